"""`python -m dlaunch.train`: parse and validate the command line, run the trainer, exit with its code.

Exit codes: 0 ok, 2 bad input (one line `train: error: ...` on stderr, nothing written), 65 diverged,
75 interrupted by SIGUSR1 (resumable), 143 cancelled by SIGTERM, other non-zero: failed.
A job that its scheduler started again (requeued after a node failure or a preemption), or whose script started
training again after a hang (DLAUNCH_RETRY), resumes by itself.
"""

import os
import sys
from typing import List, Optional

from dlaunch.train.signals import StopSignals

StopSignals().install()  # before the slow imports: a stop signal sent during start-up is kept, not lost

from dlaunch.train.config import EXIT_BAD_INPUT, ConfigError, parse_config  # noqa: E402
from dlaunch.train.jobenv import restart_count, retry_count  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if (restart_count(os.environ) or retry_count(os.environ)) and "--resume" not in argv:
            argv.append("--resume")  # the same job again: continue its metrics and checkpoint
        cfg = parse_config(argv)
        from dlaunch.train.frameworks import get_framework

        framework = get_framework(cfg.framework)
    except ConfigError as e:
        print("train: error: %s" % e, file=sys.stderr)
        return EXIT_BAD_INPUT
    from dlaunch.train.loop import run

    return run(cfg, argv, framework)


if __name__ == "__main__":
    sys.exit(main())
