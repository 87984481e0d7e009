"""The efficiency budget's parts are one table (dlaunch/analysis/budget.py's PARTS: name, per-step measure, colour,
definition): the docs name exactly its parts, and a part added to it alone reaches the budget's rows, the report's
table (report.md and the console), its definitions, the plot's legend and the API's BudgetRow, while the docs check
names it as missing from each doc until the doc lists it (docs/ARCHITECTURE.md, "Add a budget part")."""

import re
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from test_efficiency import budget_runs
from test_report import results_of, table_rows

from dlaunch import api
from dlaunch.analysis.budget import OTHER, PARTS, BudgetPart
from dlaunch.reporting.plots import plot_budget

ROOT = Path(__file__).resolve().parents[1]
# Where each doc lists the parts: the `names` between two phrases (its lines joined), in the table's order.
DOCS = {
    "README.md": ("as a share of the step time behind the measured E_G (global batch / X):", "1.000 minus the parts"),
    "docs/ARCHITECTURE.md": ("splits what a GPU count loses of the ideal between", "so that the parts"),
    "docs/API.md": ("the share of the ideal lost per cause, by part (", "None: not recorded"),
}


def parts_named(doc: str) -> list:
    text = " ".join((ROOT / doc).read_text().split())
    start, end = DOCS[doc]
    assert start in text, "%s: no list of the budget's parts after %r" % (doc, start)
    return re.findall(r"`([^`]+)`", text.split(start, 1)[1].split(end, 1)[0])


def docs_disagreeing() -> list:
    """One line per doc whose list of the budget's parts is not the table's."""
    return ["%s names the budget's parts %s, not %s" % (doc, parts_named(doc), list(PARTS))
            for doc in DOCS if parts_named(doc) != list(PARTS)]


def test_the_docs_name_exactly_the_budgets_parts():
    assert docs_disagreeing() == []
    assert list(PARTS)[-1] == OTHER and PARTS[OTHER].per_step is None  # the rest, last


# A part a test adds: 1 ms per step per GPU, so 2 ms more at 4 GPUs than at the reference's 2.
P2P = BudgetPart("p2p", lambda run: 0.001 * run.world_size, "C9", "1 ms per GPU (a part added by a test)")


@pytest.fixture
def added_part(monkeypatch):
    monkeypatch.setitem(PARTS, P2P.name, P2P)


def test_a_part_added_to_the_table_alone_is_in_the_report_its_definitions_and_the_api(added_part, tmp_path):
    budget_runs(tmp_path / "runs")
    made = api.report([tmp_path / "runs"], output=tmp_path / "report")
    t4 = 0.194  # the step time behind X at 4 GPUs (tests/test_efficiency.py)
    (group,) = made.groups
    assert list(group.budget[1].lost) == list(PARTS) and group.budget[1].lost["p2p"] == pytest.approx(0.002 / t4)
    assert 1.0 - sum(group.budget[1].lost.values()) == pytest.approx(group.budget[1].efficiency, abs=1e-12)
    (printed,) = [t for t in made.tables if t.title.endswith("efficiency budget")]
    assert printed.headers[-1] == "p2p" and printed.rows[1][-1] == "%.3f" % (0.002 / t4)
    text = (tmp_path / "report" / "report.md").read_text()
    intro = "## Efficiency budget\n\nPer GPU count, from ideal (1.000) to the measured E_G: the share of the ideal lost to "
    g2, g4 = table_rows(text, intro + "each cause (communication, stragglers, data, compute, epoch overhead, other, p2p) "
                        "against the group's reference G_ref (definitions below); the parts and E_G add up to 1.")
    assert (g2[-1], g4[-1]) == ("0.000", "%.3f" % (0.002 / t4))
    definitions = " ".join(text.split("## Definitions")[1].split())
    assert "`p2p` = 1 ms per GPU (a part added by a test)" in definitions


def test_a_part_added_to_the_table_alone_is_in_the_plots_legend_and_the_docs_check_misses_it(added_part, tmp_path):
    budget_runs(tmp_path / "runs")
    figure = Figure()
    plot_budget(figure, results_of(tmp_path / "runs"))
    (ax,) = figure.axes
    assert "p2p" in [t.get_text() for t in ax.get_legend().get_texts()]
    missing = docs_disagreeing()
    assert len(missing) == len(DOCS) and all("'other', 'p2p']" in line for line in missing), missing
