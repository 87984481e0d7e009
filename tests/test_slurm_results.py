"""The results database against the real Slurm cluster: two experiments whose framework differs, run as
jobs, recorded by `dlaunch status`, compared in CSV and Markdown, and rebuilt from their directories."""
import csv
import io
import json

import pytest

from prerequisites import require_library
from test_slurm_dlaunch import JOB_TIMEOUT_S, TINY, dlaunch, job_id, log_text

pytestmark = pytest.mark.slow


@pytest.mark.horovod
def test_two_experiments_compare_and_the_database_rebuilds_the_same(two_nodes, slurm_site, tmp_path, results_db):
    require_library("horovod.torch")
    runs = []
    for framework, experiment in (("ddp", "results-ddp"), ("horovod", "results-hvd")):
        ran = dlaunch(two_nodes, tmp_path, "run", "--site", str(slurm_site), "--framework", framework, "--experiment",
                      experiment, "--run-name", "rep", "--repeat", "2", "--time", "00:10:00", *TINY, "--steps", "4")
        assert ran.returncode == 0, ran.stderr
        runs += [tmp_path / "runs" / experiment / ("rep-r%d" % i) for i in (1, 2)]
    for run_dir in runs:
        assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
        assert "run_start" in (run_dir / "mlperf.log").read_text()  # the trainer's MLPerf log, in the job too
    assert not results_db.exists()  # nothing recorded the runs yet: they ended on the cluster
    shown = dlaunch(two_nodes, tmp_path, "status", "runs")
    assert shown.returncode == 0, shown.stderr

    compared = dlaunch(two_nodes, tmp_path, "results", "compare", "results-ddp", "results-hvd", "--format", "csv")
    assert compared.returncode == 0, compared.stderr
    (row,) = csv.DictReader(io.StringIO(compared.stdout))
    assert (row["model"], row["gpus"], row["a_runs"], row["b_runs"]) == ("resnet18", "1", "2", "2")
    assert float(row["a_median"]) > 0 and float(row["b_median"]) > 0 and row["p_value"]
    assert row["significant"].startswith("no (too few runs")  # 2 runs a side: p >= 1/3 whatever the figures
    compared = dlaunch(two_nodes, tmp_path, "results", "compare", "results-ddp", "results-hvd", "--format", "markdown")
    assert compared.returncode == 0, compared.stderr
    assert "changed: experiment results-ddp -> results-hvd; framework ddp -> horovod" in compared.stdout
    (row_line,) = [line for line in compared.stdout.splitlines() if line.startswith("| resnet18 | ")]
    assert row_line.count("| 2 |") == 2  # both sides' run counts
    assert "same in every row: loader native, gpus 1, batch_per_gpu 4, amp none" in compared.stdout

    listed = dlaunch(two_nodes, tmp_path, "results", "--format", "json")
    before = json.loads(listed.stdout)
    assert sorted((r["experiment"], r["run"]) for r in before) == [
        ("results-ddp", "rep-r1"), ("results-ddp", "rep-r2"), ("results-hvd", "rep-r1"), ("results-hvd", "rep-r2")]
    assert {r["provenance"]["job_id"] for r in before} == {job_id(r) for r in runs}
    for path in results_db.parent.glob(results_db.name + "*"):
        path.unlink()
    rebuilt = dlaunch(two_nodes, tmp_path, "results", "rebuild", "runs")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(dlaunch(two_nodes, tmp_path, "results", "--format", "json").stdout) == before
