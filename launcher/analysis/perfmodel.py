"""Performance model v2: step time, throughput and E_G for any GPU count; `dlaunch predict`.

The machine (launcher/analysis/perfmodel_nccl.py: NCCL's cost model, the ranks' timing noise, the storage) is kept apart from the
workload (compute, data and other time per step, gradient bytes, framework). A machine is fitted once
per site, from published data (`--calibrated`) or the user's own runs (`--from-runs`), and then applied
unchanged to every model, batch and framework. Per step on p GPUs:

    messages  DDP: gradient buckets (1 MiB first, then 25 MiB), ready one after another during
              back-propagation (= 2/3 of compute) and all-reduced in order, overlapping it;
              Horovod: buffers of the fusion threshold, likewise; DeepSpeed ZeRO-0: all-reduce after
              back-propagation; ZeRO-1/2: reduce-scatter of the gradients plus all-gather of the
              updated parameters, after back-propagation.
    exposed   what the step waits for after compute ends: the network time left when
              back-propagation is done, plus the slowest rank's lateness at the synchronisation,
              sqrt(noise_s * (compute + data)) * S_p, plus the straggling of a loader that cannot
              keep up, data * S_p: the measured data wait per step, exponential per rank
              (S_p = straggler_factor(p): slowest-of-n waits over the 2, 4, ... p-rank rounds of
              the collective, see perfmodel_nccl.py), plus the storage stall of a loader that
              reads files (native) on a site whose file system sustains R images/s: the step
              cannot be shorter than p * batch / R.
    step      other + data + compute + exposed;  X = p * batch / step;  E_G = (X_G/X_ref)/(G/G_ref).
    kernel    NCCL kernel time (what profiles such as Aach et al. 2023, Table 2a count): all network
              time, plus the waits above, plus beside_compute * back-propagation (kernels running
              beside compute). comm share = kernel / (kernel + compute + data).

The timing noise is a machine property in seconds, not a fraction of the step: a model with more
work per step averages it out (its spread grows with the square root of the busy time), so with one
machine fit ResNet-152 loses less to stragglers than ResNet-50.

Fits. `fit_machine` finds noise_s and beside_compute from kernel-time comm shares (weighted least
squares, non-negative); `fit_loader_stall` the data wait of a loader that cannot keep up; `fit_runs`
the network (from the runs' measured all-reduce time) and the noise (from their wall-clock step
time against their profile), with a leave-one-out error (`leave_one_out`).
numpy is imported inside the functions that fit (`dlaunch` starts without it).
"""
import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import mean
from typing import Annotated, Callable, Dict, List, Literal, Optional, Sequence, Tuple

import typer
from rich.console import Console

from launcher.analysis.scaling import Run, load_runs, rich_table
from launcher.boundary import finite_number
from launcher.errors import DlaunchError
from launcher.analysis.perfmodel_nccl import DEFAULT_INTRA_NODE_GBPS, RING_PLATEAU, Machine, straggler_factor
from launcher.jobs.sites import Site, resolve_site
from launcher.paths import PUBLISHED_DIR
from train.framework_table import image_frameworks

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
# DeepLearningExamples, PyTorch ResNet-50 v1.5, DGX A100, TF32 (PyTorch's default precision on an
# A100, as in the study; AMP would be 2470), batch 256. The default compute time of `dlaunch predict`
# when no measurement is given (somewhat optimistic for batch 64).
PUBLISHED_RESNET50_IMAGES_PER_S: Dict[str, float] = {"A100": 938.0}
DEFAULT_BATCH = 64  # the paper's batch per GPU
DEFAULT_GPU_COUNTS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
BACKWARD_FRACTION = 2.0 / 3.0  # backward ~ 2x forward
DDP_FIRST_BUCKET_BYTES = 1024.0 ** 2  # torch.distributed's first bucket
DDP_BUCKET_BYTES = 25 * 1024.0 ** 2  # DistributedDataParallel(bucket_cap_mb=25)
DEFAULT_FUSION_MB = 64.0  # HOROVOD_FUSION_THRESHOLD's default (the trainer's --fusion-threshold-mb)
DEEPSPEED_BUCKET_BYTES = 4 * 5e8  # reduce_bucket_size: 5e8 fp32 elements

AACH2023_TABLE2A = PUBLISHED_DIR / "aach2023_table2a.csv"
# The machine of Table 2a, JUWELS Booster (sites/juwels-booster.toml): 4 A100 per node, 4x HDR200.
AACH2023_MACHINE = Machine(gpus_per_node=4, latency_us=1.5, bandwidth_gbps_per_node=800.0)
# Fit on the counts a user could afford before a large allocation; larger counts are predicted.
CALIBRATION_MAX_GPUS = 64
CALIBRATION_HOWTO = ("make calibration runs with the trainer's profiler, e.g. `dlaunch sweep --site SITE --nodes 1,2,4 "
                     "--model resnet50 --steps 60 --warmup-steps 10 --profile-steps 20`, then pass their run "
                     "directories (or the sweep's folder)")


def gradient_bytes(model: str) -> float:
    """fp32 gradient bytes of a known model (4 bytes per parameter)."""
    try:
        return 4.0 * MODEL_PARAMS_M[model] * 1e6
    except KeyError:
        raise ValueError("unknown model %r (known: %s)" % (model, ", ".join(sorted(MODEL_PARAMS_M)))) from None


@dataclass(frozen=True)
class Workload:
    """What one GPU does per step (seconds), and how its gradients travel."""

    compute_s: float
    batch: int
    gradient_bytes: float
    data_s: float = 0.0  # waiting for the next batch (0: the loader keeps up)
    other_s: float = 0.0  # optimizer step and the rest of a step
    framework: str = "ddp"
    zero_stage: int = 0
    fusion_mb: float = DEFAULT_FUSION_MB
    reads_files: bool = False  # the loader reads every sample as a file through the CPU (native)

    @property
    def backward_s(self) -> float:
        return BACKWARD_FRACTION * self.compute_s

    @property
    def busy_s(self) -> float:
        return self.compute_s + self.data_s


@dataclass(frozen=True)
class Message:
    collective: str  # allreduce, reduce_scatter, all_gather
    nbytes: float
    ready: float  # fraction of back-propagation done when it may start


def _buckets(total: float, first: float, size: float) -> List[float]:
    sizes, left = [], total
    for cap in [first] + [size] * int(total // size + 1):
        if left <= 0:
            break
        sizes.append(min(cap, left))
        left -= sizes[-1]
    return sizes


def messages(workload: Workload) -> List[Message]:
    """The collectives of one step, in the order they are issued."""
    total = workload.gradient_bytes
    if workload.framework in ("ddp", "horovod"):
        sizes = (_buckets(total, DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES) if workload.framework == "ddp"
                 else _buckets(total, workload.fusion_mb * 1024 ** 2, workload.fusion_mb * 1024 ** 2))
        done, out = 0.0, []
        for size in sizes:
            done += size
            out.append(Message("allreduce", size, done / total))
        return out
    if workload.framework == "deepspeed":
        if workload.zero_stage == 0:
            return [Message("allreduce", s, 1.0) for s in _buckets(total, DEEPSPEED_BUCKET_BYTES, DEEPSPEED_BUCKET_BYTES)]
        if workload.zero_stage in (1, 2):
            return [Message("reduce_scatter", total, 1.0), Message("all_gather", total, 1.0)]
        raise ValueError("ZeRO stage %r is not modelled (0, 1, 2)" % workload.zero_stage)
    raise ValueError("unknown framework %r (known: %s)" % (workload.framework, ", ".join(MODELLED)))


def network_timeline(workload: Workload, machine: Machine, gpus: int) -> Tuple[float, float, str]:
    """(network seconds of all messages, seconds of it left after back-propagation, algorithms used)."""
    backward = workload.backward_s
    free = total = 0.0
    algorithms = set()
    for msg in messages(workload):
        if msg.collective == "allreduce":
            seconds, algorithm = machine.allreduce(gpus, msg.nbytes)
        else:
            seconds, algorithm = machine.ring_half_s(gpus, msg.nbytes), "ring"
        if gpus > 1:
            algorithms.add(algorithm)
        free = max(free, msg.ready * backward) + seconds
        total += seconds
    return total, max(0.0, free - backward), "+".join(sorted(algorithms)) or "-"


@dataclass(frozen=True)
class Prediction:
    gpus: int
    nodes: int
    step_s: float
    comm_s: float  # network time of the step's collectives
    exposed_comm_s: float  # what the step waits for after compute: network left over + straggler waits
    wait_s: float  # straggler waits (noise, loader) and the storage stall
    kernel_comm_s: float  # NCCL kernel time, as profiles count it
    algorithm: str
    images_per_s: float
    speedup: float
    efficiency: float
    comm_share: float  # kernel comm / (kernel comm + compute + data)


def _point(workload: Workload, machine: Machine, gpus: int) -> Tuple[float, float, float, float, float, str]:
    """(step, network, exposed, waits, kernel comm, algorithm) of one GPU count."""
    network, left_over, algorithm = network_timeline(workload, machine, gpus)
    waits = machine.lateness_s(workload.busy_s, gpus) + workload.data_s * straggler_factor(gpus)
    step = workload.other_s + workload.data_s + workload.compute_s + left_over + waits
    if workload.reads_files and machine.storage_images_per_s and gpus > 1:
        waits += max(0.0, gpus * workload.batch / machine.storage_images_per_s - step)
    exposed = left_over + waits
    kernel = network + waits + (machine.beside_compute * workload.backward_s if gpus > 1 else 0.0)
    step = workload.other_s + workload.data_s + workload.compute_s + exposed
    return step, network, exposed, waits, kernel, algorithm


def predict(workload: Workload, network: Machine, gpus: Sequence[int]) -> List[Prediction]:
    """The model's curve over `gpus` (sorted); E_G and speed-up relative to the smallest count."""
    counts = sorted(set(gpus))
    if not counts or counts[0] < 1:
        raise ValueError("GPU counts must be >= 1")
    rows = [(p, *_point(workload, network, p)) for p in counts]
    x = {p: p * workload.batch / step for p, step, *_ in rows}
    g_ref = counts[0]
    return [
        Prediction(
            gpus=p, nodes=network.nodes(p), step_s=step, comm_s=comm, exposed_comm_s=exposed, wait_s=waits,
            kernel_comm_s=kernel, algorithm=algorithm, images_per_s=x[p], speedup=x[p] / x[g_ref],
            efficiency=(x[p] / x[g_ref]) / (p / g_ref),
            comm_share=kernel / (kernel + workload.compute_s + workload.data_s),
        )
        for p, step, comm, exposed, waits, kernel, algorithm in rows
    ]


def _nonnegative_lstsq(rows: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float]) -> List[float]:
    """Weighted least squares with coefficients >= 0 (the best non-negative solution over the column subsets)."""
    import itertools

    import numpy as np

    a, y, w = np.array(rows, dtype=float), np.array(targets, dtype=float), np.array(weights, dtype=float)
    best, best_cost = [0.0] * a.shape[1], float(np.sum((w * y) ** 2))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            coef = np.linalg.lstsq(a[:, cols] * w[:, None], y * w, rcond=None)[0]
            if (coef < 0).any():
                continue
            cost = float(np.sum((w * (a[:, cols] @ coef - y)) ** 2))
            if cost < best_cost:
                best, best_cost = [0.0] * a.shape[1], cost
                for c, v in zip(cols, coef):
                    best[c] = float(v)
    return best


def _check_shares(points: Sequence[Tuple[int, float]]) -> None:
    for gpus, share in points:
        if gpus < 2 or not 0.0 < share < 1.0:
            raise ValueError("calibration point (%r GPUs, share %r) needs >= 2 GPUs and 0 < share < 1" % (gpus, share))


def fit_machine(points: Sequence[Tuple[int, float]], workload: Workload, machine: Machine) -> Machine:
    """`machine` with the noise and beside_compute that best reproduce kernel-time comm shares [(gpus, share)].

    kernel comm = share/(1-share) * (compute + data) is linear in beside_compute and sqrt(noise_s);
    the fit is weighted by (1-share)^2 so that residuals count as errors in share."""
    _check_shares(points)
    bare = replace(machine, noise_s=0.0, beside_compute=0.0)
    rows, targets, weights = [], [], []
    for gpus, share in points:
        known = _point(workload, bare, gpus)[4]  # network + loader waits
        rows.append([workload.backward_s, math.sqrt(workload.busy_s) * straggler_factor(gpus)])
        targets.append(share / (1.0 - share) * workload.busy_s - known)
        weights.append((1.0 - share) ** 2)
    beside, spread = _nonnegative_lstsq(rows, targets, weights)
    return replace(machine, noise_s=spread ** 2, beside_compute=beside)


def fit_loader_stall(points: Sequence[Tuple[int, float]], workload: Workload, machine: Machine) -> float:
    """The data wait per step (s) of a loader that cannot keep up which best reproduces the comm shares."""
    _check_shares(points)

    def cost(data_s: float) -> float:
        loaded = replace(workload, data_s=data_s)
        return sum((1 - share) ** 2 * (p.comm_share - share) ** 2
                   for p, (_, share) in zip(predict(loaded, machine, [g for g, _ in points]), points))

    low, high = 0.0, 10.0 * workload.compute_s  # golden-section search
    ratio = (5 ** 0.5 - 1) / 2
    for _ in range(80):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if cost(a) <= cost(b):
            high = b
        else:
            low = a
    return (low + high) / 2


# --- Published data -------------------------------------------------------------------------------

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


def published_workload(model: str = "resnet50") -> Workload:
    """Table 2a's workload per GPU: batch 64, compute from the published A100 TF32 throughput (FLOP-scaled
    for other models), plus the I/O kernels' GPU time in the table's proportion to compute (DALI decodes on
    the GPU; the same share with the native loader's copies), data wait 0."""
    row = load_published()["dali"][0]
    compute = DEFAULT_BATCH / (PUBLISHED_RESNET50_IMAGES_PER_S["A100"] * MODEL_GFLOPS["resnet50"] / MODEL_GFLOPS[model])
    return Workload(compute * (1 + row.io / row.compute), DEFAULT_BATCH, gradient_bytes(model))


@dataclass(frozen=True)
class PublishedFit:
    machine: Machine  # JUWELS Booster's, fitted on the DALI column
    native_data_fraction: float  # the native loader's data wait per step / compute, fitted on its column


def fit_published(max_gpus: int = CALIBRATION_MAX_GPUS, path: Path = AACH2023_TABLE2A) -> PublishedFit:
    """One machine fit for Table 2a's machine on its DALI column (DALI keeps up: no loader wait), then the
    native loader's data wait on the native column with that machine; both on counts <= `max_gpus`."""
    columns = load_published(path)
    workload = published_workload()
    machine = fit_machine([(r.gpus, r.comm_share) for r in columns["dali"] if r.gpus <= max_gpus], workload, AACH2023_MACHINE)
    data_s = fit_loader_stall([(r.gpus, r.comm_share) for r in columns["native"] if r.gpus <= max_gpus], workload, machine)
    return PublishedFit(machine, data_s / workload.compute_s)


# --- The user's runs ------------------------------------------------------------------------------

def workload_of_run(run: Run) -> Workload:
    """The workload measured by a profiled run (its other time: step minus compute, comm and data)."""
    p = run.profile
    assert p is not None
    return Workload(p.compute_s, run.key.batch_per_worker, gradient_bytes(run.key.model), p.data_s,
                    max(0.0, p.step_s - p.compute_s - p.comm_s - p.data_s), run.key.framework,
                    reads_files=run.key.loader == "native")


def _wall_step_s(run: Run) -> float:
    return run.world_size * run.key.batch_per_worker / run.throughput


def _layout(machine: Machine, run: Run) -> Machine:
    """`machine` with the run's GPUs per node."""
    return replace(machine, gpus_per_node=max(1, run.world_size // run.nodes))


def fit_runs(runs: Sequence[Run], base: Machine) -> Machine:
    """`base` with the network fitted to the runs' measured all-reduce time and the noise to their
    wall-clock step time. The profile's comm_s is one ring all-reduce of all gradients, in which latency
    and inverse bandwidth enter linearly. A side (inside a node, across nodes) with no run keeps
    `base`'s figures; the inter-node latency is fitted only from two or more node counts."""
    multi = [r for r in runs if r.world_size > 1]
    machine = base
    for inside in (True, False):
        side = [r for r in multi if (r.nodes == 1) == inside]
        if not side:
            continue
        fit_latency = not inside and len({r.nodes for r in side}) > 1
        rows, targets = [], []
        for r in side:
            bare = replace(_layout(machine, r), latency_us=0.0 if fit_latency else machine.latency_us)
            volume = 2 * (r.world_size - 1) / r.world_size * gradient_bytes(r.key.model)
            rows.append(([2 * (r.nodes - 1) * RING_PLATEAU * 1e-6] if fit_latency else []) + [volume])
            targets.append(r.profile.comm_s - bare.ring_allreduce_s(r.world_size, 0.0))
        coef = _nonnegative_lstsq(rows, targets, [1.0] * len(rows))
        if coef[-1] <= 0:
            continue  # faster than the latency alone explains: keep the nominal bandwidth
        if inside:
            machine = replace(machine, intra_node_gbps=8e-9 / coef[-1])
        else:
            machine = replace(machine, bandwidth_gbps_per_node=8e-9 / coef[-1],
                              latency_us=coef[0] if fit_latency else machine.latency_us)
    if not multi:
        return machine
    rows, targets = [], []
    for r in multi:
        workload = workload_of_run(r)
        rows.append([math.sqrt(workload.busy_s) * straggler_factor(r.world_size)])
        targets.append(_wall_step_s(r) - _point(workload, replace(_layout(machine, r), noise_s=0.0), r.world_size)[0])
    return replace(machine, noise_s=_nonnegative_lstsq(rows, targets, [1.0] * len(rows))[0] ** 2)


@dataclass(frozen=True)
class LeftOut:
    run: Run
    predicted: Optional[float]  # images/s; None when the other runs cannot predict it
    why: str = ""

    @property
    def error(self) -> Optional[float]:
        return None if self.predicted is None else self.predicted / self.run.throughput - 1.0


def predict_run(reference: Run, machine: Machine, gpus: int) -> float:
    """Images/s at `gpus` from a reference run's workload and a fitted machine."""
    workload = workload_of_run(reference)
    step = _point(workload, machine, gpus)[0]
    return gpus * workload.batch / step


def leave_one_out(runs: Sequence[Run], base: Optional[Machine], gpus_per_node: int) -> List[LeftOut]:
    """Each run predicted from a fit on the others (their smallest run is the reference workload)."""
    out = []
    for i, run in enumerate(runs):
        rest = [r for j, r in enumerate(runs) if j != i]
        across = run.nodes > 1
        if base is None and run.world_size > 1 and not any(r.world_size > 1 and (r.nodes > 1) == across for r in rest):
            out.append(LeftOut(run, None, "the others hold no %s run and the site no [network]"
                               % ("multi-node" if across else "multi-GPU single-node")))
            continue
        machine = fit_runs(rest, base or _unknown_network(gpus_per_node))
        machine = _layout(machine, run)
        out.append(LeftOut(run, predict_run(min(rest, key=lambda r: r.world_size), machine, run.world_size)))
    return out


def _unknown_network(gpus_per_node: int) -> Machine:
    """A placeholder network for a site without [network]: replaced by the fit wherever a run measures it."""
    return Machine(gpus_per_node, 0.0, DEFAULT_INTRA_NODE_GBPS, DEFAULT_INTRA_NODE_GBPS)


def calibration_runs(paths: Sequence[Path]) -> List[Run]:
    """Profiled runs of one workload with measured throughput, smallest first (errors name --from-runs)."""
    loaded = load_runs([str(p) for p in paths]) if paths else None
    if loaded is None or loaded.rejected:
        raise DlaunchError("--from-runs: %s" % (loaded.rejected[0] if loaded else "no runs given"))
    runs = loaded.runs
    if len(runs) < 2:
        raise DlaunchError("--from-runs: %d run(s) found, at least 2 GPU counts are needed; %s" % (len(runs), CALIBRATION_HOWTO))
    for run in runs:
        if run.profile is None:
            raise DlaunchError("--from-runs: %s has no profile record; %s" % (run.path, CALIBRATION_HOWTO))
        if run.throughput is None:
            raise DlaunchError("--from-runs: %s has no measured epoch (more --steps than --warmup-steps + "
                               "--profile-steps are needed); %s" % (run.path, CALIBRATION_HOWTO))
        if run.key.model not in MODEL_PARAMS_M:
            raise DlaunchError("--from-runs: %s trains %r, not a model the model knows" % (run.path, run.key.model))
    keys = {r.key[2:] for r in runs}
    if len(keys) > 1:
        raise DlaunchError("--from-runs: the runs mix workloads (model/framework/loader/batch): %s"
                           % ", ".join(sorted("%s/%s/%s/b%d" % k for k in keys)))
    if len({r.world_size for r in runs}) < 2:
        raise DlaunchError("--from-runs: all runs use %d GPUs; at least 2 GPU counts are needed; %s"
                           % (runs[0].world_size, CALIBRATION_HOWTO))
    return sorted(runs, key=lambda r: (r.world_size, r.path))


# --- The command ----------------------------------------------------------------------------------

def interconnect_of_site(site: Site) -> Optional[Machine]:
    """The nominal machine of a site profile with a `[network]` section (None without one)."""
    if site.network is None:
        return None
    return Machine(site.gpus_per_node, site.network.latency_us, site.network.bandwidth_gbps_per_node)


def site_max_gpus(site: Site) -> int:
    """GPUs of the site's largest partition (one node for a local site)."""
    return max([p.max_nodes for p in site.partitions] or [1]) * site.gpus_per_node


def parse_gpu_counts(text: str, site: Optional[Site] = None) -> List[int]:
    """`4,8,16` -> [4, 8, 16] (sorted, unique, within what the site has)."""
    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise DlaunchError("--gpus: %r is not a comma-separated list of integers" % text) from None
    if counts[0] < 1:
        raise DlaunchError("--gpus: GPU counts must be >= 1 (got %r)" % text)
    if site is not None and counts[-1] > site_max_gpus(site):
        raise DlaunchError("--gpus: %d GPUs is more than site %s has (%d: nodes of its largest partition x %d GPUs per node)"
                           % (counts[-1], site.name, site_max_gpus(site), site.gpus_per_node))
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
    if model is not None and model not in MODEL_PARAMS_M:
        raise DlaunchError("--model: unknown model %r (known: %s)" % (model, ", ".join(sorted(MODEL_PARAMS_M))))
    if batch is not None and batch < 1:
        raise DlaunchError("--batch: must be >= 1 (got %d)" % batch)
    if compute_ms is not None and not compute_ms > 0:
        raise DlaunchError("--compute-ms: must be positive (got %r)" % compute_ms)
    if data_ms is not None and not data_ms >= 0:
        raise DlaunchError("--data-ms: must not be negative (got %r)" % data_ms)
    source, reads_files = "--compute-ms", False
    if from_run is not None:
        loaded = load_runs([str(from_run)])
        if loaded.rejected:
            raise DlaunchError("--from-run: %s" % loaded.rejected[0])
        if len(loaded.runs) != 1:
            raise DlaunchError("--from-run: %s holds %d runs, expected one" % (from_run, len(loaded.runs)))
        run = loaded.runs[0]
        if run.profile is None:
            raise DlaunchError("--from-run: %s has no profile record (run the trainer with --profile-steps N)" % run.path)
        if model is not None and model != run.key.model and compute_ms is None:
            raise DlaunchError("--from-run: %s trains %s, not --model %s: its compute time does not transfer "
                               "(leave out --model, or give --compute-ms)" % (run.path, run.key.model, model))
        model = model or run.key.model
        if model not in MODEL_PARAMS_M:
            raise DlaunchError("--from-run: %s trains %r, not a model the model knows" % (run.path, model))
        compute_ms = compute_ms if compute_ms is not None else 1e3 * run.profile.compute_s
        data_ms = data_ms if data_ms is not None else 1e3 * run.profile.data_s
        batch = batch or run.key.batch_per_worker
        reads_files = run.key.loader == "native"
        source = "measured in %s" % run.path
        if site is not None and run.key.site != site.name:
            source += (" on site %s: the compute and data times transfer to %s only if its GPUs (and CPUs) are the same"
                       % (run.key.site, site.name))
    if compute_ms is None and model is not None and site is not None:
        batch = batch or DEFAULT_BATCH
        compute_ms = published_compute_ms(site, model, batch)
        source = "published %s throughput (NVIDIA DeepLearningExamples, TF32), scaled by model FLOPs" % site.gpu_model
    if model is None:
        raise DlaunchError("--model is needed unless --from-run names a profiled run (known: %s)" % ", ".join(sorted(MODEL_PARAMS_M)))
    if compute_ms is None:
        raise DlaunchError("--compute-ms: no published throughput for %s on site %s; give a measured compute time "
                           "(or --from-run / --from-runs)" % (model, site.name if site else "-"))
    if batch is None:
        raise DlaunchError("--batch: needed with --compute-ms (the batch per GPU it was measured with)")
    return model, Workload(compute_ms / 1e3, batch, gradient_bytes(model), (data_ms or 0.0) / 1e3,
                           reads_files=reads_files), source


PREDICTION_HEADERS = ["GPUs", "nodes", "step ms", "comm ms", "exposed comm ms", "images/s", "S_G", "E_G", "comm %", "algorithm"]
LOO_HEADERS = ["left out", "GPUs", "measured images/s", "predicted images/s", "error %"]


def prediction_rows(predictions: Sequence[Prediction]) -> List[List[str]]:
    return [[str(p.gpus), str(p.nodes), "%.2f" % (1e3 * p.step_s), "%.2f" % (1e3 * p.comm_s),
             "%.2f" % (1e3 * p.exposed_comm_s), "%.1f" % p.images_per_s, "%.2f" % p.speedup,
             "%.3f" % p.efficiency, "%.1f" % (100 * p.comm_share), p.algorithm] for p in predictions]


def loo_rows(left_out: Sequence[LeftOut]) -> List[List[str]]:
    return [[lo.run.path, str(lo.run.world_size), "%.1f" % lo.run.throughput,
             "-" if lo.predicted is None else "%.1f" % lo.predicted,
             lo.why if lo.error is None else "%+.1f" % (100 * lo.error)] for lo in left_out]


def loo_summary(left_out: Sequence[LeftOut]) -> str:
    errors = [abs(lo.error) for lo in left_out if lo.error is not None]
    if not errors:
        return "leave-one-out error: none of the %d runs can be predicted from the others" % len(left_out)
    return ("leave-one-out error of the images/s: mean %.1f %%, max %.1f %% (%d of %d runs predicted from the others)"
            % (100 * mean(errors), 100 * max(errors), len(errors), len(left_out)))


def _from_runs(paths: Sequence[Path], profile: Site,
               say: Callable[[str], None]) -> Tuple[str, Workload, Machine, str, List[LeftOut]]:
    runs = calibration_runs(paths)
    base = interconnect_of_site(profile)
    left_out = leave_one_out(runs, base, profile.gpus_per_node)
    machine = replace(fit_runs(runs, base or _unknown_network(profile.gpus_per_node)), gpus_per_node=profile.gpus_per_node)
    reference = runs[0]
    say("calibrated on %d runs (%s GPUs); each run predicted from the others:" % (len(runs), ",".join(str(r.world_size) for r in runs)))
    return reference.key.model, workload_of_run(reference), machine, "measured in %s" % reference.path, left_out


MODELLED = image_frameworks("torch")  # DDP buckets, Horovod fusion, DeepSpeed ZeRO
Framework = Annotated[Literal[MODELLED], typer.Option(help="Framework: how gradients travel (DDP buckets, Horovod fusion, DeepSpeed ZeRO).")]


def predict_command(
    site: Annotated[str, typer.Option(help="Site profile (name or TOML path); its \\[network] section gives the nominal interconnect.")],
    gpus: Annotated[Optional[str], typer.Option(help="Comma-separated GPU counts; E_G is relative to the smallest. Default: 4, 8, ... 1024, up to what the site has.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model (gradient size from its parameter count).")] = None,
    compute_ms: Annotated[Optional[float], typer.Option(parser=finite_number(), help="Measured forward+backward time per step (ms).")] = None,
    data_ms: Annotated[Optional[float], typer.Option(parser=finite_number(), help="Measured time waiting for data per step (ms); default 0 (the loader keeps up).")] = None,
    batch: Annotated[Optional[int], typer.Option(help="Batch per GPU the compute time was measured with.")] = None,
    framework: Framework = "ddp",
    zero_stage: Annotated[int, typer.Option(min=0, max=2, help="DeepSpeed ZeRO stage (0: all-reduce; 1, 2: reduce-scatter + all-gather).")] = 0,
    from_run: Annotated[Optional[Path], typer.Option(help="Run directory or metrics file with a profile record (the workload only).")] = None,
    from_runs: Annotated[Optional[List[Path]], typer.Option(help="Calibrate machine and workload on your own small sweep: run directories or a sweep folder (repeat the flag), >= 2 GPU counts, each run made with --profile-steps N (e.g. `dlaunch sweep --nodes 1,2,4 --steps 60 --warmup-steps 10 --profile-steps 20`). Prints each run's leave-one-out error.")] = None,
    calibrated: Annotated[Optional[str], typer.Option(help="Machine noise fitted to Aach et al. 2023 Table 2a (JUWELS Booster, ResNet-50 DDP) on its 4-64 GPUs: 'dali' (loader keeps up) or 'native' (adds the native loader's fitted data wait unless --data-ms is given, and the storage ceiling if --storage-images-per-s is given).")] = None,
    storage_images_per_s: Annotated[Optional[float], typer.Option(parser=finite_number(), help="Images/s the site's shared file system sustains for a loader that reads every sample as a file (native): p GPUs cannot step faster than p * batch / this. Default: the site's [storage] loader_images_per_s, else no ceiling (unknown).")] = None,
) -> None:
    """Predict step time, throughput and E_G over GPU counts (NCCL ring/tree cost model, buckets, stragglers)."""
    profile = resolve_site(site)
    counts = parse_gpu_counts(gpus, profile) if gpus else [g for g in DEFAULT_GPU_COUNTS if g <= site_max_gpus(profile)] or [1]
    console = Console(soft_wrap=True)

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    if storage_images_per_s is not None and not storage_images_per_s > 0:
        raise DlaunchError("--storage-images-per-s: must be positive (got %r)" % storage_images_per_s)
    left_out: List[LeftOut] = []
    if from_runs:
        if from_run is not None or calibrated is not None:
            raise DlaunchError("--from-runs: not together with --from-run or --calibrated")
        model_name, workload, machine, source, left_out = _from_runs(from_runs, profile, say)
        machine_source = "fitted on your runs"
    else:
        machine = interconnect_of_site(profile)
        if machine is None:
            raise DlaunchError("--site: site %s has no [network] section (latency_us, bandwidth_gbps_per_node); "
                               "add one or calibrate with --from-runs" % profile.name)
        model_name, workload, source = workload_from_options(model, compute_ms, data_ms, batch, from_run, profile)
        machine_source = "nominal (site profile), no timing noise"
        if calibrated is not None:
            if calibrated not in ("dali", "native"):
                raise DlaunchError("--calibrated: %r is not a column of %s (dali, native)" % (calibrated, AACH2023_TABLE2A.name))
            fit = fit_published()
            machine = replace(machine, noise_s=fit.machine.noise_s, beside_compute=fit.machine.beside_compute)
            machine_source = "noise fitted on Aach et al. 2023 Table 2a, 4-%d GPUs (JUWELS Booster)" % CALIBRATION_MAX_GPUS
            if calibrated == "native":
                workload = replace(workload, reads_files=True)
                if data_ms is None:
                    workload = replace(workload, data_s=fit.native_data_fraction * workload.compute_s)
    workload = replace(workload, framework=framework, zero_stage=zero_stage if framework == "deepspeed" else 0)
    if storage_images_per_s is None and profile.storage is not None:  # the site's [storage] fact
        storage_images_per_s = profile.storage.loader_images_per_s
    machine = replace(machine, storage_images_per_s=storage_images_per_s)
    storage = ("no ceiling" if not (workload.reads_files and machine.storage_images_per_s)
               else "%.0f images/s for a loader reading files" % machine.storage_images_per_s)
    if left_out:
        console.print(rich_table(None, LOO_HEADERS, loo_rows(left_out)))
        say(loo_summary(left_out))
    say("%s on %s, %s: %.1f MB fp32 gradients, compute %.2f ms + data %.2f ms + other %.2f ms per step, batch %d per GPU\n"
        "machine (%s): %.2f us fabric latency, %.0f Gbit/s per node of %d GPUs, %.0f Gbit/s per GPU in a node, "
        "timing noise %.2g s, NCCL kernels beside back-propagation %.2f, storage %s\ncompute time: %s"
        % (model_name, profile.name, framework, workload.gradient_bytes / 1e6, 1e3 * workload.compute_s,
           1e3 * workload.data_s, 1e3 * workload.other_s, workload.batch, machine_source, machine.latency_us,
           machine.bandwidth_gbps_per_node, machine.gpus_per_node, machine.intra_node_gbps, machine.noise_s,
           machine.beside_compute, storage, source))
    console.print(rich_table(None, PREDICTION_HEADERS, prediction_rows(predict(workload, machine, counts))))
