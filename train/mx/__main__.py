"""`python -m train.mx --framework mx-ps-sync|mx-ps-async ...`: one Slurm task of an MXNet job.

The task's role (train/engines.py) becomes ps-lite's DMLC_* variables before mxnet is imported: the
scheduler and the servers run inside `import mxnet` and return when the workers have finished.
The metrics file is written by worker 0.
"""
import os
import socket
import sys
from typing import Dict

from train.signals import StopSignals

StopSignals().install()  # before the slow imports (see train/signals.py)

from train.config import EXIT_BAD_INPUT, EXIT_OK, ConfigError  # noqa: E402
from train.engines import COORDINATOR, SERVER, WORKER, TaskLayout, engine_config  # noqa: E402

DMLC_ROLES = {COORDINATOR: "scheduler", SERVER: "server", WORKER: "worker"}


def dmlc_environment(layout: TaskLayout) -> Dict[str, str]:
    """ps-lite's variables: the scheduler's address (task 0), the counts, this task's role and address."""
    scheduler = layout.ids(COORDINATOR)[0]
    return {"DMLC_ROLE": DMLC_ROLES[layout.role],
            "DMLC_PS_ROOT_URI": socket.gethostbyname(layout.hosts[scheduler]),
            "DMLC_PS_ROOT_PORT": str(layout.ports[scheduler]),
            "DMLC_NUM_SERVER": str(len(layout.ids(SERVER))), "DMLC_NUM_WORKER": str(layout.num_workers),
            "DMLC_NODE_HOST": socket.gethostbyname(layout.hosts[layout.task])}


def main() -> int:
    try:
        cfg, mode, layout = engine_config(sys.argv[1:], "mxnet", os.environ)
    except ConfigError as e:
        print("train.mx: error: %s" % e, file=sys.stderr)
        return EXIT_BAD_INPUT
    os.environ.update(dmlc_environment(layout))
    os.environ["OMP_NUM_THREADS"] = str(layout.threads(cfg.threads))
    if layout.role != WORKER:
        import mxnet  # noqa: F401  (runs the scheduler or server until the workers finish)
        return EXIT_OK
    from train.mx.trainer import run
    return run(cfg, sys.argv[1:], mode, layout)


if __name__ == "__main__":
    sys.exit(main())
