"""PyTorch's flight recorder for a hang (issue 44): turned on before the process group starts, dumped by every live
process when the run hangs, read back into the hang record. Torch-free but for `enable` and `dump`, which use the torch
the trainer runs with.

The recorder keeps the process's last collectives in a ring buffer (torch >= 2.2 for NCCL: PR pytorch/pytorch#110960;
gloo too where torch has `_dump_fr_trace`, 2.8 on: PR #152563 made it backend-neutral); its size is
`TORCH_FR_BUFFER_SIZE` (torch >= 2.8; `TORCH_NCCL_TRACE_BUFFER_SIZE` before, which 2.8 on still read with a
deprecation warning), read once when a process group starts. `enable` sets it (BUFFER_ENTRIES, torch's recommended
2000) unless the user did; torch's own dump at its collective timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) is left as the user
has it: the watchdog dumps when its own, much shorter, deadline passes.

The dump (torch's `_dump_nccl_trace()` / `_dump_fr_trace()`: a pickle of plain dicts, lists, tuples and strings;
torch/csrc/distributed/c10d/FlightRecorder.hpp, the format pytorch/tutorials' flight_recorder_tutorial documents at
version "2.5"): {version, pg_config {name: {name, desc, ranks: "[0, 1]"}}, pg_status {pg_id: {last_enqueued_collective,
last_started_collective, last_completed_collective}} (absent before version 2.x of the format: then derived from the
entries), entries [{record_id, pg_id, process_group (name, desc), collective_seq_id, p2p_seq_id, op_id, profiling_name
("nccl:all_reduce"), time_created_ns, input_sizes, input_dtypes, output_sizes, output_dtypes, state ("scheduled",
"started", "completed"), time_discovered_started_ns, time_discovered_completed_ns, retired, timeout_ms, is_p2p,
frames}]}. It is written as it came (`hang/flight_recorder.rank<R>`, what `torchfrtrace --prefix flight_recorder.rank`
reads) and read back with an unpickler that builds nothing but those plain types.

Each process then keeps a summary (`summary`: per process group its last enqueued and completed collective, and the
collectives not completed, at most MAX_PENDING) in its heartbeat, so the hang record's writer reads one small file per
node, not every rank's dump. `first_unfinished` is torchfrtrace's first question asked of those summaries: the first
collective (by sequence number, per process group) that not every member has completed, its operation and sizes, the
ranks that entered it, the ranks whose dump shows they never did ("missing", torchfrtrace's "Not all ranks joining
collective") and the members with no dump (a stopped process writes none).
"""

import ast
import io
import os
import pickle
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple

from dlaunch.train.metrics_schema import unavailable

BUFFER_ENTRIES = 2000
MAX_PENDING = 8
BUFFER_VARIABLE = "TORCH_FR_BUFFER_SIZE"  # torch >= 2.8
OLD_BUFFER_VARIABLE = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # torch 2.2 to 2.7 (NCCL only)
DUMP_PREFIX = "flight_recorder.rank"
NCCL_FROM, GLOO_NAME_FROM = (2, 2), (2, 8)


def torch_release(version: str) -> Tuple[int, int]:
    """ "2.14.1+cu130" -> (2, 14)."""
    major, minor = (version.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def availability(backend: str, release: Tuple[int, int], records_gloo: bool) -> Optional[str]:
    """None where this torch's flight recorder records `backend`'s collectives, else why not ("unavailable: ...")."""
    if backend == "nccl" and release >= NCCL_FROM:
        return None
    if backend == "gloo" and records_gloo:
        return None
    if backend == "nccl":
        return unavailable("torch %d.%d has no flight recorder (2.2 on)" % release)
    return unavailable("this torch's flight recorder does not record %s's collectives" % backend)


def enable(environ: MutableMapping[str, str], backend: str, release: Tuple[int, int], records_gloo: bool) -> str:
    """Set the buffer size before the process group starts (a size the user set is kept); what was done, or why not."""
    missing = availability(backend, release, records_gloo)
    if missing:
        return missing
    for name in (BUFFER_VARIABLE, OLD_BUFFER_VARIABLE):
        if environ.get(name):
            return "%s=%s (set by the user)" % (name, environ[name])
    name = BUFFER_VARIABLE if release >= GLOO_NAME_FROM else OLD_BUFFER_VARIABLE
    environ[name] = str(BUFFER_ENTRIES)
    return "%s=%d" % (name, BUFFER_ENTRIES)


def this_torch() -> Tuple[Tuple[int, int], bool]:
    """(release, whether its flight recorder records gloo) of the torch this process imported."""
    import torch

    c10d = getattr(torch._C, "_distributed_c10d", None)
    return torch_release(torch.__version__), hasattr(c10d, "_dump_fr_trace")


def dump(path: str, backend: str) -> Dict[str, Any]:
    """This process's recorder, written to `path` as torch dumps it; returns it read back."""
    from torch._C import _distributed_c10d as c10d

    # private functions, present in the releases `availability` accepts (torch's stubs do not declare them)
    data = c10d._dump_nccl_trace() if backend == "nccl" else c10d._dump_fr_trace()  # type: ignore[attr-defined]
    with open(path, "wb") as f:
        f.write(data)
    return load(data)


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only: a dump refers to no class or function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError("a flight recorder dump names no class (found %s.%s)" % (module, name))


def load(data: bytes) -> Dict[str, Any]:
    """A dump's content; ValueError when it is not one."""
    try:
        content = _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise ValueError("not a flight recorder dump: %s" % e) from None
    if not isinstance(content, dict) or not isinstance(content.get("entries"), list):
        raise ValueError("not a flight recorder dump: no list of entries")
    return content


def _ranks_of(config: Any) -> Optional[List[int]]:
    try:
        ranks = ast.literal_eval(config["ranks"]) if isinstance(config["ranks"], str) else config["ranks"]
    except (KeyError, TypeError, ValueError, SyntaxError):
        return None
    return [int(r) for r in ranks] if isinstance(ranks, (list, tuple)) else None


def _section(value: Any) -> Dict[str, Any]:
    """A dump's optional section: `value` where it is a dict, else empty."""
    return value if isinstance(value, dict) else {}


def summary(content: Mapping[str, Any], pg_rank: int) -> Dict[str, Any]:
    """What a process keeps of its dump (`pg_rank`: its rank in the default process group, the dump's numbering):
    per process group (by pg_id) its name, description, members (null: not in the dump), last enqueued and last
    completed collective, and its collectives not completed (at most MAX_PENDING, oldest first)."""
    entries = [e for e in content["entries"] if isinstance(e, dict) and not e.get("is_p2p")]
    status, configs = _section(content.get("pg_status")), _section(content.get("pg_config"))
    groups: Dict[str, Dict[str, Any]] = {}
    for entry in entries:
        pg_id = str(entry.get("pg_id"))
        name, desc = (list(entry.get("process_group") or ("", "")) + ["", ""])[:2]
        group = groups.setdefault(pg_id, {"pg_id": pg_id, "name": str(name), "desc": str(desc), "seqs": [], "done": []})
        seq = int(entry.get("collective_seq_id") or 0)
        group["seqs"].append(seq)
        if entry.get("state") == "completed":
            group["done"].append(seq)
    pending = []
    out = []
    for pg_id, group in sorted(groups.items()):
        known = _section(status.get(pg_id))
        enqueued = int(known.get("last_enqueued_collective", max(group["seqs"])))
        completed = int(known.get("last_completed_collective", max(group["done"], default=0)))
        config = configs.get(group["name"]) or next(
            (c for c in configs.values() if isinstance(c, dict) and c.get("desc") == group["desc"]), None
        )
        members = _ranks_of(config) if isinstance(config, dict) else None
        out.append(
            {
                "pg_id": pg_id,
                "name": group["name"],
                "desc": group["desc"],
                "members": members,
                "last_enqueued": enqueued,
                "last_completed": completed,
            }
        )
        for entry in entries:
            seq = int(entry.get("collective_seq_id") or 0)
            if str(entry.get("pg_id")) == pg_id and seq > completed:
                pending.append(
                    {
                        "pg_id": pg_id,
                        "collective_seq_id": seq,
                        "op": str(entry.get("profiling_name")),
                        "input_sizes": entry.get("input_sizes") or [],
                        "input_dtypes": entry.get("input_dtypes") or [],
                        "state": str(entry.get("state")),
                    }
                )
    pending.sort(key=lambda p: (p["pg_id"], p["collective_seq_id"]))
    return {"version": str(content.get("version")), "pg_rank": pg_rank, "groups": out, "pending": pending[:MAX_PENDING]}


def first_unfinished(summaries: Mapping[int, Mapping[str, Any]], world: List[int]) -> Optional[Dict[str, Any]]:
    """The first collective not every member completed, over `summaries` (pg rank -> `summary`; `world`: the default
    group's ranks, for a group whose members the dump does not name); None when there is none. Ranks are pg ranks."""
    groups: Dict[str, Dict[int, Dict[str, Any]]] = {}
    meta: Dict[str, Dict[str, Any]] = {}
    for rank, kept in summaries.items():
        for group in kept["groups"]:
            groups.setdefault(group["pg_id"], {})[rank] = group
            meta.setdefault(group["pg_id"], group)
    for pg_id in sorted(groups, key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g)):
        seen = groups[pg_id]
        members = meta[pg_id]["members"] or list(world)
        completed = max(0, min(g["last_completed"] for g in seen.values()))  # -1: none completed yet
        if len(seen) == len(members) and all(g["last_enqueued"] == completed for g in seen.values()):
            continue
        if all(g["last_enqueued"] <= completed for g in seen.values()):
            continue  # every dumped member completed all it enqueued; the undumped ones say nothing more here
        seq = completed + 1
        entered = sorted(r for r, g in seen.items() if g["last_enqueued"] >= seq)
        about: Dict[str, Any] = next(
            (
                p
                for r in entered
                for p in summaries[r]["pending"]
                if p["pg_id"] == pg_id and p["collective_seq_id"] == seq
            ),
            {},
        )
        return {
            "process_group": "%s:%s" % (meta[pg_id]["name"], meta[pg_id]["desc"]),
            "collective_seq_id": seq,
            "op": about.get("op"),
            "input_sizes": about.get("input_sizes"),
            "input_dtypes": about.get("input_dtypes"),
            "state": about.get("state"),
            "entered": entered,
            "missing_ranks": sorted(r for r in seen if r not in entered),
            "undumped_ranks": sorted(r for r in members if r not in seen),
        }
    return None


def dump_path(hang_dir: str, rank: int) -> str:
    return os.path.join(hang_dir, "%s%d" % (DUMP_PREFIX, rank))
