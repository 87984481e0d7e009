"""The trainer's stop signals (dlaunch/train/signals.py), delivered for real to fresh Python processes."""
import os
import subprocess
import sys
import time

import pytest

from dlaunch.train.signals import (END_TIME_VARIABLE, OTHER_RANK, STOP_REASONS, TIME_LIMIT_SLACK_S, at_time_limit,
                                   job_end_time, stop_cause)

# Install the handlers, send this process the given signals, print the flags the loop would reduce.
PROBE = """
import os, signal, sys
from dlaunch.train.signals import StopSignals
signals = StopSignals().install()
for name in sys.argv[1:]:
    os.kill(os.getpid(), getattr(signal, name))
print(StopSignals().flags())
print("|".join(StopSignals().reason(status) for status in ("cancelled", "interrupted")))
"""


def flags_after(*signals: str, end_time: float = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != END_TIME_VARIABLE}
    if end_time is not None:
        env[END_TIME_VARIABLE] = "%d" % end_time
    done = subprocess.run([sys.executable, "-c", PROBE, *signals], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[0]


def reasons_after(*signals: str, end_time: float = None) -> list:
    """The end record's reason for `cancelled` and for `interrupted` after `signals`, as the causes they name."""
    env = {k: v for k, v in os.environ.items() if k != END_TIME_VARIABLE}
    if end_time is not None:
        env[END_TIME_VARIABLE] = "%d" % end_time
    done = subprocess.run([sys.executable, "-c", PROBE, *signals], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return [stop_cause(reason) for reason in done.stdout.strip().splitlines()[1].split("|")]


def test_usr1_interrupts_and_term_or_int_cancel():
    assert flags_after() == "[0.0, 0.0]"
    assert flags_after("SIGUSR1") == "[1.0, 0.0]"
    assert flags_after("SIGTERM") == "[0.0, 1.0]"
    assert flags_after("SIGINT") == "[0.0, 1.0]"


def test_sigterm_at_the_time_limit_interrupts_and_before_it_cancels():
    now = time.time()
    assert flags_after("SIGTERM", end_time=now + 5) == "[1.0, 0.0]"  # Slurm ending the job for its limit
    assert flags_after("SIGTERM", end_time=now - 30) == "[1.0, 0.0]"  # limits are enforced late, too
    assert flags_after("SIGTERM", end_time=now + 3600) == "[0.0, 1.0]"  # scancel an hour before the limit
    assert flags_after("SIGINT", end_time=now) == "[0.0, 1.0]"  # Ctrl-C is never the limit


def test_the_end_records_reason_names_the_signal_that_stopped_the_run():
    """Who stopped a run, as its end record says it (issue 47 item 5): the launcher's status reads it back."""
    assert reasons_after("SIGINT") == ["SIGINT", "another rank"]  # Ctrl-C cancels; it is no interruption
    assert reasons_after("SIGTERM") == ["SIGTERM", "another rank"]
    assert reasons_after("SIGUSR1") == ["another rank", "SIGUSR1"]
    assert reasons_after("SIGTERM", end_time=time.time()) == ["another rank", "time limit"]
    assert reasons_after() == ["another rank", "another rank"]  # only another rank got one: the loop agreed on it
    assert all(stop_cause(text) == cause for cause, text in STOP_REASONS.items())
    assert stop_cause(OTHER_RANK) == "another rank" and stop_cause("oom") is None and stop_cause(None) is None


@pytest.mark.parametrize("value, expected", [("1700000000", 1700000000.0), ("", None), ("soon", None)])
def test_job_end_time_is_read_or_unknown(value, expected):
    assert job_end_time({END_TIME_VARIABLE: value}) == expected
    assert job_end_time({}) is None
    assert not at_time_limit(time.time(), None)
    assert at_time_limit(1000.0, 1000.0 + TIME_LIMIT_SLACK_S)


def test_python_m_train_installs_the_handlers_before_importing_torch():
    # A worker under torchrun starts with SIGUSR1 ignored; until the trainer's handler is installed a
    # warning is lost. Importing the entry point installs it, and torch is not imported yet by then.
    probe = ("import signal, sys; signal.signal(signal.SIGUSR1, signal.SIG_IGN); import dlaunch.train.__main__; "
             "print(signal.getsignal(signal.SIGUSR1) not in (signal.SIG_IGN, signal.SIG_DFL), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
