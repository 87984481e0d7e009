"""What a submission of several jobs costs, said before it goes out (`sweep`, `run --repeat`, `study run`; the API's
`Prepared.cost` and `StudyPlan.cost`): the node-hours of the jobs' time limits (the most the allocation is charged:
nodes x limit, as Slurm's and PBS's accounting charge whole nodes) and of their expected run time where one is
known, per partition and QOS row, and per published figure a study's jobs stand for (a job that stands for several
figures counts for each: the jobs they share are said). `--budget NODE_HOURS` refuses a plan whose time limits come
to more (`check_budget`), a dry run too.

The expected run time of a job: the median trainer time (`total_time_s`) of the earlier runs of the same request
(site, framework, world size and trainer options) that ended ok in the results database, which `status`, `watch` and
`report` fill from the run directories; else the performance model's prediction (`predicted_seconds`, the hook
`dlaunch predict` fills); else none (said, never guessed). A job that runs on this machine has no time limit."""

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

from dlaunch.errors import DlaunchError
from dlaunch.schedulers import scheduler_for
from dlaunch.specs.schema import parse_time

if TYPE_CHECKING:
    from dlaunch.jobs.sites import Site
    from dlaunch.runs.service import Prepared

Key = Tuple[str, str, int, str]  # site, framework, world size, trainer options (canonical JSON)


@dataclass(frozen=True)
class Queue:
    """One partition/QOS row's share: its jobs, their node-hours at their time limits, the largest job's nodes."""

    name: str  # the profile's row name, with its partition and QOS where they differ from it
    jobs: int
    node_hours: float
    largest_nodes: int


@dataclass(frozen=True)
class Figure:
    """The jobs that stand for one published figure, and their node-hours at their time limits."""

    figure: str
    jobs: int
    node_hours: float


@dataclass(frozen=True)
class Cost:
    jobs: int
    node_hours: Optional[float]  # of the time limits; None: the jobs run on this machine, without a limit
    expected_jobs: int  # the jobs whose run time is expected (earlier runs, the model)
    expected_node_hours: float  # of those jobs' expected run times
    queues: Tuple[Queue, ...]
    figures: Tuple[Figure, ...] = ()
    shared: Tuple[Tuple[Tuple[str, ...], int], ...] = ()  # figures that share jobs, and how many they share
    expected_from: str = ""  # where the expected run times come from


def _seconds(job: "Prepared") -> Optional[int]:
    """The job's time limit (None where it runs on this machine)."""
    if scheduler_for(job.plan.scheduler).this_machine:
        return None
    return parse_time(job.request.time)


def _queue_name(job: "Prepared", sites: Dict[str, "Site"]) -> str:
    """The partition row, with the partition and QOS it renders where they are not its name."""
    from dlaunch.jobs.sites import resolve_site

    name = job.plan.partition
    if name is None:
        return "this machine"
    if job.request.site not in sites:
        sites[job.request.site] = resolve_site(job.request.site)
    row = sites[job.request.site].partition(name)
    said = [
        "partition %s" % row.partition if row.partition and row.partition != name else "",
        "QOS %s" % row.qos if row.qos else "",
    ]
    said = [part for part in said if part]
    return "%s (%s)" % (name, ", ".join(said)) if said else name


def request_key(job: "Prepared") -> Key:
    """The job's request as a finished run's header records it (metrics_schema.abstract_request): its site,
    framework, world size and the trainer options it was given (canonical JSON)."""
    from dlaunch.train.config import parse_config
    from dlaunch.train.framework_table import FRAMEWORKS
    from dlaunch.train.metrics_schema import requested_options

    plan = job.plan
    argv = list(plan.trainer_argv)
    config = parse_config(argv, check_paths=False, engine=FRAMEWORKS[plan.framework].engine).to_dict()
    options = json.loads(json.dumps(requested_options(argv, config), default=str))
    return (plan.site, plan.framework, plan.nodes * plan.nproc_per_node, json.dumps(options, sort_keys=True))


def earlier_run_seconds(db: Path) -> Dict[Key, float]:
    """Request -> the median trainer time of its runs that ended ok, read from the results database `db` without
    writing to it (none there: empty)."""
    if not db.is_file():
        return {}
    times: Dict[Key, List[float]] = {}
    try:
        conn = sqlite3.connect("file:%s?mode=ro" % db.resolve(), uri=True)
        try:
            found = conn.execute(
                "SELECT site, request, total_time_s FROM runs WHERE status = 'ok' AND total_time_s > 0"
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return {}  # not a results database, or one of another schema: no expectation from it
    for site, request, seconds in found:
        try:
            asked = json.loads(request)
            key = (site, asked["framework"], int(asked["world_size"]), json.dumps(asked["options"], sort_keys=True))
        except (ValueError, KeyError, TypeError):
            continue
        times.setdefault(key, []).append(float(seconds))
    return {key: _median(found) for key, found in times.items()}


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def predicted_seconds(job: "Prepared") -> Optional[float]:
    """The performance model's run time for the job, where it predicts one (the hook for `dlaunch predict`'s run
    time; dlaunch/analysis/perfmodel/): None until it does."""
    return None


def cost_of(jobs: Sequence["Prepared"], figures: Sequence[Sequence[str]] = (), db: Optional[Path] = None) -> Cost:
    """The jobs' cost; `figures`: per job, the published figures it stands for (a study's); `db`: the results
    database the expected run times come from (default: $DLAUNCH_RESULTS_DB, else runs/results.sqlite)."""
    from dlaunch.resultsdb.store import db_path

    path = db_path(db)
    earlier = earlier_run_seconds(path)
    sites: Dict[str, Site] = {}
    queues: Dict[str, List[float]] = {}
    largest: Dict[str, int] = {}
    limits: List[Optional[float]] = []
    expected: List[float] = []
    sources: Set[str] = set()
    for job in jobs:
        seconds = _seconds(job)
        hours = None if seconds is None else job.plan.nodes * seconds / 3600
        limits.append(hours)
        queue = _queue_name(job, sites)
        queues.setdefault(queue, []).append(hours or 0.0)
        largest[queue] = max(largest.get(queue, 0), job.plan.nodes)
        run, source = earlier.get(request_key(job)) if earlier else None, "earlier runs of the same request (%s)" % path
        if run is None:
            run, source = predicted_seconds(job), "the performance model"
        if run is not None:
            expected.append(job.plan.nodes * run / 3600)
            sources.add(source)
    by_figure: Dict[str, List[float]] = {}
    together: Dict[Tuple[str, ...], int] = {}
    for hours, named in zip(limits, figures):
        for figure in named or ("no figure",):
            by_figure.setdefault(figure, []).append(hours or 0.0)
        if len(named) > 1:
            together[tuple(named)] = together.get(tuple(named), 0) + 1
    return Cost(
        jobs=len(jobs),
        node_hours=None if any(h is None for h in limits) else sum(h for h in limits if h is not None),
        expected_jobs=len(expected),
        expected_node_hours=sum(expected),
        queues=tuple(Queue(name, len(h), sum(h), largest[name]) for name, h in queues.items()),
        figures=tuple(Figure(name, len(h), sum(h)) for name, h in by_figure.items()),
        shared=tuple(together.items()),
        expected_from="; ".join(sorted(sources)) or "no earlier run of these requests ended ok in %s" % path,
    )


def check_budget(cost: Cost, budget: Optional[float]) -> None:
    """Refuse (exit code 2) jobs whose time limits come to more node-hours than `budget` (--budget)."""
    if budget is None:
        return
    if budget <= 0 or budget != budget:
        raise DlaunchError("--budget: give the node-hours the jobs may take, a number above 0 (got %s)" % budget)
    if cost.node_hours is not None and cost.node_hours > budget:
        rows = ", ".join("%s: %s" % (q.name, hours(q.node_hours)) for q in cost.queues)
        raise DlaunchError(
            "--budget: the %d job(s) take %s node-hours at their time limits (%s), over the budget of %s: "
            "fewer jobs, shorter time limits or a larger --budget"
            % (cost.jobs, hours(cost.node_hours), rows, hours(budget))
        )


def hours(value: float) -> str:
    """Node-hours for people: 53,633; 12.5; 0.25."""
    return "{:,.{}f}".format(value, 0 if value >= 100 else 1 if value >= 10 else 2)
