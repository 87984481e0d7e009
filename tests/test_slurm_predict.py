"""`dlaunch predict --from-runs` on a real 1- and 2-node sweep of the throw-away Slurm cluster (gloo on CPU)."""
import re

import pytest

from test_slurm_dlaunch import JOB_TIMEOUT_S, TINY, dlaunch, job_id, log_text
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow


def test_predict_from_a_one_and_two_node_sweep_predicts_four_nodes(two_nodes, tmp_path):
    site = two_nodes.site_profile(tmp_path / "slurm-four.toml", max_nodes=4)  # predicting 4 nodes is allowed
    swept = dlaunch(two_nodes, tmp_path, "sweep", "--site", str(site), "--nodes", "1,2", "--experiment", "calibration",
                    "--time", "00:10:00", *TINY, "--steps", "8", "--profile-steps", "2")
    assert swept.returncode == 0, swept.stderr
    runs = sorted(p for p in (tmp_path / "runs" / "calibration").iterdir() if p.is_dir())
    assert len(runs) == 2
    for run_dir in runs:
        assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
        assert read_metrics(str(run_dir / "metrics.jsonl")).profiles, "no profile record in %s" % run_dir

    shown = dlaunch(two_nodes, tmp_path, "predict", "--site", str(site), "--from-runs", str(tmp_path / "runs" / "calibration"),
                    "--gpus", "1,2,4")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "calibrated on 2 runs (1,2 GPUs)" in out
    summary = re.search(r"leave-one-out error \(1 of 2 runs predicted from the others\): step time mean ([\d.]+) %, "
                        r"max ([\d.]+) %; profiled comm share mean ([\d.]+) pp", out)
    assert summary, out  # the 1-node run predicted from the 2-node one; the other way needs a [network] section
    rows = {line.split()[0]: line.split() for line in out.splitlines() if re.match(r"^\d+\s+\d+\s", line)}
    assert set(rows) == {"1", "2", "4"}
    assert rows["4"][1] == "4" and float(rows["4"][4]) > 0 and rows["4"][-1] == "predicted"  # 4 nodes, images/s > 0

    too_many = dlaunch(two_nodes, tmp_path, "predict", "--site", str(site), "--from-runs", str(tmp_path / "runs"),
                       "--gpus", "8")
    assert too_many.returncode == 2 and "--gpus" in too_many.stderr
