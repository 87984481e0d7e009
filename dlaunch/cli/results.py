"""`dlaunch results`: list and filter the results database, compare two sets of runs, rebuild it.

Formats: `table` (80 columns, names never cut: dlaunch/tables.py), `csv`, `json` (every column),
`markdown`. Selectors and the comparison's statistics: dlaunch/resultsdb/compare.py.
"""

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Dict, List, Literal, Optional, Sequence, Tuple

import typer
from rich.console import Console

from dlaunch.cli.terminal import command_group, print_json
from dlaunch.resultsdb.compare import METRICS, fact_name, fact_text
from dlaunch.resultsdb.store import ResultsDB, db_path, read_rows
from dlaunch.tables import cell, counted, markdown, print_table

if TYPE_CHECKING:
    from dlaunch.api import Comparison, ResultRow

results_app = command_group(
    help="The results database: list runs (no sub-command), compare, rebuild.", invoke_without_command=True
)
err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)

Db = Annotated[
    Optional[Path],
    typer.Option("--db", help="results database (default: $DLAUNCH_RESULTS_DB, else runs/results.sqlite)"),
]
Format = Annotated[Literal["table", "csv", "json", "markdown"], typer.Option("--format", help="output format")]

LIST_HEADERS = (
    "run",
    "experiment",
    "site",
    "ended",
    "GPUs",
    "framework",
    "model",
    "step options",
    "status",
    "flags",
    "images/s",
    "S_G",
    "E_G",
    "quality",
    "epochs to target",
    "time to target s",
    "RCP",
    "history",
)
# Left out first at a narrow terminal: the columns whose value is the same in every row (they tell no run from
# another; the caption names them), then in this order; run, GPUs, images/s and E_G stay.
LIST_LEAVE_OUT = (
    "history",
    "RCP",
    "time to target s",
    "epochs to target",
    "S_G",
    "ended",
    "quality",
    "step options",
    "flags",
    "status",
    "framework",
    "model",
    "experiment",
    "site",
)


def list_leave_out(cells: Sequence[Sequence[str]]) -> List[str]:
    """LIST_LEAVE_OUT with the columns of one value in every row first."""
    same = {h for i, h in enumerate(LIST_HEADERS) if len({row[i] for row in cells}) <= 1}
    return [h for h in LIST_LEAVE_OUT if h in same] + [h for h in LIST_LEAVE_OUT if h not in same]


def flag_kinds(flags: Optional[List[Dict[str, Any]]]) -> str:
    """A row's flags by kind ('straggler', 'throttled'), 'none', or '-' when not recorded (metrics before version 4)."""
    if flags is None:
        return "-"
    return ", ".join(dict.fromkeys(f["kind"] for f in flags)) or "none"


def status_cell(row: "ResultRow") -> str:
    """The row's status, with what stopped a run that was stopped: `cancelled (SIGINT)`."""
    from dlaunch.train.signals import stop_cause

    cause = stop_cause(row.reason)
    return "%s (%s)" % (row.status, cause) if cause else row.status


def efficiency_cell(row: "ResultRow") -> str:
    """E_G, or '-' with the flags that kept the run out of its scaling curve (as report leaves it out), so the
    cell says why where the flags column is left out at a narrow terminal."""
    if row.efficiency is None and row.flags:
        return "- (%s)" % flag_kinds(row.flags)
    return cell(row.efficiency, "%.3f")


def emit(
    fmt: str,
    title: str,
    headers: Sequence[str],
    cells: Sequence[Sequence[str]],
    records: Sequence[Dict[str, Any]],
    leave_out: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> None:
    """`cells` as a table or Markdown (with `title` and `notes`), or `records` as CSV or JSON."""
    out = Console(soft_wrap=True, markup=False, highlight=False)  # made now: its width is $COLUMNS as of this call
    if fmt == "json":
        out.out(json.dumps(list(records), indent=2, sort_keys=True))
    elif fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(records[0]) if records else [], lineterminator="\n")
        writer.writeheader()
        for record in records:
            writer.writerow(
                {k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for k, v in record.items()}
            )
        out.out(buffer.getvalue(), end="")
    elif fmt == "markdown":
        out.out("\n\n".join(["## " + title, *notes, markdown(headers, cells)]))
    else:
        print_table(out, title, headers, cells, leave_out=leave_out, wrap_caption=True)
        for note in notes:
            out.print(note)


@results_app.callback()
def results(
    ctx: typer.Context,
    where: Annotated[
        Optional[List[str]],
        typer.Option(
            "--where",
            "-w",
            help="selector, e.g. site=juwels,gpus=8 or date=2026-10 or date=2026-10-01..2026-10-15 (repeatable; all must hold)",
        ),
    ] = None,
    fmt: Format = "table",
    db: Db = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="as --format json: the Python API's objects (docs/API.md)")
    ] = False,
) -> None:
    """List the runs in the results database, oldest first, with S_G, E_G and history verdicts."""
    if ctx.invoked_subcommand is not None:
        return
    from dlaunch import api

    rows = api.results(where or [], db=db)
    cells = [
        [
            r.run,
            r.experiment,
            r.site,
            r.ended[:10],
            str(r.gpus),
            r.framework,
            r.model,
            r.step_options,
            status_cell(r),
            flag_kinds(r.flags),
            cell(r.images_per_s, "%.1f"),
            cell(r.speedup, "%.2f"),
            efficiency_cell(r),
            r.quality or "-",
            cell(r.epochs_to_target, "%d"),
            cell(r.time_to_target_s, "%.1f"),
            r.rcp or "-",
            r.history or "-",
        ]
        for r in rows
    ]
    emit(
        "json" if as_json else fmt,
        "dlaunch results: %d run(s)" % len(rows),
        LIST_HEADERS,
        cells,
        [r.to_dict() for r in rows],
        list_leave_out(cells),
        ["database: %s" % db_path(db)],
    )


def changes(changed: Dict[str, List[Any]]) -> str:
    """'--threads 2 -> 1; image a -> b; version torch 2.1 -> 2.2'."""
    return "; ".join(
        "%s %s -> %s" % (fact_name(name), fact_text(name, va), fact_text(name, vb))
        for name, (va, vb) in changed.items()
    )


COMPARE_HEADERS = ("A median", "A range", "A runs", "B median", "B range", "B runs", "change %", "p", "significant")


def comparison_output(c: "Comparison") -> Tuple[List[str], List[List[str]], List[Dict[str, Any]], List[str]]:
    """(headers, cells, flat records: the matched key's fields then the row's, notes) of the API's comparison."""
    fmt = "%.4g"
    cells, records = [], []
    for m in c.rows:
        row = [str(m.key[k]) for k in c.varying]
        for median, low, high, runs in (
            (m.a_median, m.a_low, m.a_high, m.a_runs),
            (m.b_median, m.b_low, m.b_high, m.b_runs),
        ):
            row += [cell(median, fmt), "%s-%s" % (fmt % low, fmt % high) if runs > 1 else "-", str(runs)]
        row += [cell(m.change_pct, "%+.1f"), cell(m.p_value, "%.3g"), m.significant]
        cells.append(row)
        records.append({**m.key, **{k: v for k, v in m.to_dict().items() if k != "key"}})
    notes = [
        "A: %s (%s); B: %s (%s); figure: %s" % (c.a, counted(c.a_runs, "run"), c.b, counted(c.b_runs, "run"), c.metric)
    ]
    if c.changed:
        notes.append("changed: " + changes(c.changed))
    if c.pins:
        notes.append("versions: " + changes(c.pins))
    for m in c.rows:
        if m.changed:
            where = ", ".join("%s %s" % (k, m.key[k]) for k in c.varying)
            notes.append("changed at %s: %s" % (where, changes(m.changed)))
    if c.same:
        notes.append("same in every row: " + ", ".join("%s %s" % (k, v) for k, v in c.same.items()))
    notes.append(
        "significant: two-sided exact Mann-Whitney U test, p < 0.05 (rank-based: repeats are few and "
        "not normal); ranges: min-max below 6 runs, 95% CI of the median from 6"
    )
    return list(c.varying) + list(COMPARE_HEADERS), cells, records, notes


@results_app.command("compare")
def compare_command(
    a: Annotated[
        str,
        typer.Argument(
            help="selector of side A: an experiment, or key=value[,key=value] (site, stack, date, framework, pins.torch, ...)"
        ),
    ],
    b: Annotated[str, typer.Argument(help="selector of side B")],
    metric: Annotated[str, typer.Option(help="figure to compare: %s" % ", ".join(METRICS))] = "images_per_s",
    fmt: Format = "table",
    db: Db = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="the Python API's Comparison as JSON (docs/API.md); --format json: its rows alone, flat"
        ),
    ] = False,
) -> None:
    """Compare two experiments, sites, stacks or dates per model, framework and GPU count."""
    from dlaunch import api

    comparison = api.compare(a, b, metric=metric, db=db)
    if as_json:
        print_json(comparison)
        return
    headers, cells, records, notes = comparison_output(comparison)
    emit(fmt, "dlaunch results compare: %s (A) against %s (B)" % (a, b), headers, cells, records, notes=notes)


@results_app.command("rebuild")
def rebuild_command(
    paths: Annotated[
        Optional[List[Path]], typer.Argument(help="run directories or folders holding them (default: ./runs)")
    ] = None,
    prune: Annotated[
        bool, typer.Option("--prune", help="also drop the rows whose metrics file no longer exists")
    ] = False,
    db: Db = None,
) -> int:
    """Write the rows of every ended run under PATHS anew (the database may be deleted first).

    Rows of runs elsewhere stay (the database may be the only record of runs whose directories were
    cleaned up) unless --prune drops those whose metrics file is gone. Exit 1 when a metrics file
    was unreadable (each named on stderr; the others are written)."""
    from dlaunch.analysis.scaling import find_metrics_files

    files = [Path(f) for f in find_metrics_files(str(p) for p in paths or [Path("runs")])]
    rows, rejected = read_rows(files, {})
    with ResultsDB(db_path(db)) as store:
        if rows:
            store.upsert(rows)
        gone = [r["uid"] for r in store.rows() if not Path(r["provenance"]["metrics_file"]).is_file()]
        if prune and gone:
            store.delete(gone)
    for message in rejected:
        err.print("rejected: %s" % message)
    kept = (
        ""
        if prune or not gone
        else "; %d row(s) of runs whose metrics file is gone kept (--prune drops them)" % len(gone)
    )
    err.print(
        "%s: %d row(s) from %d metrics file(s)%s%s"
        % (db_path(db), len(rows), len(files), "; %d dropped" % len(gone) if prune else "", kept)
    )
    return 1 if rejected else 0
