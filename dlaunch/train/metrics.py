"""The torch trainer's metrics: torch's library versions for the header; the writer, provenance and
summary table are engine-free (dlaunch/train/metrics_core.py, shared with the TensorFlow and MXNet trainers)."""

import platform
from typing import Dict, Optional

import torch
import torchvision


def library_versions() -> Dict[str, Optional[str]]:
    """python, torch, torchvision, CUDA, NCCL, cuDNN (None where absent)."""
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError):
            nccl = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "cudnn": str(cudnn) if cudnn else None,
    }
