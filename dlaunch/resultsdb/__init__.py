"""The results database: one row per finished run across experiments (`store.py`), comparisons of
two sets of runs (`compare.py`), and the `dlaunch results` commands (`command.py`)."""
