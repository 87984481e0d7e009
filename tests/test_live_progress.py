"""`dlaunch run --site local` shows the run's progress while it runs (the view `dlaunch watch` gives batch
runs): live in a terminal (a real pseudo-terminal here), one plain line per change through a pipe. Real
2-process runs (gloo on CPU) that hold after their first epoch (tests/holds.py) until the test has seen
them there: the tests assert what is shown, never how fast."""
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from holds import Hold, run_until_released

DLAUNCH = [sys.executable, "-m", "dlaunch.cli"]
RUN = ["run", "--site", "local", "--gpus", "2", "--steps", "6", "--steps-per-epoch", "2", "--warmup-steps", "1",
       "--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--threads", "1", "--device", "cpu",
       "--data", "synthetic", "--experiment", "e", "--run-name", "r"]
LINE = re.compile(r"^\d\d:\d\d:\d\d runs/e/r: (.*)$")
SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")  # a terminal's escape sequences: colours, cursor moves
# What the run shows once its first epoch is recorded: steps, the last epoch's images/s, loss, ETA.
FIRST_EPOCH = r"running; steps 2/6, epoch 1/3, [0-9.]+ images/s \(last epoch\), loss [0-9.]+, ETA \d+s"
# A real run's ranks may differ enough on a busy machine to be flagged (dlaunch/analysis/stragglers.py).
FLAGS = r"(; (straggler|throttled): .*)?"


def env(hold: Hold, cache: Path) -> dict:
    return dict(os.environ, DLAUNCH_STATUS_CACHE=str(cache), COLUMNS="80", **hold.env())


@pytest.mark.slow
def test_a_local_run_through_a_pipe_prints_a_plain_line_per_change(tmp_path):
    hold = Hold(tmp_path)
    shown = run_until_released(DLAUNCH + RUN, hold, FIRST_EPOCH, 600, cwd=tmp_path, env=env(hold, tmp_path / "cache"))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "running runs/e/r on this machine; its log: runs/e/r/local.log" in shown.stderr
    lines = [LINE.match(line).group(1) for line in shown.stdout.splitlines() if LINE.match(line)]
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", shown.stdout)
    assert len(lines) == len(set(lines))  # a line per change
    assert lines[0].startswith("running here (dlaunch pid ")
    assert any(re.fullmatch(r"running here \(dlaunch pid \d+\); " + FIRST_EPOCH + FLAGS, line) for line in lines), lines
    assert re.fullmatch(r"finished \(exit 0\); ok; steps 6/6, epoch 3/3, [0-9.]+ images/s, loss [0-9.]+" + FLAGS, lines[-1]), lines
    # The trainer's own output is in the log, not on the screen.
    assert "OMP_NUM_THREADS" not in shown.stdout + shown.stderr
    assert "OMP_NUM_THREADS" in (tmp_path / "runs/e/r/local.log").read_text()


class Terminal:
    """A pseudo-terminal of 80 x 24 and what a program wrote to it (escape sequences left out), read as it comes."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.raw = b""
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)

    def start(self, argv, **popen) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdin=self.slave, stdout=self.slave, stderr=self.slave, start_new_session=True, **popen)
        os.close(self.slave)
        self.reader.start()
        return proc

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the program and its children have closed the terminal
                data = b""
            with self.changed:
                self.raw += data
                self.changed.notify_all()
            if not data:
                return

    def text(self) -> str:
        return SEQUENCE.sub("", self.raw.decode("utf-8", errors="replace")).replace("\r", "")

    def words(self) -> str:
        """The text with every run of blanks and line breaks as one space (the view wraps its lines at 80 columns)."""
        return " ".join(self.text().split())

    def wait_for(self, pattern: str, timeout: float) -> None:
        with self.changed:
            self.changed.wait_for(lambda: re.search(pattern, self.words()) or not self.reader.is_alive(), timeout)
            assert re.search(pattern, self.words()), "not shown: %r\n%s" % (pattern, self.text()[-3000:])


@pytest.mark.slow
def test_a_local_run_in_a_terminal_shows_live_progress(tmp_path):
    """The live view (rich's Live: a bar, steps, the last epoch's images/s, loss, ETA), then the status table."""
    hold = Hold(tmp_path)
    terminal = Terminal()
    proc = terminal.start(DLAUNCH + RUN, cwd=tmp_path, env=dict(env(hold, tmp_path / "cache"), TERM="xterm"))
    try:
        terminal.wait_for("━", 600)
        terminal.wait_for(FIRST_EPOCH, 600)
    finally:
        hold.release()
        code = proc.wait(timeout=600)
    terminal.reader.join(60)
    screen, words = terminal.text(), terminal.words()
    assert code == 0, screen[-3000:]
    assert "runs/e/r  running here (dlaunch pid %d)" % proc.pid in screen
    assert "Ctrl-C stops the run (checkpointed)" in words
    final = words.split("runs/e/r finished (exit 0)")
    assert len(final) >= 2 and re.match(r" ━+ ok; steps 6/6, epoch 3/3, [0-9.]+ images/s, loss [0-9.]+%s dlaunch runs "
                                        % FLAGS.replace(".*", ".*?"), final[-1]), screen[-3000:]  # the last frame, then the table
    assert "OMP_NUM_THREADS" not in screen  # the trainer's output went to its log
