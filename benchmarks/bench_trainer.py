"""The trainer's overhead against the bare PyTorch loop, and 1 vs 2 gloo ranks, on this machine's CPU.

  .venv/bin/python benchmarks/bench_trainer.py [--model resnet50] [--image-size 96] [--batch-size 16]
      [--steps 20] [--warmup-steps 5] [--threads 1] [--repeats N] [--amp none|bf16]
      [--compile MODE] [--optimizer-impl default|foreach|fused] [--host-syncs default|minimal]

1. trainer: `python -m dlaunch.train` (DDP, synthetic data, 1 process) reports images/s over the steps after
   the warm-up steps; bare: benchmarks/bare_loop_gpu.py --device cpu (the loop gpu_validate.sh pairs the trainer
   with on a GPU: the same model, batch, parameter groups, SGD, label-smoothed loss and workload options) in a fresh
   process with the same threads (OMP_NUM_THREADS), timed over the same steps. Ratio = trainer / bare (goal >= 0.98).
2. scaling: the trainer with 1 rank and with 2 gloo ranks (torchrun, the same batch per rank and
   threads per rank); E_2 = (T_2 / T_1) / 2 with T = images/s of the whole job.
The workload options go to every run; with --compile the table adds each run's compile time (the bare loop's
first step, the trainer's `compile_s`), which no images/s includes.
Prints a table and writes benchmarks/results/bench_trainer.json (atomically).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import save_results  # noqa: E402

from dlaunch.train.config import COMPILE_MODES, HOST_SYNCS, OPTIMIZER_IMPLS  # noqa: E402
from dlaunch.train.metrics_schema import read_metrics  # noqa: E402

BARE_LOOP = os.path.join(ROOT, "benchmarks", "bare_loop_gpu.py")


def environment(threads: int) -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS=str(threads))


def shared_options(args: argparse.Namespace) -> List[str]:
    """The options both loops take with the same meaning."""
    return ["--model", args.model, "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
            "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps), "--device", "cpu", "--amp", args.amp,
            "--compile", args.compile, "--optimizer-impl", args.optimizer_impl, "--host-syncs", args.host_syncs]


def run_trainer(args: argparse.Namespace, nproc: Optional[int], workdir: str) -> Tuple[float, Optional[float]]:
    """images/s of the whole job as the trainer measured it, and its compile_s (None without --compile)."""
    metrics_path = os.path.join(workdir, "trainer-%s.jsonl" % (nproc or 1))
    if os.path.exists(metrics_path):  # an earlier repeat's
        os.unlink(metrics_path)
    launcher = [sys.executable] if nproc is None else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    command = launcher + ["-m", "dlaunch.train"] + shared_options(args) + [
        "--num-classes", "1000", "--steps-per-epoch", str(args.steps), "--threads", str(args.threads),
        "--metrics", metrics_path]
    subprocess.run(command, cwd=ROOT, env=environment(args.threads), check=True, stdout=subprocess.DEVNULL)
    [epoch] = read_metrics(metrics_path).epochs
    return epoch["images_per_s"], epoch.get("compile_s")


def run_bare(args: argparse.Namespace) -> Tuple[float, Optional[float]]:
    """images/s of benchmarks/bare_loop_gpu.py on the CPU, and its first step's seconds under --compile."""
    out = subprocess.run([sys.executable, BARE_LOOP] + shared_options(args), cwd=ROOT, env=environment(args.threads),
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    result: Dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result["images_per_s"], result["first_step_s"] if args.compile != "off" else None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (rank)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each variant; the best is kept")
    p.add_argument("--amp", choices=("none", "bf16"), default="none")
    p.add_argument("--compile", choices=COMPILE_MODES, default="off")
    p.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="default")
    p.add_argument("--host-syncs", choices=HOST_SYNCS, default="default")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        runs = {"bare": lambda: run_bare(args), "trainer": lambda: run_trainer(args, None, workdir),
                "trainer 2 ranks": lambda: run_trainer(args, 2, workdir)}
        best = {name: 0.0 for name in runs}
        compile_s: Dict[str, List[Optional[float]]] = {name: [] for name in runs}
        for _ in range(args.repeats):  # interleaved, so a noisy neighbour hurts every variant alike
            for name, run in runs.items():
                images_per_s, seconds = run()
                best[name] = max(best[name], images_per_s)
                compile_s[name].append(seconds)
    ratio = best["trainer"] / best["bare"]
    efficiency = (best["trainer 2 ranks"] / best["trainer"]) / 2
    saved = save_results("bench_trainer", {"settings": vars(args), "images_per_s": best, "trainer_over_bare": ratio,
                                           "E_2": efficiency, "compile_s": compile_s if args.compile != "off" else None})
    options = " ".join("--%s %s" % (k.replace("_", "-"), v) for k, v in vars(args).items()
                       if k in ("amp", "compile", "optimizer_impl", "host_syncs"))
    table = Table(title="%s %dpx, batch %d/rank, %d steps (%d warm-up), %d thread(s)/rank, CPU, %s"
                  % (args.model, args.image_size, args.batch_size, args.steps, args.warmup_steps, args.threads, options))
    table.add_column("run")
    table.add_column("images/s", justify="right")
    table.add_column("", justify="right")
    if args.compile != "off":
        table.add_column("compile s (each repeat)", justify="right")
    rows = (("bare loop (bare_loop_gpu.py), 1 process", "bare", ""),
            ("trainer (DDP), 1 rank", "trainer", "trainer/bare = %.3f" % ratio),
            ("trainer (DDP, gloo), 2 ranks", "trainer 2 ranks", "E_2 = %.3f" % efficiency))
    for label, name, note in rows:
        cells = [label, "%.2f" % best[name], note]
        if args.compile != "off":
            cells.append(", ".join("%.1f" % s for s in compile_s[name] if s is not None))
        table.add_row(*cells)
    Console().print(table)
    print("wrote %s" % os.path.relpath(saved, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
