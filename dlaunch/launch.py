"""The two steps of `run`, `sweep` and `rerun` (and of `study run`'s jobs): prepare (the request resolved against its
site, checked and rendered; nothing written) and submit (dlaunch/runs/service.py's one rule). The Python API's
`run` and `sweep` (dlaunch/api/launching.py) and the command line stand on them; this module stays small, as the
command line's start-up for `run` goes through it (no API types are made here).
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Sequence, Tuple

from dlaunch.boundary import check_limit
from dlaunch.errors import DlaunchError

if TYPE_CHECKING:
    from dlaunch.runs.rerun import Rerun
    from dlaunch.runs.service import Prepared, Submitted

Trainer = Tuple[Tuple[str, Any], ...]  # (trainer flag name, value): the flags set, as LaunchRequest holds them


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


def _request(site: Optional[str], trainer: Trainer, **settings: Any) -> Any:
    from dlaunch.jobs.request import LaunchRequest

    return LaunchRequest(site=site, trainer=trainer, **settings)  # type: ignore[arg-type]


def prepare_run(
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
    trainer: Trainer = (),
    include_suspect_nodes: bool = False,
) -> List["Prepared"]:
    """The jobs `run` makes, rendered and checked, nothing written (the command line's first step); the site's suspect
    nodes left out (dlaunch/runs/suspects.py) unless `include_suspect_nodes`."""
    from dlaunch.runs import service

    if repeat < 1:  # the command line's option (typer) says it so
        raise DlaunchError("Invalid value for '--repeat': Input should be greater than or equal to 1")
    check_limit("--repeat", repeat, "repeats", allow_large)
    if repeat > 1 and resume is not None:
        raise DlaunchError("--repeat: not with --resume (resume each run directory on its own)")
    if resume is not None:
        return [service.resume(Path(resume), dry_run, allow_large, include_suspect_nodes)]
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
    )
    if repeat == 1:
        return [service.prepare(request, dry_run=dry_run)]
    from dlaunch.runs.repeat import repeat_requests

    return [service.prepare(r, dry_run=dry_run) for r in repeat_requests(request, repeat)]


def check_counts(flag: str, counts: Sequence[int]) -> List[int]:
    """A sweep's node or GPU counts: positive, each once."""
    counts = list(counts)
    if not counts or any(isinstance(c, bool) or not isinstance(c, int) for c in counts) or min(counts) < 1:
        raise DlaunchError("%s: give positive counts, e.g. 1,2,4" % flag)
    if len(set(counts)) != len(counts):
        raise DlaunchError("%s: %s lists a count twice" % (flag, ",".join(map(str, counts))))
    return counts


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
    output: str = "runs",
    experiment: Optional[str] = None,
    requeue: Optional[bool] = None,
    dry_run: bool = False,
    allow_large: bool = False,
    trainer: Trainer = (),
    include_suspect_nodes: bool = False,
) -> List["Prepared"]:
    """The jobs `sweep` makes, rendered and checked, nothing written (the command line's first step)."""
    from dlaunch.runs import service
    from dlaunch.runs.rundir import default_run_name

    if (nodes is None) == (gpus is None):
        raise DlaunchError("--nodes/--gpus: give exactly one list of counts")
    key, flag, counts = ("nodes", "--nodes", nodes) if nodes is not None else ("gpus", "--gpus", gpus)
    experiment = experiment or "sweep-%s-%s" % (framework, default_run_name())
    return [
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
                run_name="%s%04d" % (key[0], count),
                allow_large=allow_large,
                include_suspect_nodes=include_suspect_nodes,
                **{key: count},
            ),
            dry_run=dry_run,
        )
        for count in check_counts(flag, counts or [])
    ]


def prepare_rerun(
    result: str,
    site: str,
    *,
    nodes: Optional[int] = None,
    gpus: Optional[int] = None,
    data: Optional[str] = None,
    output: str = "runs",
    dry_run: bool = False,
    allow_large: bool = False,
) -> "Rerun":
    """A result (metrics file, run directory, ARCHIVE.tar.gz:RUN) as a job on `site`, rendered and checked, nothing
    written, with what differs from it (`rerun`'s first step; dlaunch/runs/rerun.py)."""
    from dlaunch.runs.rerun import prepare_rerun as rerun_of

    return rerun_of(Path(result), site, nodes, gpus, dry_run, output, data, allow_large)


def submit(
    jobs: Sequence["Prepared"], say: Callable[[str], None] = lambda line: None, show_progress: bool = False
) -> "Submitted":
    """Submit prepared jobs under the run service's one rule (a refusal raises SchedulerError, exit code 1);
    `say` hears about each. A foreground job runs here to its end, its progress shown on stdout only with
    `show_progress` (the command line's live view)."""
    from dlaunch.runs import service

    return service.submit_all(jobs, say, show_progress)
