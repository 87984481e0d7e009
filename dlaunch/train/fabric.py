"""Pre-flight's fabric check (issue 44; `python -m dlaunch.train.nodecheck fabric`, one task per node of the
allocation, after the nodes' own checks): an all-reduce over all nodes, then over neighbouring pairs, to find a node
whose links fall short.

One process per node joins a process group (NCCL on a GPU node, one GPU; else gloo) at `--master`. Each measurement
is `WARMUP` untimed all-reduces of `nbytes` then `ITERATIONS` timed ones; a group's time is its slowest member's, and
its bus bandwidth nccl-tests' for an all-reduce: 2 (k - 1) / k x bytes / time per all-reduce (k members). The pairs
are each node with the next one in the allocation's order (the last with the first), run in rounds in which a node is
in one pair at most (2 rounds, 3 for an odd count), every pair of a round at once, as nccl-tests' per-pair runs do;
the rounds run PASSES times and each pair keeps its best figure.
Rank 0 writes `fabric.json` (FABRIC_SCHEMA) beside the nodes' files; a task that cannot join writes nothing, and
`select` then says the fabric was not measured.

`judge` (torch-free, in `select`): a node fails when every pair it is in (at least two: 3 nodes or more) is below
`min_fraction` (the profile's `fabric_min_fraction`, default MIN_FRACTION) x the median over nodes of each node's best pair (a slow node's best pair is slow, its neighbours'
is their other one: the median stays a healthy figure while fewer than half the nodes are slow, where the median pair
would not with 3 or 4 nodes). A slow pair alone does not say which of its two nodes is slow, and with 2 nodes nothing
can (the record then says so and names no node). The evidence is the figures, never a guess
(ezpz's guessed swaps retired healthy nodes: saforem2/ezpz#231).
"""

import os
import statistics
import time
from typing import Any, Dict, List, Optional, Tuple

FABRIC_SCHEMA, FABRIC_VERSION = "dlaunch.preflight-fabric", 1
FABRIC_FILE = "fabric.json"
WARMUP, ITERATIONS = 2, 5
PASSES = 2  # the pairs' rounds run this often; each pair keeps its best pass (one noisy pass names no node)
MIN_FRACTION = 0.25  # default: a node whose every pair is below a quarter of the nodes' median best pair fails
GPU_BYTES, CPU_BYTES = 256 << 20, 1 << 20  # 256 MiB: seconds on InfiniBand; 1 MiB: a TCP link of the test cluster
JOIN_TIMEOUT_S = 120


def pair_rounds(n: int) -> List[List[Tuple[int, int]]]:
    """The neighbouring pairs (i, i+1 mod n) of n nodes in rounds where a node is in one pair at most."""
    if n < 2:
        return []
    if n == 2:
        return [[(0, 1)]]
    pairs = [(i, (i + 1) % n) for i in range(n)]
    rounds = [[p for p in pairs[: n - (n % 2)] if p[0] % 2 == r] for r in (0, 1)]
    if n % 2:
        rounds.append([pairs[-1]])
    return [r for r in rounds if r]


def bus_gbps(members: int, nbytes: int, seconds_each: float) -> float:
    """nccl-tests' all-reduce bus bandwidth, GB/s."""
    return 2.0 * (members - 1) / members * nbytes / seconds_each / 1e9


def measure(rank: int, world: int, master: str, port: int, nbytes: Optional[int] = None) -> Dict[str, Any]:
    """This node's part of the fabric check; every rank returns the whole result (rank 0 writes it)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    backend = "nccl" if on_gpu else "gloo"
    nbytes = nbytes or (GPU_BYTES if on_gpu else CPU_BYTES)
    dist.init_process_group(
        backend,
        init_method="tcp://%s:%d" % (master, port),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=JOIN_TIMEOUT_S),
    )
    try:
        tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        sync = torch.cuda.synchronize if on_gpu else (lambda: None)

        def timed(group: Any, members: int) -> float:
            for _ in range(WARMUP):
                dist.all_reduce(tensor, group=group)
            sync()
            started = time.perf_counter()
            for _ in range(ITERATIONS):
                dist.all_reduce(tensor, group=group)
            sync()
            slowest = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            return bus_gbps(members, nbytes, float(slowest.item()) / ITERATIONS)

        everyone = timed(None, world)
        rounds = pair_rounds(world)
        groups = [[(pair, dist.new_group(list(pair))) for pair in pairs] for pairs in rounds]
        mine: List[Tuple[Tuple[int, int], float]] = []
        for _ in range(PASSES):
            for pairs in groups:
                for pair, group in pairs:
                    if rank in pair:
                        mine.append((pair, timed(group, 2)))
                dist.barrier()
        gathered: List[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        pairs_seen: Dict[Tuple[int, ...], float] = {}
        for found in gathered:
            for pair, gbps in found:
                pairs_seen[tuple(pair)] = max(gbps, pairs_seen.get(tuple(pair), 0.0))
        return {
            "backend": backend,
            "device": str(device),
            "bytes": nbytes,
            "iterations": ITERATIONS,
            "all_gbps": everyone,
            "pairs": [{"ranks": list(pair), "gbps": gbps} for pair, gbps in sorted(pairs_seen.items())],
        }
    finally:
        dist.destroy_process_group()


def run_fabric(folder: str, attempt: str, hosts: List[str], rank: int, master: str, port: int) -> Optional[str]:
    """Measure, and on rank 0 write fabric.json (atomically) with the hosts named; the file's path, or None."""
    from dlaunch.train.heartbeat import write_json_atomically

    record: Dict[str, Any] = {"schema": FABRIC_SCHEMA, "version": FABRIC_VERSION, "attempt": attempt, "hosts": hosts}
    try:
        found = measure(rank, len(hosts), master, port)
        for pair in found["pairs"]:
            pair["hosts"] = [hosts[r] for r in pair["ranks"]]
        record.update(found, problem=None)
    except Exception as e:  # a node that cannot join: rank 0 says so, the others leave it to rank 0
        record.update(problem="fabric check failed: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:300]))
    if rank != 0:
        return None
    path = os.path.join(folder, FABRIC_FILE)
    os.makedirs(folder, exist_ok=True)
    write_json_atomically(path, dict(record, time=time.time()))
    return path


def judge(
    record: Any, hosts: List[str], attempt: str, min_fraction: float
) -> Tuple[Dict[str, Any], Dict[str, List[str]]]:
    """(the fabric part of preflight.json, the nodes it names with why) from `record` (fabric.json as read)."""
    if len(hosts) < 2:
        return {"measured": False, "why": "one node: no fabric between nodes to check"}, {}
    if not isinstance(record, dict) or record.get("schema") != FABRIC_SCHEMA or record.get("attempt") != attempt:
        return {"measured": False, "why": "no fabric record of this attempt (its step did not finish)"}, {}
    if record.get("problem"):
        return {"measured": False, "why": str(record["problem"])}, {}
    pairs = [p for p in record.get("pairs") or [] if isinstance(p, dict) and isinstance(p.get("gbps"), (int, float))]
    by_host: Dict[str, List[Dict[str, Any]]] = {}
    for p in pairs:
        for host in p.get("hosts") or []:
            by_host.setdefault(host, []).append(p)
    # Each node's best pair: a slow node's best is slow, its neighbours' best (their other pair) is not.
    best = [max(p["gbps"] for p in mine) for mine in by_host.values()]
    median: Optional[float] = statistics.median(best) if best else None
    summary: Dict[str, Any] = {
        "measured": True,
        "backend": record.get("backend"),
        "bytes": record.get("bytes"),
        "all_gbps": record.get("all_gbps"),
        "median_best_pair_gbps": median,
        "min_gbps": None if median is None else min_fraction * median,
        "min_fraction": min_fraction,
        "pairs": [{"hosts": p.get("hosts"), "gbps": p["gbps"]} for p in pairs],
    }
    if median is None:
        return summary, {}
    threshold = min_fraction * median
    slow = [p for p in pairs if p["gbps"] < threshold]
    named: Dict[str, List[str]] = {}
    for host in hosts:
        mine = by_host.get(host, [])
        if len(mine) >= 2 and all(p in slow for p in mine):
            others = ", ".join("with %s %.3g GB/s" % ([h for h in p["hosts"] if h != host][0], p["gbps"]) for p in mine)
            named[host] = [
                "fabric: all-reduce %s < %.3g GB/s (%g x the nodes' median best pair, %.3g)"
                % (others, threshold, min_fraction, median)
            ]
    if slow and not named:
        summary["note"] = "slow pair(s) %s: not attributable to one node (%d nodes)" % (
            "; ".join("%s %.3g GB/s" % ("-".join(p["hosts"]), p["gbps"]) for p in slow),
            len(hosts),
        )
    return summary, named
