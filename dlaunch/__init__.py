"""dlaunch: containerized multi-node launch toolkit for distributed deep-learning benchmarks.

`dlaunch.train` is the trainer that runs inside the images (`python -m dlaunch.train`, Python >= 3.9,
importable without the launcher); everything else is the launcher, its `dlaunch` command and its Python
API (dlaunch/api/, docs/API.md): `dlaunch.run(...)`, `dlaunch.status()`, ... are loaded on first use
(PEP 562), so that `import dlaunch` and `import dlaunch.train` import nothing else of dlaunch.
"""

from typing import Any, List

# The API's names (dlaunch/api/) and the exception and warning types it raises and issues (dlaunch/errors.py).
_API = (
    "run",
    "sweep",
    "study",
    "status",
    "study_status",
    "study_check",
    "watch",
    "cancel",
    "logs",
    "report",
    "results",
    "compare",
    "sites",
    "images",
    "doctor",
    "predict",
    "predicted_run_seconds",
    "rerun",
    "archive",
    "Job",
    "RunStatus",
    "Logs",
    "Report",
    "ReportGroup",
    "ReportPoint",
    "Spread",
    "BudgetRow",
    "SetApartRun",
    "RcpRow",
    "ResultRow",
    "SiteInfo",
    "ImageInfo",
    "Check",
    "Doctor",
    "Prediction",
    "PredictionRow",
    "LeftOutRun",
    "Table",
    "StudyPlan",
    "StudyCheck",
    "Comparison",
    "CompareRow",
    "Rerun",
    "Archive",
)
_ERRORS = ("DlaunchError", "DlaunchWarning", "DlaunchNote")
__all__ = list(_API + _ERRORS) + ["api"]


def __getattr__(name: str) -> Any:
    """The API's names, loaded on first use (the imports here are the package's only ones)."""
    if name == "api" or name in _API:
        import dlaunch.api as api  # an import statement: tests/test_architecture.py sees it

        return api if name == "api" else getattr(api, name)
    if name in _ERRORS:
        import dlaunch.errors as errors

        return getattr(errors, name)
    if name == "__version__":
        import dlaunch.version as version

        return version.__version__
    raise AttributeError("module 'dlaunch' has no attribute %r" % name)


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
