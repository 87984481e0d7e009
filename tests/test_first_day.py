"""A user's first day at the command line (issue 37): tables that fit 80 columns, help that cuts no word,
errors that point the right way, dry runs that are clean scripts. Commands run as real processes where
the terminal's width or a pipe matters (COLUMNS=80, stdout a pipe)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlaunch.cli import main
from dlaunch.resultsdb.store import record
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
    """`dlaunch images` exists to say which images are built: that column stays, with the pins; the sites
    give way (`--site` shows one site's images, with room for the column)."""
    listed = dlaunch("images", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert fits(listed.stdout)
    lines = listed.stdout.splitlines()
    assert lines[1].split() == ["image", "built", "pins"]
    assert next(line for line in lines if line.startswith("current-ddp-x86_64 ")).split()[1] == "missing"
    assert "left out at 80 columns: pins from, sites" in lines
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


def test_results_at_80_columns_fit_and_say_what_they_left_out(two_sites, tmp_path):
    """The caption naming the columns left out is wrapped too (it was one 84-column line)."""
    shown = dlaunch("results", "--db", str(two_sites), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert fits(shown.stdout) and "booster" in shown.stdout and "left out at 80 columns:" in shown.stdout


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


# -- help ----------------------------------------------------------------------------------------------
def command_params(*path: str) -> list:
    """The click parameters of `dlaunch PATH...` (lazy groups loaded as a run of them would)."""
    import typer.main

    from dlaunch.cli import app

    command = typer.main.get_command(app)
    ctx = command.make_context("dlaunch", list(path) + ["--help"], resilient_parsing=True)
    for name in path:
        command = command.get_command(ctx, name)
    return command.params


@pytest.mark.parametrize("path", [["run"], ["sweep"], ["study", "run"], ["predict"], ["doctor"], ["results"]])
def test_help_at_80_columns_keeps_every_word_and_bracket_whole(tmp_path, path):
    """Plain help, wrapped at spaces only: every option's name, metavar and help words appear whole (rich's
    tables cut `--backward-passes-per…` and `images/<stack>-<framew…`), and `[dataset]` or `[storage]` are
    text, not markup."""
    shown = dlaunch(*path, "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert fits(shown.stdout) and not any(line.endswith("...") for line in shown.stdout.splitlines()[1:])
    words = set(shown.stdout.split()) | {word.rstrip(",") for word in shown.stdout.split()}  # `-w, --where`
    for param in command_params(*path):
        for word in [*param.opts, *param.secondary_opts, *(param.help or "").split()]:
            assert word in words, (word, shown.stdout)
    assert not any(line.rstrip().endswith(("-", "‑")) and not line.rstrip().endswith(" -") for line in shown.stdout.splitlines())


def test_help_says_what_the_defaults_and_forms_are(tmp_path):
    from dlaunch.jobs.imagepaths import default_image_for_site
    from dlaunch.specs.schema import parse_time
    from dlaunch.jobs.sites import resolve_site

    shown = " ".join(dlaunch("run", "--help", cwd=tmp_path).stdout.split())
    # was: images/<stack>-<framework>.sif, older than the architecture in the name and the runtimes' forms
    assert "--image <str> container image; default: images/<stack>-<framework>-<arch> in the form" in shown
    assert Path(default_image_for_site(resolve_site("juwels"), "ddp")).name == "current-ddp-x86_64.sif"
    assert "--time <str> time limit as Slurm writes it: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS" in shown
    examples = ["30", "30:00", "01:30:00", "1-12", "1-12:30", "1-12:30:00"]  # one of each form, in that order
    assert [parse_time(e) for e in examples] == [1800, 1800, 5400, 129600, 131400, 131400]
    study = " ".join(dlaunch("study", "run", "--help", cwd=tmp_path).stdout.split())
    assert "the dataset a study's [dataset] asks for" in study
    assert "the site's [storage] loader_images_per_s" in " ".join(dlaunch("predict", "--help", cwd=tmp_path).stdout.split())


def test_version(tmp_path):
    from dlaunch import __version__

    shown = dlaunch("--version", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("dlaunch %s" % __version__) and shown.stderr == ""


# -- errors that point the right way -------------------------------------------------------------------
def test_sites_show_of_an_unknown_name_names_its_argument(capsys):
    assert main(["sites", "show", "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("dlaunch: error: sites show NAME: unknown site 'nosuch' (known: alps, ")


# -- status --------------------------------------------------------------------------------------------
def status_row(path: str) -> tuple:
    return (path, "juwels-booster", "12345678", "8", "COMPLETED", "ok", "3/3", "2560.0", path + "/metrics.jsonl")


@pytest.mark.parametrize("width", [80, 100, 300])
def test_status_table_keeps_what_a_user_came_for_at_any_width(width):
    """Run, GPUs, state and images/s stay longest; the metrics path, job id and site give way first."""
    from io import StringIO

    from rich.console import Console

    from dlaunch.tables import fit_table
    from dlaunch.cli.terminal import STATUS_HEADERS, STATUS_LEAVE_OUT

    path = "runs/juwels-booster-ddp-resnet50/20261122-101010"  # the default experiment and run names
    buffer = StringIO()
    Console(file=buffer, width=width, soft_wrap=True).print(fit_table("t", STATUS_HEADERS, [status_row(path)], width,
                                                                      leave_out=STATUS_LEAVE_OUT))
    text = buffer.getvalue()
    assert fits(text, width)
    lines = text.splitlines()
    if width == 80:
        assert lines[1].split() == ["run", "GPUs", "scheduler", "images/s"] and lines[3].split() == [path, "8", "COMPLETED", "2560.0"]
        assert lines[-1].strip() == "left out at 80 columns: results, job, site, epochs, metrics"
    if width == 100:
        assert lines[1].split() == ["run", "GPUs", "scheduler", "metrics", "epochs", "images/s"]
        assert lines[-1].strip() == "left out at 100 columns: results, job, site"
    if width == 300:
        assert lines[3].split() == list(status_row(path)) and "left out" not in text


def write_local_run(root: Path, name: str, gpus: int, records: list, state: str) -> None:
    """A run directory of site local as `dlaunch run` leaves it, of `gpus` processes."""
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    plan = {"scheduler": "local", "site": "local", "run_dir": str(run), "nodes": 1, "nproc_per_node": gpus}
    (run / "plan.json").write_text(json.dumps({"plan": plan, "request": {}}))
    (run / "job_id").write_text("local-%s\n" % name)
    (run / "state").write_text(state + "\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_runs_at_80_columns_tell_a_1_from_a_2_gpu_run_and_label_a_live_runs_figure(tmp_path):
    """Issue 37: two runs differed only by their time stamps. The GPUs column tells them apart; an ended
    run shows its throughput X (the measured epochs' mean, the first left out), a live one its last
    epoch's figure, labelled as such. The live run is this test's own process's (alive, started before
    its state was written)."""
    from dlaunch.schedulers import RUNNING_HERE
    from test_watch import end, epoch, header

    write_local_run(tmp_path / "runs" / "e", "one", 1, [header(), epoch(0), epoch(1), epoch(2), end()], "finished (exit 0)")
    write_local_run(tmp_path / "runs" / "e", "two", 2, [header(), epoch(0), epoch(1), epoch(2), end()], "finished (exit 0)")
    write_local_run(tmp_path / "runs" / "e", "live", 2, [header(), epoch(0)], RUNNING_HERE % os.getpid())
    listed = dlaunch("runs", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert fits(listed.stdout)
    lines = listed.stdout.splitlines()
    assert lines[1].split() == ["run", "site", "job", "GPUs", "scheduler", "metrics", "epochs", "images/s"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("runs/")}
    # X: epochs 1 and 2 (17 and 18 images/s), the first left out; the last epoch alone would be 18.0
    assert rows["runs/e/one"] == ["runs/e/one", "local", "local-one", "1", "finished", "ok", "3/3", "17.5"]
    assert rows["runs/e/two"] == ["runs/e/two", "local", "local-two", "2", "finished", "ok", "3/3", "17.5"]
    assert rows["runs/e/live"][:4] == ["runs/e/live", "local", "local-live", "2"] and rows["runs/e/live"][-2:] == ["16.0", "(last"]
    assert lines[-1] == "left out at 80 columns: results"
    wide = dlaunch("runs", cwd=tmp_path, columns=200).stdout.splitlines()
    live = next(line for line in wide if line.startswith("runs/e/live "))
    assert re.split(r"\s{2,}", live.strip()) == ["runs/e/live", "local", "local-live", "2", "running here (dlaunch pid %d)"
                                                % os.getpid(), "running", "1/3", "16.0 (last epoch)", "runs/e/live/metrics.jsonl"]
    cancelled = dlaunch("cancel", "runs/e/one", cwd=tmp_path)
    assert cancelled.returncode == 0 and cancelled.stderr == "runs/e/one had ended (finished (exit 0); metrics ok): nothing to cancel\n"
