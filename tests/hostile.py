"""Hostile input for the boundary tests (tests/test_boundary*.py): a sandbox per example, the `dlaunch`
command line run in this process under a time limit, the promises every outcome keeps, and the
files and values the tests corrupt.

The promises (README: "every bad input: exit 2, one line naming the flag or field, nothing written"):
exit 0, or 2 with exactly one `dlaunch: error:` line (after any warnings a dry run printed on the way;
listings over many runs: 1 with `rejected:` lines); never a traceback (an exception escapes `main` and fails the test) or a hang (`time_limit`);
no file written or changed outside what the command may write.
"""
import contextlib
import io
import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from hypothesis import strategies as st

from dlaunch.cli import main
from dlaunch.train.metrics_schema import make_record

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 60  # no command of these tests comes near it; a hang does


class Hang(BaseException):
    """A command ran past its time limit (BaseException: no `except Exception` in the code swallows it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise Hang("still running after %g s" % seconds)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Outcome:
    argv: Sequence[str]
    code: int
    out: str
    err: str
    changed: List[str]  # paths under the sandbox created or changed, relative to it

    def __str__(self) -> str:
        return "dlaunch %s -> %d\nstdout: %s\nstderr: %s\nchanged: %s" % (
            " ".join(map(repr, self.argv)), self.code, self.out[-2000:], self.err[-2000:], self.changed)


def _state(root: Path) -> Dict[str, Tuple[int, int]]:
    """Every path under `root`: files with size and time, folders as (-1, -1) (new ones count, not their times)."""
    found = {}
    for folder, subfolders, files in os.walk(root):
        for name in subfolders + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            found[os.path.relpath(path, root)] = (-1, -1) if name in subfolders else (info.st_size, info.st_mtime_ns)
    return found


class Sandbox:
    """A folder per example: `work/` (the working directory), `home/` ($HOME), `sites/`
    ($DLAUNCH_SITES_DIR), `tmp/` ($TMPDIR: a copy in a temporary file is a file written too); `run`
    calls `main` there with the output captured."""

    def __init__(self, root: Path):
        self.root = root
        self.work, self.home, self.sites, self.tmp = root / "work", root / "home", root / "sites", root / "tmp"
        for folder in (self.work, self.home, self.sites, self.tmp):
            folder.mkdir()

    def run(self, *argv: Any, limit_s: float = LIMIT_S) -> Outcome:
        argv = [str(a) for a in argv]
        before = _state(self.root)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), time_limit(limit_s), console_width():
            code = main(argv)
        after = _state(self.root)
        changed = sorted(p for p, s in after.items() if before.get(p) != s)
        return Outcome(argv, code, out.getvalue(), err.getvalue(), changed)


@contextlib.contextmanager
def console_width() -> Iterator[None]:
    """The CLI's consoles as wide as this run's $COLUMNS: a fresh `dlaunch` process reads it when its
    consoles are made, an in-process run would keep the width of whichever test imported them first."""
    from dlaunch.cli import terminal

    consoles = (terminal.out, terminal.err)
    saved = [console._width for console in consoles]  # None: rich asks the terminal each time
    for console in consoles:
        console.width = int(os.environ.get("COLUMNS", "80"))
    try:
        yield
    finally:
        for console, width in zip(consoles, saved):
            console._width = width


@contextlib.contextmanager
def sandbox() -> Iterator[Sandbox]:
    """A fresh Sandbox, the working directory and environment set for it, both restored afterwards."""
    saved_env, saved_cwd, saved_tempdir = dict(os.environ), os.getcwd(), tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="dlaunch-hostile-") as tmp:
        box = Sandbox(Path(tmp))
        os.environ.update(HOME=str(box.home), DLAUNCH_SITES_DIR=str(box.sites), COLUMNS="100", TMPDIR=str(box.tmp),
                          MPLCONFIGDIR=os.path.join(tempfile.gettempdir(), "dlaunch-hostile-matplotlib"))  # its font cache
        tempfile.tempdir = str(box.tmp)
        for name in ("SBATCH_ACCOUNT", "DLAUNCH_PARENT_RUN", "BUDGET"):
            os.environ.pop(name, None)
        os.chdir(box.work)
        try:
            yield box
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            tempfile.tempdir = saved_tempdir


def kept_promises(outcome: Outcome, codes: Sequence[int] = (0, 2), may_change: Sequence[str] = ()) -> None:
    """The outcome keeps the boundary's promises; `may_change`: path prefixes (relative to the sandbox)
    the command may write (a report folder, a run directory)."""
    assert outcome.code in codes, outcome
    if outcome.code == 2:  # one error line, last; before it at most warnings found on the way, and a listing's
        # `rejected:` line per run file it could not read (README: "Bad input and limits"; report: then "no valid
        # metrics files")
        lines = outcome.err.strip().splitlines()
        assert lines and lines[-1].startswith("dlaunch: error: "), outcome
        assert all(line.startswith(("dlaunch: warning: ", "rejected: ")) for line in lines[:-1]), outcome
    assert "Traceback" not in outcome.err + outcome.out, outcome
    stray = [p for p in outcome.changed if not any(p == m or p.startswith(m + "/") for m in may_change)]
    assert not stray, outcome


def scripts_in(output: str) -> List[str]:
    """The scripts a dry run printed (one or several, maybe followed by other text): each runs from
    `#!/bin/bash` to the end of its command, the first line without a continuation after one with."""
    scripts = []
    for chunk in output.split("#!/bin/bash\n")[1:]:
        lines = chunk.splitlines()
        end = next((i for i in range(1, len(lines)) if lines[i - 1].endswith("\\") and not lines[i].endswith("\\")), len(lines) - 1)
        scripts.append("#!/bin/bash\n" + "\n".join(lines[:end + 1]) + "\n")
    return scripts


def script_is_sound(script: str) -> None:
    """A rendered script: valid bash, and its scheduler directives one block after the shebang (sbatch
    stops reading `#SBATCH` lines at the first other line: none may come after one)."""
    lines = script.splitlines()
    directives = [i for i, line in enumerate(lines) if line.startswith(("#SBATCH", "#PBS"))]
    assert directives == list(range(1, 1 + len(directives))), script
    assert "\x00" not in script
    checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr + script


# -- valid files, to corrupt -------------------------------------------------------------------------

def header(**fields: Any) -> dict:
    record = dict(run_id="r1", argv=["--epochs", "2", "--profile-steps", "2"], config={"epochs": 2, "schedule": "step", "amp": "none"},
                  framework="ddp", loader="native", model="resnet50", device="cpu", world_size=2, nodes=1,
                  hosts=["h0", "h0"], batch_per_worker=8, global_batch=16, lr_scaled=0.1, versions={"torch": "2.9"},
                  slurm_job_id=None, site="local", experiment="exp", image=None, git_revision=None,
                  loader_settings={"total_steps": 4, "steps_per_epoch": 2},
                  request={"framework": "ddp", "world_size": 2, "options": {"epochs": 2, "profile-steps": 2}})
    record.update(fields)
    return make_record("header", 1000.0, **record)


def metrics_records() -> List[dict]:
    return [header(),
            make_record("epoch", 1001.0, epoch=0, steps=2, images=32, images_per_s=10.0, epoch_time_s=3.2,
                        data_wait_s=0.1, loss=2.0, lr=0.1, top1=0.2),
            make_record("epoch", 1002.0, epoch=1, steps=2, images=32, images_per_s=12.0, epoch_time_s=2.7,
                        data_wait_s=0.1, loss=1.5, lr=0.1, top1=0.3),
            make_record("profile", 1003.0, steps=2, step_s=0.5, compute_s=0.3, comm_s=0.1, data_s=0.1, method="timers"),
            make_record("end", 1004.0, status="ok", total_time_s=5.0, epochs_completed=2)]


# Figures no run measures: beyond float64's range when summed or multiplied (a mean of 1e308 overflowed in fsum),
# or an integer too large for a float at all. The reader refuses each (metrics_schema.MAX_FIGURE).
ABSURD_FIGURES = [1e308, -1e308, 10**400, 1.0e19]
# Where they go: (record index in metrics_records(), field) of figures readers compute with.
ABSURD_FIELDS = [(1, "images_per_s"), (2, "epoch_time_s"), (1, "images"), (3, "step_s"), (4, "total_time_s"),
                 (0, "lr_scaled"), (2, "energy_j")]


def absurd_metrics(index: int, field: str, value: Any) -> str:
    """metrics_records() with `field` of record `index` set to `value` (`energy_j`: its gpu domain), as JSON lines."""
    records = metrics_records()
    records[index][field] = {"gpu": value} if field == "energy_j" else value
    return jsonl(records)


def jsonl(records: Sequence[Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def plan_file(run_dir: Path, scheduler: str = "local", site: str = "local") -> dict:
    """plan.json as `dlaunch run` writes it (the plan abridged to what readers use)."""
    request = {"site": site, "framework": "ddp", "nodes": None, "gpus": 2, "partition": None, "time": "01:00:00",
               "account": None, "image": None, "output": str(run_dir.parent.parent), "experiment": run_dir.parent.name,
               "run_name": run_dir.name, "trainer": {"epochs": 2}, "resume": False, "requeue": None, "allow_large": False}
    plan = {"site": site, "scheduler": scheduler, "runtime": "none", "framework": "ddp", "nodes": 1,
            "nproc_per_node": 2, "run_dir": str(run_dir), "image": None}
    return {"plan": plan, "request": request}


def write_run(root: Path, name: str = "exp/r1", files: Dict[str, Any] = None) -> Path:
    """A finished local run `root/runs/<name>`: plan.json, job_id, state, local.log, metrics.jsonl, site.toml;
    `files` replaces some (text or bytes; None leaves one out)."""
    run = root / "runs" / name
    run.mkdir(parents=True)
    contents: Dict[str, Any] = {
        "plan.json": json.dumps(plan_file(run)), "job_id": "local-4242\n", "state": "finished (exit 0)\n",
        "local.log": "dlaunch: job local-4242 attempt 1 on h0\nepoch 0\n", "metrics.jsonl": jsonl(metrics_records()),
        "site.toml": (REPO / "sites" / "local.toml").read_text()}
    contents.update(files or {})
    for file, content in contents.items():
        if content is None:
            continue
        if isinstance(content, bytes):
            (run / file).write_bytes(content)
        else:
            (run / file).write_text(content)
    return run


# -- strategies ----------------------------------------------------------------------------------------

# Text a careless or hostile user types or a tampered file holds: control characters, line breaks,
# escape sequences, digits of other scripts, path tricks.
HOSTILE_TEXTS = ["", " ", "\n", "r\n", "a\x00b", "\x1b[2J\x1b[31mred", "../../../../etc/passwd", "/etc/shadow",
                 "-h", "--help", "x" * 300, "٠١:٠٠:٠٠", "25:99:00", "$(touch pwned)", "`id`", "'", "\"", "a b",
                 "\u202eevil", "é", "NaN", "inf", "-1", "0", "99999999999999999999999"]
hostile_text = st.one_of(st.sampled_from(HOSTILE_TEXTS), st.text(max_size=40),
                         st.text(alphabet=st.characters(max_codepoint=0x9f), max_size=20))
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | hostile_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3), max_leaves=6)
hostile_bytes = st.one_of(st.binary(max_size=300), st.sampled_from([
    b"\xff\xfe\x00", b"\x00" * 10, b"[" * 5000, b'{"a":' * 5000, b"\x80abc", b"NaN", b"a = [" * 3000,
    "caf\u00e9".encode("latin-1")]))


@st.composite
def mutated(draw: Any, document: Any) -> Any:
    """`document` (JSON-like) with one value replaced by a hostile one, or a key dropped."""
    def walk(node: Any) -> Any:
        if isinstance(node, dict) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node)))
            copy = dict(node)
            if draw(st.integers(0, 4)) == 0:
                del copy[key]
            else:
                copy[key] = walk(node[key])
            return copy
        if isinstance(node, list) and node and draw(st.booleans()):
            i = draw(st.integers(0, len(node) - 1))
            return node[:i] + [walk(node[i])] + node[i + 1:]
        return draw(json_value)
    return walk(document)


def toml_text(document: Dict[str, Any]) -> str:
    """A TOML file of `document` (inline tables; None values left out; NaN and infinities as TOML has them)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if v != v else ("inf" if v > 0 else "-inf") if v in (float("inf"), float("-inf")) else repr(v)
        if isinstance(v, int):
            return str(v)
        if isinstance(v, str):
            return json.dumps(v)  # a TOML basic string is a JSON string, but for \u escapes of surrogates
        if isinstance(v, list):
            return "[%s]" % ", ".join(value(x) for x in v if x is not None)
        return "{%s}" % ", ".join("%s = %s" % (json.dumps(k), value(x)) for k, x in v.items() if x is not None)
    return "".join("%s = %s\n" % (json.dumps(k), value(v)) for k, v in document.items() if v is not None)
