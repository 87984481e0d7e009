"""`report`: the runs' scaling groups, efficiency budgets and the runs set apart; report.md, report.html and the
plots; the tables the command line prints."""

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

from dlaunch.api.calls import api_function
from dlaunch.api.records import (
    BudgetRow,
    PointVerdict,
    RcpRow,
    Report,
    ReportGroup,
    ReportPoint,
    SetApartRun,
    Spread,
    Table,
)


def _spread(s: Any) -> Optional[Spread]:
    return None if s is None else Spread(s.median, s.low, s.high, s.n, s.kind)


def _group(g: Any) -> ReportGroup:
    from dlaunch.analysis.scaling import count_unit

    points = [
        ReportPoint(
            gpus=p.gpus,
            nodes=p.nodes,
            runs=p.runs,
            images_per_s=_spread(p.throughput),  # type: ignore[arg-type]
            speedup=_spread(p.speedups),
            efficiency=_spread(p.efficiencies),  # type: ignore[arg-type]
            predicted_efficiency=g.predictions[p.gpus].efficiency if p.gpus in g.predictions else None,
            shares=dataclasses.asdict(p.shares) if p.shares else None,
            joules_per_image=_spread(p.energy),
            epochs_to_target=_spread(p.epochs_to_target),
            time_to_target_s=_spread(p.time_to_target),
        )
        for p in g.points
    ]
    budget = [BudgetRow(row.gpus, row.measured_e_g, row.step_s, dict(row.lost)) for row in g.budget]
    key = g.key
    shown = {p.gpus for p in g.points}
    quality = [
        PointVerdict(
            q.gpus,
            q.runs,
            q.spread,
            q.spread_kind,
            q.reference_gpus,
            q.reference_runs,
            q.reference_spread,
            q.efficiency,
            1.0 + q.allowance,
            q.threshold,
            q.verdict,
            ["%s: %s" % (p.kind, p.detail) for p in q.problems],
            list(q.causes),
            q.gpus not in shown,
        )
        for _, q in sorted(g.quality.items())
    ]
    axes = g.runs[0].axes
    return ReportGroup(
        key.label,
        key.experiment,
        key.site,
        key.model,
        key.framework,
        key.loader,
        key.batch_per_worker,
        key.step_options,
        [r.path for r in g.runs],
        points,
        budget,
        key.threads,
        axes.engine,
        axes.architecture,
        axes.updates,
        quality,
        count_unit(g.runs),
    )


# The report's console tables: the columns left out first at a narrow terminal (report.md and report.html keep every one).
SCALING_LEAVE_OUT = [
    "images/s range",
    "E_G range",
    "J/img range",
    "spread",
    "nodes",
    "runs",
    "data %",
    "compute %",
    "comm %",
    "time to target s",
    "epochs to target",
    "TTA S_G",
    "J/img",
    "pred. E_G",
]
RUN_LEAVE_OUT = [
    "schedule",
    "global batch",
    "energy to acc. kJ",
    "kJ/epoch",
    "energy kJ",
    "time to acc. s",
    "epochs to target",
    "J/img",
    "compile s",
    "best top-1",
    "history",
    "status",
]
BUDGET_LEAVE_OUT = ["batch/X ms"]
QUALITY_LEAVE_OUT = ["ref. spread", "reference", "E_G noise allows", "runs", "spread", "E_G"]
COMPARED_LEAVE_OUT = ["threads", "loader", "data %", "compute %", "sync %", "engine", "E_G"]
CONSOLE_GROUPS = 10  # groups shown as tables of their own; more: a line per group, the tables in the files
SUMMARY_HEADERS = ["group", "runs", "GPUs", "images/s", "E_G"]


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], leave_out: Sequence[str] = ()) -> Table:
    return Table(title, list(headers), [list(row) for row in rows], [h for h in leave_out if h in headers])


def _report_tables(data: Any) -> List[Table]:
    """The tables `dlaunch report` prints: per group its scaling, runs and budget (beyond CONSOLE_GROUPS groups one
    line per group: images/s and E_G at its largest GPU count), then RCP verdicts and the runs set apart."""
    from dlaunch.analysis.convergence import RCP_SOURCE
    from dlaunch.analysis.scaling import count_unit
    from dlaunch.reporting.document import (
        COMPARED_HEADERS,
        DIVERGED_HEADERS,
        FLAGGED_HEADERS,
        OFF_NETWORK_HEADERS,
        QUALITY_HEADERS,
        RCP_HEADERS,
        Columns,
        budget_headers,
        budget_rows,
        compared_rows,
        compares_axes,
        diverged_rows,
        flagged_rows,
        off_network_rows,
        quality_rows,
        rcp_rows,
        run_rows,
        scaling_rows,
    )
    from dlaunch.tables import cell

    results, apart, tables = data.results, data.apart, []
    everything = [r for g in results for r in g.runs] + [*data.diverged, *apart.excluded()]
    columns = dataclasses.replace(
        Columns.of([r for g in results for r in g.runs], history=bool(data.recorded.history)),
        unit=count_unit(everything),
    )
    if len(results) > CONSOLE_GROUPS:
        summary = []
        for g in results:
            last = g.points[-1] if g.points else None
            summary.append(
                [
                    g.key.label,
                    str(len(g.runs)),
                    "%d-%d" % (g.points[0].gpus, last.gpus) if last else "-",
                    cell(last.images_per_s if last else None),
                    cell(last.efficiency if last else None, "%.3f"),
                ]
            )
        tables.append(
            _table(
                "%d groups: images/s and E_G at each group's largest %s (every table: report.md, "
                "report.html)" % (len(results), columns.count_name),
                columns.counted(SUMMARY_HEADERS),
                summary,
            )
        )
    else:
        for g in results:
            tables.append(_table(g.key.label, columns.scaling_headers(), scaling_rows(g, columns), SCALING_LEAVE_OUT))
            rows = [row[:-1] for row in run_rows(g, data.profiles, columns, data.recorded.history)]  # paths: report.md
            tables.append(_table(g.key.label + ": runs", columns.run_headers()[:-1], rows, RUN_LEAVE_OUT))
            if g.explained:
                tables.append(
                    _table(
                        g.key.label + ": efficiency budget",
                        columns.counted(budget_headers()),
                        budget_rows(g),
                        BUDGET_LEAVE_OUT,
                    )
                )
    quality = [
        [g.key.label] + row[:-1]  # why: a line of its own below the tables (report's `doubtful_lines`)
        for g in results
        for row in quality_rows(g, apart.doubtful_included)
        if len(results) <= CONSOLE_GROUPS or not row[7].startswith("ok")
    ]
    if quality:
        tables.append(
            _table(
                "measurement quality (%s)"
                % ("every point" if len(results) <= CONSOLE_GROUPS else "the doubtful points; every one: report.md"),
                ["group"] + columns.counted(QUALITY_HEADERS)[:-1],
                quality,
                QUALITY_LEAVE_OUT,
            )
        )
    if compares_axes(results):
        tables.append(
            _table(
                "architectures, updates and frameworks compared",
                ["group"] + columns.counted(COMPARED_HEADERS),
                [[label] + row for label, row in compared_rows(results)],
                COMPARED_LEAVE_OUT,
            )
        )
    if data.rcp:
        tables.append(
            _table(
                "convergence against MLPerf's RCPs (%s)" % RCP_SOURCE,
                ["group"] + RCP_HEADERS,
                [[v.label] + row for v, row in zip(data.rcp, rcp_rows(data.rcp))],
                ["min epochs", "RCP mean", "runs", "RCP"],
            )
        )
    if apart.flagged:
        rows = [[r.key.label] + row[:-1] for r in apart.flagged for row in flagged_rows([r], apart.flags)]
        tables.append(
            _table("runs with a straggler or a throttled GPU", ["group"] + columns.counted(FLAGGED_HEADERS[:-1]), rows)
        )
    if data.diverged:
        rows = [[r.key.label] + row[:-1] for r in data.diverged for row in diverged_rows([r])]
        tables.append(
            _table(
                "diverged runs (left out of every table above)",
                ["group"] + columns.counted(DIVERGED_HEADERS[:-1]),
                rows,
                ["epochs"],
            )
        )
    if apart.off:
        rows = [[r.key.label] + row[:-1] for r in apart.off for row in off_network_rows([r], apart.problems)]
        tables.append(_table("runs off their network", ["group"] + columns.counted(OFF_NETWORK_HEADERS[:-1]), rows))
    return tables


@api_function
def report(
    paths: Sequence[Any],
    *,
    output: Optional[Any] = None,
    include_network_mismatches: bool = False,
    include_stragglers: bool = False,
    straggler_threshold: Optional[float] = None,
    include_doubtful: bool = False,
    noise_threshold: Optional[float] = None,
    site: Optional[str] = None,
    on_rejected: Optional[Callable[[str], None]] = None,
) -> Report:
    """What `dlaunch report` shows for the runs under `paths`: per group the scaling points (X, S_G, E_G and
    their spreads, predicted E_G), the efficiency budget and each count's measurement-quality verdict (`quality`;
    doubtful points leave `points` and the budget unless `include_doubtful`; `noise_threshold`: the spread above
    which a point is noisy, default 0.10, 0.30 for runs made on this machine); the runs set apart (diverged, stragglers, off their network); the
    tables the command prints (`tables`); with `output`, report.md, report.html and the plots written there
    (`files`). `on_rejected` hears each unreadable metrics file's message as soon as it is read (the command line
    prints them before a refusal)."""
    from dlaunch.analysis.quality import noise_option
    from dlaunch.analysis.scaling import load_runs
    from dlaunch.analysis.stragglers import flag_kinds, threshold_option
    from dlaunch.boundary import output_folder
    from dlaunch.reporting.document import write_report
    from dlaunch.reporting.html import PAGE
    from dlaunch.reporting.report import report_data

    threshold_option(straggler_threshold)
    noise = noise_option(noise_threshold)
    if output is not None:
        output_folder("--output", Path(output))
    given = [Path(p) for p in paths]
    loaded = load_runs(str(p) for p in given)
    for message in loaded.rejected if on_rejected else ():  # before a refusal (no valid file) is raised
        on_rejected(message)  # type: ignore[misc]
    data = report_data(
        loaded,
        given,
        site,
        include_network_mismatches,
        include_stragglers,
        straggler_threshold,
        include_doubtful,
        noise,
    )
    apart = data.apart
    set_apart = [SetApartRun(r.path, r.key.label, r.world_size, "diverged", [r.reason or ""]) for r in data.diverged]
    set_apart += [
        SetApartRun(
            r.path,
            r.key.label,
            r.world_size,
            flag_kinds(f.kind for f in apart.flags[r.path]),
            [f.message for f in apart.flags[r.path]],
            apart.flagged_included,
        )
        for r in apart.flagged
    ]
    set_apart += [
        SetApartRun(r.path, r.key.label, r.world_size, "network", list(apart.problems[r.path]), apart.off_included)
        for r in apart.off
    ]
    notes = data.notes + apart.notes(data.results)
    files: List[str] = []
    if output is not None:
        folder = Path(output)
        write_report(
            folder,
            data.results,
            data.profiles,
            loaded.rejected,
            notes,
            data.diverged,
            data.recorded,
            data.rcp,
            apart,
            [str(p) for p in given],
        )
        files = sorted(
            str(folder / name) for name in os.listdir(folder) if name in ("report.md", PAGE) or name.endswith(".png")
        )
    rcp = [
        RcpRow(v.label, v.global_batch, v.runs, v.reached, v.epochs, v.rcp.name if v.rcp else None, v.verdict)
        for v in data.rcp
    ]
    return Report(
        [_group(g) for g in data.results], set_apart, rcp, notes, list(loaded.rejected), files, _report_tables(data)
    )
