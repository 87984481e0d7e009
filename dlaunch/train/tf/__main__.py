"""`python -m dlaunch.train.tf --framework tf-allreduce|tf-ps-async ...`: one task of a TensorFlow job's step.

Every task derives its role and TF_CONFIG from the job's task variables (dlaunch/train/engines.py, dlaunch/train/jobenv.py). Workers and
parameter servers of `tf-ps-async` serve until the chief's port closes (the chief has finished or
died), then exit 0. Exit codes as dlaunch/train/config.py; the metrics file is written by worker 0
(`tf-allreduce`) or the chief (`tf-ps-async`).
"""

import os
import sys

from dlaunch.train.signals import StopSignals

StopSignals().install()  # before the slow imports (see dlaunch/train/signals.py)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from dlaunch.train.config import EXIT_BAD_INPUT, ConfigError  # noqa: E402
from dlaunch.train.engines import engine_config  # noqa: E402


def main() -> int:
    try:
        cfg, mode, layout = engine_config(sys.argv[1:], "tensorflow", os.environ)
    except ConfigError as e:
        print("dlaunch.train.tf: error: %s" % e, file=sys.stderr)
        return EXIT_BAD_INPUT
    from dlaunch.train.tf.trainer import run

    return run(cfg, sys.argv[1:], mode, layout)


if __name__ == "__main__":
    sys.exit(main())
