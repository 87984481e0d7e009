"""`run`, `sweep` and `rerun`: jobs prepared, then rendered only (a dry run) or submitted (dlaunch/launch.py's two
steps)."""

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Sequence

from dlaunch import launch
from dlaunch.api.calls import api_function
from dlaunch.api.records import Job, Rerun

if TYPE_CHECKING:
    from dlaunch.runs.rundir import RunDir
    from dlaunch.runs.service import Prepared


def job_of(prepared: "Prepared", run: "Optional[RunDir]" = None, code: Optional[int] = None, label: str = "") -> Job:
    plan = prepared.plan
    return Job(
        run_dir=plan.run_dir,
        site=plan.site,
        scheduler=plan.scheduler,
        experiment=prepared.request.experiment or "",
        run_name=Path(plan.run_dir).name,
        script=prepared.script,
        job_id=run.job_id if run else None,
        warnings=list(prepared.warnings),
        notes=list(prepared.notes),
        submitted=run is not None,
        exit_code=code if run is not None and prepared.foreground else None,
        nodes=plan.nodes,
        processes=plan.nodes * plan.nproc_per_node,
        label=label,
    )


def delivered(jobs: Sequence["Prepared"], dry_run: bool) -> List[Job]:
    """Prepared jobs as `Job`s: rendered only (a dry run), or submitted (a foreground one run here to its end,
    without showing its progress)."""
    if dry_run:
        return [job_of(p) for p in jobs]
    submitted = launch.submit(jobs)
    return [job_of(p, run, code) for p, run, code in zip(jobs, submitted.runs, submitted.codes)]


@api_function
def run(
    site: Optional[str] = None,
    *,
    framework: str = "ddp",
    nodes: Optional[int] = None,
    gpus: Optional[int] = None,
    partition: Optional[str] = None,
    time: str = "01:00:00",
    account: Optional[str] = None,
    image: Optional[str] = None,
    output: str = "runs",
    experiment: Optional[str] = None,
    run_name: Optional[str] = None,
    repeat: int = 1,
    requeue: Optional[bool] = None,
    resume: Optional[str] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    **trainer: Any,
) -> List[Job]:
    """Render a job for a site and submit it, or run it here to its end (`site="local"`); with `dry_run`
    render it only. `repeat` N: N runs of the request (RUN_NAME-r1..-rN); `resume`: a run directory again
    from its checkpoint (every other option from its plan.json). Trainer flags as keyword arguments."""
    jobs = launch.prepare_run(
        site,
        framework=framework,
        nodes=nodes,
        gpus=gpus,
        partition=partition,
        time=time,
        account=account,
        image=image,
        output=output,
        experiment=experiment,
        run_name=run_name,
        repeat=repeat,
        requeue=requeue,
        resume=resume,
        dry_run=dry_run,
        allow_large=allow_large,
        trainer=launch.trainer_options(trainer),
    )
    return delivered(jobs, dry_run)


@api_function
def sweep(
    site: Optional[str] = None,
    *,
    framework: str = "ddp",
    nodes: Optional[Sequence[int]] = None,
    gpus: Optional[Sequence[int]] = None,
    partition: Optional[str] = None,
    time: str = "01:00:00",
    account: Optional[str] = None,
    image: Optional[str] = None,
    output: str = "runs",
    experiment: Optional[str] = None,
    requeue: Optional[bool] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    **trainer: Any,
) -> List[Job]:
    """One job per node count (`nodes=[1, 2, 4]`) or GPU count (`gpus=...`), grouped as one experiment
    (runs n0001, n0002, ... or g0001, ...)."""
    jobs = launch.prepare_sweep(
        site,
        framework=framework,
        nodes=nodes,
        gpus=gpus,
        partition=partition,
        time=time,
        account=account,
        image=image,
        output=output,
        experiment=experiment,
        requeue=requeue,
        dry_run=dry_run,
        allow_large=allow_large,
        trainer=launch.trainer_options(trainer),
    )
    return delivered(jobs, dry_run)


def counted_warnings(lines: Iterable[str]) -> List[str]:
    """Each distinct warning once, sorted, with the number of jobs it came from when more than one."""
    from collections import Counter

    return ["%s (%d jobs)" % (line, n) if n > 1 else line for line, n in sorted(Counter(lines).items())]


@api_function
def rerun(
    result: Any,
    *,
    site: str,
    nodes: Optional[int] = None,
    gpus: Optional[int] = None,
    data: Optional[str] = None,
    output: str = "runs",
    dry_run: bool = False,
    allow_large: bool = False,
) -> Rerun:
    """A result (metrics file, run directory, or ARCHIVE.tar.gz:RUN of `archive`'s bundle) run again on `site`: its
    request resolved there, submitted (or rendered only with `dry_run`), with what differs from the parent."""
    rerun = launch.prepare_rerun(
        result, site, nodes=nodes, gpus=gpus, data=data, output=output, dry_run=dry_run, allow_large=allow_large
    )
    (job,) = delivered([rerun.job], dry_run)
    return Rerun(rerun.parent, [list(row) for row in rerun.differences], job)
