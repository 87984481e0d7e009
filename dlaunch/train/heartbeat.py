"""The watchdog's files in a run directory (issue 44), torch-free and stdlib-only: the launcher reads them (`status`,
`watch`), the trainer writes them (dlaunch/train/watchdog.py). Formats:

`heartbeat/<host>.<writer>.json`, one per node, replaced atomically every `interval_s` seconds while the run runs (a
file `interval_s` x STALE_INTERVALS old or older: that node's writer is silent). Written by one process per node (the
lowest-ranked live process of that node, `writer`), from the small state each process of the node keeps in a
node-local folder (a file per process in /dev/shm). Two files of one host appear where the writer changed (its first
writer went silent): `read_heartbeats` merges them, each rank's freshest state winning. Fields (NODE_FIELDS):
- schema "dlaunch.heartbeat", version 1; host; writer (the writing process's rank); time (the write's wall clock,
  time.time()); interval_s;
- last_step, last_step_time: the node's last finished step: the lowest `step` of its ranks and the earliest
  `step_time` among those ranks (a step is finished on a node when every rank there has finished it); null before
  every rank has finished one;
- ranks: one state per process of the node (RANK_FIELDS):
    rank (torchrun's RANK; for the task-per-process engines the task id, DLAUNCH_TASK_ID), local_rank, role ("worker";
    "server", "coordinator" for the parameter-server engines' other tasks), pid;
    heartbeat: the wall clock of the process's heartbeat thread's last write (it writes every second or so whatever the
    training does: a process stuck in a collective still beats; a stopped one, or one whose C code holds the GIL,
    does not);
    step: the run's global step the process last finished (null before its first), step_time: its wall clock;
    epoch: the epoch it is in; phase (PHASES) and phase_since (wall clock); timeout_s: the seconds the process may
    stay in this phase before it calls the run hung (null: no deadline: the watchdog is off, or the process has no
    steps of its own, a parameter server); overdue: it has called the run hung;
    flight_recorder: after a hang, a summary of the process's PyTorch flight recorder (dlaunch/train/flight_recorder.py),
    or "unavailable: <reason>"; absent before.

`hang.json`, written once when the job is found hung, atomically (renamed into place), by the lowest-ranked live
process whose own deadline passed (rank 0 may be the silent one): HANG_FIELDS.
- schema "dlaunch.hang", version 1; time; detected_by {rank, host}; timeout_s (the deadline that passed);
- summary: one line naming the silent process(es) (what the metrics file's `end` record repeats as its `reason`);
- silent: the processes found silent, each {host, rank, local_rank, role, step, epoch, phase, silent_s, stalled_s, why}:
  silent_s the seconds since its last heartbeat, stalled_s since its last finished step (or since it started), why
  "no heartbeat for N s" (stopped, or its GIL held: it runs no Python), "never reported" (no state of it anywhere),
  "behind" (alive but still before a step the others have finished: stuck outside the collectives, e.g. its data),
  "missing from collective N" (the flight recorder's verdict where every process is alive and at the same step);
  empty when no process stands out;
- ranks: every process as the record's writer saw it (RANK_FIELDS, with heartbeat_age_s);
- flight_recorder: the first collective not every rank entered (dlaunch/train/flight_recorder.py's `first_unfinished`):
  {process_group, collective_seq_id, op, input_sizes, input_dtypes, state, entered, missing_ranks, undumped_ranks}, null
  when every collective was entered by all, or "unavailable: <reason>";
- stacks: the stack files present when it was written, relative to the run directory (`hang/stacks.rank<R>.txt`:
  faulthandler's dump of every thread of a live process; each live process adds its own before it exits);
  flight_recorder_dumps: `hang/flight_recorder.rank<R>` (torch's pickled dump, readable by `torchfrtrace --prefix
  flight_recorder.rank <run>/hang`).

The job then ends with exit code 69 (EXIT_HUNG, dlaunch/train/errors.py) and, where rank 0 is alive, the metrics
file's `end` record says `hung` (dlaunch/train/metrics_schema.py version 5).
"""

import json
import math
import os
import re
import tempfile
from typing import Any, Dict, List, Optional

from dlaunch.train.metrics_schema import FileRefused, is_number, open_regular

HEARTBEAT_DIR = "heartbeat"
HANG_FILE = "hang.json"
HANG_DIR = "hang"
NODE_SCHEMA, NODE_VERSION = "dlaunch.heartbeat", 1
HANG_SCHEMA, HANG_VERSION = "dlaunch.hang", 1
# A node file this many intervals old: its writer is silent (it writes every interval_s).
STALE_INTERVALS = 3
MAX_NODE_BYTES = 1024 * 1024
MAX_HANG_BYTES = 4 * 1024 * 1024

# Where a process is. Each step: data (waiting for its batch), forward (compile: the first step's forward under
# --compile), backward (the backward pass and, where the framework does it there, the gradients' all-reduce), sync (a
# framework's wait for its gradients: Horovod, a parameter server's push and pull), optimizer; step where an engine runs
# the whole step in one call (TensorFlow's tf.function, its parameter-server chief's scheduled rounds); every few steps
# the stop check (an all-reduce of the stop signals, or a barrier). Between two
# epochs: epoch boundary (the epoch's closing barrier, the per-rank gather, the records), loader start. Sections with
# an allowance of their own (dlaunch/train/watchdog.py): start-up (process start to the first finished step: the
# process group, the model, the loaders, the first step with its compilation), validation, checkpoint. A process of a
# parameter-server engine that only serves: serving.
PHASES = (
    "start-up",
    "data",
    "compile",
    "forward",
    "backward",
    "sync",
    "optimizer",
    "step",
    "stop check",
    "epoch boundary",
    "loader start",
    "validation",
    "checkpoint",
    "serving",
)
SECTIONS = ("start-up", "validation", "checkpoint")
ROLES = ("worker", "server", "coordinator")

_OPT_NUM = (int, float, type(None))
RANK_FIELDS = {
    "rank": (int,),
    "local_rank": (int,),
    "role": (str,),
    "pid": (int,),
    "heartbeat": (int, float),
    "step": (int, type(None)),
    "step_time": _OPT_NUM,
    "epoch": (int, type(None)),
    "phase": (str,),
    "phase_since": (int, float),
    "timeout_s": _OPT_NUM,
    "overdue": (bool,),
}
NODE_FIELDS = {
    "schema": (str,),
    "version": (int,),
    "host": (str,),
    "writer": (int,),
    "time": (int, float),
    "interval_s": (int, float),
    "last_step": (int, type(None)),
    "last_step_time": _OPT_NUM,
    "ranks": (list,),
}
SILENT_FIELDS = ("host", "rank", "local_rank", "role", "step", "epoch", "phase", "silent_s", "stalled_s", "why")
HANG_FIELDS = {
    "schema": (str,),
    "version": (int,),
    "time": (int, float),
    "detected_by": (dict,),
    "timeout_s": (int, float),
    "summary": (str,),
    "silent": (list,),
    "ranks": (list,),
    "flight_recorder": (dict, str, type(None)),
    "stacks": (list,),
    "flight_recorder_dumps": (list,),
}
_HOST_IN_NAME = re.compile(r"[^A-Za-z0-9._-]")


def at_step(step: Any) -> str:
    """'at step 40', or 'before its first step' (a process's step is None until it finished one)."""
    return "before its first step" if step is None else "at step %s" % step


def node_file_name(host: str, writer: int) -> str:
    """`<host>.<writer>.json` (characters a file name should not hold replaced by `_`)."""
    return "%s.%d.json" % (_HOST_IN_NAME.sub("_", host), writer)


def write_json_atomically(path: str, record: Dict[str, Any]) -> None:
    """`record` as JSON renamed over `path` (readers see the old file or the new one), readable by all (0644)."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def node_record(host: str, writer: int, now: float, interval: float, ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """A node file's content from its processes' states."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    steps = [r["step"] for r in ranks]
    last_step = None if not ranks or None in steps else min(steps)
    last_time = None
    if last_step is not None:
        last_time = min(r["step_time"] for r in ranks if r["step"] == last_step)
    return {
        "schema": NODE_SCHEMA,
        "version": NODE_VERSION,
        "host": host,
        "writer": writer,
        "time": now,
        "interval_s": interval,
        "last_step": last_step,
        "last_step_time": last_time,
        "ranks": ranks,
    }


def _typed(value: Any, types: tuple) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    if is_number(value) and not math.isfinite(value):
        return False
    return isinstance(value, types)


def rank_state_problem(state: Any) -> Optional[str]:
    """Why `state` is no process state (RANK_FIELDS); None when it is one."""
    if not isinstance(state, dict):
        return "a rank's state is not an object"
    for name, types in RANK_FIELDS.items():
        if not _typed(state.get(name), types):
            return "field %r of a rank's state is %r" % (name, state.get(name))
    if state["phase"] not in PHASES or state["role"] not in ROLES:
        return "phase %r or role %r unknown" % (state["phase"], state["role"])
    return None


def node_file_problem(record: Any) -> Optional[str]:
    """Why `record` is no node file (NODE_FIELDS); None when it is one."""
    if not isinstance(record, dict) or record.get("schema") != NODE_SCHEMA:
        return "not a %s file" % NODE_SCHEMA
    if record.get("version") != NODE_VERSION:
        return "version %r (this reader knows %d)" % (record.get("version"), NODE_VERSION)
    for name, types in NODE_FIELDS.items():
        if not _typed(record.get(name), types):
            return "field %r is %r" % (name, record.get(name))
    for state in record["ranks"]:
        problem = rank_state_problem(state)
        if problem:
            return problem
    return None


def read_json(path: str, limit: int) -> Any:
    """A run file's JSON (a regular file, no link, at most `limit` bytes); None when it is absent or unreadable."""
    try:
        with open_regular(path, limit, follow_links=False) as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, FileRefused, ValueError, RecursionError):
        return None


def read_node_files(run_dir: str) -> List[Dict[str, Any]]:
    """The run's valid node files (any order); files that are not one are left out."""
    folder = os.path.join(run_dir, HEARTBEAT_DIR)
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith(".")]
    except OSError:
        return []
    records = []
    for name in names:
        record = read_json(os.path.join(folder, name), MAX_NODE_BYTES)
        if node_file_problem(record) is None:
            records.append(record)
    return records


def merge_ranks(records: List[Dict[str, Any]]) -> Dict[int, Dict[str, Any]]:
    """rank -> its freshest state (latest heartbeat) over node files, with its node file's `host`."""
    merged: Dict[int, Dict[str, Any]] = {}
    for record in records:
        for state in record["ranks"]:
            known = merged.get(state["rank"])
            if known is None or state["heartbeat"] > known["heartbeat"]:
                merged[state["rank"]] = dict(state, host=record["host"])
    return merged


def read_heartbeats(run_dir: str) -> Dict[str, Dict[str, Any]]:
    """host -> what the launcher shows of a live run: {time (the newest write), interval_s, last_step,
    last_step_time, ranks (merged, freshest state per rank)} from the run's node files."""
    by_host: Dict[str, List[Dict[str, Any]]] = {}
    for record in read_node_files(run_dir):
        by_host.setdefault(record["host"], []).append(record)
    nodes = {}
    for host, records in by_host.items():
        ranks = sorted(merge_ranks(records).values(), key=lambda r: r["rank"])
        newest = max(records, key=lambda r: r["time"])
        summary = node_record(host, newest["writer"], newest["time"], newest["interval_s"], ranks)
        nodes[host] = {k: summary[k] for k in ("time", "interval_s", "last_step", "last_step_time", "ranks")}
    return nodes


def hang_record_problem(record: Any) -> Optional[str]:
    """Why `record` is no hang record (HANG_FIELDS); None when it is one."""
    if not isinstance(record, dict) or record.get("schema") != HANG_SCHEMA:
        return "not a %s file" % HANG_SCHEMA
    if record.get("version") != HANG_VERSION:
        return "version %r (this reader knows %d)" % (record.get("version"), HANG_VERSION)
    for name, types in HANG_FIELDS.items():
        if not _typed(record.get(name), types):
            return "field %r is %r" % (name, record.get(name))
    for silent in record["silent"]:
        if not isinstance(silent, dict) or set(silent) != set(SILENT_FIELDS):
            return "a silent process's fields are not %s" % ", ".join(SILENT_FIELDS)
    return None


def hung_end_fields(record: Dict[str, Any]) -> Dict[str, Any]:
    """The metrics file's `end` record fields of a hung run (status `hung`, metrics version 5) from its hang record."""
    return {
        "reason": record["summary"],
        "hang": {
            "file": HANG_FILE,
            "timeout_s": record["timeout_s"],
            "silent": record["silent"],
            "flight_recorder": record["flight_recorder"],
        },
    }


def read_hang_record(run_dir: str) -> Optional[Dict[str, Any]]:
    """The run's hang record (`hang.json`), None when there is none or it is not one."""
    record = read_json(os.path.join(run_dir, HANG_FILE), MAX_HANG_BYTES)
    return record if hang_record_problem(record) is None else None
