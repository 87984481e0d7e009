"""Issue 36 on the real test cluster: a job with one node slowed from outside (a cgroup CPU quota on that node,
as a throttled GPU, a degraded link or a noisy neighbour slows one node of a real machine) is flagged by `status`,
`watch` and `report`, naming the node; equal jobs are not (5 of 5). Each node runs on a core of its own
(`slurm-cluster.sh start --pin-cores`, the session cluster): unpinned, both nodes' ranks would share this machine's
2 cores and their speeds would say nothing about a node.

The test profile's `straggler_threshold` is 0.85, not the default 0.10: this machine's two vCPUs, the test nodes, at
times differ by up to 40 % in speed on their own (measured in equal jobs: one node's forward pass 9.2 ms, the other's
12.8 ms, 1.39x, steadily over a job's epochs; most jobs within 5 %), more than two nodes of one type on a real cluster.
A slowed node's forward pass took 2.88x the other's in the full run of 2026-11-26 23:04 ("computed 188 % slower than
the median rank", of 2 ranks the faster one; the job 23.9 against 65.1 images/s for the equal one). 0.85 keeps the ratio between 2 ranks that 0.30 allowed when the median was the mean of the two (before
phases method "rank-timers-median-rank": 1.3 / 0.7 = 1.86x).

Before issue 36 (main c098ce7) the slowed job ended `ok` with 3.3x less throughput and nothing named the node."""
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

import slurm
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow

DLAUNCH = os.path.join(os.path.dirname(sys.executable), "dlaunch")
SLOW_NODE = "dl-node2"
# 4 epochs of 10 steps: judged on the 3 after the first (its warm-up), so one noisy epoch cannot flag a run.
WORK = ["--framework", "ddp", "--nodes", "2", "--model", "resnet18", "--image-size", "32", "--num-classes", "10",
        "--batch-size", "4", "--threads", "1", "--device", "cpu", "--data", "synthetic", "--workers", "0",
        "--warmup-steps", "1", "--steps-per-epoch", "10", "--steps", "40", "--time", "00:10:00"]
JOB_TIMEOUT_S = 300


def dlaunch(cluster: slurm.Cluster, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([DLAUNCH, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=cluster.env(COLUMNS="300"))


def submit(cluster: slurm.Cluster, cwd: Path, site: Path, experiment: str, run_name: str) -> Path:
    ran = dlaunch(cluster, cwd, "run", "--site", str(site), "--experiment", experiment, "--run-name", run_name, *WORK)
    assert ran.returncode == 0, ran.stderr
    return cwd / "runs" / experiment / run_name


def finish(cluster: slurm.Cluster, runs: List[Path]) -> None:
    for run in runs:
        job = (run / "job_id").read_text().strip()
        log = "".join(p.read_text(errors="replace") for p in run.glob("slurm-*.out"))
        assert cluster.wait_job(job, JOB_TIMEOUT_S) == "COMPLETED", log
        assert read_metrics(str(run / "metrics.jsonl")).status == "ok"


THRESHOLD = 0.85


@pytest.fixture
def pinned(two_nodes: slurm.Cluster) -> slurm.Cluster:
    if not two_nodes.node_cores:
        pytest.skip("the cluster was started without --pin-cores: its nodes share the cores")
    return two_nodes


@pytest.fixture
def site(pinned: slurm.Cluster, tmp_path: Path) -> Path:
    return pinned.site_profile(tmp_path / "slurm-vcpus.toml", extra={"straggler_threshold": THRESHOLD})


def test_equal_jobs_are_not_flagged(pinned, site, tmp_path):
    runs = [submit(pinned, tmp_path, site, "equal", "r%d" % i) for i in range(5)]
    finish(pinned, runs)
    shown = dlaunch(pinned, tmp_path, "status", "runs/equal")
    assert shown.returncode == 0, shown.stderr
    assert "straggler" not in shown.stdout and "throttled" not in shown.stdout, shown.stdout
    for run in runs:  # every rank recorded its phases: the runs were judged, not skipped
        assert all(epoch.get("phases") for epoch in read_metrics(str(run / "metrics.jsonl")).epochs)
    watch = dlaunch(pinned, tmp_path, "watch", "--once", "runs/equal")  # through a pipe: plain lines
    assert watch.returncode == 0, watch.stderr
    lines = {line.split()[1].rstrip(":"): line for line in watch.stdout.splitlines() if "runs/equal/" in line}
    assert sorted(lines) == ["runs/equal/r%d" % i for i in range(5)], watch.stdout
    assert not [line for line in lines.values() if "straggler" in line or "throttled" in line], watch.stdout
    report = dlaunch(pinned, tmp_path, "report", "runs/equal", "--output", "report")
    assert report.returncode == 0, report.stderr
    assert "## Stragglers and throttled GPUs" not in (tmp_path / "report" / "report.md").read_text()


def test_a_slowed_node_is_flagged_by_status_watch_and_report(pinned, site, tmp_path):
    reference = submit(pinned, tmp_path, site, "slowed", "equal")
    finish(pinned, [reference])
    pinned.slow_node(SLOW_NODE, cpu_percent=30)  # new job steps on that node inherit the quota
    try:
        slowed = submit(pinned, tmp_path, site, "slowed", "slow-node2")
        finish(pinned, [slowed])
    finally:
        pinned.restore_node(SLOW_NODE)

    status = dlaunch(pinned, tmp_path, "status", "runs/slowed")
    assert status.returncode == 0, status.stderr
    flagged = [line for line in status.stdout.splitlines() if "straggler" in line]
    assert len(flagged) == 1 and flagged[0].startswith("runs/slowed/slow-node2: straggler: %s rank 1 (local rank 0) "
                                                        "computed" % SLOW_NODE), status.stdout
    assert "slower than the median rank: a straggler; this run's E_G is understated" in flagged[0]

    watch = dlaunch(pinned, tmp_path, "watch", "--once", "runs/slowed")  # through a pipe: plain lines
    assert watch.returncode == 0, watch.stderr
    lines = {line.split()[1].rstrip(":"): line for line in watch.stdout.splitlines() if "runs/slowed/" in line}
    assert "straggler: %s rank 1" % SLOW_NODE in lines["runs/slowed/slow-node2"], watch.stdout
    assert "straggler" not in lines["runs/slowed/equal"], watch.stdout

    report = dlaunch(pinned, tmp_path, "report", "runs/slowed", "--output", "report")
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report" / "report.md").read_text()
    apart = page.split("## Stragglers and throttled GPUs", 1)[1].split("\n## ", 1)[0]
    assert "slow-node2" in apart and "%s rank 1" % SLOW_NODE in apart, page
    # kept with --include-stragglers, the slowed run makes the 2-GPU point noisy (issue 47's quality verdict), which
    # would set it apart too: kept here (--include-doubtful) to count its runs
    included = dlaunch(pinned, tmp_path, "report", "runs/slowed", "--output", "with", "--include-stragglers",
                       "--include-doubtful")
    assert included.returncode == 0, included.stderr
    # left out of the scaling figures unless asked: one run at 2 GPUs, then both
    assert _runs_at_2_gpus(page) == 1 and _runs_at_2_gpus((tmp_path / "with" / "report.md").read_text()) == 2


def _runs_at_2_gpus(report_md: str) -> int:
    """The run count of the scaling table's 2-GPU row."""
    scaling = report_md.split("## Scaling", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in scaling.splitlines() if line.startswith("|") and "GPUs" in line)
    columns = [c.strip() for c in header.strip("|").split("|")]
    for line in scaling.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == len(columns) and cells[columns.index("GPUs")] == "2":
            return int(cells[columns.index("runs")])
    raise AssertionError("no 2-GPU row in the scaling table:\n" + scaling)
