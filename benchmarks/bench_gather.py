"""The cost of the trainer's one gather per epoch (dlaunch/train/phases.py): measured here, estimated at scale.

  .venv/bin/python benchmarks/bench_gather.py [--repeats 2000] [--ranks 2,8,64,256,1024] [--gpus-per-node 4]

1. measured on this machine: 2 gloo processes call `gather_rows` (one all_reduce_sum of the [2 x K] float64
   table, the trainer's code) `--repeats` times, each after a barrier, as at an epoch's end; rank 0's seconds per
   call: median, 10th and 90th percentile. Rank 0's summary (`phase_fields` + `overhead_fields`, pure Python)
   is timed on rows of each rank count (ranks/--gpus-per-node hosts), and so is the host side of a gather of
   that size without its communication (building the table, reading it back with .tolist()).
2. estimated per rank count: NCCL's all-reduce of ranks x K x 8 bytes by dlaunch/analysis/perfmodel/nccl.py's
   model for JUWELS Booster's machine (perfmodel.AACH2023_MACHINE: 4 A100 per node, 4x HDR200 = 800 Gbit/s per
   node, 1.5 us fabric latency per inter-node step; NCCL 2.8-2.10's Simple-protocol latencies, the cheaper of ring
   and tree), plus the two host parts measured here.
Prints a table and writes benchmarks/results/bench_gather.json (atomically).
"""
import argparse
import os
import random
import socket
import statistics
import sys
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import save_results  # noqa: E402

from dlaunch.analysis.perfmodel.paper import AACH2023_MACHINE  # noqa: E402
from dlaunch.train.frameworks.base import ProcessGroupFramework  # noqa: E402
from dlaunch.train.phases import ROW, gather_rows, overhead_fields, phase_fields  # noqa: E402

CPU = torch.device("cpu")


def rank_main(rank: int, world_size: int, port: int, repeats: int, results: Any) -> None:
    """One gloo rank: `repeats` gathers, each after a barrier; rank 0 puts its seconds per gather on `results`."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world_size)
    framework = ProcessGroupFramework()
    framework.world_size = world_size
    row = [random.random() for _ in ROW]
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        began = time.perf_counter()
        gather_rows(framework.all_reduce_sum, row, rank, world_size, CPU)
        seconds.append(time.perf_counter() - began)
    if rank == 0:
        results.put(seconds)
    dist.barrier()
    dist.destroy_process_group()


def measured_gather(repeats: int) -> List[float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(rank_main, args=(2, port, repeats, results), nprocs=2, start_method="spawn")
    return results.get()


def synthetic_rows(ranks: int, gpus_per_node: int) -> Dict[str, Any]:
    """Rows and hosts of `ranks` ranks, `gpus_per_node` per host, with random phases (every rank timed 20 steps)."""
    rows = []
    for rank in range(ranks):
        values = dict(zip(ROW, (random.random() for _ in ROW)), steps=20.0, local_rank=float(rank % gpus_per_node))
        rows.append([values[name] for name in ROW])
    return {"rows": rows, "hosts": ["n%05d" % (rank // gpus_per_node) for rank in range(ranks)]}


def median_seconds(call: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def host_side(ranks: int) -> None:
    """The gather's host work at `ranks` ranks without the communication: the table built, one row set, read back."""
    table = torch.zeros((ranks, len(ROW)), dtype=torch.float64)
    table[0] = torch.tensor([0.0] * len(ROW), dtype=torch.float64)
    table.tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--ranks", default="2,8,64,256,1024", help="rank counts to estimate (comma-separated)")
    parser.add_argument("--gpus-per-node", type=int, default=4)
    args = parser.parse_args()
    random.seed(0)
    gather = measured_gather(args.repeats)
    deciles = statistics.quantiles(gather, n=10)
    measured = {"ranks": 2, "backend": "gloo (TCP, loopback)", "repeats": args.repeats, "row_floats": len(ROW),
                "median_s": statistics.median(gather), "p10_s": deciles[0], "p90_s": deciles[-1]}
    estimates = []
    for ranks in [int(r) for r in args.ranks.split(",")]:
        data = synthetic_rows(ranks, args.gpus_per_node)
        summary_s = median_seconds(lambda: (phase_fields(data["rows"], data["hosts"]),
                                            overhead_fields(data["rows"][0], 0.0)), 50)
        host_s = median_seconds(lambda: host_side(ranks), 50)
        nbytes = ranks * len(ROW) * 8
        nccl_s, algorithm = AACH2023_MACHINE.allreduce(ranks, nbytes)
        estimates.append({"ranks": ranks, "bytes": nbytes, "nccl_model_s": nccl_s, "algorithm": algorithm,
                          "host_s": host_s, "summary_s": summary_s, "total_s": nccl_s + host_s + summary_s})

    console = Console()
    table = Table(title="One phase gather on this machine: 2 gloo ranks, %d repeats, K = %d float64 per rank"
                  % (args.repeats, len(ROW)))
    for column in ("median ms", "10th percentile ms", "90th percentile ms"):
        table.add_column(column, justify="right")
    table.add_row(*("%.3f" % (measured[key] * 1e3) for key in ("median_s", "p10_s", "p90_s")))
    console.print(table)
    table = Table(title="Estimated per epoch: NCCL all-reduce (model, JUWELS Booster) + host parts measured here")
    for column in ("ranks", "bytes", "NCCL model ms", "algorithm", "host side ms", "rank 0 summary ms", "total ms"):
        table.add_column(column, justify="right")
    for row in estimates:
        table.add_row(str(row["ranks"]), str(row["bytes"]), "%.3f" % (row["nccl_model_s"] * 1e3), row["algorithm"],
                      "%.3f" % (row["host_s"] * 1e3), "%.3f" % (row["summary_s"] * 1e3), "%.3f" % (row["total_s"] * 1e3))
    console.print(table)
    path = save_results("bench_gather", {"command": " ".join(sys.argv), "measured": measured, "estimated": estimates,
                                         "machine_model": "perfmodel.AACH2023_MACHINE (JUWELS Booster)",
                                         "torch": torch.__version__})
    console.print("written: %s" % path)


if __name__ == "__main__":
    main()
