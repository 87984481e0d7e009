"""The trainer's exit codes and its bad-input error (torch-free; the modules below config.py raise it too)."""

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: resumable, requeue
EXIT_CANCELLED = 143  # 128 + SIGTERM
EXIT_DIVERGED = 65  # EX_DATAERR: the run's settings or data make the loss non-finite
# EX_UNAVAILABLE: a process of the job stopped answering (dlaunch/train/watchdog.py); hang.json in the run directory
# names it. Resuming on the same nodes may hang again.
EXIT_HUNG = 69
# EX_NOHOST: pre-flight found fewer healthy nodes than the job needs (dlaunch/train/nodecheck.py); preflight.json in
# the run directory names the nodes left out and why. Nothing trained.
EXIT_TOO_FEW_NODES = 68


class ConfigError(ValueError):
    """Bad input: printed as one line `train: error: ...`, exit code 2."""
