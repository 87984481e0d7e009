"""Horovod and DeepSpeed against DDP: two real gloo (or MPI) ranks, the same seed and data.

Every run profiles one step (`--profile-steps 1`, which trains like a normal step), so the
frameworks' `no_sync` paths are exercised too. BatchNorm statistics are compared on rank 0 only
(DDP broadcasts rank 0's buffers, Horovod and DeepSpeed keep them per rank); parameters must agree
on every rank (the `end` record's per-rank digests).
"""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import torch

from helpers_train import REPO, TINY, assert_ok, load_model_state, run_trainer, trainer_env
from train.metrics_schema import read_metrics

STEPS, WORLD = 4, 2
UNPROFILED = TINY + ["--steps", str(STEPS), "--steps-per-epoch", str(STEPS), "--warmup-steps", "1",
                     "--lr", "0.4", "--warmup-epochs", "0.5", "--seed", "5"]
ARGS = UNPROFILED + ["--profile-steps", "1"]
TORCH_EXTENSIONS_DIR = os.path.expanduser("~/.cache/dlaunch/torch_extensions")


def require(available: bool, what: str) -> None:
    """Skip when `what` is missing, except in CI (CI=true or DLAUNCH_REQUIRE_ALL=1): fail there."""
    if available:
        return
    if os.environ.get("DLAUNCH_REQUIRE_ALL") == "1" or os.environ.get("CI") == "true":
        pytest.fail("%s is missing, and CI/DLAUNCH_REQUIRE_ALL=1 requires every library" % what)
    pytest.skip("%s is not installed" % what)


def require_library(module: str) -> None:
    try:
        available = importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package is missing
        available = False
    require(available, module)


@pytest.fixture(autouse=True)
def compiled_ops_cache(monkeypatch):
    """DeepSpeed compiles its CPU communication op once (about 1.5 min) into this stable cache."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", os.environ.get("TORCH_EXTENSIONS_DIR", TORCH_EXTENSIONS_DIR))


def horovodrun(args, controller: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`horovodrun -np 2` with the Gloo controller or Open MPI (TCP transport, allowed as root)."""
    launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    command = [launcher, "-np", str(WORLD), "-H", "localhost:%d" % WORLD]
    env = trainer_env()
    if controller == "gloo":
        command.append("--gloo")
    else:
        command.append("--mpi")
        env.update(OMPI_MCA_btl="self,tcp", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command += [sys.executable, "-m", "train", "--framework", "horovod"] + args
    return subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def run_dir_of(tmp_path_factory, name, launch, args=ARGS):
    run_dir = tmp_path_factory.mktemp(name)
    assert_ok(launch(args + ["--checkpoint-dir", str(run_dir)]))
    return str(run_dir)


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    return run_dir_of(tmp_path_factory, "ddp", lambda args: run_trainer(args + ["--framework", "ddp"], nproc=WORLD))


def assert_same_training(run_dir, reference_dir):
    """Ranks agree bit for bit; rank 0's model equals the DDP reference's within float tolerance."""
    metrics = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert metrics.status == "ok"
    assert metrics.header["world_size"] == WORLD
    digests = metrics.end["param_digests"]
    assert len(digests) == WORLD and len(set(digests)) == 1
    assert [r["steps"] for r in metrics.profiles] == ([1] if "--profile-steps" in metrics.header["argv"] else [])
    trained, reference = load_model_state(run_dir), load_model_state(reference_dir)
    assert trained.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1])
def test_deepspeed_zero_trains_like_ddp(stage, ddp_reference, tmp_path_factory):
    require_library("deepspeed")
    # ZeRO >= 1 partitions gradients, which the profiler needs whole: profiled only at stage 0.
    run_dir = run_dir_of(tmp_path_factory, "ds%d" % stage, lambda args: run_trainer(
        args + ["--framework", "deepspeed", "--zero-stage", str(stage)], nproc=WORLD),
        ARGS if stage == 0 else UNPROFILED)
    assert_same_training(run_dir, ddp_reference)
    settings = read_metrics(os.path.join(run_dir, "metrics.jsonl")).header["framework_settings"]
    assert settings["config"]["zero_optimization"] == {"stage": stage}
    assert settings["checkpoint"] == ("model+optimizer" if stage == 0 else "model only (ZeRO partitions optimizer state)")


@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_horovod_trains_like_ddp(controller, ddp_reference, tmp_path_factory):
    require_library("horovod.torch")
    if controller == "mpi":
        require(shutil.which("mpirun") is not None, "mpirun (Open MPI)")
    run_dir = run_dir_of(tmp_path_factory, "hvd-" + controller, lambda args: horovodrun(args, controller))
    assert_same_training(run_dir, ddp_reference)
    header = read_metrics(os.path.join(run_dir, "metrics.jsonl")).header
    assert header["framework_settings"]["controller"] == controller
    assert header["versions"]["horovod"]


@pytest.mark.horovod
@pytest.mark.slow
def test_horovod_started_by_torchrun_fails_loudly(tmp_path):
    require_library("horovod.torch")
    metrics = tmp_path / "metrics.jsonl"
    result = run_trainer(TINY + ["--framework", "horovod", "--steps", "2", "--metrics", str(metrics)], nproc=WORLD)
    assert result.returncode != 0
    assert "Horovod sees 1 process(es) but WORLD_SIZE=2" in result.stderr
    assert "horovodrun" in result.stderr
    assert not metrics.exists()
