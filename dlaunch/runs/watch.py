"""`dlaunch watch`: follow runs (one, an experiment's, a study's) until every one has ended.

In a terminal a live view (rich's Live): per run its job state, a progress bar (steps done of the
total), images/s, loss, ETA (at the rate measured so far, counting down between records), the queue
place while pending and why a run failed as soon as it fails; with several runs an overall bar.
Through a pipe plain lines: one per run whenever its state or figures change (no control
characters), and one `overall:` line whenever runs start or end. `--once` looks once and exits.
Exit code: 0 when every run ended ok (with --once: none failed so far), 1 when one failed.
`dlaunch run` shows a run that runs on this machine the same way while its job runs (`follow_job`).
"""

import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from rich.console import Console, Group, RenderableType
from rich.text import Text

from dlaunch.boundary import escape, printable
from dlaunch.errors import DlaunchError, SchedulerError
from dlaunch.runs.rundir import find_runs, readable
from dlaunch.runs.runstate import EPOCH_SO_FAR, Snapshot, observe
from dlaunch.schedulers import JobState, scheduler_for

BAR_WIDTH = 20


def duration(seconds: float) -> str:
    """e.g. 45s, 3m12s, 2h05m, 3d04h."""
    s = int(round(seconds))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % divmod(s, 60)
    if s < 86400:
        return "%dh%02dm" % (s // 3600, s % 3600 // 60)
    return "%dd%02dh" % (s // 86400, s % 86400 // 3600)


EPOCH_SO_FAR_IMAGES = "images/s (%s)" % EPOCH_SO_FAR
EPOCH_SO_FAR_LOSS = "(rank 0, this epoch so far)"


def figures(snapshot: Snapshot, now: Optional[float] = None) -> str:
    """Queue place while pending, else steps, epochs, images/s and loss, each labelled by what it covers: the run's
    X once its metrics end; within an epoch (the trainer's progress file) the epoch's figures so far (the job's
    images/s over its measured steps, steps only; rank 0's loss); else the last epoch's (its part of X, the
    mean loss over its steps and ranks); and the ETA, as far as known."""
    if snapshot.queue:
        return snapshot.queue
    p = snapshot.progress
    parts = []
    if p.steps_total:
        parts.append("steps %d/%d" % (p.steps_done, p.steps_total))
    if p.epochs_total:
        parts.append("epoch %d/%d" % (p.epochs_done, p.epochs_total))
    if p.images_per_s is not None:
        parts.append("%.1f images/s" % p.images_per_s)
    elif p.epoch_so_far_images_per_s is not None:
        parts.append("%.1f %s" % (p.epoch_so_far_images_per_s, EPOCH_SO_FAR_IMAGES))
    elif p.last_epoch_images_per_s is not None:
        parts.append("%.1f images/s (last epoch)" % p.last_epoch_images_per_s)
    if p.epoch_so_far_loss is not None:
        parts.append("loss %.3f %s" % (p.epoch_so_far_loss, EPOCH_SO_FAR_LOSS))
    elif p.loss is not None:
        parts.append("loss %.3f" % p.loss)
    eta = p.eta_s(now)
    if eta is not None:
        parts.append("ETA %s" % duration(eta))
    return ", ".join(parts)


class Watcher:
    """Looks at the runs under `targets` again on every `poll`; a run that ended is not asked about again.
    `straggler_threshold`: flags judged at it instead of each run's profile threshold (runstate.observe)."""

    def __init__(
        self,
        targets: Sequence[Path],
        explain: Callable[[Snapshot], str],
        reject: Callable[[str], None] = lambda message: print("rejected: " + message, file=sys.stderr, flush=True),
        straggler_threshold: Optional[float] = None,
    ):
        self.targets = list(targets)
        self.straggler_threshold = straggler_threshold
        self.explain = explain
        self.reject = reject  # told once about each run whose files cannot be read (dlaunch/boundary.py)
        self.ended: Dict[Path, Snapshot] = {}
        self.reasons: Dict[Path, Tuple[bool, str]] = {}  # path -> (ended when explained, reason)
        self.rejected: Dict[str, None] = {}

    def poll(self) -> List[Snapshot]:
        found = find_runs(self.targets)  # every time: a sweep being submitted adds runs
        runs, rejected = readable(r for r in found if r.path not in self.ended)
        keep = {r.path for r in runs} | set(self.ended)
        runs = [r for r in found if r.path in keep]
        if not runs:
            if rejected:
                raise DlaunchError(rejected[0])
            raise DlaunchError("no run directories under %s" % ", ".join(escape(str(t)) for t in self.targets))
        for message in rejected:
            if message not in self.rejected:
                self.rejected[message] = None
                self.reject(printable(message))
        fresh = {
            s.run.path: s
            for s in observe(
                [r for r in runs if r.path not in self.ended], straggler_threshold=self.straggler_threshold
            )
        }
        self.ended.update((path, s) for path, s in fresh.items() if s.ended)
        return [self.ended.get(run.path) or fresh[run.path] for run in runs]

    def reason(self, snapshot: Snapshot) -> str:
        """Why a failed run failed (looked up when it fails and once more when it has ended)."""
        if not snapshot.failed:
            return ""
        known = self.reasons.get(snapshot.run.path)
        if known is None or known[0] != snapshot.ended:
            known = (snapshot.ended, printable(self.explain(snapshot)))
            self.reasons[snapshot.run.path] = known
        return known[1]


def overall(snapshots: Sequence[Snapshot]) -> str:
    """e.g. '2 of 4 runs ended (1 ok, 1 failed), 1 running, 1 pending'."""
    ended = [s for s in snapshots if s.ended]
    ok, stopped = sum(s.ok for s in ended), sum(s.stopped for s in ended)
    text = "%d of %d runs ended (%d ok, %d failed%s)" % (
        len(ended),
        len(snapshots),
        ok,
        len(ended) - ok - stopped,
        ", %d stopped" % stopped if stopped else "",
    )
    pending = sum(not s.ended and s.meaning is JobState.PENDING for s in snapshots)
    running = len(snapshots) - len(ended) - pending
    return text + "".join(", %d %s" % (n, word) for n, word in ((running, "running"), (pending, "pending")) if n)


def details(snapshot: Snapshot, reason: str, now: Optional[float] = None) -> str:
    """'status; figures; why: reason (or who stopped it); network: ...; straggler: ...; dl-node2: last step 40 4 min
    ago' (the parts that say something: of the nodes, those that stalled)."""
    parts = [
        snapshot.progress.status,
        figures(snapshot, now),
        "why: " + reason if reason else snapshot.stopped_by or "",
    ]
    parts += ["network: " + problem for problem in snapshot.network]
    shown = parts + list(snapshot.flags) + list(snapshot.preflight) + list(snapshot.stalled)
    return "; ".join(part for part in shown if part)


def plain_line(snapshot: Snapshot, reason: str) -> str:
    """One run as one line: 'name: STATE; status; figures; why: reason'."""
    return printable("%s: %s; %s" % (snapshot.name, snapshot.state, details(snapshot, reason)))


def exit_code(snapshots: Sequence[Snapshot], watcher: Optional["Watcher"] = None) -> int:
    """1 when a run failed, or a run's files could not be read (a `rejected:` line), else 0."""
    return 1 if any(s.failed for s in snapshots) or (watcher is not None and watcher.rejected) else 0


def follow_plain(
    watcher: Watcher,
    interval: float,
    once: bool,
    write: Callable[[str], None],
    wait: Optional[Callable[[float], bool]] = None,
) -> int:
    """Print a line per run whenever it changes, and the overall line when runs start or end; until every
    run has ended, or with `wait` (a job that runs here: `follow_job`) until it says the job has."""
    shown: Dict[Path, str] = {}
    shown_overall = ""
    over = False
    while True:
        snapshots = watcher.poll()
        stamp = time.strftime("%H:%M:%S ")
        for s in snapshots:
            line = plain_line(s, watcher.reason(s))
            if shown.get(s.run.path) != line:
                write(stamp + line)
                shown[s.run.path] = line
        if len(snapshots) > 1 and overall(snapshots) != shown_overall:
            shown_overall = overall(snapshots)
            write(stamp + "overall: " + shown_overall)
        if once or over or (wait is None and all(s.ended for s in snapshots)):
            return exit_code(snapshots, watcher)
        if wait is None:
            time.sleep(interval)
        else:
            over = wait(interval)


def _style(snapshot: Snapshot) -> str:
    if snapshot.failed:
        return "bold red"
    if snapshot.ok:
        return "green"
    return "yellow" if snapshot.meaning is JobState.PENDING else "cyan"


def _bar_row(fraction: Optional[float], detail: Text) -> RenderableType:
    """An indented progress bar (blank without a known total) and the text beside it, wrapped at spaces."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    row = Table.grid(padding=(0, 1))
    row.add_column(width=1)
    row.add_column(width=BAR_WIDTH)
    row.add_column(ratio=1, overflow="fold")
    bar = ProgressBar(total=1.0, completed=fraction, width=BAR_WIDTH) if fraction is not None else Text("")
    row.add_row("", bar, detail)
    return row


def _shown(snapshots: Sequence[Snapshot], room: int) -> Tuple[List[Snapshot], str]:
    """The runs that fit `room` runs of the screen: all in their order, or else the failed, running and
    pending ones first; and a line counting the others ('' when all fit)."""
    if len(snapshots) <= room:
        return list(snapshots), ""
    order = sorted(snapshots, key=lambda s: (not s.failed, s.ended, s.meaning is JobState.PENDING))
    shown, rest = order[: max(1, room - 1)], order[max(1, room - 1) :]
    ok = sum(s.ok for s in rest)
    return shown, "%d more not shown (%d ended ok, %d not ended); `dlaunch runs` lists all" % (
        len(rest),
        ok,
        sum(not s.ended for s in rest),
    )


def view(
    watcher: Watcher, snapshots: Sequence[Snapshot], now: float, title: str, height: Optional[int] = None
) -> RenderableType:
    """The live view: per run a line with its name and state, below it the bar and the figures (or
    why it failed); with several runs an overall bar. Names fold only when wider than the console;
    when the runs do not fit the screen's `height` (if given), runs that ended ok give way first."""
    parts: List[RenderableType] = [Text(title, style="dim")]
    shown, more = _shown(snapshots, (height - 4) // 3) if height else (list(snapshots), "")  # 3 lines a run at most
    for s in shown:
        reason = watcher.reason(s)
        parts.append(Text.assemble(s.name, "  ", (s.state, _style(s))))
        style = "red" if reason else ("yellow" if s.network or s.flags else "")
        parts.append(_bar_row(s.progress.fraction, Text(details(s, reason, now), style=style)))
    if more:
        parts.append(Text(more, style="dim"))
    if len(snapshots) > 1:
        done = sum(1.0 if s.ended else (s.progress.fraction or 0.0) for s in snapshots) / len(snapshots)
        parts.append(Text("overall", style="bold"))
        parts.append(_bar_row(done, Text(overall(snapshots), style="bold")))
    return Group(*parts)


def follow_live(
    watcher: Watcher, console: Console, interval: float, title: str, wait: Optional[Callable[[float], bool]] = None
) -> int:
    """Redraw the view every second (the ETAs count down), look at the runs every `interval` s; until
    every run has ended, or with `wait` (`follow_plain`) until it says the job has."""
    from rich.live import Live

    snapshots = watcher.poll()
    next_poll = time.monotonic() + interval
    over = False
    with Live(console=console, auto_refresh=False, redirect_stderr=False) as live:
        while True:
            live.update(view(watcher, snapshots, time.time(), title, console.height), refresh=True)
            if over or (wait is None and all(s.ended for s in snapshots)):
                return exit_code(snapshots, watcher)
            pause = max(0.0, min(1.0, next_poll - time.monotonic()))
            if wait is None:
                time.sleep(pause)
            else:
                over = wait(pause)
            if over or time.monotonic() >= next_poll:
                snapshots = watcher.poll()
                next_poll = time.monotonic() + interval


def _live_console(console: Console) -> Optional[Console]:
    """A console for the live view on `console`'s file, or None where plain lines are due (a pipe, a dumb
    terminal). The view wraps its lines itself: a soft-wrapping console would let Live crop them at the edge."""
    if not console.is_terminal or console.is_dumb_terminal:
        return None
    return Console(file=console.file, markup=False, soft_wrap=False)


def _print_line(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


INTERRUPTED = "dlaunch: interrupted: the run stops after its current step (checkpointed); waiting for it"


def wait_for_job(wait: Callable[[Optional[float]], bool]) -> None:
    """Wait for a job that runs here to end, showing nothing: Ctrl-C reaches the job too (the trainer stops after its
    step, checkpointed), and the wait goes on until it has ended."""
    while True:
        try:
            wait(None)
            return
        except KeyboardInterrupt:
            print(INTERRUPTED, file=sys.stderr, flush=True)


def follow_job(
    run_dir: Path,
    wait: Callable[[float], bool],
    explain: Callable[[Snapshot], str],
    interval: float = 1.0,
    console: Optional[Console] = None,
) -> None:
    """Show the progress of a run whose job runs here (`dlaunch run --site local`) as `dlaunch watch`
    shows runs (live in a terminal, plain lines through a pipe) until `wait(seconds)`, which waits at most
    that long, says the job has ended and its end is recorded. Ctrl-C reaches the job too (the trainer
    stops after its step, checkpointed): the view goes on until the job has ended."""
    watcher = Watcher([run_dir], explain)
    live = _live_console(console or Console())
    title = "Ctrl-C stops the run (checkpointed)"
    while True:
        try:
            if live is None:
                follow_plain(watcher, interval, False, _print_line, wait)
            else:
                follow_live(watcher, live, interval, title, wait)
            return
        except KeyboardInterrupt:
            print(INTERRUPTED, file=sys.stderr, flush=True)


def check_watchable(snapshots: Sequence[Snapshot]) -> None:
    """Refuse to follow runs whose scheduler's status command is not on this machine (a login node of another
    cluster): their state would never be known (SchedulerError, exit code 1)."""
    for kind in sorted({s.scheduler for s in snapshots if not s.ended and s.meaning is JobState.UNKNOWN}):
        scheduler = scheduler_for(kind)
        if scheduler.status_command and shutil.which(scheduler.status_command) is None:
            raise SchedulerError(
                "%s: command not found: watch %s jobs from a login node of their cluster "
                "(--once shows what the run directories say)" % (scheduler.status_command, scheduler.label)
            )


def follow(
    targets: Sequence[Path],
    explain: Callable[[Snapshot], str],
    console: Console,
    interval: float = 5.0,
    once: bool = False,
    straggler_threshold: Optional[float] = None,
) -> int:
    """Watch the runs under `targets`: live in a terminal, plain lines otherwise; the exit code.
    `straggler_threshold`: flags judged at it instead of each run's profile threshold."""
    watcher = Watcher(targets, explain, straggler_threshold=straggler_threshold)
    if not once:
        check_watchable(watcher.poll())
    live = _live_console(console)
    if live is None:
        return follow_plain(watcher, interval, once, _print_line)
    title = "dlaunch watch %s: every %gs; Ctrl-C stops watching, not the runs" % (
        " ".join(str(t) for t in targets),
        interval,
    )
    if once:
        snapshots = watcher.poll()
        live.print(view(watcher, snapshots, time.time(), title))
        return exit_code(snapshots, watcher)
    return follow_live(watcher, live, interval, title)


def resolve_targets(names: Sequence[Path], output: Path = Path("runs")) -> List[Path]:
    """Each name as a path, or else as an experiment or study under `output` (`dlaunch watch scaling`)."""
    targets = []
    for name in names:
        if name.exists():
            targets.append(name)
        elif (output / name).is_dir():
            targets.append(output / name)
        else:
            raise DlaunchError("%s: no such run, experiment or study directory (nor %s)" % (name, output / name))
    return targets
