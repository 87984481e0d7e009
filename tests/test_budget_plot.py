"""The efficiency budget's plot reads without its table (issue 47 item 6): per GPU count the shares lost stacked up
from 0, those gained (a superlinear case: compute faster than at G_ref) apart below 0 in the cause's own colour, the
measured E_G written above, and a legend of the causes drawn only (it had 11 entries and a hatched "gained" block)."""
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from test_analysis import v4_fields, write_run
from test_efficiency import budget_runs, steps_rate
from test_report import results_of

from dlaunch.reporting.plots import plot_budget
from dlaunch.train.metrics_schema import VERSION


def superlinear_runs(root: Path) -> None:
    """G = 2: compute 0.1 s per step; G = 4 and 8: compute 0.06 and 0.05 s (the model's share fits a cache), while
    communication, data and the epoch overhead grow: E_G 1.268 and 1.108."""
    ref = v4_fields([0.1, 0.1], overhead_s=0.136)
    g4 = v4_fields([0.06] * 4, data_s=0.012, sync_s=0.025, overhead_s=0.15)
    g8 = v4_fields([0.05] * 7 + [0.054], data_s=0.02, sync_s=0.035, overhead_s=0.2)
    for name, gpus, fields in (("g2", 2, ref), ("g4", 4, g4), ("g8", 8, g8)):
        write_run(root, name, gpus, [1.0, steps_rate(fields, 80 * gpus)], epoch_fields=[fields, fields], version=VERSION)


def drawn(runs: Path):
    figure = Figure()
    plot_budget(figure, results_of(runs))
    (ax,) = figure.axes
    (group,) = results_of(runs)
    return ax, group.budget


def bars_by_colour(ax) -> dict:
    """colour -> [(GPU count label, bottom, height)] of the drawn bars of non-zero height."""
    found: dict = {}
    labels = [t.get_text() for t in ax.get_xticklabels()]
    for patch in ax.patches:
        if abs(patch.get_height()) > 0:
            x = labels[round(patch.get_x() + patch.get_width() / 2)]
            found.setdefault(patch.get_facecolor(), []).append((x, patch.get_y(), patch.get_height()))
    return found


def test_a_superlinear_budget_draws_gains_below_zero_and_names_only_the_causes_drawn(tmp_path):
    superlinear_runs(tmp_path / "runs")
    ax, rows = drawn(tmp_path / "runs")
    assert [round(r.measured_e_g, 3) for r in rows] == [1.0, 1.268, 1.108]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["epoch overhead", "compute", "data", "stragglers", "communication"]  # the stack's top first
    assert [t.get_text() for t in ax.texts] == ["E_G 1.000", "E_G 1.268", "E_G 1.108"]
    bars = bars_by_colour(ax)
    compute = next(bars[h.get_facecolor()] for h, n in zip(ax.get_legend().legend_handles, legend) if n == "compute")
    assert [(x, bottom) for x, bottom, _ in compute] == [("4", 0.0), ("8", 0.0)]  # gains hang from 0 downwards
    assert [height for _, _, height in compute] == pytest.approx([rows[1].lost["compute"], rows[2].lost["compute"]])
    for row in rows[1:]:  # what is drawn up less what is drawn down is what E_G lacks of the ideal
        up = sum(h for b in bars.values() for x, _, h in b if x == str(row.gpus) and h > 0)
        down = sum(h for b in bars.values() for x, _, h in b if x == str(row.gpus) and h < 0)
        assert up + down == pytest.approx(1 - row.measured_e_g)
    assert ax.get_ylim()[0] < min(r.lost["compute"] for r in rows) and not any(p.get_hatch() for p in ax.patches)


def test_a_budget_without_gains_draws_losses_only(tmp_path):
    budget_runs(tmp_path / "runs")
    ax, rows = drawn(tmp_path / "runs")
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["epoch overhead", "data", "stragglers", "communication"]  # compute and other lost nothing
    assert ax.get_ylim()[0] > -0.05 and all(p.get_height() >= 0 for p in ax.patches)
