"""fake-tasks, a framework that exists only in tests (tests/test_backend_battery.py adds its `ROW` to
`dlaunch.train.framework_table.FRAMEWORKS`): one scheduler task per process, each of which records the job's
neutral variables as it sees them (`task-<id>.json` in the run directory, with its pid), then does what
$FAKE_TASKS_MODE says: end (`ok`), wait for ever (`forever`), or, the last task, fail at once (exit 3) while the
others, all started, wait for ever (`fail-last`). No trainer, no torch: a scheduler's battery runs in seconds."""

import json
import os
import sys
import time

from dlaunch.train import jobenv
from dlaunch.train.framework_table import FrameworkInfo

ROW = FrameworkInfo(
    "fake-tasks",
    "torch",
    "fake_tasks:none",
    "task-per-worker",
    "fake-tasks",
    "json",
    "nothing (tests/fake_tasks.py)",
    "tasks that record their variables",
    entry="fake_tasks",
)
MODE = "FAKE_TASKS_MODE"
SEEN = (
    jobenv.JOB_ID,
    jobenv.NNODES,
    jobenv.NODELIST,
    jobenv.NTASKS,
    jobenv.TASK_ID,
    jobenv.LOCAL_TASK_ID,
    jobenv.NODE_ID,
)


def main() -> int:
    task, ntasks = int(os.environ[jobenv.TASK_ID]), int(os.environ[jobenv.NTASKS])
    record = os.path.join(os.environ["DLAUNCH_RUN_DIR"], "task-%d.json" % task)
    with open(record + ".tmp", "w") as f:
        json.dump(dict({name: os.environ.get(name) for name in SEEN}, pid=os.getpid()), f)
    os.replace(record + ".tmp", record)
    mode = os.environ.get(MODE, "ok")
    if mode == "ok":
        return 0
    if mode == "fail-last" and task == ntasks - 1:
        others = [os.path.join(os.environ["DLAUNCH_RUN_DIR"], "task-%d.json" % t) for t in range(task)]
        while not all(os.path.exists(other) for other in others):  # they run, and will wait for ever
            time.sleep(0.05)
        return 3
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
