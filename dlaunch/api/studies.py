"""`study_list`, `study`, `study_check`, `study_status`: the study files there are; a study's jobs for a site, rendered or
submitted; its runs' status."""

import warnings
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

from dlaunch.api.calls import api_function
from dlaunch.api.launching import cost_record, counted_warnings, job_of
from dlaunch.api.observing import statuses_of
from dlaunch.api.records import Job, RunStatus, StudyCheck, StudyListing, StudyPlan
from dlaunch.boundary import escape
from dlaunch.errors import DlaunchError, DlaunchNote, DlaunchWarning


@api_function
def study_list() -> List[StudyListing]:
    """The study files found ($DLAUNCH_STUDIES_DIR's, then the shipped ones), by name: kind, protocols (the default
    first) and the jobs each runs; an unreadable one says why."""
    from dlaunch.errors import DlaunchError
    from dlaunch.runs.studyfile import available_studies, load_study

    found = []
    for name, path in available_studies().items():
        try:
            study = load_study(path)
        except DlaunchError as e:
            found.append(StudyListing(name, str(path), unreadable=str(e)))
            continue
        protocols = sorted(study.protocol, key=lambda p: p != study.default_protocol)
        found.append(
            StudyListing(
                study.name,
                str(path),
                study.kind,
                study.gpu_vendor,
                protocols,
                {p: study.job_count(p) for p in protocols} if protocols else {"": study.job_count(None)},
                study.description,
            )
        )
    return found


@api_function
def study(
    name_or_path: Any,
    *,
    site: str,
    output: Any = None,
    dry_run: bool = False,
    list_only: bool = False,
    only: Sequence[str] = (),
    data: Sequence[str] = (),
    account: Optional[str] = None,
    image: Optional[str] = None,
    protocol: Optional[str] = None,
    stack: Optional[str] = None,
    allow_large: bool = False,
    budget: Optional[float] = None,
    preflight: bool = False,
    spare_nodes: int = 0,
    include_suspect_nodes: bool = False,
    planned: Optional[Callable[[StudyPlan], None]] = None,
    say: Callable[[str], None] = lambda line: None,
    show_progress: bool = False,
) -> List[Job]:
    """A study's jobs for `site` that are missing or failed, rendered and submitted into OUTPUT/<study name> (a
    study name, shipped or in $DLAUNCH_STUDIES_DIR, or a study file; OUTPUT: `output`, else the site's runs_dir, else
    ./runs); with `dry_run` (or `list_only`, whose jobs the command line prints one line each: `label`, nodes,
    processes) rendered only. Warnings about its data and jobs are DlaunchWarnings, each said once; the jobs left
    alone (ended ok, still active) a DlaunchNote. `budget`: node-hours the jobs' time limits may come to (more is
    refused, a dry run too). `preflight`, `spare_nodes`: every job's nodes checked before training, as `run`'s; the site's suspect nodes
    (dlaunch/runs/suspects.py) left out unless `include_suspect_nodes`. `planned` hears the StudyPlan (with the cost) before anything is submitted, `say` each
    submission; `show_progress`: a job run here shows its progress on stdout (the command line's live view)."""
    from dlaunch.runs.cost import check_budget
    from dlaunch.runs.study import prepare_study, submit_study
    from dlaunch.runs.studyfile import find_study

    dry_run = dry_run or list_only
    prepared = prepare_study(
        find_study(str(name_or_path)),
        site,
        None if output is None else Path(output),
        dry_run,
        only,
        data,
        account,
        image,
        protocol,
        stack,
        allow_large,
        preflight,
        spare_nodes,
        include_suspect_nodes,
    )
    counted = counted_warnings([*prepared.warnings, *(line for _, job in prepared.jobs for line in job.warnings)])
    for line in counted:
        warnings.warn(escape(line), DlaunchWarning, stacklevel=3)
    if prepared.ended_ok or prepared.active:
        warnings.warn("study %s: %s" % (prepared.study.name, prepared.summary), DlaunchNote, stacklevel=3)
    check_budget(prepared.cost, budget)
    jobs = [job_of(job, label=item.label) for item, job in prepared.jobs]
    if planned is not None:
        planned(
            StudyPlan(
                prepared.study.name,
                prepared.site,
                prepared.summary,
                prepared.design,
                counted,
                jobs,
                cost_record(prepared.cost),
            )
        )
    if dry_run:
        return jobs
    submitted = submit_study(prepared, say, show_progress)
    return [
        job_of(job, run, code, item.label)
        for (item, job), run, code in zip(prepared.jobs, submitted.runs, submitted.codes)
    ]


@api_function
def study_check(
    name_or_path: Any, *, sites: Sequence[str] = (), protocol: Optional[str] = None, stack: Optional[str] = None
) -> List[StudyCheck]:
    """Render every job of a study for each of `sites` (default: every shipped site, those not of the study's kind
    skipped) as `dlaunch study check` does: per site the jobs that cannot run there and why."""
    from dlaunch.runs.study import check_study
    from dlaunch.runs.studyfile import find_study

    return [
        StudyCheck(r.site, r.jobs, [[label, why] for label, why in r.failures], r.skipped)
        for r in check_study(find_study(str(name_or_path)), sites, protocol, stack)
    ]


@api_function
def study_status(folder: Any) -> List[RunStatus]:
    """The runs of a study directory (OUTPUT/<study name>), as `status` gives them (none before its first run was
    submitted); a folder that does not exist is a DlaunchError."""
    from dlaunch.runs.rundir import find_runs

    if not Path(folder).is_dir():
        raise DlaunchError("%s: no such study directory" % escape(str(folder)))
    return statuses_of(find_runs([Path(folder)]))
