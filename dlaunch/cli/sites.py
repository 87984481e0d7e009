"""`dlaunch sites`: the site profiles listed (no sub-command), one shown, checked, or migrated to the current schema."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dlaunch.boundary import display_path, escape
from dlaunch.cli.terminal import Json, command_group, complete_site, err, out, print_json

sites_app = command_group(
    help="Site profiles: list (no sub-command), show, check, migrate.", invoke_without_command=True
)

SITES_HEADERS = ("name", "aliases", "scheduler", "GPUs per node", "container", "description", "file")
# What a user picks a site by comes last: its names, scheduler and GPUs per node; a description is shown
# on one line or not at all (`sites show NAME` prints it).
SITES_LEAVE_OUT = ("description", "file", "container", "GPUs per node", "scheduler", "aliases")


@sites_app.callback()
def sites(ctx: typer.Context, as_json: Json = False) -> None:
    """List the profiles."""
    if ctx.invoked_subcommand is not None:
        return
    from dlaunch import api
    from dlaunch.tables import fit_table

    found = api.sites()
    if as_json:
        return print_json(found)
    rows, unreadable = [], []
    for site in found:
        if site.unreadable is not None:  # listed, not fatal; the reason below the table, whatever the table leaves out
            rows.append(
                (escape(site.name), "", "unreadable", "", "", escape(site.unreadable), display_path(Path(site.file)))
            )
            unreadable.append("%s: unreadable: %s" % (escape(site.name), escape(site.unreadable)))
            continue
        rows.append(
            (
                site.name,
                ", ".join(site.aliases),
                site.scheduler,
                str(site.gpus_per_node),
                site.container,
                escape(site.description),
                display_path(Path(site.file)),
            )
        )
    out.print(fit_table("sites", SITES_HEADERS, rows, out.width, leave_out=SITES_LEAVE_OUT, one_line=("description",)))
    for line in unreadable:
        out.print(line, highlight=False)


@sites_app.command("show")
def sites_show(
    name: Annotated[str, typer.Argument(help="profile name, alias or path", autocompletion=complete_site)],
) -> int:
    """Print one profile, resolved and with defaults filled in; warn when its sources are old."""
    import datetime

    from dlaunch.jobs.sitecheck import age_warnings
    from dlaunch.jobs.sites import resolve_site

    site = resolve_site(name, given_by="sites show NAME")
    out.print_json(site.model_dump_json())
    for warning in age_warnings(site, datetime.date.today()):
        err.print("dlaunch: warning: site %s: %s" % (site.name, warning))
    return 0


@sites_app.command("check")
def sites_check(
    name: Annotated[
        str, typer.Argument(help="profile file, or a profile's name or alias", autocompletion=complete_site)
    ],
) -> int:
    """Validate one profile; warn about the first schema, contradictions, shadowed names, old sources, interpreters and
    folders that are not there."""
    import datetime

    from dlaunch.jobs.sitecheck import check_warnings
    from dlaunch.jobs.sites import load_site, profile_path
    from dlaunch.runs.engines import interpreter_warnings

    path = profile_path(name, given_by="sites check")
    site = load_site(path)
    warnings = check_warnings(path, datetime.date.today()) + interpreter_warnings(site)
    warnings += [problem for field in ("images_dir", "runs_dir") for problem in site.folder(field)[1:] if problem]
    for warning in warnings:
        err.print("dlaunch: warning: %s: %s" % (display_path(path), escape(warning)), highlight=False)
    out.print(
        "%s: ok (site %s%s)" % (display_path(path), site.name, ", %d warning(s)" % len(warnings) if warnings else ""),
        highlight=False,
    )
    return 0


@sites_app.command("migrate")
def sites_migrate(
    path: Annotated[Path, typer.Argument(help="profile file of the first schema")],
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="write here (may be PATH itself) instead of printing")
    ] = None,
) -> int:
    """Rewrite a first-schema profile in the current schema, comments kept (printed, or written with -o)."""
    from dlaunch.atomic import write_atomic
    from dlaunch.boundary import output_file
    from dlaunch.jobs.sitecheck import migrate

    if output is not None:
        output_file("--output", output)
    text, changed = migrate(path)
    if not changed:
        err.print("dlaunch: note: %s is in the current schema already" % display_path(path))
    if output is None:
        out.out(text, end="")
    else:
        write_atomic(output, text)
        err.print("dlaunch: wrote %s" % display_path(output))
    return 0
