"""A run that hangs, as the launcher shows it (issue 44): the trainer's watchdog (dlaunch/train/watchdog.py) writes
per-node heartbeat files while a run runs and `hang.json` when no step finished within the hang timeout (formats:
dlaunch/train/heartbeat.py); this module reads them for `status`, `watch` and the suspect-node record.

- `hang_record`: the run's hang record, whether or not rank 0 lived to write the metrics file's `end` (status `hung`);
- `silent_nodes`: the nodes of the processes the record names as silent (left out of the next jobs: suspects.py);
- `hang_reason`: the line `status` gives as the run's why;
- `node_activity`: per node of a running run, how long ago it last finished a step, from its heartbeat file, so a stall
  shows before the watchdog fires (and where it cannot: a trainer run without one writes no file, and no line shows).
"""

from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional

from dlaunch.boundary import display_path
from dlaunch.train.heartbeat import STALE_INTERVALS, read_hang_record, read_heartbeats

HUNG = "hung"  # the run's status (the metrics file's end status, dlaunch/train/metrics_schema.py)


def hang_record(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The run's `hang.json` (None: there is none, or it is not one)."""
    return read_hang_record(str(run_dir))


def silent_nodes(record: Dict[str, Any]) -> List[str]:
    """The nodes of the processes the hang record names as silent, each once, in the record's order."""
    hosts = [s.get("host") for s in record["silent"]]
    return list(dict.fromkeys(h for h in hosts if isinstance(h, str) and h))


def _process(silent: Dict[str, Any]) -> str:
    """'dl-node2 rank 1 (local rank 1), last step 40, phase backward (no heartbeat for 55 s)'."""
    return "%s rank %s (local rank %s), last step %s, phase %s (%s)" % (
        silent.get("host") or "node unknown",
        silent["rank"],
        silent.get("local_rank"),
        "none" if silent.get("step") is None else silent["step"],
        silent.get("phase") or "unknown",
        silent["why"],
    )


def hang_reason(run_dir: Path, record: Dict[str, Any]) -> str:
    """Why a hung run failed: who was silent, the record's file, and how to go on without its nodes."""
    silent = record["silent"]
    who = "; ".join(_process(s) for s in silent) if silent else record["summary"]
    nodes = silent_nodes(record)
    without = " (leaves out %s)" % ", ".join(nodes) if nodes else ""
    return "hung: no step finished for %.0f s: silent: %s; %s; resume it: dlaunch run --resume %s%s" % (
        record["timeout_s"],
        who,
        display_path(run_dir / "hang.json"),
        display_path(run_dir),
        without,
    )


def ago(seconds: float) -> str:
    """'12 s', '4 min', '2.5 h' (a clock a little ahead of the node's: '0 s')."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return "%.0f s" % seconds
    if seconds < 7200:
        return "%.0f min" % (seconds / 60)
    return "%.1f h" % (seconds / 3600)


STALL_S = 60.0  # no step for this long: a node `watch` shows (the watchdog's own deadline is 180 s or more)


class NodeLine(NamedTuple):
    text: str  # 'dl-node2: last step 40 4 min ago'
    stalled: bool  # no step for STALL_S, or its heartbeat stopped (`watch` shows those only)


def node_activity(run_dir: Path, now: float, since: Optional[float] = None) -> List[NodeLine]:
    """Per node of the run's heartbeat files (by name): 'dl-node2: last step 40 4 min ago', and 'no heartbeat for
    N' where its file is STALE_INTERVALS intervals old (its writer stopped); [] without heartbeat files. Files last
    written before `since` (the latest attempt's start) are an earlier attempt's (a resumed run's other nodes).
    Each line says whether the node stalled: its last step STALL_S old, or its heartbeat stopped (a line per node of
    a healthy run would change every second in `watch` and say nothing)."""
    lines = []
    for host, node in sorted(read_heartbeats(str(run_dir)).items()):
        if since is not None and node["time"] < since:
            continue
        silent = now - node["time"] >= STALE_INTERVALS * node["interval_s"]
        if node["last_step"] is None:  # as of its file, written every interval: say when that was
            text = "%s: no step finished as of its heartbeat %s ago" % (host, ago(now - node["time"]))
            stalled = silent
        else:
            text = "%s: last step %d %s ago" % (host, node["last_step"], ago(now - node["last_step_time"]))
            stalled = silent or now - node["last_step_time"] >= STALL_S
        if silent:
            text += ", no heartbeat for %s" % ago(now - node["time"])
        lines.append(NodeLine(text, stalled))
    return lines
