"""`dlaunch report`: the report's tables on the console (dlaunch/reporting/report.py's data), report.md, report.html
and the plots written (dlaunch/reporting/document.py)."""
from pathlib import Path
from typing import Annotated, List, Optional, Sequence

import typer
from rich.console import Console

from dlaunch.analysis.convergence import RCP_SOURCE
from dlaunch.analysis.scaling import load_runs
from dlaunch.analysis.stragglers import check_threshold
from dlaunch.boundary import escape, output_folder
from dlaunch.cli.terminal import finite_number
from dlaunch.reporting.document import (BUDGET_HEADERS, DIVERGED_HEADERS, FLAGGED_HEADERS, OFF_NETWORK_HEADERS, RCP_HEADERS,
                                        Columns, budget_rows, diverged_rows, flagged_rows, off_network_rows, rcp_rows,
                                        run_rows, scaling_rows, write_report)
from dlaunch.reporting.html import PAGE
from dlaunch.reporting.report import GroupResult, Profiles, Recorded, report_data
from dlaunch.tables import cell, print_table

SCALING_LEAVE_OUT = ["images/s range", "E_G range", "J/img range", "spread", "nodes", "runs", "data %", "compute %",
                     "comm %", "time to target s", "epochs to target", "TTA S_G", "J/img", "pred. E_G"]
RUN_LEAVE_OUT = ["schedule", "global batch", "energy to acc. kJ", "kJ/epoch", "energy kJ", "time to acc. s",
                 "epochs to target", "J/img", "best top-1", "history", "status"]
BUDGET_LEAVE_OUT = ["step ms"]
CONSOLE_GROUPS = 10  # groups printed as tables of their own; more: a line per group, the tables in the files


def show_table(console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
               leave_out: Sequence[str] = ()) -> None:
    """A table that fits the console without cutting a name (tables.print_table), leaving out first what a
    reader came for least, and says so in a caption wrapped at spaces; report.md and report.html keep every column."""
    print_table(console, title, headers, rows, leave_out=[h for h in leave_out if h in headers], wrap_caption=True)


SUMMARY_HEADERS = ["group", "runs", "GPUs", "images/s", "E_G"]


def summary_rows(results: Sequence[GroupResult]) -> List[List[str]]:
    """Per group: its runs, its GPU counts and images/s and E_G at the largest."""
    rows = []
    for g in results:
        last = g.points[-1] if g.points else None
        counts = "%d-%d" % (g.points[0].gpus, last.gpus) if last else "-"
        rows.append([g.key.label, str(len(g.runs)), counts, cell(last.images_per_s if last else None),
                     cell(last.efficiency if last else None, "%.3f")])
    return rows


def print_results(console: Console, results: Sequence[GroupResult], profiles: Profiles, recorded: Recorded) -> None:
    """Per group its scaling, runs and budget tables; beyond CONSOLE_GROUPS groups one line per group (images/s
    and E_G at its largest GPU count), every table in report.md and report.html."""
    if len(results) > CONSOLE_GROUPS:
        show_table(console, "%d groups: images/s and E_G at each group's largest GPU count (every table: report.md, "
                            "report.html)" % len(results), SUMMARY_HEADERS, summary_rows(results))
        return
    columns = Columns.of([r for g in results for r in g.runs], history=bool(recorded.history))
    for g in results:
        show_table(console, g.key.label, columns.scaling_headers(), scaling_rows(g, columns), SCALING_LEAVE_OUT)
        rows = [row[:-1] for row in run_rows(g, profiles, columns, recorded.history)]  # metrics file paths: report.md
        show_table(console, g.key.label + ": runs", columns.run_headers()[:-1], rows, RUN_LEAVE_OUT)
        if g.explained:
            show_table(console, g.key.label + ": efficiency budget", BUDGET_HEADERS, budget_rows(g), BUDGET_LEAVE_OUT)


def fraction(text: str) -> float:
    """A typer `parser` for --straggler-threshold: a number strictly between 0 and 1."""
    value = finite_number()(text)
    try:
        check_threshold(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return value


# The options that decide which runs the tables and plots keep (report and study report).
IncludeNetworkMismatches = Annotated[bool, typer.Option(
    "--include-network-mismatches", help="keep runs whose network is not the site's [network] in the tables and plots")]
IncludeStragglers = Annotated[bool, typer.Option(
    "--include-stragglers", help="keep runs with a straggler or a throttled GPU in the tables and plots (their E_G is understated)")]
StragglerThreshold = Annotated[Optional[float], typer.Option(
    parser=fraction, help="a rank computing this fraction slower than the median rank is a straggler (default: each run's site profile's straggler_threshold, else 0.1)")]


def report_command(
    paths: Annotated[List[Path], typer.Argument(help="Run directories (searched recursively for metrics.jsonl) or metrics files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for report.md, report.html and the PNG plots.")] = Path("report"),
    site: Annotated[Optional[str], typer.Option(help="Site profile (name or TOML path) for every run; default: the one each run's directory kept (site.toml), else its site's name.")] = None,
    include_network_mismatches: IncludeNetworkMismatches = False,
    include_stragglers: IncludeStragglers = False,
    straggler_threshold: StragglerThreshold = None,
) -> None:
    """Turn run directories into the study's tables, report.md, report.html (one page to share) and plots.

    Exit code 0; 1 when some metrics files were rejected (each named on stderr, the rest reported);
    2 on bad input (nothing written).
    """
    output_folder("--output", output)  # before anything is read or written
    loaded = load_runs(str(p) for p in paths)
    console, errors = Console(soft_wrap=True, markup=False), Console(stderr=True, soft_wrap=True, markup=False)
    for message in loaded.rejected:
        errors.print("rejected: %s" % escape(message), highlight=False)
    data = report_data(loaded, paths, site, include_network_mismatches, include_stragglers, straggler_threshold)
    rcp, apart, diverged = data.rcp, data.apart, data.diverged
    print_results(console, data.results, data.profiles, data.recorded)
    if rcp:
        show_table(console, "convergence against MLPerf's RCPs (%s)" % RCP_SOURCE, ["group"] + RCP_HEADERS,
                   [[v.label] + row for v, row in zip(rcp, rcp_rows(rcp))], ["min epochs", "RCP mean", "runs", "RCP"])
    if apart.flagged:
        rows = [[r.key.label] + row[:-1] for r in apart.flagged for row in flagged_rows([r], apart.flags)]
        show_table(console, "runs with a straggler or a throttled GPU", ["group"] + FLAGGED_HEADERS[:-1], rows)
    if diverged:
        rows = [[r.key.label] + row[:-1] for r in diverged for row in diverged_rows([r])]
        show_table(console, "diverged runs (left out of every table above)", ["group"] + DIVERGED_HEADERS[:-1], rows, ["epochs"])
    if apart.off:
        rows = [[r.key.label] + row[:-1] for r in apart.off for row in off_network_rows([r], apart.problems)]
        show_table(console, "runs off their network", ["group"] + OFF_NETWORK_HEADERS[:-1], rows)
    notes = data.notes + apart.notes()
    for note in notes:
        errors.print("note: %s" % note, highlight=False)
    write_report(output, data.results, data.profiles, loaded.rejected, notes, diverged, data.recorded, rcp, apart, [str(p) for p in paths])
    console.print("wrote %s and %s" % (output / "report.md", output / PAGE), highlight=False)
    if loaded.rejected:
        raise typer.Exit(1)


