"""A ring all-reduce performance model: step time, throughput and E_G for any GPU count.

Per step on p GPUs (data parallel, fixed batch per GPU):

    comm(p)  = 2(p-1) * alpha + 2(p-1)/p * S / B(p)          (ring all-reduce of S gradient bytes)
    B(p)     = intra-node (NVLink) bandwidth per GPU            when p <= gpus_per_node
             = node network bandwidth / gpus_per_node           when p >  gpus_per_node
    hidden   = min(overlap * comm(p), backward)                 backward = 2/3 of compute
    step(p)  = data + compute + comm(p) - hidden
    X(p)     = p * batch / step(p);   E_G = (X_G / X_ref) / (G / G_ref), G_ref = smallest G asked

`overlap` is the fraction of the all-reduce that can run during back-propagation (DDP buckets,
Horovod tensor fusion); the last bucket never overlaps, hence a default of 0.5. The comm share is
comm / (comm + compute + data) with the full, un-overlapped comm time: the normalisation of kernel
time tables such as Aach et al. 2023, Table 2a, renormalised to those three parts.

A site's nominal network (`[network]`) ignores what NCCL kernels also spend waiting for slower
ranks; `calibrate` fits effective latency and bandwidths to measured comm shares instead
(`dlaunch predict --calibrated dali|native` uses the published table; errors in
benchmarks/README.md).
"""
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Sequence, Tuple

import numpy as np
import typer
from rich.console import Console

from launcher.analysis import load_runs, rich_table
from launcher.errors import DlaunchError
from launcher.sites import Site, resolve_site

# Parameter counts in millions (torchvision ResNets; ResNet-44 is the CIFAR 6n+2 net).
MODEL_PARAMS_M: Dict[str, float] = {
    "resnet18": 11.7,
    "resnet34": 21.8,
    "resnet50": 25.6,
    "resnet101": 44.5,
    "resnet152": 60.2,
    "resnet44": 0.66,
}
# Forward GFLOPs per 224 px image, to scale a published ResNet-50 throughput to the other models.
MODEL_GFLOPS: Dict[str, float] = {
    "resnet18": 1.82,
    "resnet34": 3.67,
    "resnet50": 4.11,
    "resnet101": 7.83,
    "resnet152": 11.56,
}
# Published single-GPU ResNet-50 training throughput (images/s) by GPU model prefix: NVIDIA
# DeepLearningExamples, PyTorch ResNet-50 v1.5, A100 80GB, AMP, batch 256. The default compute time
# of `dlaunch predict` when no measurement is given (an optimistic one for batch 64 and TF32).
PUBLISHED_RESNET50_IMAGES_PER_S: Dict[str, float] = {"A100": 2470.0}
DEFAULT_BATCH = 64  # the paper's batch per GPU
BACKWARD_FRACTION = 2.0 / 3.0  # backward ~ 2x forward
DEFAULT_OVERLAP = 0.5
DEFAULT_INTRA_NODE_GBPS = 2400.0  # A100 NVLink 3: 300 GB/s per GPU and direction

PUBLISHED_DIR = Path(__file__).resolve().parent.parent / "data" / "published"
AACH2023_TABLE2A = PUBLISHED_DIR / "aach2023_table2a.csv"
AACH2023_GPUS_PER_NODE = 4  # JUWELS Booster, where Table 2a was measured


def gradient_bytes(model: str) -> float:
    """fp32 gradient bytes of a known model (4 bytes per parameter)."""
    try:
        return 4.0 * MODEL_PARAMS_M[model] * 1e6
    except KeyError:
        raise ValueError("unknown model %r (known: %s)" % (model, ", ".join(sorted(MODEL_PARAMS_M)))) from None


@dataclass(frozen=True)
class Interconnect:
    """A site's interconnect: latency per ring hop, bandwidths in Gbit/s."""

    gpus_per_node: int
    latency_us: float
    bandwidth_gbps_per_node: float
    intra_node_gbps: float = DEFAULT_INTRA_NODE_GBPS

    def bytes_per_s(self, gpus: int) -> float:
        """Bottleneck bandwidth of one GPU's ring link (bytes/s)."""
        if gpus <= self.gpus_per_node:
            return self.intra_node_gbps * 1e9 / 8
        return self.bandwidth_gbps_per_node * 1e9 / 8 / self.gpus_per_node

    def allreduce_s(self, gpus: int, nbytes: float) -> float:
        """Ring all-reduce time of `nbytes` over `gpus` ranks."""
        if gpus <= 1:
            return 0.0
        hops = 2 * (gpus - 1)
        return hops * self.latency_us * 1e-6 + hops / gpus * nbytes / self.bytes_per_s(gpus)


@dataclass(frozen=True)
class Workload:
    """What one GPU does per step, measured on one run."""

    compute_s: float
    batch: int
    gradient_bytes: float
    data_s: float = 0.0


@dataclass(frozen=True)
class Prediction:
    gpus: int
    nodes: int
    step_s: float
    comm_s: float
    exposed_comm_s: float
    images_per_s: float
    speedup: float
    efficiency: float
    comm_share: float


def predict(workload: Workload, network: Interconnect, gpus: Sequence[int], overlap: float = DEFAULT_OVERLAP) -> List[Prediction]:
    """The model's curve over `gpus` (sorted); E_G and speed-up relative to the smallest count."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError("overlap must be within [0, 1], got %r" % overlap)
    counts = sorted(set(gpus))
    if not counts or counts[0] < 1:
        raise ValueError("GPU counts must be >= 1")
    rows = []
    for p in counts:
        comm = network.allreduce_s(p, workload.gradient_bytes)
        exposed = comm - min(overlap * comm, BACKWARD_FRACTION * workload.compute_s)
        step = workload.data_s + workload.compute_s + exposed
        rows.append((p, comm, exposed, step, p * workload.batch / step))
    x_ref, g_ref = rows[0][4], rows[0][0]
    busy = workload.compute_s + workload.data_s
    return [
        Prediction(
            gpus=p,
            nodes=-(-p // network.gpus_per_node),
            step_s=step,
            comm_s=comm,
            exposed_comm_s=exposed,
            images_per_s=x,
            speedup=x / x_ref,
            efficiency=(x / x_ref) / (p / g_ref),
            comm_share=comm / (comm + busy),
        )
        for p, comm, exposed, step, x in rows
    ]


def calibrate(points: Sequence[Tuple[int, float]], workload: Workload, gpus_per_node: int) -> Interconnect:
    """Effective latency and bandwidths that best reproduce measured comm shares [(gpus, share)].

    comm/(compute+data) = share/(1-share) is linear in (alpha, 1/B_intra, 1/B_inter); the least
    squares fit is weighted by (1-share)^2 so residuals count as errors in share. A bandwidth with
    no point on its side of `gpus_per_node` keeps its default.
    """
    busy = workload.compute_s + workload.data_s
    rows, targets, weights = [], [], []
    for gpus, share in points:
        if gpus < 2 or not 0.0 < share < 1.0:
            raise ValueError("calibration point (%r GPUs, share %r) needs >= 2 GPUs and 0 < share < 1" % (gpus, share))
        transfer = 2 * (gpus - 1) / gpus * workload.gradient_bytes / busy
        intra = gpus <= gpus_per_node
        rows.append([2 * (gpus - 1) / busy, transfer if intra else 0.0, 0.0 if intra else transfer])
        targets.append(share / (1.0 - share))
        weights.append((1.0 - share) ** 2)
    a, y, w = np.array(rows), np.array(targets), np.array(weights)
    used = a.any(axis=0)
    coef = np.zeros(3)
    coef[used] = np.linalg.lstsq(a[:, used] * w[:, None], y * w, rcond=None)[0]
    if (coef[used] <= 0).any():
        raise ValueError("calibration gives a non-positive latency or inverse bandwidth: %s" % coef)
    latency_s, inv_intra, inv_inter = (float(c) for c in coef)
    return Interconnect(
        gpus_per_node=gpus_per_node,
        latency_us=latency_s * 1e6,
        bandwidth_gbps_per_node=gpus_per_node * 8e-9 / inv_inter if inv_inter else float("nan"),
        intra_node_gbps=8e-9 / inv_intra if inv_intra else DEFAULT_INTRA_NODE_GBPS,
    )


@dataclass(frozen=True)
class PublishedRow:
    """Percent of CUDA kernel time per step (the remainder is other kernels)."""

    gpus: int
    comm: float
    io: float
    compute: float

    @property
    def comm_share(self) -> float:
        """Comm share renormalised to comm + I/O + compute (the model's normalisation)."""
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


def interconnect_of_site(site: Site) -> Optional[Interconnect]:
    """The model's interconnect for a site profile with a `[network]` section (None without one)."""
    if site.network is None:
        return None
    return Interconnect(site.gpus_per_node, site.network.latency_us, site.network.bandwidth_gbps_per_node)


def parse_gpu_counts(text: str) -> List[int]:
    """`4,8,16` -> [4, 8, 16] (sorted, unique)."""
    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise DlaunchError("--gpus: %r is not a comma-separated list of integers" % text) from None
    if counts[0] < 1:
        raise DlaunchError("--gpus: GPU counts must be >= 1 (got %r)" % text)
    return counts


def published_compute_ms(site: Site, model: str, batch: int) -> Optional[float]:
    """Compute time per step from the published throughput of the site's GPU model, if one is known."""
    gpu = next((g for g in PUBLISHED_RESNET50_IMAGES_PER_S if (site.gpu_model or "").startswith(g)), None)
    if gpu is None or model not in MODEL_GFLOPS:
        return None
    images_per_s = PUBLISHED_RESNET50_IMAGES_PER_S[gpu] * MODEL_GFLOPS["resnet50"] / MODEL_GFLOPS[model]
    return 1e3 * batch / images_per_s


def workload_from_options(model: Optional[str], compute_ms: Optional[float], data_ms: Optional[float],
                          batch: Optional[int], from_run: Optional[Path],
                          site: Optional[Site] = None) -> Tuple[str, Workload, str]:
    """The model name, the workload and where its compute time comes from.

    `--from-run` fills what the flags leave out; without either, the published throughput of the
    site's GPU model (batch 64 unless given)."""
    source = "--compute-ms"
    if from_run is not None:
        loaded = load_runs([str(from_run)])
        if loaded.rejected:
            raise DlaunchError("--from-run: %s" % loaded.rejected[0])
        if len(loaded.runs) != 1:
            raise DlaunchError("--from-run: %s holds %d runs, expected one" % (from_run, len(loaded.runs)))
        run = loaded.runs[0]
        if run.profile is None:
            raise DlaunchError("--from-run: %s has no profile record (run the trainer with --profile-steps N)" % run.path)
        model = model or run.key.model
        compute_ms = compute_ms if compute_ms is not None else 1e3 * run.profile.compute_s
        data_ms = data_ms if data_ms is not None else 1e3 * run.profile.data_s
        batch = batch or run.key.batch_per_worker
        source = "measured in %s" % run.path
    if compute_ms is None and model is not None and site is not None:
        batch = batch or DEFAULT_BATCH
        compute_ms = published_compute_ms(site, model, batch)
        source = "published %s throughput (NVIDIA DeepLearningExamples, AMP), scaled by model FLOPs" % site.gpu_model
    if model is None or compute_ms is None or batch is None:
        raise DlaunchError("--model, --compute-ms and --batch are needed unless --from-run names a profiled run")
    if model not in MODEL_PARAMS_M:
        raise DlaunchError("--model: unknown model %r (known: %s)" % (model, ", ".join(sorted(MODEL_PARAMS_M))))
    if compute_ms <= 0 or batch < 1 or (data_ms or 0.0) < 0:
        raise DlaunchError("--compute-ms and --batch must be positive, --data-ms not negative")
    return model, Workload(compute_ms / 1e3, batch, gradient_bytes(model), (data_ms or 0.0) / 1e3), source


PREDICTION_HEADERS = ["GPUs", "nodes", "step ms", "comm ms", "exposed comm ms", "images/s", "S_G", "E_G", "comm %"]


def prediction_rows(predictions: Sequence[Prediction]) -> List[List[str]]:
    return [[str(p.gpus), str(p.nodes), "%.2f" % (1e3 * p.step_s), "%.2f" % (1e3 * p.comm_s),
             "%.2f" % (1e3 * p.exposed_comm_s), "%.1f" % p.images_per_s, "%.2f" % p.speedup,
             "%.3f" % p.efficiency, "%.1f" % (100 * p.comm_share)] for p in predictions]


def predict_command(
    site: Annotated[str, typer.Option(help="Site profile (name or TOML path) with a [network] section.")],
    gpus: Annotated[str, typer.Option(help="Comma-separated GPU counts; E_G is relative to the smallest.")] = "4,8,16,32,64,128,256,512,1024",
    model: Annotated[Optional[str], typer.Option(help="Model (gradient size from its parameter count).")] = None,
    compute_ms: Annotated[Optional[float], typer.Option(help="Measured forward+backward time per step (ms).")] = None,
    data_ms: Annotated[Optional[float], typer.Option(help="Measured time waiting for data per step (ms); default 0.")] = None,
    batch: Annotated[Optional[int], typer.Option(help="Batch per GPU the compute time was measured with.")] = None,
    from_run: Annotated[Optional[Path], typer.Option(help="Run directory or metrics file with a profile record.")] = None,
    overlap: Annotated[float, typer.Option(min=0.0, max=1.0, help="Fraction of the all-reduce hidden behind back-propagation.")] = DEFAULT_OVERLAP,
    calibrated: Annotated[Optional[str], typer.Option(help="Instead of the site's nominal network, effective parameters fitted to Aach et al. 2023 Table 2a: 'dali' or 'native' column (ResNet-50 DDP, JUWELS Booster).")] = None,
) -> None:
    """Predict step time, throughput and E_G over GPU counts with a ring all-reduce model."""
    counts = parse_gpu_counts(gpus)
    profile = resolve_site(site)
    network = interconnect_of_site(profile)
    if network is None:
        raise DlaunchError("--site: site %s has no [network] section (latency_us, bandwidth_gbps_per_node)" % profile.name)
    model_name, workload, source = workload_from_options(model, compute_ms, data_ms, batch, from_run, profile)
    if calibrated is not None:
        published = load_published()
        if calibrated not in published:
            raise DlaunchError("--calibrated: %r is not a column of %s (dali, native)" % (calibrated, AACH2023_TABLE2A.name))
        # Fitted on the published machine (JUWELS Booster, 4 GPUs per node), whatever the site.
        network = calibrate([(r.gpus, r.comm_share) for r in published[calibrated]], workload, AACH2023_GPUS_PER_NODE)
    console = Console(soft_wrap=True)
    console.print(
        "%s on %s: %.1f MB fp32 gradients, compute %.2f ms + data %.2f ms per step, batch %d per GPU; "
        "latency %.2f us per hop, %.0f Gbit/s per node of %d GPUs, %.0f Gbit/s per GPU in a node, overlap %.2f\n"
        "compute time: %s"
        % (model_name, profile.name, workload.gradient_bytes / 1e6, 1e3 * workload.compute_s, 1e3 * workload.data_s,
           workload.batch, network.latency_us, network.bandwidth_gbps_per_node, network.gpus_per_node,
           network.intra_node_gbps, overlap, source),
        markup=False, highlight=False,
    )
    console.print(rich_table(None, PREDICTION_HEADERS, prediction_rows(predict(workload, network, counts, overlap))))
