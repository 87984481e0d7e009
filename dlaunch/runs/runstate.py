"""A run at one moment: the scheduler's word on its job and the progress its metrics file shows.

`observe(runs)` asks each scheduler once for all of its jobs (Slurm: one `squeue`), and reads each
metrics file; `dlaunch status`, `runs` and `watch` show what it returns.
"""
import dataclasses
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from dlaunch.boundary import alive_since, escape
from dlaunch.runs.failures import reconcile
from dlaunch.runs.network import run_network_problems
from dlaunch.runs.rundir import RunDir, display_path
from dlaunch.schedulers import Job, JobState, registration, scheduler_for
from dlaunch.train.metrics_schema import MAX_METRICS_BYTES, FileRefused, Metrics, MetricsError, open_regular, read_metrics

# A run succeeded when its job did (and its metrics end `ok`); a job the scheduler forgot is judged by its metrics.
SUCCEEDED = (JobState.COMPLETED, JobState.GONE)
LOCAL_OK = "finished (exit 0)"
LOCAL_RUNNING = "running here (dlaunch pid %d)"
# A run directory with neither job id nor state this long after its plan was written was never submitted.
SUBMIT_GRACE_S = 60.0


@dataclass(frozen=True)
class Progress:
    """What the metrics file says: `status` is 'no metrics yet', 'unreadable: ...', 'running' or the end status."""

    status: str
    epochs_done: int = 0
    epochs_total: Optional[int] = None
    steps_done: int = 0
    steps_total: Optional[int] = None
    images_per_s: Optional[float] = None
    loss: Optional[float] = None
    seconds_per_step: Optional[float] = None  # measured: the epochs' training time over their steps
    last_record_time: Optional[float] = None
    network: Optional[List[Dict[str, Any]]] = None  # what the collective libraries selected (metrics version 3)

    @property
    def fraction(self) -> Optional[float]:
        return min(1.0, self.steps_done / self.steps_total) if self.steps_total else None

    def eta_s(self, now: Optional[float] = None) -> Optional[float]:
        """Seconds left at the measured rate; counted down from the last record when `now` is given."""
        if self.status != "running" or not self.steps_total or self.seconds_per_step is None:
            return None
        left = max(0, self.steps_total - self.steps_done) * self.seconds_per_step
        if now is not None and self.last_record_time is not None:
            left -= max(0.0, now - self.last_record_time)
        return max(0.0, left)


def _read(path: Path) -> Metrics:
    try:
        return read_metrics(str(path), follow_links=False)
    except MetricsError:
        if not _being_written(path):
            raise
        time.sleep(0.2)  # the trainer writes a record with one write + flush; read it once it is whole
        return read_metrics(str(path), follow_links=False)


def _being_written(path: Path) -> bool:
    """The metrics file's last byte ends no line: a record is being written (a FIFO or link is not)."""
    try:
        with open_regular(str(path), MAX_METRICS_BYTES, follow_links=False) as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except (FileRefused, OSError):
        return False


def read_progress(path: Path) -> Progress:
    """The progress in a metrics file (a missing or still empty file is 'no metrics yet')."""
    if not os.path.lexists(path) or (path.is_file() and path.stat().st_size == 0):  # opened, header not yet written
        return Progress("no metrics yet")
    try:
        metrics = _read(path)
    except (MetricsError, OSError) as e:
        return Progress("unreadable: %s" % escape(str(e)))
    settings = metrics.header.get("loader_settings") or {}
    config = metrics.header.get("config") or {}
    steps_total = settings.get("total_steps")
    steps_per_epoch = settings.get("steps_per_epoch")
    epochs_total = -(-steps_total // steps_per_epoch) if steps_total and steps_per_epoch else config.get("epochs")
    epochs = metrics.epochs
    steps = sum(e["steps"] for e in epochs)
    train_time = sum(e["epoch_time_s"] for e in epochs)
    last = epochs[-1] if epochs else None
    return Progress(
        status=metrics.status,
        epochs_done=len(epochs),
        epochs_total=epochs_total,
        steps_done=steps,
        steps_total=steps_total,
        images_per_s=float(last["images_per_s"]) if last else None,
        loss=float(last["loss"]) if last else None,
        seconds_per_step=train_time / steps if steps and train_time > 0 else None,
        last_record_time=float(metrics.records[-1]["time"]) if metrics.records else None,
        network=metrics.network,
    )


@dataclass(frozen=True)
class Snapshot:
    """One run at one moment."""

    run: RunDir
    name: str  # the run directory as shown
    site: str
    job: str
    state: str  # the scheduler's word for the job's state, or a foreground run's ('finished (exit 0)', 'running here ...')
    queue: str  # for a pending job: reason, place in the queue, expected start
    progress: Progress
    ended: bool  # nothing more will happen to this run (until it is resumed)
    meaning: Optional[JobState] = None  # what the scheduler's state means (None: foreground or not submitted)
    scheduler: str = ""  # its kind (dlaunch/schedulers/)
    network: Tuple[str, ...] = ()  # how the run is off its profile's [network] (dlaunch/runs/network.py)

    @property
    def ok(self) -> bool:
        """Ended with a successful job and an `ok` end record."""
        return self.ended and self.progress.status == "ok" and (self.state == LOCAL_OK or self.meaning in SUCCEEDED)

    @property
    def failed(self) -> bool:
        """Ended otherwise than ok, or already known to fail (job state or end record) while it ends."""
        status = self.progress.status
        stopped = status not in ("ok", "running", "no metrics yet") and not status.startswith("unreadable")
        return (self.ended and not self.ok) or stopped or (self.meaning is not None and self.meaning.failed)


def _unsubmitted_state(run: RunDir, now: float) -> Tuple[str, bool]:
    """(state, ended) of a run without a job id: being submitted, refused, or never submitted."""
    state = run.state
    if state:
        return state, state.startswith("submission failed")
    return "not submitted", now - (run.path / "plan.json").stat().st_mtime > SUBMIT_GRACE_S


def _foreground_state(run: RunDir, now: float) -> Tuple[str, bool]:
    """(state, ended) of a run in the foreground on this machine: `dlaunch run` records it running, then
    finished. The process the state names runs it only if it started before the state was written
    (boundary.alive_since)."""
    state = run.state or ""
    if state.startswith("finished"):
        return state, True
    running = re.fullmatch(re.escape(LOCAL_RUNNING).replace("%d", "([0-9]{1,9})"), state)
    if running:
        pid = int(running.group(1))
        if alive_since(pid, (run.path / "state").lstat().st_mtime):
            return state, False
        return "dlaunch (pid %d) ended without recording the job's exit" % pid, True
    if state and not state.startswith("submission failed"):
        return "unknown state: %s" % state, True
    return _unsubmitted_state(run, now)


def observe(runs: Iterable[RunDir], now: Optional[float] = None) -> List[Snapshot]:
    """A snapshot of every run (each scheduler asked once for all of its jobs)."""
    runs = list(runs)
    now = time.time() if now is None else now
    plans = {run.path: run.plan()["plan"] for run in runs}
    jobs: Dict[str, Job] = {}
    for kind in {plan["scheduler"] for plan in plans.values() if not registration(plan["scheduler"]).foreground}:
        ids = [run.job_id for run in runs if plans[run.path]["scheduler"] == kind and run.job_id]
        jobs.update(scheduler_for(kind).jobs(ids) if ids else {})
    snapshots = []
    for run in runs:
        plan = plans[run.path]
        progress = read_progress(run.metrics_path)
        job_id = run.job_id
        queue_text, meaning = "", None
        if registration(plan["scheduler"]).foreground:
            state, ended = _foreground_state(run, now)
        elif job_id:
            job = jobs[job_id]
            state, queue_text, meaning = job.state, job.queue, job.kind
            # Still active, or the scheduler did not answer: not ended. It forgot the job: it ended long ago.
            ended = not meaning.active and meaning is not JobState.UNKNOWN
        else:
            state, ended = _unsubmitted_state(run, now)
        started = bool(job_id) or (run.state or "").startswith(("running here", "finished"))
        status = reconcile(meaning, progress.status, ended) if started else progress.status
        if status != progress.status:
            progress = dataclasses.replace(progress, status=status)
        snapshots.append(Snapshot(run, display_path(run.path), plan["site"], job_id or "-", state, queue_text,
                                  progress, ended, meaning, plan["scheduler"], tuple(run_network_problems(run, progress.network))))
    return snapshots
