"""Pre-flight's GEMM rate (issue 44, dlaunch/train/nodecheck.py) against the device's own rate, on one GPU (or a CPU).

  python3 benchmarks/bench_nodecheck.py [--rounds 3] [--device cuda]

Three ways of timing the same n x n FP16 GEMM (float32 on a CPU; n = nodecheck's size), interleaved `--rounds` times:
  check      nodecheck.check_device as shipped, with the GPU's NVML reasons sampled (dlaunch/train/gpuhealth.py)
  per-gemm   the loop pre-flight had before (a synchronisation and an NVML read after every product)
  reference  64 GEMMs back to back between two synchronisations, for at least 1 s, no NVML: what the device delivers
Prints a table (TFLOP/s, median and range) and writes benchmarks/results/bench_nodecheck.json.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlaunch.train import nodecheck


def loop_rate(device, size, min_seconds, batch, sample=lambda: None):
    """TFLOP/s of `batch` GEMMs enqueued between two synchronisations, `sample()` after each synchronisation, for at
    least `min_seconds` after one untimed GEMM."""
    import torch

    dtype = torch.float16 if device.type == "cuda" else torch.float32
    a = torch.rand(size, size, device=device, dtype=dtype) - 0.5
    b = torch.rand(size, size, device=device, dtype=dtype) - 0.5
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda device=None: None)
    a @ b
    sync(device)
    runs, started = 0, time.perf_counter()
    while runs == 0 or time.perf_counter() - started < min_seconds:
        for _ in range(batch):
            a @ b
        runs += batch
        sync(device)
        sample()
    return 2.0 * size**3 * runs / (time.perf_counter() - started) / 1e12


def per_gemm(device, size, min_seconds, sample):
    """The loop pre-flight used before the batched one: sync and sample after each product."""
    return loop_rate(device, size, min_seconds, 1, sample)


def reference(device, size, min_seconds):
    """What the device delivers: 64 GEMMs back to back between synchronisations (1 on a CPU), no NVML."""
    return loop_rate(device, size, min_seconds, 64 if device.type == "cuda" else 1)


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    size = nodecheck.GPU_SIZE if device.type == "cuda" else nodecheck.CPU_SIZE
    sample = lambda: None
    if device.type == "cuda":
        torch.cuda.set_device(device)
        from dlaunch.train.gpuhealth import GpuHealth

        sample = GpuHealth.for_device(device).sample
    rates = {"check": [], "per-gemm": [], "reference": []}
    for _ in range(args.rounds):
        rates["check"].append(nodecheck.check_device(device, size, nodecheck.MIN_SECONDS, sample)["tflops"])
        rates["per-gemm"].append(per_gemm(device, size, nodecheck.MIN_SECONDS, sample))
        rates["reference"].append(reference(device, size, nodecheck.MIN_SECONDS))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    ref = statistics.median(rates["reference"])
    print("device %s, n=%d, torch %s, %d rounds" % (name, size, torch.__version__, args.rounds))
    print("%-10s %12s %20s %14s" % ("timing", "TFLOP/s", "range", "of reference"))
    for key, values in rates.items():
        med = statistics.median(values)
        print("%-10s %12.4g %9.4g - %-9.4g %13.1f%%" % (key, med, min(values), max(values), 100 * med / ref))
    out = os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_nodecheck.json"), "w") as f:
        json.dump({"device": name, "size": size, "torch": torch.__version__, "tflops": rates}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
