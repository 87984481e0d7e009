"""The local scheduler (dlaunch/schedulers/local.py) with real processes: one task's failure ends the others at
once, whichever task fails; a local run's job lives in a process group of its own, which `dlaunch cancel` finds
and ends whatever became of the dlaunch process that started it, and which Ctrl-C reaches through that process;
a group whose id is reused is not the run's; `--resume` is refused for a framework that keeps no checkpoints."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

import dlaunch.cli
from dlaunch.cli import main
from dlaunch.jobs.request import LaunchRequest
from dlaunch.runs import service
from dlaunch.schedulers.local import job_group

REPO = Path(__file__).resolve().parent.parent
# Every task but the last waits for ever; the last one fails at once.
LAST_FAILS_FIRST = 'if [ "$DLAUNCH_TASK_ID" = "$((DLAUNCH_NTASKS - 1))" ]; then exit 3; fi; exec sleep infinity'
HANG_GUARD_S = 120  # nothing is timed: without the behaviour under test these waits never end
# A local job of two tasks that say they run, then wait for ever (no trainer: the job script is this one).
TWO_SLEEPING_TASKS = (
    "#!/bin/bash\nexec python -m dlaunch.schedulers.local --tasks 2 -- "
    "bash -c 'touch ready-$DLAUNCH_TASK_ID; exec sleep infinity'\n"
)
# `dlaunch run --site local` as the run service does it, with the job script above.
FOLLOW = """
import dataclasses, sys
from pathlib import Path
from dlaunch.jobs.request import LaunchRequest
from dlaunch.runs import service
job = service.prepare(LaunchRequest(site="local", gpus=1), run_dir=Path(sys.argv[1]), dry_run=True)
sys.exit(service.submit_all([dataclasses.replace(job, script=sys.argv[2])], print).exit_code)
"""


def test_the_last_task_failing_first_ends_the_others_at_once():
    """The wait loop once stopped polling at the first live task: task 2's failure went unseen while task 0 ran."""
    step = subprocess.Popen(
        [sys.executable, "-m", "dlaunch.schedulers.local", "--tasks", "3", "--", "bash", "-c", LAST_FAILS_FIRST],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = step.communicate(timeout=HANG_GUARD_S)
    finally:
        end_group(step.pid)
        step.wait()
    assert step.returncode == 3, stderr
    assert "dlaunch-local-step: task 2 exited with 3; ending the others" in stderr


def end_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", "")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setattr(dlaunch.cli.out, "width", 300)
    return tmp_path


def start_followed(run: Path) -> subprocess.Popen:
    """The dlaunch process of a local run of TWO_SLEEPING_TASKS, once both tasks run."""
    dlaunch = subprocess.Popen(
        [sys.executable, "-c", FOLLOW, str(run), TWO_SLEEPING_TASKS],
        cwd=run.parent,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_until(lambda: len(list(run.glob("ready-*"))) == 2 or dlaunch.poll() is not None, "the tasks did not start")
    assert dlaunch.poll() is None, "dlaunch ended before its job's tasks ran"
    return dlaunch


def group_of(run: Path) -> int:
    return int((run / "job_id").read_text().strip().split("-")[1])


def test_cancel_ends_a_local_runs_tasks_after_its_dlaunch_was_killed(here, capsys):
    """dlaunch SIGKILLed while its local job runs: the job runs on, `status` says so, and `cancel` ends its tasks
    (it said 'nothing to cancel' while they ran on)."""
    run = here / "runs" / "e" / "r"
    run.parent.mkdir(parents=True)
    dlaunch = start_followed(run)
    group = group_of(run)
    try:
        dlaunch.kill()
        dlaunch.wait()
        assert job_group("local-%d" % group, run) == group  # the job's processes outlive the dlaunch that started them
        assert main(["status", str(run)]) == 0
        assert "running here (dlaunch pid %d has ended)" % dlaunch.pid in capsys.readouterr().out
        assert main(["cancel", str(run)]) == 0
        assert capsys.readouterr().err.strip() == "cancelled job local-%d" % group
        wait_until(lambda: job_group("local-%d" % group, run) is None, "the job's tasks ran on after the cancel")
        assert main(["status", str(run)]) == 0
        assert "cancel requested" in capsys.readouterr().out
        assert main(["cancel", str(run)]) == 0
        assert "nothing to cancel" in capsys.readouterr().err
    finally:
        end_group(group)


def test_ctrl_c_reaches_a_local_job_through_the_dlaunch_that_follows_it(here):
    """The job's session is its own, which the terminal's SIGINT does not reach: dlaunch passes it on, the tasks end
    and dlaunch records the job's exit (the step's: 128 + SIGINT)."""
    run = here / "runs" / "e" / "r"
    run.parent.mkdir(parents=True)
    dlaunch = start_followed(run)
    group = group_of(run)
    try:
        dlaunch.send_signal(signal.SIGINT)
        assert dlaunch.wait(timeout=HANG_GUARD_S) == 128 + signal.SIGINT
        assert (run / "state").read_text() == "finished (exit %d)\n" % (128 + signal.SIGINT)
    finally:
        end_group(group)


def test_a_process_group_that_started_after_the_job_id_was_written_is_not_the_run(here, capsys):
    """A reused id: a group of processes in the run directory, but started after its job id was recorded."""
    from test_watch import header, write_run

    run = write_run(here / "runs" / "e", "r", [header()], state="finished (exit 0)")
    (run / "state").write_text("cancel requested\n")
    with subprocess.Popen(["sleep", "600"], cwd=run, start_new_session=True) as later:
        (run / "job_id").write_text("local-%d\n" % later.pid)
        os.utime(run / "job_id", (time.time() - 60, time.time() - 60))
        try:
            assert job_group("local-%d" % later.pid, run) is None
            assert main(["cancel", str(run)]) == 0
            assert "nothing to cancel" in capsys.readouterr().err
            assert later.poll() is None
        finally:
            later.kill()


def test_resume_is_refused_for_a_framework_that_keeps_no_checkpoints(here, capsys):
    """An MXNet parameter-server run resumed: one task failed on the finished run's files and the others sat idle.
    Now: one line naming the framework, exit 2, nothing written."""
    prepared = service.prepare(
        LaunchRequest(site="local", framework="mx-ps-sync", experiment="e", run_name="mx"), dry_run=True
    )
    from dlaunch.runs.rundir import RunDir

    run = RunDir.create(prepared.run_dir)
    run.write_plan(prepared.plan.to_dict(), prepared.request.to_dict())
    run.write("job_id", "local-1\n")
    run.set_state("finished (exit 0)")
    before = sorted(p.name for p in run.path.iterdir())
    capsys.readouterr()
    assert main(["run", "--resume", str(run.path)]) == 2
    assert capsys.readouterr().err == (
        "dlaunch: error: --resume: mx-ps-sync keeps no checkpoints, so its runs cannot resume: run it anew\n"
    )
    assert sorted(p.name for p in run.path.iterdir()) == before and run.state == "finished (exit 0)"


def test_a_local_runs_word_for_an_interrupted_job_is_shown_as_it_was():
    """A local job's state has a meaning now (FAILED for `finished (exit 75)`): its word, which gives the exit code
    itself, gets no second one (a batch system's FAILED still says what exit 75 meant)."""
    from dlaunch.runs.failures import scheduler_label
    from dlaunch.schedulers import JobState

    assert scheduler_label("finished (exit 75)", JobState.FAILED, "interrupted") == "finished (exit 75)"
    assert scheduler_label("FAILED", JobState.FAILED, "interrupted") == "FAILED (exit 75: checkpointed, resume it)"
