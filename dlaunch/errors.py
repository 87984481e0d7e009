"""Errors the CLI turns into one-line messages (`dlaunch: error: ...`)."""


class DlaunchError(Exception):
    """Bad input (a flag, a file, a field): exit code 2, nothing written or submitted."""

    exit_code = 2


class SchedulerError(DlaunchError):
    """The scheduler refused or did not answer (sbatch, squeue, scancel): exit code 1."""

    exit_code = 1
