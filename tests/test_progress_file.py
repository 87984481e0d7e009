"""The trainer's progress file within an epoch (dlaunch/train/progress.py) and what `dlaunch watch` and the live view
of `dlaunch run --site local` make of it: real trainer processes (gloo on CPU), the progress written after every
step ($DLAUNCH_PROGRESS_INTERVAL_S=0), a run held mid-epoch (tests/holds.py) while the test looks at it."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from dlaunch.train.metrics_schema import read_metrics
from dlaunch.train.progress import DEFAULT_INTERVAL_S, interval_s, read_progress_file
from helpers_train import TINY, assert_ok, run_trainer
from holds import Hold, Lines

DLAUNCH = [sys.executable, "-m", "dlaunch.cli"]
EVERY_STEP = {"DLAUNCH_PROGRESS_INTERVAL_S": "0"}
# What a run held after 3 of its 6 steps (one epoch) shows: steps, the epoch's images/s and loss so far, ETA.
WITHIN_EPOCH = (r"running; steps 3/6, epoch 0/1, [0-9.]+ images/s \(this epoch so far, steps only\), "
                r"loss [0-9.]+ \(rank 0, this epoch so far\), ETA \d+s")


@pytest.mark.parametrize("host_syncs, loss_steps", [("default", 12), ("minimal", 10)])
def test_the_last_progress_file_of_an_epoch_agrees_with_its_epoch_record(tmp_path, host_syncs, loss_steps):
    """One process, 12 steps, written after each: the last file (after step 12) has the epoch record's steps and
    measured steps; its loss is the record's (one rank: the rank mean is rank 0's) over the steps it read: all 12,
    with --host-syncs minimal the 10 read at the stop check; its images/s, read before the epoch's closing sync, at
    least the record's."""
    metrics = tmp_path / "metrics.jsonl"
    result = run_trainer(TINY + ["--steps", "12", "--steps-per-epoch", "12", "--warmup-steps", "2", "--host-syncs",
                                 host_syncs, "--metrics", str(metrics)], env=EVERY_STEP)
    assert_ok(result)
    (record,) = read_metrics(str(metrics)).epochs
    progress = read_progress_file(str(tmp_path / "progress.json"))
    assert progress is not None
    assert {k: progress[k] for k in ("epoch", "epochs", "step_in_epoch", "steps_per_epoch", "global_step", "total_steps",
                                     "measured_steps", "loss_steps")} == {
        "epoch": 0, "epochs": 1, "step_in_epoch": 12, "steps_per_epoch": 12, "global_step": 12, "total_steps": 12,
        "measured_steps": record["measured_steps"], "loss_steps": loss_steps}
    assert record["measured_steps"] == 10
    if host_syncs == "default":
        assert progress["loss"] == pytest.approx(record["loss"], rel=1e-12)
    assert progress["images_per_s"] >= record["images_per_s"] > 0
    assert progress["epoch_time_s"] <= record["epoch_time_s"] and progress["time"] <= record["time"]


@pytest.mark.parametrize("value, seconds", [("0", 0.0), ("0.5", 0.5), ("", DEFAULT_INTERVAL_S), ("-1", DEFAULT_INTERVAL_S),
                                            ("nan", DEFAULT_INTERVAL_S), ("soon", DEFAULT_INTERVAL_S)])
def test_the_progress_interval_from_the_environment(value, seconds):
    assert interval_s({"DLAUNCH_PROGRESS_INTERVAL_S": value}) == seconds
    assert interval_s({}) == DEFAULT_INTERVAL_S


def wait_for_file(path, proc: subprocess.Popen, timeout: float = 600) -> None:
    """Until the held trainer has created `path` (the state is forced: the run waits there until released)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the run ended before it was held"
        assert time.monotonic() < deadline, "not held within %g s" % timeout
        time.sleep(0.1)


@pytest.mark.slow
def test_a_local_run_shows_steps_images_per_s_loss_and_eta_before_its_first_epoch_ends(tmp_path):
    """`dlaunch run --site local` of one epoch (as `make demo`), held after 3 of its 6 steps: `dlaunch watch --once`
    and the run's own view (through a pipe) show where it is within the epoch, each figure labelled; once ended, its
    epoch record is what is shown."""
    hold = Hold(tmp_path, at_step=3)
    env = dict(os.environ, DLAUNCH_STATUS_CACHE=str(tmp_path / "cache"), **EVERY_STEP, **hold.env())
    argv = DLAUNCH + ["run", "--site", "local", "--gpus", "2", "--steps", "6", "--steps-per-epoch", "6", "--warmup-steps",
                      "1", "--data", "synthetic", "--experiment", "e", "--run-name", "r"] + TINY
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        wait_for_file(hold.held_at_step(0), proc)
        once = subprocess.run(DLAUNCH + ["watch", "--once", "runs/e/r"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert once.returncode == 0, once.stdout + once.stderr
        assert re.fullmatch(r"\d\d:\d\d:\d\d runs/e/r: running here \(dlaunch pid %d\); %s\n" % (proc.pid, WITHIN_EPOCH),
                            once.stdout), once.stdout
        out.wait_for(r"runs/e/r: running here \(dlaunch pid \d+\); " + WITHIN_EPOCH, 600)  # the run's own view
        progress = json.loads((tmp_path / "runs/e/r/progress.json").read_text())
        assert (progress["global_step"], progress["measured_steps"], progress["loss_steps"]) == (3, 2, 3)
    finally:
        hold.release()
        proc.wait(timeout=600)
    lines = out.join(60).splitlines()
    assert proc.returncode == 0, "\n".join(lines) + err.join(60)
    ended = [line for line in lines if re.search(r"runs/e/r: finished \(exit 0\)", line)]
    assert len(ended) == 1 and re.search(r"; ok; steps 6/6, epoch 1/1, [0-9.]+ images/s, loss [0-9.]+(;|$)", ended[0]), lines
    assert (tmp_path / "runs/e/r/progress.json").exists()  # left behind, not shown: the run has ended
