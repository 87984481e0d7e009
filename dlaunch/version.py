"""dlaunch's version (pyproject.toml reads it; `dlaunch --version` and report.md's provenance print it)."""

__version__ = "0.1.0"
