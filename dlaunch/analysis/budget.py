"""The efficiency budget of a scaling group: from ideal (1.00) to the measured E_G, the share lost per cause.

Its parts are one table, `PARTS` (name, per-step measure, colour, definition), which the report's table and
definitions (dlaunch/reporting/document.py), its plot (dlaunch/reporting/plots.py), the API's `BudgetRow.lost` and the
docs' lists of the parts (tests/test_budget_parts.py) read: a part is added there alone.

Per GPU count G of a group whose reference is G_ref (same batch per GPU), per step, each figure the median
over the point's runs of the run's mean over its measured epochs (the epoch record's phases, nodes and overhead:
dlaunch/train/phases.py defines them, dlaunch/analysis/phases.py reads them, dlaunch/analysis/scaling.py averages them):
t(G) = global_batch / X(G), the effective step time behind the measured E_G (not a measured step: X counts every
second of the epochs), and each part's measure x(G) in seconds per step (`BudgetPart.per_step`).

lost to x at G = (x(G) - x(G_ref)) / t(G); `other` = 1 - E_G - the recorded parts (optimizer changes, host gaps,
and any part not recorded), so 1 - sum(lost) = measured E_G exactly. A part is None ("not recorded") where the
point's or the reference's runs lack it (files before version 4). The runs are those the caller gives, as it judged
them: diverged runs are left out here, flagged ones (a straggler or a throttled GPU) by the caller
(`stragglers.unflagged`) unless it includes them.
"""

from dataclasses import dataclass
from statistics import median
from typing import Callable, Dict, List, Optional, Sequence

from dlaunch.analysis.scaling import Run, measured_runs, scaling

COMMUNICATION, STRAGGLERS, DATA, COMPUTE = "communication", "stragglers", "data", "compute"
EPOCH_OVERHEAD, OTHER = "epoch overhead", "other"


@dataclass(frozen=True)
class BudgetPart:
    """A cause the budget names: a column of the report's table and a key of `BudgetRow.lost`."""

    name: str
    per_step: Optional[
        Callable[[Run], Optional[float]]
    ]  # seconds per step of one run (None: not recorded); OTHER: None
    colour: str  # its bars in the report's plot (a matplotlib colour)
    definition: str  # the report's definition of its measure (Markdown)


# The parts in the order the report shows them; OTHER, the rest, last.
PARTS: Dict[str, BudgetPart] = {
    part.name: part
    for part in (
        BudgetPart(
            COMMUNICATION,
            lambda r: r.phases.median.sync_s - r.phases.wait_s if r.phases else None,
            "C3",
            "exposed communication, the median rank's sync_s less its wait for the slowest rank",
        ),
        BudgetPart(
            STRAGGLERS,
            lambda r: r.phases.wait_s if r.phases else None,
            "C1",
            "that wait, measured: the median rank's sync_s - the slowest rank's (0 if negative)",
        ),
        BudgetPart(DATA, lambda r: r.phases.median.data_s if r.phases else None, "C2", "the median rank's data_s"),
        BudgetPart(
            COMPUTE,
            lambda r: r.phases.median.compute_s if r.phases else None,
            "C5",
            "the median rank's compute_s (it grows where communication beside back-propagation shares the GPU's SMs "
            "or a CPU's cores, or where clocks drop)",
        ),
        BudgetPart(EPOCH_OVERHEAD, lambda r: r.overhead_per_step_s, "C4", "overhead.total_s / steps"),
        BudgetPart(
            OTHER,
            None,
            "C7",
            "1 - E_G - the recorded parts (optimizer changes, host gaps, and parts not recorded), so ideal (1.000) - "
            "everything lost = measured E_G exactly",
        ),
    )
}


@dataclass(frozen=True)
class BudgetRow:
    """One GPU count: 1 - sum(lost.values() that are not None) == measured_e_g."""

    gpus: int
    measured_e_g: float
    lost: Dict[str, Optional[float]]  # PARTS -> fraction of ideal lost (None: not recorded)
    step_s: float  # t(G) = global batch / X: the effective step time, not a measured step
    per_step_s: Dict[str, Optional[float]]  # the parts but OTHER at G, seconds per step (medians)


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    recorded = [v for v in values if v is not None]
    return median(recorded) if recorded else None


def budget(runs: Sequence[Run]) -> List[BudgetRow]:
    """The budget per GPU count of one scaling group (`runs`, as `scaling.scaling` takes them: judged by the caller)."""
    measures = {name: part.per_step for name, part in PARTS.items() if part.per_step is not None}
    kept = measured_runs(runs)
    points = scaling(kept)
    if not points:
        return []
    figures = {}
    for point in points:
        at = [r for r in kept if r.world_size == point.gpus]
        step = median(r.global_batch / r.throughput for r in at)  # type: ignore[operator]
        figures[point.gpus] = (step, {name: _median([of(r) for r in at]) for name, of in measures.items()})
    reference = figures[points[0].gpus][1]
    rows = []
    for point in points:
        step, here = figures[point.gpus]
        lost: Dict[str, Optional[float]] = {
            name: None if here[name] is None or reference[name] is None else (here[name] - reference[name]) / step  # type: ignore[operator]
            for name in measures
        }
        lost[OTHER] = 1.0 - point.efficiency - sum(v for v in lost.values() if v is not None)
        rows.append(BudgetRow(point.gpus, point.efficiency, {name: lost[name] for name in PARTS}, step, here))
    return rows
