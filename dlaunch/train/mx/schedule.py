"""dlaunch/train/schedule.py as an MXNet LR scheduler. It is pickled to the servers with the optimizer, which
unpickle it while `import mxnet` is still running (the server loop runs inside that import), so this
module imports nothing from mxnet but `lr_scheduler` (already loaded by then)."""

from mxnet.lr_scheduler import LRScheduler

from dlaunch.train.schedule import LRSchedule


class ScheduleOnServer(LRScheduler):
    """The LR of step `(num_update - 1) // updates_per_step` (a server counts one update per push it
    applies: one per step synchronously, one per worker asynchronously)."""

    def __init__(self, schedule: LRSchedule, updates_per_step: int):
        super().__init__(base_lr=schedule(0))
        self.schedule, self.updates_per_step = schedule, updates_per_step

    def __call__(self, num_update: int) -> float:
        return self.schedule(max(0, num_update - 1) // self.updates_per_step)
