"""`--site local` end to end (a real 2-process torchrun/gloo run) and the SIGUSR1 path through torchrun."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlaunch.jobs.launchers import IGNORE_USR1
from dlaunch.train.metrics_schema import read_metrics

TINY = ["--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--threads", "1", "--device", "cpu",
        "--data", "synthetic"]


@pytest.mark.slow
def test_local_site_runs_two_workers_end_to_end(tmp_path):
    dlaunch = [sys.executable, "-m", "dlaunch.cli"]
    result = subprocess.run(dlaunch + ["run", "--site", "local", "--gpus", "2", "--steps", "4", "--warmup-steps", "1",
                                       "--output", str(tmp_path / "runs"), "--experiment", "e2e", "--run-name", "r"] + TINY,
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "runs" / "e2e" / "r"
    plan = json.loads((run / "plan.json").read_text())["plan"]
    metrics = read_metrics(os.path.join(plan["run_dir"], "metrics.jsonl"))
    assert metrics.status == "ok"
    assert metrics.header["world_size"] == 2 and metrics.header["site"] == "local"
    assert metrics.header["experiment"] == "e2e"
    assert (run / "state").read_text() == "finished (exit 0)\n"
    assert "ok" in result.stdout and (run / "local.log").stat().st_size > 0


WORKER = """
import os, signal, sys, time
def on_usr1(*args):
    open(os.path.join(sys.argv[1], "usr1-%s" % os.environ["RANK"]), "w").close()
    sys.exit(75)  # like the trainer: checkpoint, end status `interrupted`, exit 75
signal.signal(signal.SIGUSR1, on_usr1)
open(os.path.join(sys.argv[1], "ready-%s" % os.environ["RANK"]), "w").close()
time.sleep(60)
"""


def step_processes(root: int):
    """`root` and all its descendants: the processes Slurm signals in a job step."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" ", 1)
        except OSError:
            continue
        ppid = int(rest.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(pid))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _signal_step(tmp_path: Path, prefix):
    """Start `prefix torchrun ... worker.py` with 2 workers, deliver SIGUSR1 step-wide, return torchrun's exit code."""
    (tmp_path / "worker.py").write_text(WORKER)
    torchrun = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nnodes=1",
                "--nproc_per_node=2", str(tmp_path / "worker.py"), str(tmp_path)]
    proc = subprocess.Popen(list(prefix) + torchrun, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while len(list(tmp_path.glob("ready-*"))) < 2 and time.time() < deadline:
        time.sleep(0.1)
    assert len(list(tmp_path.glob("ready-*"))) == 2, "the workers did not install their handlers within 60 s"
    for pid in step_processes(proc.pid):
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    return proc.wait(timeout=60)


@pytest.mark.slow
def test_torchrun_survives_usr1_and_workers_get_it(tmp_path):
    """With the rendered prefix, Slurm's SIGUSR1 reaches both workers and torchrun reports their exit."""
    code = _signal_step(tmp_path, IGNORE_USR1)
    assert sorted(p.name for p in tmp_path.glob("usr1-*")) == ["usr1-0", "usr1-1"]
    assert code == 1  # torchrun's "child failed" for the workers' exit 75 (interrupted), not death by signal


@pytest.mark.slow
def test_plain_torchrun_dies_on_usr1(tmp_path):
    """Why the prefix exists: torchrun without it is killed by SIGUSR1 (revisit if torch starts handling it)."""
    assert _signal_step(tmp_path, ()) == -signal.SIGUSR1
