"""Stragglers and throttled GPUs from the per-rank phases of metrics schema version 4 (dlaunch/analysis/phases.py: the
records; dlaunch/train/phases.py: the writer side).

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
a threshold in, `Flag`s out. A version 1-3 file has no phases: no flags, never "no straggler".
"""

from dataclasses import dataclass
from typing import List, Optional, Protocol, Sequence, Tuple

from dlaunch.analysis.phases import EpochPhases, GpuHealth, NodeFigures
from dlaunch.thresholds import DEFAULT_THRESHOLD

# Reasons that slow a GPU whatever its clock shows (NVML clock event reasons, as the trainer names them).
HARD_THROTTLES = ("thermal", "hardware slowdown", "power brake")
STRAGGLER, THROTTLED = "straggler", "throttled"


def forward_excess(phases: EpochPhases, forward_s: Optional[float] = None) -> Optional[float]:
    """The straggler measure: how much longer `forward_s` (default: the slowest rank's forward pass) took than the
    median rank's, a fraction (0.53: 53 % longer); None when the median rank's is not positive."""
    if phases.median.forward_s <= 0:
        return None
    return (phases.slowest.forward_s if forward_s is None else forward_s) / phases.median.forward_s - 1.0


@dataclass(frozen=True)
class Flag:
    kind: str  # STRAGGLER or THROTTLED
    host: str
    rank: Optional[int]  # stragglers: the slow rank; throttled GPUs: the GPU's rank where the record holds it
    local_rank: Optional[int]
    message: str


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
