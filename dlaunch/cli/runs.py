"""The commands on run directories: `dlaunch status`, `runs`, `watch`, `logs` and `cancel`."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional, Sequence

import typer

from dlaunch.boundary import display_path, escape
from dlaunch.cli.terminal import (
    Json,
    RunDirArg,
    RunDirs,
    StragglerThreshold,
    complete_run_dir,
    err,
    finite_number,
    out,
    print_json,
    show_status,
)

if TYPE_CHECKING:
    from dlaunch.api import RunStatus


def print_statuses(statuses: Sequence["RunStatus"]) -> int:
    """`--json` of status and runs: the runs' RunStatus objects; a `rejected:` line on stderr for each run whose
    files cannot be read (exit code 1, else 0)."""
    print_json(statuses)
    rejected = [s.rejected for s in statuses if s.rejected]
    for message in rejected:
        err.print("rejected: %s" % escape(message), highlight=False)
    return 1 if rejected else 0


def status(run_dirs: RunDirs = None, as_json: Json = False, straggler_threshold: StragglerThreshold = None) -> int:
    """Scheduler state and metrics status of runs (without arguments: `dlaunch runs`)."""
    if not run_dirs:
        return runs(as_json=as_json, straggler_threshold=straggler_threshold)
    from dlaunch import api

    found = api.status(run_dirs, straggler_threshold=straggler_threshold)
    return print_statuses(found) if as_json else show_found(found, run_dirs)


def runs(
    directory: Annotated[
        Optional[Path],
        typer.Argument(
            help="folder holding run directories (default: ./runs)",
            autocompletion=complete_run_dir,
            show_default=False,
        ),
    ] = None,
    as_json: Json = False,
    straggler_threshold: StragglerThreshold = None,
) -> int:
    """The run directories under DIRECTORY (default ./runs), newest first, with state and figures."""
    from dlaunch import api

    found = api.status(
        None if directory is None else [directory], newest_first=True, straggler_threshold=straggler_threshold
    )
    return print_statuses(found) if as_json else show_found(found, [directory or Path("runs")])


def show_found(found: Sequence["RunStatus"], paths: Sequence[Path]) -> int:
    """The runs' table (show_status), or a line saying that there are none under `paths` (exit code 0)."""
    if not found:
        err.print("no run directories under %s" % ", ".join(escape(str(p)) for p in paths), highlight=False)
    return show_status(found)


def watch_runs(
    targets: List[Path], interval: float = 5.0, once: bool = False, straggler_threshold: Optional[float] = None
) -> int:
    """Follow runs to their end in the live view (dlaunch/runs/watch.py: it redraws the terminal as the runs go, so
    it is the command line's, not the API's; docs/API.md); 1 when one failed. Their last status through the API,
    which records the runs that ended in the results database."""
    from dlaunch import api
    from dlaunch.runs.service import why_failed
    from dlaunch.runs.watch import follow

    try:
        code = follow(targets, why_failed, out, interval=interval, once=once, straggler_threshold=straggler_threshold)
    except KeyboardInterrupt:
        err.print("dlaunch: stopped watching; the runs go on (dlaunch watch %s)" % " ".join(str(t) for t in targets))
        return 130
    api.status(targets, straggler_threshold=straggler_threshold)
    return code


def watch(
    targets: Annotated[
        List[Path],
        typer.Argument(
            help="run, experiment or study directories (or an experiment's name under ./runs)",
            autocompletion=complete_run_dir,
            show_default=False,
        ),
    ],
    once: Annotated[
        bool, typer.Option("--once", help="show the state once and exit (for cron): 1 when a run failed")
    ] = False,
    interval: Annotated[
        float, typer.Option(parser=finite_number(low=0.1), help="seconds between looks at the runs (at least 0.1)")
    ] = 5.0,
    straggler_threshold: StragglerThreshold = None,
) -> int:
    """Follow runs to their end: progress, images/s, loss, ETA, queue place, why one failed.

    Live in a terminal; through a pipe one plain line per change. Ends when every run has ended;
    exit code 1 when one failed."""
    from dlaunch.runs.watch import resolve_targets

    return watch_runs(resolve_targets(targets), interval=interval, once=once, straggler_threshold=straggler_threshold)


def logs(run_dir: RunDirArg) -> int:
    """Print a run's logs."""
    from dlaunch import api
    from dlaunch.boundary import check_regular, copy_log

    found = api.logs(run_dir)
    if found.missing:
        err.print(found.missing, highlight=False)
    for path in [check_regular(Path(p)) for p in found.files]:  # all checked before the first is printed
        err.rule(display_path(path))
        copy_log(path, lambda text: out.out(text, end="", highlight=False))
    return 1 if found.failed else 0


def cancel(run_dir: RunDirArg) -> int:
    """Cancel a run's job (a run that has ended is left as it is: exit 0)."""
    from dlaunch import api

    err.print(api.cancel(run_dir), highlight=False)
    return 0
