"""fake-ddp, a framework that exists only in tests (tests/test_added_backends.py adds it with this file and
`ROW` in `dlaunch.train.framework_table.FRAMEWORKS`): PyTorch DDP under another name, in an image group of its own.

Started as its row's entry (`torchrun ... -m fake_framework`), it adds its row to the table of the
trainer's process and runs the trainer.
"""
import sys

from dlaunch.train.framework_table import FRAMEWORKS, FrameworkInfo
from dlaunch.train.frameworks.ddp import DDP

ROW = FrameworkInfo("fake-ddp", "torch", "fake_framework:FakeDDP", "torchrun-per-node", "fake-ddp", "torch.distributed",
                    "torch with torch.distributed", "DDP under a test-only name", entry="fake_framework",
                    gradient_exchange="ddp-buckets")


class FakeDDP(DDP):
    name = "fake-ddp"


if __name__ == "__main__":
    FRAMEWORKS[ROW.name] = ROW
    from dlaunch.train.__main__ import main

    sys.exit(main())
