"""`dlaunch rerun RESULT --site OTHER`: a result turned back into a job on another site, what differs printed, the job
printed (--dry-run) or submitted: the Python API's two steps, `prepare_rerun` and `submit`, as `run`."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dlaunch.cli.terminal import AllowLarge, err, out
from dlaunch.tables import fit_table


def rerun_command(
    result: Annotated[
        Path,
        typer.Argument(
            help="metrics file, run directory, or ARCHIVE.tar.gz:RUN (a run inside `dlaunch archive`'s bundle)"
        ),
    ],
    site: Annotated[str, typer.Option("--site", help="the site to run it on (profile name, alias or path)")],
    nodes: Annotated[Optional[int], typer.Option(min=1, help="nodes (default: the result's GPU count)")] = None,
    gpus: Annotated[Optional[int], typer.Option(min=1, help="GPUs in all (default: the result's)")] = None,
    data: Annotated[
        Optional[str], typer.Option(help="the dataset's path on the new site (default: the result's)")
    ] = None,
    output: Annotated[
        Optional[str],
        typer.Option(
            help="the run goes to OUTPUT/rerun-EXPERIMENT/RUN_NAME (default: the site's runs_dir, else ./runs)"
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the job and the differences; write and submit nothing")
    ] = False,
    allow_large: AllowLarge = False,
) -> int:
    """Rerun a result on another site: its request resolved for the site, the differences printed."""
    from dlaunch import api

    prepared = api.prepare_rerun(
        str(result),
        site=site,
        nodes=nodes,
        gpus=gpus,
        data=data,
        output=output,
        dry_run=dry_run,
        allow_large=allow_large,
    )
    (job,) = prepared.jobs
    for warning in job.warnings:
        err.print("dlaunch: warning: %s" % warning)
    if dry_run:  # stdout is the script alone (`--dry-run > job.sh`); what differs goes to stderr
        out.out(job.script, end="")
    shown = err if dry_run else out
    shown.print(
        fit_table(
            "rerun of %s on %s: what differs" % (prepared.parent, job.site),
            ("attribute", "parent", "rerun"),
            prepared.differences,
            shown.width,
        )
    )
    if dry_run:
        return 0
    (submitted,) = api.submit(prepared, say=err.print, show_progress=True)
    return submitted.exit_code or 0
