"""The neutral job: what every scheduler, container runtime and launch style reads or contributes.

`JobSpec` is the job's shape (nodes, tasks, CPUs, time, queue); the prelude items are the typed
shell lines that run on the batch host before the step. None of these classes writes shell:
`render.py` turns each item into text and quotes every value.
"""

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from dlaunch.specs.schema import Partition


class ShellWord(str):
    """An argument that expands shell variables of the batch script (`$SLURM_JOB_ID`); rendered in
    double quotes, and only plain words with `$NAME` references are accepted (render.quote)."""


def joined(separator: str, words: Sequence[str]) -> str:
    """`separator`.join(words), still a ShellWord when one of them is."""
    text = separator.join(words)
    return ShellWord(text) if any(isinstance(w, ShellWord) for w in words) else text


@dataclass(frozen=True)
class JobSpec:
    name: str  # the scheduler's job name: EXPERIMENT-RUN_NAME, so each run of a sweep or study has its own
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    seconds: int  # time limit
    queue: Optional[Partition]  # None on the local scheduler
    account: Optional[str]
    run_dir: str
    requeue: bool
    extra_tasks: int = 0  # tasks beyond tasks_per_node on every node (coordinators; the scheduler places them)
    overcommit: bool = False  # more tasks than CPUs on a node
    smt: bool = True  # False: one hardware thread per core (the scheduler's `one_thread_per_core`)
    exclude: Tuple[str, ...] = ()  # nodes the job must not run on (node names, checked: dlaunch/boundary.py NODE)

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node + self.extra_tasks


@dataclass(frozen=True)
class WorkDir:
    """`cd PATH`: the job runs in its run directory, whatever folder it was submitted from (so no user
    module there, a train.py or a dlaunch/ folder, is found before the trainer's)."""

    path: str


@dataclass(frozen=True)
class Export:
    """`export NAME=value`."""

    name: str
    value: str  # a ShellWord expands variables; anything else is single-quoted


@dataclass(frozen=True)
class RequireVariable:
    """`: "${NAME:?...}"`: stop the job when a variable the profile relies on (set by a module) is unset."""

    name: str
    needed_by: str  # the profile field that uses it (a name: shown in the error)


@dataclass(frozen=True)
class Prepend:
    """`export NAME=value"${NAME:+:$NAME}"`: extends a path list without dropping what is there."""

    name: str
    value: str


@dataclass(frozen=True)
class FirstHost:
    """`NAME="$(<hosts command> | sed -n 1p)<suffix>"; export NAME`: the job's first host."""

    name: str
    hosts_command: Tuple[str, ...]  # prints one host per line
    suffix: str = ""


@dataclass(frozen=True)
class CommandOutput:
    """`NAME="$(command)"; NAME="${NAME%% *}"; export NAME`: the first word a command prints on the batch
    host (the job's first node), e.g. MASTER_ADDR from `hostname -i`."""

    name: str
    command: Tuple[str, ...]


@dataclass(frozen=True)
class HostList:
    """`NAME="$(<hosts command> | paste -sd, -)"; export NAME`: the job's hosts, comma-separated."""

    name: str
    hosts_command: Tuple[str, ...]


@dataclass(frozen=True)
class Banner:
    """`echo "dlaunch: job <id> attempt <n> on <hosts> at <UTC time>"`: the first line of each attempt."""

    job_id: str  # variable names, without `$`
    restart_count: str
    hosts: str


@dataclass(frozen=True)
class EndTime:
    """`export NAME=$(( $(date +%s) + seconds ))`: when the time limit ends (dlaunch/train/signals.py)."""

    name: str
    seconds: int


@dataclass(frozen=True)
class AttemptCount:
    """`NAME=<lines of FILE equal to $JOB_ID>`, then `$JOB_ID` appended to FILE: how often this job
    started before (for a batch system that reruns a job without counting it for the job)."""

    name: str
    job_id: str  # the variable holding the job's id, without `$`
    file: str


@dataclass(frozen=True)
class NodeCheck:
    """`<step> || echo "...exit $?" >&2`: pre-flight's check on every node (dlaunch/train/nodecheck.py); the script
    goes on whatever the step's exit (a node without a result is named by the selection that follows)."""

    command: Tuple[Union[str, "TaskEnv"], ...]


@dataclass(frozen=True)
class HangRetry:
    """The training step in a loop: after it failed with a hang record `hang_file` newer than its start, `select`
    chooses the nodes again without those the hang named (dlaunch/train/nodecheck.py; it fails, and the job ends with
    the step's exit, when the record names none or too few healthy nodes are left), the `reselect` items follow, and
    the step runs again with `counter` one higher, at most `times` times. Any other end of the step ends the job."""

    times: int
    counter: str  # the variable counting the retries (DLAUNCH_RETRY: the trainer resumes when it is set)
    started: str  # the variable holding the step's start (seconds since the epoch), which `select` is given
    hang_file: str
    select: "CommandOutput"
    reselect: Tuple["PreludeItem", ...]


PreludeItem = Union[
    WorkDir,
    Export,
    RequireVariable,
    Prepend,
    FirstHost,
    CommandOutput,
    HostList,
    Banner,
    EndTime,
    AttemptCount,
    NodeCheck,
]


@dataclass(frozen=True)
class TaskEnv:
    """`bash -c 'export NAME="$VARIABLE" ...; exec "$@"' dlaunch-task`: a word of the step's command, in
    front of what each task runs, that sets the job's neutral task variables (dlaunch/train/jobenv.py) from the
    scheduler's own (`Scheduler.task_variables`)."""

    variables: Tuple[Tuple[str, str], ...]  # (neutral name, the scheduler's variable)
