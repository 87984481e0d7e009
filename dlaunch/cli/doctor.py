"""`dlaunch doctor`: a site's checks before a job (dlaunch/preflight.py), as a table or --json."""

from typing import Annotated

import typer

from dlaunch.cli.terminal import Account, Framework, Image, Json, Partition, complete_site, out, print_json


def doctor(
    site: Annotated[
        str, typer.Option("--site", help="profile name, alias or path to a .toml", autocompletion=complete_site)
    ],
    partition: Partition = None,
    account: Account = None,
    image: Image = None,
    framework: Framework = "ddp",
    as_json: Json = False,
) -> int:
    """Check a site before submitting: scheduler, account, MPI, modules, image, rendezvous, interfaces, GPUs, driver, network.

    Run it on the login node, and inside an allocation (`srun -N2 --ntasks-per-node=1 dlaunch doctor
    --site S`) for the node's checks, pre-flight's check of the node (a GEMM on each GPU, its product
    verified, NVML's reasons) and one all-reduce across the nodes (its transport and bus bandwidth). Exit code 0 when no check fails, 1 when one does, 2 on bad input.
    """
    from dlaunch import api
    from dlaunch.tables import fit_table

    found = api.doctor(site, partition=partition, account=account, image=image, framework=framework)
    if as_json:
        print_json(found)
        return 1 if found.failed else 0
    place = "%s %s" % ("node" if found.on_node else "login node (no compute node checks)", found.host)
    rows = [[c.name, c.outcome, c.detail, c.fix] for c in found.checks]
    out.print(
        fit_table(
            "dlaunch doctor: site %s on %s" % (found.site, place),
            ["check", "result", "found", "fix / why"],
            rows,
            out.width,
        )
    )
    if found.failed:
        out.print("%d check(s) failed: %s" % (len(found.failed), ", ".join(found.failed)), highlight=False)
        return 1
    return 0
