"""Schedulers: one file each, registered by `kind` in `BACKENDS` (a site's `[scheduler] kind`).

A scheduler contributes to a job's script (directive lines, typed prelude items, the step command
that starts the tasks on the nodes, and how its own variables map to the job's neutral ones that the
trainer reads: dlaunch/train/jobenv.py) and owns everything after submission: submit (a batch system)
or start (a foreground backend: the job runs here, now, and dlaunch follows it to its end), the state
of jobs and their place in the queue, the accounting of ended ones (end reason, energy), cancel, the
run's log files and the words the batch system writes into them. Its `Config` is the pydantic model
of the site's `[scheduler]` section. Its registration row says whether it runs jobs in the foreground.
"""

import enum
import importlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

from dlaunch.errors import DlaunchError, SchedulerError
from dlaunch.jobs.jobspec import JobSpec, PreludeItem, ShellWord
from dlaunch.jobs.schema import StrictModel


@dataclass(frozen=True)
class Registration:
    """A row of `BACKENDS`: where the backend's class is, and how it runs a job (cf. ReFrame's
    `register_scheduler(name, local=...)`)."""

    target: str  # "module:Class"
    # Runs the job here and now, in dlaunch's own process, to its end: this machine, one node, no
    # queue, no account, no time limit; the run directory records the ending (`finished (exit N)`).
    foreground: bool = False


# kind -> registration; adding a scheduler is its file plus one row here.
BACKENDS = {
    "slurm": Registration("dlaunch.schedulers.slurm:Slurm"),
    "pbs": Registration("dlaunch.schedulers.pbs:Pbs"),
    "local": Registration("dlaunch.schedulers.local:Local", foreground=True),
}
Figure = Union[float, str]  # a measured value, or "unavailable: <reason>"


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
        return self in (
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMEOUT,
            JobState.NODE_FAIL,
            JobState.PREEMPTED,
            JobState.OUT_OF_MEMORY,
        )


@dataclass(frozen=True)
class Submission:
    job_id: str


class Running:
    """A job a foreground backend started here (`Scheduler.start`)."""

    job_id = ""

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Its exit code once it has ended, waiting at most `timeout` s for that (None: until it ends);
        None while it still runs."""
        raise NotImplementedError


@dataclass(frozen=True)
class ScriptCheck:
    """A test-only submission's answer (`dlaunch doctor`)."""

    accepted: bool
    found: str  # the account and queue the script asks for, and what the batch system said
    fix: str = ""  # for a refusal: what to do about it


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
    status_command = ""  # the one that answers `jobs()` (`dlaunch watch` needs it)
    ping_command: Tuple[str, ...] = ()  # exits 0 when the batch system's server answers (`dlaunch doctor`)
    server_variable: str = ""  # the environment variable that points its commands at the server, if any
    # Seconds before the time limit at which the scheduler signals the job to checkpoint (None: it does not).
    signal_lead_s: Optional[int] = None
    # Its directives can keep a job off named nodes (`JobSpec.exclude`: the site's suspect nodes; Slurm's --exclude).
    excludes_nodes = False
    # (pattern, what it is) the profile's per-framework options of its step must match (`[launch.<fw>]`);
    # () = words of the step command
    step_option_form: Tuple[str, str] = ()
    Config: Type[StrictModel] = StrictModel
    # Regular expressions of the lines the batch system writes into a job's log (dlaunch/runs/failures.py):
    # its verdict on the job (time limit, cancel, node failure), and its launcher's noise around a failure.
    log_verdicts: Tuple[str, ...] = ()
    log_noise: Tuple[str, ...] = ()
    # Why `check_script` cannot answer, where the batch system has no test-only submission ("": it can).
    no_test_submission = "no test-only submission"
    # (neutral task variable of dlaunch/train/jobenv.py, this scheduler's variable that each task of a step has)
    task_variables: Tuple[Tuple[str, str], ...] = ()

    def __init__(self, timeout_s: float = 30.0, environ: Optional[Mapping[str, str]] = None):
        self.timeout_s = timeout_s
        self.environ = dict(os.environ if environ is None else environ)

    def _run(self, argv: List[str]) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, env=self.environ, check=False
            )
        except FileNotFoundError:
            raise SchedulerError("%s: command not found (is this a %s login node?)" % (argv[0], self.kind)) from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(
                "%s did not answer within %g s (is the %s server down?)" % (argv[0], self.timeout_s, self.kind)
            ) from None

    # -- the script ---------------------------------------------------------------------------------
    def directives(self, cfg: StrictModel, job: JobSpec) -> Tuple[str, ...]:
        return ()

    def prelude(self, cfg: StrictModel, job: JobSpec) -> Tuple[PreludeItem, ...]:
        return ()

    def job_environment(self, cfg: StrictModel, job: JobSpec) -> Tuple[PreludeItem, ...]:
        """Exports of the job-level neutral variables (dlaunch/train/jobenv.py) from this scheduler's own;
        task-level values the same in every task (a fixed task count) may be exported here too."""
        return ()

    def step(
        self, cfg: StrictModel, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]
    ) -> Tuple[str, ...]:
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
        """Hand the job to the batch system (a backend registered as `foreground` has `start` instead)."""
        raise NotImplementedError

    def start(self, script: Path, run_dir: Path) -> Running:
        """A foreground backend's submission: start the job here, now, writing its output into its log;
        the caller follows it to its end."""
        raise NotImplementedError

    def check_script(self, script: Path) -> ScriptCheck:
        """Whether the batch system would take `script`, asked without submitting it; only where
        `no_test_submission` is ""."""
        raise NotImplementedError

    def mpi_plugins(self) -> List[str]:
        """The MPI wirings its step offers (a profile's `mpi_plugin` must be one of them)."""
        return []

    def jobs(self, job_ids: Sequence[str]) -> Dict[str, Job]:
        """The state of each job (one call for all where the batch system allows), with the place of a
        pending one in the queue; ended jobs from the batch system's accounting while it keeps them."""
        raise NotImplementedError

    def end_reason(self, job_id: str) -> Optional[str]:
        """How the batch system says the job ended, while it remembers; None when it does not say."""
        return None

    def job_energy(self, job_id: str) -> Figure:
        """The energy the batch system's accounting recorded for the job's nodes, in joules."""
        return "unavailable: %s records no energy" % (self.label or self.kind)

    def cancel(self, job_id: str) -> None:
        raise NotImplementedError

    # -- the run directory --------------------------------------------------------------------------
    def log_files(self, run_dir: Path) -> List[Path]:
        """The job's logs in the run directory, oldest first (each may hold several attempts)."""
        return []


def registration(kind: str) -> Registration:
    """The registry row of a `[scheduler] kind` (also `plan.json`'s `scheduler`)."""
    if kind not in BACKENDS:
        raise DlaunchError("scheduler %r is not one of %s" % (kind, ", ".join(BACKENDS)))
    return BACKENDS[kind]


def scheduler_for(kind: str) -> Scheduler:
    """The backend of a `[scheduler] kind`."""
    module, name = registration(kind).target.split(":")
    return getattr(importlib.import_module(module), name)()


def validate_config(data: Any) -> Any:
    """A `[scheduler]` section as its backend's Config model (told apart by `kind`, looked up when a
    profile is read, so that a backend registered later is known too)."""
    if not isinstance(data, dict):
        return data
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in BACKENDS:
        raise ValueError("kind: %r is not one of %s" % (kind, ", ".join(BACKENDS)))
    return scheduler_for(kind).Config.model_validate(data)


__all__ = [
    "BACKENDS",
    "Figure",
    "Job",
    "JobState",
    "Registration",
    "Running",
    "Scheduler",
    "ScriptCheck",
    "ShellWord",
    "Submission",
    "registration",
    "scheduler_for",
    "validate_config",
]
