"""Hang detection (issue 44: dlaunch/train/watchdog.py, heartbeat.py, flight_recorder.py): the deadline's arithmetic, the
files' formats, the verdict from node files, the flight recorder's dump read (NCCL dumps captured on an H200, and fake
ones of 4 ranks built in torch's documented format; gloo's real dumps in the runs below), and real 2-rank gloo runs under torchrun:
one rank stopped for good (SIGSTOP) after its first epoch, and a section held long that must not be called hung."""

import hashlib
import os
import pickle
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers_train import TINY, start_trainer, worker_pids
from holds import Hold, Lines

from dlaunch.train import flight_recorder as fr
from dlaunch.train import heartbeat as hb
from dlaunch.train.config import FLAGS_BY_NAME, ConfigError, parse_config
from dlaunch.train.data.make_folder import make_pattern_folder
from dlaunch.train.errors import EXIT_HUNG
from dlaunch.train.metrics_schema import MetricsError, make_record, read_metrics
from dlaunch.train.watchdog import FIRST_SECTION_S, FLOOR_S, SAFETY_FACTOR, HangClock, intervals, judge

HANG_TIMEOUT_S = 4.0  # the runs' --hang-timeout: beat 0.4 s, node file 0.8 s, a heartbeat stale after 2 s


# -- the deadline ----------------------------------------------------------------------------------------------------


def test_the_default_timeout_is_the_floor_until_steps_and_boundaries_are_long():
    clock = HangClock(None, started=0.0)
    assert clock.deadline(None, 0.0) == (FIRST_SECTION_S, FIRST_SECTION_S)  # start-up: before the first step
    clock.progress(100.0)  # the first step: start-up is not a stretch
    for t in (101.0, 102.0, 103.5):  # steps of 1 to 1.5 s
        clock.progress(t)
    assert clock.longest_stretch == 1.5 and clock.timeout() == FLOOR_S
    assert clock.deadline(None, 0.0) == (103.5 + FLOOR_S, FLOOR_S)
    clock.progress(103.5 + 60.0)  # an epoch boundary of a minute
    assert clock.timeout() == SAFETY_FACTOR * 60.0


def test_a_job_whose_steps_take_seconds_is_stopped_within_5_minutes_of_its_hang():
    """FLOOR_S after the last step the deadline passes; the verdict waits one node interval and two beats more, and
    torchrun gives a stopped process 30 s before it kills it."""
    beat, node, _ = intervals(FLOOR_S)
    assert FLOOR_S + node + 2 * beat + beat + 30 < 300


def test_sections_have_their_own_allowance_from_their_observed_time():
    clock = HangClock(None, started=0.0)
    clock.progress(10.0)
    clock.progress(11.0)
    assert clock.deadline("validation", 20.0) == (20.0 + FIRST_SECTION_S, FIRST_SECTION_S)  # never seen
    clock.section_began(20.0)  # the 9 s before it is a stretch too
    clock.section_ended("validation", 20.0, 420.0)  # 400 s
    assert clock.longest_stretch == 9.0 and clock.last_progress == 420.0
    assert clock.allowance("validation") == SAFETY_FACTOR * 400.0
    assert clock.allowance("checkpoint") == FIRST_SECTION_S
    clock.section_ended("checkpoint", 430.0, 431.0)
    assert clock.allowance("checkpoint") == FLOOR_S  # 5 s observed: never less than the timeout


def test_the_flag_fixes_the_timeout_and_a_pause_restarts_the_clock():
    clock = HangClock(6.0, started=0.0)
    clock.progress(1.0)
    clock.progress(100.0)  # a long stretch does not move a timeout the user set
    assert clock.deadline(None, 0.0) == (106.0, 6.0)
    assert clock.allowance("validation") == FIRST_SECTION_S
    clock.restart(500.0)
    assert clock.deadline(None, 0.0) == (506.0, 6.0) and clock.longest_stretch == 99.0
    assert intervals(6.0) == pytest.approx((0.6, 1.2, 3.0)) and intervals(FLOOR_S) == (1.0, 10.0, 30.0)


@pytest.mark.parametrize("value, ok", [("0", True), ("5", True), ("2", True), ("1", False), ("-3", False)])
def test_the_hang_timeout_flag(value, ok):
    assert FLAGS_BY_NAME["hang-timeout"].launcher  # the launcher's option comes from here
    if ok:
        assert parse_config(["--hang-timeout", value]).hang_timeout == float(value)
    else:
        with pytest.raises(ConfigError, match="--hang-timeout .* must be 0 \\(off\\) or at least 2 seconds"):
            parse_config(["--hang-timeout", value])
    assert parse_config([]).hang_timeout is None


# -- the flight recorder's dump --------------------------------------------------------------------------------------


def fake_nccl_dump(rank: int, enqueued: int, completed: int, version: str = "2.5", status: bool = True) -> bytes:
    """FAKE: what torch's `_dump_nccl_trace()` returns on a GPU node (no GPU here), built as pytorch/tutorials'
    flight_recorder_tutorial documents the format (version 2.5): entries 40..`enqueued` of the default group, the last
    ones not completed; pg_status where the format has it."""
    entries = []
    for seq in range(40, enqueued + 1):
        entries.append(
            {
                "frames": [{"name": "all_reduce", "filename": "distributed_c10d.py", "line": 2696}],
                "record_id": seq - 40,
                "pg_id": 0,
                "process_group": ("0", "default_pg"),
                "collective_seq_id": seq,
                "p2p_seq_id": 0,
                "op_id": seq,
                "profiling_name": "nccl:all_reduce" if seq < 42 else "nccl:broadcast",
                "time_created_ns": 1724779239936775119 + seq,
                "input_sizes": [[1024, 1024]],
                "input_dtypes": ["Float"],
                "output_sizes": [[1024, 1024]],
                "output_dtypes": ["Float"],
                "state": "completed" if seq <= completed else "started",
                "time_discovered_started_ns": None,
                "time_discovered_completed_ns": None,
                "retired": seq <= completed,
                "timeout_ms": 600000,
                "is_p2p": False,
            }
        )
    dump = {
        "version": version,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
        "entries": entries,
    }
    if status:
        dump["pg_status"] = {
            "0": {
                "last_enqueued_collective": enqueued,
                "last_started_collective": enqueued,
                "last_completed_collective": completed,
            }
        }
    return pickle.dumps(dump)


@pytest.mark.parametrize("status", [True, False], ids=["pg_status", "older format: from the entries"])
def test_the_first_collective_not_every_rank_entered_names_the_missing_rank(status):
    """Ranks 0 and 1 entered broadcast 42 and wait in it; rank 2's dump ends at 41 (it never entered); rank 3 wrote no
    dump (stopped). What torchfrtrace reports: 'Not all ranks joining collective 42 ... missing ranks: {2}'."""
    summaries = {
        rank: fr.summary(fr.load(fake_nccl_dump(rank, enq, enq - 1 if rank < 2 else enq, status=status)), rank)
        for rank, enq in ((0, 42), (1, 42), (2, 41))
    }
    assert summaries[0]["groups"] == [
        {
            "pg_id": "0",
            "name": "0",
            "desc": "default_pg",
            "members": [0, 1, 2, 3],
            "last_enqueued": 42,
            "last_completed": 41,
        }
    ]
    assert fr.first_unfinished(summaries, [0, 1, 2, 3]) == {
        "process_group": "0:default_pg",
        "collective_seq_id": 42,
        "op": "nccl:broadcast",
        "input_sizes": [[1024, 1024]],
        "input_dtypes": ["Float"],
        "state": "started",
        "entered": [0, 1],
        "missing_ranks": [2],
        "undumped_ranks": [3],
    }


def test_nothing_unfinished_and_a_dump_naming_a_class_is_refused():
    done = {rank: fr.summary(fr.load(fake_nccl_dump(rank, 41, 41)), rank) for rank in range(4)}
    assert fr.first_unfinished(done, [0, 1, 2, 3]) is None
    assert len(done[0]["pending"]) == 0

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(ValueError, match="names no class"):
        fr.load(pickle.dumps({"entries": [Evil()]}))
    with pytest.raises(ValueError, match="no list of entries"):
        fr.load(pickle.dumps({"version": "2.5"}))


@pytest.mark.parametrize(
    "backend, release, gloo, expected",
    [
        ("nccl", (2, 14), True, "TORCH_FR_BUFFER_SIZE=2000"),
        ("gloo", (2, 14), True, "TORCH_FR_BUFFER_SIZE=2000"),
        ("nccl", (2, 5), False, "TORCH_NCCL_TRACE_BUFFER_SIZE=2000"),
        ("gloo", (2, 5), False, "unavailable: this torch's flight recorder does not record gloo's collectives"),
        ("nccl", (1, 11), False, "unavailable: torch 1.11 has no flight recorder (2.2 on)"),
    ],
)
def test_the_recorder_is_turned_on_where_the_torch_has_it(backend, release, gloo, expected):
    environ = {}
    assert fr.enable(environ, backend, release, gloo) == expected
    assert environ == ({} if expected.startswith("unavailable") else dict([expected.split("=")]))
    users = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}
    if not expected.startswith("unavailable"):
        assert fr.enable(users, backend, release, gloo) == "TORCH_NCCL_TRACE_BUFFER_SIZE=500 (set by the user)"
    assert fr.torch_release("2.14.1+cu130") == (2, 14) and fr.torch_release("1.11.0") == (1, 11)


REAL_DUMPS = Path(__file__).parent / "flight_recorder"  # captured on an H200: its README says how
REAL_SHA256 = {
    "nccl-2.28.9-h200-pending.rank0": "06f45bafaf41549050fcb8e57d5801118837093b48988b15ed5fb0f042f2eaa6",
    "nccl-2.28.9-h200-gpu-stopped.rank0": "ef738de6a4dc2db3b13e94c7d46c21379552a6e0c44c4ffeaf63c62bd9fcb7be",
}


def real_dump(name: str) -> dict:
    data = (REAL_DUMPS / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == REAL_SHA256[name], "%s is not the captured dump" % name
    return fr.load(data)


def test_real_nccl_dumps_are_read_the_trainers_way():
    """NCCL 2.28.9's dumps through torch 2.11 on an H200 (format 2.10): an all-reduce enqueued behind a stopped GPU is
    the first unfinished collective, with its operation, sizes and state; the trainer's dump at a GPU hang has none."""
    pending = fr.summary(real_dump("nccl-2.28.9-h200-pending.rank0"), 0)
    assert pending["version"] == "2.10"
    assert pending["groups"] == [
        {"pg_id": "0", "name": "0", "desc": "default_pg", "members": [0], "last_enqueued": 4, "last_completed": 3}
    ]
    assert fr.first_unfinished({0: pending}, [0]) == {
        "process_group": "0:default_pg",
        "collective_seq_id": 4,
        "op": "nccl:all_reduce",
        "input_sizes": [[1024]],
        "input_dtypes": ["Float"],
        "state": "scheduled",
        "entered": [0],
        "missing_ranks": [],
        "undumped_ranks": [],
    }
    stopped = fr.summary(real_dump("nccl-2.28.9-h200-gpu-stopped.rank0"), 0)
    assert (stopped["groups"][0]["last_enqueued"], stopped["groups"][0]["last_completed"], stopped["pending"]) == (6, 6, [])
    assert fr.first_unfinished({0: stopped}, [0]) is None


@pytest.mark.parametrize(
    "dump, ending",
    [
        (
            "nccl-2.28.9-h200-gpu-stopped.rank0",
            " and every collective in their flight recorders completed: the hang is in their own work, not in a "
            "collective (a GPU that stopped computing, a deadlock: see the stacks)",
        ),
        ("nccl-2.28.9-h200-pending.rank0", ", waiting in collective 4 (nccl:all_reduce): the collective or the network hangs"),
        (None, ": a collective, the network or a GPU hangs (see the stacks)"),
    ],
    ids=["all completed (a GPU that stopped)", "a collective pending", "no dump"],
)
def test_when_every_process_is_alive_at_one_step_the_verdict_says_what_the_flight_recorders_rule_out(dump, ending):
    """Seen on an H200: a GPU that stopped computing left one live rank in its backward pass, every collective
    completed; the verdict had said "a collective or the network hangs", the one thing the dump ruled out."""
    more = {"flight_recorder": fr.summary(real_dump(dump), 0)} if dump else {}
    record = judge(
        [hb.node_record("n1", 0, 999.0, 1.0, [state(0, 999.0, **more)])], [0], 1000.0, 30.0, 10.0, {"rank": 0, "host": "n1"}
    )
    assert record["silent"] == []
    assert record["summary"] == (
        "no progress for 10 s: no process stands out: every one is alive at the same step (phase backward)" + ending
    )


# -- the verdict from node files -------------------------------------------------------------------------------------


def state(rank, heartbeat, step=30, phase="backward", local_rank=0, **more):
    return dict(
        {
            "rank": rank,
            "local_rank": local_rank,
            "role": "worker",
            "pid": 100 + rank,
            "heartbeat": heartbeat,
            "step": step,
            "step_time": 900.0,
            "epoch": 2,
            "phase": phase,
            "phase_since": 950.0,
            "timeout_s": 180.0,
            "overdue": True,
        },
        **more,
    )


def test_a_rank_whose_heartbeat_stopped_is_named_with_its_node_step_and_phase():
    n1 = hb.node_record("n1", 0, 999.0, 10.0, [state(0, 999.0), state(1, 999.0, local_rank=1)])
    n2 = hb.node_record("n2", 2, 999.0, 10.0, [state(2, 820.0, step=29, phase="data"), state(3, 999.0, local_rank=1)])
    old_n2 = hb.node_record("n2", 2, 700.0, 10.0, [state(2, 700.0, step=28)])  # an older file of n2: merged, not used
    record = judge([n1, n2, old_n2], [0, 1, 2, 3], 1000.0, 30.0, 180.0, {"rank": 0, "host": "n1"})
    assert hb.hang_record_problem(record) is None
    assert record["silent"] == [
        {
            "host": "n2",
            "rank": 2,
            "local_rank": 0,
            "role": "worker",
            "step": 29,
            "epoch": 2,
            "phase": "data",
            "silent_s": 180.0,
            "stalled_s": 100.0,
            "why": "no heartbeat for 180 s",
        }
    ]
    assert record["summary"] == (
        "no progress for 180 s: rank 2 (n2, local rank 0) no heartbeat for 180 s, at step 29, phase data"
    )
    assert [r["rank"] for r in record["ranks"]] == [0, 1, 2, 3]
    assert record["flight_recorder"] == "unavailable: no process dumped a flight recorder"


def test_a_silent_process_that_finished_no_step_reads_so_not_step_none():
    n1 = hb.node_record("n1", 0, 999.0, 10.0, [state(0, 999.0), state(1, 800.0, step=None, phase="loader start")])
    record = judge([n1], [0, 1], 1000.0, 30.0, 180.0, {"rank": 0, "host": "n1"})
    assert record["summary"].endswith("rank 1 (n1, local rank 0) no heartbeat for 200 s, before its first step, phase "
                                      "loader start")


def test_without_a_silent_rank_the_one_behind_then_the_flight_recorders_missing_rank_is_named():
    n1 = hb.node_record("n1", 0, 999.0, 10.0, [state(0, 999.0), state(1, 999.0, step=29, phase="data")])
    record = judge([n1], [0, 1], 1000.0, 30.0, 180.0, {"rank": 0, "host": "n1"})
    assert [(s["rank"], s["why"]) for s in record["silent"]] == [
        (1, "behind: alive at step 29 while others finished step 30")
    ]
    summaries = [fr.summary(fr.load(fake_nccl_dump(r, 42 if r != 3 else 41, 41)), r) for r in range(4)]
    ranks = [state(r, 999.0, flight_recorder=summaries[r]) for r in range(4)]
    record = judge(
        [hb.node_record("n1", 0, 999.0, 10.0, ranks)], [0, 1, 2, 3], 1000.0, 30.0, 180.0, {"rank": 0, "host": "n1"}
    )
    assert [(s["rank"], s["why"]) for s in record["silent"]] == [(3, "missing from collective 42 (nccl:broadcast)")]
    never = judge([], [0], 1000.0, 30.0, 180.0, {"rank": 1, "host": "n1"})
    assert never["silent"][0]["why"] == "never reported" and never["silent"][0]["host"] is None


def test_a_process_that_only_serves_is_never_behind():
    """A parameter server (phase serving, no steps) beside two workers, one of them behind."""
    server = dict(state(0, 999.0, step=None, phase="serving", timeout_s=None, overdue=False), role="server")
    n1 = hb.node_record("n1", 1, 999.0, 10.0, [server, state(1, 999.0, step=12), state(2, 999.0, step=11)])
    record = judge([n1], [0, 1, 2], 1000.0, 30.0, 180.0, {"rank": 1, "host": "n1"})
    assert [(s["rank"], s["role"], s["why"]) for s in record["silent"]] == [
        (2, "worker", "behind: alive at step 11 while others finished step 12")
    ]


def test_the_files_the_launcher_reads(tmp_path):
    folder = tmp_path / hb.HEARTBEAT_DIR
    folder.mkdir()
    n2 = hb.node_record("n2", 2, 999.0, 10.0, [state(3, 998.0, step=31), state(2, 990.0, step=30, step_time=950.0)])
    hb.write_json_atomically(str(folder / hb.node_file_name("n2", 2)), n2)
    hb.write_json_atomically(
        str(folder / hb.node_file_name("n2", 3)), hb.node_record("n2", 3, 1005.0, 10.0, [state(3, 1004.0, step=32)])
    )
    (folder / "junk.json").write_text("{")
    os.symlink(folder / hb.node_file_name("n2", 2), folder / "link.json")
    nodes = hb.read_heartbeats(str(tmp_path))
    assert list(nodes) == ["n2"]
    assert (nodes["n2"]["time"], nodes["n2"]["last_step"], nodes["n2"]["last_step_time"]) == (1005.0, 30, 950.0)
    assert [(r["rank"], r["step"]) for r in nodes["n2"]["ranks"]] == [(2, 30), (3, 32)]  # each rank's freshest
    assert oct(os.stat(folder / hb.node_file_name("n2", 2)).st_mode & 0o777) == "0o644"
    assert hb.read_hang_record(str(tmp_path)) is None
    record = judge([n2], [2, 3], 1000.0, 30.0, 180.0, {"rank": 3, "host": "n2"})
    hb.write_json_atomically(str(tmp_path / hb.HANG_FILE), record)
    assert hb.read_hang_record(str(tmp_path)) == record


def test_the_end_record_of_a_hung_run_is_metrics_version_5():
    record = judge(
        [hb.node_record("n1", 0, 999.0, 10.0, [state(0, 999.0), state(1, 900.0)])],
        [0, 1],
        1000.0,
        30.0,
        180.0,
        {"rank": 0, "host": "n1"},
    )
    end = make_record("end", 1.0, status="hung", total_time_s=5.0, epochs_completed=1, **hb.hung_end_fields(record))
    assert end["version"] == 5 and end["hang"]["silent"][0]["rank"] == 1 and end["reason"].startswith("no progress")
    with pytest.raises(MetricsError, match="field 'hang' has the keys silent, expected file"):
        make_record("end", 1.0, status="hung", total_time_s=5.0, epochs_completed=1, hang={"silent": []})


def test_an_earlier_attempts_hang_record_does_not_end_the_resumed_run(tmp_path):
    """A resumed run (`run --resume`, or the job script's retry after a hang) keeps the run directory and its hang.json:
    before, the first node file the resumed run wrote saw it and ended every process hung at once (seen on the test
    cluster: the retry ended 0.5 s after it resumed, with the old reason). Only a record of this attempt counts."""
    from dlaunch.train.watchdog import HUNG_MARK, Watchdog

    def record(at: float) -> dict:
        found = judge([], [0], at, 30.0, 10.0, {"rank": 0, "host": "n1"})
        return dict(found, stacks=[], flight_recorder_dumps=[])

    watchdog = Watchdog(str(tmp_path), 4.0, {}, "n1")
    mark = Path(watchdog.local_dir) / HUNG_MARK
    try:
        os.makedirs(watchdog.local_dir, exist_ok=True)
        hb.write_json_atomically(str(tmp_path / hb.HANG_FILE), record(watchdog.started_wall - 60))
        watchdog._write_node_file()
        assert not mark.exists() and not watchdog._hang_recorded()
        hb.write_json_atomically(str(tmp_path / hb.HANG_FILE), record(watchdog.started_wall + 1))
        watchdog._write_node_file()
        assert mark.exists() and watchdog._hang_recorded()
    finally:
        import shutil

        shutil.rmtree(watchdog.local_dir, ignore_errors=True)


# -- real runs: 2 gloo ranks under torchrun -------------------------------------------------------------------------


def run_args(run: Path, *more: str) -> list:
    return (
        TINY
        + [
            "--steps",
            "6",
            "--steps-per-epoch",
            "3",
            "--warmup-steps",
            "1",
            "--hang-timeout",
            str(HANG_TIMEOUT_S),
            "--metrics",
            str(run / "metrics.jsonl"),
            "--checkpoint-dir",
            str(run / "checkpoints"),
        ]
        + list(more)
    )


def wait_until(condition, proc: subprocess.Popen, err: Lines, what: str, timeout: float = 600):
    """Until `condition()` gives something true (a state the run is forced into); fails if the run ends first."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        assert proc.poll() is None, "the run ended before %s:\n%s" % (what, err.join(30)[-4000:])
        assert time.monotonic() < deadline, "not %s within %g s" % (what, timeout)
        time.sleep(0.1)


def zombie(pid: int) -> bool:
    """Whether process `pid` has exited and waits for its parent to collect it."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def rank_shown(run: Path, rank: int):
    """Rank `rank`'s state in the run's node files (what the launcher reads), None before there is one."""
    for node in hb.read_heartbeats(str(run)).values():
        for found in node["ranks"]:
            if found["rank"] == rank:
                return found
    return None


def test_a_rank_stopped_for_good_is_named_and_the_job_ends_hung(tmp_path):
    """Both ranks held after their first epoch (the failpoint pauses their watchdogs); once the node file shows rank 1
    held at the epoch boundary it is stopped for good (SIGSTOP from outside), then rank 0 is released into the stop
    check's all-reduce, which rank 1 never enters. Before the watchdog this run never ended (rank 0 waits in gloo's
    all-reduce, 30 minutes by default, and torchrun waits for it). Now rank 0's deadline passes HANG_TIMEOUT_S after its
    release: it names rank 1 (its heartbeat stopped before the release), dumps its own stacks and flight recorder,
    writes hang.json and the end record, and exits 69; torchrun then kills the stopped rank."""
    run = tmp_path / "run"
    hold = Hold(tmp_path)
    proc = start_trainer(run_args(run), nproc=2, env=hold.env())
    err = Lines(proc.stderr)
    stopped = None
    try:
        for rank in (0, 1):
            wait_until(Path("%s.held-after-epoch-0.rank%d" % (hold.file, rank)).exists, proc, err, "held")
        shown = wait_until(
            lambda: (rank_shown(run, 1) or {}).get("phase") == "epoch boundary" and rank_shown(run, 1),
            proc,
            err,
            "shown held at the epoch boundary",
        )
        assert (shown["step"], shown["epoch"], shown["local_rank"]) == (3, 0, 1)
        node = hb.read_heartbeats(str(run))[socket.gethostname()]
        assert node["last_step"] == 3 and node["interval_s"] == pytest.approx(0.8)
        workers = worker_pids(proc.pid)
        stopped = workers[1]
        os.kill(stopped, signal.SIGSTOP)
        released = time.time()
        hold.release(rank=0)
        # Once rank 0 has exited, torchrun sends the stopped rank SIGTERM, which a stopped process never handles, and
        # kills it 30 s later (torch.distributed.elastic's close timeout): the test kills it at once instead.
        wait_until(lambda: not os.path.exists("/proc/%d" % workers[0]) or zombie(workers[0]), proc, err, "rank 0 ended")
        os.kill(stopped, signal.SIGKILL)
        assert proc.wait(timeout=600) != 0
    finally:
        hold.release()
        if proc.poll() is None:
            proc.kill()
        if stopped is not None:
            subprocess.run(["kill", "-9", str(stopped)], stderr=subprocess.DEVNULL, check=False)
    log = err.join(60)
    assert "exitcode  : %d" % EXIT_HUNG in log, log[-4000:]  # torchrun's report of rank 0
    record = hb.read_hang_record(str(run))
    assert record is not None, log[-4000:]
    (silent,) = record["silent"]
    assert {k: silent[k] for k in ("host", "rank", "local_rank", "role", "step", "epoch", "phase")} == {
        "host": socket.gethostname(),
        "rank": 1,
        "local_rank": 1,
        "role": "worker",
        "step": 3,
        "epoch": 0,
        "phase": "epoch boundary",
    }
    assert silent["why"].startswith("no heartbeat for") and silent["silent_s"] >= HANG_TIMEOUT_S
    assert record["detected_by"] == {"rank": 0, "host": socket.gethostname()}
    assert record["time"] - released >= HANG_TIMEOUT_S  # never before the deadline
    assert record["flight_recorder"]["op"] == "gloo:all_reduce"  # the stop check's, a real gloo dump
    assert (record["flight_recorder"]["entered"], record["flight_recorder"]["undumped_ranks"]) == ([0], [1])
    assert record["stacks"] == ["hang/stacks.rank0.txt"]
    stacks = (run / "hang" / "stacks.rank0.txt").read_text()
    assert "agreed_stop" in stacks  # rank 0's main thread, waiting in the stop check's all-reduce
    assert (run / "hang" / "flight_recorder.rank0").exists()
    end = read_metrics(str(run / "metrics.jsonl")).end
    assert end["status"] == "hung" and end["hang"]["silent"] == record["silent"] and end["reason"] == record["summary"]


@pytest.mark.parametrize("section", ["validation", "checkpoint"])
def test_a_long_section_of_a_live_run_is_not_called_hung(tmp_path, section):
    """Each rank held inside its first epoch's validation or checkpoint (the failpoint leaves the watchdog running: a
    slow section) until the node file shows that rank 0 has been in it for longer than the hang timeout: the section's
    own allowance (never seen before: FIRST_SECTION_S) covers it, the run then ends ok and no hang is recorded."""
    run = tmp_path / "run"
    more = []
    if section == "validation":
        folder = tmp_path / "jpegs"
        make_pattern_folder(str(folder), 2, 12, 2, 40)  # 3 batches of 4 per rank and epoch
        more = ["--data", str(folder), "--workers", "0"]
    hold = Hold(tmp_path)
    proc = start_trainer(run_args(run, *more), nproc=2, env=dict(hold.env(), DLAUNCH_TEST_HOLD_IN=section))
    err = Lines(proc.stderr)
    try:
        wait_until(Path("%s.held-in-%s.rank0" % (hold.file, section)).exists, proc, err, "held")

        def long_enough():
            node = hb.read_heartbeats(str(run)).get(socket.gethostname())
            rank0 = rank_shown(run, 0)
            return node and rank0["phase"] == section and node["time"] - rank0["phase_since"] > 2 * HANG_TIMEOUT_S

        wait_until(long_enough, proc, err, "in the section for twice the hang timeout")
        assert rank_shown(run, 0)["timeout_s"] == FIRST_SECTION_S and not rank_shown(run, 0)["overdue"]
        hold.release()
        assert proc.wait(timeout=600) == 0, err.join(60)[-4000:]
    finally:
        hold.release()
        if proc.poll() is None:
            proc.kill()
    assert not (run / hb.HANG_FILE).exists()
    assert read_metrics(str(run / "metrics.jsonl")).end["status"] == "ok"
