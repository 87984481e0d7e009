"""A rank stopped for good on the real test cluster (issue 44, done-when): SIGSTOP from outside, as a GPU or driver
that hangs leaves a process alive but silent. The job ends within the hang timeout + 60 s, `status` names the node and
the rank, the site's suspect-node record holds the node, and the resubmission leaves it out (a dry run: the 2-node
cluster cannot run a 2-node job without it)."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from holds import Hold
from test_slurm_dlaunch import dlaunch, job_id, log_text, submit, wait_for
from test_slurm_failures import node_of

from dlaunch.runs import suspects
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow
HANG_TIMEOUT_S = 10  # the watchdog's start-up and sections have their own allowances: 20 equal runs at 5 s, no false hang


def test_a_rank_stopped_for_good_ends_the_job_hung_names_its_node_and_the_resubmission_leaves_it_out(
        two_nodes, slurm_site, tmp_path):
    record = tmp_path / "suspect-nodes"
    env = {suspects.FOLDER_ENV: str(record)}
    hold = Hold(tmp_path)
    run_dir = submit(two_nodes, tmp_path, slurm_site, "hang", "--nodes", "2", "--steps", "100000",
                     "--hang-timeout", str(HANG_TIMEOUT_S), **hold.env(), **env)
    stopped = None
    try:
        wait_for(lambda: all(Path("%s.held-after-epoch-0.rank%d" % (hold.file, r)).exists() for r in (0, 1)),
                 "both ranks held after their first epoch")
        # While it runs (held: the watchdog paused), status says per node when it last finished a step.
        wait_for(lambda: len(re.findall(r": last step \d+ \d+ s ago", dlaunch(two_nodes, tmp_path, "status",
                                                                              str(run_dir), **env).stdout)) == 2,
                 "both nodes' last step in status", timeout=60)
        node, stopped = node_of(two_nodes, 1)
        os.kill(stopped, signal.SIGSTOP)
        released = time.monotonic()
        hold.release(rank=0)
        state = two_nodes.wait_job(job_id(run_dir), HANG_TIMEOUT_S + 120)
        ended_after = time.monotonic() - released
    finally:
        hold.release()
        if stopped is not None:
            subprocess.run(["kill", "-9", str(stopped)], stderr=subprocess.DEVNULL, check=False)
    print("hang to job end: %.1f s (hang timeout %d s)" % (ended_after, HANG_TIMEOUT_S))
    assert state == "FAILED"
    assert ended_after <= HANG_TIMEOUT_S + 60
    [shown] = json.loads(dlaunch(two_nodes, tmp_path, "status", "--json", str(run_dir), **env).stdout)
    assert (shown["state"], shown["status"]) == (
        "FAILED (exit 69: a process stopped answering, the watchdog stopped the job)", "hung"), shown
    assert re.match(r"hung: no step finished for %d s: silent: %s rank 1 \(local rank \d\), last step \d+, phase \S"
                    % (HANG_TIMEOUT_S, node), shown["why_failed"]), shown
    assert "resume it: dlaunch run --resume" in shown["why_failed"] and shown["why_failed"].endswith(
        "(leaves out %s)" % node)
    listed = dlaunch(two_nodes, tmp_path, "nodes", "list", "--site", str(slurm_site), "--json", **env)
    assert listed.returncode == 0, listed.stderr
    assert '"node": "%s"' % node in listed.stdout and str(run_dir.resolve()) in listed.stdout
    resumed = dlaunch(two_nodes, tmp_path, "run", "--resume", str(run_dir), "--dry-run", **env)
    assert resumed.returncode == 0, resumed.stderr
    assert "#SBATCH --exclude=%s\n" % node in resumed.stdout and "--resume" in resumed.stdout
    assert "leaves out suspect nodes: %s (hung in " % node in resumed.stderr


def two_rank_node_site(cluster, path: Path, **extra) -> Path:
    """A profile of the psslurm-like partition, whose 2 pretend GPUs a node give a 1-node job 2 ranks (on the CPU)."""
    if not cluster.psslurm_partition or cluster.gpus_per_node != 2:
        pytest.skip("the cluster given by $SLURM_CONF has no partition with 2 pretend GPUs per node")
    return cluster.site_profile(path, gpus_per_node=2, gpu_vendor="nvidia", partition=cluster.psslurm_partition,
                                extra=extra)


def hang_rank_1(cluster, run_dir: Path, hold: Hold) -> str:
    """Both ranks held after their first epoch; rank 1 stopped for good (SIGSTOP), rank 0 released into the stop
    check; once the hang record exists the stopped process is killed (what torchrun does 30 s after its SIGTERM, which
    a stopped process ignores). Rank 1's node."""
    stopped = None
    try:
        wait_for(lambda: all(Path("%s.held-after-epoch-0.rank%d" % (hold.file, r)).exists() for r in (0, 1)),
                 "both ranks held after their first epoch")
        node, stopped = node_of(cluster, 1)
        os.kill(stopped, signal.SIGSTOP)
        hold.release(rank=0)
        wait_for(lambda: (run_dir / "hang.json").exists(), "the hang record", timeout=HANG_TIMEOUT_S + 60)
        return node
    finally:
        hold.release()
        if stopped is not None:
            subprocess.run(["kill", "-9", str(stopped)], stderr=subprocess.DEVNULL, check=False)


def test_a_hang_on_one_node_is_retried_in_the_job_from_the_checkpoint_on_the_spare(two_nodes, tmp_path):
    """Issue 44 item 2 (never a requeue into the same hang): a 1-node job of 2 ranks with a spare node
    (`--preflight --spare-nodes 1`, the psslurm-like partition's 2 pretend GPUs per node: 2 ranks on the CPU). Rank 1
    is stopped for good after the first epoch; rank 0's watchdog names it and its node, the training step ends, and
    the job script chooses again without that node: the spare. Training resumes there from the epoch-1 checkpoint and
    the job completes; status says so, and the suspect-node record holds the node. Before this change the job
    ended FAILED, hung, with the spare idle (the script had no retry: tests/golden/generic-slurm-ddp-preflight.sh)."""
    site = two_rank_node_site(two_nodes, tmp_path / "retry.toml", preflight={"min_fraction": 0.01})
    env = {suspects.FOLDER_ENV: str(tmp_path / "suspect-nodes")}
    hold = Hold(tmp_path)
    run_dir = submit(two_nodes, tmp_path, site, "retry", "--nodes", "1", "--preflight", "--spare-nodes", "1",
                     "--steps", "6", "--hang-timeout", str(HANG_TIMEOUT_S), **hold.env(), **env)
    node = hang_rank_1(two_nodes, run_dir, hold)
    state = two_nodes.wait_job(job_id(run_dir), 240)
    log = "".join(p.read_text(errors="replace") for p in run_dir.glob("slurm-*.out"))
    assert state == "COMPLETED", log[-4000:]
    spare = [n for n in two_nodes.node_names[:2] if n != node][0]
    chosen = json.loads((run_dir / "preflight.json").read_text())
    assert (chosen["retry"], chosen["chosen"], [n["host"] for n in chosen["left_out"]]) == (1, [spare], [node])
    assert chosen["left_out"][0]["reasons"][0].startswith("named by the hang: rank 1 no heartbeat for ")
    assert chosen["earlier"][0]["chosen"] == [node]
    assert "retry 1 of 1 from the checkpoint on %s" % spare in log, log[-4000:]
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "ok" and set(metrics.header["hosts"]) == {node}  # the first attempt's header
    [resumed] = [r for r in metrics.records if r["type"] == "resume"]
    assert (resumed["epoch"], resumed["step"]) == (1, 2)  # from the checkpoint of epoch 0 (2 steps an epoch)
    assert {n["host"] for n in resumed["network"]} == {spare}, resumed
    [shown] = json.loads(dlaunch(two_nodes, tmp_path, "status", "--json", str(run_dir), **env).stdout)
    assert shown["ok"], shown
    assert shown["preflight"] == [
        "retry 1 after a hang left out %s (%s); trains on %s from the checkpoint"
        % (node, chosen["left_out"][0]["reasons"][0], spare)], shown
    listed = dlaunch(two_nodes, tmp_path, "nodes", "list", "--site", str(site), "--json", **env)
    assert '"node": "%s"' % node in listed.stdout and "named by the hang" in listed.stdout, listed.stdout


def test_a_hung_runs_resume_leaves_the_silent_node_out_and_trains_on_from_the_checkpoint(two_nodes, tmp_path):
    """The done-when's resubmission for a job without spares (`dlaunch run --resume`), for real: a 1-node job of 2
    ranks (2 pretend GPUs) hangs on its node (rank 1 stopped for good), and the resumed job runs on the other node
    from the checkpoint to the end. Before the watchdog ignored an earlier attempt's hang record, the resumed job read
    the run's hang.json at its first node write and ended hung within a second."""
    site = two_rank_node_site(two_nodes, tmp_path / "resume.toml")
    env = {suspects.FOLDER_ENV: str(tmp_path / "suspect-nodes")}
    hold = Hold(tmp_path)
    run_dir = submit(two_nodes, tmp_path, site, "resume", "--nodes", "1", "--steps", "6",
                     "--hang-timeout", str(HANG_TIMEOUT_S), **hold.env(), **env)
    node = hang_rank_1(two_nodes, run_dir, hold)
    assert two_nodes.wait_job(job_id(run_dir), 120) == "FAILED"
    [shown] = json.loads(dlaunch(two_nodes, tmp_path, "status", "--json", str(run_dir), **env).stdout)
    assert shown["status"] == "hung", shown  # and the node is now a suspect
    first = job_id(run_dir)
    resumed = dlaunch(two_nodes, tmp_path, "run", "--resume", str(run_dir), **env)
    assert resumed.returncode == 0 and "leaves out suspect nodes: %s (hung in " % node in resumed.stderr, resumed.stderr
    second = job_id(run_dir)
    assert second != first and two_nodes.wait_job(second, 240) == "COMPLETED", log_text(run_dir)[-4000:]
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    [again] = [r for r in metrics.records if r["type"] == "resume"]
    spare = [n for n in two_nodes.node_names[:2] if n != node][0]
    assert metrics.status == "ok" and again["epoch"] == 1 and {n["host"] for n in again["network"]} == {spare}
    [shown] = json.loads(dlaunch(two_nodes, tmp_path, "status", "--json", str(run_dir), **env).stdout)
    assert shown["ok"], shown
