"""After submission: `status`, `watch`, `cancel`, `logs` of runs, and `archive` of an experiment."""

import dataclasses
import os
import time as clock
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence

from dlaunch.api.calls import api_function
from dlaunch.api.records import Archive, Logs, RunStatus
from dlaunch.boundary import display_path, escape, quoted
from dlaunch.errors import DlaunchError, DlaunchWarning

if TYPE_CHECKING:
    from dlaunch.runs.rundir import RunDir
    from dlaunch.runs.runstate import Snapshot


@api_function
def archive(folder: Any, output: Any) -> Archive:
    """Bundle an experiment's or study's directory into `output` (FILE.tar.gz): scripts, plans, profiles, metrics,
    logs and report, with a sha256 manifest."""
    from dlaunch.runs.archive import MANIFEST, runs_without_profile, write_archive

    manifest = write_archive(Path(folder), Path(output))
    return Archive(
        str(output),
        "%s/%s" % (Path(folder).resolve().name, MANIFEST),
        len(manifest),
        sum(int(entry["bytes"]) for entry in manifest.values()),  # type: ignore[call-overload]  # a manifest entry's "bytes" is an int (write_archive)
        [str(run.path) for run in runs_without_profile(Path(folder))],
    )


def _record_ended(runs: Iterable["RunDir"]) -> None:
    """Rows for the runs that ended into the results database; one that cannot be written is a DlaunchWarning."""
    from dlaunch.resultsdb.store import record

    warning = record([run.metrics_path for run in runs]).warning
    if warning:
        warnings.warn(warning, DlaunchWarning, stacklevel=3)


def _run_status(snapshot: "Snapshot") -> RunStatus:
    from dlaunch.runs import service
    from dlaunch.runs.failures import scheduler_label

    p = snapshot.progress
    return RunStatus(
        name=snapshot.name,
        path=str(snapshot.run.path),
        site=snapshot.site,
        job=snapshot.job,
        scheduler=snapshot.scheduler,
        state=scheduler_label(snapshot.state, snapshot.meaning, p.status),
        status=p.status,
        queue=snapshot.queue,
        gpus=snapshot.gpus,
        epochs_done=p.epochs_done,
        epochs_total=p.epochs_total,
        images_per_s=p.images_per_s,
        last_epoch_images_per_s=p.last_epoch_images_per_s,
        steps_done=p.steps_done,
        steps_total=p.steps_total,
        epoch_so_far_images_per_s=p.epoch_so_far_images_per_s,
        epoch_so_far_loss=p.epoch_so_far_loss,
        loss=p.loss,
        eta_s=p.eta_s(clock.time()),
        ended=snapshot.ended,
        ok=snapshot.ok,
        why_failed=service.why_failed(snapshot) if snapshot.failed else None,
        stopped_by=snapshot.stopped_by,
        flags=list(snapshot.flags),
        network=list(snapshot.network),
        figures=service.run_figures(snapshot),
        nodes=list(snapshot.nodes),
        preflight=list(snapshot.preflight),
    )


def statuses_of(found: Sequence["RunDir"], straggler_threshold: Optional[float] = None) -> List[RunStatus]:
    """Each run's status, in the order given; a run whose files cannot be read has only `rejected`; flags judged
    at `straggler_threshold` (None: each run's profile's). The runs that ended are recorded in the results database."""
    from dlaunch.runs import service

    by_path, ok = {}, []
    for run in found:
        try:
            run.check()
        except DlaunchError as e:
            by_path[run.path] = RunStatus(display_path(run.path), str(run.path), rejected=str(e))
        else:
            ok.append(run)
    by_path.update((s.run.path, _run_status(s)) for s in service.observe(ok, straggler_threshold))
    _record_ended(ok)
    judged = _doubtful_points([run for run in ok if by_path[run.path].ok and not by_path[run.path].flags])
    for path, line in judged.items():
        by_path[path] = dataclasses.replace(by_path[path], quality=line)
    return [by_path[run.path] for run in found]


def _doubtful_points(runs: Sequence["RunDir"]) -> Dict[Path, str]:
    """Run directory -> the quality verdict of its scaling point (dlaunch/analysis/quality.py: noisy, unstable
    reference, implausible, with causes) where that point is doubtful, judged among `runs` (those listed that ended
    ok, flagged ones set apart as `report` sets them) at the default noise thresholds."""
    from dlaunch.analysis.quality import doubtful_points
    from dlaunch.analysis.scaling import load_runs

    by_metrics = {str(run.metrics_path): run.path for run in runs}
    loaded = [r for r in load_runs(list(by_metrics)).runs if r.path in by_metrics]
    return {
        by_metrics[path]: "quality of its %d-rank point: %s" % (verdict.gpus, verdict.line)
        for path, verdict in doubtful_points(loaded).items()
    }


@api_function
def status(
    paths: Optional[Sequence[Any]] = None, *, newest_first: bool = False, straggler_threshold: Optional[float] = None
) -> List[RunStatus]:
    """The runs at or below `paths` (run, experiment or study directories; default: ./runs), in path order or
    `newest_first` (by their last submission, as `dlaunch runs`): scheduler state, metrics status, figures, why one
    failed, stragglers judged at `straggler_threshold` (None: each run's site profile's). Folders without runs (and
    no ./runs by default) give none; a path that does not exist is a DlaunchError."""
    from dlaunch.analysis.stragglers import threshold_option
    from dlaunch.runs.rundir import find_runs
    from dlaunch.runs.rundir import newest_first as by_submission

    threshold_option(straggler_threshold)
    given = [Path(p) for p in paths] if paths is not None else [Path(p) for p in ("runs",) if os.path.lexists(p)]
    missing = [p for p in given if not os.path.lexists(p)]
    if missing:
        raise DlaunchError("%s: no such run directory or folder" % escape(str(missing[0])))
    found = find_runs(given)
    return statuses_of(by_submission(found) if newest_first else found, straggler_threshold)


@api_function
def watch(
    paths: Sequence[Any],
    *,
    interval: float = 5.0,
    timeout: Optional[float] = None,
    straggler_threshold: Optional[float] = None,
) -> List[RunStatus]:
    """Look at the runs every `interval` seconds until every one has ended (or `timeout` seconds have
    passed); their last status. `paths` and `straggler_threshold` as for `status`, or an experiment's name
    under ./runs."""
    from dlaunch.analysis.stragglers import threshold_option
    from dlaunch.runs import service
    from dlaunch.runs.watch import Watcher, check_watchable, resolve_targets

    if not interval >= 0.1:  # as the command line's option says it
        raise DlaunchError("Invalid value for '--interval': %s is below 0.1" % quoted(str(interval)))
    threshold_option(straggler_threshold)
    targets = resolve_targets([Path(p) for p in paths])
    check_watchable(Watcher(targets, service.why_failed).poll())
    deadline = None if timeout is None else clock.monotonic() + timeout
    while True:
        seen = status(targets, straggler_threshold=straggler_threshold)
        if all(s.ended or s.rejected for s in seen) or (deadline is not None and clock.monotonic() >= deadline):
            return seen
        clock.sleep(interval if deadline is None else max(0.0, min(interval, deadline - clock.monotonic())))


@api_function
def cancel(run_dir: Any) -> str:
    """Cancel a run's job; what was done, as a line (a run that has ended is left as it is)."""
    from dlaunch.runs import service
    from dlaunch.runs.rundir import RunDir

    return service.cancel(RunDir.open(Path(run_dir)))


@api_function
def logs(run_dir: Any) -> Logs:
    """A run's log files, oldest first, or why it has none."""
    from dlaunch.runs import service
    from dlaunch.runs.rundir import RunDir

    found = service.logs(RunDir.open(Path(run_dir)))
    return Logs([str(p) for p in found.files], found.missing, found.failed)
