"""What each command imports (start-up on login nodes): heavy modules only in the commands that use
them. Each check runs in a fresh interpreter and reads sys.modules; timings are in
benchmarks/bench_startup.py, not here."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "matplotlib", "torch")
MODELS = ("dlaunch.jobs.sites", "dlaunch.jobs.images")  # the site profiles' and the image lock's pydantic models


def modules_after(code: str, cwd: Path) -> set:
    """The modules loaded after running `code` (which may exit through dlaunch's main)."""
    script = ("import atexit, json, sys\n"
              "atexit.register(lambda: print('MODULES=' + json.dumps(sorted(sys.modules))))\n" + code)
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120)
    line = next((l for l in done.stdout.splitlines() if l.startswith("MODULES=")), None)
    assert line, done.stdout + done.stderr
    return set(json.loads(line[len("MODULES="):]))


def test_import_launcher_cli_imports_neither_numpy_nor_matplotlib(tmp_path):
    loaded = modules_after("import dlaunch.cli", tmp_path)
    assert not [m for m in HEAVY + MODELS + ("pydantic",) if m in loaded]
    assert "rich.table" not in loaded and "rich.live" not in loaded


def dlaunch(*argv: str) -> str:
    return "from dlaunch.cli import main\nmain(%r)\n" % (list(argv),)


# The Python API's types (dlaunch/api/): `run` goes through its two steps (dlaunch/launch.py) without them; `runs`,
# `status` and `watch` show the API's RunStatus objects (and record the runs that ended through it).
API = ("dlaunch.api",)


@pytest.mark.parametrize("argv, absent", [
    (["--help"], HEAVY + MODELS + API + ("pydantic", "dlaunch.launch")),  # typer converts given values with pydantic, --help has none
    (["run", "--site", "juwels", "--account", "p", "--dry-run"], HEAVY + API + ("dlaunch.jobs.images", "rich.table")),
    (["sweep", "--site", "juwels", "--account", "p", "--nodes", "1,2", "--dry-run"], HEAVY + API + ("dlaunch.jobs.images",)),
    (["runs"], HEAVY + MODELS),
    (["watch", "--once", "runs"], HEAVY + MODELS),
    (["sites"], HEAVY + ("dlaunch.jobs.images",)),
])
def test_commands_import_only_what_they_use(tmp_path, argv, absent):
    run = tmp_path / "runs" / "e" / "r"
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({"plan": {"scheduler": "local", "site": "local"}, "request": {}}))
    (run / "state").write_text("finished (exit 0)\n")
    loaded = modules_after(dlaunch(*argv), tmp_path)
    assert not [m for m in absent if m in loaded]


def test_lazy_commands_run_and_show_their_help_line(tmp_path):
    listing = subprocess.run([sys.executable, "-m", "dlaunch.cli", "--help"], cwd=tmp_path, capture_output=True,
                             text=True, env=dict(os.environ, COLUMNS="200"))
    assert listing.returncode == 0, listing.stderr
    for name in ("images", "report", "predict"):  # the command's line and its summary (in a box or not)
        listed = [line.replace("│", " ").split() for line in listing.stdout.splitlines()]
        assert any(words[:1] == [name] and len(words) > 2 for words in listed), name
    helped = subprocess.run([sys.executable, "-m", "dlaunch.cli", "predict", "--help"], cwd=tmp_path,
                            capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    assert helped.returncode == 0 and "--calibrated" in helped.stdout, helped.stderr
