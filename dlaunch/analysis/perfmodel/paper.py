"""Aach et al. 2023 as the model reads it (data/published/): Table 2a's kernel-time shares per loader, the text's
statements on E_G, the published A100 throughput per precision; the workload of the paper's runs, the machine fitted
on them (`fit_published`: noise and kernels beside compute on the DALI column, the native loader's data wait, the
file system's images/s on the point statements), its epoch (`paper_overhead`), what it leaves unstated about its
DeepSpeed runs, and the paper's values beside the model's where the prediction is of its workload and machine."""

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from dlaunch.analysis.perfmodel.compute import ComputeTime, load_gpus, published_compute
from dlaunch.analysis.perfmodel.fit import fit_loader_stall, fit_machine, golden_min
from dlaunch.analysis.perfmodel.model import (
    DALI_CPU_THREAD_IMAGES_PER_S,
    DEFAULT_BATCH,
    NATIVE_WORKER_IMAGES_PER_S,
    PAPER_LOADER_THREADS,
    EpochOverhead,
    Prediction,
    Workload,
    gradient_bytes,
    interconnect_of_site,
    predict,
)
from dlaunch.analysis.perfmodel.nccl import Machine
from dlaunch.analysis.perfmodel.overhead import PaperOverhead, checkpoint_bytes
from dlaunch.jobs.sites import Site
from dlaunch.paths import PUBLISHED_DIR

# The paper's GPU (JUWELS Booster: A100 40 GB), whose published compute time (compute.py: NVIDIA's DGX A100 row, a
# whole training step) the paper's workload takes.
AACH2023_GPU = "A100-40GB"
AACH2023_TABLE2A = PUBLISHED_DIR / "aach2023_table2a.csv"
AACH2023_STATEMENTS = PUBLISHED_DIR / "aach2023_statements.csv"
# The machine of Table 2a, JUWELS Booster (sites/juwels-booster.toml): 4 A100 per node, 4x HDR200.
AACH2023_MACHINE = Machine(gpus_per_node=4, latency_us=1.5, bandwidth_gbps_per_node=800.0)
AACH2023_REFERENCE_GPUS = 4  # the paper's E_G is relative to one node
# Fit on the counts a user could afford before a large allocation; larger counts are predicted.
CALIBRATION_MAX_GPUS = 64
# How far a point statement ("Horovod 0.50 at 128 GPUs") may be from the model and still hold: the
# spread of E_G values the paper gives for one GPU count and loader (Horovod 0.50, DeepSpeed 0.33).
STATEMENT_TOLERANCE = 0.10
# What the paper leaves unstated about its DeepSpeed runs (precision, ZeRO stage), assumed as in
# DeepSpeedExamples' CIFAR example of 2022-03 (cifar/ds_config.json at 6bd444a: fp16 enabled, ZeRO
# stage 0; its data go through DeepSpeed's own `training_data` loader, which would explain "DeepSpeed
# cannot use the DALI data loader"; the v0.6.3 tutorial page's config has no fp16): fp16 compute. DDP
# and Horovod: TF32, PyTorch's default, as Table 2a's kernel times (DDP) say. benchmarks/README.md
# has the mechanisms of DeepSpeed 0.6.3 this was chosen over.
PAPER_DEEPSPEED_SOURCE = "not stated there; as in DeepSpeedExamples' CIFAR config of 2022-03"
STORAGE_FIT = (
    "fitted on the paper's E_G values for the native loader (%s), at least what Table 2a's native rows "
    "drew up to %d GPUs" % (AACH2023_STATEMENTS.name, CALIBRATION_MAX_GPUS)
)


@dataclass(frozen=True)
class PublishedRow:
    """Percent of CUDA kernel time per step in NCCL (comm), I/O and cuDNN (compute) kernels; the rest is other kernels."""

    gpus: int
    comm: float
    io: float
    compute: float

    @property
    def comm_share(self) -> float:
        """NCCL's share of all kernel time (the model's comm share)."""
        return self.comm / 100.0

    @property
    def renormalised_share(self) -> float:
        """Comm share of comm + I/O + compute kernels (the other kernels left out; the v2 model's yardstick)."""
        return self.comm / (self.comm + self.io + self.compute)


def load_published(path: Path = AACH2023_TABLE2A) -> Dict[str, List[PublishedRow]]:
    """Published shares per loader column ('dali', 'native'); empty cells are left out."""
    columns: Dict[str, List[PublishedRow]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for loader in ("dali", "native"):
                cells = [row["%s_%s" % (loader, part)] for part in ("comm", "io", "compute")]
                if all(cells):
                    comm, io, compute = (float(c) for c in cells)
                    columns.setdefault(loader, []).append(PublishedRow(int(row["gpus"]), comm, io, compute))
    return columns


class Statement(NamedTuple):
    """A statement of the paper's text on E_G (reference 4 GPUs) for GPU counts gpus_from..gpus_to."""

    model: str
    loader: str
    frameworks: Tuple[str, ...]
    gpus_from: int
    gpus_to: int
    relation: str  # '>', '<' or '=' (within STATEMENT_TOLERANCE)
    value: float

    def covers(self, model: str, loader: str, framework: str, gpus: int) -> bool:
        return (
            (model, loader) == (self.model, self.loader)
            and framework in self.frameworks
            and self.gpus_from <= gpus <= self.gpus_to
        )

    def error(self, efficiency: float) -> float:
        """Model - value; for a bound 0 while it holds (else by how much the model is on the wrong side)."""
        if self.relation == "=" or not self.holds(efficiency):
            return efficiency - self.value
        return 0.0

    def holds(self, efficiency: float) -> bool:
        if self.relation == "=":
            return abs(efficiency - self.value) <= STATEMENT_TOLERANCE
        return efficiency > self.value if self.relation == ">" else efficiency < self.value

    @property
    def text(self) -> str:
        return ("%.2f" if self.relation == "=" else self.relation + "%.2f") % self.value


def load_statements(path: Path = AACH2023_STATEMENTS) -> List[Statement]:
    with open(path, newline="", encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#")]
    return [
        Statement(
            r["model"],
            r["loader"],
            tuple(r["frameworks"].split()),
            int(r["gpus_from"]),
            int(r["gpus_to"]),
            r["relation"],
            float(r["value"]),
        )
        for r in csv.DictReader(lines)
    ]


def storage_points(statements: Sequence[Statement]) -> List[Tuple[str, int, float]]:
    """[(framework, gpus, E_G)] of the point statements on the native loader: what the file system is fitted on."""
    return [
        (f, s.gpus_from, s.value)
        for s in statements
        if s.relation == "=" and s.loader == "native"
        for f in s.frameworks
    ]


def storage_floor(gpus: Sequence[int], workload: Workload, machine: Machine) -> float:
    """Images/s a loader drew at `gpus` without a stall: a file system that reproduces those rows sustains at least this."""
    free = replace(machine, storage_images_per_s=None)
    return max(p.images_per_s for p in predict(workload, free, gpus))


def fit_storage(
    statements: Sequence[Tuple[str, int, float]],
    workloads: Dict[str, Workload],
    machine: Machine,
    floor: float,
    overhead: Optional[EpochOverhead] = None,
) -> float:
    """The file system's images/s (>= `floor`) whose E_G best matches [(framework, gpus, E_G)] (reference 4
    GPUs), each framework with its workload in `workloads`, epochs with `overhead`."""

    def cost(log_r: float) -> float:
        storage = replace(machine, storage_images_per_s=math.exp(log_r))
        return sum(
            (predict(workloads[f], storage, [AACH2023_REFERENCE_GPUS, g], overhead)[1].efficiency - v) ** 2
            for f, g, v in statements
        )

    return math.exp(golden_min(cost, math.log(floor), math.log(100.0 * floor)))


def paper_compute(model: str, batch: int = DEFAULT_BATCH, precision: str = "tf32") -> ComputeTime:
    """The compute time of `model` on the paper's GPU (`published_compute`: NVIDIA's A100 row and its rules)."""
    return published_compute(load_gpus()[AACH2023_GPU], model, batch, precision)


def io_kernel_s(loader: str, batch: int, max_gpus: int = CALIBRATION_MAX_GPUS, path: Path = AACH2023_TABLE2A) -> float:
    """The loader's I/O kernel time per step: Table 2a's I/O kernels over its cuDNN and other kernels (a
    ResNet-50 TF32 step on the paper's GPU), rows up to `max_gpus`, per image. Decoding and augmenting an image
    costs the same whatever network and precision train on it, so it does not scale with FLOPs or the precision."""
    rows = [r for r in load_published(path)[loader] if r.gpus <= max_gpus]
    per_step = math.fsum(r.io for r in rows) / math.fsum(100.0 - r.comm - r.io for r in rows)
    return per_step * paper_compute("resnet50", batch).seconds


def paper_overhead(
    loader: str, batch: int = DEFAULT_BATCH, path: Path = AACH2023_TABLE2A, model: str = "resnet50"
) -> PaperOverhead:
    """Aach et al.'s epoch overhead with `loader` for `model`'s workload whose compute holds Table 2a's I/O kernels."""
    return PaperOverhead(loader, io_kernel_s(loader, batch, path=path), checkpoint_bytes(model))


def published_workload(
    model: str = "resnet50", loader: str = "dali", path: Path = AACH2023_TABLE2A, precision: str = "tf32"
) -> Workload:
    """Table 2a's workload per GPU: batch 64; the GPU's kernel time per step other than NCCL's: the
    published A100 throughput at `precision` (a whole training step; `paper_compute`'s rules) plus
    the loader's I/O kernels (`io_kernel_s`); data wait 0; the native loader reads files."""
    return Workload(
        paper_compute(model, DEFAULT_BATCH, precision).seconds + io_kernel_s(loader, DEFAULT_BATCH, path=path),
        DEFAULT_BATCH,
        gradient_bytes(model),
        reads_files=loader == "native",
    )


@dataclass(frozen=True)
class PublishedFit:
    machine: Machine  # JUWELS Booster's: noise and beside_compute (DALI column), storage (native statements)
    native_data_fraction: float  # the native loader's data wait per step / compute, fitted on its column
    storage_floor: float  # images/s the native rows up to the fit's largest count drew without a stall


def fit_published(
    max_gpus: int = CALIBRATION_MAX_GPUS, path: Path = AACH2023_TABLE2A, statements: Path = AACH2023_STATEMENTS
) -> PublishedFit:
    """One machine fit for Table 2a's machine: noise and beside_compute on its DALI column (DALI keeps
    up: no loader wait), then the native loader's data wait on the native column with that machine,
    both on counts <= `max_gpus`; then the file system's images/s from the point statements on the
    native loader's E_G (of 90-epoch runs: with the paper's epoch overhead), each framework's with its
    `paper_workload` (not below what the native rows drew without a stall)."""
    columns = load_published(path)
    dali = published_workload(path=path)
    machine = fit_machine(
        [(r.gpus, r.comm_share) for r in columns["dali"] if r.gpus <= max_gpus], dali, AACH2023_MACHINE
    )
    native = published_workload(loader="native", path=path)
    fitted = [r for r in columns["native"] if r.gpus <= max_gpus]
    native = replace(native, data_s=fit_loader_stall([(r.gpus, r.comm_share) for r in fitted], native, machine))
    floor = storage_floor([r.gpus for r in fitted], native, machine)
    points = storage_points(load_statements(statements))
    unstalled = PublishedFit(machine, native.data_s / native.compute_s, floor)
    workloads = {f: paper_workload(unstalled, loader="native", framework=f, path=path) for f, _, _ in points}
    storage = fit_storage(points, workloads, machine, floor, paper_overhead("native", path=path))
    return replace(unstalled, machine=replace(machine, storage_images_per_s=storage))


def calibrated_workload(workload: Workload, fit: PublishedFit, loader: str, measured_data: bool = False) -> Workload:
    """`workload` as on Table 2a's machine with `loader`: the native loader reads files and, unless the
    data wait is `measured_data`, waits the fitted one."""
    if loader != "native":
        return workload
    if measured_data:
        return replace(workload, reads_files=True)
    return replace(workload, reads_files=True, data_s=fit.native_data_fraction * workload.compute_s)


def paper_input(loader: str) -> Tuple[float, str]:
    """(images/s, what it rests on) of one GPU's loader in the paper's setup (8 CPU threads per loader instance): the
    threads times one thread's rate measured with the trainer's pipeline on this project's VM, an AMD EPYC core
    (benchmarks/README.md); no source states JUWELS Booster's (EPYC 7402) own."""
    per_thread, name = (
        (NATIVE_WORKER_IMAGES_PER_S, "native worker process")
        if loader == "native"
        else (DALI_CPU_THREAD_IMAGES_PER_S, "DALI CPU thread")
    )
    return PAPER_LOADER_THREADS * per_thread, (
        "the paper's %d CPU threads per loader x %.0f images/s per %s, measured on an AMD EPYC core of this project's "
        "VM with `python -m dlaunch.train.loaderbench` (benchmarks/README.md), not on JUWELS Booster's EPYC 7402 "
        "(no source states its rate): assumed" % (PAPER_LOADER_THREADS, per_thread, name)
    )


def paper_precision(framework: str) -> str:
    """The precision of the paper's runs: TF32 (PyTorch's default), fp16 for DeepSpeed (PAPER_DEEPSPEED_SOURCE)."""
    return "fp16" if framework == "deepspeed" else "tf32"


def paper_workload(
    fit: PublishedFit,
    model: str = "resnet50",
    loader: str = "dali",
    framework: str = "ddp",
    path: Path = AACH2023_TABLE2A,
) -> Workload:
    """The paper's workload with `framework` on Table 2a's machine (`published_workload` at the
    framework's `paper_precision`, `calibrated_workload` for the loader)."""
    published = published_workload(model, loader, path, paper_precision(framework))
    return replace(
        calibrated_workload(published, fit, loader), framework=framework, input_images_per_s=paper_input(loader)[0]
    )


@dataclass(frozen=True)
class PaperCheck:
    """What the paper publishes for one GPU count of the predicted workload (None: nothing)."""

    comm_share: Optional[float]  # Table 2a, NCCL share of kernel time
    statement: Optional[Statement]  # on E_G


def paper_checks(model: str, loader: str, framework: str, gpus: Sequence[int]) -> Dict[int, PaperCheck]:
    """Table 2a's comm share (DDP) and the text's E_G statements for ResNet-50, batch 64, on JUWELS Booster."""
    rows = (
        {r.gpus: r.comm_share for r in load_published()[loader]} if framework == "ddp" and model == "resnet50" else {}
    )
    statements = load_statements()
    return {
        g: PaperCheck(rows.get(g), next((s for s in statements if s.covers(model, loader, framework, g)), None))
        for g in gpus
    }


def paper_machine(site: Site) -> bool:
    """Whether the site is Table 2a's machine (JUWELS Booster): its GPU and its network."""
    machine = interconnect_of_site(site)
    return (
        site.gpu_model == AACH2023_GPU
        and machine is not None
        and (machine.gpus_per_node, machine.latency_us, machine.bandwidth_gbps_per_node)
        == (
            AACH2023_MACHINE.gpus_per_node,
            AACH2023_MACHINE.latency_us,
            AACH2023_MACHINE.bandwidth_gbps_per_node,
        )
    )


def check_summary(predictions: Sequence[Prediction], checks: Dict[int, PaperCheck]) -> List[str]:
    """One line per observable: the model's errors at the counts where the paper has a value."""
    lines = []
    for label, counts in (
        ("fitted", [p for p in predictions if p.gpus <= CALIBRATION_MAX_GPUS]),
        ("predicted", [p for p in predictions if p.gpus > CALIBRATION_MAX_GPUS]),
    ):
        errors = [
            100 * abs(p.comm_share - checks[p.gpus].comm_share) for p in counts if checks[p.gpus].comm_share is not None
        ]
        if errors:
            lines.append(
                "NCCL kernel share vs Table 2a, %s counts: mean %.1f pp, max %.1f pp"
                % (label, fmean(errors), max(errors))
            )
    said = [(p, checks[p.gpus].statement) for p in predictions if checks[p.gpus].statement is not None]
    if said:
        held = sum(1 for p, s in said if s.holds(p.efficiency))
        lines.append(
            "E_G vs the paper's statements: %d of %d hold (a bound as stated, a value within +-%.2f)"
            % (held, len(said), STATEMENT_TOLERANCE)
        )
    return lines


def paper_assumptions(
    framework: str,
    calibrated: Optional[str],
    precision: Optional[str],
    zero_stage: Optional[int],
    measured_compute: bool,
) -> List[str]:
    """What `--calibrated` assumes about the paper's DeepSpeed runs where the flags leave it open."""
    if calibrated is None or framework != "deepspeed":
        return []
    return (
        ["fp16 (compute from the published mixed-precision figure)"]
        if precision is None and not measured_compute
        else []
    ) + (["ZeRO stage 0"] if zero_stage is None else [])
