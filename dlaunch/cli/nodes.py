"""`dlaunch nodes`: a site's suspect nodes (dlaunch/runs/suspects.py), listed or cleared. Outside the Python API, as
`results` is: it reads and writes the record through dlaunch/runs/suspects.py."""

import json
import sys
from typing import Annotated, List, Optional

import typer

from dlaunch.boundary import escape
from dlaunch.cli.terminal import Json, command_group, complete_site, out

nodes_app = command_group(help="Suspect nodes: the nodes a run named when it ended badly, left out of the site's jobs.")

Site = Annotated[
    str, typer.Option("--site", help="profile name, alias or path to a .toml", autocompletion=complete_site)
]
Nodes = Annotated[Optional[List[str]], typer.Argument(help="nodes (default: every one)")]
HEADERS = ("node", "reason", "run", "date")


def _site_name(site: str) -> str:
    from dlaunch.jobs.sites import resolve_site

    return resolve_site(site).name


def _show(entries: list, as_json: bool, title: str) -> None:
    from dlaunch.tables import print_table

    if as_json:
        sys.stdout.write(json.dumps([e.to_dict() for e in entries], indent=2, sort_keys=True) + "\n")
        return
    if entries:
        rows = [tuple(escape(v) for v in (e.node, e.reason, e.run, e.date)) for e in entries]
        print_table(out, title, HEADERS, rows, leave_out=("reason",))


@nodes_app.command("list")
def list_nodes(site: Site, as_json: Json = False) -> None:
    """The site's suspect nodes: node, reason, run, date (one line per node and run)."""
    from dlaunch.runs import suspects

    name = _site_name(site)
    entries = suspects.read(name)
    _show(entries, as_json, "suspect nodes of %s" % name)
    if not entries and not as_json:
        out.print("no suspect nodes of %s" % escape(name), highlight=False)


@nodes_app.command("clear")
def clear_nodes(site: Site, nodes: Nodes = None, as_json: Json = False) -> None:
    """Clear nodes from the site's record (all when none is named): its jobs may run on them again."""
    from dlaunch.runs import suspects

    name = _site_name(site)
    removed = suspects.clear(name, nodes or [])
    if as_json:
        _show(removed, True, "")
        return
    cleared = sorted({e.node for e in removed})
    out.print(
        "cleared %s of %s" % (", ".join(cleared), escape(name)) if cleared else "no suspect nodes of %s" % escape(name),
        highlight=False,
    )
