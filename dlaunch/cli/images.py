"""`dlaunch images`: the container images per stack, framework image and architecture, or their definition files
written anew (--render)."""

from typing import Annotated, Optional

import typer

from dlaunch.boundary import escape
from dlaunch.cli.terminal import Json, complete_site, out, print_json

IMAGES_HEADERS = ("image", "sites", "built", "pins from", "pins")
IMAGES_LEAVE_OUT = ("pins from", "sites", "pins")


def images(
    site: Annotated[
        Optional[str],
        typer.Option(
            "--site", help="Only the images this site uses (name, alias or file).", autocompletion=complete_site
        ),
    ] = None,
    render: Annotated[
        bool, typer.Option("--render", help="Regenerate containers/<stack>/<image>.def from containers/versions.toml.")
    ] = False,
    as_json: Json = False,
) -> int:
    """List the container images (per stack, framework image and architecture), the sites using them, whether they are built and their pins."""
    from rich.console import Console

    from dlaunch import api
    from dlaunch.jobs.imagepaths import images_dir
    from dlaunch.jobs.images import container_binary
    from dlaunch.tables import fit_table

    if render:
        for path in api.render_images():
            out.print("wrote %s" % path, highlight=False)
        return 0
    found = api.images(site)
    if as_json:
        print_json(found)
        return 0
    title = "dlaunch images in %s%s" % (
        images_dir(),
        "" if container_binary() else " (no apptainer/singularity on PATH)",
    )
    # The image name is <stack>-<image group>-<arch>: no separate columns for them (80 columns). Every
    # pin is one word: the table wraps between pins, never inside a version (dlaunch/tables.py).
    rows = [
        (
            i.image,
            ", ".join(i.sites) or "-",
            ", ".join(i.built) or "missing",
            i.pins_from,
            " ".join(escape("%s=%s" % pin) for pin in i.pins.items()),
        )
        for i in found
    ]
    console = Console(soft_wrap=True, markup=False)  # its width from $COLUMNS now
    console.print(fit_table(title, IMAGES_HEADERS, rows, console.width, leave_out=IMAGES_LEAVE_OUT))
    console.print("image: NAME.sif (Apptainer) or NAME/ (unpacked root fs, Charliecloud)", highlight=False)
    return 0
