"""The performance model against Aach et al. 2023, Table 2a (ResNet-50, PyTorch DDP, JUWELS Booster).

    .venv/bin/python benchmarks/bench_perfmodel.py

For the DALI and the native loader column it calibrates the ring all-reduce model's effective
latency and bandwidths (launcher.perfmodel.calibrate) on (a) every GPU count and (b) the counts up
to 64 GPUs only, predicting 128 and more (the question before a large allocation), and prints the
published comm share, the predicted one and their difference per GPU count, with max and mean
absolute errors. Shares are comm / (comm + I/O + compute): the published kernel-time percentages
renormalised to those three parts. Shares do not depend on the absolute step time; the fitted
parameters are printed for an assumed compute + I/O time of STEP_S per step and scale with it.
Prints Markdown (recorded in benchmarks/README.md).
"""
from statistics import mean
from typing import List, Sequence

from launcher.perfmodel import PublishedRow, Workload, calibrate, gradient_bytes, load_published, predict

GPUS_PER_NODE = 4  # JUWELS Booster: 4 A100 per node
STEP_S = 0.1  # assumed compute + I/O time per step for printing absolute parameters
EXTRAPOLATE_FROM = 64  # fit (b) uses GPU counts up to this


def predicted_shares(rows: Sequence[PublishedRow], fit_rows: Sequence[PublishedRow], workload: Workload) -> List[float]:
    network = calibrate([(r.gpus, r.comm_share) for r in fit_rows], workload, GPUS_PER_NODE)
    print("- fit on %s GPUs: latency %.1f us per hop, %.1f Gbit/s per node, %.1f Gbit/s per GPU in a node"
          % (",".join(str(r.gpus) for r in fit_rows), network.latency_us, network.bandwidth_gbps_per_node,
             network.intra_node_gbps))
    return [p.comm_share for p in predict(workload, network, [r.gpus for r in rows])]


def errors_line(label: str, errors: Sequence[float]) -> str:
    absolute = [abs(e) for e in errors]
    return "%s: max %.1f pp, mean %.1f pp (%d GPU counts)" % (label, max(absolute), mean(absolute), len(absolute))


def main() -> None:
    workload = Workload(compute_s=STEP_S, batch=1, gradient_bytes=gradient_bytes("resnet50"))
    for loader, rows in load_published().items():
        print("### %s loader\n" % loader)
        small = [r for r in rows if r.gpus <= EXTRAPOLATE_FROM]
        fit_all = predicted_shares(rows, rows, workload)
        fit_small = predicted_shares(rows, small, workload)
        print("\n| GPUs | published comm %% | (a) fit all | error pp | (b) fit <= %d | error pp |" % EXTRAPOLATE_FROM)
        print("|---|---|---|---|---|---|")
        err_all, err_out = [], []
        for row, a, b in zip(rows, fit_all, fit_small):
            err_all.append(100 * (a - row.comm_share))
            err_b = 100 * (b - row.comm_share)
            if row.gpus > EXTRAPOLATE_FROM:
                err_out.append(err_b)
            print("| %d | %.1f | %.1f | %+.1f | %.1f | %+.1f%s |" % (
                row.gpus, 100 * row.comm_share, 100 * a, err_all[-1], 100 * b, err_b,
                "" if row.gpus > EXTRAPOLATE_FROM else " (fitted)"))
        print("\n- " + errors_line("(a) calibrated on all", err_all))
        print("- " + errors_line("(b) extrapolated beyond %d GPUs" % EXTRAPOLATE_FROM, err_out) + "\n")


if __name__ == "__main__":
    main()
