"""Horovod: `hvd.DistributedOptimizer`, parameters and optimizer state broadcast from rank 0.

Started by `horovodrun -np N` (add `--gloo` to use Gloo when Horovod is built with MPI too) or by
`srun --mpi=pmix|pmi2` with one task per GPU; rank, local rank and size come from Horovod. Started by
torchrun, every process would be an independent job of one: `init` compares `hvd.size()` with the
launcher's environment and fails loudly instead.

Knobs: `--fp16-allreduce` (fp16 gradient compression), `--fusion-threshold-mb` (tensor fusion buffer,
exported as HOROVOD_FUSION_THRESHOLD before `hvd.init`), `--backward-passes-per-step N` (gradients of
N micro-batches accumulate locally, each scaled by 1/N, and are reduced and applied on every N-th
`step`; the loop's steps are then micro-batches).

--compile compiles the model (Horovod's hooks sit on the gradient accumulators, outside the compiled graph);
--cuda-graphs and --host-syncs minimal are refused.

BatchNorm statistics stay per rank (Horovod broadcasts buffers only at the start); rank 0's equal
DDP's, which broadcasts rank 0's buffers every forward.
"""

import contextlib
import os
from typing import Any, Dict, Iterator, Optional, Tuple

import horovod
import horovod.torch as hvd
import torch

from dlaunch.train import jobenv
from dlaunch.train.config import ConfigError
from dlaunch.train.frameworks.base import DistInfo, Framework
from dlaunch.train.frameworks.ddp import resolve_device
from dlaunch.train.workload import refuse_step_options

# Where launchers publish the job size, most specific first: horovodrun --gloo, Open MPI's mpirun,
# torchrun, the scheduler's step (dlaunch/train/jobenv.py).
_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", jobenv.NTASKS)


def expected_size(env: Dict[str, str]) -> Optional[Tuple[str, int]]:
    """(variable, size) from the first launcher variable that is set, else None."""
    for name in _SIZE_VARIABLES:
        value = env.get(name, "")
        if value.isdigit():
            return name, int(value)
    return None


def check_controller(env: Dict[str, str]) -> None:
    """Refuse Gloo CPU operations under the MPI controller (Horovod crashes on that mix)."""
    if env.get("HOROVOD_CPU_OPERATIONS", "").lower() == "gloo" and env.get("HOROVOD_CONTROLLER", "").lower() != "gloo":
        raise ConfigError(
            "HOROVOD_CPU_OPERATIONS=gloo needs the Gloo controller (horovodrun --gloo); "
            "unset it when starting with mpirun or srun --mpi"
        )


class Horovod(Framework):
    name = "horovod"

    def __init__(self) -> None:
        self.model: Any = None
        self.optimizer: Any = None
        self.passes_per_step = 1
        self.passes = 0
        self.skip_synchronize = False  # the next update applies the gradients as they are (no_sync, synchronized)
        self.fp16_allreduce = False
        self.on_gpu = False

    def init(self, cfg: Any) -> DistInfo:
        refuse_step_options(
            cfg,
            "Horovod's all-reduces run on its own background thread, outside any CUDA graph",
            "Horovod's optimizer waits on the host for every step's all-reduces (synchronize)",
        )
        check_controller(dict(os.environ))
        if cfg.sync_bn:
            raise ConfigError("--sync-bn is implemented for --framework ddp only")
        if cfg.amp == "fp16":
            raise ConfigError("--amp fp16 is implemented for --framework ddp and deepspeed only (use bf16)")
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.fusion_threshold_mb * 1024 * 1024))
        hvd.init()
        expected = expected_size(dict(os.environ))
        if expected is not None and expected[1] > 1 and hvd.size() != expected[1]:
            size = hvd.size()
            hvd.shutdown()
            raise ConfigError(
                "--framework horovod: Horovod sees %d process(es) but %s=%d; start with "
                "horovodrun or the scheduler's MPI launch (not torchrun)" % (size, expected[0], expected[1])
            )
        device = resolve_device(cfg, hvd.local_rank(), hvd.local_size(), one_launcher=False)  # a task per rank
        self.on_gpu = device.type == "cuda"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return DistInfo(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), device)

    def wrap(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any
    ) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
        self.passes_per_step = cfg.backward_passes_per_step
        self.fp16_allreduce = cfg.fp16_allreduce
        # Horovod's collectives refuse non-contiguous tensors ("Tensor is required to be contiguous."), and
        # channels-last conv weights and their gradients are not: contiguous weights, in place (the same
        # Parameter objects); with channels-last input batches cuDNN still runs its channels-last kernels.
        model = model.to(memory_format=torch.contiguous_format)
        self.optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
            backward_passes_per_step=self.passes_per_step,
        )
        self.model = model
        self.broadcast_from_rank0()
        return model, self.optimizer

    def broadcast_from_rank0(self) -> None:
        """Rank 0's parameters, buffers and (non-empty) optimizer state on every rank. Horovod would
        initialise an empty optimizer state by a zero-gradient step, which weight decay turns into a
        parameter change that DDP does not make; a fresh optimizer is equal on all ranks anyway."""
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer.state_dict()["state"]:
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def batches_per_update(self, cfg: Any) -> int:
        return cfg.backward_passes_per_step

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.passes_per_step if self.passes_per_step > 1 else loss).backward()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward without Horovod's all-reduce hooks; the next `step` applies the gradients as they
        are then (the caller averages them). Horovod has no such mode: this sets the optimizer's
        per-parameter countdown of backward passes (`_allreduce_delay`; a hook reduces at zero) out of
        reach, then restores it and forgets the hooks' empty handles (`_handles`), so the optimizer is
        as before the backward (Horovod 0.19-0.28)."""
        delays = self.optimizer._allreduce_delay
        saved = dict(delays)
        for p in delays:
            delays[p] = 2**62
        try:
            yield
        finally:
            delays.update(saved)
            self.optimizer._handles.clear()
        self.skip_synchronize = True

    def synchronize_gradients(self) -> None:
        """On the backward pass that completes an update: wait for Horovod's all-reduces
        (`optimizer.synchronize()`); `step` then applies them under `skip_synchronize`, as Horovod's own
        `step` would after synchronising."""
        if (self.passes + 1) % self.passes_per_step == 0 and not self.skip_synchronize:
            self.optimizer.synchronize()
            self.skip_synchronize = True

    def step(self) -> None:
        self.passes += 1
        if self.passes % self.passes_per_step:
            return
        if self.skip_synchronize:
            self.skip_synchronize = False
            with self.optimizer.skip_synchronize():
                self.optimizer.step()
        else:
            self.optimizer.step()

    def zero_grad(self) -> None:
        if self.passes % self.passes_per_step == 0:
            self.optimizer.zero_grad()

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(tensor, op=hvd.Average)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(tensor, op=hvd.Sum)

    def all_gather_object(self, obj: Any) -> list:
        return hvd.allgather_object(obj)

    def barrier(self) -> None:
        hvd.barrier()

    def state_dict(self) -> Dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.broadcast_from_rank0()

    def versions(self) -> Dict[str, str]:
        return {"horovod": horovod.__version__}

    def collective_libraries(self) -> Tuple[str, ...]:
        """NCCL for GPU tensors where Horovod has it; the controller (MPI or Gloo) for the rest."""
        controller = "mpi" if hvd.mpi_enabled() else "gloo"
        return ("nccl", controller) if self.on_gpu and hvd.nccl_built() else (controller,)

    def settings(self) -> Dict[str, Any]:
        return {
            "controller": "mpi" if hvd.mpi_enabled() else "gloo",
            "built": {"mpi": hvd.mpi_built(), "gloo": hvd.gloo_built(), "nccl": bool(hvd.nccl_built())},
            "fp16_allreduce": self.fp16_allreduce,
            "fusion_threshold_bytes": int(os.environ["HOROVOD_FUSION_THRESHOLD"]),
            "backward_passes_per_step": self.passes_per_step,
        }

    def shutdown(self) -> None:
        if hvd.is_initialized():
            hvd.shutdown()
