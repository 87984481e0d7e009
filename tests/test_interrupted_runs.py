"""An interrupted run is no failure and says who stopped it (issue 47 item 5): Ctrl-C (SIGINT to a local run's process
group), `dlaunch cancel` and `scancel`, each at a forced moment (tests/holds.py): status, metrics, results and the
database agree that the run was `cancelled` and by whom, never `ok` with a verdict, never a failure whose cause is
torchrun's `SignalException` traceback. Real runs: torchrun and gloo here, the throw-away Slurm cluster for the two
cancels."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from holds import Hold
from dlaunch.train.metrics_schema import MetricsError, read_metrics
from dlaunch.train.signals import STOP_REASONS

pytestmark = pytest.mark.slow

TINY = ["--model", "resnet18", "--image-size", "32", "--num-classes", "10", "--batch-size", "4", "--threads", "1",
        "--device", "cpu", "--data", "synthetic", "--workers", "0", "--warmup-steps", "1"]
WAIT_S = 300


def dlaunch(cwd: Path, *args: str, env: dict = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlaunch.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, COLUMNS="300", **(env or {})))


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "%s did not happen within %d s" % (what, WAIT_S)
        time.sleep(0.2)


def records(run: Path) -> list:
    try:
        return read_metrics(str(run / "metrics.jsonl")).records
    except (MetricsError, OSError):
        return []


def ctrl_c_local_run(tmp_path: Path, hold: Hold, moment, steps: int) -> subprocess.CompletedProcess:
    """`dlaunch run --site local --gpus 2` (one epoch of `steps` steps per 4) in a process group of its own, held as
    `hold` says; SIGINT to the whole group (what Ctrl-C in its terminal sends) once `moment(run directory)` holds."""
    argv = [sys.executable, "-m", "dlaunch.cli", "run", "--site", "local", "--gpus", "2", "--steps", str(steps),
            "--steps-per-epoch", "4", "--experiment", "e", "--run-name", "r", *TINY]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, **hold.env()))
    try:
        wait_for(lambda: moment(tmp_path / "runs" / "e" / "r") or proc.poll() is not None, "the held moment")
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        hold.release()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def status_of(tmp_path: Path) -> dict:
    shown = dlaunch(tmp_path, "status", "runs/e/r", "--json")
    assert shown.returncode == 0, shown.stderr
    (run,) = json.loads(shown.stdout)
    return run


def row_of(tmp_path: Path) -> dict:
    listed = dlaunch(tmp_path, "results", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    return row


def epochs_done(n: int):
    return lambda run: len([r for r in records(run) if r["type"] == "epoch"]) >= n


def assert_cancelled_by_ctrl_c(tmp_path: Path, ran: subprocess.CompletedProcess) -> None:
    """Status, metrics, the results database and `results` agree: cancelled by Ctrl-C, no failure, no verdict."""
    run = tmp_path / "runs" / "e" / "r"
    end = read_metrics(str(run / "metrics.jsonl")).end
    assert (end["status"], end["reason"]) == ("cancelled", STOP_REASONS["SIGINT"]), ran.stdout + ran.stderr
    seen = status_of(tmp_path)
    assert (seen["status"], seen["ok"], seen["why_failed"]) == ("cancelled", False, None), seen
    assert seen["stopped_by"] == ("cancelled by Ctrl-C on this machine (the trainer got SIGINT); checkpointed: "
                                  "dlaunch run --resume runs/e/r continues it"), seen
    text = dlaunch(tmp_path, "status", "runs/e/r")
    assert "runs/e/r: cancelled by Ctrl-C on this machine" in text.stdout and "SignalException" not in text.stdout
    row = row_of(tmp_path)
    assert (row["status"], row["reason"], row["history"], row["efficiency"]) == (
        "cancelled", STOP_REASONS["SIGINT"], None, None)
    assert " cancelled (SIGINT) " in dlaunch(tmp_path, "results").stdout


def test_ctrl_c_mid_run_is_cancelled_by_you_not_a_failure(tmp_path):
    """SIGINT to the run's process group between its two epochs (held after the first)."""
    ran = ctrl_c_local_run(tmp_path, Hold(tmp_path), epochs_done(1), steps=8)
    assert_cancelled_by_ctrl_c(tmp_path, ran)
    assert [r["epoch"] for r in records(tmp_path / "runs" / "e" / "r") if r["type"] == "epoch"] == [0]
    header = records(tmp_path / "runs" / "e" / "r")[0]  # a CPU/gloo run: no CUDA, cuDNN or NCCL in its provenance
    assert set(header["versions"]) == {"python", "torch", "torchvision", "ddp"}, header["versions"]


def test_ctrl_c_just_after_the_last_step_is_cancelled_not_ok(tmp_path):
    """The signal comes once the last step is done and its epoch recorded, before the trainer's end record (held
    there): the run was stopped, so it is not `ok` with a verdict (it was: no stop check came after the last epoch)."""
    ran = ctrl_c_local_run(tmp_path, Hold(tmp_path), epochs_done(1), steps=4)
    assert_cancelled_by_ctrl_c(tmp_path, ran)


def test_ctrl_c_after_the_end_record_leaves_an_ok_run_ok(tmp_path):
    """The signal comes after the trainer's end record (held there): every step ran and every figure is written, so
    the run is ok in status, metrics and results alike, and status says how its job ended beside (torchrun exits 1
    on the signal; status said `finished (exit 1)` with the SignalException line as why, metrics `ok`)."""
    hold = Hold(tmp_path, after_end=True)
    ran = ctrl_c_local_run(tmp_path, hold, lambda run: hold.held_after_end(0).exists(), steps=4)
    run = tmp_path / "runs" / "e" / "r"
    assert read_metrics(str(run / "metrics.jsonl")).end["status"] == "ok"
    assert (run / "state").read_text() == "finished (exit 1)\n", ran.stdout + ran.stderr
    seen = status_of(tmp_path)
    assert (seen["status"], seen["ok"], seen["why_failed"]) == ("ok", True, None), seen
    assert seen["stopped_by"] == ("its job ended finished (exit 1) after the trainer's end record (its launcher got "
                                  "SIGINT): the run's figures are whole"), seen
    assert row_of(tmp_path)["status"] == "ok"


# -- the two cancels on the test Slurm cluster ------------------------------------------------------------------------

def test_dlaunch_cancel_and_scancel_say_who_cancelled(two_nodes, slurm_site, tmp_path):
    """Two runs held after their first epoch: one cancelled with `dlaunch cancel`, one with Slurm's own `scancel`."""
    from test_slurm_dlaunch import dlaunch as on_cluster
    from test_slurm_dlaunch import epochs_written, job_id, log_text, submit

    hold = Hold(tmp_path)
    runs = {name: submit(two_nodes, tmp_path, slurm_site, name, "--nodes", "1", "--steps", "24", **hold.env())
            for name in ("by-dlaunch", "by-scancel")}
    for run in runs.values():
        wait_for(lambda run=run: epochs_written(run) >= 1, "a first epoch of %s" % run.name)
    assert on_cluster(two_nodes, tmp_path, "cancel", str(runs["by-dlaunch"])).returncode == 0
    assert two_nodes.run(["scancel", job_id(runs["by-scancel"])]).returncode == 0
    for run in runs.values():
        assert two_nodes.wait_job(job_id(run), 120) == "CANCELLED", log_text(run)
        assert read_metrics(str(run / "metrics.jsonl")).end["reason"] == STOP_REASONS["SIGTERM"], log_text(run)
    shown = on_cluster(two_nodes, tmp_path, "status", "--json", *(str(r) for r in runs.values()))
    assert shown.returncode == 0, shown.stderr
    seen = {Path(s["path"]).name: s for s in json.loads(shown.stdout)}
    assert all((s["status"], s["ok"], s["why_failed"]) == ("cancelled", False, None) for s in seen.values()), seen
    assert seen["by-dlaunch"]["stopped_by"].startswith("cancelled by dlaunch cancel (the trainer got SIGTERM); Slurm: "
                                                       "CANCELLED"), seen
    assert seen["by-scancel"]["stopped_by"].startswith("cancelled by Slurm (scancel or an administrator, not dlaunch "
                                                       "cancel) (the trainer got SIGTERM); Slurm: CANCELLED"), seen
    listed = on_cluster(two_nodes, tmp_path, "results", "--json")
    rows = {row["run"]: row for row in json.loads(listed.stdout)}
    assert {(r["status"], r["reason"], r["history"]) for r in rows.values()} == {
        ("cancelled", STOP_REASONS["SIGTERM"], None)}
