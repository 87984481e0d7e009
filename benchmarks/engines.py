"""TensorFlow vs PyTorch vs MXNet, all-reduce and parameter server, synchronous and asynchronous:
images/s of the same model, batch and steps with 2 worker processes on this machine's CPUs
(the shape of seed 003's CPU-cluster comparison).

  .venv/bin/python benchmarks/engines.py [--model resnet44] [--image-size 32] [--batch-size 32]
      [--steps 30] [--warmup-steps 5] [--threads 1] [--repeats 1] [--modes ddp,tf-allreduce,...]

Every mode is a real trainer run: `ddp` through torchrun, the task-per-worker modes as one process per
task (coordinator and server tasks beside the 2 workers, as srun would start them; the local scheduler's
step, dlaunch/schedulers/local.py).
images/s is the trainer's own whole-job figure (after the warm-up steps) from its metrics file; with
--repeats > 1 runs are interleaved and the fastest counts (other processes share the machine).
Coordinator and server processes share the same CPUs as the workers: on one machine a parameter
server costs CPU that a cluster would give it on other cores or nodes.
Prints a table (and the seed's ratios beside ours) and writes benchmarks/results/engines.json.
"""
import argparse
import os
import sys
import tempfile
from typing import Dict, List, Optional

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import save_results  # noqa: E402

from dlaunch.analysis.published import read_published_row  # noqa: E402
from dlaunch.paths import PUBLISHED_DIR  # noqa: E402
from dlaunch.schedulers.local import run_step  # noqa: E402
from dlaunch.train.framework_table import FRAMEWORKS  # noqa: E402
from dlaunch.train.metrics_schema import read_metrics  # noqa: E402

WORKERS = 2
PYTHONS = {"tensorflow": os.path.join(ROOT, ".venv-tf", "bin", "python"),
           "mxnet": os.path.join(ROOT, ".venv-mx", "bin", "python"), "torch": sys.executable}
MODES = ("ddp", "tf-allreduce", "mx-allreduce", "torch-ps-sync", "mx-ps-sync", "tf-ps-async", "torch-ps-async",
         "mx-ps-async")
# Seed 003's published ratios (data/published/cpu_ps_ratios.csv, row `comparison`), and the pair of our
# modes each compares (faster images/s over slower images/s), as studies/cpu-ps.toml draws them.
SEED_RATIOS = (
    ("sync: TensorFlow slower than PyTorch", "tensorflow-vs-pytorch", "ddp", "tf-allreduce"),
    ("sync: PyTorch slower than MXNet", "pytorch-vs-mxnet", "mx-ps-sync", "torch-ps-sync"),
    ("async: MXNet faster than TensorFlow", "mxnet-vs-tensorflow", "mx-ps-async", "tf-ps-async"),
)


def run_mode(mode: str, args: List[str], timeout: float) -> Optional[float]:
    """images/s of one run (None, with the reason printed, when it failed)."""
    row = FRAMEWORKS[mode]
    python = PYTHONS[row.engine]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    for name in ("WORLD_SIZE", "RANK", "MASTER_PORT", "TF_CONFIG"):
        env.pop(name, None)
    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(tmp, "output"), "w+") as output:
        metrics = os.path.join(tmp, "metrics.jsonl")
        flags = ["--framework", mode] + args + ["--metrics", metrics]
        if row.launch == "task-per-worker":
            codes = run_step([python, "-m", row.entry] + flags, WORKERS + row.coordinators + row.servers_per_node,
                             env, output, ROOT, timeout).codes
        else:
            codes = run_step([python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                              str(WORKERS), "-m", "dlaunch.train"] + flags, 1, env, output, ROOT, timeout).codes
        if any(codes):
            output.seek(0)
            print("%s: exit codes %s:\n%s" % (mode, codes, output.read()[-2000:]), file=sys.stderr)
            return None
        epochs = read_metrics(metrics).epochs
        images = sum(e["images"] for e in epochs)
        seconds = sum(e["images"] / e["images_per_s"] for e in epochs if e["images_per_s"] > 0)
        return images / seconds


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet44", choices=("resnet44", "resnet50"))
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    unknown = [m for m in modes if m not in FRAMEWORKS]
    if unknown:
        p.error("--modes: unknown %s" % ", ".join(unknown))
    args = ["--model", a.model, "--image-size", str(a.image_size), "--num-classes", "10", "--batch-size",
            str(a.batch_size), "--steps", str(a.steps), "--steps-per-epoch", str(a.steps), "--warmup-steps",
            str(a.warmup_steps), "--threads", str(a.threads), "--device", "cpu", "--workers", "1"]
    best: Dict[str, Optional[float]] = {m: None for m in modes}
    for repeat in range(a.repeats):
        for mode in modes:
            print("run %d/%d: %s" % (repeat + 1, a.repeats, mode), file=sys.stderr)
            value = run_mode(mode, args, a.timeout)
            if value is not None and (best[mode] is None or value > best[mode]):
                best[mode] = value

    console = Console()
    table = Table(title="%d workers, %s %dpx, batch %d/worker, %d steps (%d warm-up), %d thread(s)/process"
                  % (WORKERS, a.model, a.image_size, a.batch_size, a.steps, a.warmup_steps, a.threads))
    for column in ("mode", "engine", "architecture", "sync", "images/s"):
        table.add_column(column, justify="right" if column == "images/s" else "left")
    for mode in modes:
        row = FRAMEWORKS[mode]
        table.add_row(mode, row.engine, row.architecture, "sync" if row.synchronous else "async",
                      "failed" if best[mode] is None else "%.1f" % best[mode])
    console.print(table)
    ratios = Table(title="ratios: seed 003 vs this machine")
    for column in ("comparison", "seed", "ours", "modes"):
        ratios.add_column(column)
    ratio_rows = []
    for label, comparison, fast, slow in SEED_RATIOS:
        seed = read_published_row(PUBLISHED_DIR / "cpu_ps_ratios.csv", "ratio", {"comparison": comparison})
        ours = best.get(fast) / best[slow] if best.get(fast) and best.get(slow) else None
        ratio_rows.append({"comparison": label, "seed": seed, "ours": ours, "faster": fast, "slower": slow})
        ratios.add_row(label, "%.2fx" % seed, "-" if ours is None else "%.2fx" % ours, "%s / %s" % (fast, slow))
    console.print(ratios)
    path = save_results("engines", {"settings": vars(a), "images_per_s": best, "ratios": ratio_rows})
    print("results: %s" % path)
    return 0 if all(v is not None for v in best.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
