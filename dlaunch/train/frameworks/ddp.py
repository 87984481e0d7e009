"""PyTorch DistributedDataParallel: NCCL on CUDA, gloo on CPU.

Rank and world size come from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE), or, where the profile starts one scheduler task per GPU, from the task's neutral
variables (dlaunch/train/jobenv.py); without either the process is a job of one (a process group over an in-memory store,
so collectives work on a laptop). A job of one does not wrap the model in DistributedDataParallel:
there is nothing to average, and DDP would still copy every gradient through its buckets.

--cuda-graphs (dlaunch/train/workload.py) is DDP's alone among the frameworks: across ranks it follows torch's notes
on CUDA graphs with DDP (NCCL's async error handling off before the group starts, DDP built on a side stream, more
than 11 eager iterations before the capture).
"""

import contextlib
import gc
import os
from typing import Any, ContextManager, Dict, Mapping, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlaunch.train import jobenv
from dlaunch.train.config import ConfigError
from dlaunch.train.frameworks.base import DistInfo, ProcessGroupFramework
from dlaunch.train.gpus import device_index, started_by_torchrun


def rank_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE from the task's neutral variables (dlaunch/train/jobenv.py)
    where one scheduler task runs per GPU (a profile's `task-per-gpu` mode); {} where torchrun set them,
    or outside a job step."""
    if "RANK" in environ or jobenv.task_count(environ) is None:
        return {}
    task = jobenv.task(environ)
    nodes = len(jobenv.node_hosts(environ))
    on_node = jobenv.tasks_per_node(environ, task.ntasks, nodes)[task.node_id]
    return {
        "RANK": str(task.task_id),
        "LOCAL_RANK": str(task.local_id),
        "WORLD_SIZE": str(task.ntasks),
        "LOCAL_WORLD_SIZE": str(on_node),
    }


def resolve_device(cfg: Any, local_rank: int, local_workers: int, one_launcher: bool) -> torch.device:
    """`--device auto|cpu|cuda` -> this rank's device (ConfigError when CUDA is asked for but absent, or when
    the node's workers outnumber the GPUs they see: dlaunch/train/gpus.py), before any process group starts."""
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is available")
        index = device_index(local_rank, local_workers, torch.cuda.device_count(), one_launcher, os.environ)
        return torch.device("cuda", index)
    return torch.device("cpu")


# Eager DDP iterations before a CUDA graph captures DDP's step (torch's CUDA graphs notes: "at least 11").
DDP_GRAPH_EAGER_STEPS = 11


def _cuda_grad_scaler() -> Any:
    amp = getattr(torch, "amp", None)
    if hasattr(amp, "GradScaler"):  # torch >= 2.3
        return amp.GradScaler("cuda")  # type: ignore[union-attr]  # hasattr(None, ...) is False
    return torch.cuda.amp.GradScaler()


class DDP(ProcessGroupFramework):
    name = "ddp"

    def __init__(self) -> None:
        self.module: Any = None  # the model itself
        self.model: Any = None  # what the loop calls: DDP(module), or the module in a job of one
        self.optimizer: Any = None
        self.scaler: Any = None
        self.backend = ""
        self.world_size = 1
        self.sync_bn = False

    def init(self, cfg: Any) -> DistInfo:
        env = os.environ
        env.update(rank_environment(env))
        rank = int(env.get("RANK", "0"))
        world_size = int(env.get("WORLD_SIZE", "1"))
        local_rank = int(env.get("LOCAL_RANK", "0"))
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
        device = resolve_device(cfg, local_rank, local_world_size, started_by_torchrun(env))
        if cfg.sync_bn and device.type != "cuda":
            raise ConfigError("--sync-bn needs a CUDA device (torch's SyncBatchNorm is GPU-only)")
        if cfg.amp == "fp16" and device.type != "cuda":
            raise ConfigError("--amp fp16 needs a CUDA device (use --amp bf16 on CPU)")
        if cfg.cuda_graphs and device.type != "cuda":
            raise ConfigError("--cuda-graphs needs a CUDA device")
        if cfg.cuda_graphs and world_size > 1 and cfg.warmup_steps <= DDP_GRAPH_EAGER_STEPS:
            raise ConfigError(
                "--cuda-graphs across %d ranks needs --warmup-steps > %d (DDP's eager iterations before "
                "a capture)" % (world_size, DDP_GRAPH_EAGER_STEPS)
            )
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if cfg.cuda_graphs:  # NCCL's watchdog must not poll collectives that a CUDA graph captures
            env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
        if "WORLD_SIZE" in env:
            dist.init_process_group(self.backend)
        else:
            dist.init_process_group(self.backend, store=dist.HashStore(), rank=0, world_size=1)
        self.world_size = world_size
        return DistInfo(rank, world_size, local_rank, local_world_size, device)

    def wrap(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any
    ) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
        self.sync_bn = cfg.sync_bn
        if cfg.sync_bn:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # reuses the Parameter objects
        device = next(model.parameters()).device
        self.module = model
        self.model = model
        if self.world_size > 1:
            # A CUDA graph of DDP's step needs DDP built on a side stream (torch's CUDA graphs notes, "Usage with
            # DistributedDataParallel").
            stream = torch.cuda.Stream() if cfg.cuda_graphs else None
            if stream is not None:
                stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                self.model = DistributedDataParallel(
                    model, device_ids=[device.index] if device.type == "cuda" else None
                )
            if stream is not None:
                torch.cuda.current_stream().wait_stream(stream)
        self.optimizer = optimizer
        if cfg.amp == "fp16":
            self.scaler = _cuda_grad_scaler()
        return self.model, optimizer

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def no_sync(self) -> ContextManager[Any]:
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def step(self) -> None:
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> Dict[str, Any]:
        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.scaler:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def versions(self) -> Dict[str, str]:
        return {"ddp": torch.__version__}

    def settings(self) -> Dict[str, Any]:
        return {
            "backend": self.backend,
            "wrapped": self.world_size > 1,
            "sync_bn": self.sync_bn,
            "grad_scaler": self.scaler is not None,
        }

    def shutdown(self) -> None:
        # Free the DDP reducer (it holds the process group and gloo work objects) while the
        # interpreter is fully alive, then the group: a gloo group torn down at interpreter exit
        # aborted a rank now and then ("terminate called without an active exception").
        self.model = self.module = self.optimizer = None
        gc.collect()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
