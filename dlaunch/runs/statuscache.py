"""What dlaunch learnt about runs that have ended, kept between commands: `status`, `runs` and `watch`
over thousands of finished runs read one file instead of every run's plan, state, metrics, profile and
logs, and ask no scheduler about them.

A run enters once it has ended (`Snapshot.ended`: nothing more happens to it until it is resumed). Its
entry is used while the run directory and the files its snapshot came from are as they were (a digest
of each one's inode, size, modification and change time; a resumed run writes its state and plan anew) and
dlaunch's own code is the one that made it (`code_stamp`: another version may compute a figure
otherwise). Anything else (no cache file, a broken one, a changed run) is a miss, never an error: the
snapshot is computed from the run directory as without a cache.

Where: $DLAUNCH_STATUS_CACHE (a file; empty: no cache), else beside the results database, which the
same commands write (dlaunch/resultsdb/store.py: runs/results.sqlite -> runs/results.status-cache.json).
At most MAX_ENTRIES runs, the newest entries kept. Two commands that save at once may each lose the
other's new entries (computed again next time), never corrupt the file.
"""

import functools
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

CACHE_ENV = "DLAUNCH_STATUS_CACHE"
FORMAT = 1
MAX_ENTRIES = 20000
PACKAGE = Path(__file__).resolve().parent.parent


def cache_path() -> Optional[Path]:
    """The cache file, or None when $DLAUNCH_STATUS_CACHE is set empty."""
    from dlaunch.resultsdb.store import db_path

    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return Path(chosen) if chosen else None
    database = db_path()
    return database.with_name(database.stem + ".status-cache.json")


@functools.lru_cache(maxsize=1)
def code_stamp() -> str:
    """A digest of dlaunch's source files (names, sizes, modification times)."""
    digest = hashlib.sha256()
    for folder, subfolders, files in os.walk(PACKAGE):
        subfolders.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            st = os.stat(path)
            digest.update(("%s %d %d\n" % (os.path.relpath(path, PACKAGE), st.st_size, st.st_mtime_ns)).encode())
    return digest.hexdigest()[:32]


def _states(run_dir: Path, names: Sequence[str]) -> List[Any]:
    """What changes when the run directory or one of its files `names` changes: each one's inode, size,
    modification and change time (None for a missing one); links are not followed."""
    base = str(run_dir)
    found: List[Any] = []
    for path in (base, *[base + os.sep + name for name in names]):
        try:
            st = os.lstat(path)
        except OSError:
            found.append(None)
            continue
        found.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return found


def _digest(states: Sequence[Any]) -> str:
    return hashlib.blake2b(repr(states).encode(), digest_size=12).hexdigest()


def _valid(entry: Any) -> bool:
    """An entry as `put` makes them (the file may come from anywhere: it is checked when read)."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("stamp"), str)
        and isinstance(entry.get("snapshot"), dict)
        and isinstance(entry.get("files"), list)
        and all(isinstance(name, str) and name and os.sep not in name for name in entry["files"])
    )


class StatusCache:
    """The cache file's entries: absolute run directory -> {"stamp" (a digest of its files' states),
    "files" (their names), "made" (when), "snapshot"}."""

    def __init__(self, path: Optional[Path]):
        self.path = path
        self.entries: Dict[str, Dict[str, Any]] = self._read() if path else {}
        self.new: Dict[str, Dict[str, Any]] = {}

    def _read(self) -> Dict[str, Dict[str, Any]]:
        try:
            with open(str(self.path), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("code") != code_stamp():
            return {}
        runs = data.get("runs")
        return {key: entry for key, entry in runs.items() if _valid(entry)} if isinstance(runs, dict) else {}

    def lookup(self, run_dir: Path, files: Sequence[str]) -> Tuple[List[Any], Optional[Dict[str, Any]]]:
        """(the states of the run directory and its `files` now, for `put`; the snapshot kept for the run,
        as `put` was given it, while these and its logs are unchanged, else None)."""
        key = os.path.abspath(run_dir)
        entry = self.new.get(key) or self.entries.get(key)
        if entry is None or entry["files"][: len(files)] != list(files):
            return _states(run_dir, files), None
        states = _states(run_dir, entry["files"])
        kept = entry["snapshot"] if entry["stamp"] == _digest(states) else None
        return states[: 1 + len(files)], kept

    def put(
        self, run_dir: Path, made_from: List[Any], files: Sequence[str], logs: Sequence[str], snapshot: Dict[str, Any]
    ) -> None:
        """Keep an ended run's snapshot, made from `files` (as `lookup` was given them) and its `logs`;
        `made_from` is the lookup's states from before they were read (a file written meanwhile: not kept)."""
        names = list(files) + list(logs)
        states = _states(run_dir, names)
        if self.path is None or states[: 1 + len(files)] != made_from:
            return
        self.new[os.path.abspath(run_dir)] = {
            "stamp": _digest(states),
            "files": names,
            "made": time.time(),
            "snapshot": snapshot,
        }

    def save(self) -> None:
        """Write the new entries into the cache file (merged with what another command saved meanwhile);
        a file that cannot be written is left as it is."""
        from dlaunch.atomic import write_atomic

        if self.path is None or not self.new:
            return
        entries = dict(self._read())
        entries.update(self.new)
        if len(entries) > MAX_ENTRIES:
            newest = sorted(
                entries, key=lambda key: entries[key].get("made", 0) if isinstance(entries[key], dict) else 0
            )
            entries = {key: entries[key] for key in newest[-MAX_ENTRIES:]}
        try:
            write_atomic(
                self.path,
                json.dumps({"format": FORMAT, "code": code_stamp(), "runs": entries}, separators=(",", ":")),
                mode=0o600,
            )
        except OSError:
            return
        self.entries, self.new = entries, {}


_current: Dict[Tuple[Optional[str], Optional[str]], StatusCache] = {}


def current() -> StatusCache:
    """This process's cache (read once per cache file: per value of the variables that choose it)."""
    from dlaunch.resultsdb.store import DB_ENV

    chosen = (os.environ.get(CACHE_ENV), os.environ.get(DB_ENV))
    if chosen not in _current:
        _current[chosen] = StatusCache(cache_path())
    return _current[chosen]
