"""`dlaunch archive EXPERIMENT -o FILE.tar.gz`: an experiment's or study's files bundled with a sha256 manifest
(the Python API's `archive`; dlaunch/runs/archive.py)."""

from pathlib import Path
from typing import Annotated

import typer

from dlaunch.boundary import display_path, escape
from dlaunch.cli.terminal import err, out
from dlaunch.runs.rundir import SITE_PROFILE


def archive_command(
    experiment: Annotated[Path, typer.Argument(help="experiment or study directory")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the bundle, FILE.tar.gz")],
) -> int:
    """Bundle an experiment's scripts, plans, profiles, metrics, logs and report with a sha256 manifest."""
    from dlaunch import api

    made = api.archive(experiment, output)
    out.print(
        "wrote %s: %d files, %d bytes before compression, manifest %s"
        % (display_path(Path(made.file)), made.files, made.bytes, escape(made.manifest)),
        markup=False,
        highlight=False,
    )
    if made.without_profile:
        err.print(
            "note: %d run(s) without %s (submitted before dlaunch kept the profile a job was made from): "
            "no profile of theirs in the bundle, e.g. %s"
            % (len(made.without_profile), SITE_PROFILE, display_path(Path(made.without_profile[0]))),
            markup=False,
            highlight=False,
        )
    return 0
