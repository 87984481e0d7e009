"""The local scheduler's step (`python -m dlaunch.schedulers.local --tasks N -- COMMAND`), with real processes:
one task's failure ends the others at once, whichever task fails."""
import os
import signal
import subprocess
import sys

# Every task but the last waits for ever; the last one fails at once.
LAST_FAILS_FIRST = 'if [ "$DLAUNCH_TASK_ID" = "$((DLAUNCH_NTASKS - 1))" ]; then exit 3; fi; exec sleep infinity'
HANG_GUARD_S = 120  # nothing is timed: a step that waits for its live tasks never returns without it


def test_the_last_task_failing_first_ends_the_others_at_once():
    """The wait loop once stopped polling at the first live task: task 2's failure went unseen while task 0 ran."""
    step = subprocess.Popen([sys.executable, "-m", "dlaunch.schedulers.local", "--tasks", "3", "--", "bash", "-c",
                             LAST_FAILS_FIRST], stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = step.communicate(timeout=HANG_GUARD_S)
    finally:
        try:
            os.killpg(step.pid, signal.SIGKILL)  # the tasks too, if the step left them
        except ProcessLookupError:
            pass
        step.wait()
    assert step.returncode == 3, stderr
    assert "dlaunch-local-step: task 2 exited with 3; ending the others" in stderr
