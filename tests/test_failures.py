"""The failure explainer (dlaunch/runs/failures.py) on logs the tests write, shaped like real ones."""
from pathlib import Path

import pytest

from dlaunch.runs.failures import explain, reconcile, scheduler_label
from dlaunch.schedulers import JobState
from dlaunch.schedulers.pbs import Pbs
from dlaunch.schedulers.slurm import Slurm
from dlaunch.train.signals import OTHER_RANK, STOP_REASONS

SLURM = dict(verdicts=Slurm.log_verdicts, noise=Slurm.log_noise)

TORCHRUN_NOISE = [
    "[W1122 14:18:06 socket.cpp:1028] [c10d] some warning",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "  exitcode  : 2 (pid: 4242)",
    "train FAILED",
    "srun: error: dl-node1: task 0: Exited with exit code 1",
]


def write_log(folder: Path, name: str, lines) -> Path:
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_written_log_the_trainers_own_error_beats_torchruns_exit_code(tmp_path):
    log = write_log(tmp_path, "slurm-7.out", TORCHRUN_NOISE[:3] + ["train: error: no images in /data/train/class_999"])
    cause = explain([log], **SLURM)
    assert cause.line == "train: error: no images in /data/train/class_999" and cause.where == "slurm-7.out:4"


def test_written_log_the_failing_ranks_error_beats_its_peers_symptom(tmp_path):
    log = write_log(tmp_path, "slurm-8.out", [
        "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.77.0.12]:1234",
        *TORCHRUN_NOISE,
        *["  File \"x.py\", line %d, in f" % i for i in range(60)],
        "[rank1]: PIL.UnidentifiedImageError: cannot identify image file '/data/train/c1/bad.JPEG'",
    ])
    assert "UnidentifiedImageError" in explain([log], **SLURM).line


def test_written_log_a_full_disk_reads_no_space_left(tmp_path):
    log = write_log(tmp_path, "slurm-9.out", [
        "Traceback (most recent call last):",
        "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0",
        *TORCHRUN_NOISE,
        "OSError: [Errno 28] No space left on device",
    ])
    assert explain([log], **SLURM).line == "OSError: [Errno 28] No space left on device"


def test_written_log_a_killed_rank_is_named_by_torchruns_root_cause(tmp_path):
    log = write_log(tmp_path, "slurm-3.out", [
        "[rank0]: RuntimeError: Connection reset by peer",
        "  exitcode  : -9 (pid: 77)",
        "Signal 9 (SIGKILL) received by PID 77",
    ])
    assert explain([log], **SLURM).line == "Signal 9 (SIGKILL) received by PID 77"


def test_written_logs_the_newest_submission_and_attempt_speak_first(tmp_path):
    old = write_log(tmp_path, "slurm-9.out", ["train: error: an old mistake, fixed since"])
    new = write_log(tmp_path, "slurm-10.out", [
        "dlaunch: job 10 attempt 1 on dl-node[1-2] at 2026-11-22T14:00:00Z",
        "slurmstepd: error: *** JOB 10 ON dl-node1 CANCELLED AT 2026-11-22T14:01:04 DUE TO NODE FAILURE ***",
        "dlaunch: job 10 attempt 2 on dl-node[1-2] at 2026-11-22T14:02:00Z",
        "OSError: [Errno 28] No space left on device",
    ])
    assert Slurm().log_files(tmp_path) == [old, new]  # numeric job order, not slurm-10 before slurm-9
    assert explain([old, new], **SLURM).where == "slurm-10.out:4"
    write_log(tmp_path, "slurm-10.out", new.read_text().splitlines()[:3])  # the second attempt says nothing yet
    assert "DUE TO NODE FAILURE" in explain([old, new], **SLURM).line


def test_written_pbs_log_pbs_verdict_beats_mpiexecs_noise(tmp_path):
    """PBS's own words (OpenPBS src/resmom/mom_main.c) rank as the scheduler's verdict; without the PBS
    backend's patterns they are not recognised."""
    log = write_log(tmp_path, "pbs.out", [
        "dlaunch: job 4711.pbs attempt 1 on x1,x2 at 2026-11-22T14:00:00Z",
        "x1.hsn.cm.polaris.alcf.anl.gov: rank 3 died from signal 15",
        "=>> PBS: job killed: walltime 3623 exceeded limit 3600",
    ])
    assert Pbs().log_files(tmp_path) == [log]
    assert explain([log], Pbs.log_verdicts, Pbs.log_noise).line == "=>> PBS: job killed: walltime 3623 exceeded limit 3600"
    assert explain([log]) is None


def test_written_log_without_any_cause_explains_nothing(tmp_path):
    assert explain([write_log(tmp_path, "slurm-1.out", ["epoch 0 ok", "epoch 1 ok"])]) is None
    assert explain([]) is None


@pytest.mark.parametrize("meaning, metrics, ended, shown", [
    (JobState.FAILED, "running", True, "died"),             # an OOM kill of rank 0: no end record
    (JobState.FAILED, "no metrics yet", True, "died"),      # a launch failure: the trainer never started
    (JobState.GONE, "running", True, "died"),
    (None, "running", True, "died"),  # a local run: `finished (exit 1)`
    (JobState.RUNNING, "running", False, "running"),
    (JobState.PENDING, "no metrics yet", False, "no metrics yet"),
    (JobState.TIMEOUT, "cancelled", True, "interrupted"),   # the time limit, from a trainer that could not tell
    (JobState.CANCELLED, "cancelled", True, "cancelled"),
    (JobState.FAILED, "interrupted", True, "interrupted"),  # exit 75 reads FAILED to Slurm
    (JobState.COMPLETED, "ok", True, "ok"),
])
def test_reconcile_trusts_the_metrics_unless_the_job_ended_without_saying_how(meaning, metrics, ended, shown):
    assert reconcile(meaning, metrics, ended) == shown


def test_a_failed_job_whose_trainer_was_interrupted_or_diverged_says_so_beside_the_schedulers_state():
    assert scheduler_label("FAILED", JobState.FAILED, "interrupted") == "FAILED (exit 75: checkpointed, resume it)"
    assert scheduler_label("F", JobState.FAILED, "diverged") == "F (exit 65: the loss diverged)"  # PBS
    assert scheduler_label("FAILED", JobState.FAILED, "failed") == "FAILED"
    assert scheduler_label("TIMEOUT", JobState.TIMEOUT, "interrupted") == "TIMEOUT"


# -- who stopped a run (issue 47 item 5) --------------------------------------------------------------------------------

def test_a_launchers_stop_signal_is_read_from_the_newest_attempt(tmp_path):
    from dlaunch.runs.failures import launcher_stop

    log = tmp_path / "local.log"
    log.write_text("dlaunch: job local-1 attempt 1 on h\n"
                   "W1127 torch/distributed/elastic/agent/server/api.py:753] Received 2 death signal, shutting down workers\n"
                   "dlaunch: job local-1 attempt 2 on h\nepoch 0\n")
    assert launcher_stop([log]) is None  # the newest attempt got none
    log.write_text(log.read_text() + "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got "
                   "signal: 15\n")
    assert launcher_stop([log]) == "SIGTERM"
    log.write_text("Received 10 death signal, shutting down workers\n")  # SIGUSR1 never reaches torchrun: no stop
    assert launcher_stop([log]) is None


@pytest.mark.parametrize("reason,meaning,requested,here,signal_,wrote,said", [
    (STOP_REASONS["SIGINT"], None, False, True, None, True,
     "cancelled by Ctrl-C on this machine (the trainer got SIGINT)"),
    (None, None, False, True, "SIGINT", False,
     "cancelled by Ctrl-C on this machine (before its trainer wrote how it ended; its launcher got SIGINT)"),
    (STOP_REASONS["SIGTERM"], JobState.CANCELLED, True, False, None, True,
     "cancelled by dlaunch cancel (the trainer got SIGTERM)"),
    (STOP_REASONS["SIGTERM"], JobState.CANCELLED, False, False, None, True,
     "cancelled by Slurm (scancel or an administrator, not dlaunch cancel) (the trainer got SIGTERM)"),
    (STOP_REASONS["SIGTERM"], None, False, True, None, True,
     "cancelled by SIGTERM: the job was cancelled (scancel, dlaunch cancel) or ended by its scheduler (the trainer got "
     "SIGTERM)"),
    (None, JobState.CANCELLED, False, False, None, False,
     "cancelled by Slurm (scancel or an administrator, not dlaunch cancel) (before its trainer wrote how it ended)"),
])
def test_who_stopped_a_cancelled_run(reason, meaning, requested, here, signal_, wrote, said):
    from dlaunch.runs.failures import stopped_by

    assert stopped_by("cancelled", reason, meaning, requested, here, "Slurm", signal_, wrote_end=wrote) == said


def test_who_stopped_an_interrupted_run():
    from dlaunch.runs.failures import stopped_by

    limit = stopped_by("interrupted", STOP_REASONS["time limit"], JobState.TIMEOUT, False, False, "Slurm")
    assert limit == "interrupted by the job's time limit (the trainer got SIGTERM at the time limit)"
    warned = stopped_by("interrupted", STOP_REASONS["SIGUSR1"], JobState.FAILED, False, False, "Slurm")
    assert warned == ("interrupted by SIGUSR1: the scheduler's warning before the time limit (or scancel "
                      "--signal=USR1) (the trainer got SIGUSR1)")
    assert stopped_by("interrupted", OTHER_RANK, None, False, True, "this machine") == (
        "interrupted by another rank: a stop signal that reached another process of the run")


@pytest.mark.parametrize("meaning,metrics,signal_,shown", [
    (JobState.CANCELLED, "running", None, "cancelled"),  # scancel before the trainer wrote its end
    (None, "no metrics yet", "SIGINT", "cancelled"),  # Ctrl-C during a local run's start-up
    (None, "running", None, "died"),
])
def test_a_job_stopped_before_its_trainer_said_how_it_ended_is_cancelled_not_died(meaning, metrics, signal_, shown):
    assert reconcile(meaning, metrics, True, signal_) == shown
