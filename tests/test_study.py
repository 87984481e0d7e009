"""Study files: validation, the aach2023 matrix rendered on JUWELS, the smoke study run here to a report
with the published values beside this run's, and resubmission of only what is missing or failed."""
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dlaunch.runs.study import expand
from dlaunch.runs.studyfile import load_study
from dlaunch.train.metrics_schema import make_record, read_metrics

REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "studies"
# `dlaunch` with the study group registered (as dlaunch/cli's lazy registration will do), through cli.main's
# error handling: bad input is one line and exit code 2.
DLAUNCH = ("import sys; from dlaunch.cli import app, main; from dlaunch.cli.study import study_app; "
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
    (("gpus = [1, 2]", "gpus = [1, 2]\nexclude = [{ nodes = 1 }]"), "matrix.0: exclude.0: nodes: the matrix lists gpus, not nodes"),
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


def test_aach2023_renders_every_job_on_juwels_with_its_figure_and_repeat(tmp_path):
    result = dlaunch(tmp_path, "study", "run", STUDIES / "aach2023.toml", "--site", "juwels", "--dry-run",
                     "--output", tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert result.stderr.rstrip().splitlines()[-1] == "387 jobs"  # stdout: the scripts alone
    assert out.count("#!/bin/bash") == 387
    labels = [line for line in out.splitlines() if line.startswith("# job ")]
    assert len(labels) == 387
    assert labels[0] == "# job 1/387 r50-dali-cpu-ddp/ddp-dali-resnet50-g0004-step-r1: Fig. 3a, Fig. 4a, Fig. 6, repeat 1 of 3"
    assert "# job 387/387 accuracy-65k/ddp-dali-resnet50-g1024-exponential-r1: Fig. 8b, Fig. 9, repeat 1 of 1" in labels
    assert "  Fig. 7: 102 jobs" in result.stderr and "  Table 2b: 17 jobs" in result.stderr  # the counts per figure
    assert "assumptions (unstated in the sources; this study's choice):" in result.stderr
    assert "label smoothing 0.1" in result.stderr and "label smoothing" not in out
    # the trainer scales --lr per --reference-batch images linearly: 0.025 x G for 64 images per GPU
    assert out.count("--lr 0.025 \\\n  --reference-batch 64 \\\n") == 387
    assert out.count("--batch-size 64 ") == 387 and out.count("--workers 8 ") == 387
    assert out.count("--dali-device gpu") == 54 and out.count("--kernel-profile-steps 100") == 51
    assert out.count("--framework deepspeed") == 24 and "--framework deepspeed \\\n  --model resnet50 \\\n  --loader dali" not in out
    assert out.count("paper-ddp-x86_64.sif") and "current-ddp" not in out  # the study's stack
    assert "needs an account" in result.stderr and "(387 jobs)" in result.stderr  # said once, counted
    assert "DLAUNCH_IMAGENET_TFRECORD" in result.stderr
    assert not (tmp_path / "runs").exists()


# The design of Aach et al. 2023 (shared/papers/aach2023-design.md), figure by figure: which runs each
# figure or table shows (framework, loader, DALI device, model, GPU counts, schedules) and how many runs
# stand for each point. DeepSpeed has no DALI run; the native loader none at 1024 GPUs.
ALL_GPUS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
NATIVE_GPUS = ALL_GPUS[:-1]
DESIGN = {
    "Fig. 3a": [("ddp", "dali", "cpu", "resnet50", ALL_GPUS), ("horovod", "dali", "cpu", "resnet50", ALL_GPUS)],
    "Fig. 3b": [(f, "native", None, "resnet50", NATIVE_GPUS) for f in ("ddp", "horovod", "deepspeed")],
    "Fig. 4a": [("ddp", "dali", "cpu", "resnet50", ALL_GPUS), ("horovod", "dali", "cpu", "resnet50", ALL_GPUS)],
    "Fig. 4b": [("ddp", "dali", "gpu", "resnet50", ALL_GPUS), ("horovod", "dali", "gpu", "resnet50", ALL_GPUS)],
    "Fig. 5": [(f, "native", None, "resnet50", NATIVE_GPUS) for f in ("ddp", "horovod", "deepspeed")],
    "Fig. 6": [("ddp", "dali", "cpu", m, ALL_GPUS) for m in ("resnet50", "resnet101", "resnet152")],
    "Fig. 7": [(f, "dali", "cpu", "resnet101", ALL_GPUS) for f in ("ddp", "horovod")]
              + [(f, "native", None, "resnet101", NATIVE_GPUS) for f in ("ddp", "horovod")],
    "Table 2a": [("ddp", "dali", "cpu", "resnet50", ALL_GPUS), ("ddp", "native", None, "resnet50", NATIVE_GPUS)],
    "Table 2b": [("ddp", "dali", "cpu", "resnet101", ALL_GPUS), ("ddp", "native", None, "resnet101", NATIVE_GPUS)],
    "Table 2c": [("ddp", "dali", "cpu", "resnet152", ALL_GPUS), ("ddp", "native", None, "resnet152", NATIVE_GPUS)],
    "Fig. 8b": [("ddp", "dali", "cpu", "resnet50", ALL_GPUS)],
    "Fig. 9": [("ddp", "dali", "cpu", "resnet50", (1024,))],
}
SCHEDULES_OF = {"Fig. 8b": ("step", "cosine", "exponential"), "Fig. 9": ("step", "cosine", "exponential")}
RUNS_PER_POINT = {figure: 3 if figure.startswith("Fig.") and figure[5] in "34567" else 1 for figure in DESIGN}


def test_aach2023_matrix_matches_the_papers_design_figure_by_figure():
    jobs = expand(load_study(STUDIES / "aach2023.toml"), "juwels", Path("runs"))
    assert len({(j.matrix, j.name) for j in jobs}) == len(jobs) == 387  # no run twice
    assert all(j.figures for j in jobs)
    for figure, series in DESIGN.items():
        expected = Counter((f, loader, device, model, gpus, schedule)
                           for f, loader, device, model, counts in series for gpus in counts
                           for schedule in SCHEDULES_OF.get(figure, ("step",)) for _ in range(RUNS_PER_POINT[figure]))
        actual = Counter((j.coordinates["framework"], j.coordinates["loader"],
                          j.request.option("dali-device") if j.coordinates["loader"] == "dali" else None,
                          j.coordinates["model"], j.coordinates["gpus"], j.coordinates["schedule"])
                         for j in jobs if figure in j.figures)
        assert actual == expected, figure
        assert sorted(j.coordinates["repeat"] for j in jobs if figure in j.figures) == sorted(
            r for _ in range(sum(expected.values()) // RUNS_PER_POINT[figure]) for r in range(1, RUNS_PER_POINT[figure] + 1))
    counts = Counter(f for j in jobs for f in j.figures)
    assert {f: counts[f] for f in DESIGN} == {"Fig. 3a": 54, "Fig. 3b": 72, "Fig. 4a": 54, "Fig. 4b": 54, "Fig. 5": 72,
                                             "Fig. 6": 81, "Fig. 7": 102, "Table 2a": 17, "Table 2b": 17,
                                             "Table 2c": 17, "Fig. 8b": 27, "Fig. 9": 3}
    assert not [j for j in jobs if j.coordinates["framework"] == "deepspeed" and j.coordinates["loader"] == "dali"]
    assert all(j.request.option("kernel-profile-steps") for j in jobs if j.figures[0].startswith("Table 2"))


def test_aach2023_paper_protocol_is_one_flag_away(tmp_path):
    study = load_study(STUDIES / "aach2023.toml")
    short = {(j.matrix, j.name): j.request for j in expand(study, "juwels", Path("runs"))}
    paper = {(j.matrix, j.name): j.request for j in expand(study, "juwels", Path("runs"), protocol="paper")}
    assert short.keys() == paper.keys()
    scaling = ("r50-native", "ddp-native-resnet50-g0004-step-r1")
    assert short[scaling].option("steps") == 500 and short[scaling].option("epochs") is None
    assert paper[scaling].option("epochs") == 90 and paper[scaling].option("steps") is None
    assert paper[scaling].time == "24:00:00"
    profiled = {key: r for key, r in paper.items() if key[0].startswith("table2")}
    assert {r.option("epochs") for key, r in profiled.items() if r.gpus == 4} == {5}  # "5 epochs on 4 GPUs"
    assert {r.option("epochs") for key, r in profiled.items() if r.gpus != 4} == {10}
    result = dlaunch(tmp_path, "study", "run", STUDIES / "aach2023.toml", "--site", "juwels", "--dry-run",
                     "--protocol", "fast")
    assert result.returncode == 2 and "--protocol: study aach2023 has no protocol 'fast'" in result.stderr


def test_a_study_may_name_its_stack_and_the_site_may_keep_its_own():
    study = load_study(STUDIES / "aach2023.toml")
    jobs = expand(study, "juwels", Path("runs"), only=["matrix=r50-native", "gpus=4", "repeat=1"])
    assert [Path(j.request.image).name for j in jobs] == ["paper-ddp-x86_64.sif", "paper-horovod-x86_64.sif",
                                                          "paper-deepspeed-x86_64.sif"]
    own = expand(study, "juwels", Path("runs"), only=["matrix=r50-native", "gpus=4", "repeat=1"], stack="site")
    assert [j.request.image for j in own] == [None, None, None]  # prepare gives the site's default


def test_later_recipes_win_and_a_run_length_replaces_the_other():
    from dlaunch.runs.study import merge_recipes

    assert merge_recipes({"epochs": 90, "lr": 0.1}, {"lr": 0.2}, {"steps": 500}) == {"lr": 0.2, "steps": 500}
    assert merge_recipes({"steps": 5}, {"epochs": 3, "steps": 4}) == {"epochs": 3, "steps": 4}  # one recipe: both kept


def test_gpu_counts_above_a_node_spread_evenly_over_the_fewest_nodes():
    from dlaunch.runs.study import spread_nodes

    assert [spread_nodes(g, 4) for g in (1, 3, 4, 8, 12)] == [None, None, None, None, None]
    assert [spread_nodes(g, 8) for g in (4, 8, 12, 16, 20)] == [None, None, 2, None, 4]
    assert spread_nodes(5, 4) == 5  # 1 per node: no fewer nodes hold 5 evenly
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

    # The comparison with the published figures is the subject here, not the flags: whether a 2-process run on
    # this machine's shared cores comes out a straggler is up to the moment, so flagged runs are kept in.
    report = dlaunch(tmp_path, "study", "report", folder, "-o", tmp_path / "report", "--include-stragglers")
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "published_vs_this_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Published vs this run", 1)[1]
    assert "Assumptions (values the sources leave unstated, fixed by this study):\n- batch 8 per process" in section
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
    assert "1 job (left alone: 3 ended ok)" in third.stdout and "resubmitting scaling/%s" % failed.name in third.stderr
    assert "--resume" in (failed / "job.sh").read_text()
    assert read_metrics(str(failed / "metrics.jsonl")).status == "ok"
    assert {n: (folder / "scaling" / n / "plan.json").stat().st_mtime_ns for n in others} == others

    elsewhere = dlaunch(tmp_path, "study", "run", STUDIES / "smoke.toml", "--site", "jureca-dc", "--output", runs, "--dry-run")
    assert elsewhere.returncode == 0  # a dry run writes nothing; a real run on another site is refused:
    refused = dlaunch(tmp_path, "study", "run", STUDIES / "smoke.toml", "--site", "generic-slurm", "--output", runs,
                      "--account", "x")
    assert refused.returncode == 2 and "was run on site local" in refused.stderr


# `dlaunch run --repeat N` (dlaunch/runs/repeat.py names the runs, the run service submits them): the
# same tiny request as the smoke study, on this machine.
SMOKE_TRAINER = ["--model", "resnet44", "--data", "synthetic", "--num-classes", "10", "--image-size", "32",
                 "--batch-size", "8", "--steps", "6", "--steps-per-epoch", "3", "--warmup-steps", "1", "--threads", "1",
                 "--device", "cpu", "--workers", "0"]


def _repeat(output: Path, repeats: int, *more: str) -> int:
    from dlaunch.cli import main

    return main(["run", "--site", "local", "--gpus", "1", "--output", str(output), "--experiment", "rep", "--run-name", "x",
                 "--repeat", str(repeats), *more] + SMOKE_TRAINER)


def test_repeat_names_are_deterministic_and_sort_in_submission_order():
    from dlaunch.runs.repeat import repeat_names

    assert repeat_names("g4", 3) == ["g4-r1", "g4-r2", "g4-r3"]
    assert repeat_names("g4", 10)[:2] == ["g4-r01", "g4-r02"] and repeat_names("g4", 10)[-1] == "g4-r10"
    assert sorted(repeat_names("g4", 12)) == repeat_names("g4", 12)


def test_repeat_dry_run_prints_every_job_and_writes_nothing(tmp_path, capsys):
    assert _repeat(tmp_path / "runs", 3, "--dry-run") == 0
    out, err = capsys.readouterr()
    assert out.count("#!/bin/bash") == 3 and "3 runs of one request (--repeat 3)" in err
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
    # whether 2 repeats on this shared machine spread beyond the noise threshold is a state of timing: kept
    report = dlaunch(tmp_path, "report", tmp_path / "runs", "-o", tmp_path / "report", "--include-doubtful")
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    scaling = text.split("## Scaling", 1)[1].split("## Measurement quality")[0]
    (row,) = [line for line in scaling.splitlines() if line.startswith("| rep/local/resnet44")]
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[1:5] == ["1", "1", "2", "min-max"]  # GPUs, nodes, runs, spread
    low, high = (float(v) for v in cells[6].split("-"))
    assert low <= float(cells[5]) <= high


def test_study_check_names_the_jobs_that_cannot_run_on_a_site_and_exits_1(tmp_path):
    study = tmp_path / "odd.toml"
    study.write_text(GOOD.replace("gpus = [1, 2]", "gpus = [4, 2000]").replace('name = "bad"', 'name = "odd"'))
    result = dlaunch(tmp_path, "study", "check", study, "--site", "juwels")
    assert result.returncode == 1, result.stderr
    assert "juwels-booster: 1 of 2 jobs cannot run there" in result.stdout
    assert "juwels-booster: --nodes: no partition of site juwels-booster takes 500 node(s)" in result.stdout
    assert "m/ddp-native-resnet44-g2000-step-r1: no figure, repeat 1 of 1" in result.stdout
    everywhere = dlaunch(tmp_path, "study", "check", study)  # jureca-dc (128 nodes) is too small: skipped
    assert "jureca-dc: skipped (too small: the study's largest jobs take 500 nodes" in everywhere.stdout
    fine = dlaunch(tmp_path, "study", "check", STUDIES / "mahon2020.toml", "--site", "lumi-g", "--site", "juwels")
    assert fine.returncode == 0 and "lumi-g: ok (40 jobs)" in fine.stdout and "juwels-booster: ok (40 jobs)" in fine.stdout


# What keeps a shipped study from rendering on a shipped site of its kind today, and why: each entry is
# asserted (the reason and the count), so that the entry fails once the gap closes and is taken out.
# - partitions: Polaris takes jobs of 3-9 nodes for at most an hour (debug-scaling; preemptable is picked only
#   by name), and the study asks a day.
KNOWN_GAPS = {
    ("aach2023", "polaris"): ("no partition of site polaris takes", 12),
}


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_study_renders_on_every_shipped_site_of_its_kind(path):
    from dlaunch.runs.study import check_study

    results = check_study(path)
    checked = [r for r in results if not r.skipped]
    assert checked, "no shipped site is of the kind of %s" % path.stem
    for r in checked:
        gap = KNOWN_GAPS.get((path.stem, r.site))
        if gap is None:
            assert not r.failures, (r.site, r.failures[:3])
        else:
            assert len(r.failures) == gap[1] and all(gap[0] in why for _, why in r.failures), (r.site, r.failures[:3])


def _engine_run(root: Path, framework: str, name: str, workers: int, images_per_s: float) -> None:
    """A hand-made metrics file of one run (two epochs, the second measured)."""
    records = [make_record("header", 1.0, run_id=name, argv=["python", "-m", "dlaunch.train.tf"], config={}, framework=framework,
                           loader="native", model="resnet44", device="cpu", world_size=workers, nodes=workers,
                           hosts=["n%d" % i for i in range(workers)], batch_per_worker=128, global_batch=128 * workers,
                           lr_scaled=0.1, versions={}, slurm_job_id=None, site="juwels-cluster",
                           experiment="cpu-ps.all-reduce", image=None, git_revision=None)]
    records += [make_record("epoch", 2.0 + e, epoch=e, steps=10, images=1280 * workers, images_per_s=images_per_s,
                            epoch_time_s=1.0, data_wait_s=0.0, loss=1.0, lr=0.1) for e in range(2)]
    records.append(make_record("end", 9.0, status="ok", total_time_s=9.0, epochs_completed=2))
    (root / name).mkdir(parents=True)
    (root / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_throughput_ratio_comparison_draws_the_published_ratio_beside_this_runs(tmp_path):
    from dlaunch.analysis.published import compare_published
    from dlaunch.analysis.scaling import load_runs
    from dlaunch.paths import PUBLISHED_DIR

    for repeat, (torch_x, tf_x) in enumerate([(300.0, 100.0), (330.0, 110.0)], 1):
        _engine_run(tmp_path, "ddp", "ddp-n2-r%d" % repeat, 2, torch_x)
        _engine_run(tmp_path, "tf-allreduce", "tf-n2-r%d" % repeat, 2, tf_x)
    _engine_run(tmp_path, "ddp", "ddp-n4-r1", 4, 500.0)  # no TensorFlow run at 4: no ratio there
    compare = load_study(STUDIES / "cpu-ps.toml").compare[0]
    c = compare_published(compare, PUBLISHED_DIR / compare.file, load_runs([str(tmp_path)]).runs)
    assert c.published == [(2, 2.65)]  # the paper's average ratio, drawn at each measured count
    [(workers, spread)] = c.measured["ddp / tf-allreduce"]
    assert workers == 2 and spread.median == pytest.approx(315.0 / 105.0)
    assert (spread.low, spread.high) == (pytest.approx(300.0 / 110.0), pytest.approx(330.0 / 100.0))


def test_a_study_report_without_published_data_names_no_plot(tmp_path):
    from test_analysis import write_run

    folder = tmp_path / "smoke"
    text = (STUDIES / "smoke.toml").read_text()
    folder.mkdir()
    (folder / "study.toml").write_text(re.sub(r"(?ms)^compare = \[.*?^\]\n", "", text))
    for gpus, x in ((1, 100.0), (2, 180.0)):
        write_run(folder, "g%d" % gpus, gpus, [10.0, x], model="resnet44", experiment="scaling")
    report = dlaunch(tmp_path, "study", "report", folder, "-o", tmp_path / "report")
    assert report.returncode == 0, report.stderr
    assert "The study compares with no published data." in (tmp_path / "report" / "report.md").read_text()
    assert not (tmp_path / "report" / "published_vs_this_run.png").exists()
    assert "published_vs_this_run.png" not in report.stdout and "report.md" in report.stdout


def test_study_report_keeps_runs_with_a_straggler_apart_unless_included(tmp_path):
    """As `report`: a straggler's run is listed apart; --include-stragglers (missing from `study report` before)
    puts it back into the scaling table."""
    from test_analysis import v4_fields, write_run
    from dlaunch.train.metrics_schema import VERSION

    folder = tmp_path / "smoke"
    folder.mkdir()
    (folder / "study.toml").write_text((STUDIES / "smoke.toml").read_text())
    slow = v4_fields([0.1, 0.2])  # rank 1 computes 33 % slower than the median rank
    write_run(folder, "g1", 1, [10.0, 100.0], model="resnet44", experiment="scaling", version=VERSION)
    write_run(folder, "g2", 2, [10.0, 120.0], model="resnet44", experiment="scaling", version=VERSION,
              epoch_fields=[slow, slow])

    def scaling_gpus(*flags: str):
        """The GPU counts of the scaling table, and of this run's values beside the published ones."""
        report = dlaunch(tmp_path, "study", "report", folder, "-o", tmp_path / "report", *flags)
        assert report.returncode == 0, report.stderr
        text = (tmp_path / "report" / "report.md").read_text()
        section = text.split("## Scaling", 1)[1].split("\n## ", 1)[0]
        published = [[c.strip() for c in line.strip("|").split(" | ")]
                     for line in text.split("## Published vs this run", 1)[1].splitlines() if line.startswith("| Mahon")]
        return ([line.split(" | ")[1].strip() for line in section.splitlines() if line.startswith("| scaling/")],
                [row[1] for row in published if row[7] not in ("", "-")])

    assert scaling_gpus() == (["1"], ["1"])
    assert scaling_gpus("--include-stragglers") == (["1", "2"], ["1", "2"])  # the published comparison kept it out too
    assert scaling_gpus("--straggler-threshold", "0.5") == (["1", "2"], ["1", "2"])


def test_a_study_is_found_by_name_from_any_folder_and_by_its_folder_variable(tmp_path, monkeypatch):
    """As sites: `study run aach2023` anywhere (issue 37: only `studies/aach2023.toml` inside the checkout
    worked), a file in $DLAUNCH_STUDIES_DIR by its name (before a shipped one), or a path."""
    listed = dlaunch(tmp_path, "study", "run", "smoke", "--site", "local", "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0] == "scaling/ddp-native-resnet44-g0001-step-r1: no figure, repeat 1 of 2; 1 node, 1 GPU"
    checked = dlaunch(tmp_path, "study", "check", "mahon2020", "--site", "juwels")
    assert checked.returncode == 0 and "juwels-booster: ok (40 jobs)" in checked.stdout
    moved = dlaunch(tmp_path, "study", "run", "studies/smoke.toml", "--site", "local", "--list")
    assert moved.returncode == 2 and moved.stderr == (
        "dlaunch: error: studies/smoke.toml: no such file; the study smoke is found by its name from any folder (%s)\n"
        % (STUDIES / "smoke.toml"))
    unknown = dlaunch(tmp_path, "study", "run", "nosuch", "--site", "local", "--list")
    assert unknown.returncode == 2 and "study 'nosuch': no such study (known: aach2023, " in unknown.stderr
    mine = tmp_path / "mystudies"
    mine.mkdir()
    (mine / "smoke.toml").write_text(GOOD.replace('name = "bad"', 'name = "mysmoke"'))
    monkeypatch.setenv("DLAUNCH_STUDIES_DIR", str(mine))
    own = dlaunch(tmp_path, "study", "run", "smoke", "--site", "local", "--list")
    assert own.returncode == 0 and own.stdout.splitlines() == [
        "m/ddp-native-resnet44-g0001-step-r1: no figure, repeat 1 of 1; 1 node, 1 GPU",
        "m/ddp-native-resnet44-g0002-step-r1: no figure, repeat 1 of 1; 1 node, 2 GPUs"]
    assert own.stderr.splitlines()[0] == "study mysmoke" and own.stderr.splitlines()[-1] == "2 jobs"


def test_study_list_is_one_line_per_job_and_writes_nothing(tmp_path):
    listed = dlaunch(tmp_path, "study", "run", "aach2023", "--site", "juwels", "--list", "--output", tmp_path / "runs")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 387 and "#!/bin/bash" not in listed.stdout
    assert lines[0] == "r50-dali-cpu-ddp/ddp-dali-resnet50-g0004-step-r1: Fig. 3a, Fig. 4a, Fig. 6, repeat 1 of 3; 1 node, 4 GPUs"
    assert lines[-1] == ("accuracy-65k/ddp-dali-resnet50-g1024-exponential-r1: Fig. 8b, Fig. 9, repeat 1 of 1; "
                         "256 nodes, 1024 GPUs")
    assert listed.stderr.rstrip().splitlines()[-1] == "387 jobs"
    assert not (tmp_path / "runs").exists()


def test_study_reports_published_comparison_leaves_a_doubtful_point_out_unless_included(tmp_path):
    """As `report`'s tables: a point the quality verdict doubts (here E_G 1.3 from one run per point: more than ideal
    beyond what noise allows) is no value beside the published ones unless --include-doubtful (it was drawn)."""
    from test_analysis import write_run

    folder = tmp_path / "smoke"
    folder.mkdir()
    (folder / "study.toml").write_text((STUDIES / "smoke.toml").read_text())
    write_run(folder, "g1", 1, [10.0, 100.0], model="resnet44", experiment="scaling")
    write_run(folder, "g2", 2, [10.0, 260.0], model="resnet44", experiment="scaling")

    def published_gpus(*flags: str):
        report = dlaunch(tmp_path, "study", "report", folder, "-o", tmp_path / "report", *flags)
        assert report.returncode == 0, report.stderr
        text = (tmp_path / "report" / "report.md").read_text()
        rows = [[c.strip() for c in line.strip("|").split(" | ")]
                for line in text.split("## Published vs this run", 1)[1].splitlines() if line.startswith("| Mahon")]
        return [row[1] for row in rows if row[7] not in ("", "-")]

    assert published_gpus() == ["1"]
    assert published_gpus("--include-doubtful") == ["1", "2"]
