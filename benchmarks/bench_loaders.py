"""DALI (CPU pipeline) vs the native loader (ImageFolder + DataLoader): training images/s on one JPEG folder.

  .venv/bin/python benchmarks/bench_loaders.py [--images 512] [--size 256] [--image-size 224]
      [--batch-size 32] [--workers 1 2] [--epochs 3] [--repeats 2]

Both loaders run the trainer's training pipeline (decode, random-resized crop, flip, normalise) in
this process on the CPU, with the same number of workers: DataLoader worker processes for native,
pipeline threads for DALI. The first epoch is a warm-up (process start, page cache); the rest are
timed; of `--repeats` runs the fastest counts (other processes share the machine). Prints a table
and writes benchmarks/results/bench_loaders.json.
"""
import argparse
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

import torch
from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import save_results  # noqa: E402

from dlaunch.train.config import parse_config  # noqa: E402
from dlaunch.train.data import build_loaders  # noqa: E402
from dlaunch.train.data.make_folder import make_pattern_folder  # noqa: E402
from dlaunch.train.frameworks.base import DistInfo  # noqa: E402



def images_per_s(folder: str, loader: str, workers: int, args: argparse.Namespace) -> float:
    """Training images/s of `loader` over the timed epochs (after one warm-up epoch)."""
    cfg = parse_config(["--data", folder, "--loader", loader, "--dali-device", "cpu", "--workers", str(workers),
                        "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
                        "--metrics", os.path.join(folder, "unused.jsonl")])
    train = build_loaders(cfg, DistInfo(0, 1, 0, 1, torch.device("cpu"))).train
    images, seconds = 0, 0.0
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        start = time.perf_counter()
        count = sum(batch.shape[0] for batch, _ in train)
        if epoch > 0:
            images += count
            seconds += time.perf_counter() - start
    return images / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=512, help="training images in the generated folder")
    p.add_argument("--size", type=int, default=256, help="side of the generated JPEGs")
    p.add_argument("--image-size", type=int, default=224, help="crop fed to the model")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--epochs", type=int, default=3, help="including one warm-up epoch")
    p.add_argument("--repeats", type=int, default=2, help="runs per loader; the fastest counts")
    args = p.parse_args()
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first is a warm-up)")
    torch.set_num_threads(1)
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "jpegs")
        classes = 4
        make_pattern_folder(folder, classes, args.images // classes, 1, args.size)
        for workers in args.workers:  # repeats interleaved, the fastest counts (the machine is shared)
            native = max(images_per_s(folder, "native", workers, args) for _ in range(args.repeats))
            dali = max(images_per_s(folder, "dali", workers, args) for _ in range(args.repeats))
            rows.append({"workers": workers, "native_images_per_s": native, "dali_cpu_images_per_s": dali,
                         "speedup": dali / native})
    table = Table(title="Training loader throughput, %d %dx%d JPEGs -> %d px, batch %d (CPU)"
                  % (args.images, args.size, args.size, args.image_size, args.batch_size))
    for column in ("workers", "native img/s", "DALI-CPU img/s", "native /worker", "DALI /worker", "DALI/native"):
        table.add_column(column, justify="right")
    for r in rows:
        w = r["workers"]
        table.add_row(str(w), "%.1f" % r["native_images_per_s"], "%.1f" % r["dali_cpu_images_per_s"],
                      "%.1f" % (r["native_images_per_s"] / w), "%.1f" % (r["dali_cpu_images_per_s"] / w),
                      "%.2fx" % r["speedup"])
    Console().print(table)
    import nvidia.dali

    print("wrote %s" % save_results("bench_loaders", {
        "versions": {"torch": torch.__version__, "dali": nvidia.dali.__version__}, "args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
