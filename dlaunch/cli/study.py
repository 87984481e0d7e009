"""`dlaunch study list/run/check/status/report`: the studies there are; a study file's jobs rendered and submitted
(dlaunch/runs/study.py) with their cost, checked against sites, its runs' state, its report with the published values
beside this run's."""

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Dict, List, Optional, Sequence

import typer

from dlaunch.boundary import display_path, escape
from dlaunch.cli.report import (
    IncludeDoubtful,
    IncludeNetworkMismatches,
    IncludeStragglers,
    NoiseThreshold,
    report_command,
)
from dlaunch.cli.run import Budget, IncludeSuspectNodes, Preflight, SpareNodes, cost_lines
from dlaunch.cli.runs import print_statuses, show_found
from dlaunch.cli.terminal import AllowLarge, Json, StragglerThreshold, command_group, err, out, print_json
from dlaunch.errors import DlaunchWarning
from dlaunch.reporting.document import write_comparison
from dlaunch.runs.study import published_comparisons
from dlaunch.runs.studyfile import Study, available_studies, choose_protocol, find_study, load_study
from dlaunch.tables import counted

if TYPE_CHECKING:
    from dlaunch.api import StudyCheck, StudyPlan


def complete_study(incomplete: str) -> List[str]:
    """Study names starting with `incomplete` (TAB after `study run`)."""
    return [name for name in available_studies() if name.startswith(incomplete)]


def print_check(study: Study, protocol: Optional[str], results: Sequence["StudyCheck"]) -> int:
    """One line per site, then per site every reason with the jobs it stops; exit code 1 when a job cannot run."""
    head = "study %s%s" % (study.name, ", protocol %s" % protocol if protocol else "")
    out.out(head)
    for r in results:
        if r.skipped:
            out.out("  %s: skipped (%s)" % (r.site, r.skipped))
        elif r.failures and not r.jobs:
            out.out("  %s: no job can run there" % r.site)
        elif r.failures:
            out.out("  %s: %d of %s cannot run there" % (r.site, len(r.failures), counted(r.jobs, "job")))
        else:
            out.out("  %s: ok (%s)" % (r.site, counted(r.jobs, "job")))
    for r in results:
        reasons: Dict[str, List[str]] = {}
        for label, why in r.failures:
            reasons.setdefault(why, []).append(label)
        for why, labels in reasons.items():
            out.out("%s: %s" % (r.site, why))
            shown = labels[:3] + (["... and %d more" % (len(labels) - 3)] if len(labels) > 3 else [])
            out.out("\n".join("    %s" % label for label in shown))
    return 1 if any(r.failures for r in results) else 0


study_app = command_group(
    help="Studies: list them; a matrix of runs from a study file, its status and its report.", no_args_is_help=True
)
ProtocolOption = Annotated[
    Optional[str],
    typer.Option("--protocol", help="the study's protocol (run length) to use; default: its default_protocol"),
]
StackOption = Annotated[
    Optional[str],
    typer.Option(
        "--stack",
        help="image stack of every framework's default image (`site`: the site's own); default: the study's `stack`",
    ),
]


StudyArg = Annotated[
    str,
    typer.Argument(
        help="study name (shipped, or a file in $DLAUNCH_STUDIES_DIR), or a study file",
        autocompletion=complete_study,
        show_default=False,
    ),
]


STUDIES_HEADERS = ("study", "kind", "protocols", "description", "file")


@study_app.command("list")
def study_list_command(as_json: Json = False) -> int:
    """List the studies: kind, protocols (the default first) with their jobs, description."""
    from dlaunch import api
    from dlaunch.tables import fit_table

    found = api.study_list()
    if as_json:
        print_json(found)
        return 0
    rows, unreadable = [], []
    for s in found:
        if s.unreadable is not None:
            rows.append((escape(s.name), "", "unreadable", escape(s.unreadable), display_path(Path(s.file))))
            unreadable.append("%s: unreadable: %s" % (escape(s.name), escape(s.unreadable)))
            continue
        kind = s.kind + (" (%s)" % s.gpu_vendor if s.gpu_vendor else "")
        protocols = ", ".join(
            "%s (%s%s)" % (name, "default, " if i == 0 else "", counted(jobs, "job")) if name else counted(jobs, "job")
            for i, (name, jobs) in enumerate(s.jobs.items())
        )
        rows.append((s.name, kind, protocols, escape(s.description), display_path(Path(s.file))))
    out.print(
        fit_table(
            "studies", STUDIES_HEADERS, rows, out.width, leave_out=("file", "description"), one_line=("description",)
        )
    )
    for line in unreadable:
        out.print(line, highlight=False)
    return 0


@study_app.command("run")
def study_run_command(
    study: StudyArg,
    site: Annotated[str, typer.Option("--site", help="profile name, alias or path to a .toml")],
    output: Annotated[
        Optional[Path],
        typer.Option(help="the study directory is OUTPUT/<study name> (default: the site's runs_dir, else ./runs)"),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="print every job's figure, repeat and script (the jobs and node-hours per figure, the cost per partition and the study's assumptions on stderr); write and submit nothing",
        ),
    ] = False,
    listing: Annotated[
        bool,
        typer.Option(
            "--list", help="as --dry-run, one line per job (its figures, repeat, nodes and GPUs) instead of its script"
        ),
    ] = False,
    only: Annotated[
        Optional[List[str]],
        typer.Option(
            "--only",
            help="key=value (matrix, figure, framework, loader, model, gpus, nodes, schedule, repeat); repeatable",
        ),
    ] = None,
    data: Annotated[
        Optional[List[str]],
        typer.Option(help="the dataset a study's [dataset] asks for: PATH, or ENV=PATH per dataset; repeatable"),
    ] = None,
    account: Annotated[Optional[str], typer.Option(help="account/budget; default: the site's account variable")] = None,
    image: Annotated[
        Optional[str],
        typer.Option(help="container image for every job; default: images/<stack>-<framework>-<arch> per framework"),
    ] = None,
    protocol: ProtocolOption = None,
    stack: StackOption = None,
    allow_large: AllowLarge = False,
    budget: Budget = None,
    include_suspect_nodes: IncludeSuspectNodes = False,
    preflight: Preflight = False,
    spare_nodes: SpareNodes = 0,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="print the Python API's StudyPlan as JSON (docs/API.md), nothing else: its jobs (with --dry-run or --list their scripts; once submitted, their job ids) and their cost",
        ),
    ] = False,
) -> int:
    """Submit the jobs of a study that are missing or failed (or print them with --dry-run)."""
    import dataclasses

    from dlaunch import api

    dry_run = dry_run or listing
    plans: List[StudyPlan] = []

    def planned(plan: "StudyPlan") -> None:  # before anything is submitted: its warnings, each once, and its cost
        plans.append(plan)
        for line in plan.warnings:
            err.print("dlaunch: warning: %s" % line)
        for line in dict.fromkeys(note for job in plan.jobs for note in job.notes):  # as run's and sweep's
            err.print("dlaunch: note: %s" % line)
        if not dry_run and plan.cost and plan.jobs:
            err.out("\n".join(cost_lines(plan.cost)), highlight=False)

    with warnings.catch_warnings():  # said by `planned`, counted per job
        warnings.simplefilter("ignore", DlaunchWarning)
        jobs = api.study(
            study,
            site=site,
            output=output,
            dry_run=dry_run,
            only=only or (),
            data=data or (),
            account=account,
            image=image,
            protocol=protocol,
            stack=stack,
            allow_large=allow_large,
            budget=budget,
            include_suspect_nodes=include_suspect_nodes,
            preflight=preflight,
            spare_nodes=spare_nodes,
            planned=planned,
            say=err.print,
            show_progress=not as_json,
        )  # stdout: the JSON alone
    (plan,) = plans
    if as_json:
        print_json(dataclasses.replace(plan, jobs=jobs))
        return 0 if dry_run else next((j.exit_code for j in jobs if j.exit_code), 0)
    if dry_run:  # stdout is the scripts (or the list) alone: the counts and notes go to stderr
        for i, job in enumerate(jobs, 1):
            if listing:
                out.out(
                    "%s; %s, %s" % (job.label, counted(job.nodes, "node"), counted(job.processes, "GPU")),
                    highlight=False,
                )
            else:
                out.out("# job %d/%d %s" % (i, len(jobs), job.label))
                out.out(job.script)
        err.out(plan.design, highlight=False)
        if plan.cost and plan.jobs:
            err.out("\n".join(cost_lines(plan.cost)), highlight=False)
        err.out(plan.summary, highlight=False)
        return 0
    failed = sum(bool(job.exit_code) for job in jobs)
    out.out("study %s: %s submitted%s" % (plan.study, plan.summary, ", %d failed here" % failed if failed else ""))
    return next((job.exit_code for job in jobs if job.exit_code), 0)


@study_app.command("check")
def study_check_command(
    study: StudyArg,
    site: Annotated[
        Optional[List[str]],
        typer.Option(
            "--site",
            help="profile name, alias or path; repeatable; default: every shipped site (those not of the study's kind are skipped)",
        ),
    ] = None,
    protocol: ProtocolOption = None,
    stack: StackOption = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="print the Python API's objects as JSON (docs/API.md): a StudyCheck per site, nothing else"
        ),
    ] = False,
) -> int:
    """Render every job of a study for a site and list those that cannot run there (exit 1 if one cannot)."""
    from dlaunch import api

    checked = api.study_check(study, sites=site or (), protocol=protocol, stack=stack)
    if as_json:
        print_json(checked)
        return 1 if any(r.failures for r in checked) else 0
    loaded = load_study(find_study(study))
    return print_check(loaded, choose_protocol(loaded, protocol), checked)


@study_app.command("status")
def study_status_command(folder: Annotated[Path, typer.Argument(help="study directory")], as_json: Json = False) -> int:
    """State and figures of every run of a study directory."""
    from dlaunch import api

    found = api.study_status(folder)
    return print_statuses(found) if as_json else show_found(found, [folder])


@study_app.command("report")
def study_report_command(
    folder: Annotated[Path, typer.Argument(help="study directory")],
    output: Annotated[Path, typer.Option("--output", "-o", help="folder for report.md and the plots")] = Path("report"),
    include_network_mismatches: IncludeNetworkMismatches = False,
    include_stragglers: IncludeStragglers = False,
    straggler_threshold: StragglerThreshold = None,
    include_doubtful: IncludeDoubtful = False,
    noise_threshold: NoiseThreshold = None,
) -> int:
    """The study's tables and plots, with the published values beside this run's, its protocol and assumptions."""
    study, comparisons, design = published_comparisons(
        folder, include_stragglers, straggler_threshold, include_doubtful, noise_threshold
    )
    code = 0
    try:
        report_command(
            [folder],
            output=output,
            site=None,
            include_network_mismatches=include_network_mismatches,
            include_stragglers=include_stragglers,
            straggler_threshold=straggler_threshold,
            include_doubtful=include_doubtful,
            noise_threshold=noise_threshold,
        )
    except typer.Exit as e:
        code = e.exit_code
    plot = write_comparison(output, comparisons, study.based_on, design=design, assumptions=study.assumptions)
    if plot is not None:
        out.print("wrote %s" % plot, highlight=False)
    return code
