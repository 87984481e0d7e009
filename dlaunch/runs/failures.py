"""Why a run ended badly: every log of the run, newest attempt first, the most telling line, and the
run's real state when the scheduler and the metrics file disagree; who stopped a run that was stopped
(`stopped_by`), which is no failure.

A run's logs are its scheduler's (`Scheduler.log_files`: `slurm-<job>.out` per submission, `pbs.out`,
`local.log`); a rerun attempt appends to its file after a `dlaunch: job J attempt N` banner. The newest
attempt that explains anything wins; inside it, causes rank (first observed line of the best rank):
  0 the trainer's own one-line error (`train: error: ...`, bad input found on the nodes);
  1 an operating-system error (no space left, out of memory): the root cause of whatever reported it;
  2 the failing rank's root cause: a worker killed by a signal, an exception that is not a peer's symptom;
  3 the scheduler's verdict (time limit, cancel, node failure: `Scheduler.log_verdicts`);
  4 a peer's symptom (connection closed or reset by the rank that died first);
  5 launcher noise (torchrun's `exitcode`, `ChildFailedError`; the scheduler's own: `Scheduler.log_noise`).
"""

import functools
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from dlaunch.boundary import LOG_TAIL_BYTES, log_tail, printable
from dlaunch.runs.nodechecks import TOO_FEW
from dlaunch.schedulers import JobState
from dlaunch.train.errors import EXIT_DIVERGED, EXIT_HUNG, EXIT_INTERRUPTED, EXIT_TOO_FEW_NODES
from dlaunch.train.signals import OTHER_RANK, STOP_REASONS, stop_cause

ATTEMPT = re.compile(r"^dlaunch: job \S+ attempt (\d+)\b")
_SYMPTOM = (
    r"Connection (closed|reset) by peer|Broken pipe|Socket Timeout|remote process exited|"
    r"communicator was aborted|Connection refused|timed out|Timeout"
)
RANK_KILLED = re.compile(r"Signal (\d+) \(\w+\) received by PID")  # torchrun's words for a rank a signal ended
_NOISE = r"ChildFailedError|SignalException|exitcode\s*:\s*-?\d"
Ranked = Tuple[Tuple[int, "re.Pattern[str]", Optional["re.Pattern[str]"]], ...]


@functools.cache
def ranked(verdicts: Tuple[str, ...] = (), noise: Tuple[str, ...] = ()) -> Ranked:
    """The causes by rank, with a scheduler's verdicts (rank 3) and noise (rank 5)."""
    all_noise = "|".join((_NOISE,) + noise)
    patterns = (
        (0, r"\btrain: error: ", None),
        (
            1,
            r"No space left on device|ENOSPC|Out of memory|Cannot allocate memory|oom[-_ ]kill|Killed process \d+",
            None,
        ),
        (2, RANK_KILLED.pattern, None),
        (2, r"^(\[rank\d+\]:\s*)?[\w.]*(Error|Exception)\b:", "%s|%s" % (_SYMPTOM, all_noise)),
        *((3, verdict, None) for verdict in verdicts),
        (4, _SYMPTOM, None),
        (5, all_noise, None),
    )
    return tuple(
        (rank, re.compile(pattern, re.IGNORECASE if rank == 1 else 0), re.compile(exclude) if exclude else None)
        for rank, pattern, exclude in patterns
    )


@dataclass(frozen=True)
class Cause:
    rank: int
    where: str  # `slurm-12.out:68`
    line: str

    def __str__(self) -> str:
        return "%s: %s" % (self.where, printable(self.line))


def attempts(path: Path) -> List[List[Tuple[int, str]]]:
    """The log's attempts, newest first, each as (line number, line); of a log longer than
    LOG_TAIL_BYTES only its end (dlaunch/boundary.py), line numbers counted from there (`log_name`)."""
    sections: List[List[Tuple[int, str]]] = [[]]
    for number, line in enumerate(log_tail(path)[0].splitlines(), 1):
        if ATTEMPT.match(line) and sections[-1]:
            sections.append([])
        sections[-1].append((number, line.strip()))
    return [s for s in reversed(sections) if s]


def best_cause(lines: Sequence[Tuple[int, str]], name: str, causes: Ranked) -> Optional[Cause]:
    """The best-ranked line of one attempt (the first observed among equals)."""
    best: Optional[Cause] = None
    for number, line in lines:
        for rank, pattern, exclude in causes:
            if (best is None or rank < best.rank) and pattern.search(line) and not (exclude and exclude.search(line)):
                best = Cause(rank, "%s:%d" % (name, number), line)
                break
    return best


def log_name(path: Path) -> str:
    """The log's name as a cause names it: `slurm-12.out`, or for a log read from its end only
    `slurm-12.out (last 4 MiB)` (its line numbers count from there)."""
    try:
        cut = path.lstat().st_size > LOG_TAIL_BYTES
    except OSError:
        cut = False
    return "%s (last %d MiB)" % (path.name, LOG_TAIL_BYTES // 2**20) if cut else path.name


def explain(logs: Sequence[Path], verdicts: Tuple[str, ...] = (), noise: Tuple[str, ...] = ()) -> Optional[Cause]:
    """The cause of the newest attempt that shows one; `logs` oldest first (`Scheduler.log_files`),
    `verdicts` and `noise` the scheduler's (`Scheduler.log_verdicts`, `log_noise`)."""
    causes = ranked(tuple(verdicts), tuple(noise))
    for path in reversed(logs):
        for lines in attempts(path):
            cause = best_cause(lines, log_name(path), causes)
            if cause:
                return cause
    return None


UNFINISHED = ("running", "no metrics yet")
# A launcher's words when a stop signal reached it (torchrun: `Received 2 death signal, shutting down workers`,
# `SignalException: Process 12 got signal: 2`), whatever its trainer managed to write.
LAUNCHER_STOPPED = re.compile(r"\bReceived (\d+) death signal\b|\bSignalException: Process \d+ got signal: (\d+)")
STOP_SIGNALS: Dict[int, str] = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


def reconcile(
    meaning: Optional[JobState], metrics_status: str, ended: bool, launcher_signal: Optional[str] = None
) -> str:
    """The run's status: the metrics file's, unless the scheduler ended a job that never said how it ended.

    `cancelled`: such a job was cancelled (the scheduler says so, or its launcher got `launcher_signal`, SIGINT or
    SIGTERM, `launcher_stop`) before its trainer wrote how it ended. `died`: the job ended otherwise (launch
    failure, OOM kill, a crashed node) while its metrics say running or were never written. A `cancelled` run
    that the scheduler ended for its time limit is `interrupted` (older trainers could not tell the two apart)."""
    if ended and metrics_status in UNFINISHED:
        return "cancelled" if meaning is JobState.CANCELLED or launcher_signal else "died"
    if meaning is JobState.TIMEOUT and metrics_status == "cancelled":
        return "interrupted"
    return metrics_status


def launcher_stop(logs: Sequence[Path]) -> Optional[str]:
    """The stop signal ("SIGINT", "SIGTERM") that the newest attempt's launcher says it got (LAUNCHER_STOPPED), or
    None; `logs` oldest first. A stop signal after a rank failed in that attempt (`failed_first`) is the scheduler
    ending the step's other tasks (srun does so when one task fails), not a stop: None."""
    for path in reversed(logs):
        for lines in attempts(path)[:1]:
            for _, line in lines:
                found = LAUNCHER_STOPPED.search(line)
                number = int(found.group(1) or found.group(2)) if found else None
                if number in STOP_SIGNALS:
                    return STOP_SIGNALS[number]
                if failed_first(line):
                    return None
            return None
    return None


def failed_first(line: str) -> bool:
    """Whether the line says a rank failed by itself: a cause of rank 0-2 (`ranked`: the trainer's error, an
    operating-system error, a rank's exception or its death by a signal other than a stop signal)."""
    killed = RANK_KILLED.search(line)
    if killed:
        return int(killed.group(1)) not in STOP_SIGNALS
    return best_cause([(0, line)], "", tuple(c for c in ranked() if c[0] <= 2)) is not None


def stopped_by(
    status: str,
    reason: Optional[str],
    meaning: Optional[JobState],
    cancel_requested: bool,
    here: bool,
    scheduler: str,
    launcher_signal: Optional[str] = None,
    wrote_end: bool = True,
) -> str:
    """Who stopped a run whose `status` is `interrupted` or `cancelled`, as a line: `dlaunch cancel` (its state says
    `cancel requested`), the `scheduler` (its job CANCELLED otherwise: scancel or an administrator), the time limit,
    Ctrl-C on this machine (a run `here` whose trainer, or launcher, got SIGINT), else the signal its trainer's end
    record names (`reason`) or its launcher got (`launcher_signal`: the trainer `wrote_end` no end record)."""
    trainer = stop_cause(reason)
    cause = trainer or launcher_signal
    if cancel_requested:
        who = "dlaunch cancel"
    elif meaning is JobState.CANCELLED:
        who = "%s (scancel or an administrator, not dlaunch cancel)" % scheduler
    elif meaning is JobState.TIMEOUT or cause == "time limit":
        who = "the job's time limit"
    elif here and cause == "SIGINT":
        who = "Ctrl-C on this machine"
    elif trainer == "another rank":
        return "%s by %s" % (status, OTHER_RANK)
    else:
        who = STOP_REASONS.get(cause or "", "a stop signal")
    if trainer:
        said = "the trainer got %s" % ("SIGTERM at the time limit" if trainer == "time limit" else trainer)
    elif not wrote_end:
        said = "before its trainer wrote how it ended%s" % ("; its launcher got %s" % launcher_signal if cause else "")
    else:
        said = "the trainer named no signal"
    return "%s by %s (%s)" % (status, who, said)


# What the trainer's own exit codes mean when the scheduler calls the job failed (see dlaunch/train/__main__.py).
TRAINER_ENDINGS = {
    "interrupted": "exit %d: checkpointed, resume it" % EXIT_INTERRUPTED,
    "diverged": "exit %d: the loss diverged" % EXIT_DIVERGED,
    "hung": "exit %d: a process stopped answering, the watchdog stopped the job" % EXIT_HUNG,
    TOO_FEW: "exit %d: pre-flight left too few healthy nodes, nothing trained" % EXIT_TOO_FEW_NODES,
}


def scheduler_label(scheduler_state: str, meaning: Optional[JobState], status: str) -> str:
    """The scheduler's word, with what a failed job's trainer meant by it when that was no failure of the job (a word
    that gives the exit code itself, as a job that ran here has it, `finished (exit 75)`, stays as it is)."""
    if meaning is JobState.FAILED and status in TRAINER_ENDINGS and "(exit " not in scheduler_state:
        return "%s (%s)" % (scheduler_state, TRAINER_ENDINGS[status])
    return scheduler_state
