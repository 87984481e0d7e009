"""`progress.json`: where a run is within its epoch, for `dlaunch status`/`watch` and the live view of a local run
(dlaunch/runs/runstate.py), which read only epoch records from the metrics file otherwise.

Rank 0 writes it beside the metrics file after a step when `interval_s` have passed since the last write
($DLAUNCH_PROGRESS_INTERVAL_S, default DEFAULT_INTERVAL_S; 0: after every step): a monotonic-clock check per
step, one small JSON file renamed over the old one per write (readers see the old file or the new one; no
fsync: the file is a live hint, which a run that has ended does not read). A write takes rank 0 about 2 ms
(a loaded 2-core VM, ext4), within the epoch's measured time: under 0.1 % of it at the default interval.
Its fields (FIELDS):

- time: wall clock (time.time(), as the metrics records' `time`) of the write;
- epoch, epochs; step_in_epoch, steps_per_epoch; global_step, total_steps: where the run is (steps done);
- epoch_time_s: the time of this epoch's steps so far, as the epoch record's `epoch_time_s` counts it;
- measured_steps, images_per_s: this epoch's measured steps so far (those after the warm-up and profiled
  steps: the ones the epoch record's `images_per_s` counts) and the whole job's images per second over
  them, steps only (the epoch's overhead outside the steps is not known before its end); null before one.
  The clock is read after the loss, so on a GPU it counts finished steps; with --host-syncs minimal it counts
  the steps rank 0 has launched, which the device may not have finished yet;
- loss, loss_steps: rank 0's mean loss over `loss_steps` of this epoch's steps in this process. Reading it
  costs one device sync per write; with --host-syncs minimal nothing more is synced: the losses as read at
  the last stop check (every STOP_CHECK_STEPS steps, dlaunch/train/loop.py), so `loss_steps` may lag the
  step; null before one (and for a loss that is not finite).
"""

import json
import math
import os
import tempfile
import time
from typing import Any, Dict, Mapping, Optional

from dlaunch.train.metrics_schema import FileRefused, is_number, open_regular

PROGRESS_FILE = "progress.json"
INTERVAL_ENV = "DLAUNCH_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 2.0
MAX_PROGRESS_BYTES = 4096
COUNTS = (
    "epoch",
    "epochs",
    "step_in_epoch",
    "steps_per_epoch",
    "global_step",
    "total_steps",
    "measured_steps",
    "loss_steps",
)
FIELDS = COUNTS + ("time", "epoch_time_s", "images_per_s", "loss")


def progress_path(metrics_path: str) -> str:
    """`progress.json` in the metrics file's folder (the run directory)."""
    return os.path.join(os.path.dirname(os.path.abspath(metrics_path)), PROGRESS_FILE)


def interval_s(environ: Mapping[str, str]) -> float:
    """$DLAUNCH_PROGRESS_INTERVAL_S as seconds (a number >= 0), else DEFAULT_INTERVAL_S."""
    try:
        value = float(environ.get(INTERVAL_ENV, ""))
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if math.isfinite(value) and value >= 0 else DEFAULT_INTERVAL_S


class ProgressFile:
    """Rank 0's progress file: `due()` after each step, `write(...)` when it is."""

    def __init__(self, path: str, interval: float):
        self.path = path
        self.interval = interval
        self.last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.interval

    def write(self, **fields: Any) -> None:
        """Rename a file with `fields` and the wall clock over the old one."""
        self.last = time.monotonic()
        record = dict(fields, time=time.time())
        folder = os.path.dirname(self.path)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + PROGRESS_FILE + ".")
        os.fchmod(fd, 0o644)  # readable as the metrics file is (mkstemp makes it 0600): a colleague's status reads it
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def finite_or_none(value: float) -> Optional[float]:
    return value if math.isfinite(value) else None


def read_progress_file(path: str) -> Optional[Dict[str, Any]]:
    """The progress file's fields, or None when there is none or it is not one the trainer writes (a run
    directory may come from anywhere: a link, a FIFO, a large or malformed file is no progress)."""
    try:
        with open_regular(path, MAX_PROGRESS_BYTES, follow_links=False) as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, FileRefused, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    counts_ok = all(isinstance(data.get(k), int) and not isinstance(data.get(k), bool) and data[k] >= 0 for k in COUNTS)
    numbers_ok = (
        is_number(data.get("time"))
        and is_number(data.get("epoch_time_s"))
        and all(
            data.get(k) is None or (is_number(data[k]) and math.isfinite(data[k])) for k in ("images_per_s", "loss")
        )
    )
    if not (counts_ok and numbers_ok and math.isfinite(data["time"]) and math.isfinite(data["epoch_time_s"])):
        return None
    return {k: data[k] for k in FIELDS}
