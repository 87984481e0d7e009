"""The TensorFlow, MXNet and PyTorch parameter-server trainers as real multi-process jobs on this machine.

Every mode runs as `dlaunch run --site local --gpus 2 --framework MODE`: 2 workers plus the coordinator
and server tasks its row asks for, one process per task, started by the local scheduler's step with the
neutral variables of dlaunch/train/jobenv.py (DLAUNCH_TASK_ID, DLAUNCH_NTASKS, ...; Slurm itself:
tests/test_slurm_engines.py). The TensorFlow and MXNet runs use their own environments
(scripts/bootstrap-engines.sh), named in the shipped local profile's `interpreters`, and are skipped, saying
so, where those are missing.
"""
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from dlaunch.train.config import ConfigError
from dlaunch.jobs.sites import SHIPPED_SITES_DIR
from dlaunch.train.engines import engine_config, task_layout
from dlaunch.train.framework_table import task_per_worker
from dlaunch.train.jobenv import expand_tasks_per_node, step_environment
from dlaunch.train.metrics_schema import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHONS = {"tensorflow": os.path.join(REPO, ".venv-tf", "bin", "python"),
           "mxnet": os.path.join(REPO, ".venv-mx", "bin", "python"), "torch": sys.executable}
RUNNABLE = [name for name, row in task_per_worker().items() if not row.refused]
SYNC_MODES = ["tf-allreduce", "mx-ps-sync", "torch-ps-sync"]  # one per engine
TINY = ["--model", "resnet44", "--image-size", "32", "--num-classes", "10", "--batch-size", "8", "--threads", "1",
        "--device", "cpu", "--workers", "1", "--warmup-steps", "2", "--steps-per-epoch", "6", "--steps", "12"]


def python_for(mode: str) -> str:
    python = PYTHONS[task_per_worker()[mode].engine]
    if not os.path.exists(python):
        pytest.skip("%s is missing: run scripts/bootstrap-engines.sh" % python)
    return python


def test_the_shipped_local_profile_names_the_engines_environments():
    """sites/local.toml finds the environments scripts/bootstrap-engines.sh makes beside it (.venv-tf, .venv-mx)."""
    from dlaunch.jobs.sites import resolve_site

    local = resolve_site(str(SHIPPED_SITES_DIR / "local.toml"))
    assert {k: os.path.realpath(v) for k, v in local.interpreters.items()} == {
        k: os.path.realpath(PYTHONS[k]) for k in ("tensorflow", "mxnet")}


def run_job(mode: str, args: List[str], folder: Path, timeout: float = 600) -> Path:
    """`dlaunch run --site local --gpus 2 --framework MODE ARGS` (asserting that it ends ok); its metrics file."""
    python_for(mode)
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    for name in ("WORLD_SIZE", "RANK", "MASTER_PORT", "TF_CONFIG"):
        env.pop(name, None)
    ran = subprocess.run([sys.executable, "-m", "dlaunch.cli", "run", "--site", "local", "--gpus", "2",
                          "--framework", mode, "--output", str(folder / "runs"), "--experiment", "engines",
                          "--run-name", mode] + args, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    return folder / "runs" / "engines" / mode / "metrics.jsonl"


def task_env(task: int, ntasks: int, **more: str) -> dict:
    """A task's neutral variables (local and node ids do not matter to the layout)."""
    return dict(step_environment(task, ntasks, 0, 0), **more)


ONE_NODE = {"DLAUNCH_NODELIST": "localhost"}


# -- roles from the allocation (no engine needed) ------------------------------------------------


def test_tasks_per_node_forms_expand():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(ConfigError, match="DLAUNCH_TASKS_PER_NODE"):
        expand_tasks_per_node("2(3)")


def test_two_node_parameter_server_step_places_coordinator_servers_and_workers():
    # 2 nodes, 2 workers + 1 server each, 1 coordinator: Slurm puts 4 tasks on the first node, 3 on the second.
    env = {"DLAUNCH_TASKS_PER_NODE": "4,3", "DLAUNCH_NODELIST": "n1,n2", "MASTER_PORT": "29500"}
    layouts = [task_layout(task_env(t, 7, **env), coordinators=1, servers_per_node=1) for t in range(7)]
    assert layouts[0].roles == ("coordinator", "server", "worker", "worker", "server", "worker", "worker")
    assert layouts[0].addresses("server") == ["n1:29502", "n2:29501"]
    assert layouts[0].worker_hosts == ["n1", "n1", "n2", "n2"]
    assert [layouts[t].worker_index for t in (2, 3, 5, 6)] == [0, 1, 2, 3]


def test_layout_errors_name_the_variable():
    with pytest.raises(ConfigError, match="DLAUNCH_TASK_ID"):
        task_layout({"DLAUNCH_NTASKS": "2", "DLAUNCH_LOCAL_TASK_ID": "0", "DLAUNCH_NODE_ID": "0",
                     "DLAUNCH_NODELIST": "a"})
    with pytest.raises(ConfigError, match="DLAUNCH_TASK_ID 2 outside DLAUNCH_NTASKS 2"):
        task_layout(task_env(2, 2, DLAUNCH_NODELIST="a"))
    with pytest.raises(ConfigError, match="DLAUNCH_NODELIST"):
        task_layout(task_env(0, 2))
    with pytest.raises(ConfigError, match="do not match"):
        task_layout(task_env(0, 3, DLAUNCH_TASKS_PER_NODE="2", DLAUNCH_NODELIST="a"))
    with pytest.raises(ConfigError, match="no worker"):
        task_layout(task_env(0, 2, DLAUNCH_NODELIST="a"), coordinators=1, servers_per_node=1)


@pytest.mark.parametrize("mode, engine, message", [
    ("ddp", "tensorflow", "not a tensorflow mode"),
    ("mx-ps-sync", "tensorflow", "not a tensorflow mode"),
])
def test_modes_that_cannot_run_are_refused_with_their_reason(mode, engine, message):
    with pytest.raises(ConfigError, match=message):
        engine_config(["--framework", mode], engine, task_env(0, 3, **ONE_NODE))


@pytest.mark.parametrize("flag", [["--checkpoint-dir", "/tmp/x"], ["--model", "resnet18"], ["--amp", "bf16"],
                                  ["--compile", "default"], ["--cuda-graphs"], ["--optimizer-impl", "foreach"],
                                  ["--host-syncs", "minimal"]])
def test_flags_the_tensorflow_trainer_lacks_are_refused(flag):
    """Refused as the engine's, before the checks of what such an option would need (`--compile` alone would
    otherwise be told to add --warmup-steps, `--cuda-graphs` --optimizer-impl fused)."""
    with pytest.raises(ConfigError, match="^%s[^:]*: (not supported by|the tensorflow trainer has)" % flag[0]):
        engine_config(["--framework", "tf-allreduce"] + flag, "tensorflow", task_env(0, 2, **ONE_NODE))


def test_wrong_mode_exits_2_with_one_line_before_importing_tensorflow():
    ran = subprocess.run([sys.executable, "-m", "dlaunch.train.tf", "--framework", "mx-ps-sync"], cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO, **task_env(0, 3, **ONE_NODE)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and "not a tensorflow mode" in ran.stderr


def test_mxnet_roles_become_ps_lite_variables():
    from dlaunch.train.mx.roles import dmlc_environment
    env = {"DLAUNCH_TASKS_PER_NODE": "4", "DLAUNCH_NODELIST": "localhost", "DLAUNCH_ENGINE_PORT": "9000"}
    layout = task_layout(task_env(3, 4, **env), coordinators=1, servers_per_node=1)
    assert dmlc_environment(layout) == {
        "DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000", "DMLC_NUM_SERVER": "1",
        "DMLC_NUM_WORKER": "2", "DMLC_NODE_HOST": "127.0.0.1"}


# -- real jobs ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", RUNNABLE)
def test_each_mode_completes_with_valid_metrics_and_records_its_architecture(mode, tmp_path):
    """`dlaunch run --site local --gpus 2 --framework MODE` ends ok for every engine mode."""
    metrics = read_metrics(str(run_job(mode, TINY, tmp_path)))  # validates every record
    row = task_per_worker()[mode]
    header, settings = metrics.header, metrics.header["framework_settings"]
    assert metrics.status == "ok" and len(metrics.epochs) == 2
    assert header["framework"] == mode and header["world_size"] == 2 and header["global_batch"] == 16
    assert settings["engine"] == row.engine and settings["architecture"] == row.architecture
    assert all(e["images_per_s"] > 0 and e["steps"] == 6 for e in metrics.epochs)
    assert metrics.epochs[1]["images"] == 6 * 16
    # Every engine's processes run the hang watchdog (dlaunch/train/watchdog.py); only torch's has a flight recorder.
    assert settings["watchdog"]["hang_timeout_s"] == "from the measured steps, at least 180"
    assert settings["watchdog"]["flight_recorder"].startswith("TORCH_FR_BUFFER_SIZE" if row.engine == "torch" else
                                                             "unavailable: this trainer has no flight recorder")
    if row.synchronous:
        assert settings["asynchronous"] is False and settings["staleness_bound"] == 0
        digests = metrics.end["param_digests"]
        assert len(set(digests)) == 1, "workers of a synchronous run disagree: %s" % digests
    else:
        assert settings["asynchronous"] is True
        assert settings["staleness_bound"] is None and settings["staleness"].startswith("unbounded")
        assert header["lr_scaled"] == pytest.approx(0.025 * 8 / 64)  # one worker's batch per update


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tf-allreduce", "mx-ps-sync"])
def test_resnet50_trains_in_the_engine(mode, tmp_path):
    args = ["--model", "resnet50", "--image-size", "32", "--num-classes", "10", "--batch-size", "2", "--threads", "1",
            "--device", "cpu", "--warmup-steps", "1", "--steps-per-epoch", "2", "--steps", "2"]
    metrics = read_metrics(str(run_job(mode, args, tmp_path)))
    assert metrics.status == "ok" and metrics.header["model"] == "resnet50"


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from dlaunch.train.data.make_folder import make_digits_folder
    root = str(tmp_path_factory.mktemp("digits") / "digits")
    make_digits_folder(root, size=32)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("mode", SYNC_MODES)
def test_two_worker_synchronous_run_learns_digits(mode, digits, tmp_path):
    args = ["--model", "resnet44", "--image-size", "32", "--data", digits, "--batch-size", "32", "--epochs", "4",
            "--lr", "0.05", "--warmup-epochs", "0", "--schedule", "exponential", "--gamma", "0.8",
            "--label-smoothing", "0", "--threads", "1", "--workers", "1", "--device", "cpu"]
    metrics = read_metrics(str(run_job(mode, args, tmp_path, timeout=900)))
    assert metrics.header["config"]["num_classes"] == 10  # from the folder
    epochs = metrics.epochs
    assert len(epochs) == 4 and epochs[-1]["loss"] < epochs[0]["loss"]
    # Chance is 0.1. Two workers' runs are not deterministic (TensorFlow's collectives, the servers'
    # order of updates): one loaded run of tf-allreduce reached 0.42 after 4 epochs, others over 0.5;
    # the bar is 2.5x chance.
    assert epochs[-1]["top1"] > 0.25, [e["top1"] for e in epochs]
    assert metrics.end["best_top1"] == max(e["top1"] for e in epochs)
