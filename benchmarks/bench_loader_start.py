"""What starting the native loader's worker processes costs at an epoch's start, by start method (issue 44 item 4).

  .venv/bin/python benchmarks/bench_loader_start.py [--workers 2] [--epochs 3] [--samples 1281167] [--repeats 3]

An epoch's start is `iter(loader)` up to its first batch (epochs of 4 batches, each read to its end), on the trainer's
training loader (dlaunch/train/data/folder.py:
ImageFolder, random-resized crop to 224 px, batch 32) over a generated JPEG folder whose sample list is made as long as
ImageNet's (`--samples`: as many distinct paths, `<file>#<n>`, each opening one of the folder's files): what a worker
receives with its dataset is as large as what a worker of an ImageNet run receives. Each way runs in a fresh process
(a fork server is started once per process):
  fork                 torch's default on Linux: workers forked from the trainer at every epoch (unsafe beside threads)
  forkserver           forked from a fork server at every epoch: the dataset pickled to each worker each epoch
  spawn                a new interpreter per worker at every epoch
  forkserver+persist   the trainer's way: from the fork server (torch, torchvision, the loader module preloaded), once
  spawn+persist        new interpreters, once
Of `--repeats` runs the fastest counts (the machine is shared). Prints a table (first epoch, later epochs' mean) and
writes benchmarks/results/bench_loader_start.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BATCHES_PER_EPOCH = 4
WAYS = ("fork", "forkserver", "spawn", "forkserver+persist", "spawn+persist")


def open_sample(path: str) -> Any:
    """The image a distinct path `<file>#<n>` stands for."""
    from torchvision.datasets.folder import default_loader

    return default_loader(path.rsplit("#", 1)[0])


def one_run(way: str, folder: str, args: argparse.Namespace) -> Dict[str, Any]:
    """In this (fresh) process: the seconds from iter() to the first batch, per epoch."""
    import torch

    from dlaunch.train.config import parse_config
    from dlaunch.train.data.folder import FORK_SERVER_PRELOAD, ResumableDistributedSampler, build_folder_loaders
    from dlaunch.train.frameworks.base import DistInfo

    torch.set_num_threads(1)
    cfg = parse_config(
        [
            "--data",
            folder,
            "--workers",
            str(args.workers),
            "--batch-size",
            "32",
            "--metrics",
            os.path.join(folder, "unused.jsonl"),
        ]
    )
    train = build_folder_loaders(cfg, DistInfo(0, 1, 0, 1, torch.device("cpu"))).train
    dataset = train.loader.dataset
    files = list(dataset.samples)
    # As many distinct paths as ImageNet's (a pickled list of repeated strings would be memoised to almost nothing).
    dataset.samples = dataset.imgs = [
        ("%s#%07d" % (files[i % len(files)][0], i), files[i % len(files)][1]) for i in range(args.samples)
    ]
    dataset.targets = [label for _, label in dataset.samples]
    import bench_loader_start  # by its name, so that a worker that unpickles the dataset finds the function

    dataset.loader = bench_loader_start.open_sample
    method, persist = (way.split("+") + [""])[:2]
    import multiprocessing

    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(FORK_SERVER_PRELOAD)
    sampler = ResumableDistributedSampler(dataset, 1, 0, shuffle=True, drop_last=True)
    sampler.skip = sampler.num_samples - BATCHES_PER_EPOCH * 32  # short epochs; the dataset keeps its whole list
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=32,
        sampler=sampler,
        num_workers=args.workers,
        multiprocessing_context=context,
        persistent_workers=bool(persist),
    )
    seconds = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        batches = iter(loader)
        next(batches)
        seconds.append(time.perf_counter() - start)
        for _ in batches:  # the rest of the epoch, as the trainer reads it
            pass
    return {"way": way, "epoch_start_s": seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1281167, help="length of the sample list (ImageNet's train set)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.folder, args)))
        return
    from benchlib import save_results
    from rich.console import Console
    from rich.table import Table

    from dlaunch.train.data.make_folder import make_pattern_folder

    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "jpegs")
        make_pattern_folder(folder, 4, 16, 4, 256)
        runs: Dict[str, List[List[float]]] = {way: [] for way in WAYS}
        for _ in range(args.repeats):  # interleaved, so that a busy moment does not fall on one way alone
            for way in WAYS:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--one",
                        way,
                        "--folder",
                        folder,
                        "--workers",
                        str(args.workers),
                        "--epochs",
                        str(args.epochs),
                        "--samples",
                        str(args.samples),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=dict(os.environ, PYTHONPATH=ROOT),
                )
                runs[way].append(json.loads(out.stdout.splitlines()[-1])["epoch_start_s"])
        for way in WAYS:
            first = min(r[0] for r in runs[way])
            later = min(sum(r[1:]) / len(r[1:]) for r in runs[way])
            rows.append({"way": way, "first_epoch_s": first, "later_epochs_s": later, "runs": runs[way]})
    table = Table(
        title="Epoch start (iter() to the first batch), %d workers, %d samples in the dataset"
        % (args.workers, args.samples)
    )
    for column in ("start method", "first epoch s", "later epochs s (mean)"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["way"], "%.2f" % r["first_epoch_s"], "%.2f" % r["later_epochs_s"])
    Console().print(table)
    import torch

    print(
        "wrote %s"
        % save_results(
            "bench_loader_start",
            {
                "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
                "args": vars(args),
                "rows": rows,
            },
        )
    )


if __name__ == "__main__":
    main()
