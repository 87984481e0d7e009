"""Issue 47 item 3: a study's report answers its question. The CPU study's axes (architecture, updates, engine,
framework) side by side per worker count in report.md and the console, filterable in the results database; the step
split where the engine records it; notes that describe the files they read; workers, not GPUs, where no run has one.
The runs are metrics files as each trainer writes them (the TensorFlow trainer's epochs hold no phases or overhead)."""
import pytest
from test_quality import RUNNER, local_run
from test_report import table_rows

import dlaunch
from dlaunch.cli import app
from dlaunch.train.metrics_schema import VERSION

# (framework, workers, images/s, the median rank's compute per step; None: a trainer that records no phases); each
# rank waits 0.01 s per step for data and syncs 0.02 s (v4_fields): a split of 15.4 % sync, 76.9 % compute, 7.7 % data
ARMS = [("ddp", 1, 100.0, 0.10), ("ddp", 2, 190.0, 0.10), ("torch-ps-sync", 1, 80.0, 0.10),
        ("torch-ps-sync", 2, 140.0, 0.10), ("tf-ps-async", 1, 60.0, None), ("tf-ps-async", 2, 115.0, None)]


@pytest.fixture
def arms(tmp_path):
    runs = tmp_path / "runs"
    for framework, workers, x, compute in ARMS:
        local_run(runs, "%s-w%d" % (framework, workers), workers, x, compute or 0.1, threads=16, framework=framework,
                  experiment="cpu-ps", steps=60, measured=50, phases=compute is not None,
                  hosts=["node%d" % w for w in range(workers)])
    return runs


def test_the_report_sets_the_arms_side_by_side_per_worker_count(tmp_path, arms):
    out = tmp_path / "report"
    result = RUNNER.invoke(app, ["report", str(arms), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    compared = table_rows(text, "## Architectures, updates and frameworks compared")
    assert [row[1:6] + row[7:] for row in compared] == [
        ["1", "allreduce", "sync", "torch", "ddp", "16", "100.0", "1.000", "15.4", "76.9", "7.7", "ok"],
        ["1", "parameter-server", "sync", "torch", "torch-ps-sync", "16", "80.0", "1.000", "15.4", "76.9", "7.7", "ok"],
        ["1", "parameter-server", "async", "tensorflow", "tf-ps-async", "16", "60.0", "1.000", "-", "-", "-", "ok"],
        ["2", "allreduce", "sync", "torch", "ddp", "16", "190.0", "0.950", "15.4", "76.9", "7.7", "ok"],
        ["2", "parameter-server", "sync", "torch", "torch-ps-sync", "16", "140.0", "0.875", "15.4", "76.9", "7.7", "ok"],
        ["2", "parameter-server", "async", "tensorflow", "tf-ps-async", "16", "115.0", "0.958", "-", "-", "-", "ok"]]
    assert text.split("## Architectures, updates and frameworks compared\n\n", 1)[1].splitlines()[0].startswith(
        "| group | workers | architecture | updates | engine | framework | loader | threads |")
    assert "| group | workers | nodes | runs |" in text  # the Scaling table: workers, not GPUs
    assert "architectures, updates and frameworks compared" in result.stdout
    # the notes describe the files read: fresh files (of the version written now) of the TensorFlow trainer, not
    # "version 1-3"
    assert ("2 runs (metrics version %d files of the tensorflow trainer, whose epoch records hold no overhead) recorded "
            "no epoch overhead, so images/s is the steps-only rate: tf-ps-async-w1, tf-ps-async-w2" % VERSION
            ) in result.stderr
    assert "metrics version 1-3" not in text
    assert "site local has no [[reference]] for resnet18 on 1 worker" in result.stderr
    (group,) = [g for g in dlaunch.report([arms]).groups if g.framework == "tf-ps-async"]
    assert (group.engine, group.architecture, group.updates, group.threads) == ("tensorflow", "parameter-server", "async", "16")


def test_the_results_database_filters_by_the_study_axes(tmp_path, arms):
    assert RUNNER.invoke(app, ["report", str(arms), "-o", str(tmp_path / "report")]).exit_code == 0
    by = {selector: sorted(r.run for r in dlaunch.results([selector]))
          for selector in ("architecture=parameter-server,updates=sync", "updates=async", "engine=tensorflow",
                           "architecture=allreduce", "device=cpu,threads=16,gpus=2")}
    assert by == {"architecture=parameter-server,updates=sync": ["torch-ps-sync-w1", "torch-ps-sync-w2"],
                  "updates=async": ["tf-ps-async-w1", "tf-ps-async-w2"], "engine=tensorflow": ["tf-ps-async-w1", "tf-ps-async-w2"],
                  "architecture=allreduce": ["ddp-w1", "ddp-w2"],
                  "device=cpu,threads=16,gpus=2": ["ddp-w2", "tf-ps-async-w2", "torch-ps-sync-w2"]}
    listed = RUNNER.invoke(app, ["results", "-w", "updates=async", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    assert {(r["architecture"], r["updates"], r["engine"], r["quality"]) for r in __import__("json").loads(listed.stdout)} == {
        ("parameter-server", "async", "tensorflow", "ok")}
