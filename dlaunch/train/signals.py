"""The stop signals, torch-free, so that `python -m dlaunch.train` installs them before any slow import.

SIGUSR1 (Slurm's warning before the time limit, `sbatch --signal=USR1@120`, or `scancel --signal=USR1`)
asks for a checkpoint and end status `interrupted` (resumable, exit 75). SIGTERM (`scancel`) or SIGINT
(Ctrl-C in a local run) asks for a checkpoint and `cancelled` (exit 143), except that a SIGTERM at the
job's time limit is Slurm ending the job for its limit: that is an interruption too. Slurm 22.05 does not
tell a job its end time (SLURM_JOB_END_TIME exists from 23.02 on), so the batch script exports
`DLAUNCH_JOB_END_TIME` (Unix seconds). The handlers only record; the loop asks all ranks every few steps
and after each epoch.

A worker under torchrun starts with SIGUSR1 ignored (inherited from torchrun, see dlaunch/jobs/launchers.py):
a warning sent before `install()` is lost, which is why it is the first thing `python -m dlaunch.train` does.

The end record of a stopped run says what stopped it (`StopSignals.reason`: one of STOP_REASONS, whose first words
name the cause, which `stop_cause` reads back for the launcher's status: who stopped the run).
"""

import os
import signal
import time
from typing import Any, Dict, List, Mapping, Optional

# A SIGTERM this close to (or after) the job's end time is taken as the time limit, not a cancel:
# Slurm enforces limits with a resolution of up to a minute, in either direction.
TIME_LIMIT_SLACK_S = 60.0
END_TIME_VARIABLE = "DLAUNCH_JOB_END_TIME"

# The end record's `reason` of a run stopped by a signal, by cause (its text starts with the cause).
STOP_REASONS = {
    "SIGINT": "SIGINT: Ctrl-C, or a signal to the run's processes",
    "SIGTERM": "SIGTERM: the job was cancelled (scancel, dlaunch cancel) or ended by its scheduler",
    "time limit": "time limit: SIGTERM at the job's end time",
    "SIGUSR1": "SIGUSR1: the scheduler's warning before the time limit (or scancel --signal=USR1)",
}
OTHER_RANK = "another rank: a stop signal that reached another process of the run"
STOP_STATUSES = ("cancelled", "interrupted")

# One record per process: handlers installed twice (or by two instances) keep what was received.
_received: Dict[int, bool] = {signal.SIGUSR1: False, signal.SIGTERM: False, signal.SIGINT: False}
_time_limit = [False]


def job_end_time(environ: Mapping[str, str]) -> Optional[float]:
    """The job's end time from `DLAUNCH_JOB_END_TIME`, or None when unknown or malformed."""
    try:
        return float(environ[END_TIME_VARIABLE])
    except (KeyError, ValueError):
        return None


def at_time_limit(now: float, end_time: Optional[float]) -> bool:
    return end_time is not None and now >= end_time - TIME_LIMIT_SLACK_S


def _handle(signum: int, frame: Any) -> None:
    _received[signum] = True
    if signum == signal.SIGTERM and at_time_limit(time.time(), job_end_time(os.environ)):
        _time_limit[0] = True


class StopSignals:
    """The stop signals this process has received since `install()`."""

    def install(self) -> "StopSignals":
        for signum in _received:
            signal.signal(signum, _handle)
        return self

    def flags(self) -> List[float]:
        """[interrupt, cancel] as 0/1 for an all-rank reduction; a time-limit SIGTERM interrupts."""
        interrupt = _received[signal.SIGUSR1] or _time_limit[0]
        cancel = (_received[signal.SIGTERM] and not _time_limit[0]) or _received[signal.SIGINT]
        return [float(interrupt), float(cancel)]

    def reason(self, status: str) -> str:
        """The end record's reason for a stop `status` (STOP_STATUSES): the signal this process got that gives it,
        or, where only another rank got one, OTHER_RANK."""
        if status == "cancelled":
            terminated = _received[signal.SIGTERM] and not _time_limit[0]
            cause = "SIGINT" if _received[signal.SIGINT] else "SIGTERM" if terminated else None
        else:
            cause = "time limit" if _time_limit[0] else "SIGUSR1" if _received[signal.SIGUSR1] else None
        return STOP_REASONS[cause] if cause else OTHER_RANK


def stop_cause(reason: Optional[str]) -> Optional[str]:
    """The cause (a key of STOP_REASONS, or "another rank") an end record's `reason` names; None for another reason."""
    for cause, text in list(STOP_REASONS.items()) + [("another rank", OTHER_RANK)]:
        if reason == text:
            return cause
    return None
