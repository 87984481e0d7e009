"""A study run: its matrix expanded into jobs for a site, rendered and submitted through the run service
(dlaunch/runs/service.py) into one study directory (`OUTPUT/<study name>/<matrix name>/<run name>`), its runs, its
published comparisons, and the check of its jobs against a site. The study file's schema: dlaunch/runs/studyfile.py;
the `dlaunch study` commands: dlaunch/cli/study.py; the API's `study`: dlaunch/api/studies.py.

Run names are deterministic, so a second `study run` finds the runs it made: it leaves those that ended ok or still
run and resubmits (with `--resume`, as `dlaunch run --resume`) those that ended otherwise (`runstate.observe`
decides). The study file is copied into the study directory (`study.toml`) with the site and protocol it runs with
(`study.json`); `study report` reads the comparisons and the study's assumptions from it. `study check` renders
every job for a site (or for every shipped site of the study's kind) and lists those that cannot run there.
GPU counts above one node that a site's nodes do not hold evenly in whole nodes run on the fewest nodes that hold
them evenly (12 GPUs: 3 nodes of 4, or 2 nodes of 6 on 8-GPU nodes).
"""

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from dlaunch.analysis.published import Comparison, compare_published
from dlaunch.boundary import ALLOW_LARGE, LIMITS, display_path, escape, read_json, read_text
from dlaunch.errors import DlaunchError
from dlaunch.jobs.request import LaunchRequest
from dlaunch.paths import PUBLISHED_DIR, SHIPPED_SITES_DIR
from dlaunch.runs import service
from dlaunch.runs.cost import Cost, hours
from dlaunch.runs.rundir import RunDir, find_runs
from dlaunch.runs.studyfile import (
    DIMENSIONS,
    LOADERS,
    STUDY_COPY,
    STUDY_INFO,
    Matrix,
    Study,
    StudyInfo,
    choose_protocol,
    load_study,
    recorded_study,
)
from dlaunch.schedulers import scheduler_for
from dlaunch.tables import counted


@dataclass(frozen=True)
class MatrixRun:
    """One run of a study's matrix: its coordinates and its request (a job once prepared: `StudyJobs`)."""

    matrix: str
    name: str
    coordinates: Dict[str, Any]  # framework, loader, model, gpus|nodes, schedule, repeat
    request: LaunchRequest
    figures: Tuple[str, ...] = ()
    repeats: int = 1

    @property
    def label(self) -> str:
        """matrix, figures and repeat, as the dry run prints them above the job's script."""
        figures = ", ".join(self.figures) or "no figure"
        return "%s/%s: %s, repeat %d of %d" % (
            self.matrix,
            self.name,
            figures,
            self.coordinates["repeat"],
            self.repeats,
        )

    def line(self, nodes: int, per_node: int) -> str:
        """The label and the job's size, as `study run --list` prints it."""
        return "%s; %s, %s" % (self.label, counted(nodes, "node"), counted(nodes * per_node, "GPU"))


def parse_only(only: Sequence[str]) -> Dict[str, List[str]]:
    """`--only key=value` filters: values of one key are alternatives, keys must all match."""
    known = ("matrix", "figure", "repeat") + DIMENSIONS
    filters: Dict[str, List[str]] = {}
    for item in only:
        key, sep, value = item.partition("=")
        if not sep or key not in known or not value:
            raise DlaunchError("--only: %r is not key=value with key one of %s" % (item, ", ".join(known)))
        filters.setdefault(key, []).append(value)
    return filters


def _selected(filters: Dict[str, List[str]], coordinates: Dict[str, Any], figures: Sequence[str]) -> bool:
    for key, values in filters.items():
        if key == "figure":
            if not set(values) & set(figures):
                return False
        elif str(coordinates.get(key)) not in values:
            return False
    return True


def spread_nodes(gpus: int, per_node: int) -> Optional[int]:
    """The fewest nodes that hold `gpus` evenly, where a whole number of full nodes does not (else None:
    `--gpus` alone decides)."""
    if gpus <= per_node or gpus % per_node == 0:
        return None
    return next(n for n in range(-(-gpus // per_node), gpus + 1) if gpus % n == 0 and gpus // n <= per_node)


def merge_recipes(*recipes: Dict[str, Any]) -> Dict[str, Any]:
    """Later recipes win; a run length (`epochs` or `steps`) replaces the other one of an earlier recipe."""
    merged: Dict[str, Any] = {}
    for recipe in recipes:
        for length, other in (("epochs", "steps"), ("steps", "epochs")):
            if length in recipe:
                merged.pop(other, None)
        merged.update(recipe)
    return merged


def _overlays(
    study: Study, m: Matrix, protocol: Optional[str], point: Dict[str, Any]
) -> Tuple[Dict[str, Any], Optional[str]]:
    """(recipe, time) a protocol adds at one point of a matrix block."""
    if protocol is None or m.part is None:
        return {}, None
    overlay = study.protocol[protocol].parts[m.part]
    recipe, time = dict(overlay.recipe), overlay.time
    for at in overlay.at:
        if all(point.get(k) == v for k, v in at.match.items()):
            recipe.update(at.recipe)
            time = at.time or time
    return recipe, time


def _values(seen: Dict[str, List[str]], coordinates: Dict[str, Any], figures: Sequence[str]) -> None:
    """Note each value a job has for an `--only` key (in file order), to name them when a filter matches nothing."""
    for key, value in [*coordinates.items(), *(("figure", figure) for figure in figures)]:
        known = seen.setdefault(key, [])
        if str(value) not in known:
            known.append(str(value))


def expand(
    study: Study,
    site: str,
    output: Path,
    data: Optional[Dict[str, str]] = None,
    account: Optional[str] = None,
    image: Optional[str] = None,
    only: Sequence[str] = (),
    protocol: Optional[str] = None,
    stack: Optional[str] = None,
    allow_large: bool = False,
    preflight: bool = False,
    spare_nodes: int = 0,
    include_suspect_nodes: bool = False,
) -> List[MatrixRun]:
    """Every job of the study's matrix (in file order) that the protocol runs (its `only` points, its `repeats`), as
    requests for `site`; `data`: loader -> path, for the jobs whose recipe names no data; `stack` overrides the
    study's (`site`: the site's own). More than the limit of `study jobs` (a typo's million) is refused as soon as it
    is reached, unless `allow_large`; `--only` filters that leave no job are refused, naming the values there are."""
    from dlaunch.jobs.imagepaths import default_image_for_site
    from dlaunch.jobs.sites import resolve_site

    filters = parse_only(only)
    protocol = choose_protocol(study, protocol)
    resolved = resolve_site(site)
    stack = None if stack == "site" else stack or study.stack
    refused = None if image else stack_refusal(resolved, stack)
    if refused:
        raise DlaunchError("--stack: %s" % refused)
    jobs: List[MatrixRun] = []
    seen: Dict[str, List[str]] = {}
    for m, point, repeats in study.selected(protocol):
        key = m.count_key
        framework, loader, model, count, schedule = point.values()
        extra_recipe, extra_time = _overlays(study, m, protocol, point)
        recipe = merge_recipes(study.recipe, m.recipe, extra_recipe)
        if data and loader in data and "data" not in recipe:
            recipe["data"] = data[loader]
        nodes = (
            spread_nodes(count, resolved.gpus_per_node)
            if key == "gpus" and not scheduler_for(resolved.scheduler.kind).this_machine
            else None
        )
        job_image = image
        if not job_image and stack and resolved.container.containerized:
            job_image = default_image_for_site(resolved, framework, stack)
        for repeat in range(1, repeats + 1):
            coordinates = dict(point, matrix=m.name, repeat=repeat)
            _values(seen, coordinates, m.figures)
            if not _selected(filters, coordinates, m.figures):
                continue
            if len(jobs) == LIMITS["study jobs"] and not allow_large:
                raise DlaunchError(
                    "study %s: more than %d jobs (at matrix %s): pass %s if you mean it"
                    % (study.name, LIMITS["study jobs"], m.name, ALLOW_LARGE)
                )
            name = "%s-%s-%s-%s%04d-%s-r%d" % (framework, loader, model, key[0], count, schedule, repeat)
            trainer = dict(recipe, model=model, loader=loader, schedule=schedule)
            request = LaunchRequest(
                site=site,
                framework=framework,
                partition=m.partition or study.partition,
                time=extra_time or m.time or study.time,
                account=account,
                image=job_image,
                output=str(output),
                experiment="%s.%s" % (study.name, m.name),
                run_name=name,
                trainer=tuple(trainer.items()),
                allow_large=allow_large,
                preflight=preflight,
                spare_nodes=spare_nodes,
                include_suspect_nodes=include_suspect_nodes,
                **{key: count},
                **({"nodes": nodes} if nodes else {}),  # type: ignore[arg-type]  # counts (nodes, gpus) are ints; mypy matches a **dict with every parameter
            )
            jobs.append(MatrixRun(m.name, name, coordinates, request, tuple(m.figures), repeats))
    if not jobs:
        there = "; ".join("%s is one of: %s" % (key, ", ".join(seen.get(key, ["none"]))) for key in filters)
        raise DlaunchError(
            "--only: no job of study %s%s matches %s; %s"
            % (study.name, " (protocol %s)" % protocol if protocol else "", " ".join(only), there)
        )
    return jobs


def study_dir(study: Study, output: Path) -> Path:
    return (output / study.name).resolve()


def _check_recorded(folder: Path, site: str, study: Study, protocol: Optional[str]) -> None:
    """Refuse to add runs of another site or protocol to a study directory (one made before the study had protocols
    ran its plain one)."""
    info = folder / STUDY_INFO
    if not os.path.lexists(info):
        return
    recorded = read_json(info, StudyInfo, follow_links=False)
    if recorded.site != site:
        raise DlaunchError(
            "--site: %s was run on site %s; give another --output to run it on %s"
            % (display_path(folder), escape(recorded.site), site)
        )
    plain = [name for name, p in study.protocol.items() if p.plain]  # the recipe as it was before protocols
    if recorded.protocol is None and protocol in plain:
        return
    if recorded.protocol != protocol:
        as_before = (
            " (or --protocol %s, the design it was run with)" % plain[0] if recorded.protocol is None and plain else ""
        )
        raise DlaunchError(
            "--protocol: %s was run with protocol %s; give another --output to run protocol %s%s"
            % (display_path(folder), escape(str(recorded.protocol)), protocol, as_before)
        )


def _record_study(path: Path, folder: Path, site: str, protocol: Optional[str], stack: Optional[str]) -> None:
    """Copy the study file, the site, protocol and stack into the study directory (first submission only)."""
    from dlaunch.atomic import write_atomic

    if (folder / STUDY_INFO).is_file():
        return
    write_atomic(folder / STUDY_COPY, read_text(path))
    info = {
        "study": load_study(path).name,
        "file": str(path.resolve()),
        "site": site,
        "protocol": protocol,
        "stack": stack,
    }
    write_atomic(folder / STUDY_INFO, json.dumps(info, indent=2) + "\n")


def _datasets(
    study: Study, data: Sequence[str], dry_run: bool, loaders: Sequence[str]
) -> Tuple[Dict[str, str], List[str]]:
    """(loader -> data path, warnings) for the study's [[dataset]]s that jobs of `loaders` read (those whose recipe
    names no data): `--data PATH` (one dataset) or `--data ENV=PATH`, else the datasets' environment variables. A dry
    run needs none: its jobs read `/unset/ENV`, and a warning says what they will read."""
    wanted = [d for d in study.dataset if set(d.loaders) & set(loaders)]
    if not wanted:
        if data:
            raise DlaunchError("--data: the jobs of study %s read the data their recipe names" % study.name)
        return {}, []
    by_env = {d.env: d for d in wanted}
    given: Dict[str, str] = {}
    for item in data:
        env, sep, path = item.partition("=")
        if sep and env in by_env:
            given[env] = path
        elif len(wanted) == 1:
            given[wanted[0].env] = item
        else:
            raise DlaunchError("--data: %r: give ENV=PATH with ENV one of %s" % (item, ", ".join(by_env)))
    paths, warnings = {}, []
    for d in wanted:
        path = given.get(d.env) or os.environ.get(d.env)  # type: ignore[assignment]  # a path still None is refused or replaced just below
        if not path:
            missing = "--data: give the %s (or set $%s)" % (d.description, d.env)
            if not dry_run:
                raise DlaunchError(missing)
            path = "/unset/%s" % d.env
            warnings.append("%s; the dry run's jobs read --data %s" % (missing, path))
        for loader in d.loaders:
            paths[loader] = path
    return paths, warnings  # type: ignore[return-value]  # paths by loader name: a Loader is a str


@dataclass(frozen=True)
class StudyJobs:
    """A study's jobs for a site, rendered (nothing written): those to submit (missing, or ended otherwise than ok:
    resumed from their checkpoint), how many were left alone, and what the user should know."""

    study: Study
    path: Path  # the study file
    folder: Path  # the study directory
    site: str
    protocol: Optional[str]
    stack: Optional[str]  # the image stack it records (None: the site's own)
    jobs: Tuple[Tuple[MatrixRun, service.Prepared], ...]
    cost: Cost  # of the jobs to submit
    ended_ok: int = 0  # jobs left alone: their runs ended ok
    active: int = 0  # jobs left alone: their runs have not ended
    warnings: Tuple[str, ...] = ()  # the study's own, about its data and folder (each job's are its Prepared's)

    @property
    def summary(self) -> str:
        """`3 jobs (left alone: 2 ended ok, 1 still active)`."""
        skipped = ["%d ended ok" % self.ended_ok] * bool(self.ended_ok) + ["%d still active" % self.active] * bool(
            self.active
        )
        return counted(len(self.jobs), "job") + (" (left alone: %s)" % ", ".join(skipped) if skipped else "")

    @property
    def design(self) -> str:
        """The protocol, the stack, the jobs and node-hours per figure and the study's assumptions."""
        return design_summary(self.study, self.protocol, self.cost)


def prepare_study(
    path: Path,
    site: str,
    output: Optional[Path] = None,
    dry_run: bool = False,
    only: Sequence[str] = (),
    data: Sequence[str] = (),
    account: Optional[str] = None,
    image: Optional[str] = None,
    protocol: Optional[str] = None,
    stack: Optional[str] = None,
    allow_large: bool = False,
    preflight: bool = False,
    spare_nodes: int = 0,
    include_suspect_nodes: bool = False,
) -> StudyJobs:
    """Render the jobs of a study that are missing or failed (nothing written), with their cost: the first step of
    `study run`. The study directory is OUTPUT/<study name> (`output`, else the site's runs_dir, else ./runs); one of
    another site or protocol is refused (unless `dry_run`)."""
    from dlaunch.jobs.sites import resolve_site
    from dlaunch.runs.cost import cost_of

    study = load_study(path)
    protocol = choose_protocol(study, protocol)
    resolved = resolve_site(site)
    where, said = service.runs_folder(resolved, None if output is None else str(output), dry_run)
    output = Path(where)
    if not image:  # the study's stack's default images come from the site's images folder
        said += service.images_folder(resolved, dry_run)
    options = (protocol, stack, allow_large, preflight, spare_nodes, include_suspect_nodes)
    jobs = expand(study, site, output, None, account, image, only, *options)
    reading = sorted({job.coordinates["loader"] for job in jobs if job.request.option("data") is None})
    paths, warnings = _datasets(study, data, dry_run, reading)
    if paths:
        jobs = expand(study, site, output, paths, account, image, only, *options)
    folder = study_dir(study, output)
    if not dry_run:
        _check_recorded(folder, site, study, protocol)
    existing = [
        RunDir(folder / j.matrix / j.name) for j in jobs if (folder / j.matrix / j.name / "plan.json").is_file()
    ]
    snapshots = {s.run.path: s for s in service.observe(existing)} if existing else {}
    todo, ok, active = [], 0, 0
    for job in jobs:
        snapshot = snapshots.get(folder / job.matrix / job.name)
        if snapshot is None:
            todo.append((job, False))
        elif snapshot.ok:
            ok += 1
        elif not snapshot.ended:
            active += 1
        else:
            todo.append((job, True))  # ended otherwise than ok: resumed from its checkpoint, if any
    rendered = tuple(
        (
            job,
            service.prepare(
                dataclasses.replace(job.request, resume=resume), run_dir=folder / job.matrix / job.name, dry_run=dry_run
            ),
        )
        for job, resume in todo
    )
    return StudyJobs(
        study,
        Path(path),
        folder,
        site,
        protocol,
        None if stack == "site" else stack or study.stack,
        rendered,
        cost_of([job for _, job in rendered], [job.figures for job, _ in rendered]),
        ok,
        active,
        (*said, *warnings),
    )


def submit_study(
    prepared: StudyJobs, say: Callable[[str], None] = lambda line: None, show_progress: bool = False
) -> service.Submitted:
    """Record the study in its directory (the study file, site, protocol and stack, at its first submission) and
    submit its jobs under the run service's one rule: the second step of `study run`."""
    _record_study(prepared.path, prepared.folder, prepared.site, prepared.protocol, prepared.stack)
    return service.submit_all([job for _, job in prepared.jobs], say, show_progress=show_progress)


def design_summary(study: Study, protocol: Optional[str], cost: Cost) -> str:
    """The protocol, the stack, the jobs per figure (and their node-hours at their time limits), the jobs figures
    share (a figure counts each job that stands for it) and the study's assumptions, as lines of text."""
    lines = [
        "study %s%s%s"
        % (
            study.name,
            ", protocol %s: %s" % (protocol, study.protocol[protocol].description) if protocol else "",
            ", stack %s" % study.stack if study.stack else "",
        )
    ]
    lines += [
        "  %s: %s%s"
        % (f.figure, counted(f.jobs, "job"), ", %s node-hours" % hours(f.node_hours) if cost.node_hours else "")
        for f in cost.figures
    ]
    if cost.shared:
        lines.append(
            "  the figures count %d jobs: %d in all, as one job stands for every figure of its matrix block; shared:"
            % (sum(f.jobs for f in cost.figures), cost.jobs)
        )
        lines += ["    %s: %s" % (", ".join(figures), counted(n, "job")) for figures, n in cost.shared]
    if study.assumptions:
        lines.append("assumptions (unstated in the sources; this study's choice):")
        lines += ["  - %s" % a for a in study.assumptions]
    return "\n".join(lines)


def study_runs(folder: Path) -> List[RunDir]:
    runs = find_runs([folder])
    if not runs:
        raise DlaunchError("%s: no run directories" % folder)
    return runs


def published_comparisons(
    folder: Path,
    include_stragglers: bool = False,
    straggler_threshold: Optional[float] = None,
    include_doubtful: bool = False,
    noise_threshold: Optional[float] = None,
) -> Tuple[Study, List[Comparison], List[str]]:
    """A study directory's study, its published values beside its runs' (the study's `[[compare]]` entries), and the
    lines on its design (protocol, image stack) its report shows. Flagged runs are left out as `report` leaves them
    out (each judged at `straggler_threshold`, else its profile's), unless `include_stragglers`; so are the runs of
    points the quality verdict doubts (at `noise_threshold`), unless `include_doubtful`."""
    from dlaunch.analysis.quality import doubtful_points
    from dlaunch.analysis.scaling import load_runs
    from dlaunch.analysis.stragglers import flagged, unflagged
    from dlaunch.reporting.report import load_profiles

    study = recorded_study(folder)
    info = (
        read_json(folder / STUDY_INFO, StudyInfo, follow_links=False).model_dump()
        if os.path.lexists(folder / STUDY_INFO)
        else {}
    )
    runs = load_runs([str(folder)]).runs
    if not include_stragglers:
        runs = unflagged(runs, flagged(runs, straggler_threshold, load_profiles(runs, None).of))
    if not include_doubtful:
        doubtful = doubtful_points(runs, noise_threshold)
        runs = [r for r in runs if r.path not in doubtful]
    comparisons = [compare_published(c, PUBLISHED_DIR / c.file, runs) for c in study.compare]
    protocol = info.get("protocol")
    design = (
        ["Protocol: %s (%s)" % (protocol, study.protocol[protocol].description)] if protocol in study.protocol else []
    )
    design += ["Image stack: %s" % info["stack"]] if info.get("stack") else []
    return study, comparisons, design


# -- study check --------------------------------------------------------------------------------------
def site_kind(site: Any) -> str:
    return "cpu" if site.gpu_vendor == "none" else "gpu"


def stack_refusal(site: Any, stack: Optional[str]) -> Optional[str]:
    """Why the study's image stack (`stack`: its own or --stack's; None: the site's) has no images for a site,
    said the way a study is fixed (`--stack site`), the same for `study run` and `study check`."""
    from dlaunch.jobs.imagepaths import check_site_stack

    if not stack or not site.container.containerized:
        return None
    try:
        check_site_stack(site, stack)
    except DlaunchError as e:
        return str(e).split(";")[0] + " (--stack site renders it with the site's own, or give --image)"
    return None


def unfit_reason(study: Study, site: Any, stack: Optional[str], named: bool = False) -> Optional[str]:
    """Why a site is not of the study's kind (None: it is): CPU or GPU, the stack, and (`named`: False) the GPU
    vendor the study names. A site named on the command line is judged job by job, as `study run` renders
    them (LUMI-G runs the native loader's jobs of an NVIDIA study with its own stack; DALI's are refused)."""
    if scheduler_for(site.scheduler.kind).this_machine:
        return "this machine (%s), not a cluster" % site.scheduler.kind
    if site_kind(site) != study.kind:
        return "a %s site; the study needs %s nodes" % (site_kind(site), study.kind.upper())
    refused = stack_refusal(site, stack)
    if refused:
        return refused
    if study.gpu_vendor and site.gpu_vendor != study.gpu_vendor and not named:
        return "%s GPUs; the study needs %s GPUs" % (site.gpu_vendor, study.gpu_vendor)
    return None


@dataclass(frozen=True)
class CheckResult:
    site: str
    jobs: int
    failures: Tuple[Tuple[str, str], ...]  # (job label, why it cannot run)
    skipped: Optional[str] = None  # why the site was not checked (not of the study's kind)


def job_nodes(job: MatrixRun, gpus_per_node: int) -> int:
    """The nodes a job of the study asks for on a site with `gpus_per_node`."""
    request = job.request
    return request.nodes or -(-request.gpus // gpus_per_node)  # type: ignore[operator]  # a request without nodes has its gpus


def check_study_on_site(
    study: Study, site: str, protocol: Optional[str], stack: Optional[str], skip_too_small: bool = False
) -> CheckResult:
    """Render every job of `study` for `site` as a dry run does; collect those that cannot run there.
    `skip_too_small`: a site whose largest partition holds fewer nodes than the study's largest job is
    not checked but skipped (the study is larger than the site)."""
    from dlaunch.jobs.sites import resolve_site

    resolved = resolve_site(site)
    try:
        jobs = expand(
            study,
            site,
            Path("/dlaunch-study-check"),
            {loader: "/dlaunch-study-check/data" for loader in LOADERS},
            protocol=protocol,
            stack=stack,
        )
    except DlaunchError as e:
        return CheckResult(resolved.name, 0, (("every job", str(e)),))
    largest = max((job_nodes(job, resolved.gpus_per_node) for job in jobs), default=0)
    capacity = max((p.max_nodes for p in resolved.partitions), default=largest)
    if skip_too_small and largest > capacity:
        return CheckResult(
            resolved.name,
            len(jobs),
            (),
            skipped="too small: the study's largest jobs take %d nodes, the "
            "site's largest partition %d" % (largest, capacity),
        )
    failures = []
    for job in jobs:
        try:
            service.prepare(job.request, run_dir=Path("/dlaunch-study-check") / job.matrix / job.name, dry_run=True)
        except DlaunchError as e:
            failures.append((job.label, str(e)))
    return CheckResult(resolved.name, len(jobs), tuple(failures))


def shipped_sites() -> List[str]:
    return [path.stem for path in sorted(SHIPPED_SITES_DIR.glob("*.toml"))]


def check_study(
    path: Path, sites: Sequence[str] = (), protocol: Optional[str] = None, stack: Optional[str] = None
) -> List[CheckResult]:
    """`study check`: the given sites, or every shipped site (those not of the study's kind skipped)."""
    from dlaunch.jobs.sites import resolve_site

    study = load_study(path)
    protocol = choose_protocol(study, protocol)
    results = []
    for name in sites or shipped_sites():
        site = resolve_site(name)
        reason = unfit_reason(study, site, None if stack == "site" else stack or study.stack, named=bool(sites))
        if reason and not sites:
            results.append(CheckResult(site.name, 0, (), skipped=reason))
        elif reason:
            results.append(CheckResult(site.name, 0, (("every job", reason),)))
        else:
            results.append(check_study_on_site(study, name, protocol, stack, skip_too_small=not sites))
    return results
