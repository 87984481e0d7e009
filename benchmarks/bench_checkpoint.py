"""How fast the trainer's checkpoint can be written at best: its own writer into memory, no file system.

  .venv/bin/python benchmarks/bench_checkpoint.py [--repeats 7] [--dir /dev/shm] [--models resnet50,resnet152]

The calibrated JUWELS model (dlaunch/analysis/perfmodel) assumes one checkpoint per epoch written at 1 GB/s. This
measures the ceiling of that rate independently of any file system: `save_checkpoint` (dlaunch/train/checkpoint.py:
torch.save, flush, fsync, rename) of the state the trainer keeps (the model's weights and SGD's momentum, fp32) into
`--dir` (default /dev/shm, memory), one thread, as one rank writes it. A write to a parallel file system adds to
this time; it cannot be faster than the serialisation. Prints a table and writes
benchmarks/results/bench_checkpoint.json (atomically).
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
import torchvision
from rich.console import Console
from rich.table import Table

from benchlib import save_results
from dlaunch.train.checkpoint import save_checkpoint


def trainer_state(model_name: str) -> dict:
    """A model's weights and its SGD momentum buffers, as after a step."""
    model = getattr(torchvision.models, model_name)()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--models", default="resnet50,resnet152")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = Table(title="save_checkpoint into %s, %d repeats, one thread" % (args.dir, args.repeats))
    for header in ("model", "MB", "median s", "min s", "GB/s at the median", "GB/s at the min"):
        table.add_column(header, justify="right")
    results = {}
    for name in args.models.split(","):
        state = trainer_state(name)
        with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
            path = os.path.join(scratch, "last.pt")
            seconds = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                save_checkpoint(path, state)
                seconds.append(time.perf_counter() - start)
            size = os.path.getsize(path)
        median, best = statistics.median(seconds), min(seconds)
        results[name] = {"bytes": size, "median_s": median, "min_s": best, "seconds": seconds}
        table.add_row(name, "%.0f" % (size / 1e6), "%.3f" % median, "%.3f" % best,
                      "%.2f" % (size / median / 1e9), "%.2f" % (size / best / 1e9))
    Console().print(table)
    print("load average: %.2f %.2f %.2f" % os.getloadavg())
    print("written:", save_results("bench_checkpoint", {"dir": args.dir, "repeats": args.repeats,
                                                        "load_average": os.getloadavg(), "models": results}))


if __name__ == "__main__":
    main()
