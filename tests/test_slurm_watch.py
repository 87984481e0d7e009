"""`dlaunch watch` and `run --follow` on the real throw-away Slurm cluster: 2-node runs followed to their
end through a pipe and in a terminal (tmux, 80 columns), a run queued behind another, a failed run."""
import re
import subprocess
from pathlib import Path
from typing import List

import pytest

from holds import Hold, run_until_released
from test_slurm_dlaunch import DLAUNCH, JOB_TIMEOUT_S, TINY, job_id, log_text, submit
from test_watch import watch_in_tmux

pytestmark = pytest.mark.slow

LINE = re.compile(r"^\d\d:\d\d:\d\d (\S+): (.*)$")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def watch_through_a_pipe(cluster, cwd: Path, *args: str, timeout: float = 2 * JOB_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([DLAUNCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=cluster.env(COLUMNS="80"))


def shown(stdout: str) -> List[tuple]:
    """(run, rest) of every line, after checking that the pipe got plain lines only."""
    assert not CONTROL.search(stdout), repr(stdout)
    lines = [LINE.match(line) for line in stdout.splitlines()]
    assert all(lines), stdout
    return [m.groups() for m in lines]


def test_run_follow_watches_a_two_node_run_to_its_end_through_a_pipe(two_nodes, slurm_site, tmp_path):
    """The job holds after its first epoch until the watcher has shown it running (tests/holds.py)."""
    hold = Hold(tmp_path)
    ran = run_until_released([DLAUNCH, "run", "--site", str(slurm_site), "--experiment", "tests", "--run-name", "followed",
                              "--time", "00:10:00", "--nodes", "2", *TINY, "--steps", "24", "--follow"], hold,
                             r"RUNNING; running; steps \d+/24, epoch \d+/12", 2 * JOB_TIMEOUT_S, cwd=tmp_path,
                             env=two_nodes.env(COLUMNS="80", **hold.env()))
    run_dir = tmp_path / "runs" / "tests" / "followed"
    assert ran.returncode == 0, ran.stdout + ran.stderr + log_text(run_dir)
    assert "submitted job %s" % job_id(run_dir) in ran.stderr
    lines = shown(ran.stdout)
    assert {run for run, _ in lines} == {"runs/tests/followed"}
    assert any(re.match(r"RUNNING; running; steps \d+/24, epoch \d+/12", rest) for _, rest in lines), ran.stdout
    assert lines[-1][1].startswith("COMPLETED; ok; steps 24/24, epoch 12/12, ")
    assert len(lines) == len(set(lines))  # one line per change


def test_watch_in_a_terminal_shows_the_queue_bars_and_the_end(two_nodes, slurm_site, tmp_path):
    """Two runs on all nodes in one experiment: the second waits in the queue while the first runs, held
    after its first epoch until the terminal has shown both (tests/holds.py)."""
    nodes = str(two_nodes.nodes)
    hold = Hold(tmp_path)
    first = submit(two_nodes, tmp_path, slurm_site, "first", "--nodes", nodes, "--steps", "24", **hold.env())
    second = submit(two_nodes, tmp_path, slurm_site, "second", "--nodes", nodes, "--steps", "8", **hold.env())

    def release_once_both_shown(screen: str) -> None:
        if ("runs/tests/first  RUNNING" in screen and "━" in screen and "ETA" in screen
                and "runs/tests/second  PENDING" in screen and "1st in queue" in screen):
            hold.release()

    try:
        code, screens, final = watch_in_tmux(tmp_path, [DLAUNCH, "watch", "--interval", "1", "runs/tests"],
                                             {"SLURM_CONF": str(two_nodes.conf)}, 2 * JOB_TIMEOUT_S,
                                             on_screen=release_once_both_shown)
    finally:
        hold.release()
        two_nodes.run(["scancel", job_id(first), job_id(second)])
    seen = "\n---\n".join(screens[-5:])
    assert code == 0, final + log_text(first) + log_text(second)
    assert any("runs/tests/second  PENDING" in s and "1st in queue" in s for s in screens), seen
    assert any("━" in s and "ETA" in s and "runs/tests/first  RUNNING" in s for s in screens), seen
    assert "runs/tests/first  COMPLETED" in final and "runs/tests/second  COMPLETED" in final, final
    assert "2 of 2 runs ended (2 ok, 0 failed)" in final and "steps 8/8" in final and "steps 24/24" in final, final
    assert not any("…" in s for s in screens + [final])


def test_watch_exits_nonzero_for_a_failed_two_node_run(two_nodes, slurm_site, tmp_path):
    run_dir = submit(two_nodes, tmp_path, slurm_site, "failing", "--nodes", "2", "--steps", "4",
                     "--data", str(tmp_path / "no-such-dataset"))  # the trainer refuses it on both nodes
    watched = watch_through_a_pipe(two_nodes, tmp_path, "watch", "--interval", "1", "runs/tests/failing")
    assert watched.returncode == 1, watched.stdout + watched.stderr
    run, rest = shown(watched.stdout)[-1]
    assert run == "runs/tests/failing"
    # The job ended before any metrics: `died`, and the trainer's own error line says why.
    assert rest.startswith("FAILED; died; why: slurm-%s.out:" % job_id(run_dir)), rest
    assert "train: error: --data %s: no such directory" % (tmp_path / "no-such-dataset") in rest, rest
    once = watch_through_a_pipe(two_nodes, tmp_path, "watch", "--once", "runs/tests")
    assert once.returncode == 1 and shown(once.stdout)[-1][1] == rest
