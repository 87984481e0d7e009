"""Hang detection (issue 44): every process of a job knows its last finished step and its phase, a thread beside the
training publishes them, and when no step finishes within the hang timeout the job is stopped with a record that names
the silent process(es). Torch-free and stdlib-only: the PyTorch, TensorFlow and MXNet trainers all use it.

The channel, and why (benchmarks/README.md, "Hang detection", has the load at 1024 ranks):
- each process's heartbeat thread writes its state (RANK_FIELDS of dlaunch/train/heartbeat.py, about 300 bytes) every
  `beat_s` into a node-local folder (/dev/shm: memory, no file-system server involved);
- one process per node (the lowest-ranked whose heartbeat is fresh there) reads its node's states and replaces one small
  file per node in the run directory (`heartbeat/<host>.<writer>.json`) every `node_s`: a rename and a create per node
  and interval on the shared file system, 1024 ranks on 256 nodes making 26 such pairs per second at the default 10 s,
  whatever the job's size per node; nobody polls a server. A rendezvous store (torch's TCPStore) polled by every rank
  every few seconds is one process answering 1024 clients: the known bottleneck at that scale; and files per rank on a
  parallel file system cost a metadata operation per rank and interval;
- only when a process's own deadline passes does anyone read other nodes' files: the node writers, each reading the
  node files of lower ranks until one shows a live worker (1 file in the usual case), and the one that finds none (the
  lowest live worker's: rank 0 may be the silent one) reads every node file once and writes `hang.json`.
A process stuck in a collective still beats (its heartbeat thread runs while the main thread waits in C); a stopped
process (SIGSTOP, a driver that stopped it), or one whose C code holds the GIL, does not: its heartbeat goes stale
(older than `stale_s`) and the record names it.

The deadline (`HangClock`): the hang timeout T is `--hang-timeout` where given (0: no deadline, the heartbeat files are
still written), else SAFETY_FACTOR x the longest time between two points of progress seen so far (a finished step, the
end of a section: so the steps and the epoch boundaries, loader start included), at least FLOOR_S: a job whose steps and
epoch ends take seconds is stopped FLOOR_S after its last step, plus the detection's own seconds (below 5 minutes:
benchmarks/README.md). Known long sections have their own allowance: start-up (process start to the first finished
step: process group, model, loaders, the first step with its compilation) and a section not seen before (validation,
checkpoint) FIRST_SECTION_S; a section seen before SAFETY_FACTOR x its longest time; never less than T. The intervals
follow T's base (the flag, or FLOOR_S): beat_s = base/10, node_s = base/5, stale_s = base/2, capped at 1, 10 and 30 s.

When the deadline passes a process calls itself overdue: it dumps the Python stacks of all its threads (faulthandler,
`hang/stacks.rank<R>.txt` in the run directory), its flight recorder where the trainer has one
(dlaunch/train/flight_recorder.py), and publishes that. The lowest live overdue node writer waits `node_s` + 2 `beat_s`
(every node's file has then been rewritten), judges from the node files and writes `hang.json` (heartbeat.py documents
it). Every live process that sees it (node writers look every `node_s`, and tell their node through the node-local
folder) dumps its stacks if it has not, lets rank 0 write the metrics file's `end` record (status `hung`), and exits
with EXIT_HUNG. An overdue node writer that sees no record after 4 node intervals writes one itself (any overdue process after 8).

The trainer reports cheaply from its main thread (`phase`, `step_done`, `section`: a tuple built and assigned, about a
microsecond); the thread reads that tuple. `paused()` holds the deadline (tests/failpoints hold runs on purpose).
"""

import contextlib
import faulthandler
import hashlib
import os
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from dlaunch.train import heartbeat as hb
from dlaunch.train import jobenv
from dlaunch.train.errors import EXIT_HUNG
from dlaunch.train.flight_recorder import first_unfinished
from dlaunch.train.metrics_schema import unavailable

FLOOR_S = 180.0
SAFETY_FACTOR = 5.0
FIRST_SECTION_S = 1800.0
HUNG_MARK = "hung"  # in the node-local folder: this node's writer has seen hang.json
# The node-local folder's parent (default /dev/shm, else the temp folder).
LOCAL_ROOT_ENV = "DLAUNCH_HEARTBEAT_LOCAL_DIR"
DUMP_TIMEOUT_S = 30.0  # a flight recorder dump or the end record that does not return by then is given up

_current: List["Watchdog"] = []  # the process's running watchdog (torch_ps's server, the failpoints find it here)


def running() -> Optional["Watchdog"]:
    return _current[0] if _current else None


def intervals(base: float) -> Tuple[float, float, float]:
    """(beat_s, node_s, stale_s) for a hang timeout base (the flag, or FLOOR_S)."""
    return min(1.0, base / 10), min(10.0, base / 5), min(30.0, base / 2)


class HangClock:
    """A process's deadline, from what it has seen (monotonic seconds passed in: pure, testable)."""

    def __init__(self, hang_timeout: Optional[float], started: float):
        self.fixed = hang_timeout  # None: derived; > 0: the flag
        self.started = started
        self.longest_stretch = 0.0  # the longest time between two points of progress
        self.longest_section: Dict[str, float] = {}
        self.last_progress: Optional[float] = None  # a finished step or a section's end; None before the first step

    def timeout(self) -> float:
        """T: the flag, else SAFETY_FACTOR x the longest stretch, at least FLOOR_S."""
        return self.fixed if self.fixed else max(FLOOR_S, SAFETY_FACTOR * self.longest_stretch)

    def allowance(self, section: str) -> float:
        seen = self.longest_section.get(section)
        return max(self.timeout(), FIRST_SECTION_S if seen is None else SAFETY_FACTOR * seen)

    def progress(self, now: float) -> None:
        """A step finished (or, `section_began`, a section began: the stretch up to it counts too)."""
        if self.last_progress is not None:
            self.longest_stretch = max(self.longest_stretch, now - self.last_progress)
            self.last_progress = now
        else:
            self.last_progress = now  # the first step: start-up is a section of its own, not a stretch

    def section_began(self, now: float) -> None:
        if self.last_progress is not None:
            self.longest_stretch = max(self.longest_stretch, now - self.last_progress)

    def section_ended(self, section: str, began: float, now: float) -> None:
        self.longest_section[section] = max(self.longest_section.get(section, 0.0), now - began)
        if self.last_progress is not None:
            self.last_progress = now

    def restart(self, now: float) -> None:
        """After a pause: the clock runs from `now`, the paused time counted nowhere."""
        if self.last_progress is not None:
            self.last_progress = now

    def deadline(self, section: Optional[str], section_began: float) -> Tuple[float, float]:
        """(monotonic deadline, the seconds allowed) in `section` (None: between steps)."""
        if section is not None:
            allowed = self.allowance(section)
            return section_began + allowed, allowed
        if self.last_progress is None:
            allowed = max(self.timeout(), FIRST_SECTION_S)
            return self.started + allowed, allowed
        allowed = self.timeout()
        return self.last_progress + allowed, allowed


def identity(environ: Mapping[str, str]) -> Tuple[int, int, int]:
    """(rank, local rank, processes in the job): torchrun's RANK, LOCAL_RANK, WORLD_SIZE; else the task's
    DLAUNCH_TASK_ID, DLAUNCH_LOCAL_TASK_ID, DLAUNCH_NTASKS (dlaunch/train/jobenv.py); else a job of one."""
    if environ.get("RANK", "").isdigit():
        return int(environ["RANK"]), int(environ.get("LOCAL_RANK") or 0), int(environ.get("WORLD_SIZE") or 1)
    if jobenv.task_count(environ) is not None:
        task = jobenv.task(environ)
        return task.task_id, task.local_id, task.ntasks
    return 0, 0, 1


def local_folder(run_dir: str, environ: Mapping[str, str], host: str) -> str:
    """The node-local folder of this attempt of the run: the same for every process of the node (they share the run
    directory, the job's id and attempt, torchrun's run id and restart, the host), another for the next attempt, and
    another for each host where nodes share the folder (the test cluster's nodes share /dev/shm: without the host, one
    node's writer published the other's ranks as its own, naming the wrong node)."""
    parts = [os.path.abspath(run_dir), host] + [
        environ.get(name, "")
        for name in (
            jobenv.JOB_ID,
            jobenv.RESTART_COUNT,
            jobenv.RETRY,
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT",
        )
    ]
    if not any(parts[2:]):
        parts.append(str(os.getpid()))  # a process of its own (no job, no torchrun): nothing to share
    root = environ.get(LOCAL_ROOT_ENV) or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
    return os.path.join(root, "dlaunch-heartbeat-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _say(text: str) -> None:
    """One line on stderr without Python's stream lock (the main thread may hold it)."""
    try:
        os.write(2, ("train: %s\n" % text).encode("utf-8", "replace"))
    except OSError:
        pass


class Watchdog:
    """This process's heartbeat thread and hang detection (one per process: `start()` registers it)."""

    def __init__(
        self,
        run_dir: str,
        hang_timeout: Optional[float],
        environ: Mapping[str, str],
        host: str,
        role: str = "worker",
    ):
        self.run_dir = run_dir
        self.host = host
        self.role = role
        self.serves = False  # `serving()`: no steps, no deadline
        self.rank, self.local_rank, self.world = identity(environ)
        self.off = hang_timeout == 0
        base = hang_timeout if hang_timeout else FLOOR_S
        self.beat_s, self.node_s, self.stale_s = intervals(base)
        self.started_wall = time.time()
        self.clock = HangClock(hang_timeout or None, time.monotonic())
        self.local_dir = local_folder(run_dir, environ, host)
        self.hang_dir = os.path.join(run_dir, hb.HANG_DIR)
        self.section_name: Optional[str] = None
        self.section_start = 0.0
        self.paused_now = False
        self.step: Optional[int] = None
        self.step_time: Optional[float] = None
        self.epoch: Optional[int] = None
        # What the thread reads: (step, step_time, epoch, phase, phase_since, deadline, timeout_s, paused), one tuple.
        self.published: Tuple[Any, ...] = ()
        self.phase("start-up")
        # Set by the trainer: the flight recorder's dump (path -> summary, or "unavailable: ..."), the end record.
        self.flight_recorder: Optional[Callable[[str], Any]] = None
        self.flight_recorder_missing = unavailable("this trainer has no flight recorder")
        self.flight_recorder_setting = self.flight_recorder_missing  # for the metrics header
        self.on_hung: Optional[Callable[[Dict[str, Any]], None]] = None
        self.overdue_since: Optional[float] = None
        self.overdue_timeout = 0.0
        self.dumped = False
        self.flight_summary: Any = None
        self.last_node_write = -float("inf")
        self.node_writer = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dlaunch-watchdog", daemon=True)

    # -- the main thread's reports ----------------------------------------------------------------------------------
    def _publish(self, phase: str) -> None:
        deadline, allowed = self.clock.deadline(self.section_name, self.section_start)
        self.published = (
            self.step,
            self.step_time,
            self.epoch,
            phase,
            time.time(),
            deadline,
            None if self.off or self.serves else allowed,
            self.paused_now,
        )

    def phase(self, name: str) -> None:
        """Now in phase `name` (heartbeat.PHASES); the deadline does not move."""
        self._publish(name)

    def step_done(self, step: int, epoch: int) -> None:
        """The run's global step `step` (of epoch `epoch`) finished in this process."""
        self.clock.progress(time.monotonic())
        self.step, self.step_time, self.epoch = step, time.time(), epoch
        self._publish(self.published[3])

    def epoch_began(self, epoch: int) -> None:
        self.epoch = epoch
        self._publish("loader start")

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """A known long section (heartbeat.SECTIONS): its own allowance; its end counts as progress."""
        began = time.monotonic()
        self.clock.section_began(began)
        self.section_name, self.section_start = name, began
        self._publish(name)
        try:
            yield
        finally:
            self.clock.section_ended(name, began, time.monotonic())
            self.section_name = None
            self._publish("epoch boundary")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No deadline while inside; the clock restarts at its end (the phase shown stays)."""
        self.paused_now = True
        self._publish(self.published[3])
        try:
            yield
        finally:
            now = time.monotonic()
            self.clock.restart(now)
            if self.section_name is not None:
                self.section_start = now
            self.paused_now = False
            self._publish(self.published[3])

    def settings(self) -> Dict[str, Any]:
        """What the metrics header records of the watchdog (framework_settings.watchdog)."""
        return {
            "hang_timeout_s": 0 if self.off else self.clock.fixed or "from the measured steps, at least %g" % FLOOR_S,
            "heartbeat_s": self.beat_s,
            "node_file_s": self.node_s,
            "flight_recorder": self.flight_recorder_setting,
        }

    def serving(self, role: str = "server") -> None:
        """This process only serves (a parameter server, a scheduler): it beats, it has no deadline of its own."""
        self.role, self.serves = role, True
        self._publish("serving")

    # -- the thread ---------------------------------------------------------------------------------------------------
    def start(self) -> "Watchdog":
        os.makedirs(self.local_dir, exist_ok=True)
        _current[:] = [self]
        self._write_own_state()
        self.thread.start()
        return self

    def stop(self) -> None:
        """At the process's ordinary end: the thread stops, this process's node-local state goes."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5 * self.beat_s + 5)
        with contextlib.suppress(OSError):
            os.unlink(self._own_file())
        with contextlib.suppress(OSError):
            os.rmdir(self.local_dir)  # the last process of the node
        _current[:] = []

    def _own_file(self) -> str:
        return os.path.join(self.local_dir, "rank%d.json" % self.rank)

    def state(self) -> Dict[str, Any]:
        """This process's state as RANK_FIELDS (plus its flight recorder's summary after a hang)."""
        step, step_time, epoch, phase, since, _, allowed, _ = self.published
        state = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "role": self.role,
            "pid": os.getpid(),
            "heartbeat": time.time(),
            "step": step,
            "step_time": step_time,
            "epoch": epoch,
            "phase": phase,
            "phase_since": since,
            "timeout_s": allowed,
            "overdue": self.overdue_since is not None,
        }
        if self.flight_summary is not None:
            state["flight_recorder"] = self.flight_summary
        return state

    def _write_own_state(self) -> None:
        hb.write_json_atomically(self._own_file(), self.state())

    def _run(self) -> None:
        while not self.stopping.wait(self.beat_s):
            try:
                self._tick()
            except Exception as e:  # the watchdog never ends the training by its own error
                _say("watchdog: %s: %s" % (type(e).__name__, e))

    def _tick(self) -> None:
        now = time.monotonic()
        deadline, allowed, paused = self.published[5], self.published[6], self.published[7]
        if self.overdue_since is None and allowed is not None and not paused and now > deadline:
            self._become_overdue(allowed)
        self._write_own_state()
        if now - self.last_node_write >= self.node_s:
            self.last_node_write = now
            self._write_node_file()
        if os.path.exists(os.path.join(self.local_dir, HUNG_MARK)):
            self._end_hung()
        if self.overdue_since is not None:
            self._judge_if_due(now)

    def _local_states(self) -> List[Dict[str, Any]]:
        states = []
        for name in os.listdir(self.local_dir):
            if name.startswith("rank") and name.endswith(".json"):
                state = hb.read_json(os.path.join(self.local_dir, name), hb.MAX_NODE_BYTES)
                if hb.rank_state_problem(state) is None and _alive(state["pid"]):
                    states.append(state)
        return states

    def _write_node_file(self) -> None:
        """As the node's writer (the lowest-ranked process with steps and a fresh heartbeat here, else the lowest-ranked
        with a fresh heartbeat: a process that only serves has no deadline and so never judges): this node's file in
        the run directory, and whether the run has been found hung."""
        states = self._local_states()
        wall = time.time()
        fresh = [(s["phase"] == "serving", s["rank"]) for s in states if wall - s["heartbeat"] <= self.stale_s]
        self.node_writer = not fresh or min(fresh) >= (self.serves, self.rank)
        if not self.node_writer:
            return
        folder = os.path.join(self.run_dir, hb.HEARTBEAT_DIR)
        os.makedirs(folder, exist_ok=True)
        record = hb.node_record(self.host, self.rank, wall, self.node_s, states)
        hb.write_json_atomically(os.path.join(folder, hb.node_file_name(self.host, self.rank)), record)
        if self._hang_recorded():
            with open(os.path.join(self.local_dir, HUNG_MARK), "w"):
                pass

    # -- a hang ---------------------------------------------------------------------------------------------------------
    def _dump(self) -> None:
        """This process's stacks and flight recorder into the run directory (once)."""
        if self.dumped:
            return
        self.dumped = True
        os.makedirs(self.hang_dir, exist_ok=True)
        with open(os.path.join(self.hang_dir, "stacks.rank%d.txt" % self.rank), "w") as f:
            f.write("rank %d (%s, local rank %d, pid %d)\n" % (self.rank, self.host, self.local_rank, os.getpid()))
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        self.flight_summary = self.flight_recorder_missing
        if self.flight_recorder is not None:
            self.flight_summary = _within(DUMP_TIMEOUT_S, self.flight_recorder, self.hang_dir) or unavailable(
                "the flight recorder's dump did not return within %.0f s" % DUMP_TIMEOUT_S
            )
        self._write_own_state()

    def _become_overdue(self, allowed: float) -> None:
        self.overdue_since, self.overdue_timeout = time.monotonic(), allowed
        step, _, _, phase = self.published[:4]
        _say(
            "hang: no progress for %.0f s (rank %d, step %s, phase %s); stacks in %s"
            % (allowed, self.rank, step, phase, self.hang_dir)
        )
        self._dump()

    def _judge_if_due(self, now: float) -> None:
        """Write the hang record once every node's file has been rewritten since this process became overdue, if it
        is the judge: the lowest live worker's node writer; after 4 node intervals without a record any overdue node
        writer, after 8 any overdue process."""
        if self.overdue_since is None:
            return  # not overdue
        waited = now - self.overdue_since
        if self._hang_recorded():
            self._end_hung()
        if waited < self.node_s + 2 * self.beat_s:
            return
        if (self.node_writer and (waited >= 4 * self.node_s or self._lowest_live())) or waited >= 8 * self.node_s:
            self._write_hang_record()
            self._end_hung()

    def _hang_recorded(self) -> bool:
        """Whether a process wrote this attempt's hang record (one older than this process is an earlier attempt's: a
        resumed run, or the job script's retry after a hang, keeps the run directory and its hang.json)."""
        if not os.path.exists(os.path.join(self.run_dir, hb.HANG_FILE)):
            return False
        record = hb.read_hang_record(self.run_dir)
        return record is None or record["time"] >= self.started_wall

    def _lowest_live(self) -> bool:
        """Whether no node file of a lower writer shows a live worker of a lower rank (read in rank order, up to
        the first that does)."""
        folder = os.path.join(self.run_dir, hb.HEARTBEAT_DIR)
        lower = []
        for name in os.listdir(folder):
            writer = name[:-5].rsplit(".", 1)[-1] if name.endswith(".json") else ""
            if writer.isdigit() and int(writer) < self.rank:
                lower.append((int(writer), name))
        wall = time.time()
        for _, name in sorted(lower):
            record = hb.read_json(os.path.join(folder, name), hb.MAX_NODE_BYTES)
            if hb.node_file_problem(record) is None and any(
                s["rank"] < self.rank and s["phase"] != "serving" and wall - s["heartbeat"] <= self.stale_s
                for s in record["ranks"]
            ):
                return False
        return True

    def _write_hang_record(self) -> None:
        record = judge(
            hb.read_node_files(self.run_dir),
            list(range(self.world)),
            time.time(),
            self.stale_s,
            self.overdue_timeout,
            {"rank": self.rank, "host": self.host},
        )
        names = sorted(os.listdir(self.hang_dir))
        record["stacks"] = [hb.HANG_DIR + "/" + n for n in names if n.startswith("stacks.")]
        record["flight_recorder_dumps"] = [hb.HANG_DIR + "/" + n for n in names if n.startswith("flight_recorder.")]
        hb.write_json_atomically(os.path.join(self.run_dir, hb.HANG_FILE), record)
        _say("hang: %s; record in %s" % (record["summary"], os.path.join(self.run_dir, hb.HANG_FILE)))

    def _end_hung(self) -> None:
        """The run was found hung: stacks, the end record (rank 0), exit EXIT_HUNG. Never returns."""
        self._dump()
        record = hb.read_hang_record(self.run_dir)
        if record is not None and self.on_hung is not None:
            _within(DUMP_TIMEOUT_S, self.on_hung, record)
        with contextlib.suppress(OSError):
            os.unlink(self._own_file())
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(EXIT_HUNG)


def _within(seconds: float, call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)` on a thread of its own; its result, or None when it raised or did not return in time."""
    result: List[Any] = []

    def target() -> None:
        try:
            result.append(call(*args))
        except Exception as e:
            result.append(unavailable("%s: %s" % (type(e).__name__, e)))

    worker = threading.Thread(target=target, name="dlaunch-watchdog-call", daemon=True)
    worker.start()
    worker.join(seconds)
    return result[0] if result else None


def judge(
    records: List[Dict[str, Any]],
    expected: List[int],
    now: float,
    stale_s: float,
    timeout_s: float,
    detected_by: Dict[str, Any],
) -> Dict[str, Any]:
    """The hang record (heartbeat.HANG_FIELDS, without its file lists) from the node files `records` at wall time
    `now`: which of the `expected` ranks are silent, and why."""
    merged = hb.merge_ranks(records)
    seen = []
    for rank in sorted(set(expected) | set(merged)):
        state = merged.get(rank)
        if state is not None:
            seen.append(dict(state, heartbeat_age_s=now - state["heartbeat"]))
    silent = []
    for rank in expected:
        state = merged.get(rank)
        if state is None:
            silent.append(_silent({"rank": rank}, now, "never reported"))
        elif now - state["heartbeat"] > stale_s:
            silent.append(_silent(state, now, "no heartbeat for %.0f s" % (now - state["heartbeat"])))
    summaries = {
        s["flight_recorder"]["pg_rank"]: s["flight_recorder"]
        for s in seen
        if isinstance(s.get("flight_recorder"), dict)
    }
    reasons = [s["flight_recorder"] for s in seen if isinstance(s.get("flight_recorder"), str)]
    to_rank = {s["flight_recorder"]["pg_rank"]: s["rank"] for s in seen if isinstance(s.get("flight_recorder"), dict)}
    stepping = [s for s in seen if s["phase"] != "serving"]
    collective: Any = first_unfinished(summaries, list(range(len(stepping)))) if summaries else None
    if not summaries:
        collective = reasons[0] if reasons else unavailable("no process dumped a flight recorder")
    if not silent:
        steps = [s["step"] for s in stepping if s["step"] is not None]
        top = max(steps) if steps else None
        for s in stepping:
            if top is not None and (s["step"] is None or s["step"] < top):
                silent.append(
                    _silent(s, now, "behind: alive at step %s while others finished step %d" % (s["step"], top))
                )
    if not silent and isinstance(collective, dict):
        for pg_rank in collective["missing_ranks"]:
            state = merged.get(to_rank.get(pg_rank, pg_rank))
            if state is not None:
                why = "missing from collective %d (%s)" % (collective["collective_seq_id"], collective["op"])
                silent.append(_silent(state, now, why))
    if silent:
        summary = "; ".join(
            "rank %d (%s, local rank %s) %s, %s, phase %s"
            % (s["rank"], s["host"], s["local_rank"], s["why"], hb.at_step(s["step"]), s["phase"])
            for s in silent
        )
    else:
        phases = ", ".join(sorted({str(s["phase"]) for s in stepping})) or "unknown"
        summary = "no process stands out: every one is alive at the same step (phase %s)%s" % (
            phases,
            _where_all_wait(collective, bool(stepping) and len(summaries) >= len(stepping)),
        )
    return {
        "schema": hb.HANG_SCHEMA,
        "version": hb.HANG_VERSION,
        "time": now,
        "detected_by": detected_by,
        "timeout_s": timeout_s,
        "summary": "no progress for %.0f s: %s" % (timeout_s, summary),
        "silent": silent,
        "ranks": seen,
        "flight_recorder": collective,
        "stacks": [],
        "flight_recorder_dumps": [],
    }


def _where_all_wait(collective: Any, all_dumped: bool) -> str:
    """Where processes all alive at one step hang, as their flight recorders tell (the hang summary's end)."""
    if isinstance(collective, dict):
        return ", waiting in collective %d (%s): the collective or the network hangs" % (
            collective["collective_seq_id"],
            collective["op"],
        )
    if all_dumped:
        # Seen on an H200 (benchmarks/README.md): a GPU that stopped computing left every recorded collective completed.
        return (
            " and every collective in their flight recorders completed: the hang is in their own work, not in a "
            "collective (a GPU that stopped computing, a deadlock: see the stacks)"
        )
    return ": a collective, the network or a GPU hangs (see the stacks)"


def _silent(state: Dict[str, Any], now: float, why: str) -> Dict[str, Any]:
    """One silent process (heartbeat.SILENT_FIELDS)."""
    heard = state.get("heartbeat")
    stepped = state.get("step_time")
    return {
        "host": state.get("host"),
        "rank": state["rank"],
        "local_rank": state.get("local_rank"),
        "role": state.get("role"),
        "step": state.get("step"),
        "epoch": state.get("epoch"),
        "phase": state.get("phase"),
        "silent_s": None if heard is None else now - heard,
        "stalled_s": None if stepped is None else now - stepped,
        "why": why,
    }
