"""`dlaunch results`' listing (issue 37): a bad selector named before the database is looked for, rows of runs that
ended together in GPU-count order (not as text), and at 80 columns the columns that tell runs apart kept."""
import json

import pytest
from typer.testing import CliRunner

from dlaunch import api
from dlaunch.cli import app, main
from dlaunch.resultsdb.store import record
from test_analysis import write_run


@pytest.mark.parametrize("argv, named", [
    (["results", "-w", "gpus=abc"], "selector 'gpus=abc': gpus takes a count"),
    (["results", "-w", "date=2026-13"], "selector 'date=2026-13': date '2026-13' is not a day"),
    (["results", "compare", "exp", "colour=red"], "selector 'colour=red': unknown key 'colour'"),
])
def test_a_bad_selector_is_named_even_without_a_database(results_db, capsys, argv, named):
    assert not results_db.exists()
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("dlaunch: error: " + named) and captured.err.count("\n") == 1, captured.err
    assert captured.out == "" and not results_db.exists()


@pytest.fixture
def sweep(tmp_path, results_db):
    """A JUWELS Booster sweep to 1,024 GPUs and a local run, every run ended at the same moment (1970-01-01T00:20:00Z)."""
    for gpus in (1, 1024, 128, 16):
        write_run(tmp_path / "runs", "g%d" % gpus, gpus, [1.0, 100.0 * gpus ** 0.9], site="juwels-booster",
                  experiment="scaling", gpus_per_node=4)
    write_run(tmp_path / "runs", "here", 2, [1.0, 180.0], site="local", experiment="local-check")
    record(sorted((tmp_path / "runs").rglob("metrics.jsonl")))
    return results_db


def test_runs_that_ended_together_are_listed_by_gpu_count(sweep, capsys):
    assert [(r.experiment, r.gpus) for r in api.results()] == [
        ("local-check", 2), ("scaling", 1), ("scaling", 16), ("scaling", 128), ("scaling", 1024)]
    assert main(["results", "--json"]) == 0
    assert [row["run"] for row in json.loads(capsys.readouterr().out)] == ["here", "g1", "g16", "g128", "g1024"]


def test_at_80_columns_the_listing_keeps_what_tells_runs_apart(sweep):
    shown = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["results"])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    header = lines[1].split()
    assert header[:4] == ["run", "experiment", "site", "GPUs"] and "images/s" in header and "E_G" in header
    assert "framework" not in header and "status" not in header  # one value in every row: left out first
    assert [line.split()[0] for line in lines[3:8]] == ["here", "g1", "g16", "g128", "g1024"]
    assert "juwels-booster" in shown.stdout and "local-check" in shown.stdout
    caption = " ".join(line for line in lines[8:] if not line.startswith("database:"))
    assert caption.startswith("left out at 80 columns:") and "framework" in caption and "status" in caption
    assert all(len(line) <= 80 for line in lines)


def test_a_wide_listing_shows_step_options_and_flags(sweep):
    shown = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["results"])
    assert shown.exit_code == 0, shown.output
    header = shown.stdout.splitlines()[1].split("  ")
    assert {"step options", "flags"} <= {h.strip() for h in header}
