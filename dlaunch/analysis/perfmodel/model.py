"""The model itself: what one GPU does per step (`Workload`), how its gradients travel (`messages`), one step on
p GPUs (`step_times`: busy, transfers, the waits, NCCL kernel time), the epoch, and the curve over GPU counts
(`predict`). Definitions: the package's docstring (dlaunch/analysis/perfmodel/__init__.py)."""

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Tuple

from dlaunch.analysis.perfmodel.nccl import DEFAULT_INTRA_NODE_GBPS, Machine, straggler_factor
from dlaunch.train.framework_table import gradient_exchanges

if TYPE_CHECKING:  # the site profiles' pydantic models stay out of the model's import
    from dlaunch.jobs.sites import Site

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
DEFAULT_BATCH = 64  # the paper's batch per GPU
DEFAULT_GPU_COUNTS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
BACKWARD_FRACTION = 2.0 / 3.0  # backward ~ 2x forward
DDP_FIRST_BUCKET_BYTES = 1024.0**2  # torch.distributed's first bucket
DDP_BUCKET_BYTES = 25 * 1024.0**2  # DistributedDataParallel(bucket_cap_mb=25)
DEFAULT_FUSION_MB = 64.0  # HOROVOD_FUSION_THRESHOLD's default (the trainer's --fusion-threshold-mb)
DEEPSPEED_BUCKET_BYTES = 4 * 5e8  # reduce_bucket_size: 5e8 fp32 elements
# The native loader's CPU side: DataLoader worker processes per GPU (Aach et al.: 8 CPU threads per
# loader instance), each decoding and augmenting about 170 ImageNet-sized JPEGs per second (measured
# on an AMD EPYC core with the trainer's native pipeline, benchmarks/README.md; not on JUWELS Booster's
# EPYC 7402, whose rate no source states): a GPU that takes a batch faster than they make one waits for it.
NATIVE_WORKERS = 8
NATIVE_WORKER_IMAGES_PER_S = 170.0
# DALI's CPU pipeline (`--loader dali --dali-device cpu`): images/s one of its threads decodes and augments, measured
# like the native worker's with the trainer's loader-only benchmark (`benchmarks/bench_loaderonly.py`, 2026-11-27:
# 408 images/s with 1 thread, 394 per thread with 2, on this project's AMD EPYC VM, 500 x 375 photo JPEGs of 99 kB;
# benchmarks/README.md). Aach et al.: 8 CPU threads per loader instance, whichever loader.
PAPER_LOADER_THREADS = NATIVE_WORKERS
DALI_CPU_THREAD_IMAGES_PER_S = 400.0
# Epochs: ImageNet-1k (Aach et al.: 1,281,167 training and 50,000 validation images, validated every epoch).
IMAGENET_TRAIN_IMAGES = 1281167
IMAGENET_VAL_IMAGES = 50000
DEFAULT_EPOCHS = 90  # the run time's epochs unless given: Aach et al.'s (and torchvision's reference) ImageNet recipe


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
    input_images_per_s: Optional[float] = None  # what one GPU's loader decodes and augments (None: keeps up)

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
        sizes = (
            _buckets(total, DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)
            if exchange == "ddp-buckets"
            else _buckets(total, workload.fusion_mb * 1024**2, workload.fusion_mb * 1024**2)
        )
        done, out = 0.0, []
        for size in sizes:
            done += size
            out.append(Message("allreduce", size, done / total))
        return out
    if exchange == "deepspeed-zero":
        if workload.zero_stage == 0:
            return [
                Message("allreduce", s, 1.0) for s in _buckets(total, DEEPSPEED_BUCKET_BYTES, DEEPSPEED_BUCKET_BYTES)
            ]
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
    input_wait: float = 0.0  # the GPU's wait for a loader slower than the step (in `step`, not in `exposed`)
    bound: str = "compute"  # what sets the step: compute (the GPU's work and communication), input, storage


def loader_spread(gpus: int, batch: int) -> float:
    """How much longer than the others the slowest of `gpus` ranks waits for its batch, per second of
    mean data wait: a batch's `batch` samples are read one after another, each with an exponential
    delay, so a rank's data wait has the spread mean / sqrt(batch)."""
    return straggler_factor(gpus) / math.sqrt(batch)


def step_times(workload: Workload, machine: Machine, gpus: int) -> StepTimes:
    """The step on `gpus` GPUs: time, exposed and hidden waits, NCCL kernel time; at least the time the loader
    takes to make a batch (`input_bound`)."""
    return input_bound(workload, _gpu_step(workload, machine, gpus))


def input_bound(workload: Workload, t: StepTimes) -> StepTimes:
    """`t` bounded by the input pipeline: a prefetching loader makes a batch every batch / rate seconds, beside the
    step; a GPU whose step is shorter waits the rest. Its peers' loaders are as slow, so the wait adds no lag."""
    floor = workload.batch / workload.input_images_per_s if workload.input_images_per_s else 0.0
    if floor <= t.step:
        return replace(t, bound="storage" if t.stall > 0 else "compute")
    return replace(t, step=floor, input_wait=floor - t.step, bound="input")


def _gpu_step(workload: Workload, machine: Machine, gpus: int) -> StepTimes:
    """The step as the GPU's work, its communication and the file system make it."""
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
    return StepTimes(
        workload.busy_s + stall + left_over + end_lag,
        network,
        stall + left_over + end_lag,
        end_lag + stall,
        math.fsum(waits),
        kernel,
        stall,
        profiled,
        algorithm,
    )


def steps_per_epoch(gpus: int, batch: int, images: int = IMAGENET_TRAIN_IMAGES) -> int:
    """Steps of an epoch of `images` at `batch` per GPU on `gpus` GPUs (the last one partial)."""
    return -(-images // (gpus * batch))


class EpochOverhead(Protocol):
    """An epoch's time outside its steps (dlaunch/analysis/perfmodel/overhead.py): seconds per epoch by part at `gpus`."""

    def parts(self, workload: Workload, machine: Machine, gpus: int) -> Dict[str, float]: ...


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
    input_wait_s: float = 0.0  # the GPU's wait for a loader slower than its step
    bound: str = "compute"  # what sets the step: compute, input, storage (the file system)

    @property
    def epoch_overhead_s(self) -> float:
        return math.fsum(self.epoch_overhead.values())

    def run_s(self, epochs: int) -> float:
        """A training of `epochs` epochs: each its steps and its overhead (no start-up, no first-epoch warm-up)."""
        return epochs * (self.steps_per_epoch * self.step_s + self.epoch_overhead_s)

    @property
    def overhead_share(self) -> float:
        """Epoch overhead's share of the run's time: overhead / (steps x step + overhead)."""
        total = self.steps_per_epoch * self.step_s + self.epoch_overhead_s
        return self.epoch_overhead_s / total if total > 0 else 0.0


def predict(
    workload: Workload,
    network: Machine,
    gpus: Sequence[int],
    overhead: Optional[EpochOverhead] = None,
    epoch_images: int = IMAGENET_TRAIN_IMAGES,
) -> List[Prediction]:
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
        profiled_data = workload.data_s + t.stall + t.input_wait
        out.append(
            Prediction(
                gpus=p,
                nodes=network.nodes(p),
                step_s=t.step,
                comm_s=t.network,
                exposed_comm_s=t.exposed,
                wait_s=t.waits,
                hidden_wait_s=t.hidden_waits,
                kernel_comm_s=t.kernel,
                algorithm=t.algorithm,
                images_per_s=x[p],
                speedup=x[p] / x[g_ref],
                efficiency=(x[p] / x[g_ref]) / (p / g_ref),
                comm_share=t.kernel / (t.kernel + workload.compute_s),
                profiled_comm_share=t.profiled_comm / (t.profiled_comm + workload.compute_s + profiled_data),
                steps_per_epoch=steps[p],
                epoch_overhead=parts[p],
                input_wait_s=t.input_wait,
                bound=t.bound,
            )
        )
    return out


def intra_node_gbps(site: "Site") -> Optional[float]:
    """The profile's `[predict] intra_node_gbps_per_gpu` (None: it states none)."""
    return site.predict.intra_node_gbps_per_gpu if site.predict else None


def interconnect_of_site(site: "Site") -> Optional[Machine]:
    """The nominal machine of a site profile with a `[network]` section (None without one); inside a node its
    `intra_node_gbps`, else the A100's NVLink figure (`dlaunch report`'s predicted E_G; `dlaunch predict` refuses
    a site without one)."""
    if site.network is None:
        return None
    return Machine(
        site.gpus_per_node,
        site.network.latency_us,
        site.network.bandwidth_gbps_per_node,
        intra_node_gbps(site) or DEFAULT_INTRA_NODE_GBPS,
    )


def site_max_gpus(site: "Site") -> int:
    """GPUs of the site's largest partition (one node for a local site)."""
    return max([p.max_nodes for p in site.partitions] or [1]) * site.gpus_per_node
