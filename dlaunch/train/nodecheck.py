"""`python -m dlaunch.train.nodecheck`: pre-flight (issue 44), every node checked before training.

`check` (one task per node, in the job's image; the node named as the job's host list names it, dlaunch/train/jobenv.py):
a GEMM of fixed size on each of the node's GPUs (FP16, the tensor cores' figure; on a node without a GPU float32 on its
CPU), its rate in TFLOP/s and its product verified (Freivalds: C x against A (B x) in float32 with a random x; a GPU
that computes wrong numbers fails), and the GPU's NVML clock event reasons seen while it computed
(dlaunch/train/gpuhealth.py; hardware slowdown, thermal and power brake are failures) and the memory faults NVML
reports (row remapping pending or failed, retired pages pending, uncorrectable ECC errors), into `<dir>/<host>.json`, written
atomically. It exits 0 once it wrote its file, a crash of the check included (the file
names it): one node's failure must not end the other nodes' checks.

`fabric` (one task per node, after `check`; allocations of 2 nodes or more): the nodes' links, an all-reduce over all
of them and over neighbouring pairs (dlaunch/train/fabric.py), into `<dir>/fabric.json`; `select` leaves out a node
whose every pair falls short.

`select` (one process, after every node's check): reads the nodes' files of this attempt, judges each against the
thresholds it is given (the site profile's [preflight]), writes `preflight.json` (PREFLIGHT_SCHEMA) and prints the
chosen hosts, comma-separated: the first `--nodes` healthy ones in the allocation's order. Fewer healthy nodes than
that: nothing printed, exit EXIT_TOO_FEW_NODES. A node without a file of this attempt is named "no answer".
The rate threshold is `min_fraction` x the profile's expected per-GPU rate where it gives one (with its source),
else x the allocation's median node rate (a node's rate: its slowest GPU's); the record says which.

`select --after-hang RUN/hang.json --since T --retry K` (the job script, once its training step failed with a hang record
written after the step started at T): the same choice from the same node files, the nodes the hang record names (its
silent processes' hosts) failing with that reason, so the job trains again from its checkpoint on healthy nodes the
hang did not name (the spares, or nodes it trained on). The record gains `retry` and `earlier` (the selections before).
A hang record older than T, or one that names no node, gives no retry: nothing written, exit EXIT_HUNG, and the job
ends with its step's exit (the same nodes would meet the same hang). The nodes are not checked again: their check is
the job's first.
"""

import argparse
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

from dlaunch.train import jobenv
from dlaunch.train.errors import EXIT_HUNG, EXIT_OK, EXIT_TOO_FEW_NODES
from dlaunch.train.heartbeat import at_step, node_file_name, read_json, write_json_atomically

NODE_SCHEMA, PREFLIGHT_SCHEMA, VERSION = "dlaunch.preflight-node", "dlaunch.preflight", 1
PREFLIGHT_FILE = "preflight.json"
NODE_DIR = "preflight"  # the nodes' files, in the run directory
MAX_FILE_BYTES = 1 << 20
GPU_SIZE, CPU_SIZE = 8192, 1024  # the GEMM's n (n x n times n x n)
MIN_SECONDS = 1.0  # each device's timed GEMMs last at least this long (after one untimed)
# GEMMs enqueued between two synchronisations: a GPU that waits for the host after each product (and an NVML read) idles
# between them, 4 % of its rate on an H200 (623 against 649 TFLOP/s back to back; benchmarks/README.md, pre-flight).
BATCH = {"cuda": 16, "cpu": 1}
# Relative error of C x against A (B x) beyond which the product is wrong (FP16 products round at ~1e-3).
TOLERANCE = {"cuda": 2e-2, "cpu": 1e-3}
# NVML clock event reasons that fail a node (power cap and sync boost are a loaded GPU's normal state).
FAILING_THROTTLE = ("hardware slowdown", "thermal", "power brake")
HEALTHY, FAILED = "healthy", "failed"


def gemm(a: Any, b: Any) -> Any:
    """The product the check times and verifies (the seam a test's failpoint breaks)."""
    return a @ b


def check_device(device: Any, size: int, min_seconds: float, sample: Any = lambda: None) -> Dict[str, Any]:
    """One device's GEMM: its rate (TFLOP/s) and the relative error of its product; `sample()` once each batch of
    timed GEMMs is enqueued (the GPU's NVML reasons read while it computes: a slowdown under load may be gone once it
    idles)."""
    import torch

    on_gpu = device.type == "cuda"
    dtype = torch.float16 if on_gpu else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.rand(size, size, device=device, dtype=dtype, generator=generator) - 0.5
    b = torch.rand(size, size, device=device, dtype=dtype, generator=generator) - 0.5
    sync = torch.cuda.synchronize if on_gpu else (lambda device=None: None)
    product = gemm(a, b)
    sync(device)
    runs, started = 0, time.perf_counter()
    while runs == 0 or time.perf_counter() - started < min_seconds:
        for _ in range(BATCH[device.type]):
            product = gemm(a, b)
        runs += BATCH[device.type]
        sample()  # while the batch computes
        sync(device)
    seconds = time.perf_counter() - started
    x = torch.rand(size, 1, device=device, dtype=torch.float32, generator=generator) - 0.5
    expected = a.float() @ (b.float() @ x)
    error = float((product.float() @ x - expected).norm() / expected.norm())
    return {
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "size": size,
        "tflops": 2.0 * size**3 * runs / seconds / 1e12,
        "relative_error": error,
        "tolerance": TOLERANCE[device.type],
    }


def throttle_of(health: Any) -> Any:
    """The NVML clock event reasons a GpuHealth saw in any of its samples (a list), or 'unavailable: ...'."""
    from dlaunch.train.gpuhealth import MEASURED, REASONS, throttle_names

    vector = health.end_epoch()
    if int(vector[0]) != MEASURED:
        return "unavailable: %s" % REASONS.get(int(vector[0]), "reason %d" % int(vector[0]))
    return throttle_names(int(vector[3]))


def check_node(min_seconds: float = MIN_SECONDS) -> Dict[str, Any]:
    """This node's devices: every GPU it sees, else its CPU."""
    import torch

    if torch.cuda.is_available():
        devices = []
        for index in range(torch.cuda.device_count()):
            device = torch.device("cuda", index)
            torch.cuda.set_device(device)
            from dlaunch.train.gpuhealth import GpuHealth

            health = GpuHealth.for_device(device)
            figures = check_device(device, GPU_SIZE, min_seconds, health.sample)
            figures["name"] = torch.cuda.get_device_name(device)
            figures["throttle"] = throttle_of(health)
            figures["memory"] = health.memory_faults()
            devices.append(figures)
        return {"devices": devices}
    return {"devices": [check_device(torch.device("cpu"), CPU_SIZE, min_seconds)]}


def node_file(folder: str, host: str) -> str:
    return os.path.join(folder, node_file_name(host, 0))


def run_check(folder: str, attempt: str, host: str, min_seconds: float = MIN_SECONDS) -> Dict[str, Any]:
    """Check this node and write its file (a crash of the check is written as its `problem`)."""
    record: Dict[str, Any] = {"schema": NODE_SCHEMA, "version": VERSION, "host": host, "attempt": attempt}
    try:
        record.update(check_node(min_seconds), problem=None)
    except Exception as e:  # the check itself failed on this node: that is its verdict
        record.update(devices=[], problem="check failed: %s: %s" % (type(e).__name__, e))
    record["time"] = time.time()
    os.makedirs(folder, exist_ok=True)
    write_json_atomically(node_file(folder, host), record)
    return record


def node_rate(record: Dict[str, Any]) -> Optional[float]:
    """A node's rate: its slowest device's (None without devices)."""
    rates = [d["tflops"] for d in record.get("devices") or []]
    return min(rates) if rates else None


def judge(
    hosts: List[str],
    records: Dict[str, Optional[Dict[str, Any]]],
    needed: int,
    min_fraction: float,
    expected_tflops: Optional[float] = None,
    expected_source: str = "",
    named: Optional[Dict[str, List[str]]] = None,
) -> Dict[str, Any]:
    """The pre-flight record (PREFLIGHT_SCHEMA) of `hosts` from their node files (None: no answer); `named`: hosts a
    hang named, with why (they fail whatever their check said)."""
    rates = [r for r in (node_rate(rec) for rec in records.values() if rec and not rec.get("problem")) if r]
    basis: Dict[str, Any]
    if expected_tflops is not None:
        basis = {
            "expected_tflops_per_gpu": expected_tflops,
            "source": expected_source,
            "min_tflops": min_fraction * expected_tflops,
        }
    else:
        median = statistics.median(rates) if rates else None
        basis = {
            "expected_tflops_per_gpu": None,
            "source": "the allocation's median node rate (the profile gives no expected rate)",
            "median_tflops": median,
            "min_tflops": min_fraction * median if median is not None else None,
        }
    basis["min_fraction"] = min_fraction
    threshold = basis["min_tflops"]
    nodes = []
    for host in hosts:
        rec = records.get(host)
        reasons = node_reasons(rec, threshold, basis["source"]) + (named or {}).get(host, [])
        nodes.append(
            {
                "host": host,
                "verdict": FAILED if reasons else HEALTHY,
                "reasons": reasons,
                "tflops": node_rate(rec) if rec else None,
                "devices": rec.get("devices", []) if rec else [],
            }
        )
    healthy = [n["host"] for n in nodes if n["verdict"] == HEALTHY]
    chosen = healthy[:needed] if len(healthy) >= needed else []
    return {
        "schema": PREFLIGHT_SCHEMA,
        "version": VERSION,
        "time": time.time(),
        "needed": needed,
        "hosts": hosts,
        "threshold": basis,
        "nodes": nodes,
        "enough": len(healthy) >= needed,
        "chosen": chosen,
        "left_out": [{"host": n["host"], "reasons": n["reasons"]} for n in nodes if n["verdict"] == FAILED],
    }


def node_reasons(record: Optional[Dict[str, Any]], min_tflops: Optional[float], source: str) -> List[str]:
    """Why a node fails ([]: it passes), each with the figure measured and the threshold."""
    if record is None:
        return ["no answer: its check wrote no result for this attempt"]
    if record.get("problem"):
        return [str(record["problem"])]
    if not record.get("devices"):
        return ["no device checked"]
    reasons = []
    for d in record["devices"]:
        if not d["relative_error"] <= d["tolerance"]:  # NaN fails too
            reasons.append(
                "GEMM result wrong on %s: relative error %.3g > %.3g"
                % (d["device"], d["relative_error"], d["tolerance"])
            )
        if min_tflops is not None and d["tflops"] < min_tflops:
            reasons.append("GEMM rate on %s %.3g TFLOP/s < %.3g (%s)" % (d["device"], d["tflops"], min_tflops, source))
        throttle = d.get("throttle")
        failing = [t for t in throttle if t in FAILING_THROTTLE] if isinstance(throttle, list) else []
        if failing:
            reasons.append("NVML on %s: %s" % (d["device"], ", ".join(failing)))
        memory = d.get("memory")
        if isinstance(memory, list) and memory:
            reasons.append("NVML on %s: %s" % (d["device"], "; ".join(str(m) for m in memory)))
    return reasons


def hang_named(hang_file: str, since: float) -> Dict[str, List[str]]:
    """The nodes the run's hang record names (its silent processes' hosts) with why; {} when the record is missing,
    not one, written before `since` (an earlier step's), or names no node (then a retry would meet the same hang)."""
    from dlaunch.train.heartbeat import hang_record_problem

    record = read_json(hang_file, MAX_FILE_BYTES)
    if hang_record_problem(record) is not None:
        return {}
    if record["time"] < since:
        return {}
    named: Dict[str, List[str]] = {}
    for silent in record["silent"]:
        if silent.get("host"):
            named.setdefault(silent["host"], []).append(
                "named by the hang: rank %s %s, %s, phase %s (%s)"
                % (silent["rank"], silent["why"], at_step(silent["step"]), silent["phase"], os.path.basename(hang_file))
            )
    return named


def read_nodes(folder: str, hosts: List[str], attempt: str) -> Dict[str, Optional[Dict[str, Any]]]:
    """Each host's node file of this attempt (None: none, another attempt's, or not a node file)."""
    found: Dict[str, Optional[Dict[str, Any]]] = {}
    for host in hosts:
        record = read_json(node_file(folder, host), MAX_FILE_BYTES)
        ok = isinstance(record, dict) and record.get("schema") == NODE_SCHEMA and record.get("attempt") == attempt
        found[host] = record if ok and record.get("host") == host else None
    return found


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dlaunch.train.nodecheck", description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("check", "fabric", "select"))
    parser.add_argument("--dir", required=True, help="the nodes' files (the run directory's preflight/)")
    parser.add_argument("--attempt", required=True, help="this attempt's name (the job id and restart count)")
    parser.add_argument("--hosts", default="", help="select: the allocation's hosts, comma-separated")
    parser.add_argument("--nodes", type=int, default=0, help="select: the nodes the job trains on")
    parser.add_argument("--min-fraction", type=float, default=0.5)
    parser.add_argument("--fabric-min-fraction", type=float, default=None, help="select: the fabric's (fabric.py)")
    parser.add_argument("--expected-tflops", type=float, default=None)
    parser.add_argument("--expected-source", default="")
    parser.add_argument("--record", default="", help="select: where preflight.json goes")
    parser.add_argument("--after-hang", default="", help="select again after a hang: its record (hang.json)")
    parser.add_argument("--since", type=float, default=0.0, help="with --after-hang: when the hung step started")
    parser.add_argument("--retry", type=int, default=0, help="with --after-hang: which retry this is (1 on)")
    parser.add_argument("--master", default="", help="fabric: the host the nodes' process group meets at")
    parser.add_argument("--port", type=int, default=29501, help="fabric: its port")
    args = parser.parse_args(argv)
    if args.mode == "fabric" and not args.master:
        parser.error("fabric needs --master")
    if args.mode == "select" and (args.nodes < 1 or not args.hosts or not args.record):
        parser.error("select needs --hosts, --nodes >= 1 and --record")
    if not 0 < args.min_fraction <= 1:
        parser.error("--min-fraction must be in (0, 1]")
    if args.fabric_min_fraction is not None and not 0 < args.fabric_min_fraction <= 1:
        parser.error("--fabric-min-fraction must be in (0, 1]")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.mode == "check":
        run_check(args.dir, args.attempt, jobenv.this_node(os.environ))
        return EXIT_OK
    if args.mode == "fabric":
        from dlaunch.train.fabric import run_fabric

        task = jobenv.task(os.environ)
        run_fabric(args.dir, args.attempt, jobenv.node_hosts(os.environ), task.node_id, args.master, args.port)
        return EXIT_OK
    hosts = [h for h in args.hosts.split(",") if h]
    named: Dict[str, List[str]] = {}
    previous = read_json(args.record, MAX_FILE_BYTES) if args.after_hang else None
    if args.after_hang:
        named = hang_named(args.after_hang, args.since)
        if not named:
            print(
                "dlaunch: no retry: %s is missing, older than the step, or names no node (the same nodes would meet "
                "the same hang)" % args.after_hang,
                file=sys.stderr,
            )
            return EXIT_HUNG
    from dlaunch.train import fabric

    fabric_found, fabric_named = fabric.judge(
        read_json(os.path.join(args.dir, fabric.FABRIC_FILE), MAX_FILE_BYTES),
        hosts,
        args.attempt,
        fabric.MIN_FRACTION if args.fabric_min_fraction is None else args.fabric_min_fraction,
    )
    for host, reasons in fabric_named.items():
        named[host] = reasons + named.get(host, [])
    record = judge(
        hosts,
        read_nodes(args.dir, hosts, args.attempt),
        args.nodes,
        args.min_fraction,
        args.expected_tflops,
        args.expected_source,
        named,
    )
    record["fabric"] = fabric_found
    if args.after_hang:
        earlier = previous.get("earlier", []) if isinstance(previous, dict) else []
        if isinstance(previous, dict):
            earlier = list(earlier) + [{k: previous.get(k) for k in ("time", "retry", "chosen", "left_out")}]
        record.update(retry=args.retry, earlier=earlier)
    write_json_atomically(args.record, record)
    for left in record["left_out"]:
        print("dlaunch: pre-flight: %s left out: %s" % (left["host"], "; ".join(left["reasons"])), file=sys.stderr)
    if not record["enough"]:
        print(
            "dlaunch: pre-flight: %d healthy node(s) of the %d needed; the job ends before training"
            % (len(hosts) - len(record["left_out"]), args.nodes),
            file=sys.stderr,
        )
        return EXIT_TOO_FEW_NODES
    print(",".join(record["chosen"]), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    # The module as imported, not this `__main__` copy of it: one module object (a test's failpoint patches `gemm`).
    from dlaunch.train import nodecheck

    sys.exit(nodecheck.main())
