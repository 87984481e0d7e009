"""Performance model v3: step time, throughput, E_G and NCCL kernel shares from one model; `dlaunch predict`.

The machine (dlaunch/analysis/perfmodel_nccl.py: NCCL's cost model, the ranks' timing noise, the storage)
is kept apart from the workload (compute, data and other time per step, gradient bytes, framework). A
machine is fitted once per site, from published data (`--calibrated`) or the user's own runs
(`--from-runs`), and then applied unchanged to every model, batch and framework.

One step on p GPUs, timed from the end of the previous step's last collective (all ranks leave it
together):

    busy      other + data + compute (forward, then back-propagation = 2/3 of compute): the step's
              work on one rank, without communication. `compute` is all the GPU's kernel time other
              than NCCL's (cuDNN, element-wise, optimizer, and a GPU loader's I/O kernels).
    messages  DDP: gradient buckets (1 MiB first, then 25 MiB), ready one after another during
              back-propagation (by gradient bytes) and all-reduced in order, overlapping it; Horovod:
              buffers of the fusion threshold, likewise; DeepSpeed ZeRO-0: all-reduce after
              back-propagation; ZeRO-1/2: reduce-scatter of the gradients plus all-gather of the
              updated parameters, after back-propagation.
    lag(t)    how much later than the others the slowest rank reaches time t of the step:
              sqrt(noise_s * t) * S_p, the host and OS delays it accumulated since the step began
              (S_p = straggler_factor(p), perfmodel_nccl.py), plus data * S_p / sqrt(batch) for a
              loader that cannot keep up (`loader_spread`: a batch's samples are read one after
              another, each with an exponential delay).
    kernel    NCCL kernel time per step (what NSys profiles count, Aach et al. 2023 Table 2a): the
              transfers, plus each message's wait for its slowest peer, lag(ready) (its kernel
              starts when the own rank is ready and spins until every rank has joined, while
              back-propagation goes on beside it; kernels run one after another on one NCCL stream,
              so a wait ends at the latest when the next message is ready), plus beside_compute x
              the back-propagation the messages overlap (kernels waiting for the next bucket and
              slowed by sharing the GPU). comm share = kernel / (kernel + compute).
    exposed   what the step waits for beyond its work: the transfers left over after
              back-propagation and the last message's wait, lag(busy) (and a storage stall, below).
              The earlier waits are hidden behind back-propagation: kernel time counts every
              message's wait, the step only the last one.
    step      busy + exposed.
    epoch     steps = ceil(images / (p * batch)) per epoch (ImageNet-1k's 1,281,167 training images unless
              given another size), and the epoch's overhead outside its steps, O(p) seconds (loader start,
              validation, checkpoint, barriers, logging: `--epoch-overhead`, the runs' measured mean with
              `--from-runs`, or Aach et al.'s setup with `--calibrated`, `PaperOverhead`), shared by its steps
              as metrics-v4's reader shares it:  X = p * batch / (step + O / steps);
              E_G = (X_G / X_ref) / (G / G_ref).
    storage   a loader that reads every sample as a file (native) on a file system that sustains R
              images/s: p GPUs cannot step faster than p * batch / R. The stall is every rank's extra
              data wait, with the spread of any data wait: the slowest rank's adds to lag, so the
              others' kernels wait for it at every message.
    loader CPU the native loader's worker processes decode and augment NATIVE_WORKERS x
              NATIVE_WORKER_IMAGES_PER_S images/s per GPU (measured): a GPU that takes a batch faster
              waits for the rest of it (`calibrated_workload`).
    precision the published compute time is the A100's TF32 or mixed-precision figure; Aach et al.'s
              DeepSpeed runs are assumed fp16 (`paper_precision`, printed by `predict`), which gives
              DeepSpeed a faster one-node reference behind the same file system, hence a lower E_G.
    profiled  what the trainer's `--profile-steps` measures (un-overlapped timers): one ring
              all-reduce of all gradients after compute, which waits lag(busy) for the slowest
              rank; profiled comm share = comm / (comm + compute + data).

The timing noise is a machine property in seconds (the variance of a rank's delay per second of
work), so a model with more work per step loses a smaller fraction of it to stragglers.

Fits. `fit_machine`: noise_s and beside_compute from kernel-time comm shares; `fit_loader_stall`: the
data wait of a loader that cannot keep up; `fit_storage`: the file system's images/s from published
E_G statements (each framework with the paper's workload, `paper_workload`); `fit_runs`: the network
and the noise from the user's runs (their profiled all-reduce and wall-clock step time), with a
leave-one-out error of step time and profiled comm share (`leave_one_out`). All fits are a few
parameters solved in pure Python (`dlaunch predict` starts without numpy).
"""
import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import mean
from typing import Annotated, Callable, Dict, List, Literal, NamedTuple, Optional, Sequence, Tuple, Union

import typer
from rich.console import Console

from dlaunch.analysis.scaling import Run, find_metrics_files, load_runs, run_from_metrics
from dlaunch.boundary import finite_number
from dlaunch.errors import DlaunchError
from dlaunch.analysis.perfmodel_nccl import DEFAULT_INTRA_NODE_GBPS, RING_PLATEAU, Machine, straggler_factor
from dlaunch.jobs.sites import Site, resolve_site
from dlaunch.paths import PUBLISHED_DIR
from dlaunch.tables import fit_table
from dlaunch.train.config import workload_flags
from dlaunch.train.framework_table import gradient_exchanges
from dlaunch.train.metrics_schema import MetricsError, read_metrics

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
# Published single-GPU ResNet-50 training throughput (images/s) by GPU model prefix and precision: NVIDIA
# DeepLearningExamples, PyTorch ResNet-50 v1.5, DGX A100, batch 256, a whole training step (all its
# kernels; data/published/nvidia_resnet50_a100.csv): tf32 = PyTorch's default precision on an A100,
# fp16 = mixed precision. The default compute time of `dlaunch predict` when no measurement is given.
PUBLISHED_RESNET50_IMAGES_PER_S: Dict[str, Dict[str, float]] = {"A100": {"tf32": 938.0, "fp16": 2470.0}}
PRECISIONS = ("tf32", "fp16")
DEFAULT_BATCH = 64  # the paper's batch per GPU
DEFAULT_GPU_COUNTS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
BACKWARD_FRACTION = 2.0 / 3.0  # backward ~ 2x forward
DDP_FIRST_BUCKET_BYTES = 1024.0 ** 2  # torch.distributed's first bucket
DDP_BUCKET_BYTES = 25 * 1024.0 ** 2  # DistributedDataParallel(bucket_cap_mb=25)
DEFAULT_FUSION_MB = 64.0  # HOROVOD_FUSION_THRESHOLD's default (the trainer's --fusion-threshold-mb)
DEEPSPEED_BUCKET_BYTES = 4 * 5e8  # reduce_bucket_size: 5e8 fp32 elements
# The native loader's CPU side: DataLoader worker processes per GPU (Aach et al.: 8 CPU threads per
# loader instance), each decoding and augmenting about 170 ImageNet-sized JPEGs per second (measured
# on an AMD EPYC core with the trainer's native pipeline, benchmarks/README.md): a GPU that takes a
# batch faster than they make one waits for its data.
NATIVE_WORKERS = 8
NATIVE_WORKER_IMAGES_PER_S = 170.0
# Epochs: ImageNet-1k (Aach et al.: 1,281,167 training and 50,000 validation images, validated every epoch).
IMAGENET_TRAIN_IMAGES = 1281167
IMAGENET_VAL_IMAGES = 50000
# `predict` names the GPU count from which epoch overhead is more than this share of a run's time.
OVERHEAD_SHARE_LIMIT = 0.10

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

    compute_s: float  # forward + backward: the GPU's kernel time other than NCCL's
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
        """The step's work without communication, over which a rank's delays accumulate."""
        return self.other_s + self.data_s + self.compute_s

    @property
    def backward_start_s(self) -> float:
        return self.busy_s - self.backward_s


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
    """The collectives of one step, in the order they are issued (how gradients travel: the framework
    table's `gradient_exchange`)."""
    total = workload.gradient_bytes
    exchange = gradient_exchanges().get(workload.framework)
    if exchange in ("ddp-buckets", "horovod-fusion"):
        sizes = (_buckets(total, DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES) if exchange == "ddp-buckets"
                 else _buckets(total, workload.fusion_mb * 1024 ** 2, workload.fusion_mb * 1024 ** 2))
        done, out = 0.0, []
        for size in sizes:
            done += size
            out.append(Message("allreduce", size, done / total))
        return out
    if exchange == "deepspeed-zero":
        if workload.zero_stage == 0:
            return [Message("allreduce", s, 1.0) for s in _buckets(total, DEEPSPEED_BUCKET_BYTES, DEEPSPEED_BUCKET_BYTES)]
        if workload.zero_stage in (1, 2):
            return [Message("reduce_scatter", total, 1.0), Message("all_gather", total, 1.0)]
        raise ValueError("ZeRO stage %r is not modelled (0, 1, 2)" % workload.zero_stage)
    raise ValueError("unknown framework %r (known: %s)" % (workload.framework, ", ".join(gradient_exchanges())))


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
class StepTimes:
    """One GPU count's step, in seconds (see the module docstring)."""

    step: float
    network: float  # transfers of the step's collectives
    exposed: float  # what the step waits for beyond its work: transfers left over, the last wait, the storage stall
    waits: float  # the slowest rank's lag at the end of the step (noise, loader) and the storage stall
    hidden_waits: float  # the kernels' waits for their peers that back-propagation hides
    kernel: float  # NCCL kernel time
    stall: float  # the storage stall: every rank's mean extra data wait (in `waits`)
    profiled_comm: float  # what --profile-steps measures as comm
    algorithm: str


def loader_spread(gpus: int, batch: int) -> float:
    """How much longer than the others the slowest of `gpus` ranks waits for its batch, per second of
    mean data wait: a batch's `batch` samples are read one after another, each with an exponential
    delay, so a rank's data wait has the spread mean / sqrt(batch)."""
    return straggler_factor(gpus) / math.sqrt(batch)


def step_times(workload: Workload, machine: Machine, gpus: int) -> StepTimes:
    """The step on `gpus` GPUs: time, exposed and hidden waits, NCCL kernel time."""
    network, left_over, algorithm = network_timeline(workload, machine, gpus)
    if gpus <= 1:
        return StepTimes(workload.busy_s, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, algorithm)
    spread = loader_spread(gpus, workload.batch)

    def lag(t: float, data: float) -> float:
        return machine.lateness_s(t, gpus) + data * spread

    unstalled = workload.busy_s + left_over + lag(workload.busy_s, workload.data_s)
    stall = 0.0  # the mean extra data wait; the slowest rank waits (1 + spread) times it
    if workload.reads_files and machine.storage_images_per_s:
        stall = max(0.0, gpus * workload.batch / machine.storage_images_per_s - unstalled) / (1.0 + spread)
    data = workload.data_s + stall
    end_lag = lag(workload.busy_s, data)
    msgs = messages(workload)
    ready = [workload.backward_start_s + m.ready * workload.backward_s for m in msgs]
    waits = [min(lag(t, data), following - t) for t, following in zip(ready, ready[1:])]
    overlapped = workload.backward_s * (1.0 - msgs[0].ready)
    kernel = network + math.fsum(waits) + end_lag + machine.beside_compute * overlapped
    profiled = machine.ring_allreduce_s(gpus, workload.gradient_bytes) + end_lag
    return StepTimes(workload.busy_s + stall + left_over + end_lag, network, stall + left_over + end_lag, end_lag + stall,
                     math.fsum(waits), kernel, stall, profiled, algorithm)


def steps_per_epoch(gpus: int, batch: int, images: int = IMAGENET_TRAIN_IMAGES) -> int:
    """Steps of an epoch of `images` at `batch` per GPU on `gpus` GPUs (the last one partial)."""
    return -(-images // (gpus * batch))


@dataclass(frozen=True)
class FixedOverhead:
    """An epoch overhead of `seconds` per epoch whatever the GPU count (stated, or measured by runs)."""

    seconds: float
    source: str

    def parts(self, workload: Workload, machine: Machine, gpus: int) -> Dict[str, float]:
        return {self.source: self.seconds}


@dataclass(frozen=True)
class PaperOverhead:
    """Aach et al.'s epoch outside its steps (seconds), from the paper's stated setup
    (../shared/papers/aach2023-design.md: ImageNet's 50,000 validation images every epoch, batch 64 per GPU,
    DALI or the native loader with 8 CPU threads per loader, 90 epochs); what it leaves unstated is
    assumed (`paper_overhead_assumptions`, printed by `predict`):

    validation      forward only over ceil(50,000 / p) images per GPU: per image the loader's I/O kernels
                    (`io_s` per batch, inside compute_s) and the rest of compute without back-propagation;
                    the native loader's 8 workers make at most native_loader_images_per_s, and all ranks
                    together read at most the file system's images/s.
    loader start    native: the DataLoader's workers start again for training and validation every epoch
                    (PyTorch's default, persistent_workers=False): each waits for its first batch, made by
                    one worker (batch / NATIVE_WORKER_IMAGES_PER_S); DALI: none (its pipelines are built
                    once and prefetch across the iterator's reset at an epoch's end).
    synchronisation the validation's accuracy all-reduce and the epoch's closing barrier (two small
                    all-reduces), after the slowest rank's lag over the validation pass.
    checkpoint, logging  not stated: none (0 s).
    """

    loader: str  # 'dali' or 'native'
    io_s: float = 0.0  # the loader's I/O kernel seconds per batch within the workload's compute_s

    def parts(self, workload: Workload, machine: Machine, gpus: int) -> Dict[str, float]:
        forward_per_image = (self.io_s + (workload.compute_s - self.io_s) * (1.0 - BACKWARD_FRACTION)) / workload.batch
        if self.loader == "native":
            forward_per_image = max(forward_per_image, 1.0 / native_loader_images_per_s())
        validation = -(-IMAGENET_VAL_IMAGES // gpus) * forward_per_image
        if workload.reads_files and machine.storage_images_per_s:
            validation = max(validation, IMAGENET_VAL_IMAGES / machine.storage_images_per_s)
        start = 2 * workload.batch / NATIVE_WORKER_IMAGES_PER_S if self.loader == "native" else 0.0
        sync = machine.lateness_s(validation, gpus) + 2 * machine.allreduce_s(gpus, 8.0)
        return {"validation": validation, "loader start": start, "synchronisation": sync, "checkpoint": 0.0, "logging": 0.0}


EpochOverhead = Union[FixedOverhead, PaperOverhead]


def paper_overhead_assumptions(loader: str) -> List[str]:
    """What `PaperOverhead` assumes where Aach et al. are silent (printed by `predict`)."""
    start = ("the native loader's DataLoader workers start again every epoch for training and validation "
             "(PyTorch's default persistent_workers=False), each first batch made by one worker at %.0f images/s"
             % NATIVE_WORKER_IMAGES_PER_S if loader == "native" else
             "DALI's pipelines are built once and prefetch across epoch ends (no start cost)")
    return [start, "no checkpoint (not stated; 0 s)", "no logging cost (not stated; 0 s)",
            "validation in forward only (a third of the step's non-I/O kernels, its I/O kernels per image)"]


@dataclass(frozen=True)
class Prediction:
    gpus: int
    nodes: int
    step_s: float
    comm_s: float  # network time of the step's collectives
    exposed_comm_s: float  # what the step waits for beyond its work: transfers left over + wait_s
    wait_s: float  # the last message's wait for the slowest rank (noise, loader) + the storage stall
    hidden_wait_s: float  # the earlier kernels' waits for their peers: NCCL kernel time, not step time
    kernel_comm_s: float  # NCCL kernel time, as profiles count it
    algorithm: str
    images_per_s: float
    speedup: float
    efficiency: float
    comm_share: float  # NCCL kernel time / (NCCL + compute kernel time), as Table 2a
    profiled_comm_share: float  # what --profile-steps measures: comm / (comm + compute + data)
    steps_per_epoch: int = 0
    epoch_overhead: Dict[str, float] = field(default_factory=dict)  # seconds per epoch outside the steps, by part

    @property
    def epoch_overhead_s(self) -> float:
        return math.fsum(self.epoch_overhead.values())

    @property
    def overhead_share(self) -> float:
        """Epoch overhead's share of the run's time: overhead / (steps x step + overhead)."""
        total = self.steps_per_epoch * self.step_s + self.epoch_overhead_s
        return self.epoch_overhead_s / total if total > 0 else 0.0


def predict(workload: Workload, network: Machine, gpus: Sequence[int], overhead: Optional[EpochOverhead] = None,
            epoch_images: int = IMAGENET_TRAIN_IMAGES) -> List[Prediction]:
    """The model's curve over `gpus` (sorted); E_G and speed-up relative to the smallest count; epochs of
    `epoch_images` with `overhead` outside their steps."""
    counts = sorted(set(gpus))
    if not counts or counts[0] < 1:
        raise ValueError("GPU counts must be >= 1")
    rows = [(p, step_times(workload, network, p)) for p in counts]
    steps = {p: steps_per_epoch(p, workload.batch, epoch_images) for p in counts}
    parts = {p: overhead.parts(workload, network, p) if overhead else {} for p in counts}
    x = {p: p * workload.batch / (t.step + math.fsum(parts[p].values()) / steps[p]) for p, t in rows}
    g_ref = counts[0]
    out = []
    for p, t in rows:
        profiled_data = workload.data_s + t.stall
        out.append(Prediction(
            gpus=p, nodes=network.nodes(p), step_s=t.step, comm_s=t.network, exposed_comm_s=t.exposed, wait_s=t.waits,
            hidden_wait_s=t.hidden_waits, kernel_comm_s=t.kernel, algorithm=t.algorithm, images_per_s=x[p],
            speedup=x[p] / x[g_ref], efficiency=(x[p] / x[g_ref]) / (p / g_ref),
            comm_share=t.kernel / (t.kernel + workload.compute_s),
            profiled_comm_share=t.profiled_comm / (t.profiled_comm + workload.compute_s + profiled_data),
            steps_per_epoch=steps[p], epoch_overhead=parts[p],
        ))
    return out


def overhead_passes(workload: Workload, machine: Machine, overhead: EpochOverhead, start: int, limit: int,
                    epoch_images: int = IMAGENET_TRAIN_IMAGES) -> Optional[int]:
    """The smallest GPU count from `start` (then whole nodes) up to `limit` at which epoch overhead is more
    than OVERHEAD_SHARE_LIMIT of the run's time; None when it stays below up to `limit`."""
    node = machine.gpus_per_node
    counts = [start] + list(range(-(-(start + 1) // node) * node, limit + 1, node))
    for gpus in counts:
        if predict(workload, machine, [gpus], overhead, epoch_images)[0].overhead_share > OVERHEAD_SHARE_LIMIT:
            return gpus
    return None


# --- Fits (pure Python: a few parameters each) ---------------------------------------------------

def _solve(a: List[List[float]], b: List[float]) -> Optional[List[float]]:
    """x with a x = b (Gaussian elimination, partial pivoting); None when singular."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _nonnegative_lstsq(rows: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float]) -> List[float]:
    """Weighted least squares with coefficients >= 0 (the best non-negative solution over the column subsets)."""
    import itertools

    width = len(rows[0])
    wa = [[w * v for v in row] for row, w in zip(rows, weights)]
    wy = [w * y for y, w in zip(targets, weights)]
    best, best_cost = [0.0] * width, math.fsum(v * v for v in wy)
    for k in range(1, width + 1):
        for cols in itertools.combinations(range(width), k):
            normal = [[math.fsum(r[i] * r[j] for r in wa) for j in cols] for i in cols]
            coef = _solve(normal, [math.fsum(r[i] * y for r, y in zip(wa, wy)) for i in cols])
            if coef is None or any(c < 0 for c in coef):
                continue
            cost = math.fsum((math.fsum(r[c] * v for c, v in zip(cols, coef)) - y) ** 2 for r, y in zip(wa, wy))
            if cost < best_cost:
                best, best_cost = [0.0] * width, cost
                for c, v in zip(cols, coef):
                    best[c] = v
    return best


def _golden_min(cost: Callable[[float], float], low: float, high: float, rounds: int = 100) -> float:
    """The minimum of a unimodal `cost` on [low, high] (golden-section search)."""
    ratio = (5 ** 0.5 - 1) / 2
    for _ in range(rounds):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if cost(a) <= cost(b):
            high = b
        else:
            low = a
    return (low + high) / 2


def _check_shares(points: Sequence[Tuple[int, float]]) -> None:
    for gpus, share in points:
        if gpus < 2 or not 0.0 < share < 1.0:
            raise ValueError("calibration point (%r GPUs, share %r) needs >= 2 GPUs and 0 < share < 1" % (gpus, share))


def fit_machine(points: Sequence[Tuple[int, float]], workload: Workload, machine: Machine) -> Machine:
    """`machine` with the noise and beside_compute that best reproduce NCCL kernel-time shares [(gpus, share)].

    kernel = share/(1-share) * compute; the residuals are weighted by (1-share)^2 / compute so that
    they count as errors in share. beside_compute enters linearly (solved for each noise); the
    spread sqrt(noise) is searched (the waits are capped by the bucket spacing, so not linear)."""
    _check_shares(points)
    overlapped = [workload.backward_s * (1.0 - messages(workload)[0].ready)] * len(points)
    targets = [share / (1.0 - share) * workload.compute_s for _, share in points]
    weights = [(1.0 - share) ** 2 / workload.compute_s for _, share in points]

    def best_beside(spread: float) -> Tuple[float, float]:
        trial = replace(machine, noise_s=spread ** 2, beside_compute=0.0)
        rest = [t - step_times(workload, trial, gpus).kernel for (gpus, _), t in zip(points, targets)]
        beside = max(0.0, math.fsum(w * w * a * r for w, a, r in zip(weights, overlapped, rest))
                     / math.fsum(w * w * a * a for w, a in zip(weights, overlapped)))
        return beside, math.fsum((w * (r - beside * a)) ** 2 for w, a, r in zip(weights, overlapped, rest))

    # beyond this spread the last wait alone exceeds every target
    high = max(t / (straggler_factor(g) * math.sqrt(workload.busy_s)) for (g, _), t in zip(points, targets))
    spread = _golden_min(lambda s: best_beside(s)[1], 0.0, high)
    return replace(machine, noise_s=spread ** 2, beside_compute=best_beside(spread)[0])


def fit_loader_stall(points: Sequence[Tuple[int, float]], workload: Workload, machine: Machine) -> float:
    """The data wait per step (s) of a loader that cannot keep up which best reproduces the comm shares."""
    _check_shares(points)

    def cost(data_s: float) -> float:
        loaded = replace(workload, data_s=data_s)
        return sum((1 - share) ** 2 * (p.comm_share - share) ** 2
                   for p, (_, share) in zip(predict(loaded, machine, [g for g, _ in points]), points))

    return _golden_min(cost, 0.0, 10.0 * workload.compute_s, rounds=80)


def storage_floor(gpus: Sequence[int], workload: Workload, machine: Machine) -> float:
    """Images/s a loader drew at `gpus` without a stall: a file system that reproduces those rows sustains at least this."""
    free = replace(machine, storage_images_per_s=None)
    return max(p.images_per_s for p in predict(workload, free, gpus))


def fit_storage(statements: Sequence[Tuple[str, int, float]], workloads: Dict[str, Workload], machine: Machine,
                floor: float, overhead: Optional[EpochOverhead] = None) -> float:
    """The file system's images/s (>= `floor`) whose E_G best matches [(framework, gpus, E_G)] (reference 4
    GPUs), each framework with its workload in `workloads`, epochs with `overhead`."""
    def cost(log_r: float) -> float:
        storage = replace(machine, storage_images_per_s=math.exp(log_r))
        return sum((predict(workloads[f], storage, [AACH2023_REFERENCE_GPUS, g], overhead)[1].efficiency - v) ** 2
                   for f, g, v in statements)

    return math.exp(_golden_min(cost, math.log(floor), math.log(100.0 * floor)))


# --- Published data -------------------------------------------------------------------------------

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
        return (model, loader) == (self.model, self.loader) and framework in self.frameworks and self.gpus_from <= gpus <= self.gpus_to

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
    return [Statement(r["model"], r["loader"], tuple(r["frameworks"].split()), int(r["gpus_from"]), int(r["gpus_to"]),
                      r["relation"], float(r["value"])) for r in csv.DictReader(lines)]


def storage_points(statements: Sequence[Statement]) -> List[Tuple[str, int, float]]:
    """[(framework, gpus, E_G)] of the point statements on the native loader: what the file system is fitted on."""
    return [(f, s.gpus_from, s.value) for s in statements if s.relation == "=" and s.loader == "native" for f in s.frameworks]


def io_kernel_s(loader: str, batch: int, gpu: str = "A100", max_gpus: int = CALIBRATION_MAX_GPUS,
                path: Path = AACH2023_TABLE2A) -> float:
    """The loader's I/O kernel time per step: Table 2a's I/O kernels over its cuDNN and other kernels (a
    ResNet-50 TF32 step), rows up to `max_gpus`, per image. Decoding and augmenting an image costs the
    same whatever network and precision train on it, so it does not scale with FLOPs or the precision."""
    rows = [r for r in load_published(path)[loader] if r.gpus <= max_gpus]
    per_step = math.fsum(r.io for r in rows) / math.fsum(100.0 - r.comm - r.io for r in rows)
    return batch * per_step / PUBLISHED_RESNET50_IMAGES_PER_S[gpu]["tf32"]


def paper_overhead(loader: str, batch: int = DEFAULT_BATCH, gpu: str = "A100", path: Path = AACH2023_TABLE2A) -> PaperOverhead:
    """Aach et al.'s epoch overhead with `loader` for a workload whose compute holds Table 2a's I/O kernels."""
    return PaperOverhead(loader, io_kernel_s(loader, batch, gpu, path=path))


def published_gpu(site: Site) -> Optional[str]:
    """The key of `PUBLISHED_RESNET50_IMAGES_PER_S` the site's GPU model starts with, if any."""
    return next((g for g in PUBLISHED_RESNET50_IMAGES_PER_S if (site.gpu_model or "").startswith(g)), None)


def published_workload(model: str = "resnet50", loader: str = "dali", path: Path = AACH2023_TABLE2A,
                       precision: str = "tf32") -> Workload:
    """Table 2a's workload per GPU: batch 64; the GPU's kernel time per step other than NCCL's: the
    published A100 throughput at `precision` (a whole training step; FLOP-scaled for other models) plus
    the loader's I/O kernels (`io_kernel_s`); data wait 0; the native loader reads files."""
    images_per_s = PUBLISHED_RESNET50_IMAGES_PER_S["A100"][precision]
    step = DEFAULT_BATCH / (images_per_s * MODEL_GFLOPS["resnet50"] / MODEL_GFLOPS[model])
    return Workload(step + io_kernel_s(loader, DEFAULT_BATCH, path=path), DEFAULT_BATCH, gradient_bytes(model),
                    reads_files=loader == "native")


@dataclass(frozen=True)
class PublishedFit:
    machine: Machine  # JUWELS Booster's: noise and beside_compute (DALI column), storage (native statements)
    native_data_fraction: float  # the native loader's data wait per step / compute, fitted on its column
    storage_floor: float  # images/s the native rows up to the fit's largest count drew without a stall


def fit_published(max_gpus: int = CALIBRATION_MAX_GPUS, path: Path = AACH2023_TABLE2A,
                  statements: Path = AACH2023_STATEMENTS) -> PublishedFit:
    """One machine fit for Table 2a's machine: noise and beside_compute on its DALI column (DALI keeps
    up: no loader wait), then the native loader's data wait on the native column with that machine,
    both on counts <= `max_gpus`; then the file system's images/s from the point statements on the
    native loader's E_G (of 90-epoch runs: with the paper's epoch overhead), each framework's with its
    `paper_workload` (not below what the native rows drew without a stall)."""
    columns = load_published(path)
    dali = published_workload(path=path)
    machine = fit_machine([(r.gpus, r.comm_share) for r in columns["dali"] if r.gpus <= max_gpus], dali, AACH2023_MACHINE)
    native = published_workload(loader="native", path=path)
    fitted = [r for r in columns["native"] if r.gpus <= max_gpus]
    native = replace(native, data_s=fit_loader_stall([(r.gpus, r.comm_share) for r in fitted], native, machine))
    floor = storage_floor([r.gpus for r in fitted], native, machine)
    points = storage_points(load_statements(statements))
    unstalled = PublishedFit(machine, native.data_s / native.compute_s, floor)
    workloads = {f: paper_workload(unstalled, loader="native", framework=f, path=path) for f, _, _ in points}
    storage = fit_storage(points, workloads, machine, floor, paper_overhead("native", path=path))
    return replace(unstalled, machine=replace(machine, storage_images_per_s=storage))


def native_loader_images_per_s() -> float:
    """Images/s the native loader's workers of one GPU decode and augment (its CPU side)."""
    return NATIVE_WORKERS * NATIVE_WORKER_IMAGES_PER_S


def calibrated_workload(workload: Workload, fit: PublishedFit, loader: str, measured_data: bool = False) -> Workload:
    """`workload` as on Table 2a's machine with `loader`: the native loader reads files and, unless the
    data wait is `measured_data`, waits the fitted one, or longer where the GPU takes a batch faster
    than the loader's workers make one (`native_loader_images_per_s`)."""
    if loader != "native":
        return workload
    if measured_data:
        return replace(workload, reads_files=True)
    cpu_bound = workload.batch / native_loader_images_per_s() - workload.compute_s - workload.other_s
    return replace(workload, reads_files=True, data_s=max(fit.native_data_fraction * workload.compute_s, cpu_bound))


def paper_precision(framework: str) -> str:
    """The precision of the paper's runs: TF32 (PyTorch's default), fp16 for DeepSpeed (PAPER_DEEPSPEED_SOURCE)."""
    return "fp16" if framework == "deepspeed" else "tf32"


def paper_workload(fit: PublishedFit, model: str = "resnet50", loader: str = "dali", framework: str = "ddp",
                   path: Path = AACH2023_TABLE2A) -> Workload:
    """The paper's workload with `framework` on Table 2a's machine (`published_workload` at the
    framework's `paper_precision`, `calibrated_workload` for the loader)."""
    published = published_workload(model, loader, path, paper_precision(framework))
    return replace(calibrated_workload(published, fit, loader), framework=framework)


# --- The user's runs ------------------------------------------------------------------------------

def workload_of_run(run: Run) -> Workload:
    """The workload measured by a profiled run (its other time: step minus compute, comm and data)."""
    p = run.profile
    assert p is not None
    return Workload(p.compute_s, run.key.batch_per_worker, gradient_bytes(run.key.model), p.data_s,
                    max(0.0, p.step_s - p.compute_s - p.comm_s - p.data_s), run.key.framework,
                    reads_files=run.key.loader == "native")


def wall_step_s(run: Run) -> float:
    """A run's wall-clock step time, from its steps-only throughput (no epoch overhead)."""
    return run.world_size * run.key.batch_per_worker / run.steps_images_per_s


def _layout(machine: Machine, run: Run) -> Machine:
    """`machine` with the run's GPUs per node."""
    return replace(machine, gpus_per_node=max(1, run.world_size // run.nodes))


def _network_given_noise(multi: Sequence[Tuple[Run, Workload]], machine: Machine, spread: float) -> Machine:
    """`machine` with noise spread^2 and the network that best explains the runs' profiled all-reduces
    (one ring all-reduce + the slowest rank's lag: linear in latency and inverse bandwidth)."""
    fitted = replace(machine, noise_s=spread ** 2)
    for inside in (True, False):
        side = [(r, w) for r, w in multi if (r.nodes == 1) == inside]
        if not side:
            continue
        fit_latency = not inside and len({r.nodes for r, _ in side}) > 1
        rows, targets = [], []
        for r, w in side:
            bare = replace(_layout(fitted, r), latency_us=0.0 if fit_latency else fitted.latency_us)
            lag = fitted.lateness_s(w.busy_s, r.world_size) + w.data_s * loader_spread(r.world_size, w.batch)
            rows.append(([2 * (r.nodes - 1) * RING_PLATEAU * 1e-6] if fit_latency else [])
                        + [2 * (r.world_size - 1) / r.world_size * w.gradient_bytes])
            targets.append(r.profile.comm_s - bare.ring_allreduce_s(r.world_size, 0.0) - lag)
        coef = _nonnegative_lstsq(rows, targets, [1.0] * len(rows))
        if coef[-1] <= 0:
            continue  # faster than the latency alone explains: keep the nominal bandwidth
        if inside:
            fitted = replace(fitted, intra_node_gbps=8e-9 / coef[-1])
        else:
            fitted = replace(fitted, bandwidth_gbps_per_node=8e-9 / coef[-1],
                             latency_us=coef[0] if fit_latency else fitted.latency_us)
    return fitted


def fit_runs(runs: Sequence[Run], base: Machine) -> Machine:
    """`base` with the noise and the network fitted to the runs: each multi-GPU run's profiled
    all-reduce (one ring all-reduce + the slowest rank's lag) and wall-clock step (busy + transfers
    left over + that lag), in relative terms. For each spread sqrt(noise) the network follows from
    the all-reduces (`_network_given_noise`); the spread is searched. A side (inside a node, across
    nodes) with no run keeps `base`'s figures, as does one the runs cannot tell from an infinite
    bandwidth; the inter-node latency is fitted only from two or more node counts."""
    multi = [(r, workload_of_run(r)) for r in runs if r.world_size > 1]
    if not multi:
        return base

    def cost(spread: float) -> float:
        machine = _network_given_noise(multi, base, spread)
        total = 0.0
        for r, w in multi:
            t = step_times(w, _layout(machine, r), r.world_size)
            total += ((t.step - wall_step_s(r)) / wall_step_s(r)) ** 2 + ((t.profiled_comm - r.profile.comm_s) / r.profile.comm_s) ** 2
        return total

    # at most all of a step beyond its work is the slowest rank's lag
    high = max((wall_step_s(r) - w.busy_s) / (math.sqrt(w.busy_s) * straggler_factor(r.world_size)) for r, w in multi)
    return _network_given_noise(multi, base, _golden_min(cost, 0.0, max(high, 0.0)))


@dataclass(frozen=True)
class LeftOut:
    run: Run
    predicted: Optional[Prediction]  # None when the other runs cannot predict it
    why: str = ""

    @property
    def step_error(self) -> Optional[float]:
        """Predicted / measured wall-clock step time - 1."""
        return None if self.predicted is None else self.predicted.step_s / wall_step_s(self.run) - 1.0

    @property
    def measured_share(self) -> float:
        shares = self.run.shares
        return shares.comm if shares else 0.0

    @property
    def share_error(self) -> Optional[float]:
        """Predicted - measured profiled comm share (a fraction)."""
        return None if self.predicted is None else self.predicted.profiled_comm_share - self.measured_share


def predict_run(reference: Run, machine: Machine, gpus: int) -> Prediction:
    """The step at `gpus` from a reference run's workload and a fitted machine."""
    return predict(workload_of_run(reference), machine, [gpus])[0]


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
        machine = _layout(fit_runs(rest, base or _unknown_network(gpus_per_node)), run)
        out.append(LeftOut(run, predict_run(min(rest, key=lambda r: r.world_size), machine, run.world_size)))
    return out


def _unknown_network(gpus_per_node: int) -> Machine:
    """A placeholder network for a site without [network]: replaced by the fit wherever a run measures it."""
    return Machine(gpus_per_node, 0.0, DEFAULT_INTRA_NODE_GBPS, DEFAULT_INTRA_NODE_GBPS)


def calibration_runs(paths: Sequence[Path]) -> Tuple[List[Run], str]:
    """Profiled runs of one workload with measured throughput, smallest first, and the workload options they were
    made with (`workload_flags`: --compile ..., "" for none; errors name --from-runs). A compiled run's step times
    leave its compile time out (the warm-up steps held it); a run that compiled after its warm-up steps is refused."""
    if not paths:
        raise DlaunchError("--from-runs: no runs given")
    runs, options = [], {}
    for path in find_metrics_files([str(p) for p in paths]):
        try:
            metrics = read_metrics(path)
        except MetricsError as e:
            raise DlaunchError("--from-runs: %s" % e) from None
        run = run_from_metrics(metrics)
        recompiled = sum(e.get("graphs_compiled_after_warmup") or 0 for e in metrics.epochs)
        if recompiled:
            raise DlaunchError("--from-runs: %s compiled %d graph(s) after its warm-up steps, so its step times hold "
                               "compile time; rerun it with more --warmup-steps" % (run.path, recompiled))
        runs.append(run)
        options[run.path] = workload_flags(metrics.header["config"])
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
    if len(set(options.values())) > 1:
        raise DlaunchError("--from-runs: the runs mix step options: %s"
                           % "; ".join("%s: %s" % (path, flags or "none") for path, flags in sorted(options.items())))
    if len({r.world_size for r in runs}) < 2:
        raise DlaunchError("--from-runs: all runs use %d GPUs; at least 2 GPU counts are needed; %s"
                           % (runs[0].world_size, CALIBRATION_HOWTO))
    return sorted(runs, key=lambda r: (r.world_size, r.path)), options[runs[0].path]


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


def published_compute_ms(site: Site, model: str, batch: int, precision: str = "tf32") -> Optional[float]:
    """Compute time per step from the published throughput of the site's GPU model at `precision`, if one is known."""
    gpu = published_gpu(site)
    if gpu is None or model not in MODEL_GFLOPS:
        return None
    images_per_s = PUBLISHED_RESNET50_IMAGES_PER_S[gpu][precision] * MODEL_GFLOPS["resnet50"] / MODEL_GFLOPS[model]
    return 1e3 * batch / images_per_s


def workload_from_options(model: Optional[str], compute_ms: Optional[float], data_ms: Optional[float],
                          batch: Optional[int], from_run: Optional[Path],
                          site: Optional[Site] = None, precision: str = "tf32") -> Tuple[str, Workload, str]:
    """The model name, the workload and where its compute time comes from.

    `--from-run` fills what the flags leave out; without either, the published throughput of the
    site's GPU model at `precision` (batch 64 unless given)."""
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
        compute_ms = published_compute_ms(site, model, batch, precision)
        source = ("published %s throughput (NVIDIA DeepLearningExamples, %s), scaled by model FLOPs"
                  % (site.gpu_model, "TF32" if precision == "tf32" else "mixed precision"))
    if model is None:
        raise DlaunchError("--model is needed unless --from-run names a profiled run (known: %s)" % ", ".join(sorted(MODEL_PARAMS_M)))
    if compute_ms is None:
        raise DlaunchError("--compute-ms: no published throughput for %s on site %s; give a measured compute time "
                           "(or --from-run / --from-runs)" % (model, site.name if site else "-"))
    if batch is None:
        raise DlaunchError("--batch: needed with --compute-ms (the batch per GPU it was measured with)")
    return model, Workload(compute_ms / 1e3, batch, gradient_bytes(model), (data_ms or 0.0) / 1e3,
                           reads_files=reads_files), source


@dataclass(frozen=True)
class PaperCheck:
    """What the paper publishes for one GPU count of the predicted workload (None: nothing)."""

    comm_share: Optional[float]  # Table 2a, NCCL share of kernel time
    statement: Optional[Statement]  # on E_G


def paper_checks(model: str, loader: str, framework: str, gpus: Sequence[int]) -> Dict[int, PaperCheck]:
    """Table 2a's comm share (DDP) and the text's E_G statements for ResNet-50, batch 64, on JUWELS Booster."""
    rows = {r.gpus: r.comm_share for r in load_published()[loader]} if framework == "ddp" and model == "resnet50" else {}
    statements = load_statements()
    return {g: PaperCheck(rows.get(g), next((s for s in statements if s.covers(model, loader, framework, g)), None))
            for g in gpus}


def _signed(value: float, digits: int) -> str:
    """`+0.12` / `-0.12`, and `0.00` when it rounds to zero."""
    text = "%+.*f" % (digits, value)
    return text[1:] if float(text) == 0 else text


def _published_columns(checks: Optional[Dict[int, PaperCheck]]) -> Tuple[bool, bool]:
    """Whether the paper has any E_G statement, any comm share for the rows."""
    values = list(checks.values()) if checks else []
    return any(c.statement is not None for c in values), any(c.comm_share is not None for c in values)


def prediction_rows(predictions: Sequence[Prediction], basis: Callable[[int], str], profiled: bool = False,
                    checks: Optional[Dict[int, PaperCheck]] = None, overhead: bool = False,
                    spread: Optional[Dict[int, Optional[float]]] = None) -> List[List[str]]:
    """Table rows: step, exposed time, images/s, E_G and the comm share, with the paper's values and the
    model's errors where `checks` has them, the epoch overhead (seconds per epoch, share of the run's
    time) with `overhead`, the runs' straggler `spread` per GPU count, and whether each count is fitted
    or predicted."""
    paper_eg, paper_share = _published_columns(checks)
    out = []
    for p in predictions:
        share = p.profiled_comm_share if profiled else p.comm_share
        row = [str(p.gpus), str(p.nodes), "%.2f" % (1e3 * p.step_s), "%.2f" % (1e3 * p.exposed_comm_s),
               "%.1f" % p.images_per_s, "%.3f" % p.efficiency]
        if paper_eg:
            s = checks[p.gpus].statement
            row += ["-", "-"] if s is None else [s.text, "holds" if s.relation != "=" and s.holds(p.efficiency)
                                                 else _signed(s.error(p.efficiency), 2)]
        row.append("%.1f" % (100 * share))
        if paper_share:
            paper = checks[p.gpus].comm_share
            row += ["-", "-"] if paper is None else ["%.1f" % (100 * paper), _signed(100 * (share - paper), 1)]
        if overhead:
            row += ["%.2f" % p.epoch_overhead_s, "%.1f" % (100 * p.overhead_share)]
        if spread is not None:
            value = spread.get(p.gpus, "-")
            row.append(value if isinstance(value, str) else "not recorded" if value is None else "%.2f" % value)
        out.append(row + [basis(p.gpus)])
    return out


OVERHEAD_HEADERS = ["overhead s", "overhead %"]
SPREAD_HEADER = "straggler spread"


def prediction_headers(profiled: bool, checks: Optional[Dict[int, PaperCheck]] = None, overhead: bool = False,
                       spread: bool = False) -> List[str]:
    paper_eg, paper_share = _published_columns(checks)
    share = "profiled comm %" if profiled else "NCCL kernel %"
    return (["GPUs", "nodes", "step ms", "exposed ms", "images/s", "E_G"] + (["paper E_G", "E_G error"] if paper_eg else [])
            + [share] + (["paper %", "error pp"] if paper_share else []) + (OVERHEAD_HEADERS if overhead else [])
            + ([SPREAD_HEADER] if spread else []) + ["basis"])


STORAGE_FIT = ("fitted on the paper's E_G values for the native loader (%s), at least what Table 2a's native rows "
               "drew up to %d GPUs" % (AACH2023_STATEMENTS.name, CALIBRATION_MAX_GPUS))
LOO_HEADERS = ["left out", "GPUs", "step ms", "predicted ms", "error %", "comm %", "predicted %", "error pp"]


def loo_rows(left_out: Sequence[LeftOut]) -> List[List[str]]:
    rows = []
    for lo in left_out:
        measured = [lo.run.path, str(lo.run.world_size), "%.2f" % (1e3 * wall_step_s(lo.run))]
        if lo.predicted is None:
            rows.append(measured + ["-", lo.why, "%.1f" % (100 * lo.measured_share), "-", "-"])
            continue
        rows.append(measured + ["%.2f" % (1e3 * lo.predicted.step_s), _signed(100 * lo.step_error, 1),
                                "%.1f" % (100 * lo.measured_share), "%.1f" % (100 * lo.predicted.profiled_comm_share),
                                _signed(100 * lo.share_error, 1)])
    return rows


def loo_summary(left_out: Sequence[LeftOut]) -> str:
    predicted = [lo for lo in left_out if lo.predicted is not None]
    if not predicted:
        return "leave-one-out error: none of the %d runs can be predicted from the others" % len(left_out)
    steps = [100 * abs(lo.step_error) for lo in predicted]
    shares = [100 * abs(lo.share_error) for lo in predicted]
    return ("leave-one-out error (%d of %d runs predicted from the others): step time mean %.1f %%, max %.1f %%; "
            "profiled comm share mean %.1f pp, max %.1f pp"
            % (len(predicted), len(left_out), mean(steps), max(steps), mean(shares), max(shares)))


def _from_runs(paths: Sequence[Path], profile: Site,
               say: Callable[[str], None]) -> Tuple[str, Workload, Machine, str, List[LeftOut], List[Run], str]:
    runs, step_options = calibration_runs(paths)
    base = interconnect_of_site(profile)
    left_out = leave_one_out(runs, base, profile.gpus_per_node)
    machine = replace(fit_runs(runs, base or _unknown_network(profile.gpus_per_node)), gpus_per_node=profile.gpus_per_node)
    reference = runs[0]
    say("calibrated on %d runs (%s GPUs); each run predicted from the others:" % (len(runs), ",".join(str(r.world_size) for r in runs)))
    return (reference.key.model, workload_of_run(reference), machine, "measured in %s" % reference.path, left_out, runs,
            step_options)


def runs_step(step_options: str, count: int) -> str:
    """What the calibration runs' step was, for the basis line: eager, or compiled (and other workload options)."""
    if not step_options:
        return "the %d runs' step: eager, torch's optimizer, default host syncs" % count
    compiled = "compiled, their compile time in the warm-up steps and left out" if "--compile" in step_options else ""
    return "the %d runs' step: %s%s" % (count, step_options, " (%s)" % compiled if compiled else "")


def straggler_spread(runs: Sequence[Run]) -> Dict[int, Optional[float]]:
    """Per GPU count of `runs`, the slowest rank's compute_s over the median rank's (the mean over its runs
    that recorded phases; None: none did)."""
    spread: Dict[int, Optional[float]] = {}
    for gpus in sorted({r.world_size for r in runs}):
        ratios = [r.phases.slowest.compute_s / r.phases.median.compute_s for r in runs
                  if r.world_size == gpus and r.phases is not None and r.phases.median.compute_s > 0]
        spread[gpus] = mean(ratios) if ratios else None
    return spread


def measured_overhead(runs: Sequence[Run]) -> Optional[FixedOverhead]:
    """The runs' mean epoch overhead (seconds per epoch); None when none recorded one (metrics before version 4)."""
    recorded = [r.epoch_overhead_s for r in runs if r.epoch_overhead_s is not None]
    return FixedOverhead(mean(recorded), "measured") if recorded else None


def describe_epochs(overhead: EpochOverhead, workload: Workload, epoch_images: int) -> str:
    """What the epochs are and where their overhead comes from (with `PaperOverhead`'s assumptions)."""
    epochs = "epochs of %d training images (%s)" % (epoch_images, "ImageNet-1k" if epoch_images == IMAGENET_TRAIN_IMAGES
                                                       else "--epoch-images")
    if isinstance(overhead, FixedOverhead):
        source = "given" if overhead.source == "--epoch-overhead" else "your runs' mean"
        return "%s; epoch overhead %.3f s per epoch (%s)" % (epochs, overhead.seconds, source)
    return ("%s; epoch overhead from Aach et al.'s stated setup (50,000 validation images every epoch, batch %d per GPU, "
            "8 CPU threads per %s loader): validation, loader start, synchronisation; assumed: %s"
            % (epochs, workload.batch, overhead.loader, "; ".join(paper_overhead_assumptions(overhead.loader))))


def _basis(fitted: Sequence[int], fitted_max: int) -> Callable[[int], str]:
    """'fitted' for a count the fit used, 'in range' between them, 'predicted' beyond the largest."""
    return lambda gpus: "fitted" if gpus in fitted else "in range" if gpus < fitted_max else "predicted"


def _paper_machine(site: Site) -> bool:
    """Whether the site's network is Table 2a's machine (JUWELS Booster)."""
    machine = interconnect_of_site(site)
    return machine is not None and (machine.gpus_per_node, machine.latency_us, machine.bandwidth_gbps_per_node) == (
        AACH2023_MACHINE.gpus_per_node, AACH2023_MACHINE.latency_us, AACH2023_MACHINE.bandwidth_gbps_per_node)


def check_summary(predictions: Sequence[Prediction], checks: Dict[int, PaperCheck]) -> List[str]:
    """One line per observable: the model's errors at the counts where the paper has a value."""
    lines = []
    for label, counts in (("fitted", [p for p in predictions if p.gpus <= CALIBRATION_MAX_GPUS]),
                          ("predicted", [p for p in predictions if p.gpus > CALIBRATION_MAX_GPUS])):
        errors = [100 * abs(p.comm_share - checks[p.gpus].comm_share) for p in counts if checks[p.gpus].comm_share is not None]
        if errors:
            lines.append("NCCL kernel share vs Table 2a, %s counts: mean %.1f pp, max %.1f pp" % (label, mean(errors), max(errors)))
    said = [(p, checks[p.gpus].statement) for p in predictions if checks[p.gpus].statement is not None]
    if said:
        held = sum(1 for p, s in said if s.holds(p.efficiency))
        lines.append("E_G vs the paper's statements: %d of %d hold (a bound as stated, a value within +-%.2f)"
                     % (held, len(said), STATEMENT_TOLERANCE))
    return lines


def _paper_assumptions(framework: str, calibrated: Optional[str], precision: Optional[str], zero_stage: Optional[int],
                       measured_compute: bool) -> List[str]:
    """What `--calibrated` assumes about the paper's DeepSpeed runs where the flags leave it open."""
    if calibrated is None or framework != "deepspeed":
        return []
    return ((["fp16 (compute from the published mixed-precision figure)"] if precision is None and not measured_compute else [])
            + (["ZeRO stage 0"] if zero_stage is None else []))


Framework = Annotated[str, typer.Option(help="Framework: how gradients travel (its row's gradient_exchange: DDP buckets, Horovod fusion, DeepSpeed ZeRO).")]
Precision = Annotated[Optional[Literal[PRECISIONS]], typer.Option(help="Precision of the published compute time: tf32 (default) or fp16 (mixed precision). With --calibrated, DeepSpeed assumes fp16 as the paper's runs (printed). Not with a measured compute time.")]


def predict_command(
    site: Annotated[str, typer.Option(help="Site profile (name or TOML path); its \\[network] section gives the nominal interconnect.")],
    gpus: Annotated[Optional[str], typer.Option(help="Comma-separated GPU counts; E_G is relative to the smallest. Default: 4, 8, ... 1024, up to what the site has.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model (gradient size from its parameter count).")] = None,
    compute_ms: Annotated[Optional[float], typer.Option(parser=finite_number(), help="Measured forward+backward time per step (ms).")] = None,
    data_ms: Annotated[Optional[float], typer.Option(parser=finite_number(), help="Measured time waiting for data per step (ms); default 0 (the loader keeps up).")] = None,
    batch: Annotated[Optional[int], typer.Option(help="Batch per GPU the compute time was measured with.")] = None,
    framework: Framework = "ddp",
    zero_stage: Annotated[Optional[int], typer.Option(min=0, max=2, help="DeepSpeed ZeRO stage (0: all-reduce; 1, 2: reduce-scatter + all-gather). Default 0.")] = None,
    precision: Precision = None,
    from_run: Annotated[Optional[Path], typer.Option(help="Run directory or metrics file with a profile record (the workload only).")] = None,
    from_runs: Annotated[Optional[List[Path]], typer.Option(help="Calibrate machine and workload on your own small sweep: run directories or a sweep folder (repeat the flag), >= 2 GPU counts, each run made with --profile-steps N (e.g. `dlaunch sweep --nodes 1,2,4 --steps 60 --warmup-steps 10 --profile-steps 20`). Prints each run's leave-one-out error of step time and profiled comm share.")] = None,
    calibrated: Annotated[Optional[str], typer.Option(help="Machine fitted to Aach et al. 2023 Table 2a (JUWELS Booster, ResNet-50 DDP) on its 4-64 GPUs: 'dali' (loader keeps up) or 'native' (adds the native loader's fitted data wait unless --data-ms is given, and the file system's images/s fitted on the paper's E_G statements unless --storage-images-per-s or the site's [storage] gives one; a GPU faster than the loader's 8 workers waits for them). On JUWELS Booster, ResNet-50, batch 64, shows the paper's values beside the model's.")] = None,
    storage_images_per_s: Annotated[Optional[float], typer.Option(parser=finite_number(), help="Images/s the site's shared file system sustains for a loader that reads every sample as a file (native): p GPUs cannot step faster than p * batch / this. Default: the site's [storage] loader_images_per_s, else no ceiling (unknown).")] = None,
    epoch_overhead: Annotated[Optional[float], typer.Option(parser=finite_number(), help="Seconds per epoch outside the steps (loader start, validation, checkpoint, barriers, logging) at every GPU count. Default: the runs' mean measured overhead with --from-runs (metrics version 4), Aach et al.'s setup with --calibrated (assumptions printed), else none.")] = None,
    epoch_images: Annotated[int, typer.Option(help="Training images per epoch (steps per epoch = ceil(images / global batch)). Default: ImageNet-1k's.")] = IMAGENET_TRAIN_IMAGES,
) -> None:
    """Predict step time, throughput, E_G and NCCL kernel share over GPU counts (NCCL ring/tree cost model, buckets, stragglers)."""
    if framework not in gradient_exchanges():
        raise DlaunchError("--framework %s: the performance model knows how the gradients of %s travel, not of this one "
                           "(its row in dlaunch/train/framework_table.py has no gradient_exchange)" % (framework, ", ".join(gradient_exchanges())))
    profile = resolve_site(site)
    counts = parse_gpu_counts(gpus, profile) if gpus else [g for g in DEFAULT_GPU_COUNTS if g <= site_max_gpus(profile)] or [1]
    console = Console(soft_wrap=True)

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    if storage_images_per_s is not None and not storage_images_per_s > 0:
        raise DlaunchError("--storage-images-per-s: must be positive (got %r)" % storage_images_per_s)
    if epoch_overhead is not None and not epoch_overhead >= 0:
        raise DlaunchError("--epoch-overhead: must not be negative (got %r)" % epoch_overhead)
    if epoch_images < 1:
        raise DlaunchError("--epoch-images: must be >= 1 (got %d)" % epoch_images)
    measured_compute = compute_ms is not None or from_run is not None or bool(from_runs)
    if precision is not None and measured_compute:
        raise DlaunchError("--precision: chooses the published compute time; a measured one (--compute-ms, --from-run, "
                           "--from-runs) has its own precision")
    assumed = _paper_assumptions(framework, calibrated, precision, zero_stage, measured_compute)
    precision = precision or (paper_precision(framework) if calibrated is not None else "tf32")
    left_out: List[LeftOut] = []
    checks: Optional[Dict[int, PaperCheck]] = None
    overhead: Optional[EpochOverhead] = None
    spread: Optional[Dict[int, Optional[float]]] = None
    storage_source = "--storage-images-per-s" if storage_images_per_s is not None else None
    if from_runs:
        if from_run is not None or calibrated is not None:
            raise DlaunchError("--from-runs: not together with --from-run or --calibrated")
        model_name, workload, machine, source, left_out, runs, step_options = _from_runs(from_runs, profile, say)
        fitted = sorted({r.world_size for r in runs})
        overhead, spread = measured_overhead(runs), straggler_spread(runs)
        machine_source = "fitted on your runs"
        basis = _basis(fitted, max(fitted))
    else:
        machine = interconnect_of_site(profile)
        if machine is None:
            raise DlaunchError("--site: site %s has no [network] section (latency_us, bandwidth_gbps_per_node); "
                               "add one or calibrate with --from-runs" % profile.name)
        model_name, workload, source = workload_from_options(model, compute_ms, data_ms, batch, from_run, profile, precision)
        machine_source = "nominal (site profile), no timing noise"
        basis = lambda gpus: "nominal"  # noqa: E731
        if calibrated is not None:
            if calibrated not in ("dali", "native"):
                raise DlaunchError("--calibrated: %r is not a column of %s (dali, native)" % (calibrated, AACH2023_TABLE2A.name))
            fit = fit_published()
            machine = replace(machine, noise_s=fit.machine.noise_s, beside_compute=fit.machine.beside_compute)
            machine_source = "noise fitted on Aach et al. 2023 Table 2a, 4-%d GPUs (JUWELS Booster)" % CALIBRATION_MAX_GPUS
            published = compute_ms is None and from_run is None
            io_s = 0.0
            if published:  # the paper's workload: its loader's I/O kernels run on the GPU too
                gpu = published_gpu(profile)
                assert gpu is not None  # the compute time came from its published throughput
                io_s = io_kernel_s(calibrated, workload.batch, gpu)
                workload = replace(workload, compute_s=workload.compute_s + io_s)
                source += ", plus Table 2a's %s I/O kernels" % calibrated
            overhead = PaperOverhead(calibrated, io_s)
            workload = calibrated_workload(workload, fit, calibrated, data_ms is not None or from_run is not None)
            basis = _basis([g for g in counts if g <= CALIBRATION_MAX_GPUS], CALIBRATION_MAX_GPUS)
            if calibrated == "native" and storage_images_per_s is None and profile.storage is None:
                storage_images_per_s = fit.machine.storage_images_per_s
                storage_source = STORAGE_FIT
                storage_counts = {gpus for _, gpus, _ in storage_points(load_statements())}
                basis = _basis([g for g in counts if g <= CALIBRATION_MAX_GPUS or g in storage_counts], CALIBRATION_MAX_GPUS)
            if (published and model_name == "resnet50" and workload.batch == DEFAULT_BATCH and data_ms is None
                    and counts[0] == AACH2023_REFERENCE_GPUS and _paper_machine(profile)):
                checks = paper_checks(model_name, calibrated, framework, counts)
    workload = replace(workload, framework=framework,
                       zero_stage=(zero_stage or 0) if gradient_exchanges()[framework] == "deepspeed-zero" else 0)
    if storage_images_per_s is None and profile.storage is not None:  # the site's [storage] fact
        storage_images_per_s, storage_source = profile.storage.loader_images_per_s, "site profile [storage]"
    machine = replace(machine, storage_images_per_s=storage_images_per_s)
    storage = ("no ceiling" if not (workload.reads_files and machine.storage_images_per_s)
               else "%.0f images/s for a loader reading files (%s)" % (machine.storage_images_per_s, storage_source))
    if calibrated == "native" and data_ms is None and from_run is None:
        storage += ("; the native loader's CPU %.0f images/s per GPU (%d workers x %.0f, measured)"
                    % (native_loader_images_per_s(), NATIVE_WORKERS, NATIVE_WORKER_IMAGES_PER_S))
    if left_out:
        console.print(fit_table("", LOO_HEADERS, loo_rows(left_out), console.width, leave_out=["comm %", "step ms"]))
        say(loo_summary(left_out))
    say("%s on %s, %s: %.1f MB fp32 gradients, compute %.2f ms + data %.2f ms + other %.2f ms per step, batch %d per GPU\n"
        "machine (%s): %.2f us fabric latency, %.0f Gbit/s per node of %d GPUs, %.0f Gbit/s per GPU in a node, "
        "timing noise %.2g s, NCCL kernels beside back-propagation %.2f, storage %s\ncompute time: %s"
        % (model_name, profile.name, framework, workload.gradient_bytes / 1e6, 1e3 * workload.compute_s,
           1e3 * workload.data_s, 1e3 * workload.other_s, workload.batch, machine_source, machine.latency_us,
           machine.bandwidth_gbps_per_node, machine.gpus_per_node, machine.intra_node_gbps, machine.noise_s,
           machine.beside_compute, storage, source))
    if assumed:
        say("assumption about Aach et al.'s DeepSpeed runs (%s): %s" % (PAPER_DEEPSPEED_SOURCE, ", ".join(assumed)))
    overhead_note = None
    if epoch_overhead is not None:
        overhead = FixedOverhead(epoch_overhead, "--epoch-overhead")
    elif from_runs and overhead is None:
        overhead_note = "epoch overhead: not recorded by your runs (metrics before version 4); give --epoch-overhead S"
    say(describe_epochs(overhead, workload, epoch_images) if overhead else
        overhead_note or "epoch overhead: none (give --epoch-overhead S, or --from-runs with version 4 runs)")
    predictions = predict(workload, machine, counts, overhead, epoch_images)
    profiled = bool(from_runs)
    console.print(fit_table("", prediction_headers(profiled, checks, overhead is not None, spread is not None),
                            prediction_rows(predictions, basis, profiled, checks, overhead is not None, spread), console.width,
                            leave_out=["nodes", "exposed ms", "images/s", "overhead s", "step ms"]))
    say("exposed: what a step waits for beyond its own work (transfers left over after back-propagation, the "
        "slowest rank, the file system); the kernels' earlier waits for their peers are NCCL kernel time, hidden "
        "behind back-propagation")
    if from_runs:
        say("basis: fitted = a GPU count of your runs (profiled comm %% as --profile-steps measures it); in range = "
            "between them; predicted = beyond %d GPUs; %s" % (max(fitted), runs_step(step_options, len(runs))))
    elif calibrated is not None:
        say("basis: fitted = inside the fit's range (Table 2a rows of 4-%d GPUs%s); predicted = beyond it"
            % (CALIBRATION_MAX_GPUS, "; the storage ceiling: E_G values of the paper" if storage_source == STORAGE_FIT else ""))
    else:
        say("basis: nominal = the site profile's network, nothing fitted (see --calibrated, --from-runs)")
    if overhead is not None:
        passes = overhead_passes(workload, machine, overhead, counts[0], max(site_max_gpus(profile), counts[-1]), epoch_images)
        say("overhead: seconds per epoch outside the steps and their share of the run's time; "
            + ("more than %.0f %% of it from %d GPUs on" % (100 * OVERHEAD_SHARE_LIMIT, passes) if passes else
               "under %.0f %% of it up to %d GPUs" % (100 * OVERHEAD_SHARE_LIMIT, max(site_max_gpus(profile), counts[-1]))))
    if spread is not None:
        say("straggler spread: your runs' slowest rank's compute time over the median rank's (metrics version 4), "
            "at their GPU counts")
    for line in check_summary(predictions, checks) if checks else []:
        say(line)
