"""Holding a real run mid-way (tests/failpoints/sitecustomize.py) so that a test asserts an intermediate state
that is forced, not hoped for: the job pauses after its first epoch until the test has seen what it checks.
`Lines` reads a command's output as it comes, so that a test can wait for a line, then release the run."""
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

FAILPOINTS = Path(__file__).resolve().parent / "failpoints"


class Hold:
    """A release file; `env()` makes the trainer processes started with it pause after their first epoch, and with
    `at_step` N before their step N + 1 (N steps done) too; with `after_end` only once they wrote their end record."""

    def __init__(self, folder: Path, at_step: Optional[int] = None, after_end: bool = False) -> None:
        self.file = folder / "release-held-runs"
        self.at_step = at_step
        self.after_end = after_end

    def env(self, pythonpath: str = "") -> Dict[str, str]:
        """The variables that arm the hold (`pythonpath`: what else the processes need on PYTHONPATH)."""
        paths = [str(FAILPOINTS)] + [p for p in (pythonpath or os.environ.get("PYTHONPATH", "")).split(os.pathsep) if p]
        armed = {"PYTHONPATH": os.pathsep.join(paths), "DLAUNCH_TEST_HOLD": str(self.file)}
        if self.at_step is not None:
            armed["DLAUNCH_TEST_HOLD_AT_STEP"] = str(self.at_step)
        if self.after_end:
            armed["DLAUNCH_TEST_HOLD_AFTER_END"] = "1"
        return armed

    def held_after_end(self, rank: int = 0) -> Path:
        """The file the process of `rank` creates when it pauses after writing its end record (`after_end`)."""
        return Path("%s.held-after-end.rank%d" % (self.file, rank))

    def held_at_step(self, rank: int = 0) -> Path:
        """The file the process of `rank` creates when it pauses at `at_step` (before its next step)."""
        return Path("%s.held-at-step-%d.rank%d" % (self.file, self.at_step, rank))

    def container_env(self) -> Dict[str, str]:
        """`env()` for processes inside a container that binds the release file's folder at the same path: a
        copy of the failpoint there, and nothing of this host's PYTHONPATH (the image has its own trainer)."""
        inside = self.file.parent / "failpoints"
        inside.mkdir(exist_ok=True)
        shutil.copy(FAILPOINTS / "sitecustomize.py", inside / "sitecustomize.py")
        return {"PYTHONPATH": str(inside), "DLAUNCH_TEST_HOLD": str(self.file)}

    def release(self, rank: Optional[int] = None) -> None:
        """Let every held process go on, or only the one of `rank`."""
        (self.file if rank is None else Path("%s.rank%d" % (self.file, rank))).touch()


class Lines:
    """The lines a stream gives, collected by a thread as they come."""

    def __init__(self, stream) -> None:
        self.lines: List[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.lines.append(None)  # the end of the stream
            self.changed.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> str:
        """The first line that matches `pattern`; fails when the stream ends or `timeout` s pass without one."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self.changed:
            while True:
                for line in self.lines[seen:]:
                    if line is None:
                        raise AssertionError("no line matching %r before the end:\n%s" % (pattern, self.text()))
                    if re.search(pattern, line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no line matching %r within %g s:\n%s" % (pattern, timeout, self.text()))
                self.changed.wait(left)

    def text(self) -> str:
        """Everything read so far (all of it once the stream has ended: `join()` first)."""
        return "".join(line + "\n" for line in self.lines if line is not None)

    def join(self, timeout: float) -> str:
        self.reader.join(timeout)
        assert not self.reader.is_alive(), "the stream is still open after %g s" % timeout
        return self.text()


def run_until_released(argv: List[str], hold: Hold, pattern: str, timeout: float, **popen) -> subprocess.CompletedProcess:
    """Run `argv` (which starts held runs and prints their progress), release the runs once a line of its
    output matches `pattern`, and return its whole result."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        out.wait_for(pattern, timeout)
    finally:
        hold.release()
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
    return subprocess.CompletedProcess(argv, proc.returncode, out.join(30), err.join(30))
