"""Suspect nodes, per site (issue 44): the nodes a run named when it ended badly, left out of the site's next jobs.

A run that ended `hung` names its silent processes' nodes (its hang record, dlaunch/runs/hangs.py); each goes into
the site's record with the reason, the run and the date when dlaunch first sees the run ended (`status`, `watch`,
`run --follow`: runstate.observe). A run's pre-flight (`--preflight`, dlaunch/runs/nodechecks.py) names the nodes
whose own check failed; they go in as soon as dlaunch sees its record. `run`, `sweep`, `study run` and `run --resume` leave the site's suspect nodes
out (a scheduler that can: Slurm's `--exclude`, rendered by dlaunch/schedulers/slurm.py) unless
`--include-suspect-nodes`; `dlaunch nodes list|clear --site S [NODE...]` shows and clears the record. Evidence only:
a node is recorded because a run's own record names it, never guessed (ezpz's guessed swaps retired healthy nodes).

The record: one JSON file per site in the suspect-node folder ($DLAUNCH_SUSPECT_NODES, else `suspect-nodes/` beside
the results database: runs/suspect-nodes/SITE.json), schema "dlaunch.suspect-nodes" version 1:
{"schema", "version", "site", "nodes": [{"node", "reason", "run", "date"}]}, one entry per node and run, replaced
atomically (dlaunch/atomic.py) under a lock on `SITE.json.lock`, so two commands that see runs end at once both add.
"""

import contextlib
import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

from dlaunch.atomic import write_atomic
from dlaunch.boundary import check_name, check_node_name, display_path, parse_json, read_text
from dlaunch.errors import DlaunchError
from dlaunch.paths import DEFAULT_RESULTS_DB, RESULTS_DB_ENV
from dlaunch.train.heartbeat import at_step

SCHEMA, VERSION = "dlaunch.suspect-nodes", 1
FOLDER_ENV = "DLAUNCH_SUSPECT_NODES"
INCLUDE_FLAG = "--include-suspect-nodes"


@dataclass(frozen=True)
class Suspect:
    node: str
    reason: str  # e.g. 'hung: rank 1 (local rank 1) silent at step 40, phase backward (no heartbeat for 62 s)'
    run: str  # the run directory (absolute)
    date: str  # when it was recorded, UTC, ISO 8601

    def to_dict(self) -> Dict[str, str]:
        return asdict(self)


def folder() -> Path:
    """Where the sites' records are: $DLAUNCH_SUSPECT_NODES, else beside the results database."""
    chosen = os.environ.get(FOLDER_ENV)
    database = Path(os.environ.get(RESULTS_DB_ENV) or DEFAULT_RESULTS_DB)
    return Path(chosen) if chosen else database.parent / "suspect-nodes"


def record_path(site: str) -> Path:
    return folder() / ("%s.json" % check_name("--site", site))


def _entry(item: Any, shown: str) -> Suspect:
    if not isinstance(item, dict) or set(item) != {"node", "reason", "run", "date"}:
        raise DlaunchError("%s: an entry of nodes is not {node, reason, run, date}" % shown)
    if not all(isinstance(v, str) for v in item.values()):
        raise DlaunchError("%s: an entry of nodes has a value that is not text" % shown)
    check_node_name("%s: node" % shown, item["node"])
    return Suspect(**item)


def read(site: str) -> List[Suspect]:
    """The site's suspect nodes, oldest first ([] without a record); a file that is not one: DlaunchError naming it."""
    path = record_path(site)
    if not path.exists():
        return []
    shown = display_path(path)
    data = parse_json(read_text(path), shown)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise DlaunchError("%s: not a %s file of version %d" % (shown, SCHEMA, VERSION))
    if not isinstance(data.get("nodes"), list):
        raise DlaunchError("%s: field 'nodes' is not a list" % shown)
    return [_entry(item, shown) for item in data["nodes"]]


def nodes(site: str) -> List[str]:
    """The site's suspect nodes' names, each once, sorted."""
    return sorted({s.node for s in read(site)})


@contextlib.contextmanager
def _locked(site: str) -> Iterator[None]:
    path = record_path(site)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write(site: str, entries: List[Suspect]) -> None:
    record = {"schema": SCHEMA, "version": VERSION, "site": site, "nodes": [e.to_dict() for e in entries]}
    write_atomic(record_path(site), json.dumps(record, indent=1) + "\n")


def add(site: str, found: Sequence[Suspect]) -> List[Suspect]:
    """Add entries to the site's record (one per node and run: seen again, nothing changes); the ones added."""
    with _locked(site):
        entries = read(site)
        known = {(e.node, e.run) for e in entries}
        added = [e for e in found if (e.node, e.run) not in known]
        if added:
            _write(site, entries + added)
        return added


def clear(site: str, names: Sequence[str] = ()) -> List[Suspect]:
    """Remove `names` (all nodes when none is given) from the site's record; the entries removed. A name the record
    does not hold: DlaunchError, nothing removed."""
    for name in names:
        check_node_name("NODE", name)
    with _locked(site):
        entries = read(site)
        unknown = sorted(set(names) - {e.node for e in entries})
        if unknown:
            raise DlaunchError(
                "NODE: %s is not a suspect node of site %s (`dlaunch nodes list --site %s`)" % (unknown[0], site, site)
            )
        removed = [e for e in entries if not names or e.node in names]
        if removed:
            _write(site, [e for e in entries if e not in removed])
        return removed


def today(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def from_hang(run_dir: Path, record: Dict[str, Any], now: float) -> List[Suspect]:
    """The suspect entries a hang record gives: one per node of a silent process (a node name that is not one,
    from a damaged record, is left out)."""
    found: Dict[str, List[str]] = {}
    for silent in record["silent"]:
        host = silent.get("host")
        try:
            check_node_name("hang.json: host", host if isinstance(host, str) else "")
        except DlaunchError:
            continue
        found.setdefault(host, []).append(
            "rank %s (local rank %s) silent %s, phase %s (%s)"
            % (
                silent["rank"],
                silent.get("local_rank"),
                at_step(silent.get("step")),
                silent.get("phase"),
                silent["why"],
            )
        )
    return [Suspect(host, "hung: " + "; ".join(why), str(run_dir.resolve()), today(now)) for host, why in found.items()]


def from_preflight(run_dir: Path, record: Dict[str, Any], now: float) -> List[Suspect]:
    """The suspect entries a pre-flight record gives: one per node it left out, with its check's reasons (a node name
    that is not one is left out)."""
    found = []
    for left in record["left_out"]:
        try:
            check_node_name("preflight.json: host", left["host"])
        except DlaunchError:
            continue
        reason = "pre-flight: " + "; ".join(str(r) for r in left["reasons"])
        found.append(Suspect(left["host"], reason, str(run_dir.resolve()), today(now)))
    return found


def describe(entries: Sequence[Suspect]) -> str:
    """'dl-node2 (hung in runs/e/r, 2026-11-27)' per node, for the note of a job that leaves them out."""
    latest: Dict[str, Suspect] = {}
    for e in entries:
        latest[e.node] = e
    return ", ".join(
        "%s (%s in %s, %s)" % (node, e.reason.split(":")[0], display_path(Path(e.run)), e.date[:10])
        for node, e in sorted(latest.items())
    )
