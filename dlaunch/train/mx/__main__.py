"""`python -m dlaunch.train.mx --framework mx-ps-sync|mx-ps-async ...`: one task of an MXNet job's step.

The task's role (dlaunch/train/engines.py) becomes ps-lite's DMLC_* variables before mxnet is imported: the
scheduler and the servers run inside `import mxnet` and return when the workers have finished.
`mx-allreduce` (Horovod over gloo) has workers only; dlaunch/train/mx/trainer.py sets Horovod's variables.
The metrics file is written by worker 0.
"""

import os
import sys

from dlaunch.train.signals import StopSignals

StopSignals().install()  # before the slow imports (see dlaunch/train/signals.py)

from dlaunch.train import jobenv  # noqa: E402
from dlaunch.train.config import EXIT_BAD_INPUT, EXIT_OK, ConfigError  # noqa: E402
from dlaunch.train.engines import WORKER, engine_config  # noqa: E402
from dlaunch.train.mx.roles import dmlc_environment  # noqa: E402
from dlaunch.train.watchdog import Watchdog  # noqa: E402


def main() -> int:
    try:
        cfg, mode, layout = engine_config(sys.argv[1:], "mxnet", os.environ)
    except ConfigError as e:
        print("dlaunch.train.mx: error: %s" % e, file=sys.stderr)
        return EXIT_BAD_INPUT
    if mode.architecture == "parameter-server":
        os.environ.update(dmlc_environment(layout))
    else:
        # Horovod 0.28.1 cannot allreduce MXNet's oneDNN (MKLDNN) arrays: "Check failed: !IsMKLDNNData():
        # We can't generate TBlob for MKLDNN data" on the first gradient. MXNet's plain CPU kernels then.
        os.environ["MXNET_MKLDNN_ENABLED"] = "0"
    os.environ["OMP_NUM_THREADS"] = str(layout.threads(cfg.threads))
    if layout.role != WORKER:
        # It beats while mxnet's import serves (ps-lite's C++ runs without the GIL); no deadline of its own.
        watch = Watchdog(
            os.path.dirname(os.path.abspath(cfg.metrics_path)),
            cfg.hang_timeout,
            os.environ,
            jobenv.this_node(os.environ),
        ).start()
        watch.serving(layout.role)
        try:
            import mxnet  # noqa: F401  (runs the scheduler or server until the workers finish)
        finally:
            watch.stop()
        return EXIT_OK
    from dlaunch.train.mx.trainer import run

    return run(cfg, sys.argv[1:], mode, layout)


if __name__ == "__main__":
    sys.exit(main())
