"""The Python API (docs/API.md): what the `dlaunch` command line does, as functions that return typed,
JSON-serialisable objects. The command line (dlaunch/cli/) parses, calls these and prints.

- Every object is a frozen dataclass of str, int, float, bool, None, lists and dicts of those, or other
  such dataclasses: `x.to_dict()` is plain JSON, `T.from_dict(d)` makes it again (`Record`).
- Bad input and refusals raise `DlaunchError` (dlaunch/errors.py) only: `str(e)` is the line the
  command line prints after `dlaunch: error: `, `e.exit_code` its exit code (2: bad input, 1: the
  scheduler refused). What stops nothing is a `DlaunchWarning` (`warnings.warn`).
- Keyword arguments are the command line's options (`--run-name` is `run_name=`); the trainer's flags
  are keyword arguments too (`--batch-size 8` is `batch_size=8`), checked as the command line checks them.

Start-up matters (the command line imports this module): each function imports its parts when called.
"""

import dataclasses
import functools
import os
import time as clock
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Type, TypeVar

from dlaunch import launch
from dlaunch.boundary import display_path, escape, quoted
from dlaunch.errors import DlaunchError, DlaunchNote, DlaunchWarning

if TYPE_CHECKING:
    from dlaunch.analysis.perfmodel.fit import LeftOut
    from dlaunch.resultsdb.store import ResultsDB
    from dlaunch.runs.rundir import RunDir
    from dlaunch.runs.runstate import Snapshot
    from dlaunch.runs.service import Prepared

__all__ = [
    "Archive",
    "BudgetRow",
    "Check",
    "CompareRow",
    "Comparison",
    "Doctor",
    "ImageInfo",
    "Job",
    "LeftOutRun",
    "Logs",
    "Prediction",
    "PredictionRow",
    "RcpRow",
    "Record",
    "Report",
    "ReportGroup",
    "ReportPoint",
    "Rerun",
    "ResultRow",
    "RunStatus",
    "SetApartRun",
    "SiteInfo",
    "Spread",
    "StudyCheck",
    "StudyPlan",
    "Table",
    "archive",
    "cancel",
    "compare",
    "doctor",
    "images",
    "logs",
    "predict",
    "render_images",
    "report",
    "rerun",
    "results",
    "run",
    "sites",
    "status",
    "study",
    "study_check",
    "study_status",
    "sweep",
    "watch",
]

R = TypeVar("R", bound="Record")


# -- the objects ----------------------------------------------------------------------------------------


class Record:
    """What every API object has: `to_dict()` (plain JSON values) and `from_dict()` (the object again:
    `T.from_dict(json.loads(json.dumps(x.to_dict()))) == x`), read from the dataclass's field types."""

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: Type[R], data: Mapping[str, Any]) -> R:
        hints = _field_types(cls)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise DlaunchError("%s: unknown field %s" % (cls.__name__, unknown[0]))
        return cls(**{name: _typed(hints[name], value, "%s.%s" % (cls.__name__, name)) for name, value in data.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


@functools.cache
def _field_types(cls: type) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _typed(hint: Any, value: Any, where: str) -> Any:
    """`value` (parsed JSON) as the field type `hint` says: nested records made, lists and dicts followed."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        return _typed(next(a for a in args if a is not type(None)), value, where)
    if origin in (list, List):
        if not isinstance(value, list):
            raise DlaunchError("%s: expected a list, got %r" % (where, value))
        return [_typed(args[0], v, where) for v in value]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise DlaunchError("%s: expected an object, got %r" % (where, value))
        return {k: _typed(args[1], v, where) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, Record):
        if not isinstance(value, dict):
            raise DlaunchError("%s: expected an object, got %r" % (where, value))
        return hint.from_dict(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise DlaunchError("%s: expected %s, got %r" % (where, hint.__name__, value))
    return value


@dataclass(frozen=True)
class Job(Record):
    """One job of `run`/`sweep`: rendered (a dry run), submitted, or run here to its end (a foreground site)."""

    run_dir: str
    site: str
    scheduler: str  # its kind (dlaunch/schedulers/)
    experiment: str
    run_name: str
    script: str
    job_id: Optional[str] = None  # None in a dry run
    warnings: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # what dlaunch decided for the user (a partition row by size)
    submitted: bool = False
    exit_code: Optional[int] = None  # a foreground run's (it ran here to its end); None otherwise
    nodes: int = 0
    processes: int = 0  # in all: GPUs, or processes on a site without GPUs
    label: str = ""  # a study's job: its matrix and name, the published figures it stands for, its repeat


@dataclass(frozen=True)
class Rerun(Record):
    """`rerun`: a result's job on another site, the `parent` it came from (its metrics file, or
    ARCHIVE.tar.gz:EXPERIMENT/RUN) and what differs from it, as [attribute, parent's, rerun's]."""

    parent: str
    differences: List[List[str]]
    job: Job


@dataclass(frozen=True)
class Archive(Record):
    """`archive`: the bundle written, its manifest (`files` in it, `bytes` before compression) and the runs
    that kept no site profile (submitted before dlaunch kept the one a job was made from)."""

    file: str
    manifest: str  # its path inside the bundle
    files: int
    bytes: int
    without_profile: List[str]


@dataclass(frozen=True)
class StudyPlan(Record):
    """A study's jobs for a site before they are submitted: `summary` ('3 jobs (left alone: 2 ended ok)'), its
    `design` (protocol, stack, jobs per figure, assumptions), each distinct warning once (with its number of jobs)."""

    study: str
    site: str
    summary: str
    design: str
    warnings: List[str]
    jobs: List[Job]


@dataclass(frozen=True)
class StudyCheck(Record):
    """`study check` on one site: its jobs, those that cannot run there (`failures`: label and why), or why the
    site was `skipped` (not of the study's kind)."""

    site: str
    jobs: int
    failures: List[List[str]]  # [job label, why it cannot run there]
    skipped: Optional[str] = None


@dataclass(frozen=True)
class RunStatus(Record):
    """One run as `dlaunch status` shows it (a row of its table and the lines below it)."""

    name: str  # the run directory as shown (relative to the working directory below it)
    path: str
    site: str = ""
    job: str = "-"
    scheduler: str = ""  # its kind
    state: str = ""  # the scheduler's word for the job's state (the table's `scheduler` column)
    status: str = ""  # what its metrics say: 'no metrics yet', 'running', the end status ('ok', 'failed', ...)
    queue: str = ""  # a pending job's reason, place in the queue and expected start
    gpus: Optional[int] = None
    epochs_done: int = 0
    epochs_total: Optional[int] = None
    images_per_s: Optional[float] = None  # the run's throughput X once its metrics end
    last_epoch_images_per_s: Optional[float] = None  # while it runs: its last epoch's part of X (overhead included)
    steps_done: int = 0
    steps_total: Optional[int] = None
    # While it runs within an epoch (the trainer's progress.json): the job's images/s over the epoch's measured
    # steps so far (steps only) and rank 0's mean loss over them; `loss` is the last epoch record's.
    epoch_so_far_images_per_s: Optional[float] = None
    epoch_so_far_loss: Optional[float] = None
    loss: Optional[float] = None
    eta_s: Optional[float] = None  # while it runs: seconds left at the measured rate
    ended: bool = False
    ok: bool = False
    why_failed: Optional[str] = None  # None unless it failed
    flags: List[str] = field(default_factory=list)  # 'straggler: ...', 'throttled: ...'
    network: List[str] = field(default_factory=list)  # how it is off its profile's [network]
    figures: str = ""  # time and energy to accuracy, energy ('' when none is known)
    rejected: Optional[str] = None  # why its files cannot be read (then nothing else is known)
    # While it runs: per node how long ago it last finished a step ('dl-node2: last step 40 4 min ago'), from the
    # trainer's heartbeat files (dlaunch/runs/hangs.py)
    nodes: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Logs(Record):
    """A run's log files (oldest first), or why it has none (`failed`: it failed without writing one)."""

    files: List[str]
    missing: str = ""
    failed: bool = False


@dataclass(frozen=True)
class Spread(Record):
    """Repeated measurements: the median, the range `low`-`high` and its kind ('min-max', '95% CI')."""

    median: float
    low: float
    high: float
    runs: int
    kind: str


@dataclass(frozen=True)
class ReportPoint(Record):
    """One GPU count of a report's group: medians and spreads over its runs."""

    gpus: int
    nodes: int
    runs: int
    images_per_s: Spread  # throughput X
    speedup: Spread  # S_G = X_G / X_ref
    efficiency: Spread  # E_G = S_G / (G / G_ref)
    predicted_efficiency: Optional[float] = None  # the performance model's E_G (the site's [network])
    shares: Optional[Dict[str, float]] = None  # comm, compute, data: fractions of the profiled step
    joules_per_image: Optional[Spread] = None
    epochs_to_target: Optional[Spread] = None
    time_to_target_s: Optional[Spread] = None


@dataclass(frozen=True)
class BudgetRow(Record):
    """The efficiency budget at one GPU count: the share of the ideal lost per cause (None: not recorded)."""

    gpus: int
    efficiency: float  # the measured E_G
    step_s: float
    lost: Dict[str, Optional[float]]


@dataclass(frozen=True)
class ReportGroup(Record):
    """Runs of one experiment, site, model, framework, loader, batch per GPU and step options."""

    label: str
    experiment: str
    site: str
    model: str
    framework: str
    loader: str
    batch_per_gpu: int
    step_options: str  # workload options away from their defaults, as flags ("-": none)
    runs: List[str]  # their metrics files
    points: List[ReportPoint]
    budget: List[BudgetRow]


@dataclass(frozen=True)
class SetApartRun(Record):
    """A run the report lists apart (`why`: 'diverged', 'straggler', 'throttled', 'straggler and throttled' or
    'network') and whether it is in its tables."""

    metrics: str
    group: str
    gpus: int
    why: str
    details: List[str]
    included: bool = False


@dataclass(frozen=True)
class RcpRow(Record):
    """A group's convergence against MLPerf's Reference Convergence Points (dlaunch/analysis/convergence.py)."""

    group: str
    global_batch: int
    runs: int
    reached: int  # runs that reached 75.9 % top-1
    epochs: Optional[float]  # their mean epochs to it; None when too few reached
    rcp: Optional[str]
    verdict: str


@dataclass(frozen=True)
class Table(Record):
    """A table as the command line prints it: cells as text; `leave_out` the columns it drops first when the
    terminal is too narrow (it says which it left out)."""

    title: str
    headers: List[str]
    rows: List[List[str]]
    leave_out: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Report(Record):
    """The numbers `dlaunch report` shows; `tables` as it prints them; `files` are those written (with `output`)."""

    groups: List[ReportGroup]
    set_apart: List[SetApartRun]
    rcp: List[RcpRow]
    notes: List[str]
    rejected: List[str]  # one message per metrics file that could not be read
    files: List[str] = field(default_factory=list)
    tables: List[Table] = field(default_factory=list)


@dataclass(frozen=True)
class ResultRow(Record):
    """A run in the results database (dlaunch/resultsdb/store.py's columns) with S_G, E_G, history and RCP verdicts."""

    uid: str
    run: str
    experiment: str
    site: str
    started: str
    ended: str
    status: str
    reason: Optional[str]
    framework: str
    loader: str
    model: str
    amp: str
    schedule: str
    gpus: int
    nodes: int
    batch_per_gpu: int
    global_batch: int
    image: Optional[str]
    stack: str
    pins: Dict[str, Any]
    images_per_s: Optional[float]
    epoch_time_s: Optional[float]
    epochs: int
    total_time_s: Optional[float]
    best_top1: Optional[float]
    target_accuracy: Optional[float]
    epochs_to_target: Optional[int]
    epochs_to_mlperf_target: Optional[int]
    time_to_target_s: Optional[float]
    energy_j: Optional[float]
    energy_domains: Optional[str]
    joules_per_image: Optional[float]
    energy_to_target_j: Optional[float]
    request: Dict[str, Any]
    provenance: Dict[str, Any]
    path: str
    source: str
    flags: Optional[List[Dict[str, Any]]]  # [{"kind": "straggler" or "throttled", "message"}]; None: not recorded
    flags_threshold: Optional[float]  # the straggler threshold the flags were judged at
    step_options: str  # the trainer's workload options away from their defaults ("-": none)
    compile_s: Optional[float]  # --compile's compile time, never part of images_per_s
    speedup: Optional[float]
    efficiency: Optional[float]
    history: Optional[str]
    rcp: Optional[str]


@dataclass(frozen=True)
class CompareRow(Record):
    """One matched `key` (model, framework, GPU count, ...) of a comparison: each side's median, range (`_spread`:
    its kind), runs and values; B's median against A's in per cent, the exact Mann-Whitney p and its verdict."""

    key: Dict[str, Any]
    a_median: Optional[float]
    a_low: Optional[float]
    a_high: Optional[float]
    a_spread: Optional[str]
    a_runs: int
    a_values: List[float]
    b_median: Optional[float]
    b_low: Optional[float]
    b_high: Optional[float]
    b_spread: Optional[str]
    b_runs: int
    b_values: List[float]
    change_pct: Optional[float]
    p_value: Optional[float]
    significant: str


@dataclass(frozen=True)
class Comparison(Record):
    """`results compare`: sides A and B (their selectors and runs) on `metric`, matched per `varying` key; what is
    the `same` in every row, what tells the sides apart (`changed`, library `pins`: [A's, B's])."""

    a: str
    b: str
    a_runs: int
    b_runs: int
    metric: str
    varying: List[str]
    same: Dict[str, Any]
    changed: Dict[str, List[Any]]
    pins: Dict[str, List[Any]]
    rows: List[CompareRow]


@dataclass(frozen=True)
class SiteInfo(Record):
    """A site profile as `dlaunch sites` lists it; `unreadable` says why one could not be read."""

    name: str
    file: str
    aliases: List[str] = field(default_factory=list)
    scheduler: str = ""
    gpus_per_node: Optional[int] = None
    container: str = ""
    description: str = ""
    unreadable: Optional[str] = None


@dataclass(frozen=True)
class ImageInfo(Record):
    """A container image (`<stack>-<framework>-<arch>`): the sites using it, what is built, its pins."""

    image: str
    path: str  # where its .sif is (or would be)
    sites: List[str]
    built: List[str]  # 'sif', 'root fs'
    pins_from: str  # the built image's labels, else the lock
    pins: Dict[str, str]


@dataclass(frozen=True)
class Check(Record):
    """One of `doctor`'s checks: outcome pass, fail or skip; what it found; for a failure the fix, for a skip why."""

    name: str
    outcome: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Doctor(Record):
    """`doctor`'s checks of a site, and where they ran."""

    site: str
    host: str
    on_node: bool  # inside an allocation (the node's checks ran) or on a login node
    checks: List[Check]

    @property
    def failed(self) -> List[str]:
        return [c.name for c in self.checks if c.outcome == "fail"]


@dataclass(frozen=True)
class PredictionRow(Record):
    """The performance model at one GPU count (dlaunch/analysis/perfmodel/model.py's Prediction), the basis of the
    row, and the published or measured values beside it."""

    gpus: int
    nodes: int
    step_s: float
    comm_s: float
    exposed_comm_s: float
    wait_s: float
    hidden_wait_s: float
    kernel_comm_s: float
    algorithm: str
    images_per_s: float
    speedup: float
    efficiency: float
    comm_share: float  # NCCL kernel time / (NCCL + compute kernel time), as Table 2a of Aach et al.
    profiled_comm_share: float  # what --profile-steps measures: comm / (comm + compute + data)
    steps_per_epoch: int = 0
    epoch_overhead: Dict[str, float] = field(default_factory=dict)  # seconds per epoch outside the steps, by part
    overhead_share: float = 0.0  # the epoch overhead's share of the run's time
    basis: str = ""  # nominal, fitted, in range, predicted
    paper_efficiency: Optional[str] = None  # Aach et al.'s statement on E_G at this count (">0.50", "0.50")
    paper_efficiency_error: Optional[float] = None  # E_G - the stated value; None where a stated bound holds
    paper_comm_share: Optional[float] = None  # Table 2a's NCCL share of kernel time
    slowest_forward_excess: Optional[float] = (
        None  # the runs' slowest rank's forward pass over the median rank's, a fraction
    )
    # (stragglers.forward_excess; None: not recorded)


@dataclass(frozen=True)
class LeftOutRun(Record):
    """One of `from_runs`' runs predicted from a fit on the others (`why` when the others cannot predict it)."""

    run: str  # its metrics file
    gpus: int
    step_ms: float  # its wall-clock step time
    comm_share: float  # its profiled comm share
    predicted_step_ms: Optional[float] = None
    step_error: Optional[float] = None  # predicted / measured - 1
    predicted_comm_share: Optional[float] = None
    share_error: Optional[float] = None  # predicted - measured
    why: str = ""


@dataclass(frozen=True)
class Prediction(Record):
    """`predict`: the workload and machine it assumed and where each came from, and a row per GPU count."""

    site: str
    model: str
    framework: str
    batch: int
    compute_source: str
    machine: str  # where the machine's figures come from: the site's nominal network, or what they were fitted on
    rows: List[PredictionRow]
    workload: Dict[str, Any] = field(default_factory=dict)  # dlaunch/analysis/perfmodel/model.py's Workload
    machine_figures: Dict[str, Any] = field(default_factory=dict)  # .../perfmodel/nccl.py's Machine
    storage: str = ""  # the file system's ceiling and where it comes from
    epochs: str = ""  # the epochs and their overhead
    profiled: bool = False  # fitted on runs (from_runs): its comm share is the profiled one
    runs_gpus: List[int] = field(default_factory=list)  # the GPU counts of the runs it was fitted on
    assumptions: List[str] = field(default_factory=list)  # about Aach et al.'s DeepSpeed runs (calibrated)
    left_out: List[LeftOutRun] = field(default_factory=list)
    left_out_summary: str = ""
    notes: List[str] = field(default_factory=list)  # what the rows rest on


# -- errors ---------------------------------------------------------------------------------------------


def os_error(e: OSError) -> DlaunchError:
    """An OSError about a path the user gave or one dlaunch writes (a name too long for the file system, no
    permission, a full disk) as the one line naming it (exit code 2)."""
    where = "%s: " % display_path(Path(os.fsdecode(e.filename))) if e.filename is not None else ""
    return DlaunchError("%s%s" % (where, e.strerror or escape(str(e))))


F = TypeVar("F", bound=Callable[..., Any])


def _api(function: F) -> F:
    """An API function: a path may be given as str or os.PathLike (handed on as str, as the command line has it); its
    DlaunchError's message as the command line prints it (control characters escaped), an OSError as `os_error`."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args = tuple(os.fspath(a) if isinstance(a, os.PathLike) else a for a in args)
        kwargs = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in kwargs.items()}
        try:
            return function(*args, **kwargs)
        except DlaunchError as e:
            e.args = (escape(str(e)),)
            raise
        except OSError as e:
            raise os_error(e) from e

    return wrapper  # type: ignore[return-value]


# -- run, sweep -----------------------------------------------------------------------------------------


def _job(prepared: "Prepared", run: "Optional[RunDir]" = None, code: Optional[int] = None, label: str = "") -> Job:
    plan = prepared.plan
    return Job(
        run_dir=plan.run_dir,
        site=plan.site,
        scheduler=plan.scheduler,
        experiment=prepared.request.experiment or "",
        run_name=Path(plan.run_dir).name,
        script=prepared.script,
        job_id=run.job_id if run else None,
        warnings=list(prepared.warnings),
        notes=list(prepared.notes),
        submitted=run is not None,
        exit_code=code if run is not None and prepared.foreground else None,
        nodes=plan.nodes,
        processes=plan.nodes * plan.nproc_per_node,
        label=label,
    )


def _delivered(jobs: Sequence["Prepared"], dry_run: bool) -> List[Job]:
    """Prepared jobs as `Job`s: rendered only (a dry run), or submitted (a foreground one run here to its end,
    without showing its progress)."""
    if dry_run:
        return [_job(p) for p in jobs]
    submitted = launch.submit(jobs)
    return [_job(p, run, code) for p, run, code in zip(jobs, submitted.runs, submitted.codes)]


@_api
def run(
    site: Optional[str] = None,
    *,
    framework: str = "ddp",
    nodes: Optional[int] = None,
    gpus: Optional[int] = None,
    partition: Optional[str] = None,
    time: str = "01:00:00",
    account: Optional[str] = None,
    image: Optional[str] = None,
    output: str = "runs",
    experiment: Optional[str] = None,
    run_name: Optional[str] = None,
    repeat: int = 1,
    requeue: Optional[bool] = None,
    resume: Optional[str] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    **trainer: Any,
) -> List[Job]:
    """Render a job for a site and submit it, or run it here to its end (`site="local"`); with `dry_run`
    render it only. `repeat` N: N runs of the request (RUN_NAME-r1..-rN); `resume`: a run directory again
    from its checkpoint (every other option from its plan.json). Trainer flags as keyword arguments."""
    jobs = launch.prepare_run(
        site,
        framework=framework,
        nodes=nodes,
        gpus=gpus,
        partition=partition,
        time=time,
        account=account,
        image=image,
        output=output,
        experiment=experiment,
        run_name=run_name,
        repeat=repeat,
        requeue=requeue,
        resume=resume,
        dry_run=dry_run,
        allow_large=allow_large,
        trainer=launch.trainer_options(trainer),
    )
    return _delivered(jobs, dry_run)


@_api
def sweep(
    site: Optional[str] = None,
    *,
    framework: str = "ddp",
    nodes: Optional[Sequence[int]] = None,
    gpus: Optional[Sequence[int]] = None,
    partition: Optional[str] = None,
    time: str = "01:00:00",
    account: Optional[str] = None,
    image: Optional[str] = None,
    output: str = "runs",
    experiment: Optional[str] = None,
    requeue: Optional[bool] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    **trainer: Any,
) -> List[Job]:
    """One job per node count (`nodes=[1, 2, 4]`) or GPU count (`gpus=...`), grouped as one experiment
    (runs n0001, n0002, ... or g0001, ...)."""
    jobs = launch.prepare_sweep(
        site,
        framework=framework,
        nodes=nodes,
        gpus=gpus,
        partition=partition,
        time=time,
        account=account,
        image=image,
        output=output,
        experiment=experiment,
        requeue=requeue,
        dry_run=dry_run,
        allow_large=allow_large,
        trainer=launch.trainer_options(trainer),
    )
    return _delivered(jobs, dry_run)


def _counted_warnings(lines: Iterable[str]) -> List[str]:
    """Each distinct warning once, sorted, with the number of jobs it came from when more than one."""
    from collections import Counter

    return ["%s (%d jobs)" % (line, n) if n > 1 else line for line, n in sorted(Counter(lines).items())]


@_api
def rerun(
    result: Any,
    *,
    site: str,
    nodes: Optional[int] = None,
    gpus: Optional[int] = None,
    data: Optional[str] = None,
    output: str = "runs",
    dry_run: bool = False,
    allow_large: bool = False,
) -> Rerun:
    """A result (metrics file, run directory, or ARCHIVE.tar.gz:RUN of `archive`'s bundle) run again on `site`: its
    request resolved there, submitted (or rendered only with `dry_run`), with what differs from the parent."""
    rerun = launch.prepare_rerun(
        result, site, nodes=nodes, gpus=gpus, data=data, output=output, dry_run=dry_run, allow_large=allow_large
    )
    (job,) = _delivered([rerun.job], dry_run)
    return Rerun(rerun.parent, [list(row) for row in rerun.differences], job)


@_api
def archive(folder: Any, output: Any) -> Archive:
    """Bundle an experiment's or study's directory into `output` (FILE.tar.gz): scripts, plans, profiles, metrics,
    logs and report, with a sha256 manifest."""
    from dlaunch.runs.archive import MANIFEST, runs_without_profile, write_archive

    manifest = write_archive(Path(folder), Path(output))
    return Archive(
        str(output),
        "%s/%s" % (Path(folder).resolve().name, MANIFEST),
        len(manifest),
        sum(int(entry["bytes"]) for entry in manifest.values()),  # type: ignore[call-overload]
        [str(run.path) for run in runs_without_profile(Path(folder))],
    )


@_api
def study(
    name_or_path: Any,
    *,
    site: str,
    output: Any = "runs",
    dry_run: bool = False,
    list_only: bool = False,
    only: Sequence[str] = (),
    data: Sequence[str] = (),
    account: Optional[str] = None,
    image: Optional[str] = None,
    protocol: Optional[str] = None,
    stack: Optional[str] = None,
    allow_large: bool = False,
    planned: Optional[Callable[[StudyPlan], None]] = None,
    say: Callable[[str], None] = lambda line: None,
    show_progress: bool = False,
) -> List[Job]:
    """A study's jobs for `site` that are missing or failed, rendered and submitted into OUTPUT/<study name> (a
    study name, shipped or in $DLAUNCH_STUDIES_DIR, or a study file); with `dry_run` (or `list_only`, whose jobs the
    command line prints one line each: `label`, nodes, processes) rendered only. Warnings about its data and jobs are
    DlaunchWarnings, each said once; the jobs left alone (ended ok, still active) a DlaunchNote. `planned` hears the
    StudyPlan before anything is submitted, `say` each submission; `show_progress`: a job run here shows its
    progress on stdout (the command line's live view)."""
    from dlaunch.runs.study import prepare_study, submit_study
    from dlaunch.runs.studyfile import find_study

    dry_run = dry_run or list_only
    prepared = prepare_study(
        find_study(str(name_or_path)),
        site,
        Path(output),
        dry_run,
        only,
        data,
        account,
        image,
        protocol,
        stack,
        allow_large,
    )
    counted = _counted_warnings([*prepared.warnings, *(line for _, job in prepared.jobs for line in job.warnings)])
    for line in counted:
        warnings.warn(escape(line), DlaunchWarning, stacklevel=3)
    if prepared.ended_ok or prepared.active:
        warnings.warn("study %s: %s" % (prepared.study.name, prepared.summary), DlaunchNote, stacklevel=3)
    jobs = [_job(job, label=item.label) for item, job in prepared.jobs]
    if planned is not None:
        planned(StudyPlan(prepared.study.name, prepared.site, prepared.summary, prepared.design, counted, jobs))
    if dry_run:
        return jobs
    submitted = submit_study(prepared, say, show_progress)
    return [
        _job(job, run, code, item.label)
        for (item, job), run, code in zip(prepared.jobs, submitted.runs, submitted.codes)
    ]


@_api
def study_check(
    name_or_path: Any, *, sites: Sequence[str] = (), protocol: Optional[str] = None, stack: Optional[str] = None
) -> List[StudyCheck]:
    """Render every job of a study for each of `sites` (default: every shipped site, those not of the study's kind
    skipped) as `dlaunch study check` does: per site the jobs that cannot run there and why."""
    from dlaunch.runs.study import check_study
    from dlaunch.runs.studyfile import find_study

    return [
        StudyCheck(r.site, r.jobs, [[label, why] for label, why in r.failures], r.skipped)
        for r in check_study(find_study(str(name_or_path)), sites, protocol, stack)
    ]


@_api
def study_status(folder: Any) -> List[RunStatus]:
    """The runs of a study directory (OUTPUT/<study name>), as `status` gives them."""
    from dlaunch.runs.study import study_runs

    return _statuses(study_runs(Path(folder)))


# -- status, watch, cancel, logs -----------------------------------------------------------------------


def _record_ended(runs: Iterable["RunDir"]) -> None:
    """Rows for the runs that ended into the results database; one that cannot be written is a DlaunchWarning."""
    from dlaunch.resultsdb.store import record

    warning = record([run.metrics_path for run in runs]).warning
    if warning:
        warnings.warn(warning, DlaunchWarning, stacklevel=3)


def _run_status(snapshot: "Snapshot") -> RunStatus:
    from dlaunch.runs import service
    from dlaunch.runs.failures import scheduler_label

    p = snapshot.progress
    return RunStatus(
        name=snapshot.name,
        path=str(snapshot.run.path),
        site=snapshot.site,
        job=snapshot.job,
        scheduler=snapshot.scheduler,
        state=scheduler_label(snapshot.state, snapshot.meaning, p.status),
        status=p.status,
        queue=snapshot.queue,
        gpus=snapshot.gpus,
        epochs_done=p.epochs_done,
        epochs_total=p.epochs_total,
        images_per_s=p.images_per_s,
        last_epoch_images_per_s=p.last_epoch_images_per_s,
        steps_done=p.steps_done,
        steps_total=p.steps_total,
        epoch_so_far_images_per_s=p.epoch_so_far_images_per_s,
        epoch_so_far_loss=p.epoch_so_far_loss,
        loss=p.loss,
        eta_s=p.eta_s(clock.time()),
        ended=snapshot.ended,
        ok=snapshot.ok,
        why_failed=service.why_failed(snapshot) if snapshot.failed else None,
        flags=list(snapshot.flags),
        network=list(snapshot.network),
        figures=service.run_figures(snapshot),
        nodes=list(snapshot.nodes),
    )


def _check_threshold(straggler_threshold: Optional[float]) -> None:
    """A straggler threshold given (None: each run's profile's) is a fraction in (0, 1), as the option says."""
    from dlaunch.analysis.stragglers import check_threshold

    if straggler_threshold is not None:
        try:
            check_threshold(straggler_threshold)
        except ValueError as e:
            raise DlaunchError("Invalid value for '--straggler-threshold': %s" % e) from None


def _statuses(found: Sequence["RunDir"], straggler_threshold: Optional[float] = None) -> List[RunStatus]:
    """Each run's status, in the order given; a run whose files cannot be read has only `rejected`; flags judged
    at `straggler_threshold` (None: each run's profile's). The runs that ended are recorded in the results database."""
    from dlaunch.runs import service

    by_path, ok = {}, []
    for run in found:
        try:
            run.check()
        except DlaunchError as e:
            by_path[run.path] = RunStatus(display_path(run.path), str(run.path), rejected=str(e))
        else:
            ok.append(run)
    by_path.update((s.run.path, _run_status(s)) for s in service.observe(ok, straggler_threshold))
    _record_ended(ok)
    return [by_path[run.path] for run in found]


@_api
def status(
    paths: Sequence[Any] = ("runs",), *, newest_first: bool = False, straggler_threshold: Optional[float] = None
) -> List[RunStatus]:
    """The runs at or below `paths` (run, experiment or study directories), in path order or `newest_first`
    (by their last submission, as `dlaunch runs`): scheduler state, metrics status, figures, why one failed,
    stragglers judged at `straggler_threshold` (None: each run's site profile's)."""
    from dlaunch.runs.rundir import find_runs
    from dlaunch.runs.rundir import newest_first as by_submission

    _check_threshold(straggler_threshold)
    paths = list(paths)
    found = find_runs([Path(p) for p in paths])
    if not found:
        raise DlaunchError("no run directories under %s" % ", ".join(escape(str(p)) for p in paths))
    return _statuses(by_submission(found) if newest_first else found, straggler_threshold)


@_api
def watch(
    paths: Sequence[Any],
    *,
    interval: float = 5.0,
    timeout: Optional[float] = None,
    straggler_threshold: Optional[float] = None,
) -> List[RunStatus]:
    """Look at the runs every `interval` seconds until every one has ended (or `timeout` seconds have
    passed); their last status. `paths` and `straggler_threshold` as for `status`, or an experiment's name
    under ./runs."""
    from dlaunch.runs import service
    from dlaunch.runs.watch import Watcher, check_watchable, resolve_targets

    if not interval >= 0.1:  # as the command line's option says it
        raise DlaunchError("Invalid value for '--interval': %s is below 0.1" % quoted(str(interval)))
    _check_threshold(straggler_threshold)
    targets = resolve_targets([Path(p) for p in paths])
    check_watchable(Watcher(targets, service.why_failed).poll())
    deadline = None if timeout is None else clock.monotonic() + timeout
    while True:
        seen = status(targets, straggler_threshold=straggler_threshold)
        if all(s.ended or s.rejected for s in seen) or (deadline is not None and clock.monotonic() >= deadline):
            return seen
        clock.sleep(interval if deadline is None else max(0.0, min(interval, deadline - clock.monotonic())))


@_api
def cancel(run_dir: Any) -> str:
    """Cancel a run's job; what was done, as a line (a run that has ended is left as it is)."""
    from dlaunch.runs import service
    from dlaunch.runs.rundir import RunDir

    return service.cancel(RunDir.open(Path(run_dir)))


@_api
def logs(run_dir: Any) -> Logs:
    """A run's log files, oldest first, or why it has none."""
    from dlaunch.runs import service
    from dlaunch.runs.rundir import RunDir

    found = service.logs(RunDir.open(Path(run_dir)))
    return Logs([str(p) for p in found.files], found.missing, found.failed)


# -- report, results ------------------------------------------------------------------------------------


def _spread(s: Any) -> Optional[Spread]:
    return None if s is None else Spread(s.median, s.low, s.high, s.n, s.kind)


def _group(g: Any) -> ReportGroup:
    points = [
        ReportPoint(
            gpus=p.gpus,
            nodes=p.nodes,
            runs=p.runs,
            images_per_s=_spread(p.throughput),  # type: ignore[arg-type]
            speedup=_spread(p.speedups),
            efficiency=_spread(p.efficiencies),  # type: ignore[arg-type]
            predicted_efficiency=g.predictions[p.gpus].efficiency if p.gpus in g.predictions else None,
            shares=dataclasses.asdict(p.shares) if p.shares else None,
            joules_per_image=_spread(p.energy),
            epochs_to_target=_spread(p.epochs_to_target),
            time_to_target_s=_spread(p.time_to_target),
        )
        for p in g.points
    ]
    budget = [BudgetRow(row.gpus, row.measured_e_g, row.step_s, dict(row.lost)) for row in g.budget]
    key = g.key
    return ReportGroup(
        key.label,
        key.experiment,
        key.site,
        key.model,
        key.framework,
        key.loader,
        key.batch_per_worker,
        key.step_options,
        [r.path for r in g.runs],
        points,
        budget,
    )


# The report's console tables: the columns left out first at a narrow terminal (report.md and report.html keep every one).
SCALING_LEAVE_OUT = [
    "images/s range",
    "E_G range",
    "J/img range",
    "spread",
    "nodes",
    "runs",
    "data %",
    "compute %",
    "comm %",
    "time to target s",
    "epochs to target",
    "TTA S_G",
    "J/img",
    "pred. E_G",
]
RUN_LEAVE_OUT = [
    "schedule",
    "global batch",
    "energy to acc. kJ",
    "kJ/epoch",
    "energy kJ",
    "time to acc. s",
    "epochs to target",
    "J/img",
    "compile s",
    "best top-1",
    "history",
    "status",
]
BUDGET_LEAVE_OUT = ["batch/X ms"]
CONSOLE_GROUPS = 10  # groups shown as tables of their own; more: a line per group, the tables in the files
SUMMARY_HEADERS = ["group", "runs", "GPUs", "images/s", "E_G"]


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], leave_out: Sequence[str] = ()) -> Table:
    return Table(title, list(headers), [list(row) for row in rows], [h for h in leave_out if h in headers])


def _flag_kinds(flags: Sequence[Any]) -> str:
    """'straggler', 'throttled' or 'straggler and throttled': the kinds of a run's flags (stragglers first)."""
    return " and ".join(dict.fromkeys(f.kind for f in flags))


def _report_tables(data: Any) -> List[Table]:
    """The tables `dlaunch report` prints: per group its scaling, runs and budget (beyond CONSOLE_GROUPS groups one
    line per group: images/s and E_G at its largest GPU count), then RCP verdicts and the runs set apart."""
    from dlaunch.analysis.convergence import RCP_SOURCE
    from dlaunch.reporting.document import (
        BUDGET_HEADERS,
        DIVERGED_HEADERS,
        FLAGGED_HEADERS,
        OFF_NETWORK_HEADERS,
        RCP_HEADERS,
        Columns,
        budget_rows,
        diverged_rows,
        flagged_rows,
        off_network_rows,
        rcp_rows,
        run_rows,
        scaling_rows,
    )
    from dlaunch.tables import cell

    results, apart, tables = data.results, data.apart, []
    if len(results) > CONSOLE_GROUPS:
        summary = []
        for g in results:
            last = g.points[-1] if g.points else None
            summary.append(
                [
                    g.key.label,
                    str(len(g.runs)),
                    "%d-%d" % (g.points[0].gpus, last.gpus) if last else "-",
                    cell(last.images_per_s if last else None),
                    cell(last.efficiency if last else None, "%.3f"),
                ]
            )
        tables.append(
            _table(
                "%d groups: images/s and E_G at each group's largest GPU count (every table: report.md, "
                "report.html)" % len(results),
                SUMMARY_HEADERS,
                summary,
            )
        )
    else:
        columns = Columns.of([r for g in results for r in g.runs], history=bool(data.recorded.history))
        for g in results:
            tables.append(_table(g.key.label, columns.scaling_headers(), scaling_rows(g, columns), SCALING_LEAVE_OUT))
            rows = [row[:-1] for row in run_rows(g, data.profiles, columns, data.recorded.history)]  # paths: report.md
            tables.append(_table(g.key.label + ": runs", columns.run_headers()[:-1], rows, RUN_LEAVE_OUT))
            if g.explained:
                tables.append(
                    _table(g.key.label + ": efficiency budget", BUDGET_HEADERS, budget_rows(g), BUDGET_LEAVE_OUT)
                )
    if data.rcp:
        tables.append(
            _table(
                "convergence against MLPerf's RCPs (%s)" % RCP_SOURCE,
                ["group"] + RCP_HEADERS,
                [[v.label] + row for v, row in zip(data.rcp, rcp_rows(data.rcp))],
                ["min epochs", "RCP mean", "runs", "RCP"],
            )
        )
    if apart.flagged:
        rows = [[r.key.label] + row[:-1] for r in apart.flagged for row in flagged_rows([r], apart.flags)]
        tables.append(_table("runs with a straggler or a throttled GPU", ["group"] + FLAGGED_HEADERS[:-1], rows))
    if data.diverged:
        rows = [[r.key.label] + row[:-1] for r in data.diverged for row in diverged_rows([r])]
        tables.append(
            _table("diverged runs (left out of every table above)", ["group"] + DIVERGED_HEADERS[:-1], rows, ["epochs"])
        )
    if apart.off:
        rows = [[r.key.label] + row[:-1] for r in apart.off for row in off_network_rows([r], apart.problems)]
        tables.append(_table("runs off their network", ["group"] + OFF_NETWORK_HEADERS[:-1], rows))
    return tables


@_api
def report(
    paths: Sequence[Any],
    *,
    output: Optional[Any] = None,
    include_network_mismatches: bool = False,
    include_stragglers: bool = False,
    straggler_threshold: Optional[float] = None,
    site: Optional[str] = None,
    on_rejected: Optional[Callable[[str], None]] = None,
) -> Report:
    """What `dlaunch report` shows for the runs under `paths`: per group the scaling points (X, S_G, E_G and
    their spreads, predicted E_G), the efficiency budget; the runs set apart (diverged, stragglers, off
    their network); the tables the command prints (`tables`); with `output`, report.md, report.html and the
    plots written there (`files`). `on_rejected` hears each unreadable metrics file's message as soon as it is
    read (the command line prints them before a refusal)."""
    from dlaunch.analysis.scaling import load_runs
    from dlaunch.boundary import output_folder
    from dlaunch.reporting.document import write_report
    from dlaunch.reporting.html import PAGE
    from dlaunch.reporting.report import report_data

    _check_threshold(straggler_threshold)
    if output is not None:
        output_folder("--output", Path(output))
    given = [Path(p) for p in paths]
    loaded = load_runs(str(p) for p in given)
    for message in loaded.rejected if on_rejected else ():  # before a refusal (no valid file) is raised
        on_rejected(message)  # type: ignore[misc]
    data = report_data(loaded, given, site, include_network_mismatches, include_stragglers, straggler_threshold)
    apart = data.apart
    set_apart = [SetApartRun(r.path, r.key.label, r.world_size, "diverged", [r.reason or ""]) for r in data.diverged]
    set_apart += [
        SetApartRun(
            r.path,
            r.key.label,
            r.world_size,
            _flag_kinds(apart.flags[r.path]),
            [f.message for f in apart.flags[r.path]],
            apart.flagged_included,
        )
        for r in apart.flagged
    ]
    set_apart += [
        SetApartRun(r.path, r.key.label, r.world_size, "network", list(apart.problems[r.path]), apart.off_included)
        for r in apart.off
    ]
    notes = data.notes + apart.notes()
    files: List[str] = []
    if output is not None:
        folder = Path(output)
        write_report(
            folder,
            data.results,
            data.profiles,
            loaded.rejected,
            notes,
            data.diverged,
            data.recorded,
            data.rcp,
            apart,
            [str(p) for p in given],
        )
        files = sorted(
            str(folder / name) for name in os.listdir(folder) if name in ("report.md", PAGE) or name.endswith(".png")
        )
    rcp = [
        RcpRow(v.label, v.global_batch, v.runs, v.reached, v.epochs, v.rcp.name if v.rcp else None, v.verdict)
        for v in data.rcp
    ]
    return Report(
        [_group(g) for g in data.results], set_apart, rcp, notes, list(loaded.rejected), files, _report_tables(data)
    )


def results_db(db: Optional[Any] = None) -> "ResultsDB":
    """The results database `db` (default: $DLAUNCH_RESULTS_DB, else runs/results.sqlite); DlaunchError when there is none."""
    from dlaunch.resultsdb.store import ResultsDB, db_path

    path = db_path(Path(db) if db is not None else None)
    if not path.is_file():
        raise DlaunchError(
            "%s: no results database (runs are recorded when they end; `dlaunch results rebuild` "
            "reads run directories)" % path
        )
    return ResultsDB(path)


@_api
def results(where: Sequence[str] = (), *, db: Optional[Any] = None) -> List[ResultRow]:
    """The runs in the results database, oldest first (those that ended together by experiment, site and GPU
    count), that match every selector of `where` (e.g. 'site=juwels,gpus=8', 'date=2026-10'), with S_G, E_G,
    history and MLPerf RCP verdicts. A bad selector is a DlaunchError (before the database is looked for); one
    that matches nothing a DlaunchNote."""
    from dlaunch.analysis.convergence import load_rcps, run_rcp_verdict
    from dlaunch.resultsdb.compare import parse_conditions, select, unmatched, with_history, with_scaling

    for selector in where:  # a bad selector is named before the database is looked for
        parse_conditions(selector)
    with results_db(db) as store:
        everything = with_scaling(store.rows())
    for note in unmatched(everything, list(where)):
        warnings.warn("-w %s" % escape(note), DlaunchNote, stacklevel=3)
    rcps = load_rcps()
    names = [f.name for f in dataclasses.fields(ResultRow) if f.name != "rcp"]
    rows = sorted(
        with_history(select(everything, list(where)), everything),  # runs that ended together: by GPU count
        key=lambda row: (row["ended"], row["experiment"], row["site"], row["gpus"], row["run"]),
    )
    return [
        ResultRow(
            **{k: row[k] for k in names},
            rcp=None
            if row["epochs_to_mlperf_target"] is None
            else run_rcp_verdict(row["global_batch"], row["epochs_to_mlperf_target"], rcps),
        )
        for row in rows
    ]


def _compare_row(match: Any) -> CompareRow:
    sides = {}
    for side, values in (("a", match.a), ("b", match.b)):
        s = match.spread(values)
        sides.update(
            {
                side + "_median": s.median if s else None,
                side + "_low": s.low if s else None,
                side + "_high": s.high if s else None,
                side + "_spread": s.kind if s else None,
                side + "_runs": len(values),
                side + "_values": list(values),
            }
        )
    return CompareRow(
        key=dict(match.key),
        **sides,
        change_pct=None if match.change is None else 100 * match.change,
        p_value=match.p_value,
        significant=match.significance,
    )


@_api
def compare(a: str, b: str, *, metric: str = "images_per_s", db: Optional[Any] = None) -> Comparison:
    """Two sets of runs of the results database (each an experiment's name or a selector, as `results`' `where`)
    compared per model, framework, GPU count, ... on `metric`, as `dlaunch results compare`."""
    from dlaunch.resultsdb.compare import compare as compared
    from dlaunch.resultsdb.compare import parse_conditions

    for selector in (a, b):  # named before the database is looked for
        parse_conditions(selector)
    with results_db(db) as store:
        c = compared(store.rows(), a, b, metric)
    keys = list(c.matches[0].key) if c.matches else []
    varying = [k for k in keys if len({str(m.key[k]) for m in c.matches}) > 1] or keys[:1]
    return Comparison(
        c.a.label,
        c.b.label,
        len(c.a.rows),
        len(c.b.rows),
        c.metric,
        varying,
        {k: c.matches[0].key[k] for k in keys if k not in varying},
        {k: list(v) for k, v in c.changed.items()},
        {k: list(v) for k, v in c.pins.items()},
        [_compare_row(m) for m in c.matches],
    )


# -- sites, images, doctor, predict ---------------------------------------------------------------------


@_api
def sites() -> List[SiteInfo]:
    """The site profiles found (dlaunch/jobs/sites.py's folders), by name; an unreadable one says why."""
    from dlaunch.jobs.sites import available_sites, load_site

    found = []
    for name, path in available_sites().items():
        try:
            site = load_site(path)
        except DlaunchError as e:
            found.append(SiteInfo(name, str(path), unreadable=str(e)))
            continue
        found.append(
            SiteInfo(
                site.name,
                str(path),
                list(site.aliases),
                site.scheduler.kind,
                site.gpus_per_node,
                site.container.kind,
                site.description,
            )
        )
    return found


@_api
def images(site: Optional[str] = None) -> List[ImageInfo]:
    """The container images per stack, framework image and architecture (those `site` uses, when given),
    the sites using each, whether it is built and its pins (a built image's labels, else the lock's)."""
    from dlaunch.jobs import images as lock_images
    from dlaunch.jobs.imagepaths import default_image, image_reference, stack_of
    from dlaunch.jobs.sites import resolve_site
    from dlaunch.train.framework_table import image_groups

    lock = lock_images.load_lock()
    if site is None:
        users = lock_images.site_stacks()
        shown = [(name, arch) for name, stack in lock.stacks.items() for arch in stack.architectures]
    else:
        chosen = resolve_site(site)
        stack_name = stack_of(chosen)
        if stack_name is None:
            raise DlaunchError("--site: site %s runs without a container" % chosen.name)
        users = {chosen.name: (stack_name, chosen.arch)}
        shown = [(stack_name, chosen.arch)]
    binary = lock_images.container_binary()
    found = []
    for stack_name, arch in shown:
        using = [name for name, used in users.items() if used == (stack_name, arch)]
        stack = lock.stacks.get(stack_name)
        for group in stack.image_groups() if stack else image_groups():
            sif = default_image(group, stack_name, arch)
            rootfs = Path(image_reference(group, stack_name, arch, "dir"))
            pins, source = lock_images.pins_of(sif, rootfs, stack, group, binary)
            built = [kind for kind, there in (("sif", sif.is_file()), ("root fs", rootfs.is_dir())) if there]
            found.append(ImageInfo(sif.stem, str(sif), using, built, source, dict(pins)))
    return found


@_api
def render_images() -> List[str]:
    """Write containers/<stack>/<image>.def anew from the lock (containers/versions.toml); the files written."""
    from dlaunch.atomic import write_atomic
    from dlaunch.jobs.images import load_lock, render_all

    written = []
    for path, text in render_all(load_lock()).items():
        write_atomic(path, text)
        written.append(str(path))
    return written


@_api
def doctor(
    site: str,
    *,
    partition: Optional[str] = None,
    account: Optional[str] = None,
    image: Optional[str] = None,
    framework: str = "ddp",
) -> Doctor:
    """Check a site before submitting (dlaunch/preflight.py): on a login node the scheduler, account, MPI,
    modules, runtime and image; inside an allocation also the node's architecture, rendezvous, interfaces,
    GPUs, driver and one all-reduce across the nodes. Failed checks are results, not errors."""
    import socket

    from dlaunch.preflight import examine

    profile, node, done = examine(site, partition, account, image, framework)
    return Doctor(
        profile.name, socket.gethostname(), node.on_node, [Check(c.name, c.result, c.found, c.fix) for c in done]
    )


def _left_out(lo: "LeftOut") -> LeftOutRun:
    from dlaunch.analysis.perfmodel.fit import wall_step_s

    measured = dict(
        run=lo.run.path, gpus=lo.run.world_size, step_ms=1e3 * wall_step_s(lo.run), comm_share=lo.measured_share
    )
    if lo.predicted is None:
        return LeftOutRun(**measured, why=lo.why)
    return LeftOutRun(
        **measured,
        predicted_step_ms=1e3 * lo.predicted.step_s,
        step_error=lo.step_error,
        predicted_comm_share=lo.predicted.profiled_comm_share,
        share_error=lo.share_error,
    )


@_api
def predict(
    site: str,
    *,
    gpus: Optional[Sequence[int]] = None,
    model: Optional[str] = None,
    compute_ms: Optional[float] = None,
    data_ms: Optional[float] = None,
    batch: Optional[int] = None,
    framework: str = "ddp",
    zero_stage: Optional[int] = None,
    precision: Optional[str] = None,
    from_run: Optional[Any] = None,
    from_runs: Sequence[Any] = (),
    calibrated: Optional[str] = None,
    storage_images_per_s: Optional[float] = None,
    epoch_overhead: Optional[float] = None,
    epoch_images: Optional[int] = None,
) -> Prediction:
    """The performance model for a site, as `dlaunch predict`: step time, images/s, S_G, E_G and NCCL kernel share
    per GPU count on the site's nominal network (its [network] section), a machine fitted on Aach et al.'s Table 2a
    (`calibrated="dali"` or `"native"`) or on your own profiled runs (`from_runs`), each option the command's."""
    from dlaunch.analysis.perfmodel.fit import loo_summary
    from dlaunch.analysis.perfmodel.model import IMAGENET_TRAIN_IMAGES
    from dlaunch.analysis.perfmodel.prediction import prediction

    result = prediction(
        site,
        gpus,
        model,
        compute_ms,
        data_ms,
        batch,
        framework,
        zero_stage,
        precision,
        None if from_run is None else Path(from_run),
        [Path(p) for p in from_runs],
        calibrated,
        storage_images_per_s,
        epoch_overhead,
        IMAGENET_TRAIN_IMAGES if epoch_images is None else epoch_images,
    )
    checks, excess = result.checks or {}, result.forward_excess_by_gpus or {}
    rows = []
    for p in result.predictions:
        statement = checks[p.gpus].statement if p.gpus in checks else None
        holds = statement is not None and statement.relation != "=" and statement.holds(p.efficiency)
        rows.append(
            PredictionRow(
                **dataclasses.asdict(p),
                overhead_share=p.overhead_share,
                basis=result.basis[p.gpus],
                paper_efficiency=statement.text if statement else None,
                paper_efficiency_error=None if statement is None or holds else statement.error(p.efficiency),
                paper_comm_share=checks[p.gpus].comm_share if p.gpus in checks else None,
                slowest_forward_excess=excess.get(p.gpus),
            )
        )
    return Prediction(
        result.site,
        result.model,
        result.framework,
        result.workload.batch,
        result.compute_source,
        result.machine_source,
        rows,
        workload=dataclasses.asdict(result.workload),
        machine_figures=dataclasses.asdict(result.machine),
        storage=result.storage,
        epochs=result.epochs,
        profiled=result.profiled,
        runs_gpus=sorted(excess),
        assumptions=result.assumptions,
        left_out=[_left_out(lo) for lo in result.left_out],
        left_out_summary=loo_summary(result.left_out) if result.left_out else "",
        notes=result.notes,
    )
