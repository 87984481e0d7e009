"""The torch trainer's metrics: torch's library versions for the header; the writer, provenance and
summary table are engine-free (dlaunch/train/metrics_core.py, shared with the TensorFlow and MXNet trainers)."""

import platform
from typing import Dict, Sequence

import torch
import torchvision


def library_versions(device_type: str, collectives: Sequence[str]) -> Dict[str, str]:
    """The versions of what the run used: python, torch, torchvision; on a GPU (`device_type` "cuda") CUDA or ROCm's
    HIP and cuDNN where enabled; NCCL (RCCL) where its `collectives` include it. A library the run did not use is
    left out, never recorded as torch's build (a CPU run of a CUDA build of torch uses neither CUDA nor NCCL)."""
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }
    if device_type != "cuda":
        return versions
    toolkit = {"cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}
    versions.update((name, str(version)) for name, version in toolkit.items() if version)
    if torch.backends.cudnn.enabled and torch.backends.cudnn.is_available():
        versions["cudnn"] = str(torch.backends.cudnn.version())
    if "nccl" in collectives and hasattr(torch.cuda, "nccl"):
        try:
            version = torch.cuda.nccl.version()
            versions["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError):
            pass
    return versions
