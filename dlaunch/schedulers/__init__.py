"""Schedulers: one file each, registered by `kind` in `SCHEDULERS` (a site's `[scheduler] kind`).

A scheduler contributes to a job's script (directive lines, typed prelude items, the step command
that starts the tasks on the nodes, and how its own variables map to the job's neutral ones that the
trainer reads: dlaunch/train/jobenv.py) and owns everything after submission: submit, the state of jobs
and their place in the queue, the accounting of ended ones (end reason, energy), cancel, the run's log
files and the words the batch system writes into them. Its `Config` is the pydantic model of the site's
`[scheduler]` section.

`Scheduler` is the contract: what every scheduler must provide is abstract. What a batch system and a
scheduler that runs the job here and now differ in, callers ask of it: `queued` (a partition row, a time
limit, an account), `this_machine` (one node, here, in dlaunch's environment), and what `submit` returns (a
job that runs here comes with its handle, `Running`, which the run service follows to its end and whose
course it records in the run directory's `state`: RUNNING_HERE, FINISHED_HERE).
"""

import abc
import enum
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Type, Union

from dlaunch.errors import SchedulerError
from dlaunch.specs.job import JobSpec, PreludeItem, ShellWord
from dlaunch.specs.registration import Registration, registered, validate_section
from dlaunch.specs.schema import StrictModel

# kind -> registration; adding a scheduler is its file plus one row here.
SCHEDULERS = {
    "slurm": Registration("dlaunch.schedulers.slurm:Slurm"),
    "pbs": Registration("dlaunch.schedulers.pbs:Pbs"),
    "local": Registration("dlaunch.schedulers.local:Local"),
}
# What the run service writes into a run directory's `state` about a job it follows here (`Submission.running`),
# and a cancel it asked for; the scheduler of such a job reads its state back from there.
RUNNING_HERE = "running here (dlaunch pid %d)"
FINISHED_HERE = "finished (exit %d)"
CANCEL_REQUESTED = "cancel requested"
Figure = Union[float, str]  # a measured value, or "unavailable: <reason>"


class JobState(enum.Enum):
    """What a job's state means to dlaunch; each scheduler maps its own words to these (`JobStatus.kind`)."""

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


class Running(abc.ABC):
    """A job that runs here and now, started by `submit`: its processes have a session of their own."""

    @abc.abstractmethod
    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Its exit code once it has ended, waiting at most `timeout` s for that (None: until it ends);
        None while it still runs."""

    @abc.abstractmethod
    def interrupt(self) -> None:
        """What Ctrl-C in the terminal is to it (no terminal signals its session): SIGINT to its processes."""


@dataclass(frozen=True)
class Submission:
    """What `submit` did: the job's id, and the handle of a job that runs here and now, which the caller follows
    to its end (None: a batch system has the job)."""

    job_id: str
    running: Optional[Running] = None


@dataclass(frozen=True)
class ScriptCheck:
    """A test-only submission's answer (`dlaunch doctor`)."""

    accepted: bool
    found: str  # the account and queue the script asks for, and what the batch system said
    fix: str = ""  # for a refusal: what to do about it


@dataclass(frozen=True)
class JobStatus:
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


class Scheduler(abc.ABC):
    """The contract. Every scheduler gives the abstract members (a class attribute does for a property); the
    others default to what is right for a scheduler that does not say otherwise (no directives, no prelude, no
    test-only submission, no accounting, no MPI plugins).

    Batch-system commands run through `_run`, with a timeout: against a dead server they hang for
    many seconds. The environment (`SLURM_CONF`, `PBS_SERVER`, ...) is passed on as it is."""

    @property
    @abc.abstractmethod
    def kind(self) -> str:
        """Its `[scheduler] kind`: its key in SCHEDULERS, and plan.json's `scheduler`."""

    @property
    @abc.abstractmethod
    def label(self) -> str:
        """Its name for people: "Slurm", "PBS", "this machine"."""

    @property
    @abc.abstractmethod
    def Config(self) -> Type[StrictModel]:
        """The pydantic model of its `[scheduler]` section, with `kind: Literal["<kind>"]`."""

    # -- what a batch system and a scheduler that runs the job here and now differ in -------------------
    @property
    @abc.abstractmethod
    def queued(self) -> bool:
        """Its jobs wait in a queue: each goes to one of the profile's partition rows, with a time limit, charged to
        an account."""

    @property
    @abc.abstractmethod
    def this_machine(self) -> bool:
        """Its jobs run on this machine alone, in dlaunch's own environment: one node (no network between nodes, no
        rendezvous host), no container, a data folder that must exist here, launchers started standalone
        (torchrun --standalone, horovodrun) and so no launch mode for a profile to choose."""

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
    step_option_form: Tuple[str, str] = ()  # type: ignore[assignment]  # (): words of the step command; read only where set
    # The directive that runs a job's tasks one hardware thread per core (`[launch.<fw>] smt = false`; None: none).
    one_thread_per_core: Optional[str] = None
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
        """The directive lines, without `directive_prefix`."""
        return ()

    def prelude(self, cfg: StrictModel, job: JobSpec) -> Tuple[PreludeItem, ...]:
        return ()

    @abc.abstractmethod
    def job_environment(self, cfg: StrictModel, job: JobSpec) -> Tuple[PreludeItem, ...]:
        """Exports of the job-level neutral variables (dlaunch/train/jobenv.py: JOB_ID, NNODES, NODELIST, and
        RESTART_COUNT where it requeues) from this scheduler's own; task-level values the same in every task (a
        fixed task count) may be exported here too."""

    @abc.abstractmethod
    def step(
        self, cfg: StrictModel, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]
    ) -> Tuple[str, ...]:
        """The command that starts `job.tasks_per_node` tasks on every node: `mpi` wires them as MPI
        ranks, `whole_node` leaves them unbound to CPUs (a torchrun that owns its node); `options`
        come from the container runtime (e.g. pyxis's --container-image). One task's failure ends the
        step (tests/test_backend_battery.py holds every scheduler to it)."""

    def command(self, step: Tuple[str, ...], *rest: Tuple[Any, ...]) -> Tuple[Tuple[Any, ...], ...]:
        """The lines of the command in front of the trainer's flags: the step, then `rest` (the task
        variables' setter, the container, the launch) one line each."""
        return (step,) + rest

    def node_count_word(self, nodes: int) -> str:
        """The job's node count as the tasks see it."""
        return str(nodes)

    @abc.abstractmethod
    def job_id_word(self) -> str:
        """The job's id as the tasks see it (a c10d rendezvous id)."""

    @abc.abstractmethod
    def hosts_command(self) -> Tuple[str, ...]:
        """A command that prints the job's hosts, one per line, first = where rendezvous is hosted."""

    # -- pre-flight (`--preflight`: dlaunch/train/nodecheck.py); a scheduler that cannot returns None -------------
    def node_check_step(
        self, cfg: StrictModel, nodes: int, timeout_s: int, options: Sequence[str]
    ) -> Optional[Tuple[str, ...]]:
        """The step that runs one task on each of the allocation's `nodes` nodes, ended after `timeout_s`, one task's
        failure not ending the others; `options` as `step`'s."""
        return None

    def node_select_step(self, cfg: StrictModel, options: Sequence[str]) -> Tuple[str, ...]:
        """The step that runs one task on one node (its standard output is the script's)."""
        raise NotImplementedError

    def chosen_nodes_options(self, nodes: int, tasks: int) -> Tuple[str, ...]:
        """Step options that start the training step's `tasks` tasks on the `nodes` hosts of $DLAUNCH_NODELIST only."""
        raise NotImplementedError

    def chosen_hosts_command(self) -> Tuple[str, ...]:
        """`hosts_command` of the hosts of $DLAUNCH_NODELIST (the nodes pre-flight chose)."""
        raise NotImplementedError

    def gpu_request_field(self, cfg: StrictModel) -> Optional[str]:
        """The field of its `[scheduler]` section that asks the batch system for GPUs (None: none does)."""
        return None

    # -- after submission ---------------------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, script: Path, run_dir: Path) -> Submission:
        """Hand the job to the batch system, or start it here and now (its handle in `Submission.running`: the
        caller follows it to its end); the job writes its output into its log in `run_dir`."""

    def check_script(self, script: Path) -> ScriptCheck:
        """Whether the batch system would take `script`, asked without submitting it; only where
        `no_test_submission` is ""."""
        raise NotImplementedError(self.no_test_submission)

    def mpi_plugins(self) -> List[str]:
        """The MPI wirings its step offers (a profile's `mpi_plugin` must be one of them)."""
        return []

    @abc.abstractmethod
    def jobs(self, runs: Sequence[Tuple[str, Path]]) -> List[JobStatus]:
        """The state of each job (job id, its run directory), in order (one call for all where the batch system
        allows), with the place of a pending one in the queue; ended jobs from the batch system's accounting while
        it keeps them (UNKNOWN: it did not answer; GONE: it forgot the job)."""

    def end_reason(self, job_id: str) -> Optional[str]:
        """How the batch system says the job ended, while it remembers; None when it does not say."""
        return None

    def job_energy(self, job_id: str) -> Figure:
        """The energy the batch system's accounting recorded for the job's nodes, in joules."""
        return "unavailable: %s records no energy" % (self.label or self.kind)

    @abc.abstractmethod
    def cancel(self, job_id: str, run_dir: Path) -> None:
        """End the job, whatever became of the dlaunch process that submitted it (SchedulerError: it could not)."""

    # -- the run directory --------------------------------------------------------------------------
    @abc.abstractmethod
    def log_files(self, run_dir: Path) -> List[Path]:
        """The job's logs in the run directory, oldest first (each may hold several attempts)."""


def scheduler_class(kind: str) -> Type[Scheduler]:
    """The class registered as a `[scheduler] kind` (also `plan.json`'s `scheduler`)."""
    return registered(SCHEDULERS, kind, "scheduler")


def scheduler_for(kind: str) -> Scheduler:
    """The backend of a `[scheduler] kind`."""
    return scheduler_class(kind)()


def validate_config(data: Any) -> Any:
    """A `[scheduler]` section as its backend's Config model."""
    return validate_section(SCHEDULERS, data, lambda kind: scheduler_class(kind).Config)


__all__ = [
    "CANCEL_REQUESTED",
    "FINISHED_HERE",
    "RUNNING_HERE",
    "SCHEDULERS",
    "Figure",
    "JobState",
    "JobStatus",
    "Registration",
    "Running",
    "Scheduler",
    "ScriptCheck",
    "ShellWord",
    "Submission",
    "scheduler_class",
    "scheduler_for",
    "validate_config",
]
