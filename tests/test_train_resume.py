"""Stop signals, checkpoints and --resume, with real signals sent to real trainer processes."""
import json
import os
import signal
import time

import pytest

from helpers_train import REPO, TINY, assert_ok, load_model_state, run_trainer, start_trainer, worker_pids
from holds import Hold
from dlaunch.train.checkpoint import checkpoint_path, load_checkpoint
from dlaunch.train.config import EXIT_INTERRUPTED
from dlaunch.train.data.make_folder import make_pattern_folder
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow  # real multi-process / multi-epoch training runs

ARGS = TINY + ["--num-classes", "5", "--epochs", "3", "--steps-per-epoch", "12", "--seed", "5", "--lr", "0.1",
               "--warmup-epochs", "1"]


def wait_for_epoch_record(metrics_path, proc, timeout=300.0):
    """Block until the metrics file has an epoch record (the run is then inside epoch 1)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "trainer ended early: %s" % proc.communicate()[1][-3000:]
        if os.path.exists(metrics_path):
            with open(metrics_path) as f:
                # whole lines only: the trainer may be half-way through writing the next one
                if any(json.loads(line)["type"] == "epoch" for line in f if line.endswith("\n")):
                    return
        time.sleep(0.02)
    raise AssertionError("no epoch record in %s" % metrics_path)


def test_sigusr1_then_resume_equals_an_uninterrupted_run(tmp_path):
    reference, resumed = str(tmp_path / "reference"), str(tmp_path / "resumed")
    assert_ok(run_trainer(ARGS + ["--checkpoint-dir", reference]))

    # held after its first epoch (tests/holds.py) until the signal: it comes mid-run on any machine
    proc = start_trainer(ARGS + ["--checkpoint-dir", resumed], env=Hold(tmp_path).env(REPO))
    metrics_path = os.path.join(resumed, "metrics.jsonl")
    wait_for_epoch_record(metrics_path, proc)
    proc.send_signal(signal.SIGUSR1)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_INTERRUPTED, stderr[-3000:]
    assert read_metrics(metrics_path).status == "interrupted"
    stopped_at = load_checkpoint(checkpoint_path(resumed))
    # the signal came between epochs (while held): the run stops there, before another step
    assert (stopped_at["epoch"], stopped_at["global_step"]) == (1, 12)

    assert_ok(run_trainer(ARGS + ["--checkpoint-dir", resumed, "--resume"]))
    metrics = read_metrics(metrics_path)
    types = [r["type"] for r in metrics.records]
    assert types.count("header") == 1 and types.count("resume") == 1
    assert [r["epoch"] for r in metrics.records if r["type"] == "epoch"] == [0, 1, 2]  # each epoch once
    assert [r["steps"] for r in metrics.epochs] == [12, 12, 12]
    resume = next(r for r in metrics.records if r["type"] == "resume")
    assert (resume["epoch"], resume["step"]) == (stopped_at["epoch"], stopped_at["global_step"])
    assert metrics.status == "ok" and metrics.end["epochs_completed"] == 3

    expected, actual = load_model_state(reference), load_model_state(resumed)
    assert expected.keys() == actual.keys()
    different = [k for k in expected if not expected[k].equal(actual[k])]
    assert not different, different
    reference_lrs = [r["lr"] for r in read_metrics(os.path.join(reference, "metrics.jsonl")).epochs]
    assert [r["lr"] for r in metrics.epochs] == reference_lrs


def test_sigterm_to_one_rank_cancels_all_ranks_at_the_same_step(tmp_path):
    run_dir = str(tmp_path / "run")
    hold = Hold(tmp_path)  # both ranks hold after their first epoch; rank 1 leaves on the signal, rank 0 when released
    proc = start_trainer(ARGS + ["--checkpoint-dir", run_dir], nproc=2, env=hold.env(REPO))
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    wait_for_epoch_record(metrics_path, proc)
    os.kill(worker_pids(proc.pid)[1], signal.SIGTERM)
    hold.release(rank=0)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0
    end = read_metrics(metrics_path).end
    assert end["status"] == "cancelled", stderr[-3000:]
    assert len(end["param_digests"]) == 2 and len(set(end["param_digests"])) == 1
    assert load_checkpoint(checkpoint_path(run_dir))["global_step"] == 12  # at the end of epoch 0, where the signal came


def test_unreadable_image_ends_failed_with_the_reason(tmp_path):
    data = str(tmp_path / "data")
    make_pattern_folder(data, classes=2, images_per_class=4, val_per_class=1, size=32)
    for name in os.listdir(os.path.join(data, "train", "class_000")):
        with open(os.path.join(data, "train", "class_000", name), "wb") as f:
            f.write(b"not a jpeg")
    metrics_path = str(tmp_path / "metrics.jsonl")
    result = run_trainer(TINY + ["--data", data, "--workers", "0", "--steps", "2", "--metrics", metrics_path])
    assert result.returncode not in (0, 2)
    end = read_metrics(metrics_path).end
    assert end["status"] == "failed" and "UnidentifiedImageError" in end["reason"]


def test_a_job_restarted_by_its_scheduler_resumes_without_being_told(tmp_path):
    """A requeued job runs its script again unchanged: DLAUNCH_RESTART_COUNT >= 1 makes it a resume."""
    run_dir = str(tmp_path / "run")
    proc = start_trainer(ARGS + ["--checkpoint-dir", run_dir], env=Hold(tmp_path).env(REPO))  # held until the signal
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    wait_for_epoch_record(metrics_path, proc)
    proc.send_signal(signal.SIGUSR1)  # stands in for the node that failed: a checkpoint to come back to
    proc.communicate(timeout=300)
    again = run_trainer(ARGS + ["--checkpoint-dir", run_dir])  # the same command line, not restarted
    assert again.returncode == 2 and "pass --resume" in again.stderr
    assert_ok(run_trainer(ARGS + ["--checkpoint-dir", run_dir], env={"DLAUNCH_RESTART_COUNT": "1"}))
    metrics = read_metrics(metrics_path)
    assert metrics.status == "ok" and [e["epoch"] for e in metrics.epochs] == [0, 1, 2]
    assert [json.loads(line)["type"] for line in open(metrics_path)].count("resume") == 1
