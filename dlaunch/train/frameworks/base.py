"""The framework seam: everything that differs between DDP, Horovod and DeepSpeed.

The training loop (`dlaunch/train/loop.py`) calls only these methods, so a framework is added by writing
one subclass and registering it in `dlaunch/train/frameworks/__init__.py`.
"""

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any, ContextManager, Dict, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def tensors_digest(tensors: Iterable[torch.Tensor]) -> str:
    """sha256 of the tensors' bytes, in order."""
    digest = hashlib.sha256()
    for t in tensors:
        # Raw bytes through a uint8 view: numpy has no bfloat16.
        digest.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class Framework:
    """Base class; subclasses implement the methods that raise NotImplementedError."""

    name = "base"
    compiled = ""  # what `compile` compiled, for the metrics header ("": nothing)

    def init(self, cfg: Any) -> DistInfo:
        """Start the process group (or equivalent) and return this process's place in it."""
        raise NotImplementedError

    def wrap(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any
    ) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Make model and optimizer distributed; parameters are equal on all ranks afterwards."""
        raise NotImplementedError

    def compile(self, module: torch.nn.Module, mode: str) -> torch.nn.Module:
        """torch.compile of `module`, what `wrap` returned for the loop to call (--compile; dlaunch/train/workload.py):
        DDP's wrapper, whose buckets dynamo's DDPOptimizer splits the graph at, so the all-reduce still overlaps
        backward. Returns what the loop calls from then on."""
        self.compiled = "torch.compile(%s, mode=%s)" % (type(module).__name__, mode)
        return torch.compile(module, mode=mode)

    def batches_per_update(self, cfg: Any) -> int:
        """Micro-batches accumulated per optimizer update (the linear LR scaling counts all of them)."""
        return 1

    def eval_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module validation runs forward through (`model` is the one given to `wrap`)."""
        return model

    def parameters(self, model: torch.nn.Module) -> List[torch.nn.Parameter]:
        """This rank's parameters whose gradients it reduces (the profiler times their collective)."""
        return list(model.parameters())

    def parameter_digest(self, model: torch.nn.Module) -> str:
        """sha256 of the full parameters' bytes in registration order (a sharding framework gathers them)."""
        return tensors_digest(model.parameters())

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate `loss` (gradients averaged across ranks by the time `step` returns)."""
        loss.backward()

    def synchronize_gradients(self) -> None:
        """Called between `backward` and `step` of a training step: return once the gradients are ready for the
        optimizer (averaged across ranks), so that the loop can time communication apart from the update
        (dlaunch/train/phases.py). Default: `backward` already returned them so (DDP, DeepSpeed)."""

    def no_sync(self) -> ContextManager[Any]:
        """A context in which `backward` leaves gradients local (not averaged); used by profiling,
        which then averages them explicitly with `all_reduce_mean`. Default: no such mode (gradients
        are averaged anyway; averaging them again leaves them unchanged)."""
        return contextlib.nullcontext()

    def step(self) -> None:
        """Apply one optimizer step with the averaged gradients."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        raise NotImplementedError

    @property
    def param_groups(self):
        """The optimizer parameter groups whose `lr` the schedule sets each iteration."""
        raise NotImplementedError

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean of `tensor` over all ranks (returned, input untouched)."""
        raise NotImplementedError

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of `tensor` over all ranks (returned, input untouched): counts and energy."""
        raise NotImplementedError

    def all_gather_object(self, obj: Any) -> list:
        """`obj` of every rank, index = rank (small picklable objects: host names)."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> Dict[str, Any]:
        """Model and optimizer state for a checkpoint (model keys without wrapper prefixes)."""
        raise NotImplementedError

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        raise NotImplementedError

    def versions(self) -> Dict[str, str]:
        """Versions of the framework's own packages, for the metrics header."""
        return {}

    def collective_libraries(self) -> Tuple[str, ...]:
        """The libraries this process's collectives go through ("nccl" also for RCCL, "gloo", "mpi"),
        whose network dlaunch/train/network.py records."""
        return ()

    def flight_recorder_backend(self) -> Optional[str]:
        """The torch.distributed backend ("nccl", "gloo") whose collectives torch's flight recorder records for this
        process (dlaunch/train/flight_recorder.py); None where the collectives do not go through torch.distributed."""
        return None

    def settings(self) -> Dict[str, Any]:
        """Framework settings in effect, for the metrics header."""
        return {}

    def shutdown(self) -> None:
        """Tear down the process group; safe to call after a failure."""


class ProcessGroupFramework(Framework):
    """The loop's collectives over torch.distributed's default process group of `world_size` ranks, and
    the optimizer's parameter groups (DDP, DeepSpeed, the PyTorch parameter server's workers)."""

    world_size = 1
    optimizer: Any = None

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.all_reduce_sum(tensor).div_(self.world_size)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        dist.all_reduce(result)
        return result

    def all_gather_object(self, obj: Any) -> list:
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        dist.barrier()

    def collective_libraries(self) -> Tuple[str, ...]:
        """The default group's backends: "gloo", "nccl", or per device ("cpu:gloo,cuda:nccl")."""
        backend = str(dist.get_backend())
        return tuple(dict.fromkeys(part.split(":")[-1] for part in backend.split(",")))

    def flight_recorder_backend(self) -> Optional[str]:
        """NCCL where the default group has it, else gloo."""
        libraries = self.collective_libraries()
        return "nccl" if "nccl" in libraries else "gloo" if "gloo" in libraries else None
