"""`dlaunch run` and `dlaunch sweep`: the jobs prepared (the Python API's `prepare`, `prepare_sweep`), then their
scripts printed (--dry-run) or the jobs submitted (`submit`) under the run service's one rule, a run in the foreground
shown as `dlaunch watch` shows runs and its status after it, the others followed with --follow."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Dict, List, Optional, Tuple

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
    from dlaunch.api import Prepared


def trainer_keywords(trainer: Tuple[Tuple[str, Any], ...]) -> Dict[str, Any]:
    """The trainer flags set on the command line as the API's keyword arguments (`--batch-size` is `batch_size`)."""
    return {name.replace("-", "_"): value for name, value in trainer}


def deliver(prepared: "Prepared", follow: bool) -> int:
    """Print the scripts (a dry run; notes on stderr), or submit the jobs (the run service's one rule),
    show the runs that ran in the foreground, and follow the others (--follow)."""
    from dlaunch import api

    jobs = prepared.jobs
    for line in dict.fromkeys(warning for job in jobs for warning in job.warnings):
        err.print("dlaunch: warning: %s" % line)
    for line in dict.fromkeys(note for job in jobs for note in job.notes):
        err.print("dlaunch: note: %s" % line)
    if prepared.dry_run:  # stdout is the script(s) alone: `--dry-run > job.sh`
        for job in jobs:
            out.out(job.script, end="" if len(jobs) == 1 else "\n")
        if prepared.summary:
            err.print("dlaunch: %s" % prepared.summary, highlight=False)
        return 0
    submitted = api.submit(prepared, say=err.print, show_progress=True)
    exit_code = next((job.exit_code for job in submitted if job.exit_code), 0)
    foreground = [job.run_dir for job in submitted if job.exit_code is not None]  # ran here, to its end
    if foreground:
        show_status(api.status(foreground))
    if follow and len(foreground) < len(submitted):
        return watch_runs([Path(job.run_dir) for job in submitted]) or exit_code
    return exit_code


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
    trainer: Tuple[Tuple[str, Any], ...] = (),
) -> int:
    """Render a job for a site and submit it (or run it here with --site local)."""
    from dlaunch import api

    prepared = api.prepare(
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
        **trainer_keywords(trainer),
    )
    return deliver(prepared, follow)


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
    trainer: Tuple[Tuple[str, Any], ...] = (),
) -> int:
    """One job per node (or GPU) count, grouped as one experiment."""
    from dlaunch import api

    prepared = api.prepare_sweep(
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
        **trainer_keywords(trainer),
    )
    return deliver(prepared, follow)
