"""`dlaunch archive EXPERIMENT -o FILE.tar.gz`: an experiment's or study's files bundled with a sha256 manifest
(dlaunch/runs/archive.py)."""
from pathlib import Path
from typing import Annotated

import typer

from dlaunch.boundary import display_path, escape
from dlaunch.cli.terminal import err, out
from dlaunch.runs.archive import MANIFEST, runs_without_profile, write_archive
from dlaunch.runs.rundir import SITE_PROFILE


def archive_command(
    experiment: Annotated[Path, typer.Argument(help="experiment or study directory")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the bundle, FILE.tar.gz")],
) -> int:
    """Bundle an experiment's scripts, plans, profiles, metrics, logs and report with a sha256 manifest."""
    manifest = write_archive(experiment, output)
    size = sum(int(entry["bytes"]) for entry in manifest.values())
    out.print("wrote %s: %d files, %d bytes before compression, manifest %s/%s"
              % (display_path(output), len(manifest), size, escape(experiment.resolve().name), MANIFEST), markup=False, highlight=False)
    without = runs_without_profile(experiment)
    if without:
        err.print("note: %d run(s) without %s (submitted before dlaunch kept the profile a job was made from): "
                  "no profile of theirs in the bundle, e.g. %s" % (len(without), SITE_PROFILE, display_path(without[0].path)),
                  markup=False, highlight=False)
    return 0
