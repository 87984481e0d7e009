"""dlaunch: containerized multi-node launch toolkit for distributed deep-learning benchmarks.

`dlaunch.train` is the trainer that runs inside the images (`python -m dlaunch.train`, Python >= 3.9,
importable without the launcher); everything else is the launcher, its `dlaunch` command and its Python
API (dlaunch/api.py, docs/API.md): `dlaunch.run(...)`, `dlaunch.status()`, ... are loaded on first use
(PEP 562), so that `import dlaunch` and `import dlaunch.train` import nothing else of dlaunch.
"""
import importlib
from typing import Any, List

__version__ = "0.1.0"

# The API's names (dlaunch/api.py) and the exception and warning types it raises and issues (dlaunch/errors.py).
# `results` and `doctor` are dlaunch.api's only: `dlaunch.results` and `dlaunch.doctor` name modules of this
# package (an imported submodule takes its name in the package, whatever __getattr__ says).
_API = ("run", "sweep", "status", "watch", "cancel", "logs", "report", "sites", "images", "predict",
        "Job", "RunStatus", "Logs", "Report", "ReportGroup", "ReportPoint", "Spread", "BudgetRow", "SetApartRun",
        "RcpRow", "ResultRow", "SiteInfo", "ImageInfo", "Check", "Doctor", "Prediction", "PredictionRow")
_ERRORS = ("DlaunchError", "DlaunchWarning", "DlaunchNote")
__all__ = list(_API + _ERRORS) + ["api"]


def __getattr__(name: str) -> Any:
    if name == "api":
        return importlib.import_module("dlaunch.api")
    if name in _API:
        return getattr(importlib.import_module("dlaunch.api"), name)
    if name in _ERRORS:
        return getattr(importlib.import_module("dlaunch.errors"), name)
    raise AttributeError("module 'dlaunch' has no attribute %r" % name)


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
