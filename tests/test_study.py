"""Study files: validation, the aach2023 matrix rendered on JUWELS, the smoke study run here to a report
with the published values beside this run's, and resubmission of only what is missing or failed."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runs.study import expand, load_study
from train.metrics_schema import make_record, read_metrics

REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "studies"
# `dlaunch` with the study group registered (as cli.py's lazy registration will do), through cli.main's
# error handling: bad input is one line and exit code 2.
DLAUNCH = ("import sys; from launcher.cli import app, main; from launcher.runs.study import study_app; "
           "app.add_typer(study_app, name='study'); sys.exit(main(sys.argv[1:]))")


def dlaunch(cwd: Path, *args: object, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SBATCH_ACCOUNT", "DLAUNCH_IMAGENET")}
    env.update(PYTHONPATH=str(REPO), COLUMNS="200", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", DLAUNCH, *(str(a) for a in args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_shipped_study_files_are_valid():
    for path in sorted(STUDIES.glob("*.toml")):
        load_study(path)
    assert {p.stem for p in STUDIES.glob("*.toml")} >= {"aach2023", "mahon2020", "smoke"}


GOOD = """name = "bad"
description = "x"
based_on = ["nothing"]
[recipe]
batch-size = 8
[[matrix]]
name = "m"
models = ["resnet44"]
gpus = [1, 2]
"""


@pytest.mark.parametrize("change, field", [
    (('models = ["resnet44"]', 'models = ["resnet9000"]'), "matrix.0.models.0"),
    (("batch-size = 8", "batch-size = 8\nmodel = \"resnet50\""), "recipe: model: set by the matrix"),
    (("batch-size = 8", "batch-sise = 8"), "recipe: batch-sise: not a trainer option"),
    (("batch-size = 8", 'batch-size = "eight"'), "recipe: batch-size: expected int"),
    (("gpus = [1, 2]", "gpus = [1, 2]\nnodes = [1]"), "matrix.0: give exactly one of gpus and nodes"),
    (("gpus = [1, 2]", "gpus = [0]"), "matrix.0.gpus.0"),
    (("gpus = [1, 2]", "gpus = [1]\nexclude = [{ colour = \"red\" }]"), "matrix.0.exclude.0.colour"),
    (('description = "x"', 'description = "x"\ncompare = [{ label = "l", file = "nowhere.csv", metric = "speedup", column = "c" }]'),
     "compare.0.file: nowhere.csv is not a file in data/published/"),
    (('name = "bad"', 'name = "bad name"'), "name"),
])
def test_bad_study_files_name_the_file_and_field_exit_2_and_write_nothing(tmp_path, change, field):
    study = tmp_path / "bad.toml"
    study.write_text(GOOD.replace(*change))
    result = dlaunch(tmp_path, "study", "run", "bad.toml", "--site", "local", "--output", tmp_path / "runs")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("dlaunch: error: bad.toml: %s" % field), line
    assert not (tmp_path / "runs").exists()


def test_unknown_only_key_is_refused(tmp_path):
    result = dlaunch(tmp_path, "study", "run", STUDIES / "smoke.toml", "--site", "local", "--dry-run", "--only", "colour=red")
    assert result.returncode == 2 and "--only: 'colour=red'" in result.stderr


def test_aach2023_renders_every_job_on_juwels_without_an_account(tmp_path):
    # 197 = scaling 3 frameworks x 2 loaders x 3 models x 9 GPU counts (162) less native at 1024 GPUs (9)
    #       + accuracy DDP x DALI x ResNet-50 x 9 GPU counts x 3 schedules (27)
    #       + profile DDP x 2 loaders x ResNet-50 x 9 GPU counts less native at 1024 (17)
    result = dlaunch(tmp_path, "study", "run", STUDIES / "aach2023.toml", "--site", "juwels", "--dry-run",
                     "--output", tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().splitlines()[-1] == "197 jobs"
    assert result.stdout.count("#!/bin/bash") == 197
    assert result.stdout.count("--nodes=256\n") == 3 * 3 * 1 + 3 + 1  # 1024 GPUs: DALI scaling, accuracy, profile
    # the trainer scales --lr per --reference-batch images linearly: 0.025 x G for 64 images per GPU
    assert result.stdout.count("--lr 0.025 \\\n  --reference-batch 64 \\\n  --warmup-epochs 5.0") == 197
    assert result.stdout.count("--batch-size 64 ") == 197 and result.stdout.count("--label-smoothing 0.1") == 197
    assert result.stdout.count("--schedule cosine") == 9
    assert result.stdout.count("--profile-steps 50") == 17
    assert "needs an account" in result.stderr and "(197 jobs)" in result.stderr  # said once, counted
    assert "DLAUNCH_IMAGENET" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_only_selects_part_of_the_matrix(tmp_path):
    result = dlaunch(tmp_path, "study", "run", STUDIES / "aach2023.toml", "--site", "juwels", "--dry-run",
                     "--only", "matrix=profile", "--only", "loader=native", "--only", "gpus=4", "--only", "gpus=8",
                     "--data", "/p/scratch/imagenet")  # not visible here: checked on the nodes
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().splitlines()[-1] == "2 jobs"
    assert "DLAUNCH_IMAGENET" not in result.stderr


def test_repeats_and_exclusions_expand_to_distinct_run_names():
    smoke = expand(load_study(STUDIES / "smoke.toml"), "local", Path("runs"))
    assert [j.name for j in smoke] == ["ddp-native-resnet44-g0001-step-r1", "ddp-native-resnet44-g0001-step-r2",
                                       "ddp-native-resnet44-g0002-step-r1", "ddp-native-resnet44-g0002-step-r2"]
    aach = expand(load_study(STUDIES / "aach2023.toml"), "juwels", Path("runs"))
    assert len({(j.matrix, j.name) for j in aach}) == len(aach) == 197
    assert not [j for j in aach if j.coordinates["loader"] == "native" and j.coordinates["gpus"] == 1024]


def _fake_failed(run: Path) -> None:
    """Make a finished run look failed (a fake: the test writes its state and metrics end record)."""
    (run / "state").write_text("finished (exit 1)\n")
    lines = run.joinpath("metrics.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["type"] != "end"]
    end = make_record("end", 1.0, status="failed", total_time_s=1.0, epochs_completed=0, reason="faked by the test")
    run.joinpath("metrics.jsonl").write_text("\n".join(kept + [json.dumps(end)]) + "\n")


@pytest.mark.slow
def test_smoke_study_runs_here_reports_against_published_and_resubmits_only_failed_runs(tmp_path):
    runs = tmp_path / "runs"
    first = dlaunch(tmp_path, "study", "run", STUDIES / "smoke.toml", "--site", "local", "--output", runs)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    folder = runs / "smoke"
    names = sorted(p.name for p in (folder / "scaling").iterdir())
    assert len(names) == 4 and (folder / "study.toml").is_file()
    for name in names:
        assert read_metrics(str(folder / "scaling" / name / "metrics.jsonl")).status == "ok"
        assert read_metrics(str(folder / "scaling" / name / "metrics.jsonl")).header["experiment"] == "smoke.scaling"

    report = dlaunch(tmp_path, "study", "report", folder, "-o", tmp_path / "report")
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "published_vs_this_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Published vs this run", 1)[1]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in section.splitlines() if line.startswith("| Mahon")]
    by_gpus = {row[1]: row for row in rows}
    assert by_gpus["12"][2] == "10.1" and by_gpus["12"][4] == "-"  # published only
    for gpus in ("1", "2"):  # this run: each repeat's X over the median X at 1 process; median, min, max, runs
        low, mid, high = (float(v) for v in (by_gpus[gpus][5], by_gpus[gpus][4], by_gpus[gpus][6]))
        assert low <= mid <= high and by_gpus[gpus][7] == "2" and by_gpus[gpus][2] == "-"
    assert by_gpus["1"][4] == "1"  # the median of the reference's own repeats

    status = dlaunch(tmp_path, "study", "status", folder)
    assert status.returncode == 0 and status.stdout.count("finished (exit 0)") == 4

    again = dlaunch(tmp_path, "study", "run", STUDIES / "smoke.toml", "--site", "local", "--output", runs)
    assert again.returncode == 0, again.stderr
    assert "0 jobs (left alone: 4 ended ok)" in again.stdout
    assert sorted(p.name for p in (folder / "scaling").iterdir()) == names

    failed = folder / "scaling" / "ddp-native-resnet44-g0002-step-r2"
    _fake_failed(failed)
    others = {n: (folder / "scaling" / n / "plan.json").stat().st_mtime_ns for n in names if n != failed.name}
    third = dlaunch(tmp_path, "study", "run", STUDIES / "smoke.toml", "--site", "local", "--output", runs)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "1 jobs (left alone: 3 ended ok)" in third.stdout and "resubmitting scaling/%s" % failed.name in third.stderr
    assert "--resume" in (failed / "job.sh").read_text()
    assert read_metrics(str(failed / "metrics.jsonl")).status == "ok"
    assert {n: (folder / "scaling" / n / "plan.json").stat().st_mtime_ns for n in others} == others

    elsewhere = dlaunch(tmp_path, "study", "run", STUDIES / "smoke.toml", "--site", "jureca-dc", "--output", runs, "--dry-run")
    assert elsewhere.returncode == 0  # a dry run writes nothing; a real run on another site is refused:
    refused = dlaunch(tmp_path, "study", "run", STUDIES / "smoke.toml", "--site", "generic-slurm", "--output", runs,
                      "--account", "x")
    assert refused.returncode == 2 and "was run on site local" in refused.stderr


# `dlaunch run --repeat N` (launcher/runs/repeat.py names the runs, the run service submits them): the
# same tiny request as the smoke study, on this machine.
SMOKE_TRAINER = ["--model", "resnet44", "--data", "synthetic", "--num-classes", "10", "--image-size", "32",
                 "--batch-size", "8", "--steps", "6", "--steps-per-epoch", "3", "--warmup-steps", "1", "--threads", "1",
                 "--device", "cpu", "--workers", "0"]


def _repeat(output: Path, repeats: int, *more: str) -> int:
    from launcher.cli import main

    return main(["run", "--site", "local", "--gpus", "1", "--output", str(output), "--experiment", "rep", "--run-name", "x",
                 "--repeat", str(repeats), *more] + SMOKE_TRAINER)


def test_repeat_names_are_deterministic_and_sort_in_submission_order():
    from launcher.runs.repeat import repeat_names

    assert repeat_names("g4", 3) == ["g4-r1", "g4-r2", "g4-r3"]
    assert repeat_names("g4", 10)[:2] == ["g4-r01", "g4-r02"] and repeat_names("g4", 10)[-1] == "g4-r10"
    assert sorted(repeat_names("g4", 12)) == repeat_names("g4", 12)


def test_repeat_dry_run_prints_every_job_and_writes_nothing(tmp_path, capsys):
    assert _repeat(tmp_path / "runs", 3, "--dry-run") == 0
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 3 and "3 runs of one request (--repeat 3)" in out
    for name in ("x-r1", "x-r2", "x-r3"):
        assert str(tmp_path / "runs" / "rep" / name) in out
    assert not (tmp_path / "runs").exists()


def test_repeat_refuses_a_taken_run_name_before_submitting_any(tmp_path, capsys):
    (tmp_path / "runs" / "rep" / "x-r2").mkdir(parents=True)
    assert _repeat(tmp_path / "runs", 2) == 2
    assert re.search(r"dlaunch: error: run directory .*x-r2 exists", capsys.readouterr().err)
    assert sorted(p.name for p in (tmp_path / "runs" / "rep").iterdir()) == ["x-r2"]  # x-r1 not submitted


@pytest.mark.slow
def test_repeat_runs_here_and_the_report_gives_their_median_and_spread(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    assert _repeat(tmp_path / "runs", 2) == 0
    runs = sorted((tmp_path / "runs" / "rep").iterdir())
    assert [r.name for r in runs] == ["x-r1", "x-r2"]
    assert [read_metrics(str(r / "metrics.jsonl")).status for r in runs] == ["ok", "ok"]
    report = dlaunch(tmp_path, "report", tmp_path / "runs", "-o", tmp_path / "report")
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    scaling = text.split("## Scaling", 1)[1].split("## Runs")[0]
    (row,) = [line for line in scaling.splitlines() if line.startswith("| rep/local/resnet44")]
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[1:5] == ["1", "1", "2", "min-max"]  # GPUs, nodes, runs, spread
    low, high = (float(v) for v in cells[6].split("-"))
    assert low <= float(cells[5]) <= high
