"""The trainer's overhead against a bare PyTorch loop, and 1 vs 2 gloo ranks, on this machine's CPU.

  .venv/bin/python benchmarks/bench_trainer.py [--model resnet50] [--image-size 96] [--batch-size 16]
      [--steps 20] [--warmup-steps 5] [--threads 1]

1. trainer: `python -m dlaunch.train` (DDP, synthetic data, 1 process) reports images/s over the steps after
   the warm-up steps; bare: a plain loop of the same model, batch, threads, SGD and loss in a fresh
   process, timed over the same steps. Ratio = trainer / bare (goal >= 0.98).
2. scaling: the trainer with 1 rank and with 2 gloo ranks (torchrun, the same batch per rank and
   threads per rank); E_2 = (T_2 / T_1) / 2 with T = images/s of the whole job.
Prints a table and writes benchmarks/results/bench_trainer.json (atomically).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import save_results  # noqa: E402

from dlaunch.train.metrics_schema import read_metrics  # noqa: E402



def environment(threads: int) -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS=str(threads))


def run_trainer(args: argparse.Namespace, nproc: Optional[int], workdir: str) -> float:
    """images/s of the whole job as the trainer measured it."""
    metrics_path = os.path.join(workdir, "trainer-%s.jsonl" % (nproc or 1))
    if os.path.exists(metrics_path):  # an earlier repeat's
        os.unlink(metrics_path)
    launcher = [sys.executable] if nproc is None else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    command = launcher + ["-m", "dlaunch.train", "--model", args.model, "--image-size", str(args.image_size),
                          "--num-classes", "1000", "--batch-size", str(args.batch_size), "--steps", str(args.steps),
                          "--steps-per-epoch", str(args.steps), "--warmup-steps", str(args.warmup_steps),
                          "--threads", str(args.threads), "--device", "cpu", "--metrics", metrics_path]
    subprocess.run(command, cwd=ROOT, env=environment(args.threads), check=True, stdout=subprocess.DEVNULL)
    [epoch] = read_metrics(metrics_path).epochs
    return epoch["images_per_s"]


def bare_loop(model_name: str, image_size: int, batch_size: int, steps: int, warmup_steps: int, threads: int) -> float:
    """images/s of a plain PyTorch training loop (run in a fresh process by `--bare`)."""
    import torch
    import torchvision

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, model_name)(num_classes=1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    images = torch.randn(batch_size, 3, image_size, image_size)
    labels = torch.randint(0, 1000, (batch_size,))
    model.train()
    for step in range(steps):
        if step == warmup_steps:
            started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        criterion(model(images), labels).backward()
        optimizer.step()
    return (steps - warmup_steps) * batch_size / (time.perf_counter() - started)


def run_bare(args: argparse.Namespace) -> float:
    command = [sys.executable, os.path.abspath(__file__), "--bare", "--model", args.model, "--image-size",
               str(args.image_size), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
               "--warmup-steps", str(args.warmup_steps), "--threads", str(args.threads)]
    out = subprocess.run(command, cwd=ROOT, env=environment(args.threads), check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    return float(out.strip().splitlines()[-1])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (rank)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each variant; the best is kept")
    p.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.bare:
        print(bare_loop(args.model, args.image_size, args.batch_size, args.steps, args.warmup_steps, args.threads))
        return 0
    with tempfile.TemporaryDirectory() as workdir:
        best = {name: 0.0 for name in ("bare", "trainer", "trainer 2 ranks")}
        for _ in range(args.repeats):  # interleaved, so a noisy neighbour hurts every variant alike
            best["bare"] = max(best["bare"], run_bare(args))
            best["trainer"] = max(best["trainer"], run_trainer(args, None, workdir))
            best["trainer 2 ranks"] = max(best["trainer 2 ranks"], run_trainer(args, 2, workdir))
    ratio = best["trainer"] / best["bare"]
    efficiency = (best["trainer 2 ranks"] / best["trainer"]) / 2
    saved = save_results("bench_trainer", {"settings": {k: v for k, v in vars(args).items() if k != "bare"},
                                           "images_per_s": best, "trainer_over_bare": ratio, "E_2": efficiency})
    table = Table(title="%s %dpx, batch %d/rank, %d steps (%d warm-up), %d thread(s)/rank, CPU"
                  % (args.model, args.image_size, args.batch_size, args.steps, args.warmup_steps, args.threads))
    table.add_column("run")
    table.add_column("images/s", justify="right")
    table.add_column("", justify="right")
    table.add_row("bare PyTorch loop, 1 process", "%.2f" % best["bare"], "")
    table.add_row("trainer (DDP), 1 rank", "%.2f" % best["trainer"], "trainer/bare = %.3f" % ratio)
    table.add_row("trainer (DDP, gloo), 2 ranks", "%.2f" % best["trainer 2 ranks"], "E_2 = %.3f" % efficiency)
    Console().print(table)
    print("wrote %s" % os.path.relpath(saved, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
