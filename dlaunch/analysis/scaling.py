"""Metrics files -> runs -> scaling groups: throughput, speed-up S_G, parallel efficiency E_G.

Definitions (also printed in the report):

- Throughput X of a run ("images/s", `Run.throughput`): the mean over its measured epochs of
  images / (images / images_per_s + overhead.total_s x measured_steps / steps): each epoch's counted
  images over their steps' time plus their part of the epoch's overhead (loader start, validation,
  checkpoint, barriers, metrics: metrics schema version 4). Measured epochs: those with counted
  images, the first left out when there are two or more (it carries warm-up: cuDNN autotuning,
  loader start-up, allocator growth). Files without `overhead` (versions 1-3) give the steps-only
  rate, images_per_s alone (`Run.overhead_included` says which). The epoch record's own
  `images_per_s` is its steps-only rate (`EpochPoint.steps_images_per_s`).
- Per-rank phases, nodes, GPU health and epoch overhead of a run (version 4): the mean over the
  same measured epochs (`Run.phases`, `Run.node_figures`, `Run.overhead`; the records: dlaunch/analysis/phases.py).
  Groups and scaling points take the runs as the caller judged them: flagged runs (a straggler or a throttled GPU,
  whose E_G is understated) are left out by the caller (dlaunch/analysis/stragglers.py: `unflagged`) unless it
  includes them.
- Runs are grouped by experiment, site, model, framework, loader, batch per GPU and step options: runs with
  different batch sizes per GPU do different work per step, so each batch size is its own curve; the step
  options (`Run.key.step_options`: the trainer's --compile, --cuda-graphs, --optimizer-impl and --host-syncs
  where the header's `config` records them away from their defaults, as `dlaunch.train.config.workload_flags`
  writes them; "-" for none, as for a header older than the options) change how fast a step runs, so each
  set of them is its own curve too (`dlaunch predict --from-runs` refuses runs that mix them). So is each count of
  CPU threads per rank of runs whose ranks compute on CPUs (`Run.key.threads`, `threads_key`: the header's
  `threads`, else the config's --threads): their threads are their compute, and the trainer's default divides a
  node's CPUs by its ranks (1 process here: 2 threads; 2 processes: 1 each), so runs that differ are not one curve.
  A GPU run's CPU threads compute no part of its step: not part of its key.
- The measurement-quality verdict of each point (spread, its reference's, E_G against noise): dlaunch/analysis/
  quality.py.
- Compile time (`Run.compile_s`, --compile): the epoch records' `compile_s`, the wall time of each session's
  first step, a warm-up step: reported apart, never part of X.
- Within a group the reference is the smallest GPU count G_ref (the paper's one node, 4 GPUs):
  speed-up S_G = X_G / X_ref and E_G = S_G / (G / G_ref). For a fixed amount of work
  T = work / X, so E_G = (T_ref / T_G) / (G / G_ref), the textbook definition.
- Time shares (from `profile` records, un-overlapped timers): comm_s, compute_s and data_s
  each divided by their sum.
- Kernel shares (from `kernel_profile` records, `--kernel-profile-steps`; Table 2's measure): CUDA
  kernel time in NCCL (comm), cuDNN/cuBLAS (compute) and I/O kernels, each divided by all kernel time
  of all ranks (the rest is other kernels, so they do not sum to 1). Runs that only profile count here
  without a throughput.
- Energy (metrics schema version 2; `metrics_schema.energy_total`: the node counter where measured,
  else GPU + CPU + DRAM as far as measured): joules per image J/img = the energy of the same epochs
  that give X divided by the images trained in them (steps x global batch; an epoch's energy
  includes its validation); energy per epoch = their mean. Energy-to-accuracy (Zeus's definition)
  and time-to-accuracy: the run's energy and time at the first validation that reached
  `--target-accuracy`, from the `end` record; epochs to target: the epochs trained by then. Runs
  without energy figures (version 1 files, or no source) have none; they are never counted as zero.
- Diverged runs (end status `diverged`) enter no throughput, speed-up, E_G or energy figure.
- Repeats (several runs at one GPU count: `dlaunch run --repeat N`, a study's `repeats`): per GPU count
  the median of the runs' values and their spread (`Spread`): the distribution-free 95% confidence
  interval of the median (order statistics, binomial coverage >= 95%, computed in floating point) from
  6 runs on, the min-max range below that (fewer than 6 runs cannot give 95%). A run's speed-up is
  its X over the median X at G_ref, its E_G that over G / G_ref; so S_G and E_G of a point are
  medians too. Time shares are the runs' mean (means of shares still sum to 1).

Metrics files are read only through `dlaunch.train.metrics_schema` (torch-free).
"""

import math
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from statistics import fmean, median
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from rich import box
from rich.table import Table

from dlaunch.analysis.phases import (
    EpochPhases,
    NodeFigures,
    Overhead,
    epoch_nodes,
    epoch_overhead,
    epoch_phases,
    mean_nodes,
    mean_phases,
)
from dlaunch.boundary import escape
from dlaunch.errors import DlaunchError
from dlaunch.train.config import workload_flags
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.train.metrics_schema import METRICS_FILE, Metrics, MetricsError, energy_total, read_metrics

if TYPE_CHECKING:  # the site models (pydantic) stay out of `dlaunch status`'s start-up
    from dlaunch.jobs.sites import Reference


@dataclass(frozen=True)
class Shares:
    """Fractions of comm + compute + data time per step (they sum to 1)."""

    comm: float
    compute: float
    data: float

    @classmethod
    def from_profile(cls, comm_s: float, compute_s: float, data_s: float) -> Optional["Shares"]:
        total = comm_s + compute_s + data_s
        if total <= 0:
            return None
        return cls(comm_s / total, compute_s / total, data_s / total)


@dataclass(frozen=True)
class KernelShares:
    """Fractions of all CUDA kernel time in NCCL, cuDNN/cuBLAS and I/O kernels (the rest: other kernels)."""

    comm: float
    compute: float
    io: float

    @classmethod
    def from_record(cls, record: Dict) -> Optional["KernelShares"]:
        """None when the record's figures are unavailable (a CPU run) or no kernel ran."""
        values = [record[k] for k in ("kernel_s", "comm_s", "compute_s", "io_s")]
        if not all(isinstance(v, (int, float)) for v in values) or values[0] <= 0:
            return None
        total, comm, compute, io = values
        return cls(comm / total, compute / total, io / total)


@dataclass(frozen=True)
class EpochPoint:
    epoch: int
    steps_images_per_s: float  # the epoch record's images_per_s: its counted steps only
    images: int  # images counted for throughput; 0 when every step was warm-up or profiled
    top1: Optional[float]
    trained_images: int = 0  # every image trained in the epoch (steps x global batch)
    energy_j: Optional[float] = None  # energy_total of the epoch (None: not measured)
    epoch_time_s: float = 0.0
    steps: int = 0  # optimizer steps of the epoch
    measured_steps: int = 0  # the steps whose images are counted (images / global batch)
    overhead: Optional[Overhead] = None  # version 4
    phases: Optional[EpochPhases] = None  # version 4: median and slowest rank per step
    nodes: Optional[Tuple[NodeFigures, ...]] = None  # version 4: per node, with GPU health
    compile_s: Optional[float] = None  # --compile: the wall time of a session's first step (a warm-up step)

    @property
    def throughput(self) -> float:
        """This epoch's part of X: its counted images over their steps' time plus their share of the
        epoch's overhead (the steps-only rate without `overhead`)."""
        if self.overhead is None or self.images == 0 or self.steps_images_per_s <= 0 or self.steps <= 0:
            return self.steps_images_per_s
        return self.images / (
            self.images / self.steps_images_per_s + self.overhead.total_s * self.measured_steps / self.steps
        )


def epochs_to(epochs: Sequence[EpochPoint], target: Optional[float]) -> Optional[int]:
    """Epochs trained (epoch index + 1) at the first validation whose top-1 is at least `target`."""
    if target is None:
        return None
    return next((e.epoch + 1 for e in epochs if e.top1 is not None and e.top1 >= target), None)


@dataclass(frozen=True)
class Profile:
    """Mean seconds per step from a run's last `profile` record."""

    step_s: float
    compute_s: float
    comm_s: float
    data_s: float


class GroupKey(NamedTuple):
    experiment: str
    site: str
    model: str
    framework: str
    loader: str
    batch_per_worker: int
    step_options: str  # the trainer's workload options away from their defaults, as flags; "-": none
    threads: str = "-"  # CPU threads per rank of a CPU run (`threads_key`); "-": a GPU run, or not recorded

    @property
    def label(self) -> str:
        """experiment/site/model/framework/loader bN, tN for a CPU run's threads per rank, then the step options where
        the run changed some."""
        label = "%s/%s/%s/%s/%s b%d" % self[:6]
        label += "" if self.threads == "-" else " t%s" % self.threads
        return label if self.step_options == "-" else "%s %s" % (label, self.step_options)


def threads_key(device: str, threads: Optional[int]) -> str:
    """A run's threads per rank as part of its scaling group's key (GroupKey.threads, the results database's curves):
    the count for a run whose ranks compute on CPUs, where its threads are its compute; "-" for a GPU run (its CPU
    threads compute no part of the step: the loader's workers are processes of their own) and for a CPU run that
    recorded none (files before the header's `threads`, run without --threads)."""
    return str(threads) if device == "cpu" and threads else "-"


@dataclass(frozen=True)
class Run:
    """One run directory's metrics, reduced to what the analysis needs."""

    path: str
    key: GroupKey
    world_size: int
    nodes: int
    global_batch: int
    schedule: str
    status: str
    epochs: Tuple[EpochPoint, ...]
    profile: Optional[Profile]
    end_best_top1: Optional[float]
    energy_domains: Optional[str] = None  # what the energy figures count, e.g. "gpu+cpu" or "node"
    end_energy_j: Optional[float] = None  # the whole run's energy from the end record
    time_to_accuracy_s: Optional[float] = None
    energy_to_accuracy_j: Optional[float] = None
    reason: Optional[str] = None  # the end record's reason (failed or diverged runs)
    amp: str = "none"  # the trainer's --amp (none: FP32/TF32)
    kernel_shares: Optional[KernelShares] = None  # the last kernel_profile record's
    target_accuracy: Optional[float] = None  # the trainer's --target-accuracy
    data: str = "synthetic"  # the trainer's --data
    num_classes: Optional[int] = None
    network: Optional[List[Dict[str, Any]]] = field(default=None, hash=False)  # what its collective libraries selected
    device: str = "cuda"  # the header's: cpu, cuda (ROCm too)
    threads: Optional[int] = None  # CPU threads per rank (`recorded_threads`; None: not recorded)
    hosts: Tuple[str, ...] = ()  # every rank's host, index = rank
    version: int = 4  # the metrics schema version of its header
    scheduler: Optional[str] = None  # the kind of scheduler that ran it (the header's; None: not recorded)

    @property
    def on_gpus(self) -> bool:
        """Whether its ranks computed on GPUs (else on CPUs: its world size counts worker processes)."""
        return self.device != "cpu"

    @cached_property
    def ranks_per_node(self) -> Optional[int]:
        """The most ranks one host held (None: hosts not recorded)."""
        return max(self.hosts.count(host) for host in self.hosts) if self.hosts else None

    @cached_property
    def measured_steps(self) -> int:
        """The steps whose images give X: the measured epochs' measured steps."""
        return sum(e.measured_steps for e in self.measured_epochs)

    @cached_property
    def measured_epochs(self) -> Tuple[EpochPoint, ...]:
        """The epochs with counted images, the first of them left out when there are >= 2."""
        counted = tuple(e for e in self.epochs if e.images > 0)
        return counted[1:] if len(counted) >= 2 else counted

    @cached_property
    def throughput(self) -> Optional[float]:
        """X ("images/s"): the mean of the measured epochs' `EpochPoint.throughput`, epoch overhead included
        where recorded (`overhead_included`)."""
        measured = self.measured_epochs
        return fmean(e.throughput for e in measured) if measured else None

    @cached_property
    def steps_images_per_s(self) -> Optional[float]:
        """The mean of the measured epochs' steps-only images/s (no epoch overhead)."""
        measured = self.measured_epochs
        return fmean(e.steps_images_per_s for e in measured) if measured else None

    @cached_property
    def overhead_included(self) -> bool:
        """Whether X includes epoch overhead: every measured epoch recorded it (version 4)."""
        measured = self.measured_epochs
        return bool(measured) and all(e.overhead is not None for e in measured)

    @cached_property
    def overhead(self) -> Optional[Overhead]:
        """Seconds per epoch outside the steps, per part: the mean over the measured epochs that recorded it."""
        recorded = [e.overhead for e in self.measured_epochs if e.overhead is not None]
        return Overhead.mean_of(recorded) if recorded else None

    @cached_property
    def epoch_overhead_s(self) -> Optional[float]:
        """The run's epoch overhead: mean overhead.total_s over the measured epochs (seconds per epoch)."""
        overhead = self.overhead
        return overhead.total_s if overhead else None

    @cached_property
    def overhead_per_step_s(self) -> Optional[float]:
        """Epoch overhead per step: the mean over the measured epochs of overhead.total_s / steps."""
        recorded = [
            e.overhead.total_s / e.steps for e in self.measured_epochs if e.overhead is not None and e.steps > 0
        ]
        return fmean(recorded) if recorded else None

    @cached_property
    def phases(self) -> Optional[EpochPhases]:
        """Median and slowest rank's seconds per step, the mean over the measured epochs that recorded them."""
        return mean_phases([e.phases for e in self.measured_epochs if e.phases is not None])

    @cached_property
    def node_figures(self) -> Optional[Tuple[NodeFigures, ...]]:
        """Per node: median and slowest rank's compute_s and GPU health, the mean over the measured epochs."""
        return mean_nodes([e.nodes for e in self.measured_epochs if e.nodes is not None])

    @cached_property
    def compile_s(self) -> Optional[float]:
        """Seconds spent compiling (--compile): the epoch records' compile_s summed (a resumed run compiles again in
        each session); never part of X, whose epochs leave the warm-up steps out. None: not compiled."""
        recorded = [e.compile_s for e in self.epochs if e.compile_s is not None]
        return sum(recorded) if recorded else None

    @cached_property
    def epoch_time_s(self) -> Optional[float]:
        """Mean training time of the measured epochs (the epochs that give X)."""
        measured = self.measured_epochs
        return fmean(e.epoch_time_s for e in measured) if measured else None

    @cached_property
    def epochs_to_target(self) -> Optional[int]:
        """Epochs trained up to the first validation at or above --target-accuracy (None: not reached)."""
        return epochs_to(self.epochs, self.target_accuracy)

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"

    def _measured_with_energy(self) -> List[EpochPoint]:
        return [e for e in self.measured_epochs if e.energy_j is not None and e.trained_images > 0]

    @cached_property
    def joules_per_image(self) -> Optional[float]:
        """Energy of the measured epochs per image trained in them."""
        epochs = self._measured_with_energy()
        if not epochs:
            return None
        return sum(e.energy_j for e in epochs) / sum(e.trained_images for e in epochs)  # type: ignore[misc]

    @cached_property
    def energy_per_epoch(self) -> Optional[float]:
        epochs = self._measured_with_energy()
        return fmean(e.energy_j for e in epochs) if epochs else None  # type: ignore[type-var]

    @cached_property
    def energy_j(self) -> Optional[float]:
        """The run's energy: the end record's, else the sum over the epochs so far."""
        if self.end_energy_j is not None:
            return self.end_energy_j
        measured = [e.energy_j for e in self.epochs if e.energy_j is not None]
        return sum(measured) if measured else None

    @cached_property
    def best_top1(self) -> Optional[float]:
        accuracies = [e.top1 for e in self.epochs if e.top1 is not None]
        return max(accuracies) if accuracies else self.end_best_top1

    @cached_property
    def shares(self) -> Optional[Shares]:
        p = self.profile
        return Shares.from_profile(p.comm_s, p.compute_s, p.data_s) if p else None

    @cached_property
    def step_shares(self) -> Optional[Shares]:
        """The median rank's step split from the per-rank phases every run of the PyTorch trainer records (version 4):
        sync_s (exposed communication and waiting for peers), compute_s and data_s, each over their sum; None where
        not recorded (the TensorFlow and MXNet trainers, files before version 4)."""
        p = self.phases
        return Shares.from_profile(p.median.sync_s, p.median.compute_s, p.median.data_s) if p else None

    @property
    def axes(self) -> "Axes":
        return axes_of(self.key.framework)


class Axes(NamedTuple):
    """What a study compares about a run's framework (dlaunch/train/framework_table.py's row): its engine, its
    architecture ('allreduce', 'parameter-server') and its updates ('sync', 'async'); '-' for a framework the table
    lacks."""

    engine: str
    architecture: str
    updates: str


def axes_of(framework: str) -> Axes:
    info = FRAMEWORKS.get(framework)
    if info is None:
        return Axes("-", "-", "-")
    return Axes(info.engine, info.architecture, "sync" if info.synchronous else "async")


def count_unit(runs: Iterable[Run]) -> str:
    """What the runs' world sizes count, as the report's headers and plots name it: "GPUs", "workers" (no run
    computed on a GPU: worker processes; a parameter-server engine's servers and coordinators are not counted), or
    "GPUs or workers" for a mix."""
    kinds = frozenset(r.on_gpus for r in runs)
    return {frozenset([False]): "workers", frozenset([True, False]): "GPUs or workers"}.get(kinds, "GPUs")


def count_name(unit: str) -> str:
    """'GPU count', 'worker count' or 'GPU or worker count' of a `count_unit`."""
    return "%s count" % " or ".join(word[:-1] for word in unit.split(" or "))


CONFIDENCE = 0.95


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity: the median and its spread (`low`-`high`, `kind`)."""

    median: float
    low: float
    high: float
    n: int
    kind: str  # "min-max", or "95% CI": the distribution-free confidence interval of the median

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        """The order-statistic interval [x_(k), x_(n+1-k)] with the largest k whose coverage
        1 - 2 P(Binomial(n, 1/2) <= k - 1) is at least 95% (n >= 6); the min-max range below that.
        Written out (5 lines) rather than taken from scipy, which the launcher does not depend on."""
        ordered = sorted(values)
        n = len(ordered)
        k = interval_rank(n)
        if k == 0:
            return cls(median(ordered), ordered[0], ordered[-1], n, "min-max")
        return cls(median(ordered), ordered[k - 1], ordered[n - k], n, "%d%% CI" % round(100 * CONFIDENCE))


@cache
def interval_rank(n: int) -> int:
    """The largest k with 1 - 2 P(Binomial(n, 1/2) <= k - 1) >= CONFIDENCE (0: none). The binomial terms are
    summed in floating point, each from log-gamma (the leading ones underflow to 0, far below the 2.5 % tail
    that decides), in O(k) instead of exact big-integer sums; the same k as the exact computation
    (tests/test_analysis.py compares them for n = 6..2000)."""
    if n < 1:
        return 0
    log_total = n * math.log(2.0)
    tail, k = 0.0, 0
    while True:
        tail += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - log_total)
        if 1 - 2 * tail < CONFIDENCE:
            return k
        k += 1


@dataclass(frozen=True)
class ScalingPoint:
    """One GPU count of a group: medians and spreads over its runs (repeats)."""

    gpus: int
    nodes: int
    runs: int
    throughput: Spread  # images/s
    speedups: Spread
    efficiencies: Spread
    shares: Optional[Shares]  # the runs' mean
    energy: Optional[Spread] = None  # J/img of the runs that measured energy
    step_shares: Optional[Shares] = None  # the runs' mean Run.step_shares (per-rank phases)
    epochs_to_target: Optional[Spread] = None  # of the runs that reached --target-accuracy
    time_to_target: Optional[Spread] = None  # seconds, of the runs that reached it

    @property
    def images_per_s(self) -> float:
        return self.throughput.median

    @property
    def speedup(self) -> float:
        return self.speedups.median

    @property
    def efficiency(self) -> float:
        return self.efficiencies.median

    @property
    def joules_per_image(self) -> Optional[float]:
        return self.energy.median if self.energy else None


@dataclass(frozen=True)
class Loaded:
    runs: List[Run]
    rejected: List[str]  # one message per rejected file, naming it


def find_metrics_files(paths: Iterable[str]) -> List[str]:
    """Metrics files named by `paths`: files as given, directories searched recursively (sorted)."""
    found = []
    for path in paths:
        p = Path(path)
        if p.is_file():
            found.append(str(p))
        elif p.is_dir():
            found.extend(
                sorted(str(f) for f in p.rglob(METRICS_FILE) if f.is_file() and not f.is_symlink())
            )  # no link out of the folder
        else:
            raise DlaunchError("%s: no such file or directory" % escape(str(path)))
    return sorted(set(found))


def _text(value: Optional[str]) -> str:
    """A header's text for tables and plots: "-" when unset, control characters escaped."""
    return escape(value) if value else "-"


def _total(energy: Optional[dict]) -> Tuple[Optional[float], Optional[str]]:
    total = energy_total(energy)
    return (total[0], total[1]) if total else (None, None)


def run_from_metrics(metrics: Metrics) -> Run:
    """Reduce a parsed metrics file (schema versions 1-4) to a Run."""
    h = metrics.header
    threads = recorded_threads(h)
    key = GroupKey(
        _text(h["experiment"]),
        _text(h["site"]),
        _text(h["model"]),
        _text(h["framework"]),
        _text(h["loader"]),
        h["batch_per_worker"],
        _text(workload_flags(h["config"])),
        threads_key(h["device"], threads),
    )
    epochs, domains = [], None
    for e in metrics.epochs:
        joules, counted = _total(e.get("energy_j"))
        domains = counted or domains
        epochs.append(
            EpochPoint(
                e["epoch"],
                float(e["images_per_s"]),
                e["images"],
                e.get("top1"),
                trained_images=e["steps"] * h["global_batch"],
                energy_j=joules,
                epoch_time_s=float(e["epoch_time_s"]),
                steps=e["steps"],
                measured_steps=e.get("measured_steps", e["images"] // h["global_batch"]),
                overhead=epoch_overhead(e),
                phases=epoch_phases(e),
                nodes=epoch_nodes(e),
                compile_s=None if e.get("compile_s") is None else float(e["compile_s"]),
            )
        )
    end = metrics.end or {}
    end_energy, end_domains = _total(end.get("energy_j"))
    profile = None
    if metrics.profiles:
        last = metrics.profiles[-1]
        profile = Profile(last["step_s"], last["compute_s"], last["comm_s"], last["data_s"])
    return Run(
        path=escape(metrics.path),
        key=key,
        world_size=h["world_size"],
        nodes=h["nodes"],
        global_batch=h["global_batch"],
        schedule=_text(h["config"].get("schedule")),
        status=metrics.status,
        epochs=tuple(epochs),
        profile=profile,
        end_best_top1=end.get("best_top1"),
        energy_domains=end_domains or domains,
        end_energy_j=end_energy,
        time_to_accuracy_s=end.get("time_to_accuracy_s"),
        energy_to_accuracy_j=end.get("energy_to_accuracy_j"),
        reason=escape(end["reason"]) if end.get("reason") else None,
        amp=escape(h["config"].get("amp") or "none"),
        kernel_shares=KernelShares.from_record(metrics.kernel_profiles[-1]) if metrics.kernel_profiles else None,
        target_accuracy=end.get("target_accuracy", h["config"].get("target_accuracy")),
        data=str(h["config"].get("data") or "synthetic"),
        num_classes=h["config"].get("num_classes"),
        network=metrics.network,
        device=escape(h["device"]),
        threads=threads,
        hosts=tuple(escape(str(host)) for host in h["hosts"]),
        version=h["version"],
        scheduler=h.get("scheduler"),
    )


def recorded_threads(header: Dict[str, Any]) -> Optional[int]:
    """A run's CPU threads per rank: the header's `threads`, else its config's --threads (files before the header
    recorded them); None: not recorded (the trainer's default, which depends on the ranks per node)."""
    for threads in (header.get("threads"), header["config"].get("threads")):
        if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0:
            return threads
    return None


def load_runs(paths: Iterable[str]) -> Loaded:
    """Read every metrics file under `paths`; broken or foreign files are rejected, not skipped silently."""
    runs, rejected = [], []
    for path in find_metrics_files(paths):
        try:
            runs.append(run_from_metrics(read_metrics(path)))
        except MetricsError as e:
            rejected.append(str(e))
    runs.sort(key=lambda r: (r.key, r.world_size, r.path))
    return Loaded(runs, rejected)


def group_runs(runs: Iterable[Run]) -> Dict[GroupKey, List[Run]]:
    """Runs by group key, groups and runs in sorted order (the runs as the caller judged them: stragglers.unflagged)."""
    groups: Dict[GroupKey, List[Run]] = {}
    for run in sorted(runs, key=lambda r: (r.key, r.world_size, r.path)):
        groups.setdefault(run.key, []).append(run)
    return groups


def _mean_shares(shares: Sequence[Shares]) -> Optional[Shares]:
    if not shares:
        return None
    return Shares(fmean(s.comm for s in shares), fmean(s.compute for s in shares), fmean(s.data for s in shares))


def scaling(runs: Sequence[Run]) -> List[ScalingPoint]:
    """Throughput, S_G, E_G and J/img per GPU count of one group (median and spread over the runs, as the caller
    judged them: stragglers.unflagged); diverged runs and runs without epochs are left out."""
    metrics = ("images_per_s", "speedup", "efficiency", "joules_per_image", "epochs_to_target", "time_to_target_s")
    values = {metric: run_values(runs, metric) for metric in metrics}

    def spread(metric: str, gpus: int) -> Optional[Spread]:
        found = values[metric].get(gpus)
        return Spread.of(found) if found else None

    points = []
    for gpus, throughputs in values["images_per_s"].items():
        group = [r for r in measured_runs(runs) if r.world_size == gpus]
        points.append(
            ScalingPoint(
                gpus=gpus,
                nodes=max(r.nodes for r in group),
                runs=len(group),
                throughput=Spread.of(throughputs),
                speedups=Spread.of(values["speedup"][gpus]),
                efficiencies=Spread.of(values["efficiency"][gpus]),
                shares=_mean_shares([r.shares for r in group if r.shares is not None]),
                step_shares=_mean_shares([r.step_shares for r in group if r.step_shares is not None]),
                energy=spread("joules_per_image", gpus),
                epochs_to_target=spread("epochs_to_target", gpus),
                time_to_target=spread("time_to_target_s", gpus),
            )
        )
    return points


@dataclass(frozen=True)
class StatusFigures:
    """What `dlaunch status` shows of one run's metrics beside its state (None: not known yet)."""

    time_to_accuracy_s: Optional[float]
    energy_to_accuracy_j: Optional[float]
    joules_per_image: Optional[float]
    energy_j: Optional[float]
    energy_domains: Optional[str]  # what the trainer's energy counts ("gpu+cpu", "node")
    diverged: bool


def status_figures(metrics: Metrics) -> StatusFigures:
    """The derived figures of one run for `dlaunch status` (torch-free; version 1 files give Nones)."""
    run = run_from_metrics(metrics)
    return StatusFigures(
        run.time_to_accuracy_s,
        run.energy_to_accuracy_j,
        run.joules_per_image,
        run.energy_j,
        run.energy_domains,
        run.diverged,
    )


@dataclass(frozen=True)
class Verdict:
    reference: "Reference"
    measured: float

    @property
    def passed(self) -> bool:
        """Pass when no slower than the reference by more than its tolerance (faster always passes)."""
        return self.measured >= self.reference.images_per_s * (1.0 - self.reference.tolerance)

    @property
    def deviation(self) -> float:
        return self.measured / self.reference.images_per_s - 1.0


def reference_for(run: Run, references: Sequence["Reference"]) -> Optional["Reference"]:
    """The site's reference for the run's model, GPU count and precision."""
    return matching_reference(run.key.model, run.world_size, run.amp, references)


def matching_reference(model: str, gpus: int, amp: str, references: Sequence["Reference"]) -> Optional["Reference"]:
    """The reference for a model, GPU count and precision (one without `amp` is of full precision, --amp none)."""
    for ref in references:
        if ref.model == model and ref.gpus == gpus and getattr(ref, "amp", "none") == amp:
            return ref
    return None


def verdict(run: Run, references: Sequence["Reference"]) -> Optional[Verdict]:
    """The run's verdict against the reference for its model, GPU count and precision, if there is one."""
    ref = reference_for(run, references)
    if run.throughput is None or ref is None:
        return None
    return Verdict(ref, run.throughput)


def rich_table(title: Optional[str], headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A console table whose cells keep their full width on narrow terminals (headers wrap at spaces)."""
    table = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1), pad_edge=False, collapse_padding=True
    )
    for i, header in enumerate(headers):
        widest = max([len(word) for word in header.split()] + [len(row[i]) for row in rows])
        table.add_column(header, min_width=widest)
    for row in rows:
        table.add_row(*row)
    return table


def measured_runs(runs: Sequence[Run]) -> List[Run]:
    """The runs that give a throughput and did not diverge: those that enter scaling figures."""
    return [r for r in runs if r.throughput is not None and not r.diverged]


def reference_point(points: Sequence[Tuple[int, float]]) -> Tuple[int, float]:
    """(G_ref, X_ref) of a group's (GPUs, X) points: the smallest GPU count and the median X there."""
    g_ref = min(g for g, _ in points)
    return g_ref, median(x for g, x in points if g == g_ref)


def run_values(runs: Sequence[Run], metric: str) -> Dict[int, List[float]]:
    """Per GPU count, each run's value of `metric` (images_per_s, speedup, efficiency, comm_share,
    kernel_comm_share, kernel_compute_share, kernel_io_share, joules_per_image, epochs_to_target,
    time_to_target_s) in one group; runs without it (no epochs, no profile, no energy, target not
    reached, diverged) are left out."""
    if metric.startswith("kernel_"):  # runs that only profile have no throughput
        part = metric[len("kernel_") : -len("_share")]
        shares: Dict[int, List[float]] = {}
        for r in runs:
            if r.kernel_shares is not None and not r.diverged:
                shares.setdefault(r.world_size, []).append(getattr(r.kernel_shares, part))
        return dict(sorted(shares.items()))
    measured = measured_runs(runs)
    if not measured:
        return {}
    g_ref, x_ref = reference_point([(r.world_size, r.throughput) for r in measured])  # type: ignore[misc]
    values: Dict[int, List[float]] = {}
    for r in measured:
        if metric == "comm_share":
            value = r.shares.comm if r.shares else None
        elif metric in ("images_per_s", "joules_per_image", "epochs_to_target", "time_to_target_s"):
            value = {
                "images_per_s": r.throughput,
                "joules_per_image": r.joules_per_image,
                "epochs_to_target": r.epochs_to_target,
                "time_to_target_s": r.time_to_accuracy_s,
            }[metric]
        else:
            value = r.throughput / x_ref  # type: ignore[operator]
            value = value / (r.world_size / g_ref) if metric == "efficiency" else value
        if value is not None:
            values.setdefault(r.world_size, []).append(value)
    return dict(sorted(values.items()))
