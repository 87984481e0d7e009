"""Metrics files -> figures: runs, scaling groups, S_G and E_G (`scaling.py`), an epoch record's per-rank phases,
nodes and overhead (`phases.py`), the straggler judgement (`stragglers.py`), the efficiency budget (`budget.py`), the
measurement-quality verdict (`quality.py`), convergence against MLPerf's RCPs (`convergence.py`), the published values
a study compares with (`published.py`) and the performance model (`perfmodel/`)."""
