"""The efficiency budget of a scaling group: from ideal (1.00) to the measured E_G, the share lost per cause.

Per GPU count G of a group whose reference is G_ref (same batch per GPU), per step, each figure the median
over the point's runs of the run's mean over its measured epochs (the epoch record's phases, nodes and overhead:
dlaunch/train/phases.py defines them, dlaunch/train/metrics_schema.py holds their shape; dlaunch/analysis/scaling.py
averages them):

    t(G)        = global_batch / X(G)                       the effective step time behind the measured E_G (not a
                                                            measured step: X counts every second of the epochs)
    wait(G)     = phases.median.sync_s - phases.slowest.sync_s   waiting for the slowest rank, measured: the median
                                                            rank waits for it in the gradients' collective, the
                                                            slowest for none (`EpochPhases.wait_s`, 0 if negative)
    comm(G)     = phases.median.sync_s - wait(G)            exposed communication
    data(G)     = phases.median.data_s
    compute(G)  = phases.median.compute_s                   the median rank's forward + backward: it grows where
                                                            communication beside back-propagation shares the GPU's
                                                            SMs or a CPU's cores, or where clocks drop
    overhead(G) = overhead.total_s / steps                  epoch overhead per step

lost to x at G = (x(G) - x(G_ref)) / t(G); "other" = 1 - E_G - the recorded parts (optimizer changes, host gaps,
and any part not recorded), so 1 - sum(lost) = measured E_G exactly. A part is None
("not recorded") where the point's or the reference's runs lack it (files before version 4). The runs are those the
caller gives, as it judged them: diverged runs are left out here, flagged ones (a straggler or a throttled GPU) by the
caller (`stragglers.unflagged`) unless it includes them.
"""

from dataclasses import dataclass
from statistics import median
from typing import Callable, Dict, List, Optional, Sequence

from dlaunch.analysis.scaling import Run, measured_runs, scaling

COMMUNICATION, STRAGGLERS, DATA, COMPUTE = "communication", "stragglers", "data", "compute"
EPOCH_OVERHEAD, OTHER = "epoch overhead", "other"
LOST_PARTS = (COMMUNICATION, STRAGGLERS, DATA, COMPUTE, EPOCH_OVERHEAD, OTHER)

# Seconds per step of one run for each recorded part (None: not recorded).
PER_STEP: Dict[str, Callable[[Run], Optional[float]]] = {
    COMMUNICATION: lambda r: r.phases.median.sync_s - r.phases.wait_s if r.phases else None,
    STRAGGLERS: lambda r: r.phases.wait_s if r.phases else None,
    DATA: lambda r: r.phases.median.data_s if r.phases else None,
    COMPUTE: lambda r: r.phases.median.compute_s if r.phases else None,
    EPOCH_OVERHEAD: lambda r: r.overhead_per_step_s,
}


@dataclass(frozen=True)
class BudgetRow:
    """One GPU count: 1 - sum(lost.values() that are not None) == measured_e_g."""

    gpus: int
    measured_e_g: float
    lost: Dict[str, Optional[float]]  # LOST_PARTS -> fraction of ideal lost (None: not recorded)
    step_s: float  # t(G) = global batch / X: the effective step time, not a measured step
    per_step_s: Dict[str, Optional[float]]  # the parts but "other" at G, seconds per step (medians)


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    recorded = [v for v in values if v is not None]
    return median(recorded) if recorded else None


def budget(runs: Sequence[Run]) -> List[BudgetRow]:
    """The budget per GPU count of one scaling group (`runs`, as `scaling.scaling` takes them: judged by the caller)."""
    kept = measured_runs(runs)
    points = scaling(kept)
    if not points:
        return []
    figures = {}
    for point in points:
        at = [r for r in kept if r.world_size == point.gpus]
        step = median(r.global_batch / r.throughput for r in at)  # type: ignore[operator]
        figures[point.gpus] = (step, {part: _median([of(r) for r in at]) for part, of in PER_STEP.items()})
    reference = figures[points[0].gpus][1]
    rows = []
    for point in points:
        step, here = figures[point.gpus]
        lost: Dict[str, Optional[float]] = {
            part: None if here[part] is None or reference[part] is None else (here[part] - reference[part]) / step  # type: ignore[operator]
            for part in PER_STEP
        }
        lost[OTHER] = 1.0 - point.efficiency - sum(v for v in lost.values() if v is not None)
        rows.append(BudgetRow(point.gpus, point.efficiency, lost, step, here))
    return rows
