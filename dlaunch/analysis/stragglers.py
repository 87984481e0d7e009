"""Stragglers and throttled GPUs from the per-rank phases of metrics schema version 4 (dlaunch/train/metrics_schema.py,
dlaunch/train/phases.py: the writer side).

- The straggler measure (`forward_excess`, one definition for the flag and predict's column): how much
  longer a rank's forward pass (forward_s, the part of compute_s that overlaps no communication) took than the median
  rank's, as a fraction. The median rank is a real rank, all its phases (the median_low of the forward passes: method
  "rank-timers-median-rank", the writer's PHASES_METHOD): with 2 ranks the faster one, so "53 % slower" means the
  two ranks differ 1.53x. Records of method `MEDIAN_OF_RANKS_METHOD` (written before) hold statistics.median, for an
  even rank count the mean of the two middle ranks (with 2 ranks "21 % slower" there meant 1.53x apart): they are
  read as recorded and their flags say "than the median of the ranks".
- Straggler: a node whose slowest rank's forward excess is over the threshold (`DEFAULT_THRESHOLD`,
  dlaunch/thresholds.py; a site profile's `straggler_threshold`). A finished run is judged on its measured epochs
  (those that give images/s: `Run.measured_epochs`), each node by the mean over them of its slowest rank's forward_s
  against the mean of the median rank's; a live run on its last epoch.
- Throttled GPU: a node whose GPU health shows an SM clock below (1 - threshold) x its maximum together with a
  throttle reason, or any of `HARD_THROTTLES`.

One flag per node at most of each kind, naming host, rank and local rank; a run is flagged (`is_flagged`: left out of
scaling figures and the budget unless included) when it has any. Pure functions: a Run (or a parsed metrics file) and
a threshold in, `Flag`s out. Epoch records are parsed here (`epoch_phases`, `epoch_nodes`) and averaged over epochs
(`mean_phases`, `mean_nodes`); dlaunch/analysis/scaling.py keeps them per epoch and per run. A version 1-3 file has
none of these records: no flags, never "no straggler".
"""

from collections import Counter
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

from dlaunch.boundary import escape
from dlaunch.thresholds import DEFAULT_THRESHOLD
from dlaunch.train.metrics_schema import MEDIAN_OF_RANKS_METHOD, STEP_PHASES, is_number

# Reasons that slow a GPU whatever its clock shows (NVML clock event reasons, as the trainer names them).
HARD_THROTTLES = ("thermal", "hardware slowdown", "power brake")
STRAGGLER, THROTTLED = "straggler", "throttled"
# An epoch record's phases.method says what its "median" is (metrics_schema.PHASES_METHOD): the median rank, or in
# records of MEDIAN_OF_RANKS_METHOD the median of the ranks (statistics.median; the reference named in flags).
MEDIAN_RANK, MEDIAN_OF_RANKS = "the median rank", "the median of the ranks"


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per step of one rank (or the median rank's), metrics-v4's definitions."""

    data_s: float
    forward_s: float  # part of compute_s
    compute_s: float
    sync_s: float
    optimizer_s: float
    other_s: float
    step_s: float

    @classmethod
    def of(cls, record: Dict[str, Any]) -> "PhaseTimes":
        return cls(*(float(record[name]) for name in STEP_PHASES))

    @classmethod
    def mean_of(cls, items: Sequence["PhaseTimes"]) -> "PhaseTimes":
        return cls(*(fmean(getattr(p, name) for p in items) for name in STEP_PHASES))


@dataclass(frozen=True)
class RankId:
    host: str
    rank: int
    local_rank: Optional[int]


@dataclass(frozen=True)
class EpochPhases:
    """An epoch's `phases`: the median rank (`median_of` names what the record's median is) and the rank with the
    longest forward pass."""

    median: PhaseTimes
    slowest: PhaseTimes
    slowest_rank: RankId
    median_of: str  # MEDIAN_RANK or MEDIAN_OF_RANKS (records of MEDIAN_OF_RANKS_METHOD)

    @property
    def wait_s(self) -> float:
        """Seconds per step the median rank waits for the slowest, measured: its sync_s over the slowest rank's (in
        the gradients' collective a rank waits for those that arrive later; the slowest waits for none), 0 when the
        slowest waited longer. Time, where `forward_excess` is the flag's measure of who is slow. (Records of
        MEDIAN_OF_RANKS_METHOD: with 2 ranks their median sync_s is the mean of the two, so half the wait.)"""
        return max(0.0, self.median.sync_s - self.slowest.sync_s)


def forward_excess(phases: EpochPhases, forward_s: Optional[float] = None) -> Optional[float]:
    """The straggler measure: how much longer `forward_s` (default: the slowest rank's forward pass) took than the
    median rank's, a fraction (0.53: 53 % longer); None when the median rank's is not positive."""
    if phases.median.forward_s <= 0:
        return None
    return (phases.slowest.forward_s if forward_s is None else forward_s) / phases.median.forward_s - 1.0


@dataclass(frozen=True)
class GpuHealth:
    """A node's GPU health (None: a figure not recorded); `unavailable`: why none was recorded."""

    sm_clock_mhz: Optional[float] = None
    sm_clock_max_mhz: Optional[float] = None
    local_rank: Optional[int] = None
    throttle: Tuple[str, ...] = ()
    temperature_c: Optional[float] = None
    unavailable: Optional[str] = None

    @classmethod
    def of(cls, value: Any) -> "GpuHealth":
        if not isinstance(value, dict):
            return cls(unavailable=escape(str(value)))

        def figure(name: str) -> Optional[float]:
            return float(value[name]) if is_number(value.get(name)) else None

        return cls(
            figure("sm_clock_mhz"),
            figure("sm_clock_max_mhz"),
            value.get("local_rank"),
            tuple(escape(str(r)) for r in value.get("throttle") or ()),
            figure("temperature_c"),
        )


@dataclass(frozen=True)
class NodeFigures:
    """One node's entry of an epoch record's `nodes` (or the mean over epochs)."""

    host: str
    ranks: int
    median_forward_s: float
    median_compute_s: float
    slowest: RankId
    slowest_forward_s: float
    slowest_compute_s: float
    gpu: GpuHealth


@dataclass(frozen=True)
class Flag:
    kind: str  # STRAGGLER or THROTTLED
    host: str
    rank: Optional[int]  # stragglers: the slow rank; throttled GPUs: the GPU's rank where the record holds it
    local_rank: Optional[int]
    message: str


def epoch_phases(record: Dict[str, Any]) -> Optional[EpochPhases]:
    """The `phases` of a (validated) epoch record; None when not recorded (versions 1-3)."""
    phases = record.get("phases")
    if not isinstance(phases, dict):
        return None
    slowest = phases["slowest"]
    return EpochPhases(
        PhaseTimes.of(phases["median"]),
        PhaseTimes.of(slowest),
        RankId(escape(slowest["host"]), slowest["rank"], slowest["local_rank"]),
        MEDIAN_OF_RANKS if phases["method"] == MEDIAN_OF_RANKS_METHOD else MEDIAN_RANK,
    )


def epoch_nodes(record: Dict[str, Any]) -> Optional[Tuple[NodeFigures, ...]]:
    """The `nodes` of a (validated) epoch record; None when not recorded."""
    nodes = record.get("nodes")
    if not isinstance(nodes, list):
        return None
    return tuple(
        NodeFigures(
            escape(n["host"]),
            n["ranks"],
            float(n["median_forward_s"]),
            float(n["median_compute_s"]),
            RankId(escape(n["host"]), n["slowest"]["rank"], n["slowest"]["local_rank"]),
            float(n["slowest"]["forward_s"]),
            float(n["slowest"]["compute_s"]),
            GpuHealth.of(n.get("gpu")),
        )
        for n in nodes
    )


def _most_common(items: Sequence[Any]) -> Any:
    """The item seen most often (the first of them on a tie)."""
    return Counter(items).most_common(1)[0][0]


def mean_phases(epochs: Sequence[EpochPhases]) -> Optional[EpochPhases]:
    """The mean over epochs of each vector; the slowest rank: the one slowest in most of them (one run's epochs share
    their method)."""
    if not epochs:
        return None
    return EpochPhases(
        PhaseTimes.mean_of([e.median for e in epochs]),
        PhaseTimes.mean_of([e.slowest for e in epochs]),
        _most_common([e.slowest_rank for e in epochs]),
        _most_common([e.median_of for e in epochs]),
    )


def _mean_health(healths: Sequence[GpuHealth]) -> GpuHealth:
    """One GPU over the epochs (each epoch's record names one GPU per node): the local rank most epochs name, and of
    the epochs that name it the mean SM clock, highest maximum clock and temperature, every throttle reason seen, so
    that a flag never joins one GPU's clock to another's reasons."""
    measured = [h for h in healths if h.unavailable is None]
    if not measured:
        return healths[-1]
    local_ranks = [h.local_rank for h in measured if h.local_rank is not None]
    local_rank = _most_common(local_ranks) if local_ranks else None
    measured = [h for h in measured if h.local_rank == local_rank]

    def figures(name: str) -> List[float]:
        return [getattr(h, name) for h in measured if getattr(h, name) is not None]

    clocks, maxima, temperatures = figures("sm_clock_mhz"), figures("sm_clock_max_mhz"), figures("temperature_c")
    reasons = tuple(dict.fromkeys(r for h in measured for r in h.throttle))
    return GpuHealth(
        fmean(clocks) if clocks else None,
        max(maxima) if maxima else None,
        local_rank,
        reasons,
        max(temperatures) if temperatures else None,
    )


def mean_nodes(epochs: Sequence[Sequence[NodeFigures]]) -> Optional[Tuple[NodeFigures, ...]]:
    """Per host (in order of first appearance), the mean over the epochs that list it."""
    if not epochs:
        return None
    by_host: Dict[str, List[NodeFigures]] = {}
    for nodes in epochs:
        for node in nodes:
            by_host.setdefault(node.host, []).append(node)
    return tuple(
        NodeFigures(
            host,
            max(n.ranks for n in seen),
            fmean(n.median_forward_s for n in seen),
            fmean(n.median_compute_s for n in seen),
            _most_common([n.slowest for n in seen]),
            fmean(n.slowest_forward_s for n in seen),
            fmean(n.slowest_compute_s for n in seen),
            _mean_health([n.gpu for n in seen]),
        )
        for host, seen in by_host.items()
    )


def straggler_flags(
    phases: Optional[EpochPhases], nodes: Optional[Sequence[NodeFigures]], threshold: float
) -> List[Flag]:
    """A flag per node whose slowest rank's `forward_excess` is over `threshold` (without `nodes`: the run's
    slowest rank alone)."""
    if phases is None:
        return []
    candidates = (
        [(n.slowest, n.slowest_forward_s) for n in nodes]
        if nodes
        else [(phases.slowest_rank, phases.slowest.forward_s)]
    )
    flags = []
    for who, forward_s in candidates:
        excess = forward_excess(phases, forward_s)
        if excess is not None and excess > threshold:
            flags.append(
                Flag(
                    STRAGGLER,
                    who.host,
                    who.rank,
                    who.local_rank,
                    (
                        "%s rank %d (local rank %s) computed %.0f %% slower than %s: a straggler; "
                        "this run's E_G is understated"
                        % (who.host, who.rank, _or_dash(who.local_rank), 100 * excess, phases.median_of)
                    ),
                )
            )
    return flags


def _or_dash(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


def throttled(gpu: GpuHealth, threshold: float) -> bool:
    """An SM clock below (1 - threshold) x its maximum with a throttle reason, or a hard throttle reason."""
    if any(r in HARD_THROTTLES for r in gpu.throttle):
        return True
    slow = (
        gpu.sm_clock_mhz is not None
        and gpu.sm_clock_max_mhz
        and gpu.sm_clock_mhz < (1.0 - threshold) * gpu.sm_clock_max_mhz
    )
    return bool(slow and gpu.throttle)


def throttle_flags(nodes: Optional[Sequence[NodeFigures]], threshold: float) -> List[Flag]:
    """A flag per node whose GPU health says throttled (`throttled`), naming the GPU's local rank and its rank where
    the record holds it (the node's slowest rank's GPU: a throttled GPU usually makes its rank the slowest; the
    health record itself has the local rank only). Records of MEDIAN_OF_RANKS_METHOD hold the reasons of all the
    node's GPUs beside the figures of the one with the lowest clock; later ones the figures and reasons of one GPU."""
    flags = []
    for node in nodes or ():
        gpu = node.gpu
        if gpu.unavailable is not None or not throttled(gpu, threshold):
            continue
        if gpu.sm_clock_mhz is not None and gpu.sm_clock_max_mhz:
            clock = "SM clock %.0f of %.0f MHz (%.0f %%)" % (
                gpu.sm_clock_mhz,
                gpu.sm_clock_max_mhz,
                100 * gpu.sm_clock_mhz / gpu.sm_clock_max_mhz,
            )
        else:
            clock = "SM clock not recorded"
        rank = node.slowest.rank if gpu.local_rank is not None and gpu.local_rank == node.slowest.local_rank else None
        whose = (
            "local rank %s" % _or_dash(gpu.local_rank)
            if rank is None
            else "rank %d (local rank %d)" % (rank, gpu.local_rank)
        )
        flags.append(
            Flag(
                THROTTLED,
                node.host,
                rank,
                gpu.local_rank,
                "%s GPU of %s: %s, %s: throttled" % (node.host, whose, clock, ", ".join(gpu.throttle)),
            )
        )
    return flags


def flags_of(phases: Optional[EpochPhases], nodes: Optional[Sequence[NodeFigures]], threshold: float) -> List[Flag]:
    """Straggler flags, then throttled GPUs."""
    check_threshold(threshold)
    return straggler_flags(phases, nodes, threshold) + throttle_flags(nodes, threshold)


def is_flagged(phases: Optional[EpochPhases], nodes: Optional[Sequence[NodeFigures]], threshold: float) -> bool:
    """Whether a run (or epoch) has a straggler or a throttled GPU (`flags_of`): such runs stay out of scaling
    figures and the efficiency budget unless included."""
    return bool(flags_of(phases, nodes, threshold))


def check_threshold(threshold: float) -> None:
    if not 0.0 < threshold < 1.0:
        raise ValueError("straggler threshold %r: must be a fraction in (0, 1)" % (threshold,))


class Epoch(Protocol):
    """What the judgement reads of an epoch (dlaunch/analysis/scaling.py's EpochPoint)."""

    @property
    def phases(self) -> Optional[EpochPhases]: ...

    @property
    def nodes(self) -> Optional[Tuple[NodeFigures, ...]]: ...


class Judged(Protocol):
    """What the judgement reads of a run (dlaunch/analysis/scaling.py's Run): the mean over its measured epochs,
    and each epoch's own."""

    @property
    def phases(self) -> Optional[EpochPhases]: ...

    @property
    def node_figures(self) -> Optional[Tuple[NodeFigures, ...]]: ...

    @property
    def epochs(self) -> Sequence[Epoch]: ...


def run_flags(run: Judged, threshold: float = DEFAULT_THRESHOLD) -> List[Flag]:
    """A finished run's flags, judged on the mean over its measured epochs (scaling.run_from_metrics makes the Run)."""
    return flags_of(run.phases, run.node_figures, threshold)


def live_flags(run: Judged, threshold: float = DEFAULT_THRESHOLD) -> List[Flag]:
    """A live run's flags, judged on its last epoch record."""
    epochs = run.epochs
    return flags_of(epochs[-1].phases, epochs[-1].nodes, threshold) if epochs else []
