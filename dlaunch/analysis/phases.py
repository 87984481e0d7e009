"""An epoch record's version-4 parts as records (metrics schema version 4: dlaunch/train/metrics_schema.py holds their
shape, dlaunch/train/phases.py writes them): the per-rank step phases (`phases`: the median rank and the rank with
the longest forward pass), the per-node figures with GPU health (`nodes`) and the epoch's time outside its steps
(`overhead`). Parsed from a (validated) epoch record by field name (`epoch_phases`, `epoch_nodes`, `epoch_overhead`)
and averaged over a run's epochs (`mean_phases`, `mean_nodes`, `Overhead.mean_of`); what they mean for a run:
dlaunch/analysis/stragglers.py (flags), dlaunch/analysis/budget.py (the efficiency budget). A version 1-3 record has
none of them (None).
"""

from collections import Counter
from dataclasses import dataclass, fields
from statistics import fmean
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

from dlaunch.boundary import escape
from dlaunch.train.metrics_schema import MEDIAN_OF_RANKS_METHOD, is_number

# An epoch record's phases.method says what its "median" is (metrics_schema.PHASES_METHOD): the median rank, or in
# records of MEDIAN_OF_RANKS_METHOD the median of the ranks (statistics.median; the reference named in flags).
MEDIAN_RANK, MEDIAN_OF_RANKS = "the median rank", "the median of the ranks"

FiguresT = TypeVar("FiguresT", "PhaseTimes", "Overhead")


def _figures_of(cls: Type[FiguresT], record: Dict[str, Any]) -> FiguresT:
    """A record of seconds (`PhaseTimes`, `Overhead`) from a metrics record's fields of the same names."""
    return cls(**{f.name: float(record[f.name]) for f in fields(cls)})


def _mean_of(cls: Type[FiguresT], items: Sequence[FiguresT]) -> FiguresT:
    """Each field's mean over `items`."""
    return cls(**{f.name: fmean(getattr(item, f.name) for item in items) for f in fields(cls)})


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per step of one rank (or the median rank's), metrics-v4's definitions (`STEP_PHASES`, by name)."""

    data_s: float
    forward_s: float  # part of compute_s
    compute_s: float
    sync_s: float
    optimizer_s: float
    other_s: float
    step_s: float

    @classmethod
    def of(cls, record: Dict[str, Any]) -> "PhaseTimes":
        return _figures_of(cls, record)

    @classmethod
    def mean_of(cls, items: Sequence["PhaseTimes"]) -> "PhaseTimes":
        return _mean_of(cls, items)


@dataclass(frozen=True)
class Overhead:
    """An epoch's time outside its steps (rank 0's wall clock, seconds; metrics-v4's `overhead`, `OVERHEAD_FIELDS` by
    name), or a mean of them."""

    loader_start_s: float
    validation_s: float
    checkpoint_s: float
    barrier_s: float
    metrics_s: float
    total_s: float

    @classmethod
    def of(cls, record: Dict[str, Any]) -> "Overhead":
        return _figures_of(cls, record)

    @classmethod
    def mean_of(cls, items: Sequence["Overhead"]) -> "Overhead":
        return _mean_of(cls, items)


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
        slowest waited longer. Time, where `stragglers.forward_excess` is the flag's measure of who is slow. (Records
        of MEDIAN_OF_RANKS_METHOD: with 2 ranks their median sync_s is the mean of the two, so half the wait.)"""
        return max(0.0, self.median.sync_s - self.slowest.sync_s)


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
            sm_clock_mhz=figure("sm_clock_mhz"),
            sm_clock_max_mhz=figure("sm_clock_max_mhz"),
            local_rank=value.get("local_rank"),
            throttle=tuple(escape(str(r)) for r in value.get("throttle") or ()),
            temperature_c=figure("temperature_c"),
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


def epoch_phases(record: Dict[str, Any]) -> Optional[EpochPhases]:
    """The `phases` of a (validated) epoch record; None when not recorded (versions 1-3)."""
    phases = record.get("phases")
    if not isinstance(phases, dict):
        return None
    slowest = phases["slowest"]
    return EpochPhases(
        median=PhaseTimes.of(phases["median"]),
        slowest=PhaseTimes.of(slowest),
        slowest_rank=RankId(host=escape(slowest["host"]), rank=slowest["rank"], local_rank=slowest["local_rank"]),
        median_of=MEDIAN_OF_RANKS if phases["method"] == MEDIAN_OF_RANKS_METHOD else MEDIAN_RANK,
    )


def epoch_nodes(record: Dict[str, Any]) -> Optional[Tuple[NodeFigures, ...]]:
    """The `nodes` of a (validated) epoch record; None when not recorded."""
    nodes = record.get("nodes")
    if not isinstance(nodes, list):
        return None
    return tuple(
        NodeFigures(
            host=escape(n["host"]),
            ranks=n["ranks"],
            median_forward_s=float(n["median_forward_s"]),
            median_compute_s=float(n["median_compute_s"]),
            slowest=RankId(host=escape(n["host"]), rank=n["slowest"]["rank"], local_rank=n["slowest"]["local_rank"]),
            slowest_forward_s=float(n["slowest"]["forward_s"]),
            slowest_compute_s=float(n["slowest"]["compute_s"]),
            gpu=GpuHealth.of(n.get("gpu")),
        )
        for n in nodes
    )


def epoch_overhead(record: Dict[str, Any]) -> Optional[Overhead]:
    """The `overhead` of a (validated) epoch record; None when not recorded."""
    overhead = record.get("overhead")
    return Overhead.of(overhead) if isinstance(overhead, dict) else None


def _most_common(items: Sequence[Any]) -> Any:
    """The item seen most often (the first of them on a tie)."""
    return Counter(items).most_common(1)[0][0]


def mean_phases(epochs: Sequence[EpochPhases]) -> Optional[EpochPhases]:
    """The mean over epochs of each vector; the slowest rank: the one slowest in most of them (one run's epochs share
    their method)."""
    if not epochs:
        return None
    return EpochPhases(
        median=PhaseTimes.mean_of([e.median for e in epochs]),
        slowest=PhaseTimes.mean_of([e.slowest for e in epochs]),
        slowest_rank=_most_common([e.slowest_rank for e in epochs]),
        median_of=_most_common([e.median_of for e in epochs]),
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
    return GpuHealth(
        sm_clock_mhz=fmean(clocks) if clocks else None,
        sm_clock_max_mhz=max(maxima) if maxima else None,
        local_rank=local_rank,
        throttle=tuple(dict.fromkeys(r for h in measured for r in h.throttle)),
        temperature_c=max(temperatures) if temperatures else None,
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
            host=host,
            ranks=max(n.ranks for n in seen),
            median_forward_s=fmean(n.median_forward_s for n in seen),
            median_compute_s=fmean(n.median_compute_s for n in seen),
            slowest=_most_common([n.slowest for n in seen]),
            slowest_forward_s=fmean(n.slowest_forward_s for n in seen),
            slowest_compute_s=fmean(n.slowest_compute_s for n in seen),
            gpu=_mean_health([n.gpu for n in seen]),
        )
        for host, seen in by_host.items()
    )
