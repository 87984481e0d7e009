"""Schedulers: one file each, registered by `kind` in `BACKENDS` (a site's `[scheduler] kind`).

A scheduler contributes to a job's script (directive lines, typed prelude items, the step command
that starts the tasks on the nodes, and how its own variables map to the job's neutral ones that the
trainer reads: train/jobenv.py) and talks to the batch system (submit, the state of jobs, cancel).
Its `Config` is the pydantic model of the site's `[scheduler]` section.
"""
import enum
import importlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

from pydantic import Field

from launcher.errors import DlaunchError, SchedulerError
from launcher.jobs.jobspec import JobSpec, PreludeItem, ShellWord
from launcher.jobs.schema import StrictModel

# kind -> "module:Class"; adding a scheduler is its file plus one row here.
BACKENDS = {
    "slurm": "launcher.schedulers.slurm:Slurm",
    "pbs": "launcher.schedulers.pbs:Pbs",
    "local": "launcher.schedulers.local:Local",
}


class JobState(enum.Enum):
    """What a job's state means to dlaunch; each scheduler maps its own words (`Scheduler.classify`)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETING = "completing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAIL = "node failure"
    PREEMPTED = "preempted"
    OUT_OF_MEMORY = "out of memory"
    REQUEUED = "requeued"
    SUSPENDED = "suspended"
    UNKNOWN = "unknown"  # the scheduler did not answer
    GONE = "gone"  # the scheduler no longer knows the job (ended long ago)

    @property
    def active(self) -> bool:
        """The job may still write into its run directory."""
        return self in (JobState.PENDING, JobState.RUNNING, JobState.COMPLETING, JobState.REQUEUED, JobState.SUSPENDED)

    @property
    def failed(self) -> bool:
        return self in (JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL,
                        JobState.PREEMPTED, JobState.OUT_OF_MEMORY)


@dataclass(frozen=True)
class Submission:
    job_id: str
    exit_code: Optional[int] = None  # set when the job already ran (local)


@dataclass(frozen=True)
class Job:
    """A scheduler's view of a job: its own state word, and for a pending one why, where in the
    queue and when it may start."""

    state: str  # the scheduler's word (`PENDING`, `R`, `unknown (...)`), shown to users
    kind: JobState
    reason: str = ""
    position: Optional[int] = None
    start: str = ""

    @property
    def queue(self) -> str:
        """e.g. 'Priority, 3rd in queue, start about 2026-11-22T10:42:00' ('' unless pending)."""
        if self.kind is not JobState.PENDING:
            return ""
        parts = [self.reason] if self.reason and self.reason != "None" else []
        if self.position:
            parts.append("%s in queue" % _ordinal(self.position))
        if self.start and self.start not in ("N/A", "Unknown"):
            parts.append("start about %s" % self.start)
        return ", ".join(parts)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return "%d%s" % (n, suffix)


class Scheduler:
    """The protocol; methods that a batch system must provide raise NotImplementedError.

    Batch-system commands run through `_run`, with a timeout: against a dead server they hang for
    many seconds. The environment (`SLURM_CONF`, `PBS_SERVER`, ...) is passed on as it is."""

    kind = ""
    label = ""  # for people: "Slurm", "PBS"
    directive_prefix = ""  # `#SBATCH`, `#PBS`; "" = no directives
    commands: Tuple[str, ...] = ()  # the batch system's commands a login node needs (`dlaunch doctor`)
    ping_command: Tuple[str, ...] = ()  # exits 0 when the batch system's server answers (`dlaunch doctor`)
    Config: Type[StrictModel] = StrictModel
    # (neutral task variable of train/jobenv.py, this scheduler's variable that each task of a step has)
    task_variables: Tuple[Tuple[str, str], ...] = ()

    def __init__(self, timeout_s: float = 30.0, environ: Optional[Mapping[str, str]] = None):
        self.timeout_s = timeout_s
        self.environ = dict(os.environ if environ is None else environ)

    def _run(self, argv: List[str]) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, env=self.environ)
        except FileNotFoundError:
            raise SchedulerError("%s: command not found (is this a %s login node?)" % (argv[0], self.kind)) from None
        except subprocess.TimeoutExpired:
            raise SchedulerError("%s did not answer within %g s (is the %s server down?)" % (argv[0], self.timeout_s, self.kind)) from None

    # -- the script ---------------------------------------------------------------------------------
    def directives(self, cfg: StrictModel, job: JobSpec) -> Tuple[str, ...]:
        return ()

    def prelude(self, cfg: StrictModel, job: JobSpec) -> Tuple[PreludeItem, ...]:
        return ()

    def job_environment(self, cfg: StrictModel, job: JobSpec) -> Tuple[PreludeItem, ...]:
        """Exports of the job-level neutral variables (train/jobenv.py) from this scheduler's own;
        task-level values the same in every task (a fixed task count) may be exported here too."""
        return ()

    def step(self, cfg: StrictModel, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]) -> Tuple[str, ...]:
        """The command that starts `job.tasks_per_node` tasks on every node: `mpi` wires them as MPI
        ranks, `whole_node` leaves them unbound to CPUs (a torchrun that owns its node); `options`
        come from the container runtime (e.g. pyxis's --container-image)."""
        raise NotImplementedError

    def command(self, step: Tuple[str, ...], *rest: Tuple[Any, ...]) -> Tuple[Tuple[Any, ...], ...]:
        """The lines of the command in front of the trainer's flags: the step, then `rest` (the task
        variables' setter, the container, the launch) one line each."""
        return (step,) + rest

    def node_count_word(self, nodes: int) -> str:
        """The job's node count as the tasks see it."""
        return str(nodes)

    def job_id_word(self) -> str:
        """The job's id as the tasks see it (a c10d rendezvous id)."""
        raise NotImplementedError

    def hosts_command(self) -> Tuple[str, ...]:
        """A command that prints the job's hosts, one per line, first = where rendezvous is hosted."""
        raise NotImplementedError

    # -- the batch system ---------------------------------------------------------------------------
    def submit(self, script: Path, run_dir: Path) -> Submission:
        raise NotImplementedError

    def jobs(self, job_ids: Sequence[str]) -> Dict[str, Job]:
        """The state of each job (one call for all where the batch system allows)."""
        raise NotImplementedError

    def end_reason(self, job_id: str) -> Optional[str]:
        """How the batch system says the job ended, while it remembers; None when it does not say."""
        return None

    def cancel(self, job_id: str) -> None:
        raise NotImplementedError


def scheduler_for(kind: str) -> Scheduler:
    """The backend of a `[scheduler] kind` (also `plan.json`'s `scheduler`)."""
    if kind not in BACKENDS:
        raise DlaunchError("scheduler %r is not one of %s" % (kind, ", ".join(BACKENDS)))
    module, name = BACKENDS[kind].split(":")
    return getattr(importlib.import_module(module), name)()


def config_union() -> object:
    """The `[scheduler]` section's type: the backends' Config models, told apart by `kind`."""
    models = tuple(scheduler_for(kind).Config for kind in BACKENDS)
    return Annotated[Union[models], Field(discriminator="kind")]  # type: ignore[valid-type]


__all__ = ["BACKENDS", "Job", "JobState", "Scheduler", "ShellWord", "Submission", "config_union", "scheduler_for"]
