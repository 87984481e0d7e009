"""The performance model against Aach et al. 2023: Table 2a's NCCL kernel shares and the text's E_G statements.

    .venv/bin/python benchmarks/bench_perfmodel.py

One model gives both observables (dlaunch/analysis/perfmodel/, v3): NCCL kernel time = transfers +
every message's wait for its slowest peer + kernels beside back-propagation; the step pays only the
last wait and the transfers left over. Fitted on the rows up to 64 GPUs only and predicting 128-1024
(the question before a large allocation): timing noise and kernels beside back-propagation on the DALI
column, the site's nominal network (800 Gbit/s per node, 1.5 us) unchanged; the native loader's data
wait on the native column with that machine; the file system's images/s on the paper's point
statements on E_G (bounded below by what the native rows drew without a stall), each framework with
the paper's workload (`paper_workload`: DeepSpeed assumed in fp16, the native loader's CPU measured).
Every E_G is of the paper's 90-epoch runs: steps plus the epoch's overhead from its stated setup
(`paper_overhead`: validation, loader start, synchronisation; checkpoint and logging assumed none).
Prints Markdown: per
GPU count the comm share (NCCL's share of all kernel time, as published, and renormalised to comm +
I/O + compute as the v2 record did) with its error, beside E_G and the paper's statement; the
statements with their errors; the storage ceiling's sensitivity; DeepSpeed's one-node reference and its
sensitivity to the assumed precision and the loader's CPU; the epoch overhead per part, E_G at 1024 GPUs
without and with it, and its sensitivity to an assumed checkpoint; the E_G and kernel-share curves for
ResNet-50/101/152 (recorded in benchmarks/README.md).
"""
import csv
import math
from dataclasses import dataclass, replace
from statistics import mean
from typing import Dict, List, Tuple

from dlaunch.analysis.perfmodel.fit import golden_min
from dlaunch.analysis.perfmodel.model import (DALI_CPU_THREAD_IMAGES_PER_S, IMAGENET_TRAIN_IMAGES,
                                              NATIVE_WORKER_IMAGES_PER_S, NATIVE_WORKERS, PAPER_LOADER_THREADS,
                                              Prediction, Workload, predict)
from dlaunch.analysis.perfmodel.nccl import Machine
from dlaunch.analysis.perfmodel.overhead import CHECKPOINT_WRITE_BYTES_PER_S, FixedOverhead, PaperOverhead, overhead_passes
from dlaunch.paths import PUBLISHED_DIR
from dlaunch.analysis.perfmodel.paper import (AACH2023_REFERENCE_GPUS, CALIBRATION_MAX_GPUS, STATEMENT_TOLERANCE, PublishedFit,
                                              PublishedRow, fit_published, load_published, load_statements, paper_overhead,
                                              paper_workload, published_workload, storage_points)

GPUS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
FRAMEWORKS = ["ddp", "horovod", "deepspeed"]


def renormalised(p: Prediction, compute_fraction: float) -> float:
    """The model's kernel share of NCCL + cuDNN + I/O kernels (the other kernels left out, as the v2 yardstick)."""
    return p.kernel_comm_s / (p.kernel_comm_s + p.kernel_comm_s / p.comm_share * (1 - p.comm_share) * compute_fraction)


def cudnn_io_fraction(loader: str) -> float:
    """cuDNN + I/O kernels over all non-NCCL kernels on the fitted rows."""
    rows = [r for r in load_published()[loader] if r.gpus <= CALIBRATION_MAX_GPUS]
    return sum(r.compute + r.io for r in rows) / sum(100 - r.comm for r in rows)


def main() -> None:
    published = load_published()
    statements = load_statements()
    fit = fit_published()
    m = fit.machine
    print("Fitted on Table 2a's rows of %d-%d GPUs: timing noise %.3g s (a rank's delay spread sqrt(noise x t)), "
          "NCCL kernels beside back-propagation %.3f of it; native loader data wait %.4f x compute. File system "
          "%.0f images/s for the native loader (what the native rows drew without a stall: %.0f).\n"
          % (GPUS[0], CALIBRATION_MAX_GPUS, m.noise_s, m.beside_compute, fit.native_data_fraction,
             m.storage_images_per_s, fit.storage_floor))
    workloads = {loader: paper_workload(fit, loader=loader) for loader in published}
    print("| loader | GPUs | comm % published | model | error pp | renormalised published | model | error pp "
          "| E_G model (DDP) | paper | |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    errors: Dict[str, List[float]] = {}
    for loader, rows in published.items():
        fraction = cudnn_io_fraction(loader)
        curve = predict(workloads[loader], m, [r.gpus for r in rows], paper_overhead(loader))
        for row, p in zip(rows, curve):
            said = next((s for s in statements if s.covers("resnet50", loader, "ddp", row.gpus)), None)
            raw, renorm = 100 * (p.comm_share - row.comm_share), 100 * (renormalised(p, fraction) - row.renormalised_share)
            if row.gpus > CALIBRATION_MAX_GPUS:
                errors.setdefault(loader, []).append(raw)
                errors.setdefault(loader + " renormalised", []).append(renorm)
            print("| %s | %d%s | %.1f | %.1f | %+.1f | %.1f | %.1f | %+.1f | %.3f | %s | %s |" % (
                loader, row.gpus, " (fitted)" if row.gpus <= CALIBRATION_MAX_GPUS else "", 100 * row.comm_share,
                100 * p.comm_share, raw, 100 * row.renormalised_share, 100 * renormalised(p, fraction), renorm,
                p.efficiency, said.text if said else "-", ("holds" if said.holds(p.efficiency) else "FAILS") if said else ""))
    print()
    for name, values in errors.items():
        print("- %s comm share, predicted %d-%d GPUs: mean %.1f pp, max %.1f pp"
              % (name, CALIBRATION_MAX_GPUS * 2, max(r.gpus for r in published[name.split()[0]]),
                 mean(abs(e) for e in values), max(abs(e) for e in values)))

    print("\nThe paper's E_G statements (reference %d GPUs; a value holds within +-%.2f):\n"
          % (AACH2023_REFERENCE_GPUS, STATEMENT_TOLERANCE))
    print("| statement | role | framework | GPUs | model E_G (the worst over the range) | error | holds |")
    print("|---|---|---|---|---|---|---|")
    for s in statements:
        for framework in s.frameworks:
            counts = [g for g in GPUS if s.gpus_from <= g <= s.gpus_to]
            curve = predict(paper_workload(fit, loader=s.loader, framework=framework), m, [AACH2023_REFERENCE_GPUS] + counts,
                            paper_overhead(s.loader))[1:]
            worst = min(curve, key=lambda p: p.efficiency) if s.relation == ">" else max(curve, key=lambda p: p.efficiency)
            error = s.error(worst.efficiency)
            print("| %s E_G %s | %s | %s | %s | %.3f at %d | %s | %s |" % (
                s.loader, s.text, "fit (storage)" if s.relation == "=" else "check", framework,
                "-".join(str(g) for g in sorted({counts[0], counts[-1]})), worst.efficiency, worst.gpus,
                "%+.3f" % error if error or s.relation == "=" else "-", "yes" if s.holds(worst.efficiency) else "NO"))

    rows = [r for r in published["native"] if r.gpus > CALIBRATION_MAX_GPUS]
    print("\nSensitivity to the file system's images/s (native loader; NOT a fit: for reading only):\n")
    print("| images/s | " + " | ".join("comm error pp at %d" % r.gpus for r in rows)
          + " | DDP E_G 256 | Horovod E_G 128 | DeepSpeed E_G 128 | E_G 512 |")
    print("|---|" + "---|" * (len(rows) + 4))
    for factor in (1.0, 1.25, 1.5, 2.0):
        storage = replace(m, storage_images_per_s=factor * m.storage_images_per_s)
        shares = predict(workloads["native"], storage, [r.gpus for r in rows])
        eg = {(f, g): predict(paper_workload(fit, loader="native", framework=f), storage, [4, g],
                              paper_overhead("native"))[1].efficiency for f in FRAMEWORKS for g in (128, 256, 512)}
        print("| %.0f%s | %s | %.3f | %.3f | %.3f | %.3f |" % (
            storage.storage_images_per_s, " (fit)" if factor == 1.0 else "",
            " | ".join("%+.1f" % (100 * (p.comm_share - r.comm_share)) for p, r in zip(shares, rows)),
            eg["ddp", 256], eg["horovod", 128], eg["deepspeed", 128], max(eg[f, 512] for f in FRAMEWORKS)))

    goal_window(fit, workloads["native"], rows)
    deepspeed_reference(fit)
    epoch_overhead(fit)
    run_times(fit)

    print("\nPredicted E_G and NCCL kernel share (%) with the same fit (batch 64; compute from the A100 TF32 figure "
          "scaled by FLOPs, plus the loader's I/O kernels per image; DeepSpeed from the mixed-precision figure, as assumed for the "
          "paper's runs; the native loader's CPU as measured; the paper's epoch overhead):\n")
    print("| model | loader | framework | " + " | ".join(str(g) for g in GPUS) + " |")
    print("|---|---|---|" + "---|" * len(GPUS))
    for model in ("resnet50", "resnet101", "resnet152"):
        for loader in ("dali", "native"):
            for framework in (["ddp", "horovod"] if loader == "dali" else FRAMEWORKS):
                curve = predict(paper_workload(fit, model, loader, framework), m, GPUS, paper_overhead(loader, model=model))
                print("| %s | %s | %s | %s |" % (model, loader, framework, " | ".join(
                    "%.3f (%.0f)" % (p.efficiency, 100 * p.comm_share) for p in curve)))


def goal_window(fit: PublishedFit, native: Workload, rows: List[PublishedRow]) -> None:
    """The file-system speeds at which every native done-when item of issue 27 holds at once (reading only)."""
    m = fit.machine
    statements = [s for s in load_statements() if s.loader == "native"]
    points = storage_points(statements)

    def efficiency(storage: Machine, framework: str, gpus: int) -> float:
        return predict(paper_workload(fit, loader="native", framework=framework), storage, [4, gpus],
                       paper_overhead("native"))[1].efficiency

    def meets(r: float) -> bool:
        storage = replace(m, storage_images_per_s=r)
        errors = [abs(100 * (p.comm_share - row.comm_share))
                  for p, row in zip(predict(native, storage, [row.gpus for row in rows]), rows)]
        said = all(s.holds(efficiency(storage, f, s.gpus_from)) for s in statements for f in s.frameworks)
        return said and mean(errors) <= 5.0 and max(errors) <= 10.0

    def relative_cost(log_r: float) -> float:
        storage = replace(m, storage_images_per_s=math.exp(log_r))
        return sum(math.log(efficiency(storage, f, g) / v) ** 2 for f, g, v in points)

    grid = [fit.storage_floor * 1.005 ** k for k in range(200)]
    inside = [r for r in grid if meets(r)]
    relative = math.exp(golden_min(relative_cost, math.log(fit.storage_floor), math.log(100 * fit.storage_floor)))
    print("\nFile systems at which the native comm share at %s GPUs is within 5 pp mean / 10 pp max AND every native "
          "E_G statement holds (0.5 %% steps from %.0f): %s. Fits on the point statements: least squares %.0f (the "
          "model), least squares of log(E_G / statement) %.0f." % (
              "-".join(str(r.gpus) for r in rows[::len(rows) - 1]), fit.storage_floor,
              "%.0f-%.0f images/s" % (inside[0], inside[-1]) if inside else "none", m.storage_images_per_s, relative))


def capped(workload: Workload, fit: PublishedFit, loader_images_per_s: float) -> Workload:
    """`workload` (native, not yet calibrated) fed by a loader whose CPU makes `loader_images_per_s` per GPU."""
    return replace(workload, reads_files=True, data_s=fit.native_data_fraction * workload.compute_s,
                   input_images_per_s=loader_images_per_s)


def deepspeed_reference(fit: PublishedFit) -> None:
    """Why DeepSpeed's E_G at 128 GPUs is lower: its one-node reference, and how that depends on the assumptions."""
    m = fit.machine
    print("\nOne-node reference and 128 GPUs, native loader (the fitted file system, %.0f images/s):\n" % m.storage_images_per_s)
    print("| framework | precision | 4-GPU images/s per GPU | 128-GPU images/s | E_G 128 | paper |")
    print("|---|---|---|---|---|---|")
    said = {s.frameworks[0]: s.text for s in load_statements() if s.relation == "=" and s.loader == "native"}
    for framework in ("horovod", "deepspeed"):
        w = paper_workload(fit, loader="native", framework=framework)
        ref, big = predict(w, m, [4, 128], paper_overhead("native"))
        print("| %s | %s | %.0f | %.0f | %.3f | %s |" % (framework, "fp16" if framework == "deepspeed" else "tf32",
                                                     ref.images_per_s / 4, big.images_per_s, big.efficiency, said[framework]))
    print("\nDeepSpeed's E_G at 128 GPUs against the assumptions (NOT fits: the file system as fitted; the loader's "
          "CPU = %d workers x images/s per worker; tf32 = no assumption on precision):\n" % NATIVE_WORKERS)
    rates = [130.0, 150.0, NATIVE_WORKER_IMAGES_PER_S, 190.0]
    print("| precision (published figure) | " + " | ".join("%.0f/worker%s" % (r, " (model)" if r == NATIVE_WORKER_IMAGES_PER_S else "")
                                                      for r in rates) + " | no CPU limit |")
    print("|---|" + "---|" * (len(rates) + 1))
    for precision in ("tf32", "fp16"):
        base = replace(published_workload(loader="native", precision=precision), framework="deepspeed")
        cells = [predict(capped(base, fit, NATIVE_WORKERS * r), m, [4, 128], paper_overhead("native"))[1].efficiency
                 for r in rates]
        cells.append(predict(capped(base, fit, 1e12), m, [4, 128], paper_overhead("native"))[1].efficiency)
        print("| %s | %s |" % (precision, " | ".join("%.3f" % c for c in cells)))


@dataclass(frozen=True)
class AtWriteRate:
    """The paper's epoch with its checkpoint written at `bytes_per_s` instead of the model's assumed rate (reading)."""

    paper: PaperOverhead
    bytes_per_s: float

    def parts(self, workload: Workload, machine: Machine, gpus: int) -> Dict[str, float]:
        return dict(self.paper.parts(workload, machine, gpus), checkpoint=self.paper.checkpoint_bytes / self.bytes_per_s)


def epoch_overhead(fit: PublishedFit) -> None:
    """The paper's epoch overhead per part, E_G at 1024 GPUs without and with it, and its sensitivity."""
    m = fit.machine
    print("\nEpoch overhead of the paper's runs (DDP, batch 64; ImageNet's %d training images: steps per epoch "
          "5005 at 4 GPUs, 20 at 1024), seconds per epoch:\n" % IMAGENET_TRAIN_IMAGES)
    print("| model | loader | GPUs | validation | loader start | synchronisation | checkpoint | overhead % of the run | "
          "E_G 1024 steps only | E_G 1024 with overhead |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in ("resnet50", "resnet152"):
        for loader in ("dali", "native"):
            w = paper_workload(fit, model, loader)
            steps_only = predict(w, m, [4, 1024])[1].efficiency
            curve = predict(w, m, [4, 1024], paper_overhead(loader, model=model))
            for p in curve:
                parts = p.epoch_overhead
                print("| %s | %s | %d | %.3f | %.3f | %.4f | %.3f | %.1f | %s |" % (
                    model, loader, p.gpus, parts["validation"], parts["loader start"], parts["synchronisation"],
                    parts["checkpoint"], 100 * p.overhead_share,
                    "%.3f | %.3f" % (steps_only, p.efficiency) if p.gpus == 1024 else "- | -"))
    rates = [float("inf"), 2e9, 1e9, 0.5e9, 0.25e9]
    print("\nE_G at 1024 GPUs against the checkpoint's write rate (the model assumes %.0f GB/s; reading only):\n"
          % (CHECKPOINT_WRITE_BYTES_PER_S / 1e9))
    print("| model | loader | " + " | ".join("no checkpoint" if r == float("inf") else "%g GB/s" % (r / 1e9) for r in rates) + " |")
    print("|---|---|" + "---|" * len(rates))
    for model in ("resnet50", "resnet152"):
        for loader in ("dali", "native"):
            w = paper_workload(fit, model, loader)
            cells = [predict(w, m, [4, 1024], AtWriteRate(paper_overhead(loader, model=model), r))[1].efficiency for r in rates]
            print("| %s | %s | %s |" % (model, loader, " | ".join("%.3f" % c for c in cells)))
    constant = FixedOverhead(1.0, "reading")
    print("\nA constant 1 s per epoch (stated with --epoch-overhead 1) passes a tenth of the run's time, ResNet-50 DALI, "
          "from %s GPUs." % overhead_passes_text(paper_workload(fit), m, constant))


def load_run_times() -> Dict[Tuple[str, int], Tuple[float, str]]:
    """{(model, GPUs): (seconds, as stated)} of data/published/aach2023_run_times.csv."""
    with open(PUBLISHED_DIR / "aach2023_run_times.csv", newline="") as f:
        return {(r["model"], int(r["gpus"])): (float(r["seconds"]), r["stated"])
                for r in csv.DictReader(line for line in f if not line.startswith("#"))}


def run_times(fit: PublishedFit) -> None:
    """Issue 48: the calibrated model's 90-epoch run times (DALI, DDP, the paper's setup) beside the times the paper
    states (a check: nothing is fitted on them), what bounds the step, and the DALI CPU rate that would hold it."""
    m = fit.machine
    stated = load_run_times()
    print("\n90-epoch run times of the calibrated model (`dlaunch predict --site juwels --model MODEL`: DDP, DALI with "
          "CPU decoding at the paper's 8 threads x %.0f images/s per thread as measured here, the paper's epoch "
          "overhead), beside the paper's stated times (a check, not fitted):\n" % DALI_CPU_THREAD_IMAGES_PER_S)
    print("| model | GPUs | step ms | bound | E_G | 90 epochs | paper (stated) | model / paper |")
    print("|---|---|---|---|---|---|---|---|")
    for model in ("resnet50", "resnet101", "resnet152"):
        curve = predict(paper_workload(fit, model, "dali"), m, [4, 1024], paper_overhead("dali", model=model))
        for p in curve:
            run = p.run_s(90)
            paper = stated.get((model, p.gpus))
            print("| %s | %d | %.1f | %s | %.3f | %s | %s | %s |" % (
                model, p.gpus, 1e3 * p.step_s, p.bound, p.efficiency,
                "%.1f h" % (run / 3600) if p.gpus == 4 else "%.0f s" % run,
                paper[1] if paper else "-", "%.2f" % (run / paper[0]) if paper else "-"))
    print("\nWhat would make the input pipeline hold ResNet-50 at the paper's 13 h on 4 GPUs (reading only): the "
          "4-GPU run time against the DALI CPU rate per thread (8 threads per GPU):\n")
    rates = [DALI_CPU_THREAD_IMAGES_PER_S, 150.0, 100.0, 80.0, 70.0]
    print("| model | " + " | ".join("%.0f/thread%s" % (r, " (measured)" if r == DALI_CPU_THREAD_IMAGES_PER_S else "")
                                  for r in rates) + " | paper |")
    print("|---|" + "---|" * (len(rates) + 1))
    for model in ("resnet50", "resnet152"):
        cells = []
        for rate in rates:
            w = replace(paper_workload(fit, model, "dali"), input_images_per_s=PAPER_LOADER_THREADS * rate)
            cells.append("%.1f h" % (predict(w, m, [4], paper_overhead("dali", model=model))[0].run_s(90) / 3600))
        print("| %s | %s | %s |" % (model, " | ".join(cells), stated[model, 4][1]))


def overhead_passes_text(workload: Workload, machine: Machine, overhead: FixedOverhead) -> str:
    found = overhead_passes(workload, machine, overhead, 4, 1536)
    return "%d" % found if found else "none up to 1536"


if __name__ == "__main__":
    main()
