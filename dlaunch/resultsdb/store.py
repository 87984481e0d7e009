"""The results database: one SQLite file, one row per run that has ended (its metrics file has an
`end` record), written when dlaunch sees the run end (a local run, `status`, `runs`, `watch`,
`report`) and rebuilt from run directories on demand.

Where: `--db`, else $DLAUNCH_RESULTS_DB, else `runs/results.sqlite` (beside the default `--output`).

A row is a function of its run directory alone: its metrics file (figures as `dlaunch report` computes
them: dlaunch/analysis/scaling.py) and the site profile it kept (`site.toml`, whose straggler_threshold
judges the flags, as `dlaunch report` judges them without --site or --straggler-threshold; a run that kept
none is judged at the default, where `report` takes its site's profile by name), so rebuilding from the run
directories gives the same rows. Its key
`uid` is the run's experiment, run id and start time: a run copied or moved keeps it, and two runs of
one name in two output folders keep theirs apart. Figures that depend on other runs (S_G, E_G,
history verdicts) are computed when rows are read.

Concurrent writers (several runs ending together, `status` beside `watch`): each write is one
short `BEGIN IMMEDIATE` transaction of upserts by uid, waiting up to BUSY_TIMEOUT_S for another
writer; write-ahead logging (WAL) lets readers go on beside a writer. WAL's index lives in shared
memory, which works only among processes of one host (sqlite.org/wal.html, "WAL does not work over a
network filesystem"): on a network or parallel file system (NFS, Lustre, GPFS, BeeGFS, CIFS), where
login nodes share a home, the database keeps SQLite's rollback journal, whose POSIX locks those file
systems carry between hosts.

Schema: `PRAGMA user_version` = SCHEMA_VERSION; a newer file is refused, an older one migrated
(`MIGRATIONS`). Version 2 adds `flags`, the run's straggler and throttled-GPU flags: the rows a version 1
database holds get none (NULL, read as None: not judged) until dlaunch next reads their runs (the
migration clears their `source` stamps) or `dlaunch results rebuild`. Version 3 adds `flags_threshold`, the
threshold the flags were judged at (the straggler_threshold of the site profile the run directory kept,
dlaunch/analysis/stragglers.py's kept_threshold, else the default), `step_options` (the trainer's workload options
away from their defaults, "-" for none: part of a scaling curve's key) and `compile_s` (--compile's compile time);
its rows are read again the same way. Version 4 adds what the measurement-quality verdict reads (dlaunch/analysis/
quality.py): `device`, `threads` (CPU threads per rank: with `device` part of a scaling curve's key), `measured_steps`,
`step_compute_s` and `scheduler`; and a study's axes of the run's framework: `engine`, `architecture`, `updates` (selector keys);
its rows are read again the same way, and a row not read again yet has them NULL.
"""

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from dlaunch.analysis.convergence import MLPERF_TARGET_TOP1, rcp_applies
from dlaunch.analysis.scaling import epochs_to, run_from_metrics
from dlaunch.analysis.stragglers import kept_threshold, run_flags
from dlaunch.errors import DlaunchError
from dlaunch.jobs.imagepaths import stack_of_image
from dlaunch.paths import DEFAULT_RESULTS_DB, RESULTS_DB_ENV
from dlaunch.train.metrics_schema import Metrics, MetricsError, read_metrics

SCHEMA_VERSION = 4
DB_ENV = RESULTS_DB_ENV
DEFAULT_DB = DEFAULT_RESULTS_DB
BUSY_TIMEOUT_S = 60.0
# File systems whose locks reach other hosts but whose shared memory does not (types in /proc/mounts).
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs", "fuse.sshfs")

# (column, SQL type): the row of one run. JSON columns hold objects as text.
COLUMNS = (
    ("uid", "TEXT PRIMARY KEY"),  # experiment/run id/start time (Unix seconds)
    ("run", "TEXT NOT NULL"),  # the run id: its directory's name when launched by dlaunch
    ("experiment", "TEXT NOT NULL"),
    ("site", "TEXT NOT NULL"),
    ("started", "TEXT NOT NULL"),  # UTC, ISO 8601, of the header record
    ("ended", "TEXT NOT NULL"),  # of the last end record
    ("status", "TEXT NOT NULL"),  # the end record's status
    ("reason", "TEXT"),
    ("framework", "TEXT NOT NULL"),
    ("loader", "TEXT NOT NULL"),
    ("model", "TEXT NOT NULL"),
    ("amp", "TEXT NOT NULL"),
    ("schedule", "TEXT NOT NULL"),
    ("gpus", "INTEGER NOT NULL"),
    ("nodes", "INTEGER NOT NULL"),
    ("batch_per_gpu", "INTEGER NOT NULL"),
    ("global_batch", "INTEGER NOT NULL"),
    ("image", "TEXT"),
    ("stack", "TEXT NOT NULL"),  # the image's stack (`<stack>-<framework>-<arch>`), '-' when not named so
    ("pins", "TEXT NOT NULL"),  # JSON: the header's library versions (python, torch, cuda, nccl, ...)
    ("images_per_s", "REAL"),  # X as `dlaunch report` computes it (epoch overhead included where recorded)
    ("epoch_time_s", "REAL"),  # mean of the epochs that give X
    ("epochs", "INTEGER NOT NULL"),  # epochs completed
    ("total_time_s", "REAL"),
    ("best_top1", "REAL"),
    ("target_accuracy", "REAL"),
    ("epochs_to_target", "INTEGER"),
    ("epochs_to_mlperf_target", "INTEGER"),  # to 75.9% top-1, ResNet-50 on ImageNet only (MLPerf's RCPs)
    ("time_to_target_s", "REAL"),
    ("energy_j", "REAL"),
    ("energy_domains", "TEXT"),
    ("joules_per_image", "REAL"),
    ("energy_to_target_j", "REAL"),
    ("request", "TEXT NOT NULL"),  # JSON: the abstract request (framework, world size, trainer options)
    ("provenance", "TEXT NOT NULL"),  # JSON: git revision, job id, hosts, script hash, parent run, data
    ("path", "TEXT NOT NULL"),  # the run directory where the row was last read
    ("source", "TEXT NOT NULL"),  # the metrics file's size and mtime when read (unchanged files are skipped)
    # JSON: [{"kind": "straggler" or "throttled", "message": ...}] at flags_threshold, [] for none; null: not
    # recorded (metrics before version 4, rows before schema 2)
    ("flags", "TEXT"),
    ("flags_threshold", "REAL"),  # the straggler threshold of `flags`: the kept profile's, else the default
    ("step_options", "TEXT NOT NULL DEFAULT '-'"),  # --compile, --cuda-graphs, ... away from their defaults; '-': none
    ("compile_s", "REAL"),  # --compile: seconds of compiling (first steps), never part of images_per_s
    ("device", "TEXT"),  # the header's: cpu, cuda
    ("threads", "INTEGER"),  # CPU threads per rank (scaling.recorded_threads; NULL: not recorded)
    ("measured_steps", "INTEGER"),  # the steps images_per_s was measured over
    ("step_compute_s", "REAL"),  # the median rank's compute per step (metrics version 4; the quality verdict's)
    ("engine", "TEXT"),  # a study's axes (dlaunch/train/framework_table.py's row): torch, tensorflow, mxnet
    ("architecture", "TEXT"),  # allreduce, parameter-server
    ("updates", "TEXT"),  # sync, async
    ("scheduler", "TEXT"),  # the kind of scheduler that ran it (the header's; the quality verdict's threshold)
)
NAMES = tuple(name for name, _ in COLUMNS)
JSON_COLUMNS = ("pins", "request", "provenance", "flags")
# SQL that brings a database of the version before each key to that version.
MIGRATIONS = {
    2: (
        "ALTER TABLE runs ADD COLUMN flags TEXT",
        "UPDATE runs SET source = ''",
    ),  # every run is read again when dlaunch next sees it
    3: (
        "ALTER TABLE runs ADD COLUMN flags_threshold REAL",
        "ALTER TABLE runs ADD COLUMN step_options TEXT NOT NULL DEFAULT '-'",
        "ALTER TABLE runs ADD COLUMN compile_s REAL",
        "UPDATE runs SET source = ''",
    ),
    4: (
        "ALTER TABLE runs ADD COLUMN device TEXT",
        "ALTER TABLE runs ADD COLUMN threads INTEGER",
        "ALTER TABLE runs ADD COLUMN measured_steps INTEGER",
        "ALTER TABLE runs ADD COLUMN step_compute_s REAL",
        "ALTER TABLE runs ADD COLUMN engine TEXT",
        "ALTER TABLE runs ADD COLUMN architecture TEXT",
        "ALTER TABLE runs ADD COLUMN updates TEXT",
        "ALTER TABLE runs ADD COLUMN scheduler TEXT",
        "UPDATE runs SET source = ''",
    ),
}


def db_path(given: Optional[Path] = None) -> Path:
    """`given`, else $DLAUNCH_RESULTS_DB, else runs/results.sqlite."""
    return Path(given or os.environ.get(DB_ENV) or DEFAULT_DB)


def filesystem_type(path: Path, mounts_file: str = "/proc/self/mounts") -> str:
    """The type of the file system holding `path` (its longest mount point in `mounts_file`)."""
    target, best, kind = os.path.realpath(path), "", ""
    try:
        with open(mounts_file, encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3:
                    point = fields[1].replace("\\040", " ")
                    inside = target == point or target.startswith(point.rstrip("/") + "/")
                    if inside and len(point) >= len(best):
                        best, kind = point, fields[2]
    except OSError:
        return ""
    return kind


def journal_mode(path: Path) -> str:
    """WAL on a local file system; SQLite's rollback journal (DELETE) on one shared between hosts."""
    return "DELETE" if filesystem_type(path.parent) in NETWORK_FILESYSTEMS else "WAL"


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _stamp(path: Path) -> str:
    st = path.stat()
    return "%d:%d" % (st.st_size, st.st_mtime_ns)


def row_of(metrics: Metrics, source: str) -> Dict[str, Any]:
    """The row of a run whose metrics file has an end record."""
    h, end = metrics.header, metrics.end
    assert end is not None
    run = run_from_metrics(metrics)
    judged = run.phases is not None or run.node_figures is not None  # per-rank phases (metrics version 4)
    threshold = kept_threshold(Path(metrics.path).parent) if judged else None
    provenance = {
        "git_revision": h.get("git_revision"),
        "job_id": h.get("slurm_job_id"),
        "hosts": h.get("hosts"),
        "script_sha256": h.get("script_sha256"),
        "parent_run": h.get("parent_run"),
        "data": h["config"].get("data"),
        "num_classes": h["config"].get("num_classes"),
        "metrics_file": os.path.abspath(metrics.path),
    }
    if h.get("network") is not None:
        provenance["network"] = h["network"]
    row = {
        "uid": "%s/%s/%.3f" % (run.key.experiment, h["run_id"], h["time"]),
        "run": h["run_id"],
        "experiment": run.key.experiment,
        "site": run.key.site,
        "started": _iso(h["time"]),
        "ended": _iso(end["time"]),
        "status": end["status"],
        "reason": end.get("reason"),
        "framework": run.key.framework,
        "loader": run.key.loader,
        "model": run.key.model,
        "amp": run.amp,
        "schedule": run.schedule,
        "gpus": run.world_size,
        "nodes": run.nodes,
        "batch_per_gpu": run.key.batch_per_worker,
        "global_batch": run.global_batch,
        "image": h.get("image"),
        "stack": stack_of_image(h.get("image")) or "-",
        "pins": h.get("versions") or {},
        "images_per_s": run.throughput,
        "epoch_time_s": run.epoch_time_s,
        "epochs": end["epochs_completed"],
        "total_time_s": end["total_time_s"],
        "best_top1": run.best_top1,
        "target_accuracy": run.target_accuracy,
        "epochs_to_target": run.epochs_to_target,
        "epochs_to_mlperf_target": epochs_to(run.epochs, MLPERF_TARGET_TOP1) if rcp_applies(run) else None,
        "time_to_target_s": run.time_to_accuracy_s,
        "energy_j": run.energy_j,
        "energy_domains": run.energy_domains,
        "joules_per_image": run.joules_per_image,
        "energy_to_target_j": run.energy_to_accuracy_j,
        "request": h.get("request") or {},
        "provenance": provenance,
        "path": os.path.abspath(os.path.dirname(metrics.path)),
        "source": source,
        "flags": None if threshold is None else [flag.stored() for flag in run_flags(run, threshold)],
        "flags_threshold": threshold,
        "step_options": run.key.step_options,
        "compile_s": run.compile_s,
        "device": run.device,
        "threads": run.threads,
        "measured_steps": run.measured_steps if run.measured_epochs else None,
        "step_compute_s": run.phases.median.compute_s if run.phases else None,
        "engine": run.axes.engine,
        "architecture": run.axes.architecture,
        "updates": run.axes.updates,
        "scheduler": run.scheduler,
    }
    return row


class ResultsDB:
    """An open results database (a context manager)."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            self._prepare()
        except sqlite3.DatabaseError as e:
            raise DlaunchError("%s: not a dlaunch results database (%s)" % (path, e)) from None

    def _prepare(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise DlaunchError(
                "%s: results database of schema version %d; this dlaunch knows up to %d (update dlaunch)"
                % (self.path, version, SCHEMA_VERSION)
            )
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0].upper() != journal_mode(self.path):
            self._set_journal_mode(journal_mode(self.path))
        if version < SCHEMA_VERSION:
            with self.transaction():
                version = self.conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have been first
                if version == 0:
                    self.conn.execute("CREATE TABLE IF NOT EXISTS runs (%s)" % ", ".join("%s %s" % c for c in COLUMNS))
                else:
                    for sql in (sql for step in range(version + 1, SCHEMA_VERSION + 1) for sql in MIGRATIONS[step]):
                        self.conn.execute(sql)
                self.conn.execute("PRAGMA user_version = %d" % SCHEMA_VERSION)

    def _set_journal_mode(self, mode: str) -> None:
        """Switch the journal mode, waiting up to BUSY_TIMEOUT_S: SQLite answers the switch with 'database is
        locked' at once, without its busy handler, while another process creates the same database."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode=%s" % mode)
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.conn.close()

    def transaction(self) -> "_Transaction":
        return _Transaction(self.conn)

    def upsert(self, rows: Sequence[Dict[str, Any]]) -> None:
        """Insert or replace rows by uid, in one transaction."""
        sql = "INSERT INTO runs (%s) VALUES (%s) ON CONFLICT(uid) DO UPDATE SET %s" % (
            ", ".join(NAMES),
            ", ".join("?" * len(NAMES)),
            ", ".join("%s=excluded.%s" % (n, n) for n in NAMES[1:]),
        )
        values = [[json.dumps(row[n], sort_keys=True) if n in JSON_COLUMNS else row[n] for n in NAMES] for row in rows]
        with self.transaction():
            self.conn.executemany(sql, values)

    def sources(self) -> Dict[str, str]:
        """Metrics file -> the stamp it had when its row was written."""
        return {
            json.loads(r["provenance"])["metrics_file"]: r["source"]
            for r in self.conn.execute("SELECT provenance, source FROM runs")
        }

    def rows(self) -> List[Dict[str, Any]]:
        """Every row, oldest end first, JSON columns as objects."""
        found = []
        for r in self.conn.execute("SELECT %s FROM runs ORDER BY ended, uid" % ", ".join(NAMES)):
            row = dict(r)
            for name in JSON_COLUMNS:
                row[name] = None if row[name] is None else json.loads(row[name])
            found.append(row)
        return found

    def delete(self, uids: Iterable[str]) -> None:
        with self.transaction():
            self.conn.executemany("DELETE FROM runs WHERE uid = ?", [(u,) for u in uids])


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an exception): the write lock is taken at the start,
    so a writer waits for another (busy timeout) instead of failing on a lock upgrade."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.conn.execute("ROLLBACK" if kind else "COMMIT")


def read_rows(metrics_files: Iterable[Path], known: Dict[str, str]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(rows, rejected): the rows of the metrics files that have an end record and changed since
    `known` (file -> stamp), and one message per unreadable file."""
    rows, rejected = [], []
    for path in metrics_files:
        try:
            stamp = _stamp(path)
            if known.get(os.path.abspath(path)) == stamp:
                continue
            metrics = read_metrics(
                str(path), follow_links=False
            )  # a run's file: never through a link (dlaunch/boundary.py)
        except OSError as e:
            rejected.append("%s: %s" % (path, e.strerror or e))
            continue
        except MetricsError as e:
            rejected.append(str(e))
            continue
        if metrics.end is not None:
            rows.append(row_of(metrics, stamp))
    return rows, rejected


@dataclass(frozen=True)
class Recorded:
    rows: int
    warning: Optional[str] = None  # why nothing was recorded (the database could not be written)


def record(metrics_files: Iterable[Path], db: Optional[Path] = None) -> Recorded:
    """Upsert the rows of the ended runs among `metrics_files` (unchanged ones skipped). A database
    that cannot be written is a warning, never a failure of the command that ended the runs: the
    run directories keep everything, and `dlaunch results rebuild` recovers the rows."""
    path = db_path(db)
    try:
        known = {}
        if path.is_file():  # no database is created while no run has ended
            with ResultsDB(path) as store:
                known = store.sources()
        rows, _ = read_rows(metrics_files, known)  # `status` and `report` name unreadable files
        if rows:
            with ResultsDB(path) as store:
                store.upsert(rows)
        return Recorded(len(rows))
    except (sqlite3.Error, OSError, DlaunchError) as e:
        return Recorded(
            0, "results database %s not written: %s (dlaunch results rebuild recovers the rows)" % (path, e)
        )
