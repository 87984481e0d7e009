"""The cpu image built for real from containers/cpu/ddp.def (scripts/build-rootfs.py: mmdebstrap, the
recipe's own %post, %environment and %test) and run with a real HPC container runtime, Charliecloud's
`ch-run`: the trainer inside the container, its metrics through a bind, signals through ch-run.

The first run builds the image (minutes, see containers/README.md); later runs reuse the cached build
in ~/.cache/dlaunch/rootfs and only copy %files again and rerun %test."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlaunch.train.metrics_schema import MetricsError, read_metrics

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
TINY = ["--model", "resnet18", "--image-size", "32", "--num-classes", "10", "--batch-size", "4", "--threads", "1",
        "--device", "cpu", "--data", "synthetic", "--workers", "0", "--warmup-steps", "1", "--steps-per-epoch", "2"]


def git_revision() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def image(cpu_image) -> Path:
    return cpu_image("ddp")


@pytest.fixture(scope="module")
def horovod_image(cpu_image) -> Path:
    return cpu_image("horovod")


def ch_run(image: Path, *command: str, binds=()) -> list:
    """`ch-run --set-env` (the image's /ch/environment: its PATH) with `binds` at the same path."""
    bind_args = [arg for path in binds for arg in ("-b", f"{path}:{path}")]
    return ["ch-run", "--set-env", *bind_args, str(image), "--", *command]


def container_env(**extra) -> dict:
    """The host environment as a job has it (ch-run passes it in), with the host venv first on PATH."""
    env = dict(os.environ, USER=os.environ.get("USER", "root"), OMP_NUM_THREADS="1")
    env.update(extra)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env.pop("PYTHONPATH", None)
    return env


def test_the_image_carries_its_labels_environment_and_bind_targets(image):
    labels = json.loads((image / ".singularity.d" / "labels.json").read_text())
    assert labels["org.dlaunch.stack"] == "cpu" and labels["org.dlaunch.framework"] == "ddp"
    assert labels["org.dlaunch.git-revision"] == git_revision()
    assert labels["org.dlaunch.pin.torch"] == "2.14.1" and labels["org.dlaunch.arch"] == os.uname().machine
    environment = dict(line.split("=", 1) for line in (image / "ch" / "environment").read_text().splitlines())
    assert environment["DLAUNCH_STACK"] == "cpu" and environment["PATH"].startswith("/opt/venv/bin:")
    for target in ("work", "scratch", "tmp"):
        assert (image / target).is_dir(), target
    assert (image / "opt" / "dlaunch" / "dlaunch" / "train" / "__main__.py").read_text() == (REPO / "dlaunch" / "train" / "__main__.py").read_text()


def test_python_inside_is_the_images_not_the_hosts(image):
    """The host's PATH (its venv first) goes into the container; /ch/environment puts /opt/venv first."""
    probe = "import sys, torch, dlaunch.train as train; print(sys.prefix, torch.__version__, train.__file__)"
    ran = subprocess.run(ch_run(image, "python", "-c", probe), capture_output=True, text=True, timeout=300,
                         env=container_env())
    assert ran.returncode == 0, ran.stderr
    prefix, torch_version, train_file = ran.stdout.split()
    assert (prefix, train_file) == ("/opt/venv", "/opt/dlaunch/dlaunch/train/__init__.py")
    assert not (image / "opt" / "dlaunch" / "dlaunch" / "cli").exists()  # the image carries the trainer alone
    assert torch_version.split("+")[0] == "2.14.1"  # PyPI's build reports its CUDA: 2.14.1+cu130


def test_local_ddp_job_in_the_container_ends_ok(image, tmp_path):
    """Two gloo ranks under torchrun, inside ch-run, write their metrics to the host through a bind."""
    run_dir = tmp_path / "run"
    command = ch_run(image, "torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=2", "-m", "dlaunch.train", *TINY,
                     "--steps", "4", "--checkpoint-dir", str(run_dir), binds=[tmp_path])
    ran = subprocess.run(command, capture_output=True, text=True, timeout=600, env=container_env())
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "ok" and metrics.header["world_size"] == 2 and len(metrics.epochs) == 2
    assert metrics.header["argv"][0] == "/opt/venv/bin/python"


@pytest.mark.parametrize("launcher", [
    ["horovodrun", "--gloo", "-np", "2"],
    ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"],  # the image's Debian Open MPI
], ids=["gloo", "mpi"])
def test_horovod_job_in_the_container_ends_ok(horovod_image, tmp_path, launcher):
    run_dir = tmp_path / "run"
    command = ch_run(horovod_image, *launcher, "python", "-m", "dlaunch.train", "--framework", "horovod", *TINY,
                     "--steps", "4", "--checkpoint-dir", str(run_dir), binds=[tmp_path])
    # HOME: horovodrun keeps a cache in ~/.horovod, and the image's /root is read-only.
    ran = subprocess.run(command, capture_output=True, text=True, timeout=600, env=container_env(HOME=str(tmp_path)))
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "ok" and metrics.header["world_size"] == 2 and metrics.header["framework"] == "horovod"
    assert metrics.header["argv"][0] == "/opt/venv/bin/python"


def epochs_written(path: Path) -> int:
    try:
        return len(read_metrics(str(path)).epochs)
    except (MetricsError, OSError):
        return 0


@pytest.mark.parametrize("signum,status,code", [(signal.SIGUSR1, "interrupted", 75), (signal.SIGTERM, "cancelled", 143)])
def test_a_signal_to_ch_run_reaches_the_trainer_inside(image, tmp_path, signum, status, code):
    """ch-run execs the command in the container (same process): Slurm's USR1 warning and scancel's TERM
    reach the trainer, which checkpoints and records why it stopped."""
    run_dir = tmp_path / "run"
    command = ch_run(image, "python", "-m", "dlaunch.train", *TINY, "--steps", "100000", "--checkpoint-dir", str(run_dir),
                     binds=[tmp_path])
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=container_env())
    try:
        deadline = time.monotonic() + 300
        while epochs_written(run_dir / "metrics.jsonl") < 1:
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "no epoch within 300 s"
            time.sleep(0.5)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-4000:]
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == status
    assert any(run_dir.rglob("last.pt"))
