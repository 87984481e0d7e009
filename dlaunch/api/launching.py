"""The two steps of `run`, `sweep` and `rerun`, public: `prepare`, `prepare_sweep` and `prepare_rerun` render the jobs
(the request resolved against its site, checked and rendered; nothing written) into a `Prepared`, and `submit` submits
it under the run service's one rule (dlaunch/runs/service.py). `run`, `sweep` and `rerun` are the first step, then the
second (a dry run: the first alone); the command line calls the two steps itself, to print between them and to show a
run on this machine as it goes.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple

from dlaunch.api.calls import api_function
from dlaunch.api.records import Cost, FigureCost, Job, Prepared, QueueCost, Rerun, SharedJobs
from dlaunch.boundary import check_limit
from dlaunch.errors import DlaunchError

if TYPE_CHECKING:
    from dlaunch.runs import cost, service
    from dlaunch.runs.rundir import RunDir

Trainer = Tuple[Tuple[str, Any], ...]  # (trainer flag name, value): the flags set, as LaunchRequest holds them
RENDERED = "_rendered"  # a Prepared's rendered jobs (the run service's), beside its fields: what `submit` submits


def trainer_options(options: Mapping[str, Any]) -> Trainer:
    """Trainer flags given as keyword arguments (`batch_size=8`) as (flag name, value) pairs in the flags'
    order; None and False are flags not set (as on the command line). Unknown names fail when checked."""
    from dlaunch.jobs.request import TRAINER_FLAGS

    order = {flag.attr: i for i, flag in enumerate(TRAINER_FLAGS)}
    given = sorted(
        (order.get(name, len(order)), name.replace("_", "-"), value)
        for name, value in options.items()
        if value is not None and value is not False
    )
    return tuple((name, value) for _, name, value in given)


def _request(site: Optional[str], trainer: Mapping[str, Any], **settings: Any) -> Any:
    from dlaunch.jobs.request import LaunchRequest

    return LaunchRequest(site=site, trainer=trainer_options(trainer), **settings)  # type: ignore[arg-type]


def job_of(
    prepared: "service.Prepared", run: "Optional[RunDir]" = None, code: Optional[int] = None, label: str = ""
) -> Job:
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
        exit_code=code,  # None: not run here (rendered only, or handed to a batch system)
        nodes=plan.nodes,
        processes=plan.nodes * plan.nproc_per_node,
        label=label,
    )


def cost_record(found: "cost.Cost") -> Cost:
    """The run layer's cost of jobs (dlaunch/runs/cost.py) as the API's."""
    return Cost(
        jobs=found.jobs,
        node_hours=found.node_hours,
        expected_jobs=found.expected_jobs,
        expected_node_hours=found.expected_node_hours,
        expected_from=found.expected_from,
        queues=[QueueCost(q.name, q.jobs, q.node_hours, q.largest_nodes) for q in found.queues],
        figures=[FigureCost(f.figure, f.jobs, f.node_hours) for f in found.figures],
        shared=[SharedJobs(list(figures), n) for figures, n in found.shared],
    )


def _prepared(
    jobs: Sequence["service.Prepared"],
    dry_run: bool,
    summary: str = "",
    parent: Optional[str] = None,
    differences: Sequence[Sequence[str]] = (),
    budget: Optional[float] = None,
) -> Prepared:
    """The API's Prepared of rendered jobs, with the jobs themselves beside its fields for `submit`; the cost of more
    than one job (or of one with a `budget`, which refuses a cost over it)."""
    found = None
    if len(jobs) > 1 or budget is not None:
        from dlaunch.runs.cost import check_budget, cost_of

        found = cost_of(jobs)
        check_budget(found, budget)
    prepared = Prepared(
        [job_of(job) for job in jobs],
        dry_run,
        summary,
        parent,
        [list(row) for row in differences],
        None if found is None else cost_record(found),
    )
    object.__setattr__(prepared, RENDERED, tuple(jobs))  # frozen: set once, here
    return prepared


def _check_repeat(repeat: int, allow_large: bool) -> None:
    if repeat < 1:  # the command line's option (typer) says it so
        raise DlaunchError("Invalid value for '--repeat': Input should be greater than or equal to 1")
    check_limit("--repeat", repeat, "repeats", allow_large)


@api_function
def prepare(
    site: Optional[str] = None,
    *,
    framework: str = "ddp",
    nodes: Optional[int] = None,
    gpus: Optional[int] = None,
    partition: Optional[str] = None,
    time: str = "01:00:00",
    account: Optional[str] = None,
    image: Optional[str] = None,
    output: Optional[str] = None,
    experiment: Optional[str] = None,
    run_name: Optional[str] = None,
    repeat: int = 1,
    requeue: Optional[bool] = None,
    resume: Optional[str] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    budget: Optional[float] = None,
    include_suspect_nodes: bool = False,
    preflight: bool = False,
    spare_nodes: int = 0,
    **trainer: Any,
) -> Prepared:
    """`run`'s jobs rendered and checked, nothing written: `submit` submits them (with `dry_run`, they are shown only).
    `budget`: node-hours the jobs' time limits may come to (more is refused, a dry run too); the site's suspect nodes
    (dlaunch/runs/suspects.py) left out unless `include_suspect_nodes`; `preflight`: every node checked before training,
    failing ones left out, `spare_nodes` K more asked (dlaunch/train/nodecheck.py)."""
    from dlaunch.runs import service

    _check_repeat(repeat, allow_large)
    if repeat > 1 and resume is not None:
        raise DlaunchError("--repeat: not with --resume (resume each run directory on its own)")
    if resume is not None:
        return _prepared(
            [service.resume(Path(resume), dry_run, allow_large, include_suspect_nodes, preflight, spare_nodes)],
            dry_run,
            budget=budget,
        )
    request = _request(
        site,
        trainer,
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
        requeue=requeue,
        allow_large=allow_large,
        include_suspect_nodes=include_suspect_nodes,
        preflight=preflight,
        spare_nodes=spare_nodes,
    )
    if repeat == 1:
        return _prepared([service.prepare(request, dry_run=dry_run)], dry_run, budget=budget)
    from dlaunch.runs.repeat import repeat_requests

    return _prepared(
        [service.prepare(r, dry_run=dry_run) for r in repeat_requests(request, repeat)],
        dry_run,
        "%d runs of one request (--repeat %d)" % (repeat, repeat),
        budget=budget,
    )


def check_counts(flag: str, counts: Sequence[int]) -> List[int]:
    """A sweep's node or GPU counts: positive, each once."""
    counts = list(counts)
    if not counts or any(isinstance(c, bool) or not isinstance(c, int) for c in counts) or min(counts) < 1:
        raise DlaunchError("%s: give positive counts, e.g. 1,2,4" % flag)
    if len(set(counts)) != len(counts):
        raise DlaunchError("%s: %s lists a count twice" % (flag, ",".join(map(str, counts))))
    return counts


@api_function
def prepare_sweep(
    site: Optional[str] = None,
    *,
    framework: str = "ddp",
    nodes: Optional[Sequence[int]] = None,
    gpus: Optional[Sequence[int]] = None,
    partition: Optional[str] = None,
    time: str = "01:00:00",
    account: Optional[str] = None,
    image: Optional[str] = None,
    output: Optional[str] = None,
    experiment: Optional[str] = None,
    repeat: int = 1,
    requeue: Optional[bool] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    budget: Optional[float] = None,
    include_suspect_nodes: bool = False,
    preflight: bool = False,
    spare_nodes: int = 0,
    **trainer: Any,
) -> Prepared:
    """`sweep`'s jobs rendered and checked, nothing written: `submit` submits them."""
    from dlaunch.runs import service
    from dlaunch.runs.repeat import repeat_names
    from dlaunch.runs.rundir import default_run_name

    if (nodes is None) == (gpus is None):
        raise DlaunchError("--nodes/--gpus: give exactly one list of counts")
    _check_repeat(repeat, allow_large)
    key, flag, counts = ("nodes", "--nodes", nodes) if nodes is not None else ("gpus", "--gpus", gpus)
    experiment = experiment or "sweep-%s-%s" % (framework, default_run_name())
    counts = check_counts(flag, counts or [])
    jobs = [
        service.prepare(
            _request(
                site,
                trainer,
                framework=framework,
                partition=partition,
                time=time,
                account=account,
                image=image,
                output=output,
                experiment=experiment,
                requeue=requeue,
                run_name=name,
                allow_large=allow_large,
                include_suspect_nodes=include_suspect_nodes,
                preflight=preflight,
                spare_nodes=spare_nodes,
                **{key: count},
            ),
            dry_run=dry_run,
        )
        for count in counts
        for name in (repeat_names("%s%04d" % (key[0], count), repeat) if repeat > 1 else ["%s%04d" % (key[0], count)])
    ]
    summary = "%d runs: %d counts x %d repeats (--repeat %d)" % (len(jobs), len(counts), repeat, repeat)
    return _prepared(jobs, dry_run, summary if repeat > 1 else "", budget=budget)


@api_function
def prepare_rerun(
    result: Any,
    *,
    site: str,
    nodes: Optional[int] = None,
    gpus: Optional[int] = None,
    data: Optional[str] = None,
    output: Optional[str] = None,
    dry_run: bool = False,
    allow_large: bool = False,
) -> Prepared:
    """`rerun`'s job rendered and checked, nothing written, with its `parent` and what differs from it
    (dlaunch/runs/rerun.py): `submit` submits it."""
    from dlaunch.runs.rerun import prepare_rerun as rerun_of

    rerun = rerun_of(Path(result), site, nodes, gpus, dry_run, output, data, allow_large)
    return _prepared([rerun.job], dry_run, parent=rerun.parent, differences=rerun.differences)


def _silent(line: str) -> None:
    """Says nothing: the API's callers hear about the jobs through what `submit` returns."""


@api_function
def submit(
    prepared: Prepared, *, say: Optional[Callable[[str], None]] = None, show_progress: bool = False
) -> List[Job]:
    """Submit the jobs `prepare`, `prepare_sweep` or `prepare_rerun` rendered, under the run service's one rule (every
    run directory checked free first; a refusal stops the rest and raises DlaunchError with exit code 1): the jobs as
    submitted (their job ids; a job run here, to its end: its exit code). `say` hears about each submission;
    `show_progress`: a job that runs here shows its progress on stdout as `dlaunch watch` does (the command line's)."""
    from dlaunch.runs import service

    rendered: Optional[Tuple[service.Prepared, ...]] = getattr(prepared, RENDERED, None)
    if prepared.dry_run:
        raise DlaunchError("submit: these jobs were prepared as a dry run (prepare them with dry_run=False)")
    if rendered is None:
        raise DlaunchError("submit: give the Prepared that prepare, prepare_sweep or prepare_rerun returned")
    done = service.submit_all(rendered, say or _silent, show_progress)
    return [job_of(job, run, code) for job, run, code in zip(rendered, done.runs, done.codes)]


def _delivered(prepared: Prepared) -> List[Job]:
    """A dry run's jobs as rendered, else as submitted (a job run here: to its end, without showing its progress)."""
    return prepared.jobs if prepared.dry_run else submit(prepared)


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
    output: Optional[str] = None,
    experiment: Optional[str] = None,
    run_name: Optional[str] = None,
    repeat: int = 1,
    requeue: Optional[bool] = None,
    resume: Optional[str] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    budget: Optional[float] = None,
    include_suspect_nodes: bool = False,
    preflight: bool = False,
    spare_nodes: int = 0,
    **trainer: Any,
) -> List[Job]:
    """Render a job for a site and submit it, or run it here to its end (`site="local"`); with `dry_run`
    render it only. `repeat` N: N runs of the request (RUN_NAME-r1..-rN); `resume`: a run directory again
    from its checkpoint (every other option from its plan.json); `budget`: node-hours the time limits may come to.
    Trainer flags as keyword arguments."""
    return _delivered(
        prepare(
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
            budget=budget,
            include_suspect_nodes=include_suspect_nodes,
            preflight=preflight,
            spare_nodes=spare_nodes,
            **trainer,
        )
    )


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
    output: Optional[str] = None,
    experiment: Optional[str] = None,
    repeat: int = 1,
    requeue: Optional[bool] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    budget: Optional[float] = None,
    include_suspect_nodes: bool = False,
    preflight: bool = False,
    spare_nodes: int = 0,
    **trainer: Any,
) -> List[Job]:
    """One job per node count (`nodes=[1, 2, 4]`) or GPU count (`gpus=...`), grouped as one experiment
    (runs n0001, n0002, ... or g0001, ...); `repeat` N: N runs of each (n0001-r1 ... n0001-rN)."""
    return _delivered(
        prepare_sweep(
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
            repeat=repeat,
            requeue=requeue,
            dry_run=dry_run,
            allow_large=allow_large,
            budget=budget,
            include_suspect_nodes=include_suspect_nodes,
            preflight=preflight,
            spare_nodes=spare_nodes,
            **trainer,
        )
    )


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
    output: Optional[str] = None,
    dry_run: bool = False,
    allow_large: bool = False,
) -> Rerun:
    """A result (metrics file, run directory, or ARCHIVE.tar.gz:RUN of `archive`'s bundle) run again on `site`: its
    request resolved there, submitted (or rendered only with `dry_run`), with what differs from the parent."""
    prepared = prepare_rerun(
        result, site=site, nodes=nodes, gpus=gpus, data=data, output=output, dry_run=dry_run, allow_large=allow_large
    )
    (job,) = _delivered(prepared)
    return Rerun(prepared.parent or "", prepared.differences, job)
