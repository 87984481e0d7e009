"""A run that hangs, as `status` and `watch` show it (issue 44, the launcher's side): the trainer's heartbeat files
and hang record (dlaunch/train/heartbeat.py) written here with chosen times, never waited for."""

import json
import os
import time

from test_watch import epoch, header, make_record, watch_lines, write_run

from dlaunch import api
from dlaunch.cli import main
from dlaunch.runs.failures import scheduler_label
from dlaunch.runs.hangs import ago
from dlaunch.schedulers import RUNNING_HERE as LOCAL_RUNNING
from dlaunch.schedulers import JobState
from dlaunch.train import heartbeat as hb
from dlaunch.train.watchdog import judge


def state(rank, heartbeat, step, step_time, local_rank=0, phase="backward"):
    return {"rank": rank, "local_rank": local_rank, "role": "worker", "pid": 100 + rank, "heartbeat": heartbeat,
            "step": step, "step_time": step_time, "epoch": 1, "phase": phase, "phase_since": heartbeat,
            "timeout_s": 60.0, "overdue": False}


def write_node(run, host, writer, when, ranks, interval=10.0):
    folder = run / hb.HEARTBEAT_DIR
    folder.mkdir(exist_ok=True)
    record = hb.node_record(host, writer, when, interval, ranks)
    hb.write_json_atomically(str(folder / hb.node_file_name(host, writer)), record)
    return record


def hung_run(root, name, records, when, state_word="finished (exit 69)"):
    """A run whose rank 1 on dl-node2 stopped at step 4 (phase backward); hang.json written at `when`."""
    run = write_run(root, name, records, state=state_word)
    n1 = write_node(run, "dl-node1", 0, when - 1, [state(0, when - 1, 4, when - 70)])
    n2 = write_node(run, "dl-node2", 1, when - 62, [state(1, when - 62, 4, when - 75)])
    record = judge([n1, n2], [0, 1], when, 30.0, 60.0, {"rank": 0, "host": "dl-node1"})
    hb.write_json_atomically(str(run / hb.HANG_FILE), record)
    return run


def test_while_a_run_runs_status_and_watch_say_per_node_how_long_ago_it_last_finished_a_step(tmp_path, monkeypatch,
                                                                                            capsys):
    monkeypatch.chdir(tmp_path)
    run = write_run(tmp_path / "runs", "r", [header(), epoch(0)], state=LOCAL_RUNNING % os.getpid())
    now = time.time()
    write_node(run, "dl-node1", 0, now - 2, [state(0, now - 1, 40, now - 12), state(1, now - 1, 41, now - 3, 1)])
    # dl-node2's writer stopped 4 minutes ago (its file is older than 3 intervals): a stall the watchdog has not called
    write_node(run, "dl-node2", 2, now - 250, [state(2, now - 250, 30, now - 240)])
    [status] = api.status(["runs"])
    assert status.status == "running"
    assert status.nodes == ["dl-node1: last step 40 12 s ago", "dl-node2: last step 30 4 min ago, no heartbeat for 4 min"]
    assert main(["status", "runs"]) == 0
    out = capsys.readouterr().out
    assert "runs/r: dl-node2: last step 30 4 min ago, no heartbeat for 4 min" in out
    assert main(["watch", "--once", "runs"]) == 0  # watch names the stalled node only (dl-node1's line says nothing)
    [line] = watch_lines(capsys)
    assert "dl-node1" not in line and line.endswith("; dl-node2: last step 30 4 min ago, no heartbeat for 4 min"), line
    assert main(["status", "--json", "runs"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["nodes"][0] == "dl-node1: last step 40 12 s ago"
    write_node(run, "dl-node1", 0, now - 2, [state(0, now - 1, 40, now - 70), state(1, now - 1, 41, now - 3, 1)])
    assert main(["watch", "--once", "runs"]) == 0  # its slowest rank finished no step for 70 s: a stall, named
    [line] = watch_lines(capsys)
    assert "; dl-node1: last step 40 70 s ago; dl-node2: last step 30 4 min ago" in line, line


def test_a_node_that_has_not_finished_a_step_and_a_run_without_heartbeat_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = write_run(tmp_path / "runs", "r", [header()], state=LOCAL_RUNNING % os.getpid())
    now = time.time()
    write_node(run, "n1", 0, now, [state(0, now, None, None, phase="start-up")])
    # as of its file (written every interval): a node may have finished steps since, so the line says when
    assert api.status(["runs"])[0].nodes == ["n1: no step finished as of its heartbeat 0 s ago"]
    write_run(tmp_path / "runs", "plain", [header()], state=LOCAL_RUNNING % os.getpid())
    assert api.status(["runs/plain"])[0].nodes == []  # an engine without the watchdog: nothing shown, nothing guessed


def test_ago():
    assert [ago(s) for s in (-3, 0.4, 59, 119, 120, 3599, 7199, 7200, 9000)] == [
        "0 s", "0 s", "59 s", "119 s", "2 min", "60 min", "120 min", "2.0 h", "2.5 h"]


def test_a_run_whose_rank_0_hung_has_no_end_record_and_status_names_the_silent_rank(tmp_path, monkeypatch, capsys):
    """Rank 1 is silent; rank 0 was killed before writing `end` (or was itself the silent one): the metrics file says
    running, the job ended with exit 69, and hang.json is the record."""
    monkeypatch.chdir(tmp_path)
    hung_run(tmp_path / "runs", "r", [header(), epoch(0, time_s=200.0)], 300.0)
    [status] = api.status(["runs"])
    assert (status.status, status.ok, status.nodes) == ("hung", False, [])
    assert status.why_failed == (
        "hung: no step finished for 60 s: silent: dl-node2 rank 1 (local rank 0), last step 4, phase backward "
        "(no heartbeat for 62 s); runs/r/hang.json; resume it: dlaunch run --resume runs/r (leaves out dl-node2)")
    assert main(["status", "runs"]) == 0
    out = capsys.readouterr().out
    assert "hung" in out and "runs/r: hung: no step finished for 60 s: silent: dl-node2 rank 1" in out


def test_a_hung_run_with_rank_0_alive_ends_hung_and_the_exit_code_is_explained(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    end = make_record("end", 301.0, status="hung", total_time_s=201.0, epochs_completed=1, reason="no progress")
    hung_run(tmp_path / "runs", "r", [header(), epoch(0, time_s=200.0), end], 300.0)
    [status] = api.status(["runs"])
    assert status.status == "hung" and status.why_failed.startswith("hung: no step finished for 60 s: silent: dl-node2")
    assert main(["watch", "--once", "runs"]) == 1
    [line] = watch_lines(capsys)
    assert "runs/r: finished (exit 69); hung; " in line and "why: hung: no step finished" in line
    assert scheduler_label("FAILED", JobState.FAILED, "hung") == (
        "FAILED (exit 69: a process stopped answering, the watchdog stopped the job)")


def test_a_hang_record_older_than_the_runs_latest_record_is_an_earlier_attempts(tmp_path, monkeypatch):
    """Resumed after its hang: the run runs again (a record after hang.json's time) and is not called hung."""
    monkeypatch.chdir(tmp_path)
    hung_run(tmp_path / "runs", "r", [header(), epoch(0, time_s=200.0), epoch(1, time_s=400.0)], 300.0,
             state_word=LOCAL_RUNNING % os.getpid())
    [status] = api.status(["runs"])
    assert status.status == "running" and status.why_failed is None


def test_a_resumed_runs_heartbeat_files_of_its_earlier_attempt_are_left_out(tmp_path, monkeypatch):
    """Resumed after a hang on dl-node1 only: dl-node2's file, last written before the resume record, is the earlier
    attempt's, and no line calls dl-node2 silent now."""
    monkeypatch.chdir(tmp_path)
    now = time.time()
    resumed = make_record("resume", now - 30, epoch=1, step=2, checkpoint="checkpoints/last.pt")
    run = write_run(tmp_path / "runs", "r", [header(), epoch(0, time_s=now - 600), resumed],
                    state=LOCAL_RUNNING % os.getpid())
    write_node(run, "dl-node2", 1, now - 500, [state(1, now - 500, 2, now - 510)])
    write_node(run, "dl-node1", 0, now - 1, [state(0, now - 1, 3, now - 5)])
    assert api.status(["runs"])[0].nodes == ["dl-node1: last step 3 5 s ago"]
