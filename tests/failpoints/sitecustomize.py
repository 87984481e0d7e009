"""Test-only failpoint (a fake of nothing: it only pauses the real trainer). Python imports this module at
start-up in every process whose PYTHONPATH names this folder (tests/holds.py sets it, and Slurm and
torchrun pass it on to the job's processes).

With DLAUNCH_TEST_HOLD=FILE, each trainer process pauses after its first finished epoch (the epoch record
written, the checkpoint saved) until FILE (every rank) or FILE.rank<N> (rank N) exists, or the process has
received a stop signal. With DLAUNCH_TEST_HOLD_AT_STEP=N too, each pauses alike before its step N + 1 (N steps
done, run-wide), first creating FILE.held-at-step-N.rank<R>. With DLAUNCH_TEST_HOLD_AFTER_END=1 instead, each pauses
only once it has written its end record (the run's last moment in the trainer), first creating
FILE.held-after-end.rank<R>. A test thereby sees a live run mid-way on any machine, however fast the job, and then
releases it by creating the file."""
import importlib.abc
import importlib.machinery
import os
import sys
import time

HOLD_FILE = os.environ.get("DLAUNCH_TEST_HOLD")
HOLD_AFTER_EPOCH = 0
HOLD_AT_STEP = int(os.environ.get("DLAUNCH_TEST_HOLD_AT_STEP", "-1"))
HOLD_AFTER_END = os.environ.get("DLAUNCH_TEST_HOLD_AFTER_END") == "1"
GIVE_UP_S = 900.0  # a test that died without releasing its job does not leave it waiting for ever


def hold() -> None:
    from dlaunch.train.signals import StopSignals

    files = (HOLD_FILE, "%s.rank%s" % (HOLD_FILE, os.environ.get("RANK", "0")))
    deadline = time.monotonic() + GIVE_UP_S
    while not any(map(os.path.exists, files)) and not any(StopSignals().flags()) and time.monotonic() < deadline:
        time.sleep(0.05)


def patch(module) -> None:
    train_epoch, step, finish = module.Trainer.train_epoch, module.Trainer.step, module.Trainer.finish

    def held_train_epoch(self, epoch, skip, progress):
        status = train_epoch(self, epoch, skip, progress)
        if status is None and epoch == HOLD_AFTER_EPOCH and not HOLD_AFTER_END:
            hold()
        return status

    def held_finish(self, status):
        finish(self, status)
        if HOLD_AFTER_END:
            open("%s.held-after-end.rank%s" % (HOLD_FILE, os.environ.get("RANK", "0")), "w").close()
            hold()

    def held_step(self, *args, **kwargs):
        if self.global_step == HOLD_AT_STEP:
            open("%s.held-at-step-%d.rank%s" % (HOLD_FILE, HOLD_AT_STEP, os.environ.get("RANK", "0")), "w").close()
            hold()
        return step(self, *args, **kwargs)

    module.Trainer.train_epoch = held_train_epoch
    module.Trainer.step = held_step
    module.Trainer.finish = held_finish


class HoldFinder(importlib.abc.MetaPathFinder):
    """Finds `dlaunch.train.loop` as Python would, and patches it once it has been executed."""

    def find_spec(self, name, path, target=None):
        if name != "dlaunch.train.loop":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if HOLD_FILE:
    sys.meta_path.insert(0, HoldFinder())
