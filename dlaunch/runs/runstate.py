"""A run at one moment: the scheduler's word on its job and the progress its metrics file shows.

`observe(runs)` asks each scheduler once for all of its jobs (Slurm: one `squeue`), and reads each
metrics file, and of a run that runs its trainer's progress file (dlaunch/train/progress.py) where that is
newer than the file's last record: where the run is within its epoch; `dlaunch status`, `runs` and `watch`
show what it returns. A run that has ended is read
once: its snapshot is kept in the status cache (dlaunch/runs/statuscache.py) and taken from there while
its files are unchanged, without asking its scheduler.
"""

import dataclasses
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from dlaunch.boundary import display_path, escape
from dlaunch.errors import DlaunchError, DlaunchWarning
from dlaunch.jobs.network import network_problems
from dlaunch.runs import hangs, nodechecks, statuscache
from dlaunch.runs.failures import UNFINISHED, launcher_stop, reconcile, stopped_by
from dlaunch.runs.rundir import SNAPSHOT_FILES, RunDir
from dlaunch.schedulers import CANCEL_REQUESTED, JobState, JobStatus, scheduler_for
from dlaunch.train.metrics_schema import (
    MAX_METRICS_BYTES,
    FileRefused,
    Metrics,
    MetricsError,
    open_regular,
    read_metrics,
)
from dlaunch.train.progress import PROGRESS_FILE, read_progress_file
from dlaunch.train.signals import STOP_STATUSES

if TYPE_CHECKING:
    from dlaunch.analysis.scaling import Run

# The job states of a job that succeeded (a job the scheduler forgot is judged by its metrics).
SUCCEEDED = (JobState.COMPLETED, JobState.GONE)
# A run directory with neither job id nor state this long after its plan was written was never submitted.
SUBMIT_GRACE_S = 60.0


# The label of a live images/s within an epoch (Progress.epoch_so_far_images_per_s).
EPOCH_SO_FAR = "this epoch so far, steps only"


@dataclass(frozen=True)
class Progress:
    """What the metrics file says (and, while the run runs, its progress file): `status` is 'no metrics yet',
    'unreadable: ...', 'running' or the end status."""

    status: str
    epochs_done: int = 0
    epochs_total: Optional[int] = None
    steps_done: int = 0
    steps_total: Optional[int] = None
    # The run's throughput X (dlaunch/analysis/scaling.py: Run.throughput), once its metrics end; None while live.
    images_per_s: Optional[float] = None
    # The last epoch's part of X (scaling.EpochPoint.throughput: its overhead outside the steps included).
    last_epoch_images_per_s: Optional[float] = None
    loss: Optional[float] = None  # the last epoch record's: the mean over its steps and ranks
    seconds_per_step: Optional[float] = None  # measured: the epochs' training time (the steps') over their steps
    last_record_time: Optional[float] = None
    # From the progress file, while the run is within an epoch: the job's images/s over this epoch's measured
    # steps so far (steps only: the epoch's overhead comes at its end), and rank 0's mean loss over its steps so far.
    epoch_so_far_images_per_s: Optional[float] = None
    epoch_so_far_loss: Optional[float] = None
    # The time of the metrics file's last header or resume record: when the run's latest attempt started writing.
    session_started: Optional[float] = None

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


def _within_epoch(progress: Progress, metrics: Metrics, train_time: float, path: Path) -> Progress:
    """`progress` (of a running run's metrics file) with where its progress file says the run is, where that file
    was written after the metrics file's last record and is of this run's epochs; else `progress` as it is."""
    found = read_progress_file(str(path.parent / PROGRESS_FILE))
    last_time = max((float(r["time"]) for r in metrics.records), default=None)
    if (
        found is None
        or last_time is None
        or found["time"] <= last_time
        or found["epoch"] != progress.epochs_done
        or found["total_steps"] != progress.steps_total
        or found["global_step"] < progress.steps_done
    ):
        return progress
    steps = progress.steps_done + found["step_in_epoch"]
    seconds = train_time + found["epoch_time_s"]
    return dataclasses.replace(
        progress,
        steps_done=found["global_step"],
        seconds_per_step=seconds / steps if steps and seconds > 0 else None,
        last_record_time=found["time"],
        epoch_so_far_images_per_s=found["images_per_s"],
        epoch_so_far_loss=found["loss"],
    )


def _read_progress(path: Path, ended: bool = False) -> "Tuple[Progress, Optional[Run]]":
    """The progress in a metrics file (with its progress file's unless the file ended or the run has `ended`: then
    its records are all there is), and the file as a Run (None without one)."""
    from dlaunch.analysis.scaling import run_from_metrics

    if not os.path.lexists(path) or (path.is_file() and path.stat().st_size == 0):  # opened, header not yet written
        return Progress("no metrics yet"), None
    try:
        metrics = _read(path)
    except (MetricsError, OSError) as e:
        return Progress("unreadable: %s" % escape(str(e))), None
    settings = metrics.header.get("loader_settings") or {}
    config = metrics.header.get("config") or {}
    steps_total = settings.get("total_steps")
    steps_per_epoch = settings.get("steps_per_epoch")
    epochs_total = -(-steps_total // steps_per_epoch) if steps_total and steps_per_epoch else config.get("epochs")
    epochs = metrics.epochs
    steps = sum(e["steps"] for e in epochs)
    train_time = sum(e["epoch_time_s"] for e in epochs)
    last = epochs[-1] if epochs else None
    run = run_from_metrics(metrics)
    progress = Progress(
        status=metrics.status,
        epochs_done=len(epochs),
        epochs_total=epochs_total,
        steps_done=steps,
        steps_total=steps_total,
        images_per_s=run.throughput if metrics.end is not None else None,
        last_epoch_images_per_s=run.epochs[-1].throughput if run.epochs else None,
        loss=float(last["loss"]) if last else None,
        seconds_per_step=train_time / steps if steps and train_time > 0 else None,
        last_record_time=float(metrics.records[-1]["time"]) if metrics.records else None,
        session_started=max(
            (float(r["time"]) for r in metrics.records if r["type"] in ("header", "resume")), default=None
        ),
    )
    return (
        _within_epoch(progress, metrics, train_time, path) if metrics.status == "running" and not ended else progress
    ), run


def read_progress(path: Path, ended: bool = False) -> Progress:
    """The progress in a metrics file, and its progress file's unless the run has `ended` (a missing or still
    empty metrics file is 'no metrics yet')."""
    return _read_progress(path, ended)[0]


def _judged(
    run_dir: RunDir, run: "Optional[Run]", live: bool, option: Optional[float] = None
) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(how the run is off its profile's network: dlaunch/jobs/network.py; its straggler and throttled-GPU
    flags as lines, 'straggler: ...': dlaunch/analysis/stragglers.py, on its last epoch while `live`, at the
    threshold of `option` (--straggler-threshold), else of its profile). The profile is read only for runs that
    recorded something to judge."""
    if run is None:
        return (), ()
    phases = any(e.phases is not None or e.nodes is not None for e in run.epochs)
    if not run.network and not phases:
        return (), ()
    from dlaunch.analysis.stragglers import live_flags, run_flags, threshold_of

    profile = run_dir.profile()
    network = network_problems(run.network, profile.network if profile else None)
    flags = (live_flags if live else run_flags)(run, threshold_of(option, profile)) if phases else []
    return tuple(network), tuple(flag.line for flag in flags)


@dataclass(frozen=True)
class Snapshot:
    """One run at one moment."""

    run: RunDir
    name: str  # the run directory as shown
    site: str
    job: str
    state: str  # the scheduler's word for the job's state ('RUNNING', 'finished (exit 0)', 'running here ...')
    queue: str  # for a pending job: reason, place in the queue, expected start
    progress: Progress
    ended: bool  # nothing more will happen to this run (until it is resumed)
    meaning: Optional[JobState] = None  # what the scheduler's state means (None: not submitted)
    scheduler: str = ""  # its kind (dlaunch/schedulers/)
    network: Tuple[str, ...] = ()  # how the run is off its profile's [network] (dlaunch/jobs/network.py)
    flags: Tuple[str, ...] = ()  # its stragglers and throttled GPUs, e.g. 'straggler: n2 rank 1 ...'
    gpus: Optional[int] = None  # the GPUs (processes on a CPU site) its plan asks for: nodes x processes per node
    reason: Optional[str] = None  # why it failed ('' when it did not); None: not looked up (service.why_failed)
    figures: Optional[str] = None  # its figures (service.run_figures); None: not looked up
    # Of an ended run that was stopped: who stopped it (failures.stopped_by); of one whose job did not succeed after
    # its trainer's `ok` end record: how the job ended. None otherwise.
    stopped_by: Optional[str] = None
    # While it runs: per node how long ago it last finished a step (dlaunch/runs/hangs.py: node_activity).
    nodes: Tuple[str, ...] = ()
    # Those of `nodes` that finished no step for hangs.STALL_S, or whose heartbeat stopped.
    stalled: Tuple[str, ...] = ()
    preflight: Tuple[str, ...] = ()  # the nodes its pre-flight left out and why (dlaunch/runs/nodechecks.py)
    measured: "Optional[Run]" = field(
        default=None, compare=False, repr=False
    )  # its metrics as read (not from the cache)

    @property
    def ok(self) -> bool:
        """Ended with an `ok` end record: its trainer ran every step and wrote every figure (what its job did after
        that, a signal to its launcher, is `stopped_by`)."""
        return self.ended and self.progress.status == "ok"

    @property
    def stopped(self) -> bool:
        """Ended `interrupted` or `cancelled`: stopped by someone or its time limit, not failed."""
        return self.ended and self.progress.status in STOP_STATUSES

    @property
    def failed(self) -> bool:
        """Ended otherwise than ok or stopped, or already known to fail (job state or end record) while it ends."""
        status = self.progress.status
        if status in STOP_STATUSES or (self.ended and status == "ok"):
            return False
        ended_badly = status not in ("ok", "running", "no metrics yet") and not status.startswith("unreadable")
        return self.ended or ended_badly or (self.meaning is not None and self.meaning.failed)


def _unsubmitted_state(run: RunDir, now: float) -> Tuple[str, bool]:
    """(state, ended) of a run without a job id: being submitted, refused, or never submitted."""
    state = run.state
    if state:
        return state, state.startswith("submission failed")
    return "not submitted", now - (run.path / "plan.json").stat().st_mtime > SUBMIT_GRACE_S


def _kept(run: RunDir, kept: Dict[str, Any]) -> Optional[Snapshot]:
    """The snapshot the status cache kept for an ended run (None when the entry is not one)."""
    try:
        return Snapshot(
            run,
            display_path(run.path),
            kept["site"],
            kept["job"],
            kept["state"],
            "",
            Progress(**kept["progress"]),
            True,
            JobState[kept["meaning"]] if kept["meaning"] else None,
            kept["scheduler"],
            tuple(kept["network"]),
            tuple(kept["flags"]),
            kept["gpus"],
            kept["reason"],
            kept["figures"],
            kept["stopped_by"],
            preflight=tuple(kept.get("preflight", ())),  # entries kept before pre-flight have none
        )
    except (KeyError, TypeError, ValueError):
        return None


def _to_keep(snapshot: Snapshot) -> Dict[str, Any]:
    return {
        "site": snapshot.site,
        "job": snapshot.job,
        "state": snapshot.state,
        "progress": dataclasses.asdict(snapshot.progress),
        "meaning": snapshot.meaning.name if snapshot.meaning else None,
        "scheduler": snapshot.scheduler,
        "network": list(snapshot.network),
        "flags": list(snapshot.flags),
        "gpus": snapshot.gpus,
        "reason": snapshot.reason,
        "figures": snapshot.figures,
        "stopped_by": snapshot.stopped_by,
        "preflight": list(snapshot.preflight),
    }


def _gpus(plan: Dict[str, Any]) -> Optional[int]:
    """Nodes x processes per node of a plan (None where plan.json holds no such counts: plan.json's `plan` is
    checked for its scheduler and site only, dlaunch/runs/runfiles.py)."""
    nodes, per_node = plan.get("nodes"), plan.get("nproc_per_node")
    if all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (nodes, per_node)):
        return nodes * per_node  # type: ignore[operator]  # both are positive ints (tested on this line's if)
    return None


def _fresh(runs: List[RunDir], now: float) -> List[Snapshot]:
    """Snapshots read from the run directories (each scheduler asked once for all of its jobs)."""
    plans = {run.path: run.plan()["plan"] for run in runs}
    job_ids = {run.path: run.job_id for run in runs}
    submitted: Dict[str, List[RunDir]] = {}
    for run in runs:
        if job_ids[run.path]:
            submitted.setdefault(plans[run.path]["scheduler"], []).append(run)
    jobs: Dict[Path, JobStatus] = {}
    for kind, those in submitted.items():
        jobs.update(
            zip((run.path for run in those), scheduler_for(kind).jobs([(job_ids[r.path], r.path) for r in those]))  # type: ignore[misc]  # submitted holds runs with a job id only
        )
    snapshots = []
    for run in runs:
        plan = plans[run.path]
        job_id = job_ids[run.path]
        queue_text, meaning = "", None
        job = jobs.get(run.path)
        if job is not None:
            state, queue_text, meaning = job.state, job.queue, job.kind
            # Still active, or the scheduler did not answer: not ended. It forgot the job: it ended long ago.
            ended = not meaning.active and meaning is not JobState.UNKNOWN
        else:
            state, ended = _unsubmitted_state(run, now)
        progress, measured = _read_progress(run.metrics_path, ended)
        started = job is not None
        # Where the trainer's word is missing, or its `ok` is beside a job that did not succeed: did a stop signal
        # reach the job's launcher? (its log says so; read only of such ended runs, which the cache then keeps)
        unsure = progress.status in UNFINISHED or (progress.status == "ok" and meaning not in SUCCEEDED)
        asked = started and ended and unsure
        launcher_signal = launcher_stop(scheduler_for(plan["scheduler"]).log_files(run.path)) if asked else None
        wrote_end = progress.status not in UNFINISHED
        status = reconcile(meaning, progress.status, ended, launcher_signal) if started else progress.status
        if _hung(run, progress, status):
            status = hangs.HUNG
        checked = nodechecks.preflight_record(run.path)
        if (
            checked is not None
            and not checked["enough"]
            and not checked.get("retry")
            and _ended_before_training(progress, status, checked)
        ):
            status = nodechecks.TOO_FEW
        if status != progress.status:
            progress = dataclasses.replace(progress, status=status)
        stopped = (
            _stopped_by(
                run, plan["scheduler"], status, measured if wrote_end else None, meaning, state, launcher_signal
            )
            if ended
            else None
        )
        network, flags = _judged(run, measured, live=progress.status == "running")
        running = status == "running" and not ended
        activity = hangs.node_activity(run.path, now, progress.session_started) if running else []
        snapshots.append(
            Snapshot(
                run,
                display_path(run.path),
                plan["site"],
                job_id or "-",
                state,
                queue_text,
                progress,
                ended,
                meaning,
                plan["scheduler"],
                network,
                flags,
                _gpus(plan),
                stopped_by=stopped,
                nodes=tuple(line.text for line in activity),
                preflight=tuple(nodechecks.left_out_lines(checked)) if checked else (),
                stalled=tuple(line.text for line in activity if line.stalled),
                measured=measured,
            )
        )
    return snapshots


def _hung(run: RunDir, progress: Progress, status: str) -> bool:
    """The run's hang record is of its latest attempt and no end record says otherwise: rank 0, the silent one or
    killed before it wrote `end`, leaves the metrics file running (or the run `died` once its job ended)."""
    if status not in UNFINISHED + ("died",):
        return False
    record = hangs.hang_record(run.path)
    return record is not None and (progress.last_record_time is None or progress.last_record_time <= record["time"])


def _ended_before_training(progress: Progress, status: str, record: Dict[str, Any]) -> bool:
    """The run's latest attempt ended at its pre-flight: no metrics record after the pre-flight's, and its job over."""
    if status not in UNFINISHED + ("died",):
        return False
    return progress.last_record_time is None or progress.last_record_time <= record.get("time", 0)


def _suspect_left_out_nodes(snapshot: Snapshot, now: float) -> None:
    """The nodes a run's pre-flight left out into its site's suspect nodes (dlaunch/runs/suspects.py)."""
    from dlaunch.runs import suspects

    record = nodechecks.preflight_record(snapshot.run.path)
    if record is None or not record["left_out"]:
        return
    try:
        suspects.add(snapshot.site, suspects.from_preflight(snapshot.run.path, record, now))
    except (OSError, DlaunchError) as e:
        warnings.warn("suspect nodes of %s not recorded: %s" % (snapshot.name, e), DlaunchWarning, stacklevel=2)


def _suspect_silent_nodes(snapshot: Snapshot, now: float) -> None:
    """The nodes of a hung run's silent processes into its site's suspect nodes (dlaunch/runs/suspects.py)."""
    from dlaunch.runs import suspects

    record = hangs.hang_record(snapshot.run.path)
    if record is None:
        return
    try:
        suspects.add(snapshot.site, suspects.from_hang(snapshot.run.path, record, now))
    except (OSError, DlaunchError) as e:
        warnings.warn("suspect nodes of %s not recorded: %s" % (snapshot.name, e), DlaunchWarning, stacklevel=2)


def _stopped_by(
    run: RunDir,
    kind: str,
    status: str,
    measured: "Optional[Run]",
    meaning: Optional[JobState],
    state: str,
    launcher_signal: Optional[str],
) -> Optional[str]:
    """Snapshot.stopped_by of an ended run (`measured`: its metrics, where its trainer wrote how it ended): who
    stopped it (failures.stopped_by; the scheduler's own account of a job it cancelled, `CANCELLED by 1000`; how to
    resume it where it left a checkpoint), or how its job ended after its trainer's `ok` end record; None for any
    other run."""
    scheduler = scheduler_for(kind)
    if status in STOP_STATUSES:
        line = stopped_by(
            status,
            measured.reason if measured is not None else None,
            meaning,
            run.state == CANCEL_REQUESTED,
            scheduler.this_machine,
            scheduler.label,
            launcher_signal,
            wrote_end=measured is not None,
        )
        account = scheduler.end_reason(run.job_id) if meaning is JobState.CANCELLED and run.job_id else None
        if account:
            line += "; %s: %s" % (scheduler.label, account)
        if any((run.path / "checkpoints").glob("*.pt")):
            line += "; checkpointed: dlaunch run --resume %s continues it" % display_path(run.path)
        return line
    if status == "ok" and meaning not in SUCCEEDED:
        got = " (its launcher got %s)" % launcher_signal if launcher_signal else ""
        return "its job ended %s after the trainer's end record%s: the run's figures are whole" % (state, got)
    return None


def _rejudged(snapshot: Snapshot, option: float) -> Snapshot:
    """The snapshot with its flags judged at `option` (--straggler-threshold; an ended run's metrics read again: the
    cache keeps its flags at its profile's threshold)."""
    measured = snapshot.measured if snapshot.measured is not None else _read_progress(snapshot.run.metrics_path)[1]
    network, flags = _judged(snapshot.run, measured, snapshot.progress.status == "running", option)
    return dataclasses.replace(snapshot, network=network, flags=flags, measured=measured)


def observe(
    runs: Iterable[RunDir],
    now: Optional[float] = None,
    complete: Optional[Callable[[List[Snapshot]], List[Snapshot]]] = None,
    straggler_threshold: Optional[float] = None,
) -> List[Snapshot]:
    """A snapshot of every run: of an ended run the status cache's while its files are unchanged
    (dlaunch/runs/statuscache.py), else read from its directory and, once it has ended, kept there.
    `complete` adds what the cache should keep too to ended snapshots that lack it (`reason`, `figures`).
    `straggler_threshold` judges every run's flags at it instead of its profile's threshold (the cache still
    keeps the profile's; a fraction in (0, 1), else ValueError from the judgement: stragglers.check_threshold)."""
    runs = list(runs)
    now = time.time() if now is None else now
    found: Dict[int, Snapshot] = {}
    for i, run in enumerate(runs):
        kept = run.kept[1]
        snapshot = _kept(run, kept) if kept is not None else None
        if snapshot is not None:
            found[i] = snapshot
    fresh = [i for i in range(len(runs)) if i not in found]
    changed = set(fresh)
    found.update(zip(fresh, _fresh([runs[i] for i in fresh], now)))
    if complete is not None:
        lacking = [i for i, s in found.items() if s.ended and (s.figures is None or s.reason is None)]
        found.update(zip(lacking, complete([found[i] for i in lacking])))
        changed.update(lacking)
    cache = statuscache.current()
    for i in sorted(changed):
        snapshot = found[i]
        if snapshot.preflight:  # as soon as seen: the site's next jobs leave the nodes out
            _suspect_left_out_nodes(snapshot, now)
        if snapshot.ended:
            logs = [path.name for path in scheduler_for(snapshot.scheduler).log_files(snapshot.run.path)]
            cache.put(snapshot.run.path, snapshot.run.kept[0], SNAPSHOT_FILES, logs, _to_keep(snapshot))
            if snapshot.progress.status == hangs.HUNG:
                _suspect_silent_nodes(snapshot, now)
    cache.save()
    snapshots = [found[i] for i in range(len(runs))]
    return snapshots if straggler_threshold is None else [_rejudged(s, straggler_threshold) for s in snapshots]
