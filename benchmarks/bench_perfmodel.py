"""The performance model against Aach et al. 2023, Table 2a (ResNet-50, PyTorch DDP, JUWELS Booster).

    .venv/bin/python benchmarks/bench_perfmodel.py

Fits only on the counts up to 64 GPUs and predicts 128-1024 (the question before a large allocation):
- new model (launcher.analysis.perfmodel): one machine fit (timing noise, NCCL kernels beside back-propagation)
  on the DALI column, the site's nominal network (800 Gbit/s per node, 1.5 us) unchanged; the native
  loader's data wait fitted on the native column with that machine; no storage ceiling (JUWELS
  Booster's is not known: see the sensitivity table, which is NOT out of sample);
- old model (v1, reproduced here for the comparison): ring all-reduce with a latency linear in the GPU
  count, effective latency and bandwidths fitted per column.
Prints Markdown: the comm share (comm / (comm + I/O + compute), the published kernel-time percentages
renormalised to those three parts) per GPU count with both models' errors, the native loader's errors
for assumed storage ceilings, and the E_G curves the new model predicts for ResNet-50/101/152 with
DALI and the native loader (recorded in benchmarks/README.md).
"""
from dataclasses import replace
from statistics import mean
from typing import List, Sequence

from launcher.analysis.perfmodel import (
    CALIBRATION_MAX_GPUS,
    PublishedRow,
    Workload,
    fit_published,
    gradient_bytes,
    load_published,
    predict,
    published_workload,
)

GPUS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
STEP_S = 0.1  # v1: assumed compute + I/O time per step (shares do not depend on it)
STORAGE_CEILINGS = [10e3, 20e3, 25e3, 30e3, 50e3, 100e3]  # images/s, assumed (sensitivity only)


def v1_shares(fit_rows: Sequence[PublishedRow], gpus: Sequence[int]) -> List[float]:
    """The v1 model: comm = 2(p-1) a + 2(p-1)/p S / B(p), B = intra-node inside 4 GPUs, else per-GPU share of the node."""
    import numpy as np

    size = gradient_bytes("resnet50")

    def features(p: int) -> List[float]:
        transfer = 2 * (p - 1) / p * size / STEP_S
        return [2 * (p - 1) / STEP_S, transfer if p <= 4 else 0.0, 0.0 if p <= 4 else transfer]

    a = np.array([features(r.gpus) for r in fit_rows])
    w = np.array([(1 - r.comm_share) ** 2 for r in fit_rows])
    y = np.array([r.comm_share / (1 - r.comm_share) for r in fit_rows])
    coef = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)[0]
    ratios = [float(np.dot(coef, features(p))) for p in gpus]
    return [x / (1 + x) for x in ratios]


def native(workload: Workload, data_fraction: float) -> Workload:
    """The native loader's workload: its fitted data wait, reading every sample as a file."""
    return replace(workload, data_s=data_fraction * workload.compute_s, reads_files=True)


def main() -> None:
    published = load_published()
    fit = fit_published()
    workload = published_workload()
    loaders = {"dali": workload, "native": native(workload, fit.native_data_fraction)}
    print("Machine fitted on the DALI column, %d-%d GPUs: timing noise %.3g s (delay spread sqrt(noise x busy "
          "time)), NCCL kernels beside back-propagation %.3f of it; native loader data wait %.3f x compute.\n"
          % (GPUS[0], CALIBRATION_MAX_GPUS, fit.machine.noise_s, fit.machine.beside_compute, fit.native_data_fraction))
    print("| loader | GPUs | published comm % | new model | error pp | old model (v1) | error pp |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for loader, rows in published.items():
        fit_rows = [r for r in rows if r.gpus <= CALIBRATION_MAX_GPUS]
        new = predict(loaders[loader], fit.machine, [r.gpus for r in rows])
        old = v1_shares(fit_rows, [r.gpus for r in rows])
        err_new, err_old = [], []
        for row, n, o in zip(rows, new, old):
            e_new, e_old = 100 * (n.comm_share - row.comm_share), 100 * (o - row.comm_share)
            fitted = row.gpus <= CALIBRATION_MAX_GPUS
            if not fitted:
                err_new.append(abs(e_new))
                err_old.append(abs(e_old))
            print("| %s | %d%s | %.1f | %.1f | %+.1f | %.1f | %+.1f |" % (
                loader, row.gpus, " (fitted)" if fitted else "", 100 * row.comm_share, 100 * n.comm_share, e_new,
                100 * o, e_old))
        summary.append("- %s, predicted %s GPUs: new model mean %.1f pp, max %.1f pp; old model mean %.1f pp, max %.1f pp"
                       % (loader, ",".join(str(r.gpus) for r in rows if r.gpus > CALIBRATION_MAX_GPUS),
                          mean(err_new), max(err_new), mean(err_old), max(err_old)))
    print("\n" + "\n".join(summary))
    rows = [r for r in published["native"] if r.gpus > CALIBRATION_MAX_GPUS]
    print("\nNative loader with an assumed storage ceiling (images/s the file system sustains for it; NOT out of "
          "sample: no cited value exists, so whichever row one picks is chosen knowing 128-512):\n")
    print("| storage ceiling images/s | " + " | ".join("error pp at %d" % r.gpus for r in rows) + " | mean pp | max pp |")
    print("|---|" + "---|" * (len(rows) + 2))
    for ceiling in [None] + STORAGE_CEILINGS:
        machine = replace(fit.machine, storage_images_per_s=ceiling)
        errors = [100 * (p.comm_share - r.comm_share) for p, r in zip(predict(loaders["native"], machine, [r.gpus for r in rows]), rows)]
        print("| %s | %s | %.1f | %.1f |" % ("none" if ceiling is None else "%.0f" % ceiling, " | ".join("%+.1f" % e for e in errors),
                                            mean(abs(e) for e in errors), max(abs(e) for e in errors)))
    print("\nPredicted E_G (new model, same machine fit; batch 64, compute from the A100 TF32 figure scaled by FLOPs):\n")
    print("| model | loader | " + " | ".join(str(g) for g in GPUS) + " |")
    print("|---|---|" + "---|" * len(GPUS))
    for model in ("resnet50", "resnet101", "resnet152"):
        base = published_workload(model)
        for loader in ("dali", "native"):
            workload = base if loader == "dali" else native(base, fit.native_data_fraction)
            curve = predict(workload, fit.machine, GPUS)
            print("| %s | %s | %s |" % (model, loader, " | ".join("%.3f" % p.efficiency for p in curve)))


if __name__ == "__main__":
    main()
