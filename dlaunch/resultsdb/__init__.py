"""The results database: one row per finished run across experiments (`store.py`), and comparisons of
two sets of runs and history verdicts (`compare.py`); the `dlaunch results` commands are dlaunch/cli/results.py."""
