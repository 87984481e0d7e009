"""The results database: `results` (its rows, selected) and `compare` (two sets of runs)."""

import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

from dlaunch.api.calls import api_function
from dlaunch.api.records import CompareRow, Comparison, ResultRow
from dlaunch.boundary import escape
from dlaunch.errors import DlaunchError, DlaunchNote

if TYPE_CHECKING:
    from dlaunch.resultsdb.store import ResultsDB


def results_db(db: Optional[Any] = None) -> "ResultsDB":
    """The results database `db` (default: $DLAUNCH_RESULTS_DB, else runs/results.sqlite); DlaunchError when there is none."""
    from dlaunch.resultsdb.store import ResultsDB, db_path

    path = db_path(Path(db) if db is not None else None)
    if not path.is_file():
        raise DlaunchError(
            "%s: no results database (runs are recorded when they end; `dlaunch results rebuild` "
            "reads run directories)" % path
        )
    return ResultsDB(path)


@api_function
def results(where: Sequence[str] = (), *, db: Optional[Any] = None) -> List[ResultRow]:
    """The runs in the results database, oldest first (those that ended together by experiment, site and GPU
    count), that match every selector of `where` (e.g. 'site=juwels,gpus=8', 'date=2026-10'), with S_G, E_G,
    history and MLPerf RCP verdicts. A bad selector is a DlaunchError (before the database is looked for); one
    that matches nothing a DlaunchNote. No database where `db` names one is a DlaunchError; none at the default
    place (no run has ended yet) gives no rows, and says so in a DlaunchNote."""
    from dlaunch.analysis.convergence import load_rcps, run_rcp_verdict
    from dlaunch.resultsdb.compare import parse_conditions, select, unmatched, with_history, with_scaling
    from dlaunch.resultsdb.store import db_path

    for selector in where:  # a bad selector is named before the database is looked for
        parse_conditions(selector)
    if db is None and not db_path().is_file():
        warnings.warn("%s: no results database yet (runs are recorded when they end)" % db_path(), DlaunchNote, 3)
        return []
    with results_db(db) as store:
        everything = with_scaling(store.rows())
    for note in unmatched(everything, list(where)):
        warnings.warn("-w %s" % escape(note), DlaunchNote, stacklevel=3)
    rcps = load_rcps()
    names = [f.name for f in dataclasses.fields(ResultRow) if f.name != "rcp"]
    rows = sorted(
        with_history(select(everything, list(where)), everything),  # runs that ended together: by GPU count
        key=lambda row: (row["ended"], row["experiment"], row["site"], row["gpus"], row["run"]),
    )
    return [
        ResultRow(
            **{k: row[k] for k in names},
            rcp=None
            if row["epochs_to_mlperf_target"] is None
            else run_rcp_verdict(row["global_batch"], row["epochs_to_mlperf_target"], rcps),
        )
        for row in rows
    ]


def _compare_row(match: Any) -> CompareRow:
    sides = {}
    for side, values in (("a", match.a), ("b", match.b)):
        s = match.spread(values)
        sides.update(
            {
                side + "_median": s.median if s else None,
                side + "_low": s.low if s else None,
                side + "_high": s.high if s else None,
                side + "_spread": s.kind if s else None,
                side + "_runs": len(values),
                side + "_values": list(values),
            }
        )
    return CompareRow(
        key=dict(match.key),
        **sides,
        change_pct=None if match.change is None else 100 * match.change,
        p_value=match.p_value,
        significant=match.significance,
        changed={k: list(v) for k, v in match.changed.items()},
    )


@api_function
def compare(a: str, b: str, *, metric: str = "images_per_s", db: Optional[Any] = None) -> Comparison:
    """Two sets of runs of the results database (each an experiment's name or a selector, as `results`' `where`)
    compared per model, framework, GPU count, ... on `metric`, as `dlaunch results compare`, with every option and
    recorded fact that differs between them (the comparison's `changed` and `pins`, a row's `changed`)."""
    from dlaunch.resultsdb.compare import compare as compared
    from dlaunch.resultsdb.compare import parse_conditions

    for selector in (a, b):  # named before the database is looked for
        parse_conditions(selector)
    with results_db(db) as store:
        c = compared(store.rows(), a, b, metric)
    keys = list(c.matches[0].key) if c.matches else []
    varying = [k for k in keys if len({str(m.key[k]) for m in c.matches}) > 1] or keys[:1]
    return Comparison(
        c.a.label,
        c.b.label,
        len(c.a.rows),
        len(c.b.rows),
        c.metric,
        varying,
        {k: c.matches[0].key[k] for k in keys if k not in varying},
        {k: list(v) for k, v in c.changed.items()},
        {k: list(v) for k, v in c.pins.items()},
        [_compare_row(m) for m in c.matches],
    )
