"""`dlaunch study run/check/status/report`: a study file's jobs rendered and submitted (dlaunch/runs/study.py), checked
against sites, its runs' state, its report with the published values beside this run's."""
from collections import Counter
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Sequence

import typer

from dlaunch.cli.report import IncludeNetworkMismatches, IncludeStragglers, StragglerThreshold, report_command
from dlaunch.cli.runs import print_statuses
from dlaunch.cli.terminal import AllowLarge, Json, command_group, err, out, show_status
from dlaunch.reporting.document import write_comparison
from dlaunch.runs.study import CheckResult, check_study, prepare_study, published_comparisons, submit_study
from dlaunch.runs.studyfile import Study, available_studies, choose_protocol, find_study, load_study
from dlaunch.tables import counted


def complete_study(incomplete: str) -> List[str]:
    """Study names starting with `incomplete` (TAB after `study run`)."""
    return [name for name in available_studies() if name.startswith(incomplete)]


def print_check(study: Study, protocol: Optional[str], results: Sequence[CheckResult]) -> int:
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


study_app = command_group(help="Studies: a matrix of runs from a study file, its status and its report.", no_args_is_help=True)
ProtocolOption = Annotated[Optional[str], typer.Option("--protocol", help="the study's protocol (run length) to use; default: its default_protocol")]
StackOption = Annotated[Optional[str], typer.Option("--stack", help="image stack of every framework's default image (`site`: the site's own); default: the study's `stack`")]


StudyArg = Annotated[str, typer.Argument(help="study name (shipped, or a file in $DLAUNCH_STUDIES_DIR), or a study file",
                                         autocompletion=complete_study, show_default=False)]


@study_app.command("run")
def study_run_command(
    study: StudyArg,
    site: Annotated[str, typer.Option("--site", help="profile name, alias or path to a .toml")],
    output: Annotated[Path, typer.Option(help="the study directory is OUTPUT/<study name>")] = Path("runs"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print every job's figure, repeat and script (the counts per figure and the study's assumptions on stderr); write and submit nothing")] = False,
    listing: Annotated[bool, typer.Option("--list", help="as --dry-run, one line per job (its figures, repeat, nodes and GPUs) instead of its script")] = False,
    only: Annotated[Optional[List[str]], typer.Option("--only", help="key=value (matrix, figure, framework, loader, model, gpus, nodes, schedule, repeat); repeatable")] = None,
    data: Annotated[Optional[List[str]], typer.Option(help="the dataset a study's [dataset] asks for: PATH, or ENV=PATH per dataset; repeatable")] = None,
    account: Annotated[Optional[str], typer.Option(help="account/budget; default: the site's account variable")] = None,
    image: Annotated[Optional[str], typer.Option(help="container image for every job; default: images/<stack>-<framework>-<arch> per framework")] = None,
    protocol: ProtocolOption = None,
    stack: StackOption = None,
    allow_large: AllowLarge = False,
) -> int:
    """Submit the jobs of a study that are missing or failed (or print them with --dry-run)."""
    dry_run = dry_run or listing
    prepared = prepare_study(find_study(study), site, output, dry_run, only or (), data or (), account, image, protocol,
                             stack, allow_large)
    lines = list(prepared.warnings) + [line for _, job in prepared.jobs for line in job.warnings]
    warnings = Counter("dlaunch: warning: %s" % line for line in lines)  # one line per distinct warning, not per job
    for line, n in sorted(warnings.items()):
        err.print(line if n == 1 else "%s (%d jobs)" % (line, n))
    if dry_run:  # stdout is the scripts (or the list) alone: the counts and notes go to stderr
        for i, (job, rendered) in enumerate(prepared.jobs, 1):
            if listing:
                out.out(job.line(rendered.plan.nodes, rendered.plan.nproc_per_node), highlight=False)
            else:
                out.out("# job %d/%d %s" % (i, len(prepared.jobs), job.label))
                out.out(rendered.script)
        err.out(prepared.design, highlight=False)
        err.out(prepared.summary, highlight=False)
        return 0
    submitted = submit_study(prepared, err.print, show_progress=True)
    failed = sum(bool(code) for code in submitted.codes)
    out.out("study %s: %s submitted%s" % (prepared.study.name, prepared.summary, ", %d failed here" % failed if failed else ""))
    return submitted.exit_code


@study_app.command("check")
def study_check_command(
    study: StudyArg,
    site: Annotated[Optional[List[str]], typer.Option("--site", help="profile name, alias or path; repeatable; default: every shipped site (those not of the study's kind are skipped)")] = None,
    protocol: ProtocolOption = None,
    stack: StackOption = None,
) -> int:
    """Render every job of a study for a site and list those that cannot run there (exit 1 if one cannot)."""
    path = find_study(study)
    loaded = load_study(path)
    return print_check(loaded, choose_protocol(loaded, protocol), check_study(path, site or (), protocol, stack))


@study_app.command("status")
def study_status_command(folder: Annotated[Path, typer.Argument(help="study directory")], as_json: Json = False) -> int:
    """State and figures of every run of a study directory."""
    from dlaunch import api

    found = api.study_status(folder)
    return print_statuses(found) if as_json else show_status(found)


@study_app.command("report")
def study_report_command(
    folder: Annotated[Path, typer.Argument(help="study directory")],
    output: Annotated[Path, typer.Option("--output", "-o", help="folder for report.md and the plots")] = Path("report"),
    include_network_mismatches: IncludeNetworkMismatches = False,
    include_stragglers: IncludeStragglers = False,
    straggler_threshold: StragglerThreshold = None,
) -> int:
    """The study's tables and plots, with the published values beside this run's, its protocol and assumptions."""
    study, comparisons, design = published_comparisons(folder)
    code = 0
    try:
        report_command([folder], output=output, site=None, include_network_mismatches=include_network_mismatches,
                       include_stragglers=include_stragglers, straggler_threshold=straggler_threshold)
    except typer.Exit as e:
        code = e.exit_code
    plot = write_comparison(output, comparisons, study.based_on, design=design, assumptions=study.assumptions)
    if plot is not None:
        out.print("wrote %s" % plot, highlight=False)
    return code
