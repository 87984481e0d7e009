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
    print_json,
    show_status,
    with_trainer_options,
)
from dlaunch.errors import DlaunchError

if TYPE_CHECKING:
    from dlaunch.api import Cost, Prepared

Budget = Annotated[
    Optional[float],
    typer.Option(
        metavar="NODE_HOURS",
        help="refuse (exit 2, a dry run too) when the jobs' time limits come to more node-hours (nodes x time limit)",
    ),
]
RunsJson = Annotated[
    bool,
    typer.Option(
        "--json",
        help="print the Python API's Prepared as JSON (docs/API.md), nothing else: the jobs (their scripts; once "
        "submitted, their job ids) and their cost",
    ),
]


def cost_lines(cost: "Cost") -> List[str]:
    """What jobs cost, before they are submitted: node-hours of their time limits, of their expected run time where
    one is known, per partition/QOS row (the figures are the study's design's)."""
    from dlaunch.runs.cost import hours as node_hours

    if cost.node_hours is None:
        limits = "%d jobs on this machine, one after the other (no time limit)" % cost.jobs
    else:
        limits = "%d jobs, %s node-hours at their time limits" % (cost.jobs, node_hours(cost.node_hours))
    if cost.expected_jobs:
        expected = "expected: %s node-hours for %d of them, from %s" % (
            node_hours(cost.expected_node_hours),
            cost.expected_jobs,
            cost.expected_from,
        )
    else:
        expected = "expected run time unknown: %s" % cost.expected_from
    lines = ["cost: %s; %s" % (limits, expected)]
    if cost.node_hours is not None:
        lines += [
            "  %s: %d jobs, %s node-hours, up to %d nodes"
            % (q.queue, q.jobs, node_hours(q.node_hours), q.largest_nodes)
            for q in cost.queues
        ]
    return lines


def trainer_keywords(trainer: Tuple[Tuple[str, Any], ...]) -> Dict[str, Any]:
    """The trainer flags set on the command line as the API's keyword arguments (`--batch-size` is `batch_size`)."""
    return {name.replace("-", "_"): value for name, value in trainer}


def deliver(prepared: "Prepared", follow: bool, as_json: bool = False) -> int:
    """Print the scripts (a dry run; notes and the cost on stderr), or say the cost and submit the jobs (the run
    service's one rule), show the runs that ran in the foreground, and follow the others (--follow); with --json,
    the Prepared (its jobs as submitted) on stdout instead of scripts and tables."""
    import dataclasses

    from dlaunch import api

    jobs = prepared.jobs
    for line in dict.fromkeys(warning for job in jobs for warning in job.warnings):
        err.print("dlaunch: warning: %s" % line)
    for line in dict.fromkeys(note for job in jobs for note in job.notes):
        err.print("dlaunch: note: %s" % line)
    if prepared.dry_run:  # stdout is the script(s) alone: `--dry-run > job.sh`
        if as_json:
            print_json(prepared)
        else:
            for job in jobs:
                out.out(job.script, end="" if len(jobs) == 1 else "\n")
        if prepared.summary:
            err.print("dlaunch: %s" % prepared.summary, highlight=False)
    if prepared.cost and len(jobs) > 1:  # before anything is submitted
        err.out("\n".join(cost_lines(prepared.cost)), highlight=False)
    if prepared.dry_run:
        return 0
    submitted = api.submit(prepared, say=err.print, show_progress=not as_json)
    exit_code = next((job.exit_code for job in submitted if job.exit_code), 0)
    if as_json:
        print_json(dataclasses.replace(prepared, jobs=submitted))
        return exit_code
    foreground = [job.run_dir for job in submitted if job.exit_code is not None]  # ran here, to its end
    if foreground:
        show_status(api.status(foreground))
    if follow and len(foreground) < len(submitted):
        return watch_runs([Path(job.run_dir) for job in submitted]) or exit_code
    return exit_code


IncludeSuspectNodes = Annotated[
    bool,
    typer.Option(
        "--include-suspect-nodes",
        help="run on the site's suspect nodes too (`dlaunch nodes list`; by default a job leaves them out)",
    ),
]


Preflight = Annotated[
    bool,
    typer.Option(
        "--preflight",
        help="check every node before training (a GEMM per GPU, NVML health: the profile's [preflight]); failing "
        "nodes are named and left out (Slurm)",
    ),
]
SpareNodes = Annotated[
    int,
    typer.Option(
        "--spare-nodes",
        help="with --preflight: ask K nodes more than the job trains on, and train on healthy ones",
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
    output: Output = None,
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
    budget: Budget = None,
    as_json: RunsJson = False,
    include_suspect_nodes: IncludeSuspectNodes = False,
    preflight: Preflight = False,
    spare_nodes: SpareNodes = 0,
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
        budget=budget,
        include_suspect_nodes=include_suspect_nodes,
        preflight=preflight,
        spare_nodes=spare_nodes,
        **trainer_keywords(trainer),
    )
    return deliver(prepared, follow, as_json)


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
    output: Output = None,
    experiment: Experiment = None,
    requeue: Requeue = None,
    dry_run: DryRun = False,
    follow: Follow = False,
    repeat: Annotated[
        int,
        typer.Option(
            min=1, help="N runs of each count (n0001-r1..-rN): `dlaunch report` gives their median and spread"
        ),
    ] = 1,
    allow_large: AllowLarge = False,
    budget: Budget = None,
    as_json: RunsJson = False,
    include_suspect_nodes: IncludeSuspectNodes = False,
    preflight: Preflight = False,
    spare_nodes: SpareNodes = 0,
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
        repeat=repeat,
        requeue=requeue,
        dry_run=dry_run,
        allow_large=allow_large,
        budget=budget,
        include_suspect_nodes=include_suspect_nodes,
        preflight=preflight,
        spare_nodes=spare_nodes,
        **trainer_keywords(trainer),
    )
    return deliver(prepared, follow, as_json)
