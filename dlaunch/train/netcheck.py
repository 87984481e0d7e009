"""`python -m dlaunch.train.netcheck`: a short all-reduce across the nodes, as the trainer would run it; prints
one JSON line with the transport each library selected (dlaunch/train/network.py) and the bus bandwidth.

`dlaunch doctor` starts it on every node of an allocation in the job's environment and image, with
MASTER_ADDR and MASTER_PORT of the job's rendezvous. Each node starts `--procs-per-node` processes
(one per GPU; NCCL on GPUs, Gloo on CPUs); rank = node rank x procs per node + local rank.
Bus bandwidth as nccl-tests defines it for all-reduce: busbw = S / t x 2 (n - 1) / n for S bytes
over n ranks in t seconds (the slowest rank's mean over the timed iterations), which is what each
rank's links carry and is comparable with a node's network bandwidth. The first process of every
node prints the line (the same on all nodes); the others print nothing.
"""

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional

WARMUP_ITERATIONS = 2


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dlaunch.train.netcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--procs-per-node", type=int, default=1)
    parser.add_argument(
        "--megabytes", type=float, default=None, help="message size in MiB (default: 64 on GPUs, 8 on CPUs)"
    )
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the other nodes")
    args = parser.parse_args(argv)
    if not 0 <= args.node_rank < args.nodes or args.procs_per_node < 1 or args.iterations < 1:
        parser.error("need 0 <= --node-rank < --nodes, --procs-per-node >= 1, --iterations >= 1")
    return args


def measure(local_rank: int, args: argparse.Namespace, debug_dir: str) -> None:
    """One rank: the all-reduce, its timing and the network records; the first rank prints them."""
    import torch
    import torch.distributed as dist

    from dlaunch.train.network import by_node, observe, route_nccl_debug

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        route_nccl_debug(os.environ, debug_dir)
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    world = args.nodes * args.procs_per_node
    rank = args.node_rank * args.procs_per_node + local_rank
    dist.init_process_group(
        "nccl" if on_gpu else "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout)
    )
    megabytes = args.megabytes if args.megabytes is not None else (64.0 if on_gpu else 8.0)
    buffer = torch.ones(int(megabytes * 2**20) // 4, dtype=torch.float32, device=device)
    for _ in range(WARMUP_ITERATIONS):
        dist.all_reduce(buffer)
    if on_gpu:
        torch.cuda.synchronize()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(args.iterations):
        dist.all_reduce(buffer)
    if on_gpu:
        torch.cuda.synchronize()
    seconds = torch.tensor([(time.perf_counter() - started) / args.iterations], dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    mine = observe(("nccl",) if on_gpu else ("gloo",), os.environ)
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    if local_rank == 0:
        size = buffer.numel() * buffer.element_size()
        bus = size / seconds.item() * 2 * (world - 1) / world
        result: Dict[str, Any] = {
            "nodes": args.nodes,
            "ranks": world,
            "bytes": size,
            "seconds": seconds.item(),
            "busbw_gbps": bus * 8 / 1e9,
            "device": device.type,
            "host": socket.gethostname(),
            "network": by_node(r for records in gathered for r in records),
        }
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    debug_dir = tempfile.mkdtemp(prefix="dlaunch-netcheck-")
    try:
        if args.procs_per_node == 1:
            measure(0, args, debug_dir)
        else:
            import torch.multiprocessing

            torch.multiprocessing.spawn(measure, args=(args, debug_dir), nprocs=args.procs_per_node)
    finally:
        shutil.rmtree(debug_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
