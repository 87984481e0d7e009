"""Which GPU a worker takes, checked before NCCL starts (torch-free, Python 3.9).

A node's workers pick their GPU by local rank among the GPUs they can see. Where one launcher process
(torchrun) starts all of a node's workers, they share its view: a site that shows each scheduler task
only the GPU bound to it (JSC's psslurm, Slurm's --gpu-bind) leaves four workers one GPU, and all
four would take it (NCCL then fails at init, or four ranks share one GPU). One task per worker sees
either all of the node's GPUs (it takes its local rank's) or exactly its own (it takes that one).
"""

from typing import Mapping

from dlaunch.train.config import ConfigError

# The variables that narrow the GPUs a process sees, by vendor runtime (CUDA; ROCm's, which Slurm sets on AMD).
VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def visibility(environ: Mapping[str, str]) -> str:
    """How this process's view is narrowed, for messages: `CUDA_VISIBLE_DEVICES=0` or `no *_VISIBLE_DEVICES set`."""
    shown = ["%s=%s" % (name, environ[name]) for name in VISIBLE_VARIABLES if name in environ]
    return ", ".join(shown) or "no *_VISIBLE_DEVICES set"


def device_index(
    local_rank: int, local_workers: int, visible: int, one_launcher: bool, environ: Mapping[str, str]
) -> int:
    """The index of this worker's GPU among the `visible` ones; ConfigError (exit 2) when the node's
    workers outnumber the GPUs they can see. `one_launcher`: the node's workers share one launcher's view."""
    if visible < 1:
        raise ConfigError("no GPU is visible to this worker (%s)" % visibility(environ))
    if one_launcher and local_workers > visible:
        raise ConfigError(
            "this node's launcher starts %d workers, but they see %d GPU(s) (%s): the site probably binds one "
            "GPU per task; set binds_gpu_per_task = true in the profile's [launch] (the job then makes the "
            'node\'s GPUs visible) or start one task per GPU ([launch.<framework>] mode = "task-per-gpu")'
            % (local_workers, visible, visibility(environ))
        )
    if one_launcher or visible >= local_workers:
        return local_rank
    if visible == 1:
        return 0  # the scheduler bound this task's own GPU
    raise ConfigError(
        "this node runs %d tasks that see %d GPUs each (%s): bind one GPU per task "
        "(--gpus-per-task=1) or none" % (local_workers, visible, visibility(environ))
    )


def started_by_torchrun(environ: Mapping[str, str]) -> bool:
    """torchrun (torch.distributed.run) sets TORCHELASTIC_RUN_ID for the workers it starts."""
    return "TORCHELASTIC_RUN_ID" in environ
