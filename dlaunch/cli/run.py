"""`dlaunch run` and `dlaunch sweep`: the jobs prepared (dlaunch/launch.py), then their scripts printed (--dry-run) or
the jobs submitted under the run service's one rule, a run in the foreground shown as `dlaunch watch` shows runs and
its status after it, the others followed with --follow."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, List, Optional, Sequence, Tuple

import typer

from dlaunch.cli.runs import watch_runs
from dlaunch.cli.terminal import (
    Account,
    AllowLarge,
    DryRun,
    Experiment,
    Follow,
    Framework,
    Image,
    Output,
    Partition,
    Requeue,
    Site_,
    TimeLimit,
    complete_run_dir,
    err,
    out,
    show_status,
    with_trainer_options,
)
from dlaunch.errors import DlaunchError

if TYPE_CHECKING:
    from dlaunch.runs.service import Prepared


def deliver(jobs: Sequence["Prepared"], dry_run: bool, follow: bool, summary: str = "") -> int:
    """Print the scripts (--dry-run; notes on stderr), or submit the jobs (the run service's one rule),
    show the runs that ran in the foreground, and follow the others (--follow)."""
    from dlaunch import launch

    for line in dict.fromkeys(warning for job in jobs for warning in job.warnings):
        err.print("dlaunch: warning: %s" % line)
    for line in dict.fromkeys(note for job in jobs for note in job.notes):
        err.print("dlaunch: note: %s" % line)
    if dry_run:  # stdout is the script(s) alone: `--dry-run > job.sh`
        for job in jobs:
            out.out(job.script, end="" if len(jobs) == 1 else "\n")
        if summary:
            err.print("dlaunch: %s" % summary, highlight=False)
        return 0
    submitted = launch.submit(jobs, err.print, show_progress=True)
    foreground = [run for job, run in zip(jobs, submitted.runs) if job.foreground]
    if foreground:
        from dlaunch import api

        show_status(api.status([run.path for run in foreground]))
    if follow and len(foreground) < len(submitted.runs):
        return watch_runs([run.path for run in submitted.runs]) or submitted.exit_code
    return submitted.exit_code


IncludeSuspectNodes = Annotated[
    bool,
    typer.Option(
        "--include-suspect-nodes",
        help="run on the site's suspect nodes too (`dlaunch nodes list`; by default a job leaves them out)",
    ),
]


@with_trainer_options
def run(
    site: Site_ = None,
    framework: Framework = "ddp",
    nodes: Annotated[Optional[int], typer.Option(help="nodes (default 1)")] = None,
    gpus: Annotated[Optional[int], typer.Option(help="GPUs in all (local site: worker processes)")] = None,
    partition: Partition = None,
    time_limit: TimeLimit = "01:00:00",
    account: Account = None,
    image: Image = None,
    output: Output = "runs",
    experiment: Experiment = None,
    run_name: Annotated[Optional[str], typer.Option(help="run directory name (default: a time stamp)")] = None,
    resume: Annotated[
        Optional[Path],
        typer.Option(
            help="resubmit this run directory from its checkpoint (all other options come from its plan.json)",
            autocompletion=complete_run_dir,
        ),
    ] = None,
    requeue: Requeue = None,
    dry_run: DryRun = False,
    follow: Follow = False,
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            help="N runs of this request in one experiment (RUN_NAME-r1..-rN): `dlaunch report` gives their median and spread",
        ),
    ] = 1,
    allow_large: AllowLarge = False,
    include_suspect_nodes: IncludeSuspectNodes = False,
    trainer: Tuple[Tuple[str, Any], ...] = (),
) -> int:
    """Render a job for a site and submit it (or run it here with --site local)."""
    from dlaunch import launch

    jobs = launch.prepare_run(
        site,
        framework=framework,
        nodes=nodes,
        gpus=gpus,
        partition=partition,
        time=time_limit,
        account=account,
        image=image,
        output=output,
        experiment=experiment,
        run_name=run_name,
        repeat=repeat,
        requeue=requeue,
        resume=None if resume is None else str(resume),
        dry_run=dry_run,
        allow_large=allow_large,
        trainer=trainer,
        include_suspect_nodes=include_suspect_nodes,
    )
    return deliver(
        jobs, dry_run, follow, "%d runs of one request (--repeat %d)" % (repeat, repeat) if repeat > 1 else ""
    )


def _counts(flag: str, text: Optional[str]) -> Optional[List[int]]:
    """A comma-separated list of counts (checked by the API), None when the option was not given."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DlaunchError("%s: %r is not a comma-separated list of numbers" % (flag, text)) from None


@with_trainer_options
def sweep(
    site: Site_ = None,
    framework: Framework = "ddp",
    nodes: Annotated[Optional[str], typer.Option(help="node counts, e.g. 1,2,4,8")] = None,
    gpus: Annotated[Optional[str], typer.Option(help="GPU counts instead of node counts")] = None,
    partition: Partition = None,
    time_limit: TimeLimit = "01:00:00",
    account: Account = None,
    image: Image = None,
    output: Output = "runs",
    experiment: Experiment = None,
    requeue: Requeue = None,
    dry_run: DryRun = False,
    follow: Follow = False,
    allow_large: AllowLarge = False,
    include_suspect_nodes: IncludeSuspectNodes = False,
    trainer: Tuple[Tuple[str, Any], ...] = (),
) -> int:
    """One job per node (or GPU) count, grouped as one experiment."""
    from dlaunch import launch

    jobs = launch.prepare_sweep(
        site,
        framework=framework,
        nodes=_counts("--nodes", nodes),
        gpus=_counts("--gpus", gpus),
        partition=partition,
        time=time_limit,
        account=account,
        image=image,
        output=output,
        experiment=experiment,
        requeue=requeue,
        dry_run=dry_run,
        allow_large=allow_large,
        trainer=trainer,
        include_suspect_nodes=include_suspect_nodes,
    )
    return deliver(jobs, dry_run, follow)
