"""`dlaunch run --framework <mode> --nodes 2` for every task layout of the TensorFlow, MXNet and PyTorch engine modes
on the real throw-away Slurm cluster: one task per process, roles from Slurm's task ids, the engine's
interpreter from the site profile's `interpreters` (the environments of scripts/bootstrap-engines.sh).
A mode's synchronous and asynchronous variants share their layout (coordinator and server tasks), which is all
Slurm sees of them: one of each layout runs here, every mode runs on this machine (tests/test_engines.py)."""
import os
from pathlib import Path

import pytest

import slurm
from test_slurm_dlaunch import JOB_TIMEOUT_S, dlaunch, job_id, log_text
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
INTERPRETERS = {"tensorflow": str(REPO / ".venv-tf" / "bin" / "python"), "mxnet": str(REPO / ".venv-mx" / "bin" / "python")}
RUNNABLE = [name for name, row in FRAMEWORKS.items() if row.launch == "task-per-worker" and not row.refused]


def one_per_layout(modes):
    """The first of `modes` of each engine and task layout."""
    first = {}
    for mode in modes:
        row = FRAMEWORKS[mode]
        first.setdefault((row.engine, row.coordinators, row.servers_per_node), mode)
    return list(first.values())


ON_TWO_NODES = one_per_layout(RUNNABLE)
# ResNet-44 at 32 px, batch 4 per worker, one thread per task.
ARGS = ["--model", "resnet44", "--image-size", "32", "--num-classes", "10", "--batch-size", "4", "--threads", "1",
        "--device", "cpu", "--data", "synthetic", "--workers", "1", "--warmup-steps", "1", "--steps-per-epoch", "2",
        "--steps", "4"]


@pytest.fixture(scope="module")
def engines_site(slurm_cluster: slurm.Cluster, tmp_path_factory) -> Path:
    missing = [python for python in INTERPRETERS.values() if not os.path.exists(python)]
    if missing:
        pytest.skip("%s missing: run scripts/bootstrap-engines.sh" % ", ".join(missing))
    return slurm_cluster.site_profile(tmp_path_factory.mktemp("sites") / "slurm-engines.toml",
                                      extra={"interpreters": INTERPRETERS})


@pytest.fixture(scope="module")
def runs_home(tmp_path_factory) -> Path:
    """Where every mode's run goes (runs/engines/<mode>), so that one report covers them all."""
    return tmp_path_factory.mktemp("engines")


@pytest.mark.parametrize("mode", ON_TWO_NODES)
def test_mode_completes_on_two_nodes(mode, two_nodes, engines_site, runs_home):
    tmp_path = runs_home
    ran = dlaunch(two_nodes, tmp_path, "run", "--site", str(engines_site), "--experiment", "engines", "--run-name", mode,
                  "--time", "00:10:00", "--framework", mode, "--nodes", "2", *ARGS)
    assert ran.returncode == 0, ran.stderr
    run_dir = tmp_path / "runs" / "engines" / mode
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    row = FRAMEWORKS[mode]
    assert metrics.status == "ok" and len(metrics.epochs) == 2
    assert metrics.header["framework"] == mode and metrics.header["world_size"] == 2
    hosts = set(metrics.header["hosts"])  # one worker on each node
    assert len(hosts) == 2 and hosts <= set(two_nodes.node_names)
    assert metrics.header["slurm_job_id"] == job_id(run_dir)
    settings = metrics.header["framework_settings"]
    assert settings["engine"] == row.engine and settings["asynchronous"] is (not row.synchronous)
    assert "staleness_bound" in settings


def test_report_draws_every_engine_side_by_side(slurm_cluster, runs_home):
    """`dlaunch report` over the runs above: one group per engine mode in the tables and the plots."""
    missing = [mode for mode in ON_TWO_NODES if not (runs_home / "runs" / "engines" / mode / "metrics.jsonl").exists()]
    assert not missing, "runs of the test above are missing: %s" % missing
    ran = dlaunch(slurm_cluster, runs_home, "report", "runs/engines", "--output", "report")
    assert ran.returncode == 0, ran.stderr
    text = (runs_home / "report" / "report.md").read_text()
    assert all(mode in text for mode in ON_TWO_NODES), text
    assert list((runs_home / "report").glob("*.png"))
