"""Test-only failpoint (a fake of nothing: it only pauses the real trainer). Python imports this module at
start-up in every process whose PYTHONPATH names this folder (tests/holds.py sets it, and Slurm and
torchrun pass it on to the job's processes).

With DLAUNCH_TEST_HOLD=FILE, each trainer process pauses after its first finished epoch (the epoch record
written, the checkpoint saved), first creating FILE.held-after-epoch-0.rank<R>, until FILE (every rank) or
FILE.rank<N> (rank N) exists, or the process has received a stop signal. With DLAUNCH_TEST_HOLD_AT_STEP=N too, each
pauses alike before its step N + 1 (N steps done, run-wide), first creating FILE.held-at-step-N.rank<R>. With
DLAUNCH_TEST_HOLD_AFTER_END=1 instead, each pauses only once it has written its end record (the run's last moment in
the trainer), first creating FILE.held-after-end.rank<R>. A test thereby sees a live run mid-way on any machine,
however fast the job, and then releases it by creating the file. These holds pause the process's hang watchdog
(dlaunch/train/watchdog.py: no deadline while held, its clock restarting at the release; the phase it shows stays the
trainer's): a held run is not a hung one.

With DLAUNCH_TEST_HOLD_IN=validation or checkpoint instead, each process holds inside that section of its first epoch
(validation: before validating; checkpoint: rank 0 before writing it, the others wait for it in the barrier), first
creating FILE.held-in-<section>.rank<R>, and the watchdog is not paused: a section that lasts, as a slow one does.

With DLAUNCH_TEST_BROKEN_GEMM_HOST=HOST, pre-flight's GEMM (dlaunch/train/nodecheck.py `gemm`) on the host of that name
returns a product 1.5 times too large, as a device that computes wrong numbers does (a fake of such a GPU: the real
check runs, on the CPU here).

With DLAUNCH_TEST_GPU_HANG_AT_STEP=N, each trainer process on a GPU enqueues, before its step N + 1, a kernel that spins
for DLAUNCH_TEST_GPU_HANG_S seconds (default 240) on its compute stream (`torch.cuda._sleep`): the GPU stops finishing
work as a hung GPU or driver does, while the process and its threads live on. Everything the step enqueues after it,
DDP's NCCL all-reduce included, waits behind it, so the flight recorder holds a collective never completed. On a CPU
device (a rehearsal of the GPU check) the step sleeps in Python instead. The watchdog is not paused: this is a hang."""
import importlib.abc
import importlib.machinery
import os
import sys
import time

HOLD_FILE = os.environ.get("DLAUNCH_TEST_HOLD")
HOLD_AFTER_EPOCH = 0
HOLD_AT_STEP = int(os.environ.get("DLAUNCH_TEST_HOLD_AT_STEP", "-1"))
HOLD_IN = os.environ.get("DLAUNCH_TEST_HOLD_IN")
HOLD_AFTER_END = os.environ.get("DLAUNCH_TEST_HOLD_AFTER_END") == "1"
BROKEN_GEMM_HOST = os.environ.get("DLAUNCH_TEST_BROKEN_GEMM_HOST")
GPU_HANG_AT_STEP = int(os.environ.get("DLAUNCH_TEST_GPU_HANG_AT_STEP", "-1"))
GPU_HANG_S = float(os.environ.get("DLAUNCH_TEST_GPU_HANG_S", "240"))
GIVE_UP_S = 900.0  # a test that died without releasing its job does not leave it waiting for ever


def hold(where: str, pause_watchdog: bool = True) -> None:
    """Create FILE.<where>.rank<R>, then wait for a release."""
    import contextlib

    from dlaunch.train.signals import StopSignals

    try:
        from dlaunch.train.watchdog import running
    except ImportError:  # an image's trainer from before the watchdog
        running = lambda: None  # noqa: E731
    rank = os.environ.get("RANK", "0")
    open("%s.%s.rank%s" % (HOLD_FILE, where, rank), "w").close()
    files = (HOLD_FILE, "%s.rank%s" % (HOLD_FILE, rank))
    deadline = time.monotonic() + GIVE_UP_S
    watchdog = running()
    with watchdog.paused() if watchdog and pause_watchdog else contextlib.nullcontext():
        while not any(map(os.path.exists, files)) and not any(StopSignals().flags()) and time.monotonic() < deadline:
            time.sleep(0.05)


def patch(module) -> None:
    trainer = module.Trainer
    train_epoch, step, finish = trainer.train_epoch, trainer.step, trainer.finish
    validate, save_checkpoint = trainer.validate, module.save_checkpoint

    def held_train_epoch(self, epoch, skip, progress):
        status = train_epoch(self, epoch, skip, progress)
        if HOLD_FILE and status is None and epoch == HOLD_AFTER_EPOCH and not (HOLD_IN or HOLD_AFTER_END):
            hold("held-after-epoch-%d" % epoch)
        return status

    def held_finish(self, status):
        finish(self, status)
        if HOLD_AFTER_END:
            hold("held-after-end")

    def held_step(self, *args, **kwargs):
        if self.global_step == GPU_HANG_AT_STEP:
            hang_the_device(self.device)
        if self.global_step == HOLD_AT_STEP:
            hold("held-at-step-%d" % HOLD_AT_STEP)
        return step(self, *args, **kwargs)

    def held_validate(self):
        if HOLD_IN == "validation" and self.epochs_completed == HOLD_AFTER_EPOCH:
            hold("held-in-validation", pause_watchdog=False)
        return validate(self)

    def held_save_checkpoint(path, state):
        if HOLD_IN == "checkpoint" and state["epoch"] == HOLD_AFTER_EPOCH + 1:
            hold("held-in-checkpoint", pause_watchdog=False)
        return save_checkpoint(path, state)

    trainer.train_epoch, trainer.step, trainer.finish = held_train_epoch, held_step, held_finish
    trainer.validate, module.save_checkpoint = held_validate, held_save_checkpoint


def hang_the_device(device) -> None:
    """A kernel that keeps the device's compute stream busy for GPU_HANG_S (a rehearsal on a CPU: a sleep)."""
    open("%s.gpu-hung.rank%s" % (HOLD_FILE or "/tmp/dlaunch-test", os.environ.get("RANK", "0")), "w").close()
    if device.type != "cuda":
        time.sleep(GPU_HANG_S)
        return
    import torch

    torch.cuda._sleep(int(GPU_HANG_S * 2.0e9))  # cycles: at most 2 GHz (an H100's and H200's highest SM clock 1.98)


def break_gemm(module) -> None:
    import socket

    if socket.gethostname() != BROKEN_GEMM_HOST:
        return
    gemm = module.gemm
    module.gemm = lambda a, b: gemm(a, b) * 1.5


class PatchFinder(importlib.abc.MetaPathFinder):
    """Finds module `name` as Python would, and patches it once it has been executed."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            self.patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if HOLD_FILE or GPU_HANG_AT_STEP >= 0:
    sys.meta_path.insert(0, PatchFinder("dlaunch.train.loop", patch))
if BROKEN_GEMM_HOST:
    sys.meta_path.insert(0, PatchFinder("dlaunch.train.nodecheck", break_gemm))
