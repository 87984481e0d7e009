"""`dlaunch run --repeat N`: N runs of one request in one experiment, for medians and their spread.

The runs are `<run name>-r1` ... `<run name>-rN` (the run name defaults to a time stamp, as for one
run), side by side in the experiment's folder, so `dlaunch report` groups them at one GPU count and
gives the median and spread of each figure. Every run directory is checked before the first job is
submitted: a taken name submits nothing. Jobs are submitted in order and the first refusal stops the
rest, as `dlaunch sweep` does; on `--site local` they run one after the other.
"""
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, List, Tuple

from launcher.errors import DlaunchError
from launcher.jobs.request import LaunchRequest
from launcher.runs.rundir import RunDir, default_run_name

if TYPE_CHECKING:
    from launcher.jobs.plan import LaunchPlan


def repeat_names(base: str, repeats: int) -> List[str]:
    """`base-r1` ... `base-rN`: deterministic, sorted in submission order up to 9 repeats (r01.. beyond)."""
    width = len(str(repeats)) if repeats > 9 else 1
    return ["%s-r%0*d" % (base, width, i) for i in range(1, repeats + 1)]


def run_repeats(request: LaunchRequest, repeats: int, dry_run: bool = False, follow: bool = False) -> int:
    """Render `repeats` copies of `request` (run names from `repeat_names`) and submit them (or print
    them with `dry_run`); the exit code of the first run that failed here, else 0."""
    from launcher import cli

    if repeats < 1:
        raise DlaunchError("--repeat: give a positive number of runs")
    base = request.run_name or default_run_name()
    jobs: List[Tuple[LaunchRequest, "LaunchPlan", str]] = []
    for name in repeat_names(base, repeats):
        prepared, plan, script = cli.prepare(dataclasses.replace(request, run_name=name), dry_run=dry_run)
        if not jobs:
            cli.check_image(plan, dry_run)
        jobs.append((prepared, plan, script))
    if dry_run:
        for _, _, script in jobs:
            cli.out.out(script)
        cli.out.out("%d runs of one request (--repeat %d)" % (len(jobs), repeats))
        return 0
    taken = [plan.run_dir for _, plan, _ in jobs if Path(plan.run_dir).exists()]
    if taken:
        raise DlaunchError("--repeat: run directory %s exists (choose another --run-name or --experiment)" % taken[0])
    for i, (prepared, plan, script) in enumerate(jobs, 1):
        cli.err.print("[%d/%d] %s" % (i, len(jobs), Path(plan.run_dir).name))
        code = cli.submit(prepared, plan, script, RunDir.create(Path(plan.run_dir)))
        if code:
            return code
    if follow and not cli._foreground(jobs[0][1].scheduler):  # foreground runs were followed already
        return cli.watch_runs([Path(plan.run_dir) for _, plan, _ in jobs])
    return 0
