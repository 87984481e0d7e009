"""Horovod and DeepSpeed against DDP: two real gloo (or MPI) ranks, the same seed and data.

Every run profiles one step (`--profile-steps 1`, which trains like a normal step), so the
frameworks' `no_sync` paths are exercised too. BatchNorm statistics are compared on rank 0 only
(DDP broadcasts rank 0's buffers, Horovod and DeepSpeed keep them per rank); parameters must agree
on every rank (the `end` record's per-rank digests).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from prerequisites import require, require_library
from helpers_train import REPO, TINY, assert_ok, load_model_state, run_trainer, trainer_env
from dlaunch.train.metrics_schema import read_metrics

STEPS, WORLD = 4, 2
UNPROFILED = TINY + ["--steps", str(STEPS), "--steps-per-epoch", str(STEPS), "--warmup-steps", "1",
                     "--lr", "0.4", "--warmup-epochs", "0.5", "--seed", "5"]
ARGS = UNPROFILED + ["--profile-steps", "1"]
TORCH_EXTENSIONS_DIR = os.path.expanduser("~/.cache/dlaunch/torch_extensions")


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
    command += [sys.executable, "-m", "dlaunch.train", "--framework", "horovod"] + args
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
def test_horovod_knobs_are_applied_and_recorded(tmp_path):
    """fp16 compression, a 1 MB fusion buffer, 2 backward passes per optimizer step."""
    require_library("horovod.torch")
    metrics_path = str(tmp_path / "metrics.jsonl")
    assert_ok(horovodrun(UNPROFILED + ["--fp16-allreduce", "--fusion-threshold-mb", "1", "--backward-passes-per-step",
                                       "2", "--metrics", metrics_path], "gloo"))
    metrics = read_metrics(metrics_path)
    assert metrics.header["framework_settings"] == {
        "controller": "gloo", "built": metrics.header["framework_settings"]["built"], "fp16_allreduce": True,
        "fusion_threshold_bytes": 1024 * 1024, "backward_passes_per_step": 2,
        "sgd": "for-loop", "compiled": None, "cuda_graph": None,  # the workload options' record (issue 39)
        "watchdog": {"hang_timeout_s": "from the measured steps, at least 180", "heartbeat_s": 1.0,  # issue 44
                     "node_file_s": 10.0,
                     "flight_recorder": "unavailable: horovod's collectives do not go through torch.distributed"}}
    assert len(set(metrics.end["param_digests"])) == 1
    assert metrics.epochs[0]["steps"] == STEPS  # loop steps are micro-batches (Horovod asserts the pairing)
    # linear scaling counts every image of an update: 2 passes x 4 images x 2 ranks = 16, reference 64
    assert metrics.header["lr_scaled"] == pytest.approx(0.4 * 16 / 64)


@pytest.mark.horovod
def test_horovod_job_size_comes_from_the_most_specific_launcher_variable():
    require_library("horovod.torch")
    from dlaunch.train.frameworks.horovod import expected_size

    assert expected_size({}) is None
    assert expected_size({"DLAUNCH_NTASKS": "8"}) == ("DLAUNCH_NTASKS", 8)
    assert expected_size({"DLAUNCH_NTASKS": "8", "WORLD_SIZE": "4"}) == ("WORLD_SIZE", 4)
    assert expected_size({"DLAUNCH_NTASKS": "8", "OMPI_COMM_WORLD_SIZE": "2"}) == ("OMPI_COMM_WORLD_SIZE", 2)
    assert expected_size({"DLAUNCH_NTASKS": "8", "HOROVOD_SIZE": "2"}) == ("HOROVOD_SIZE", 2)


@pytest.mark.horovod
def test_horovod_gloo_operations_under_the_mpi_controller_are_refused():
    require_library("horovod.torch")
    from dlaunch.train.config import ConfigError
    from dlaunch.train.frameworks.horovod import check_controller

    check_controller({"HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_CONTROLLER": "gloo"})  # horovodrun --gloo
    check_controller({"OMPI_COMM_WORLD_SIZE": "2"})  # mpirun
    with pytest.raises(ConfigError, match="HOROVOD_CPU_OPERATIONS=gloo needs the Gloo controller"):
        check_controller({"HOROVOD_CPU_OPERATIONS": "gloo", "OMPI_COMM_WORLD_SIZE": "2"})


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


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    from dlaunch.train.data.make_folder import make_pattern_folder

    root = str(tmp_path_factory.mktemp("data") / "folder")
    make_pattern_folder(root, classes=2, images_per_class=8, val_per_class=2, size=40)
    return root


LIBRARIES = {"ddp": "torch.distributed", "horovod": "horovod.torch", "deepspeed": "deepspeed"}


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["native", pytest.param("dali", marks=pytest.mark.dali)])
@pytest.mark.parametrize("framework", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod),
                                       pytest.param("deepspeed", marks=pytest.mark.deepspeed)])
def test_every_framework_and_loader_writes_valid_metrics(framework, loader, image_folder, tmp_path):
    require_library(LIBRARIES[framework])
    if loader == "dali":
        require_library("nvidia.dali")
    metrics_path = str(tmp_path / "metrics.jsonl")
    args = TINY + ["--num-classes", "2", "--data", image_folder, "--workers", "1", "--steps", "2",
                   "--framework", framework, "--loader", loader, "--metrics", metrics_path]
    assert_ok(run_trainer(args))
    metrics = read_metrics(metrics_path)  # validates every record against the schema
    assert (metrics.header["framework"], metrics.header["loader"]) == (framework, loader)
    assert metrics.status == "ok" and len(metrics.epochs) == 1
    assert 0.0 <= metrics.epochs[0]["top1"] <= 1.0
    # energy through the framework's all_reduce_sum: on this CPU machine a reason per domain, never a zero
    assert all(v.startswith("unavailable: ") for v in metrics.epochs[0]["energy_j"].values())
    if loader == "dali":  # the loader's own settings reach the header
        assert metrics.header["loader_settings"]["dali"] and metrics.header["loader_settings"]["dali_device"] == "cpu"


@pytest.mark.slow
@pytest.mark.parametrize("framework", [pytest.param("deepspeed", marks=pytest.mark.deepspeed),
                                       pytest.param("horovod", marks=pytest.mark.horovod)])
def test_channels_last_trains_under_deepspeed_and_horovod(framework, tmp_path):
    """Both broadcast the parameters at start-up and refused channels-last weights (DeepSpeed views each as
    bytes, Horovod wants contiguous tensors): first seen on an H100, the same on the CPU."""
    require_library(LIBRARIES[framework])
    metrics_path = str(tmp_path / "metrics.jsonl")
    assert_ok(run_trainer(TINY + ["--data", "synthetic", "--steps", "2", "--framework", framework,
                                  "--channels-last", "--metrics", metrics_path]))
    assert read_metrics(metrics_path).status == "ok"


ENGINE_DTYPE = """
import sys, torch
from dlaunch.train.config import parse_config
from dlaunch.train.frameworks.deepspeed import DeepSpeed
from dlaunch.train.workload import build_optimizer
from dlaunch.train.models import build_model
cfg = parse_config(sys.argv[1:])
framework = DeepSpeed()
framework.init(cfg)
model = build_model(cfg.model, cfg.num_classes)
engine, _ = framework.wrap(model, build_optimizer(model, cfg), cfg)
print(engine(torch.randn(2, 3, 32, 32)).dtype)
framework.shutdown()
"""


@pytest.mark.slow
@pytest.mark.deepspeed
def test_deepspeed_engine_takes_float32_batches(tmp_path):
    """DeepSpeed's bf16/fp16 modes cast the module, not its inputs, and switch off the loop's autocast
    inside the engine on CUDA (seen on an H100: "Input type (torch.cuda.FloatTensor) and weight type ...
    should be the same"). Here the engine gets a float32 batch without autocast, on the CPU."""
    require_library("deepspeed")
    result = subprocess.run([sys.executable, "-c", ENGINE_DTYPE] + TINY + [
        "--framework", "deepspeed", "--amp", "bf16", "--steps", "1", "--metrics", str(tmp_path / "m.jsonl")],
        cwd=REPO, env=trainer_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "torch.bfloat16"


@pytest.mark.slow
@pytest.mark.deepspeed
def test_deepspeed_bf16_trains_and_closes(tmp_path):
    """bf16 parameters (DeepSpeed casts the model) reach the end record's digests too."""
    require_library("deepspeed")
    metrics_path = str(tmp_path / "metrics.jsonl")
    assert_ok(run_trainer(TINY + ["--data", "synthetic", "--steps", "2", "--framework", "deepspeed",
                                  "--amp", "bf16", "--metrics", metrics_path]))
    metrics = read_metrics(metrics_path)
    assert metrics.status == "ok" and metrics.header["config"]["amp"] == "bf16"
    assert len(metrics.end["param_digests"]) == 1


WORKLOAD_REFUSALS = {
    ("horovod", "--cuda-graphs"): "--cuda-graphs is implemented for --framework ddp only (Horovod's all-reduces",
    ("horovod", "--host-syncs"): "--host-syncs minimal: Horovod's optimizer waits on the host for every step's",
    ("deepspeed", "--cuda-graphs"): "--cuda-graphs is implemented for --framework ddp only (DeepSpeed's engine step",
    ("deepspeed", "--host-syncs"): "--host-syncs minimal: DeepSpeed's engine synchronises the host every step",
}


@pytest.mark.parametrize("framework, flag", sorted(WORKLOAD_REFUSALS))
def test_horovod_and_deepspeed_refuse_cuda_graphs_and_minimal_host_syncs_in_one_line(framework, flag, tmp_path):
    """Their steps wait on the host (DDP's captured step and minimal host syncs: tests/test_train_workload.py). The
    device is left to the trainer (`auto`), so --cuda-graphs passes the flag checks and the framework refuses it."""
    require_library(LIBRARIES[framework])
    options = {"--cuda-graphs": ["--cuda-graphs", "--optimizer-impl", "fused"], "--host-syncs": ["--host-syncs", "minimal"]}
    metrics = tmp_path / "run" / "metrics.jsonl"
    argv = [a for a in TINY if a not in ("--device", "cpu")] + ["--device", "auto", "--framework", framework, "--steps",
                                                              "6", "--warmup-steps", "4", "--metrics", str(metrics)]
    result = run_trainer(argv + options[flag], timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("train: error: " + WORKLOAD_REFUSALS[framework, flag]), line
    assert not metrics.parent.exists()


@pytest.mark.slow
@pytest.mark.parametrize("framework", [pytest.param("deepspeed", marks=pytest.mark.deepspeed),
                                       pytest.param("horovod", marks=pytest.mark.horovod)])
def test_deepspeed_and_horovod_train_compiled_with_the_foreach_optimizer(framework, tmp_path):
    """--compile through the seam: DeepSpeed's engine compiles its module, Horovod's model is compiled with its
    gradient hooks outside the graph; both record it and compile nothing after the warm-up step."""
    require_library(LIBRARIES[framework])
    metrics_path = str(tmp_path / "metrics.jsonl")
    assert_ok(run_trainer(TINY + ["--steps", "4", "--warmup-steps", "1", "--framework", framework, "--compile",
                                  "default", "--optimizer-impl", "foreach", "--metrics", metrics_path]))
    metrics = read_metrics(metrics_path)
    settings = metrics.header["framework_settings"]
    assert metrics.status == "ok" and settings["sgd"] == "foreach"
    assert settings["compiled"] == {"deepspeed": "DeepSpeedEngine.compile(mode=default)",
                                    "horovod": "torch.compile(ResNet, mode=default)"}[framework]
    assert metrics.epochs[0]["compile_s"] > 0 and metrics.epochs[0]["graphs_compiled_after_warmup"] == 0


@pytest.mark.slow
@pytest.mark.deepspeed
def test_deepspeed_bf16_with_the_fused_sgd_writes_its_checkpoint(tmp_path):
    """DeepSpeed's bf16 mode steps the fused SGD on fp32 master copies it swaps into the groups: the zero momentum
    that build_optimizer gives a fused SGD follows them (kept for the swapped-out parameters, it made the
    checkpoint's optimizer state_dict fail with a KeyError)."""
    require_library(LIBRARIES["deepspeed"])
    metrics_path = str(tmp_path / "metrics.jsonl")
    assert_ok(run_trainer(TINY + ["--steps", "2", "--steps-per-epoch", "2", "--warmup-steps", "1", "--framework",
                                  "deepspeed", "--amp", "bf16", "--optimizer-impl", "fused", "--checkpoint-dir",
                                  str(tmp_path / "checkpoints"), "--metrics", metrics_path]))
    assert read_metrics(metrics_path).header["framework_settings"]["sgd"] == "fused"
    assert (tmp_path / "checkpoints" / "last.pt").is_file()


@pytest.mark.parametrize("flags, package, message", [
    (["--framework", "horovod"], "horovod", "--framework horovod needs Horovod built with PyTorch"),
    (["--framework", "deepspeed"], "deepspeed", "--framework deepspeed needs DeepSpeed (pip install deepspeed)"),
    (["--loader", "dali"], "nvidia/dali", "--loader dali needs NVIDIA DALI (pip install nvidia-dali-cuda120)"),
])
def test_fake_missing_library_is_a_one_line_error(flags, package, message, image_folder, tmp_path):
    """A shim package that fails to import, first on the path, stands in for the missing library
    (a parent like `nvidia` stays a namespace shared with the installed nvidia-* packages)."""
    shim = tmp_path / "shim" / package
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('fake: not installed')\n")
    for parent in list(shim.relative_to(tmp_path / "shim").parents)[:-1]:
        (tmp_path / "shim" / parent / "__init__.py").write_text(
            "__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")
    metrics_path = tmp_path / "metrics.jsonl"
    env = trainer_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shim"), REPO])
    command = [sys.executable, "-m", "dlaunch.train"] + TINY + ["--num-classes", "2", "--data", image_folder, "--steps", "1",
                                                        "--metrics", str(metrics_path)] + flags
    result = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert message in result.stderr and "fake: not installed" in result.stderr
    assert not metrics_path.exists()


@pytest.mark.deepspeed
def test_deepspeed_refuses_profiling_under_zero(tmp_path):
    require_library("deepspeed")
    metrics_path = tmp_path / "metrics.jsonl"
    result = run_trainer(TINY + ["--framework", "deepspeed", "--zero-stage", "1", "--steps", "3", "--profile-steps",
                                 "1", "--metrics", str(metrics_path)])
    assert result.returncode == 2
    assert "--profile-steps needs whole local gradients" in result.stderr
    assert not metrics_path.exists()


RESUME_SCRIPT = """
import copy, json, sys, torch
from dlaunch.train.config import parse_config
from dlaunch.train.data.synthetic import synthetic_batch
from dlaunch.train.frameworks import get_framework
from dlaunch.train.workload import build_optimizer
from dlaunch.train.models import build_model

cfg = parse_config(sys.argv[1:])
fw = get_framework("deepspeed")
fw.init(cfg)
torch.manual_seed(cfg.seed)
model = build_model(cfg.model, cfg.num_classes)
wrapped, _ = fw.wrap(model, build_optimizer(model, cfg), cfg)
images, labels = synthetic_batch(cfg, 0)

def step():
    fw.zero_grad()
    fw.backward(torch.nn.functional.cross_entropy(wrapped(images), labels))
    fw.step()

def distance(a, b):
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)

step()
checkpoint = copy.deepcopy(fw.state_dict())
step()
uninterrupted = copy.deepcopy(model.state_dict())
fw.load_state_dict(checkpoint)
restored = distance(model.state_dict(), checkpoint["model"])
step()
resumed = copy.deepcopy(model.state_dict())
fw.load_state_dict({"model": checkpoint["model"]})
fw.optimizer.state.clear()  # what a momentum restart gives
step()
print(json.dumps({"keys": sorted(checkpoint), "restored": restored, "vs_uninterrupted": distance(resumed, uninterrupted),
                  "vs_momentum_restart": distance(resumed, model.state_dict())}))
"""


@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [0, 1])
def test_deepspeed_checkpoint_resume(stage, tmp_path):
    """ZeRO 0 resumes exactly (model + optimizer); ZeRO 1 restores the model and restarts momentum."""
    require_library("deepspeed")
    args = TINY + ["--framework", "deepspeed", "--zero-stage", str(stage), "--steps", "3",
                   "--metrics", str(tmp_path / "unused.jsonl")]
    result = subprocess.run([sys.executable, "-c", RESUME_SCRIPT] + args, cwd=REPO, env=trainer_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["restored"] == 0.0
    if stage == 0:
        assert report["keys"] == ["model", "optimizer"]
        assert report["vs_uninterrupted"] == 0.0
    else:
        assert report["keys"] == ["model"]
        assert report["vs_uninterrupted"] > 1e-3  # the momentum really was lost ...
        assert report["vs_momentum_restart"] == 0.0  # ... and the fp32 master weights were refreshed
