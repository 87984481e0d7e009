"""The API's objects: frozen dataclasses of plain values (`Record`), one per thing a function returns."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from dlaunch.api.record import Record


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
class QueueCost(Record):
    """One partition/QOS row's share of a `Cost`: its jobs, their node-hours at their time limits, its largest job."""

    queue: str  # the profile's row, with the partition and QOS it renders where they are not its name
    jobs: int
    node_hours: float
    largest_nodes: int


@dataclass(frozen=True)
class FigureCost(Record):
    """The jobs of a study that stand for one published figure, and their node-hours at their time limits."""

    figure: str
    jobs: int
    node_hours: float


@dataclass(frozen=True)
class SharedJobs(Record):
    """Jobs that stand for several figures at once (a figure's count includes them, so the counts add up to more)."""

    figures: List[str]
    jobs: int


@dataclass(frozen=True)
class Cost(Record):
    """What the jobs cost before they are submitted: node-hours of their time limits (`node_hours`, the most the
    allocation is charged; None where they run on this machine) and of the expected run time of `expected_jobs` of
    them (`expected_node_hours`; `expected_from` says where from: earlier runs of the same request), per
    partition/QOS row (`queues`), per figure (`figures`) and the jobs the figures share (`shared`)."""

    jobs: int
    node_hours: Optional[float]
    expected_jobs: int
    expected_node_hours: float
    expected_from: str
    queues: List[QueueCost]
    figures: List[FigureCost] = field(default_factory=list)
    shared: List[SharedJobs] = field(default_factory=list)


@dataclass(frozen=True)
class Prepared(Record):
    """What `prepare`, `prepare_sweep` and `prepare_rerun` render, nothing written or submitted: the `jobs` (each with
    its script, warnings, notes and run directory), for `submit` to submit. `dry_run`: rendered as a dry run (what a
    submission refuses, a missing account or image, is a warning): it is shown, never submitted. `summary`: what the
    command line says below a dry run's scripts. A rerun's also: its `parent` and what differs from it, as
    [attribute, parent's, rerun's]. `cost`: what more than one job (or a job with a budget) costs. One read back from
    JSON shows the jobs; only the one `prepare*` returned submits."""

    jobs: List[Job]
    dry_run: bool = False
    summary: str = ""
    parent: Optional[str] = None
    differences: List[List[str]] = field(default_factory=list)
    cost: Optional[Cost] = None  # of more than one job, or with a budget


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
    `design` (protocol, stack, jobs and node-hours per figure, the jobs figures share, assumptions), each distinct
    warning once (with its number of jobs), the jobs (submitted, once they are) and what they cost."""

    study: str
    site: str
    summary: str
    design: str
    warnings: List[str]
    jobs: List[Job]
    cost: Optional[Cost] = None


@dataclass(frozen=True)
class StudyListing(Record):
    """A study `study list` shows: its `name`, `file`, the hardware it needs (`kind`: gpu or cpu, `gpu_vendor`), its
    `protocols` (the default first) with the jobs each runs (`jobs`: protocol -> jobs; '' for a study without
    protocols) and its `description`; `unreadable` says why a file could not be read (then nothing else is known)."""

    name: str
    file: str
    kind: str = ""
    gpu_vendor: Optional[str] = None
    protocols: List[str] = field(default_factory=list)
    jobs: Dict[str, int] = field(default_factory=dict)
    description: str = ""
    unreadable: Optional[str] = None


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
    # None unless it was stopped (status `interrupted` or `cancelled`: no failure): who stopped it, e.g. 'cancelled by
    # Ctrl-C on this machine (the trainer got SIGINT)'; or how its job ended after its trainer's `ok` end record.
    stopped_by: Optional[str] = None
    flags: List[str] = field(default_factory=list)  # 'straggler: ...', 'throttled: ...'
    network: List[str] = field(default_factory=list)  # how it is off its profile's [network]
    # None unless its scaling point among the runs listed is doubtful (as `report` judges it), e.g. 'quality of its
    # 2-rank point: noisy: ...'
    quality: Optional[str] = None
    figures: str = ""  # time and energy to accuracy, energy ('' when none is known)
    rejected: Optional[str] = None  # why its files cannot be read (then nothing else is known)
    # While it runs: per node how long ago it last finished a step ('dl-node2: last step 40 4 min ago'), from the
    # trainer's heartbeat files (dlaunch/runs/hangs.py)
    nodes: List[str] = field(default_factory=list)
    # The nodes its pre-flight (`--preflight`) left out and why, and those it trains on (dlaunch/runs/nodechecks.py)
    preflight: List[str] = field(default_factory=list)


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
class PointVerdict(Record):
    """The measurement-quality verdict on one count of a group (dlaunch/analysis/quality.py): the spread of its runs'
    images/s and of its reference's, E_G against what that noise allows, the problems and their likely causes."""

    gpus: int
    runs: int
    spread: Optional[float]  # (high - low) / median of its images/s (`spread_kind`'s range); None: one run
    spread_kind: str  # 'min-max', '95% CI', '-'
    reference_gpus: int
    reference_runs: int
    reference_spread: Optional[float]
    efficiency: float  # E_G, the median over its runs
    efficiency_allowed: float  # 1 + the noise of the point and its reference: more is implausible
    noise_threshold: float  # the spread above which it is noisy (--noise-threshold, else its group's default)
    verdict: str  # 'ok', or 'noisy', 'unstable reference', 'implausible' joined by ' and '
    problems: List[str]  # the figures that make each problem
    causes: List[str]  # what the records say is the likely cause
    set_apart: bool  # left out of the tables, plots and budget (doubtful, not --include-doubtful)


@dataclass(frozen=True)
class ReportGroup(Record):
    """Runs of one experiment, site, model, framework, loader, batch per GPU, step options and, for CPU runs, threads
    per rank."""

    label: str
    experiment: str
    site: str
    model: str
    framework: str
    loader: str
    batch_per_gpu: int
    step_options: str  # workload options away from their defaults, as flags ("-": none)
    runs: List[str]  # their metrics files
    points: List[ReportPoint]  # those the tables show (doubtful ones only with include_doubtful)
    budget: List[BudgetRow]
    threads: str = "-"  # CPU threads per rank of a CPU run's group ("-": GPU runs, or not recorded)
    engine: str = "-"  # the study's axes (the framework's row of dlaunch/train/framework_table.py)
    architecture: str = "-"  # allreduce, parameter-server
    updates: str = "-"  # sync, async
    quality: List[PointVerdict] = field(default_factory=list)  # every count's verdict, set apart or not
    unit: str = "GPUs"  # what its counts count: GPUs, or workers (no run used a GPU)


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
    device: Optional[str]  # cpu, cuda (None: a row read before schema 4)
    threads: Optional[int]  # CPU threads per rank (None: not recorded)
    measured_steps: Optional[int]  # the steps images_per_s was measured over
    step_compute_s: Optional[float]  # the median rank's compute per step (metrics version 4)
    engine: Optional[str]  # the study's axes: torch, tensorflow, mxnet
    architecture: Optional[str]  # allreduce, parameter-server
    updates: Optional[str]  # sync, async
    scheduler: Optional[str]  # the kind of scheduler that ran it (None: not recorded)
    speedup: Optional[float]
    efficiency: Optional[float]
    quality: Optional[str]  # the measurement-quality verdict of its scaling point (None: in no curve)
    quality_why: Optional[str]  # its figures and likely causes ("" when ok)
    history: Optional[str]
    rcp: Optional[str]


@dataclass(frozen=True)
class CompareRow(Record):
    """One matched `key` (model, framework, GPU count, ...) of a comparison: each side's median, range (`_spread`:
    its kind), runs and values; B's median against A's in per cent, the exact Mann-Whitney p and its verdict; what
    differs between the sides' runs of this match beyond the comparison's `changed` (`changed`: [A's, B's], a side
    whose runs differ among themselves with the list of their values)."""

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
    changed: Dict[str, List[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison(Record):
    """`results compare`: sides A and B (their selectors and runs) on `metric`, matched per `varying` key; what is
    the `same` in every row, what tells the sides apart (`changed`: matched attributes, facts such as `image` and
    `nodes`, trainer options as `--threads` (None: not given); library `pins`: each [A's, B's])."""

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
    input_wait_s: float = 0.0  # the GPU's wait for a loader slower than its step
    bound: str = ""  # what sets the step: compute, input, storage (the file system)
    run_s: float = 0.0  # a whole training of the Prediction's `epochs_run` epochs (their steps and overheads)
    node_hours: float = 0.0  # run_s x nodes / 3600


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
    calibration: str = ""  # dali, native (Aach et al.'s Table 2a columns), none (nominal), runs (from_runs)
    choice: str = ""  # which model the rows are, why, and how to get the others
    collective_library: str = "NCCL"  # NCCL, RCCL, Gloo: whose kernel share comm_share is
    input: str = ""  # the loader's rate per GPU and what it rests on
    epochs_run: int = 0  # the epochs of each row's run_s
    warning: str = ""  # from_runs of another site, GPU kind or model (allow_other_runs)
