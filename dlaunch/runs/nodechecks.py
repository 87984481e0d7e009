"""A run's pre-flight (issue 44, `--preflight`), as the launcher shows it: the trainer's selection
(dlaunch/train/nodecheck.py) writes `preflight.json` in the run directory; this module reads it for `status`, `watch`
and the suspect-node record.

- `preflight_record`: the run's record (None: the run had no pre-flight, or the file is not one);
- `left_out_lines`: 'pre-flight left out n2: GEMM result wrong on cuda:0: ...' per node it left out, and on which
  nodes the run trains (after a hang's retry: which retry and why); a fabric finding that names no node;
- `too_few_reason`: the line `status` gives as the why of a run that ended before training for lack of healthy nodes;
- `TOO_FEW`: that run's status.
"""

from pathlib import Path
from typing import Any, Dict, List, Optional

from dlaunch.boundary import display_path
from dlaunch.train.heartbeat import read_json
from dlaunch.train.nodecheck import MAX_FILE_BYTES, PREFLIGHT_FILE, PREFLIGHT_SCHEMA, VERSION

TOO_FEW = "too few healthy nodes"  # the status of a run whose pre-flight left fewer healthy nodes than it needs


def preflight_record(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The run's `preflight.json` of a version this launcher reads (None: there is none, or it is not one)."""
    record = read_json(str(run_dir / PREFLIGHT_FILE), MAX_FILE_BYTES)
    if not isinstance(record, dict) or record.get("schema") != PREFLIGHT_SCHEMA:
        return None
    version = record.get("version")
    if not isinstance(version, int) or not 1 <= version <= VERSION:
        return None
    left_out = record.get("left_out")
    if not isinstance(left_out, list) or not all(
        isinstance(n, dict) and isinstance(n.get("host"), str) and isinstance(n.get("reasons"), list) for n in left_out
    ):
        return None
    if not isinstance(record.get("chosen"), list) or not isinstance(record.get("enough"), bool):
        return None
    return record


def _node(left: Dict[str, Any]) -> str:
    return "%s (%s)" % (left["host"], "; ".join(str(r) for r in left["reasons"]))


def left_out_lines(record: Dict[str, Any]) -> List[str]:
    """'pre-flight left out n2 (GEMM result wrong ...); trains on n1' ([] when it left out none); after a hang's
    retry in the job (`retry`): 'retry 1 after a hang left out n1 (named by the hang: ...); trains on n2 from the
    checkpoint', or that no healthy node was left for it."""
    return _choice_lines(record) + _fabric_lines(record)


def _fabric_lines(record: Dict[str, Any]) -> List[str]:
    """What the fabric check (dlaunch/train/fabric.py) found that names no node: a slow pair it cannot attribute, or
    why it measured nothing between 2 nodes or more ([] otherwise)."""
    fabric = record.get("fabric")
    if not isinstance(fabric, dict):
        return []
    if fabric.get("note"):
        return ["pre-flight fabric: %s" % fabric["note"]]
    hosts = record.get("hosts")
    if fabric.get("measured") is False and isinstance(hosts, list) and len(hosts) > 1:
        return ["pre-flight fabric not measured: %s" % fabric.get("why")]
    return []


def _choice_lines(record: Dict[str, Any]) -> List[str]:
    if not record["left_out"]:
        return []
    nodes = ", ".join(_node(n) for n in record["left_out"])
    retry = record.get("retry")
    if isinstance(retry, int) and retry > 0:
        if not record["enough"]:
            return ["retry %d after a hang: too few healthy nodes left (%s); the job ended" % (retry, nodes)]
        return [
            "retry %d after a hang left out %s; trains on %s from the checkpoint"
            % (retry, nodes, ", ".join(record["chosen"]))
        ]
    trains = "; trains on %s" % ", ".join(record["chosen"]) if record["enough"] else ""
    return ["pre-flight left out %s%s" % (nodes, trains)]


def too_few_reason(run_dir: Path, record: Dict[str, Any]) -> str:
    """Why a run whose pre-flight found too few healthy nodes failed: the nodes and why, nothing trained."""
    hosts = record.get("hosts") or []
    healthy = len(hosts) - len(record["left_out"])
    return "%s: %d of the %s node(s) it needs passed pre-flight, nothing trained: %s; %s" % (
        TOO_FEW,
        healthy,
        record.get("needed", "?"),
        ", ".join(_node(n) for n in record["left_out"]),
        display_path(run_dir / PREFLIGHT_FILE),
    )
