"""DDP vs Horovod vs DeepSpeed on one synthetic workload: 2 ranks, a small ResNet, CPU.

  .venv/bin/python benchmarks/bench_frameworks.py [--model resnet44] [--image-size 32] [--batch-size 32]
      [--steps 40] [--warmup-steps 10] [--profile-steps 5] [--repeats 2]

Each variant is a real trainer run (`python -m dlaunch.train`, started by torchrun or horovodrun) of the same
model, data and schedule; images/s is the trainer's own measurement (whole job, after the warm-up
and profiled steps). Runs are repeated, interleaved, and the fastest counts (other processes share
the machine). The profiled steps split a step into compute and an explicit all-reduce of all
gradients (DeepSpeed ZeRO-1 cannot be profiled: its gradients are partitioned).
Prints a table and writes benchmarks/results/bench_frameworks.json.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import save_results  # noqa: E402

from dlaunch.train.metrics_schema import read_metrics  # noqa: E402

WORLD = 2
BIN = os.path.dirname(sys.executable)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
HOROVODRUN = [os.path.join(BIN, "horovodrun"), "-np", str(WORLD), "-H", "localhost:%d" % WORLD]
# name -> (launcher, trainer flags, extra environment)
VARIANTS = {
    "ddp": (TORCHRUN, ["--framework", "ddp"], {}),
    "horovod-gloo": (HOROVODRUN + ["--gloo"], ["--framework", "horovod"], {}),
    "horovod-mpi": (HOROVODRUN + ["--mpi"], ["--framework", "horovod"],
                      {"OMPI_MCA_btl": "self,tcp", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}),
    "deepspeed-z0": (TORCHRUN, ["--framework", "deepspeed", "--zero-stage", "0"], {}),
    "deepspeed-z1": (TORCHRUN, ["--framework", "deepspeed", "--zero-stage", "1"], {}),
}


def run_variant(name: str, repeat: int, args: argparse.Namespace, workdir: str) -> Dict[str, Any]:
    launcher, flags, extra_env = VARIANTS[name]
    metrics_path = os.path.join(workdir, "%s-%d.jsonl" % (name, repeat))
    profile = 0 if name == "deepspeed-z1" else args.profile_steps
    trainer = ["-m", "dlaunch.train", "--model", args.model, "--image-size", str(args.image_size), "--num-classes", "10",
               "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--steps-per-epoch", str(args.steps),
               "--warmup-steps", str(args.warmup_steps), "--profile-steps", str(profile), "--device", "cpu",
               "--threads", "1", "--metrics", metrics_path] + flags
    command = launcher + ([] if launcher is TORCHRUN else [sys.executable]) + trainer
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **extra_env)
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/dlaunch/torch_extensions"))
    result = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        return {"variant": name, "error": result.stdout[-2000:]}
    metrics = read_metrics(metrics_path)
    profile_record: Optional[Dict[str, Any]] = metrics.profiles[0] if metrics.profiles else None
    return {"variant": name, "images_per_s": metrics.epochs[-1]["images_per_s"],
            "step_s": profile_record["step_s"] if profile_record else None,
            "compute_s": profile_record["compute_s"] if profile_record else None,
            "comm_s": profile_record["comm_s"] if profile_record else None,
            "framework_settings": metrics.header.get("framework_settings"), "versions": metrics.header["versions"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet44")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2, help="runs per variant; the table shows the fastest")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = p.parse_args()
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in args.variants}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):  # interleaved, so a burst of load elsewhere hits all variants
            for name in args.variants:
                runs[name].append(run_variant(name, repeat, args, workdir))
    rows = [max(results, key=lambda r: r.get("images_per_s", -1.0)) for results in runs.values()]
    reference = next((r["images_per_s"] for r in rows if r["variant"] == "ddp" and "error" not in r), None)
    table = Table(title="%s at %d px, batch %d per rank, %d ranks on CPU, best of %d runs (%d steps, %d warm-up, "
                  "%d profiled)" % (args.model, args.image_size, args.batch_size, WORLD, args.repeats, args.steps,
                                    args.warmup_steps, args.profile_steps))
    for column in ("variant", "images/s", "vs DDP", "step ms", "compute ms", "all-reduce ms"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for r in rows:
        if "error" in r:
            table.add_row(r["variant"], "failed", "", "", "", "")
            continue
        ms = ["%.1f" % (1000 * r[k]) if r[k] is not None else "-" for k in ("step_s", "compute_s", "comm_s")]
        ratio = "%.2f" % (r["images_per_s"] / reference) if reference else "-"
        table.add_row(r["variant"], "%.1f" % r["images_per_s"], ratio, *ms)
    Console().print(table)
    for r in rows:
        if "error" in r:
            print("%s failed:\n%s" % (r["variant"], r["error"]), file=sys.stderr)
    print("wrote %s" % save_results("bench_frameworks", {"args": vars(args), "world_size": WORLD, "rows": rows,
                                                         "all_runs": runs}))


if __name__ == "__main__":
    main()
