"""Running the real trainer in subprocesses (1 process, or 2 gloo ranks via torchrun) for tests."""
import os
import subprocess
import sys
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small and fast on a CPU: ResNet-18 at 32 px, 1 thread per rank.
TINY = ["--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--threads", "1", "--device", "cpu"]


def trainer_command(args: List[str], nproc: Optional[int] = None) -> List[str]:
    if nproc is None:
        return [sys.executable, "-m", "dlaunch.train"] + args
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "dlaunch.train"] + args


def trainer_env(extra: Optional[dict] = None) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    env.update(extra or {})
    env.pop("WORLD_SIZE", None)
    return env


def run_trainer(args: List[str], nproc: Optional[int] = None, timeout: float = 600,
                env: Optional[dict] = None) -> subprocess.CompletedProcess:
    return subprocess.run(trainer_command(args, nproc), cwd=REPO, env=trainer_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def start_trainer(args: List[str], nproc: Optional[int] = None, env: Optional[dict] = None) -> subprocess.Popen:
    return subprocess.Popen(trainer_command(args, nproc), cwd=REPO, env=trainer_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def load_model_state(checkpoint_dir: str) -> dict:
    from dlaunch.train.checkpoint import checkpoint_path, load_checkpoint
    return load_checkpoint(checkpoint_path(checkpoint_dir))["framework"]["model"]


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, "trainer failed (%d):\n%s\n%s" % (result.returncode, result.stdout[-3000:],
                                                                    result.stderr[-5000:])


def worker_pids(torchrun_pid: int) -> dict:
    """rank -> pid of the trainer processes torchrun started."""
    ranks = {}
    for task in os.listdir("/proc/%d/task" % torchrun_pid):
        with open("/proc/%d/task/%s/children" % (torchrun_pid, task)) as f:
            for pid in map(int, f.read().split()):
                with open("/proc/%d/environ" % pid, "rb") as env:
                    for item in env.read().split(b"\0"):
                        if item.startswith(b"RANK="):
                            ranks[int(item[5:])] = pid
    return ranks

