"""A user's first day at the command line (issue 37): tables that fit 80 columns, help that cuts no word,
errors that point the right way, dry runs that are clean scripts. Commands run as real processes where
the terminal's width or a pipe matters (COLUMNS=80, stdout a pipe)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlaunch.cli import main
from dlaunch.results.store import record
from test_analysis import write_run

REPO = Path(__file__).resolve().parents[1]


def dlaunch(*argv: str, cwd: Path, columns: int = 80, **env: str) -> subprocess.CompletedProcess:
    """`dlaunch ARGV` as a process whose stdout is a pipe, laid out for `columns`."""
    return subprocess.run([sys.executable, "-m", "dlaunch.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS=str(columns), **env), timeout=300)


def fits(text: str, columns: int = 80) -> bool:
    return "…" not in text and max(len(line) for line in text.splitlines()) <= columns


# -- tables at 80 columns ------------------------------------------------------------------------------
def test_sites_at_80_columns_show_names_aliases_scheduler_and_gpus_per_node(tmp_path):
    """What a user picks a site by stays (so `juwels` appears); the many-line description and the absolute
    path give way, and the caption says so."""
    listed = dlaunch("sites", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert fits(listed.stdout)
    lines = listed.stdout.splitlines()
    assert lines[1].split() == ["name", "aliases", "scheduler", "GPUs", "per", "node", "container"]
    row = next(line.split() for line in lines if line.startswith("juwels-booster "))
    assert row == ["juwels-booster", "juwels,", "jwb", "slurm", "4", "apptainer"]
    assert lines[-1] == "left out at 80 columns: description, file"
    assert str(REPO / "sites") not in listed.stdout and "InfiniBand" not in listed.stdout
    wide = dlaunch("sites", cwd=tmp_path, columns=300)
    assert str(REPO / "sites" / "juwels-booster.toml") in wide.stdout.split() and "left out" not in wide.stdout


def test_images_at_80_columns_keep_built(tmp_path):
    """`dlaunch images` exists to say which images are built: that column stays; the pins give way (one
    site's images, `--site`, have room for them)."""
    listed = dlaunch("images", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert fits(listed.stdout)
    lines = listed.stdout.splitlines()
    assert lines[1].split() == ["image", "sites", "built"]
    assert next(line for line in lines if line.startswith("current-ddp-x86_64 ")).split()[-1] == "missing"
    assert "left out at 80 columns: pins from, pins" in lines
    one_site = dlaunch("images", "--site", "juwels", cwd=tmp_path)
    assert fits(one_site.stdout) and one_site.stdout.splitlines()[1].split() == ["image", "sites", "built", "pins"]


# -- results -w ----------------------------------------------------------------------------------------
@pytest.fixture
def two_sites(tmp_path, results_db):
    """A results database of a 1-GPU JUWELS Booster run and a 2-GPU local run (ended 1970-01-01, UTC)."""
    write_run(tmp_path / "runs", "booster", 1, [1.0, 100.0], site="juwels-booster", experiment="ex")
    write_run(tmp_path / "runs", "here", 2, [1.0, 180.0], site="local", experiment="ex")
    record(sorted((tmp_path / "runs").rglob("metrics.jsonl")))
    return results_db


def listed_runs(capsys, *where: str) -> list:
    args = [word for w in where for word in ("-w", w)]
    assert main(["results", *args, "--format", "json"]) == 0
    return sorted(row["run"] for row in json.loads(capsys.readouterr().out))


def test_results_where_site_takes_a_profile_alias_as_site_does(two_sites, capsys):
    """`-w site=juwels`, the option's own help example: the alias of juwels-booster."""
    assert listed_runs(capsys, "site=juwels") == ["booster"]
    assert listed_runs(capsys, "site=juwels-booster,gpus=1") == ["booster"]
    assert listed_runs(capsys, "site=localhost") == ["here"]


@pytest.mark.parametrize("where, message", [
    ("gpus=abc", "selector 'gpus=abc': gpus takes a count (a whole number from 1), e.g. gpus=8"),
    ("nodes=0", "selector 'nodes=0': nodes takes a count"),
    ("date=2026-13", "selector 'date=2026-13': date '2026-13' is not a day, month or year (YYYY-MM-DD, YYYY-MM, YYYY)"),
    ("date=2026-02-30..", "selector 'date=2026-02-30..': date '2026-02-30' is not a day"),
    ("date=2026-10-15..2026-10-01", "selector 'date=2026-10-15..2026-10-01': the range ends (2026-10-01) before it starts (2026-10-15)"),
])
def test_results_where_values_no_run_can_have_are_bad_input(two_sites, capsys, where, message):
    assert main(["results", "-w", where]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("dlaunch: error: " + message) and captured.err.count("\n") == 1


def test_results_where_a_condition_no_run_meets_says_so_with_the_values_there_are(two_sites, capsys):
    assert listed_runs(capsys, "date=1970-01-01..1970-01") == ["booster", "here"]
    assert main(["results", "-w", "site=nosuch", "-w", "date=1971..", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "[]"
    assert captured.err.splitlines() == [
        "dlaunch: note: -w site=nosuch matches no run in the database (its values of site: juwels-booster, local)",
        "dlaunch: note: -w date=1971.. matches no run in the database (its runs ended from 1970-01-01 to 1970-01-01)"]
    assert main(["results", "-w", "site=juwels,gpus=2", "--format", "json"]) == 0  # each holds for a run: no note
    assert capsys.readouterr().err == ""
