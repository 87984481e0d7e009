"""The Python API (docs/API.md): what the `dlaunch` command line does, as functions that return typed,
JSON-serialisable objects. The command line (dlaunch/cli/) parses, calls these and prints.

- Every object is a frozen dataclass of str, int, float, bool, None, lists and dicts of those, or other
  such dataclasses: `x.to_dict()` is plain JSON, `T.from_dict(d)` makes it again (`Record`).
- Bad input and refusals raise `DlaunchError` (dlaunch/errors.py) only: `str(e)` is the line the
  command line prints after `dlaunch: error: `, `e.exit_code` its exit code (2: bad input, 1: the
  scheduler refused). What stops nothing is a `DlaunchWarning` (`warnings.warn`).
- Keyword arguments are the command line's options (`--run-name` is `run_name=`); the trainer's flags
  are keyword arguments too (`--batch-size 8` is `batch_size=8`), checked as the command line checks them.

The package: `records.py` (the objects, on `record.py`'s `Record`), `calls.py` (what every function shares), and one
module per concern: `launching.py` (run, sweep, rerun), `studies.py`, `observing.py` (status, watch, cancel, logs,
archive), `reports.py`, `database.py` (results, compare), `machines.py` (sites, images, doctor), `predicting.py`.
Start-up matters (the command line imports this package): each function imports its parts when called.
"""

from dlaunch.api.calls import os_error as os_error  # the command line's OSError line
from dlaunch.api.database import compare, results
from dlaunch.api.database import results_db as results_db
from dlaunch.api.launching import rerun, run, sweep
from dlaunch.api.machines import doctor, images, render_images, sites
from dlaunch.api.observing import archive, cancel, logs, status, watch
from dlaunch.api.predicting import predict, predicted_run_seconds
from dlaunch.api.record import Record
from dlaunch.api.records import (
    Archive,
    BudgetRow,
    Check,
    CompareRow,
    Comparison,
    Doctor,
    ImageInfo,
    Job,
    LeftOutRun,
    Logs,
    Prediction,
    PredictionRow,
    RcpRow,
    Report,
    ReportGroup,
    ReportPoint,
    Rerun,
    ResultRow,
    RunStatus,
    SetApartRun,
    SiteInfo,
    Spread,
    StudyCheck,
    StudyPlan,
    Table,
)
from dlaunch.api.reports import report
from dlaunch.api.studies import study, study_check, study_status
from dlaunch.errors import DlaunchError as DlaunchError  # what the functions raise (and warn with:)
from dlaunch.errors import DlaunchNote as DlaunchNote
from dlaunch.errors import DlaunchWarning as DlaunchWarning

__all__ = [
    "Archive",
    "BudgetRow",
    "Check",
    "CompareRow",
    "Comparison",
    "Doctor",
    "ImageInfo",
    "Job",
    "LeftOutRun",
    "Logs",
    "Prediction",
    "PredictionRow",
    "RcpRow",
    "Record",
    "Report",
    "ReportGroup",
    "ReportPoint",
    "Rerun",
    "ResultRow",
    "RunStatus",
    "SetApartRun",
    "SiteInfo",
    "Spread",
    "StudyCheck",
    "StudyPlan",
    "Table",
    "archive",
    "cancel",
    "compare",
    "doctor",
    "images",
    "logs",
    "predict",
    "predicted_run_seconds",
    "render_images",
    "report",
    "rerun",
    "results",
    "run",
    "sites",
    "status",
    "study",
    "study_check",
    "study_status",
    "sweep",
    "watch",
]
