"""Two measures of where a step's time goes, kept apart (each its own record):

1. `--profile-steps N`, wall-clock timers (record `profile`, method "unoverlapped-timers"): where the
   time of a step goes, measured without overlap.
2. `--kernel-profile-steps N`, CUDA kernel time per class (record `kernel_profile`, method
   "cuda-kernel-time"): what Table 2 of Aach et al. 2023 measures with NSys, the share of the GPU's
   kernel time in NCCL communication, in cuDNN computation and in I/O kernels; see `KernelProfiler`.

Timers:

For N steps right after the warm-up steps, each step is timed in parts, with the device
synchronised at every boundary (so the parts are un-overlapped costs, not what a normal step pays):
  data_s    waiting for the next batch;
  compute_s forward + backward with gradient synchronisation disabled (`Framework.no_sync()`);
  comm_s    one explicit all-reduce (mean) of all gradients flattened into one tensor
            (`Framework.all_reduce_mean`), copied back into the gradients; 0 for a job of one
            process, which has nothing to communicate;
  step_s    the whole step: data + compute + comm + the optimizer step.
A normal step overlaps the all-reduce with the backward pass in buckets, so step_s here is an upper
bound of a normal step, and compute_s + comm_s shows what overlap can at best hide. The profiled
steps train exactly like normal ones (averaged gradients) and are excluded from throughput.
The `profile` record holds rank 0's means (method "unoverlapped-timers"). Every rank's phases of the normal,
overlapped steps are a third measure (dlaunch/train/phases.py, the epoch record's `phases`), which times
neither profiled nor kernel-profiled steps.
"""

import time
from collections import Counter
from typing import Any, Callable, Dict, Iterable, List, Tuple

import torch

METHOD = "unoverlapped-timers"
KERNEL_METHOD = "cuda-kernel-time"
KERNEL_CLASSES = ("comm", "compute", "io", "other")
# Kernel names (lower case) by class, first match wins. comm: NCCL's (and RCCL's) kernels, e.g.
# ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllReduce_Sum_f32_RING_LL; io: the batch's way
# onto the GPU: host-to-device copies ("Memcpy HtoD (Pinned -> Device)") and DALI's and nvJPEG's kernels
# (decoding and augmentation on the GPU); compute: the cuDNN and cuBLAS library kernels (convolutions,
# cuDNN batch norm, GEMMs: cudnn::..., sm80_xmma_..., ampere_sgemm_..., cutlass::..., winograd...).
# Everything else (PyTorch's own element-wise and reduction kernels, the optimizer, other copies) is
# `other`: Table 2's three shares do not sum to 100 either.
KERNEL_PATTERNS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("comm", ("nccl",)),
    ("io", ("memcpy htod", "dali", "nvjpeg")),
    ("compute", ("cudnn", "xmma", "gemm", "cutlass", "winograd", "implicit_convolve", "conv2d", "convolution")),
)
CYCLE_STEPS = 50  # steps per profiler session: their kernel records are summed, then dropped


class StepProfiler:
    def __init__(
        self, framework: Any, parameters: List[torch.nn.Parameter], synchronize: Callable[[], None], world_size: int
    ):
        self.framework = framework
        self.world_size = world_size
        self.parameters = parameters
        self.synchronize = synchronize
        self.times: Dict[str, List[float]] = {"data_s": [], "compute_s": [], "comm_s": [], "step_s": []}

    def step(self, forward_backward: Callable[[], torch.Tensor], started: float, data_s: float) -> torch.Tensor:
        """Run one training step in timed parts; `started` is when the batch was requested."""
        self.framework.zero_grad()
        begin = time.perf_counter()
        with self.framework.no_sync():
            loss = forward_backward()
        self.synchronize()
        computed = time.perf_counter()
        if self.world_size > 1:
            self.all_reduce_gradients()
        self.synchronize()
        communicated = time.perf_counter()
        self.framework.step()
        self.synchronize()
        for name, value in (
            ("data_s", data_s),
            ("compute_s", computed - begin),
            ("comm_s", communicated - computed),
            ("step_s", time.perf_counter() - started),
        ):
            self.times[name].append(value)
        return loss

    def all_reduce_gradients(self) -> None:
        grads = [p.grad for p in self.parameters if p.grad is not None]
        mean = self.framework.all_reduce_mean(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for g in grads:
            g.copy_(mean[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def summary(self) -> Dict[str, Any]:
        """Fields of the `profile` record."""
        fields: Dict[str, Any] = {name: sum(v) / len(v) for name, v in self.times.items()}
        fields.update(steps=len(self.times["step_s"]), method=METHOD)
        return fields


def kernel_class(name: str) -> str:
    """The class of one CUDA kernel (or memory operation) by its name: comm, compute, io or other."""
    lowered = name.lower()
    for kind, patterns in KERNEL_PATTERNS:
        if any(p in lowered for p in patterns):
            return kind
    return "other"


def device_kernels(events: Iterable[Any]) -> Iterable[Tuple[str, float]]:
    """(name, microseconds) of the GPU activity among the profiler's events (`profile.events()`):
    kernels, copies and sets, whose device_type is CUDA (also on ROCm builds)."""
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CUDA:
            yield event.name, event.time_range.elapsed_us()


class KernelTimes:
    """Kernel time per class (microseconds), and per kernel name for the record's top kernels."""

    def __init__(self) -> None:
        self.by_class: Dict[str, float] = {kind: 0.0 for kind in KERNEL_CLASSES}
        self.by_name: Counter = Counter()

    def add(self, kernels: Iterable[Tuple[str, float]]) -> None:
        for name, us in kernels:
            self.by_class[kernel_class(name)] += us
            self.by_name[name] += us  # type: ignore[assignment]  # a Counter of microseconds (floats), for most_common

    def top(self, per_class: int = 3) -> Dict[str, List[List[Any]]]:
        """The longest kernels of each class: {class: [[name, seconds], ...]}."""
        top: Dict[str, List[List[Any]]] = {kind: [] for kind in KERNEL_CLASSES}
        for name, us in self.by_name.most_common():
            entries = top[kernel_class(name)]
            if len(entries) < per_class:
                entries.append([name[:200], us / 1e6])
        return top


def kernel_fields(class_seconds: List[float], steps: int, ranks: int, top: Dict[str, Any]) -> Dict[str, Any]:
    """Fields of the `kernel_profile` record from the seconds per class summed over ranks."""
    fields: Dict[str, Any] = {kind + "_s": value for kind, value in zip(KERNEL_CLASSES, class_seconds)}
    fields.update(kernel_s=sum(class_seconds), steps=steps, ranks=ranks, method=KERNEL_METHOD, top_kernels=top)
    return fields


def unavailable_kernel_fields(reason: str, steps: int, ranks: int) -> Dict[str, Any]:
    """The `kernel_profile` record of a run that has no CUDA kernels to profile (a CPU run)."""
    figure = "unavailable: " + reason
    fields: Dict[str, Any] = {kind + "_s": figure for kind in KERNEL_CLASSES}
    fields.update(kernel_s=figure, steps=steps, ranks=ranks, method=KERNEL_METHOD)
    return fields


class KernelProfiler:
    """CUDA kernel time per class over the steps between `start()` and `finish()`, with torch.profiler
    recording GPU activity only (CUPTI: every kernel of the process, DALI's included). The steps are
    normal, overlapped training steps; the profiler's overhead keeps them out of throughput. Records are
    summed every CYCLE_STEPS steps (after a device sync, so that no kernel straddles two sessions) and
    dropped, so a profile over thousands of steps holds one session's records at a time."""

    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize
        self.times = KernelTimes()
        self.steps = 0
        self.session: Any = None  # a torch.profiler.profile while one runs

    def start(self) -> None:
        self.session = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        self.session.start()

    def step(self) -> None:
        """Call after each profiled step."""
        self.steps += 1
        if self.steps % CYCLE_STEPS == 0:
            self._collect()
            self.start()

    def _collect(self) -> None:
        self.synchronize()
        session, self.session = self.session, None
        session.stop()
        self.times.add(device_kernels(session.events()))

    def finish(self) -> List[float]:
        """Seconds per class (KERNEL_CLASSES order) on this rank."""
        if self.session is not None:
            self._collect()
        return [self.times.by_class[kind] / 1e6 for kind in KERNEL_CLASSES]
