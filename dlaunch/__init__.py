"""dlaunch: containerized multi-node launch toolkit for distributed deep-learning benchmarks.

`dlaunch.train` is the trainer that runs inside the images (`python -m dlaunch.train`, Python >= 3.9,
importable without the launcher); everything else is the launcher and its `dlaunch` command.
"""
__version__ = "0.1.0"
