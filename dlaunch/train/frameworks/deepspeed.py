"""DeepSpeed: `deepspeed.initialize` with a generated config, started by torchrun (not DeepSpeed's launcher).

The process group is the one DDP sets up (torchrun's environment; gloo on CPU, NCCL on CUDA) and
`deepspeed.init_distributed` adopts it, so the collectives are DDP's. The optimizer is the trainer's
torch SGD, passed in, so the trainer's LR schedule drives it through `param_groups` (also under ZeRO,
whose partitioned optimizer steps that same SGD).

Precision: `--amp bf16` uses DeepSpeed's bf16 mode (module cast to bf16 before `initialize`, so
BatchNorm buffers are bf16 too; fp32 master weights in the optimizer); `--amp fp16` its fp16 mode
with dynamic loss scaling (CUDA only). The engine casts floating-point inputs to the module's dtype (a
forward pre-hook): DeepSpeed switches off the loop's autocast inside the engine on CUDA. Weights are made
contiguous before `initialize` (DeepSpeed broadcasts them as bytes; channels-last ones cannot be viewed
so); channels-last input batches keep cuDNN on its channels-last kernels. DeepSpeed 0.19 on a machine without GPUs picks its CPU
accelerator; its first use compiles a small communication op (ninja, about 1.5 minutes), cached in
TORCH_EXTENSIONS_DIR.

Checkpoints (`state_dict`) hold module and optimizer state dicts, not DeepSpeed checkpoint folders:
- ZeRO 0: model and optimizer state; in fp32 a DDP checkpoint resumes here and vice versa (with
  `--amp bf16` the saved module is bf16 and the fp32 master weights are refreshed from it).
- ZeRO 1/2: the optimizer state (momentum) is partitioned across ranks, so a checkpoint holds the
  model only; resuming restores weights, BatchNorm statistics and the trainer's step and restarts
  momentum from zero.
- ZeRO 3: parameters are partitioned too; checkpoints are refused (`--checkpoint-dir`).

--compile compiles through the engine (`engine.compile`); --cuda-graphs and --host-syncs minimal are refused: the
engine's step waits on the host every step.

DeepSpeed clips gradients to norm 1.0 by default; here only `--grad-clip F` clips. `--profile-steps`
needs whole local gradients (`no_sync`), so it is refused under ZeRO >= 1.
"""

import os
from typing import Any, ContextManager, Dict, Tuple

import deepspeed
import torch

from dlaunch.train.config import ConfigError
from dlaunch.train.frameworks.base import DistInfo, tensors_digest
from dlaunch.train.frameworks.ddp import DDP
from dlaunch.train.workload import refuse_step_options


def deepspeed_config(cfg: Any, world_size: int) -> Dict[str, Any]:
    """The DeepSpeed config dict for `cfg` (one micro-batch per step, no gradient accumulation)."""
    config: Dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "train_batch_size": cfg.batch_size * world_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": cfg.zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # the trainer prints and records progress
        # DeepSpeed clips to norm 1.0 unless told otherwise; the other frameworks do not clip.
        "gradient_clipping": cfg.grad_clip if cfg.grad_clip is not None and cfg.grad_clip > 0 else 0.0,
    }
    if cfg.amp == "bf16":
        config["bf16"] = {"enabled": True}
    elif cfg.amp == "fp16":
        config["fp16"] = {"enabled": True}
    return config


def cast_floating_inputs(dtype: torch.dtype) -> Any:
    """A forward pre-hook that casts the floating-point tensor arguments of a module to `dtype`."""

    def hook(module: torch.nn.Module, inputs: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return tuple(x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs)

    return hook


class DeepSpeed(DDP):
    """DDP's process group and collectives; DeepSpeed's engine for model, backward and step."""

    name = "deepspeed"

    def __init__(self) -> None:
        super().__init__()
        self.engine: Any = None
        self.config: Dict[str, Any] = {}

    def init(self, cfg: Any) -> DistInfo:
        refuse_step_options(
            cfg,
            "DeepSpeed's engine step reads gradient norms and overflow flags on the host, which a "
            "CUDA graph cannot capture",
            "DeepSpeed's engine synchronises the host every step (its throughput timer; under "
            "bf16/fp16 its optimizer's gradient-norm and overflow checks)",
        )
        if cfg.zero_stage == 3 and cfg.checkpoint_dir:
            raise ConfigError(
                "--zero-stage 3 partitions the parameters: checkpoints (--checkpoint-dir) need --zero-stage 0, 1 or 2"
            )
        if cfg.zero_stage > 0 and cfg.profile_steps > 0:
            raise ConfigError(
                "--profile-steps needs whole local gradients, which ZeRO partitions: profile with --zero-stage 0"
            )
        if cfg.profile_steps > 0 and not hasattr(deepspeed.DeepSpeedEngine, "no_sync"):  # DeepSpeed < 0.16
            raise ConfigError(
                "--profile-steps needs DeepSpeed's engine.no_sync() (DeepSpeed >= 0.16; this is %s)"
                % deepspeed.__version__
            )
        info = super().init(cfg)
        os.environ.setdefault("LOCAL_RANK", str(info.local_rank))  # a job of one has no torchrun env
        deepspeed.init_distributed(dist_backend=self.backend, verbose=False)
        return info

    def wrap(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any
    ) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
        if cfg.sync_bn:
            raise ConfigError("--sync-bn is implemented for --framework ddp only")
        if cfg.amp == "bf16":
            model = model.to(torch.bfloat16)  # in place: the optimizer keeps the same Parameter objects
        # DeepSpeed broadcasts every parameter as bytes (`p.data.view(torch.uint8)`), which fails on
        # channels-last conv weights ("self.stride(-1) must be 1 to view Half as Byte"), and ZeRO copies
        # parameters into contiguous flat buffers anyway. Contiguous weights (in place, same Parameter
        # objects); with channels-last input batches cuDNN still runs its channels-last kernels.
        model = model.to(memory_format=torch.contiguous_format)
        self.config = deepspeed_config(cfg, self.world_size)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.config, dist_init_required=False
        )
        if cfg.amp != "none":
            # DeepSpeed's fp16/bf16 modes cast the module but not its inputs, and inside the engine they
            # switch off the loop's torch.autocast on CUDA (DeepSpeed >= 0.16, runtime/torch_autocast.py):
            # without this, "Input type (torch.cuda.FloatTensor) and weight type (torch.cuda.HalfTensor)".
            self.engine.module.register_forward_pre_hook(
                cast_floating_inputs(torch.float16 if cfg.amp == "fp16" else torch.bfloat16)
            )
        self.optimizer = optimizer
        self.model = self.engine
        return self.engine, optimizer

    def compile(self, module: torch.nn.Module, mode: str) -> torch.nn.Module:
        """The engine compiles its module (DeepSpeed's `engine.compile`); the loop keeps calling the engine."""
        self.engine.compile(compile_kwargs={"mode": mode})
        self.compiled = "DeepSpeedEngine.compile(mode=%s)" % mode
        return self.engine

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def no_sync(self) -> ContextManager[Any]:
        """The engine's: gradients stay local in `backward` (ZeRO 0 only; `init` refuses profiling above)."""
        return self.engine.no_sync()

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def zero_stage(self) -> int:
        return int(self.config["zero_optimization"]["stage"])

    def parameter_digest(self, model: torch.nn.Module) -> str:
        """ZeRO-3 holds a shard of each parameter per rank: gathered whole for the digest."""
        if self.zero_stage < 3:
            return super().parameter_digest(model)
        params = list(model.parameters())
        with deepspeed.zero.GatheredParameters(params):
            return tensors_digest(params)

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {"model": self.engine.module.state_dict()}
        if self.zero_stage == 0:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.engine.module.load_state_dict(state["model"])
        if self.zero_stage == 0 and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        elif self.zero_stage > 0:
            self.optimizer.state.clear()  # momentum restarts (partitioned, so not in the checkpoint)
        refresh = getattr(self.engine.optimizer, "refresh_fp32_params", None)
        if refresh is not None:  # master weights are copies of the module's: copy the loaded ones in
            refresh()

    def versions(self) -> Dict[str, str]:
        return {"deepspeed": deepspeed.__version__}

    def settings(self) -> Dict[str, Any]:
        return {
            "backend": self.backend,
            "zero_stage": self.zero_stage,
            "config": self.config,
            "checkpoint": "model+optimizer" if self.zero_stage == 0 else "model only (ZeRO partitions optimizer state)",
        }

    def shutdown(self) -> None:
        self.engine = None
        super().shutdown()
