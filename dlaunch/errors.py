"""Errors the CLI turns into one-line messages (`dlaunch: error: ...`), and the Python API raises
(`dlaunch.DlaunchError`: `str(error)` is the line after `dlaunch: error: `, `error.exit_code` its exit code)."""


class DlaunchError(Exception):
    """Bad input (a flag, a file, a field): exit code 2, nothing written or submitted."""

    exit_code = 2


class SchedulerError(DlaunchError):
    """The scheduler refused or did not answer (sbatch, squeue, scancel): exit code 1."""

    exit_code = 1


class DlaunchWarning(UserWarning):
    """Something the user should know that stops nothing (a results database that cannot be written): the
    API issues it with `warnings.warn`, the CLI prints it as `dlaunch: warning: ...`."""

    label = "warning"


class DlaunchNote(DlaunchWarning):
    """Something the user may want to know (a selector that matches nothing): `dlaunch: note: ...`."""

    label = "note"
