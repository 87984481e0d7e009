"""The step's workload options (issue 39): torch.compile, CUDA graphs, the SGD implementation, host syncs.

benchmarks/bare_loop_gpu.py takes the same options with the same meaning, so a pair (trainer, bare loop) measures the
trainer's own overhead. The combinations that cannot run are refused by dlaunch/train/config.py (torch-free, also
for the launcher); what the image's torch lacks is refused here (`torch_refusal`) and what a framework cannot do by
its seam's `init` (Horovod, DeepSpeed and the parameter server refuse --cuda-graphs and --host-syncs minimal), each in
one line naming the flag, exit 2.

--compile MODE      torch.compile of what the loop calls (`Framework.compile`: DDP's wrapper, so that dynamo splits
                    the graph at DDP's buckets and the all-reduce still overlaps backward; DeepSpeed's engine compiles
                    its module). Validation and checkpoints use the model itself, uncompiled. The first step compiles
                    forward and backward: its wall time, device synchronised, is `compile_s` (the epoch record of the
                    epoch it ran in); config.py refuses --compile without warm-up steps, so it is never measured. Each
                    epoch record of a compiled run also counts `graphs_compiled_after_warmup`: graphs torch.compile
                    compiled after the warm-up steps (recompilations in profiled or measured steps; 0 when the
                    warm-up covered them), which `dlaunch predict --from-runs` refuses to calibrate on.
--optimizer-impl    torch.optim.SGD's foreach=True / fused=True (default: torch's own choice). torch 1.11's SGD has
                    neither; its multi-tensor SGD is torch.optim._multi_tensor.SGD, used for foreach there. The fused
                    SGD gets zero momentum just before its first step (`zero_momentum_at_first_step`: an fp16 first
                    step that overflows made it diverge).
--cuda-graphs       the whole step (zero_grad, forward, backward, DDP's all-reduce, the optimizer's and fp16's loss
                    scaler's step, the loss's bookkeeping) is captured in one CUDA graph at the last warm-up step and
                    replayed after it (`CapturedStep`). The LR becomes one device tensor that the captured fused SGD
                    reads and the loop fills each step (`LearningRate`), so the graph follows the schedule. A replayed
                    step is not timed in phases (its parts are inside one replay).
--host-syncs        default: the loss's running sum and non-finite streak are kept on the device (a few small kernels
                    per step, no sync). minimal: the step keeps its loss tensor and nothing else (`HostLosses`); the
                    losses are read on the host at the stop checks (every STOP_CHECK_STEPS steps, which synchronise
                    anyway) and at the epoch's end. fp16 needs the fused SGD (config.py), whose step skips an
                    overflowing step on the device instead of GradScaler reading the flag on the host. On CUDA the
                    first measured step runs under torch.cuda.set_sync_debug_mode("warn"): the synchronising calls it
                    still made are the `step_host_syncs` of its epoch record ([] when none).
Per-step work the bare loop does not do, and why it stays in both modes: the phase timers (CUDA events, never waited
for: dlaunch/train/phases.py), setting the LR, and asking the loader for the batch. The stop check every
STOP_CHECK_STEPS steps (one all-reduce, read on the host), the energy and GPU-health polls there (NVML calls on the
host, no device sync) are not per step.
"""

import contextlib
import inspect
import math
import os
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn

from dlaunch.train.config import ConfigError, TrainConfig


class TorchFeatures(NamedTuple):
    """What this torch offers of the workload options."""

    version: str
    compile: bool  # torch.compile (torch >= 2.0)
    sgd_options: Tuple[str, ...]  # keyword options of torch.optim.SGD among foreach (>= 1.12), fused (>= 2.3)
    multi_tensor_sgd: bool  # torch.optim._multi_tensor.SGD: the foreach SGD of torch 1.11
    fused_tensor_lr: bool  # the fused SGD takes the LR as a device tensor (aten::_fused_sgd_.tensor_lr)

    @classmethod
    def of_this_torch(cls) -> "TorchFeatures":
        parameters = inspect.signature(torch.optim.SGD).parameters
        fused_sgd = getattr(torch.ops.aten, "_fused_sgd_", None) if hasattr(torch, "_fused_sgd_") else None
        return cls(
            torch.__version__.split("+")[0],
            hasattr(torch, "compile"),
            tuple(name for name in ("foreach", "fused") if name in parameters),
            multi_tensor_sgd() is not None,
            fused_sgd is not None and "tensor_lr" in fused_sgd.overloads(),
        )


def multi_tensor_sgd() -> Any:
    """torch.optim._multi_tensor.SGD, the foreach SGD of torch 1.11 (a submodule torch.optim does not import); None
    where this torch has none."""
    try:
        from torch.optim._multi_tensor import SGD
    except ImportError:
        return None
    return SGD


def torch_refusal(cfg: TrainConfig, features: TorchFeatures) -> Optional[str]:
    """Why this torch cannot run the workload options of `cfg` (one line naming the flag), else None."""
    if cfg.compile != "off" and not features.compile:
        return "--compile needs torch >= 2.0 (this image has %s)" % features.version
    if cfg.optimizer_impl == "foreach" and "foreach" not in features.sgd_options and not features.multi_tensor_sgd:
        return "--optimizer-impl foreach needs torch >= 1.12 (this image has %s)" % features.version
    if cfg.optimizer_impl == "fused" and "fused" not in features.sgd_options:
        return "--optimizer-impl fused needs torch >= 2.3 (this image has %s)" % features.version
    if cfg.cuda_graphs and not features.fused_tensor_lr:
        return (
            "--cuda-graphs needs a fused SGD that reads the LR from a device tensor (aten::_fused_sgd_.tensor_lr), "
            "which torch %s lacks" % features.version
        )
    return None


def refuse_step_options(cfg: TrainConfig, cuda_graphs_why: str, host_syncs_why: str) -> None:
    """A framework that cannot capture its step in a CUDA graph or drop its per-step host synchronisation
    refuses --cuda-graphs and --host-syncs minimal, saying why."""
    if cfg.cuda_graphs:
        raise ConfigError("--cuda-graphs is implemented for --framework ddp only (%s)" % cuda_graphs_why)
    if cfg.host_syncs == "minimal":
        raise ConfigError("--host-syncs minimal: %s" % host_syncs_why)


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD with momentum, `--optimizer-impl`'s implementation; weight decay on conv/linear weights only (not on
    BatchNorm weights or biases)."""
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    sgd: Any = torch.optim.SGD
    options: Dict[str, Any] = {}
    if cfg.optimizer_impl != "default":
        if cfg.optimizer_impl in inspect.signature(torch.optim.SGD).parameters:
            options[cfg.optimizer_impl] = True
        else:  # torch 1.11: foreach only, as its own class (torch_refusal refused fused)
            sgd = multi_tensor_sgd()
    try:
        optimizer = sgd(groups, lr=cfg.lr, momentum=cfg.momentum, **options)
    except RuntimeError as e:  # e.g. a torch whose fused SGD does not run on this device
        raise ConfigError("--optimizer-impl %s: %s" % (cfg.optimizer_impl, str(e).splitlines()[0])) from None
    if options.get("fused") and cfg.momentum:
        zero_momentum_at_first_step(optimizer)
    return optimizer


def zero_momentum_at_first_step(optimizer: torch.optim.Optimizer) -> None:
    """Give a fused SGD zero momentum buffers just before the first step of each parameter group.

    torch's fused SGD creates the buffers uninitialised (`torch.empty_like`) in its first step and leaves them so when
    GradScaler's overflow flag tells it to skip that step; the next step adds that memory into the momentum. fp16's
    first step routinely overflows (the loss scale starts at 65,536): on an H100 (torch 2.11) ResNet-50 at fp16
    diverged by step 10, and on this CPU (torch 2.14) the weights took whatever the memory held. With zero buffers
    and dampening 0 the first update is the same (0.9 * 0 + g), and a skipped step leaves them untouched. Checked at
    each step, per group (two lookups a step for the trainer's two groups), not filled at construction: DeepSpeed
    swaps its fp32 master copies into the groups in between (state kept for the swapped-out parameters would break
    `state_dict`), and its ZeRO steps one group at a time. Horovod's DistributedOptimizer is a new optimizer built
    from the groups, without this hook; Horovod has no fp16 here (refused), so no step is skipped."""

    def zero_missing_buffers(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in opt.param_groups:
            params = group["params"]
            if not params or group.get("dampening", 0):
                continue
            if opt.state.get(params[0], {}).get("momentum_buffer") is not None:
                continue  # given its buffers already, or loaded from a checkpoint
            for param in params:
                if opt.state[param].get("momentum_buffer") is None:
                    opt.state[param]["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)

    optimizer.register_step_pre_hook(zero_missing_buffers)


def optimizer_impl(optimizer: torch.optim.Optimizer) -> str:
    """The SGD implementation a step runs: fused, foreach or for-loop (torch's choice for `default`; "default" where
    this torch cannot say which)."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return "fused"
    if group.get("foreach"):  # torch 1.11's multi-tensor SGD has foreach=True in its defaults too
        return "foreach"
    if group.get("foreach") is None:
        try:
            from torch.optim.optimizer import _default_to_fused_or_foreach
        except (
            ImportError
        ):  # before torch 2.0: 1.11's SGD has only the for-loop; 1.12's and 1.13's choice is not known here
            return "for-loop" if "foreach" not in inspect.signature(torch.optim.SGD).parameters else "default"
        params = [p for g in optimizer.param_groups for p in g["params"]]
        return "foreach" if _default_to_fused_or_foreach(params, False, False)[1] else "for-loop"
    return "for-loop"


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (torch._dynamo's counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class FirstStepClock:
    """`compile_s`: the wall time of this process's first step, device synchronised at both ends (under --compile:
    torch.compile's tracing and code generation of forward and backward, plus one step)."""

    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize
        self.began: Optional[float] = None
        self.seconds: Optional[float] = None

    def start(self) -> None:
        self.synchronize()
        self.began = time.perf_counter()

    def stop(self) -> None:
        self.synchronize()
        assert self.began is not None
        self.seconds = time.perf_counter() - self.began


class LearningRate:
    """Puts the schedule's LR into the optimizer's parameter groups each step: a number, or (`device` given:
    --cuda-graphs) one device tensor shared by the groups, which the captured step reads; filling it is a kernel,
    no host sync. The groups are asked for each step: loading a checkpoint replaces them."""

    def __init__(self, device: Optional[torch.device] = None):
        self.tensor = torch.zeros((), dtype=torch.float32, device=device) if device is not None else None

    def set(self, param_groups: List[Dict[str, Any]], value: float) -> None:
        lr: Any = value
        if self.tensor is not None:
            self.tensor.fill_(value)
            lr = self.tensor
        for group in param_groups:
            group["lr"] = lr


class DeviceLosses:
    """The loss's bookkeeping on the device, in place (--host-syncs default, and every --cuda-graphs run, whose
    captured step does it): the epoch's sum, the current and the longest streak of non-finite losses."""

    def __init__(self, device: torch.device, max_nonfinite_steps: int):
        self.max_nonfinite_steps = max_nonfinite_steps
        self.sum = torch.zeros((), dtype=torch.float64, device=device)
        self.streak = torch.zeros((), dtype=torch.float64, device=device)
        self.longest = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, loss: torch.Tensor) -> None:
        self.sum += loss
        self.streak.add_(1.0).mul_((~torch.isfinite(loss)).double())
        torch.maximum(self.longest, self.streak, out=self.longest)

    def settle(self) -> None:
        """Nothing is left to read: every step's loss is in the sums already."""

    def new_epoch(self) -> None:
        self.sum.zero_()

    def epoch_sum(self) -> float:
        return self.sum.item()

    def diverged_flag(self) -> torch.Tensor:
        """[1.0] when some --max-nonfinite-steps consecutive losses were non-finite, else [0.0] (on the device)."""
        return (self.longest >= self.max_nonfinite_steps).double().reshape(1)


class HostLosses:
    """--host-syncs minimal: a step keeps its loss tensor (no kernel, no sync); `settle` reads the kept losses on the
    host (at the stop checks and the epoch's end) into the same figures as `DeviceLosses`."""

    def __init__(self, device: torch.device, max_nonfinite_steps: int):
        self.device = device
        self.max_nonfinite_steps = max_nonfinite_steps
        self.pending: List[torch.Tensor] = []
        self.sum = 0.0
        self.streak = 0
        self.longest = 0

    def add(self, loss: torch.Tensor) -> None:
        self.pending.append(loss)

    def settle(self) -> None:
        if not self.pending:
            return
        values = torch.stack(self.pending).double().tolist()
        self.pending = []
        for value in values:
            self.sum += value
            self.streak = 0 if math.isfinite(value) else self.streak + 1
            self.longest = max(self.longest, self.streak)

    def new_epoch(self) -> None:
        self.sum = 0.0

    def epoch_sum(self) -> float:
        self.settle()
        return self.sum

    def diverged_flag(self) -> torch.Tensor:
        self.settle()
        return torch.tensor([float(self.longest >= self.max_nonfinite_steps)], dtype=torch.float64, device=self.device)


def loss_keeper(cfg: TrainConfig, device: torch.device) -> Any:
    """`HostLosses` for --host-syncs minimal (a CUDA graph's step keeps its losses on the device), else `DeviceLosses`."""
    keeper = HostLosses if cfg.host_syncs == "minimal" and not cfg.cuda_graphs else DeviceLosses
    return keeper(device, cfg.max_nonfinite_steps)


@contextlib.contextmanager
def host_syncs_seen() -> Iterator[List[str]]:
    """Inside the block (on a CUDA device), torch's sync debug mode warns at each call that synchronises the host with
    the device; yields the list that receives "file:line: message" of each, filled when the block ends."""
    seen: List[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            torch.cuda.set_sync_debug_mode("default")
    seen.extend(host_syncs_of(caught))


# What torch's sync debug mode warns at a synchronising call (c10/cuda/CUDAFunctions.cpp); turning the mode on warns
# too ("Synchronization debug mode is a prototype feature..."), which is no sync.
SYNC_WARNING = "called a synchronizing CUDA operation"


def host_syncs_of(caught: List[warnings.WarningMessage]) -> List[str]:
    """ "file:line: message" of each warning in `caught` that torch's sync debug mode gave at a synchronising call."""
    return [
        "%s:%d: %s" % (os.path.basename(w.filename), w.lineno, str(w.message).splitlines()[0])
        for w in caught
        if SYNC_WARNING in str(w.message)
    ]


class CapturedStep:
    """--cuda-graphs: `step(images, labels) -> loss` runs eagerly on a side stream before `capture_step` (a session
    step), is captured in one CUDA graph at it and replayed from then on. The graph reads the batch tensors it was
    captured with: a later batch in other tensors is copied into them (the synthetic loader's is the same every step,
    so nothing is copied). The captured loss tensor is overwritten by each replay."""

    def __init__(self, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], capture_step: int):
        self.step = step
        self.capture_step = capture_step
        self.side = torch.cuda.Stream()
        self.graph: Any = None
        self.inputs: Tuple[torch.Tensor, ...] = ()
        self.loss: Optional[torch.Tensor] = None

    def __call__(self, session_step: int, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        current = torch.cuda.current_stream()
        if self.graph is None and session_step < self.capture_step:
            self.side.wait_stream(current)
            with torch.cuda.stream(self.side):
                loss = self.step(images, labels)
            current.wait_stream(self.side)
            return loss
        if self.graph is None:
            self.inputs = (images, labels)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.loss = self.step(images, labels)
        else:
            for static, batch in zip(self.inputs, (images, labels)):
                if batch.data_ptr() != static.data_ptr():
                    static.copy_(batch, non_blocking=True)
        self.graph.replay()
        assert self.loss is not None
        return self.loss
