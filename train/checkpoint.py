"""Checkpoints (atomic, `<checkpoint-dir>/last.pt`) and the stop signals.

A checkpoint holds the position (`epoch`, `step_in_epoch`, `global_step`; the sampler resumes with
`set_epoch(epoch, skip_batches=step_in_epoch)`), the framework's model/optimizer state, the torch RNG
states, and the partial accumulators of an interrupted epoch, so the resumed run writes that epoch's
record once and in full. Rank 0 writes it (temporary file, fsync, os.replace, fsync of the
directory); every rank reads it (the directory must be shared).

Signals: SIGUSR1 (Slurm's warning before the time limit, `sbatch --signal=USR1@120`) -> checkpoint,
end status `interrupted`, exit 75; SIGTERM (scancel) or SIGINT (Ctrl-C in a local run) -> checkpoint,
end status `cancelled`, exit 143. The handler only records the signal; the loop asks all ranks every
few steps (`loop.STOP_CHECK_STEPS`) and stops them at the same step.
"""
import inspect
import os
import signal
from typing import Any, Dict, List, Optional

import torch

CHECKPOINT_NAME = "last.pt"


class StopSignals:
    """Remembers SIGUSR1 / SIGTERM / SIGINT once installed."""

    def __init__(self) -> None:
        self.received: Dict[int, bool] = {signal.SIGUSR1: False, signal.SIGTERM: False, signal.SIGINT: False}

    def install(self) -> "StopSignals":
        for signum in self.received:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received[signum] = True

    def flags(self) -> List[float]:
        """[SIGUSR1 seen, SIGTERM or SIGINT seen] as 0/1, for an all-rank reduction."""
        stop = self.received[signal.SIGTERM] or self.received[signal.SIGINT]
        return [float(self.received[signal.SIGUSR1]), float(stop)]


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
