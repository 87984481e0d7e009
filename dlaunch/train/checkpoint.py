"""Checkpoints (atomic, `<checkpoint-dir>/last.pt`); the stop signals that trigger them are in dlaunch/train/signals.py.

A checkpoint holds the position (`epoch`, `step_in_epoch`, `global_step`; the sampler resumes with
`set_epoch(epoch, skip_batches=step_in_epoch)`), the framework's model/optimizer state, the torch RNG
states, and the partial accumulators of an interrupted epoch, so the resumed run writes that epoch's
record once and in full. Rank 0 writes it (temporary file, fsync, os.replace, fsync of the
directory); every rank reads it (the directory must be shared).
"""

import inspect
import os
from typing import Any, Dict, Optional

import torch

CHECKPOINT_NAME = "last.pt"


def checkpoint_path(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, CHECKPOINT_NAME)


def save_checkpoint(path: str, state: Dict[str, Any]) -> None:
    """Write `state` so that `path` is always either the old or the complete new checkpoint."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: str) -> Optional[Dict[str, Any]]:
    """The checkpoint at `path` on the CPU, or None when there is none (a fresh start)."""
    if not os.path.exists(path):
        return None
    kwargs: Dict[str, Any] = {"map_location": "cpu"}
    if "weights_only" in inspect.signature(torch.load).parameters:
        kwargs["weights_only"] = False  # our own file; may hold framework objects beyond tensors
    return torch.load(path, **kwargs)


def rng_state() -> Dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
