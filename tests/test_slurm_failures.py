"""Failures on the real test cluster, each injected the way it happens on a real site, and what `dlaunch
status` then says: the trainer's own error, the failing rank's, a full disk, a launch failure, a rank
killed like the OOM killer does, a node that fails (requeue), and submissions in a tight loop."""
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

import slurm
from holds import Hold
from test_slurm_dlaunch import JOB_TIMEOUT_S, TINY, dlaunch, epochs_written, job_id, log_text, submit, trainer_pids, wait_for
from dlaunch.train.data.make_folder import make_pattern_folder
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow
# Real JPEG folders: ResNet-18 at 32 px, 2 images per rank and step, one epoch over everything.
ON_FOLDER = ["--model", "resnet18", "--image-size", "32", "--batch-size", "2", "--threads", "1", "--device", "cpu",
             "--workers", "0", "--warmup-steps", "1", "--epochs", "1"]


def folder(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    make_pattern_folder(str(root), classes=2, images_per_class=8, val_per_class=2, size=32)
    return root


def run_on(cluster: slurm.Cluster, cwd: Path, site: Path, name: str, *args: str, output: Optional[Path] = None) -> Path:
    """`dlaunch run` of a 2-node job; its run directory (under `output`, default ./runs)."""
    output = output or cwd / "runs"
    ran = dlaunch(cluster, cwd, "run", "--site", str(site), "--experiment", "failures", "--run-name", name,
                  "--output", str(output), "--nodes", "2", "--time", "00:10:00", *args)
    assert ran.returncode == 0, ran.stderr
    return output / "failures" / name


def status_of(cluster: slurm.Cluster, cwd: Path, run_dir: Path) -> str:
    shown = dlaunch(cluster, cwd, "status", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_an_empty_class_folder_found_on_the_nodes_shows_the_trainers_own_error(two_nodes, slurm_site, tmp_path):
    data = folder(tmp_path)
    # The folder is fine when dlaunch checks it; a job holding the nodes keeps ours queued while it breaks.
    blocker = two_nodes.run(["sbatch", "--parsable", "-N", str(two_nodes.nodes), "--output=/dev/null", "--wrap", "sleep 300"]).stdout.strip()
    wait_for(lambda: two_nodes.job_state(blocker) == "RUNNING", "the blocking job to run")
    run_dir = run_on(two_nodes, tmp_path, slurm_site, "empty-class", "--data", str(data), *ON_FOLDER)
    emptied = sorted((data / "train").iterdir())[-1]
    for image in emptied.iterdir():
        image.unlink()
    two_nodes.run(["scancel", blocker])
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "FAILED"
    assert "train: error: --data %s: no images in %s" % (data, emptied) in status_of(two_nodes, tmp_path, run_dir)


def test_a_corrupt_jpeg_shows_the_failing_ranks_error_not_its_peers_symptom(two_nodes, slurm_site, tmp_path):
    data = folder(tmp_path)
    victim = sorted((data / "train").iterdir())[0]
    sorted(victim.iterdir())[3].write_bytes(b"this is not a JPEG")
    run_dir = run_on(two_nodes, tmp_path, slurm_site, "corrupt", "--data", str(data), *ON_FOLDER)
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "FAILED"
    shown = status_of(two_nodes, tmp_path, run_dir)
    assert "UnidentifiedImageError" in shown, shown + log_text(run_dir)


def test_a_full_disk_reads_no_space_left(two_nodes, slurm_site, tmp_path):
    if not two_nodes.small_disk:
        pytest.skip("the cluster given by $SLURM_CONF has no small disk")
    output = Path(two_nodes.small_disk) / tmp_path.name  # 16 MiB: the metrics fit, a ResNet-18 checkpoint does not
    try:
        run_dir = run_on(two_nodes, tmp_path, slurm_site, "full", *TINY, "--steps", "4", output=output)
        assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "FAILED"
        shown = status_of(two_nodes, tmp_path, run_dir)
        assert "No space left on device" in shown, shown + log_text(run_dir)
    finally:
        shutil.rmtree(output, ignore_errors=True)


def test_a_run_directory_the_nodes_cannot_see_reads_died(two_nodes, slurm_site, tmp_path):
    # A file system mounted here after the nodes started is not theirs (a login node's private scratch).
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(hidden)], check=True, timeout=30)
    try:
        run_dir = run_on(two_nodes, tmp_path, slurm_site, "unseen", *TINY, "--steps", "4", output=hidden)
        assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "FAILED"
        shown = status_of(two_nodes, tmp_path, run_dir)
        assert " died" in shown and "running" not in shown, shown
        assert "Slurm ended the job (FAILED" in shown, shown
        logs = dlaunch(two_nodes, tmp_path, "logs", str(run_dir))
        assert logs.returncode == 1 and "no log" in logs.stderr and "FAILED" in logs.stderr, logs.stderr
    finally:
        subprocess.run(["umount", str(hidden)], timeout=30)


def node_of(cluster: slurm.Cluster, rank: int) -> "tuple[str, int]":
    """(the node, the pid) of the trainer worker of `rank`, found by its RANK variable among the nodes' trainer
    processes."""
    for node in cluster.node_names:
        for pid in trainer_pids(node):
            try:
                environ = Path("/proc/%d/environ" % pid).read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):
                continue
            if b"RANK=%d" % rank in environ:
                return node, pid
    raise AssertionError("no trainer of rank %d" % rank)


def rank_pid(cluster: slurm.Cluster, rank: int) -> int:
    """The pid of the trainer worker of `rank` (`node_of`)."""
    return node_of(cluster, rank)[1]


def test_rank_0_killed_as_the_oom_killer_does_reads_died_with_the_signal(two_nodes, slurm_site, tmp_path):
    """SIGKILL is what the kernel's OOM killer sends (a real OOM needs memory cgroups this cluster lacks)."""
    # held after the first epoch: rank 0 dies at the same place in every run, rank 1 waits for the SIGTERM
    run_dir = submit(two_nodes, tmp_path, slurm_site, "oom", "--nodes", "2", "--steps", "100000", **Hold(tmp_path).env())
    wait_for(lambda: epochs_written(run_dir) >= 1, "a first epoch")
    victim = rank_pid(two_nodes, 0)  # rank 0 writes the metrics: nobody records how the run ended
    os.kill(victim, signal.SIGKILL)
    assert two_nodes.wait_job(job_id(run_dir), 60) == "FAILED"
    assert read_metrics(str(run_dir / "metrics.jsonl")).status == "running"
    shown = status_of(two_nodes, tmp_path, run_dir)
    assert " died" in shown and "Signal 9 (SIGKILL) received by PID %d" % victim in shown, shown


def test_a_failed_node_requeues_the_job_which_finishes_by_itself_with_every_epoch_once(two_nodes, slurm_site, tmp_path):
    if two_nodes.dir is None:
        pytest.skip("failing a node needs a cluster started by slurm-cluster.sh here")
    # The first attempt holds after its first epoch (tests/holds.py), so it still runs when Slurm notices the
    # failure, however fast the machine; the second attempt resumes after that epoch and does not hold.
    hold = Hold(tmp_path)
    run_dir = submit(two_nodes, tmp_path, slurm_site, "node-failure", "--nodes", "2", "--steps", "8",
                     "--steps-per-epoch", "2", **hold.env())
    job = job_id(run_dir)
    wait_for(lambda: epochs_written(run_dir) >= 1, "a first epoch")
    node = two_nodes.node_names[-1]
    down = slurm.cluster_script("node-down", node, "--dir", str(two_nodes.dir))
    assert down.returncode == 0, down.stderr
    try:  # Slurm notices within SlurmdTimeout (30 s), ends the job and requeues it
        wait_for(lambda: "Restarts=1" in two_nodes.run(["scontrol", "show", "job", "-o", job]).stdout,
                 "a requeue after the node failure", timeout=150)
    finally:
        hold.release()
        up = slurm.cluster_script("node-up", node, "--dir", str(two_nodes.dir))
        assert up.returncode == 0, up.stderr
    assert two_nodes.wait_job(job, 300) == "COMPLETED", log_text(run_dir)
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "ok" and [e["epoch"] for e in metrics.epochs] == list(range(4)), log_text(run_dir)
    log = (run_dir / ("slurm-%s.out" % job)).read_text()
    assert "attempt 1 on" in log and "attempt 2 on" in log  # one log, both attempts


def test_four_runs_submitted_at_once_all_land(two_nodes, slurm_site, tmp_path):
    command = [os.path.join(os.path.dirname(os.sys.executable), "dlaunch"), "run", "--site", str(slurm_site),
               "--experiment", "loop", "--nodes", "1", "--time", "00:10:00", *TINY, "--steps", "2"]
    procs: List[subprocess.Popen] = [
        subprocess.Popen(command + ["--seed", str(seed)], cwd=tmp_path, env=two_nodes.env(), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE) for seed in range(4)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [code for _, _, code in results] == [0, 0, 0, 0], [err for _, err, _ in results]
    runs = sorted((tmp_path / "runs" / "loop").iterdir())
    assert len(runs) == 4 and len({job_id(r) for r in runs}) == 4
    for run in runs:
        two_nodes.wait_job(job_id(run), JOB_TIMEOUT_S)
