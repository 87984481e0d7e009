"""The input pipeline alone (no model): how many images/s one rank's training loader decodes and augments, per
loader and worker count, on this machine's CPU cores (or its GPU for `--dali-device gpu`). The figure a site
profile's `[[predict.input]]` row holds (docs/sites.md), measured where the training runs:

    python -m dlaunch.train.loaderbench --data IMAGENET --loader native --workers 8
    python -m dlaunch.train.loaderbench --data IMAGENET --loader dali --dali-device cpu --workers 8

It builds the trainer's own training loader (`build_loaders`, the same flags: --data, --loader, --dali-device,
--workers, --batch-size, --image-size) as rank 0 of 1, reads `--warmup-batches` batches (worker start-up, DALI's
pipeline build), then times `--batches` more, and prints one JSON line per worker count: images/s in all and per
worker, the batches, the CPU cores it could use and the CPU's name. The batches stay where the loader puts them
(the CPU, or the GPU for DALI's GPU pipeline); nothing trains on them.
"""

import argparse
import json
import os
import platform
import sys
import time
from typing import Any, Dict, List, Optional

from dlaunch.train.config import OneLineParser, parse_config
from dlaunch.train.errors import EXIT_BAD_INPUT, ConfigError


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def measure(trainer_argv: List[str], batches: int, warmup_batches: int) -> Dict[str, Any]:
    """One loader's training batches timed after `warmup_batches`: what `main` prints for it."""
    import torch

    from dlaunch.train.data import build_loaders
    from dlaunch.train.frameworks.base import DistInfo

    cfg = parse_config(trainer_argv)
    if cfg.synthetic:
        raise ConfigError("--data: give an image folder (or its TFRecords): synthetic data has no input pipeline")
    device = torch.device("cuda", 0) if cfg.loader == "dali" and cfg.dali_device == "gpu" else torch.device("cpu")
    loader = build_loaders(cfg, DistInfo(0, 1, 0, 1, device)).train
    loader.set_epoch(0)
    if batches + warmup_batches > len(loader):
        raise ConfigError(
            "--batches %d + --warmup-batches %d: the folder holds %d batches of %d"
            % (batches, warmup_batches, len(loader), cfg.batch_size)
        )
    images, start = 0, 0.0
    for index, (batch, _) in enumerate(loader):
        if index == warmup_batches:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        elif index > warmup_batches:
            images += batch.shape[0]
        if index == warmup_batches + batches:
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    loader_name = cfg.loader if cfg.loader == "native" else "dali-%s" % cfg.dali_device
    return {
        "loader": loader_name,
        "workers": cfg.workers,
        "batch": cfg.batch_size,
        "image_size": cfg.image_size,
        "images": images,
        "seconds": seconds,
        "images_per_s": images / seconds,
        "images_per_s_per_worker": images / seconds / max(1, cfg.workers),
        "cores": usable_cores(),
        "cpu": cpu_name(),
        "data": cfg.data,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m dlaunch.train.loaderbench",
        description="Images/s of the trainer's training input pipeline alone (decode + augmentation, no model).",
    )
    parser.add_argument("--data", required=True, help="ImageNet-layout folder, or its TFRecords (DALI)")
    parser.add_argument("--loader", default="native", choices=("native", "dali"))
    parser.add_argument("--dali-device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--workers", default="8", help="comma-separated worker processes (native) / threads (DALI)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batches", type=int, default=20, help="timed batches")
    parser.add_argument("--warmup-batches", type=int, default=3, help="batches read before the timing starts")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        counts = [int(w) for w in args.workers.split(",")]
    except ConfigError as e:
        print("loaderbench: error: %s" % e, file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError:
        print(
            "loaderbench: error: --workers: %r is not a comma-separated list of integers" % args.workers,
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.batches < 1 or args.warmup_batches < 0 or min(counts) < 1:
        print("loaderbench: error: --batches and --workers must be >= 1, --warmup-batches >= 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    for workers in counts:
        trainer_argv = [
            "--data", args.data, "--loader", args.loader, "--dali-device", args.dali_device,
            "--workers", str(workers), "--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
        ]  # fmt: skip
        try:
            print(json.dumps(measure(trainer_argv, args.batches, args.warmup_batches)), flush=True)
        except ConfigError as e:
            print("loaderbench: error: %s" % e, file=sys.stderr)
            return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
