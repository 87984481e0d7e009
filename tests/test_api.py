"""The Python API (dlaunch/api/, docs/API.md): each function on real files and processes, its errors against the
command line's lines, and `--json` of each listing read back through the API's dataclasses."""
import ast
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import dlaunch
from dlaunch import api
from dlaunch.api.record import field_types
from dlaunch.cli import main
from dlaunch.errors import DlaunchError, DlaunchNote
from test_analysis import write_run as write_metrics
from test_watch import end, epoch, finished, header, write_run

REPO = Path(__file__).resolve().parents[1]
TINY = dict(model="resnet18", image_size=32, batch_size=4, threads=1, device="cpu", steps=2, steps_per_epoch=1,
            warmup_steps=1, num_classes=10)


def loaded_after(code: str) -> set:
    """The dlaunch modules a fresh interpreter has loaded after running `code`."""
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'dlaunch'))"],
                          capture_output=True, text=True, check=True, cwd=REPO)
    return set(ast.literal_eval(done.stdout.splitlines()[-1]))


def test_import_dlaunch_loads_the_api_on_first_use_only():
    assert loaded_after("import dlaunch") == {"dlaunch"}
    assert not {m for m in loaded_after("import dlaunch.train.config") if not m.startswith("dlaunch.train")} - {"dlaunch"}
    assert "dlaunch.api" in loaded_after("import dlaunch; dlaunch.run")
    assert {"run", "status", "Job", "DlaunchError", "api"} <= set(dir(dlaunch))
    # results and doctor are the API's functions (the modules of those names are dlaunch.resultsdb and dlaunch.preflight)
    assert (dlaunch.results, dlaunch.doctor, dlaunch.study, dlaunch.study_status) == (api.results, api.doctor, api.study,
                                                                                      api.study_status)
    assert all(getattr(dlaunch, name) is not None for name in dlaunch.__all__)
    with pytest.raises(AttributeError):
        dlaunch.no_such_name


def test_the_package_init_is_python_3_9():
    """The images carry dlaunch/__init__.py and dlaunch/train only, with Python 3.9."""
    ast.parse((REPO / "dlaunch" / "__init__.py").read_text(), feature_version=(3, 9))


def test_no_exported_name_is_a_module_of_the_package():
    """An imported submodule takes its name in the package: an API function of that name would vanish."""
    modules = {p.stem for p in (REPO / "dlaunch").glob("*.py")} | {p.name for p in (REPO / "dlaunch").iterdir() if p.is_dir()}
    assert set(dlaunch.__all__) & modules == {"api"}  # the module itself
    assert set(dlaunch.__all__) <= set(api.__all__) | {"DlaunchError", "DlaunchWarning", "DlaunchNote", "api"}


def test_records_come_back_from_their_json():
    job = api.Job("runs/e/r", "local", "local", "e", "r", "#!/bin/bash\n", warnings=["w"], exit_code=0, submitted=True)
    point = api.ReportPoint(4, 1, 2, api.Spread(10.0, 9.0, 11.0, 2, "min-max"), api.Spread(1.0, 1.0, 1.0, 2, "min-max"),
                            api.Spread(1.0, 1.0, 1.0, 2, "min-max"), shares={"comm": 0.5, "compute": 0.5, "data": 0.0})
    for record in (job, point, api.BudgetRow(8, 0.9, 0.1, {"data": None, "other": 0.1})):
        assert type(record).from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert api.Spread.from_dict({"median": 1, "low": 1, "high": 1, "runs": 1, "kind": "min-max"}).median == 1.0
    with pytest.raises(DlaunchError, match="Job: unknown field colour"):
        api.Job.from_dict(dict(job.to_dict(), colour="red"))
    with pytest.raises(DlaunchError, match=r"Spread.runs: expected int, got '1'"):
        api.Spread.from_dict({"median": 1, "low": 1, "high": 1, "runs": "1", "kind": "min-max"})


def test_result_rows_have_the_databases_columns_and_the_derived_ones():
    from dlaunch.resultsdb.store import NAMES

    assert [f for f in field_types(api.ResultRow)] == list(NAMES) + ["speedup", "efficiency", "quality", "quality_why",
                                                                      "history", "rcp"]


def cli_error(capsys, argv) -> str:
    """The line after `dlaunch: error: ` (exit code 2) of `dlaunch ARGV`."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dlaunch: error: ") and len(err.splitlines()) == 1, err
    return err[len("dlaunch: error: "):]


@pytest.mark.parametrize("call, argv", [
    (lambda: api.run(dry_run=True), ["run", "--dry-run"]),
    (lambda: api.run("local", repeat=0, dry_run=True), ["run", "--site", "local", "--repeat", "0", "--dry-run"]),
    (lambda: api.run("local", repeat=101, dry_run=True), ["run", "--site", "local", "--repeat", "101", "--dry-run"]),
    (lambda: api.run("nowhere", dry_run=True), ["run", "--site", "nowhere", "--dry-run"]),
    (lambda: api.run("local", framework="caffe", dry_run=True), ["run", "--site", "local", "--framework", "caffe", "--dry-run"]),
    (lambda: api.run("local", run_name="a/b", dry_run=True), ["run", "--site", "local", "--run-name", "a/b", "--dry-run"]),
    (lambda: api.sweep("juwels", nodes=[1, 2, 1], account="p", dry_run=True),
     ["sweep", "--site", "juwels", "--nodes", "1,2,1", "--account", "p", "--dry-run"]),
    (lambda: api.sweep("juwels", account="p", dry_run=True), ["sweep", "--site", "juwels", "--account", "p", "--dry-run"]),
    (lambda: api.status(["nowhere"]), ["status", "nowhere"]),
    (lambda: api.status(["bad\x1bname"]), ["status", "bad\x1bname"]),
    (lambda: api.status(["nowhere"], newest_first=True), ["runs", "nowhere"]),
    (lambda: api.watch(["runs"], interval=0.05), ["watch", "--interval", "0.05", "runs"]),
    (lambda: api.cancel("nowhere"), ["cancel", "nowhere"]),
    (lambda: api.logs("nowhere"), ["logs", "nowhere"]),
    (lambda: api.report(["nowhere"]), ["report", "nowhere"]),
    (lambda: api.report(["nowhere"], straggler_threshold=2.0), ["report", "--straggler-threshold", "2", "nowhere"]),
    (lambda: api.results(db="nowhere.sqlite"), ["results", "--db", "nowhere.sqlite"]),
    (lambda: api.images(site="nowhere"), ["images", "--site", "nowhere"]),
    (lambda: api.doctor("nowhere"), ["doctor", "--site", "nowhere"]),
    (lambda: api.doctor("local", framework="caffe"), ["doctor", "--site", "local", "--framework", "caffe"]),
    (lambda: api.predict("nowhere"), ["predict", "--site", "nowhere"]),
    (lambda: api.predict("local"), ["predict", "--site", "local"]),
    (lambda: api.predict("juwels", model="resnet50", calibrated="wood"), ["predict", "--site", "juwels", "--model", "resnet50",
                                                                          "--calibrated", "wood"]),
    (lambda: api.predict("juwels", gpus=[4, 100000], model="resnet50"), ["predict", "--site", "juwels", "--gpus", "4,100000",
                                                                         "--model", "resnet50"]),
    (lambda: api.predict("juwels", from_runs=["nowhere"]), ["predict", "--site", "juwels", "--from-runs", "nowhere"]),
    (lambda: api.study("nosuch", site="local"), ["study", "run", "nosuch", "--site", "local"]),
    (lambda: api.study("smoke", site="nowhere", dry_run=True), ["study", "run", "smoke", "--site", "nowhere", "--dry-run"]),
    (lambda: api.study_status("nowhere"), ["study", "status", "nowhere"]),
])
def test_each_functions_error_is_the_command_lines_line(call, argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DlaunchError) as raised:
        call()
    assert raised.value.exit_code == 2
    assert str(raised.value) == cli_error(capsys, argv)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_an_os_error_is_the_command_lines_line_too(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(DlaunchError) as raised:
        api.run("local", output="file", experiment="e", run_name="r", gpus=1)
    assert isinstance(raised.value.__cause__, OSError)
    assert str(raised.value) == cli_error(capsys, ["run", "--site", "local", "--output", "file", "--experiment", "e",
                                                   "--run-name", "r", "--gpus", "1"])


def test_trainer_flags_are_keyword_arguments_checked_as_flags(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (job,) = api.run("local", gpus=2, experiment="e", run_name="r", batch_size=8, channels_last=True, sync_bn=False,
                     amp="bf16", lr=0.5, dry_run=True)
    assert (job.site, job.scheduler, job.experiment, job.run_name, job.job_id, job.submitted) == ("local", "local", "e", "r", None, False)
    assert Path(job.run_dir) == tmp_path / "runs" / "e" / "r"
    assert "--batch-size 8" in job.script and "--channels-last" in job.script and "--sync-bn" not in job.script
    assert main(["run", "--site", "local", "--gpus", "2", "--experiment", "e", "--run-name", "r", "--batch-size", "8",
                 "--channels-last", "--amp", "bf16", "--lr", "0.5", "--dry-run"]) == 0
    assert capsys.readouterr().out == job.script  # the same script as the command line's
    for wrong, message in [(dict(batch_sizes=8), "--batch-sizes: not a trainer option"),
                           (dict(batch_size="8"), "--batch-size: expected int, got '8'"),
                           (dict(amp="fp8"), "--amp: 'fp8' is not one of none, bf16, fp16"),
                           (dict(workers=-1), "--workers: must not be negative, got -1")]:
        with pytest.raises(DlaunchError, match="^%s$" % message):
            api.run("local", dry_run=True, **wrong)
    assert list(tmp_path.iterdir()) == []


def test_a_sweeps_jobs_are_one_experiment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    jobs = api.sweep("juwels", nodes=[1, 2, 4], account="p", experiment="scaling", dry_run=True)
    assert [(j.experiment, j.run_name) for j in jobs] == [("scaling", "n0001"), ("scaling", "n0002"), ("scaling", "n0004")]
    assert ["#SBATCH --nodes=%d" % n in j.script for j, n in zip(jobs, (1, 2, 4))] == [True] * 3
    assert all("does not exist" in " ".join(j.warnings) for j in jobs)  # the default image: warned in a dry run


def test_a_local_run_runs_to_its_end_quietly_then_status_logs_results_and_cancel(tmp_path, monkeypatch, capfd):
    """One tiny real run of the trainer on this machine (a foreground site): nothing on stdout."""
    monkeypatch.chdir(tmp_path)
    (job,) = api.run("local", gpus=1, experiment="e", run_name="r", **TINY)
    assert capfd.readouterr().out == ""
    assert (job.submitted, job.exit_code) == (True, 0) and job.job_id.startswith("local-")
    (seen,) = api.status()
    assert (seen.name, seen.ok, seen.ended, seen.status, seen.gpus, seen.epochs_done) == ("runs/e/r", True, True, "ok", 1, 2)
    assert seen.images_per_s > 0 and seen.why_failed is None and seen.job == job.job_id
    found = api.logs("runs/e/r")
    assert found.files and not found.failed and Path(found.files[0]).is_file()
    (row,) = api.results()
    assert (row.run, row.experiment, row.gpus, row.status, row.efficiency) == ("r", "e", 1, "ok", 1.0)
    assert api.cancel("runs/e/r") == "runs/e/r had ended (finished (exit 0); metrics ok): nothing to cancel"


def test_archive_and_rerun_are_api_functions_the_commands_print(tmp_path, monkeypatch, capfd):
    """`archive` and `rerun` (command line only before): the API's objects, and the commands print the same."""
    monkeypatch.chdir(tmp_path)
    api.run("local", gpus=1, experiment="e", run_name="r", **TINY)
    bundle = api.archive("runs/e", "e.tar.gz")
    assert (bundle.file, bundle.manifest, bundle.without_profile) == ("e.tar.gz", "e/manifest.json", [])
    assert bundle.files > 0 and bundle.bytes > 0 and api.Archive.from_dict(bundle.to_dict()) == bundle
    capfd.readouterr()
    assert main(["archive", "runs/e", "-o", "again.tar.gz"]) == 0
    assert capfd.readouterr().out == "wrote again.tar.gz: %d files, %d bytes before compression, manifest e/manifest.json\n" % (
        bundle.files, bundle.bytes)
    again = api.rerun("e.tar.gz:e/r", site="juwels", gpus=8, dry_run=True)
    assert again.parent == "%s:e/r" % (tmp_path / "e.tar.gz")
    assert ["nodes", "1", "2"] in again.differences and not again.job.submitted
    assert "#SBATCH --nodes=2" in again.job.script and api.Rerun.from_dict(again.to_dict()) == again
    assert main(["rerun", "e.tar.gz:e/r", "--site", "juwels", "--gpus", "8", "--dry-run"]) == 0
    assert "#SBATCH --nodes=2" in capfd.readouterr().out
    assert not Path("runs/rerun-e").exists()


def test_status_reads_written_runs_says_why_one_failed_and_rejects_a_broken_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs" / "e", "good", finished())
    write_run(tmp_path / "runs" / "e", "bad", [header(), epoch(0), end("failed", "the loss was NaN")], state="finished (exit 1)")
    broken = write_run(tmp_path / "runs" / "e", "broken", finished())
    (broken / "job_id").write_text("not a job id!\n")
    seen = {Path(s.path).name: s for s in api.status()}
    assert seen["good"].ok and seen["good"].images_per_s is not None and seen["good"].epochs_total == 3
    assert not seen["bad"].ok and seen["bad"].why_failed == "the loss was NaN" and seen["bad"].state == "finished (exit 1)"
    assert seen["broken"].rejected.endswith("is not a job id") and seen["broken"].status == ""
    assert [s.name for s in api.status(["runs/e/good", "runs/e/bad"])] == ["runs/e/good", "runs/e/bad"]


def test_watch_returns_when_every_run_has_ended_or_at_its_timeout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs" / "e", "done", finished())
    assert [s.ok for s in api.watch(["e"], interval=0.1)] == [True]  # an experiment's name under ./runs
    write_run(tmp_path / "runs" / "e", "live", [header(), epoch(0)], state="running here (dlaunch pid %d)" % os.getpid())
    seen = api.watch(["runs/e"], interval=0.1, timeout=0)
    assert sorted((Path(s.path).name, s.ended) for s in seen) == [("done", True), ("live", False)]


def test_report_gives_the_groups_numbers_and_writes_its_files_when_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for gpus, x in ((1, 100.0), (2, 180.0), (4, 300.0)):
        write_metrics(tmp_path / "runs", "g%d" % gpus, gpus, [x, x])
    write_metrics(tmp_path / "runs", "nan", 2, [50.0, 50.0], end={"status": "diverged", "reason": "loss NaN"})
    (tmp_path / "runs" / "junk").mkdir()
    (tmp_path / "runs" / "junk" / "metrics.jsonl").write_text("not json\n")
    made = api.report(["runs"])
    (group,) = made.groups
    assert (group.model, group.batch_per_gpu, len(group.runs)) == ("resnet50", 8, 3)
    assert [(p.gpus, p.images_per_s.median, round(p.speedup.median, 3), round(p.efficiency.median, 3)) for p in group.points] == [
        (1, 100.0, 1.0, 1.0), (2, 180.0, 1.8, 0.9), (4, 300.0, 3.0, 0.75)]
    assert [(r.why, r.details) for r in made.set_apart] == [("diverged", ["loss NaN"])]
    assert len(made.rejected) == 1 and "junk" in made.rejected[0] and made.files == []
    assert not (tmp_path / "report").exists()
    written = api.report(["runs"], output="out")
    assert {Path(f).name for f in written.files} >= {"report.md", "report.html"} and all(Path(f).is_file() for f in written.files)
    assert api.Report.from_dict(json.loads(json.dumps(written.to_dict()))) == written
    assert [t.title for t in written.tables][:2] == [group.label, group.label + ": runs"]  # what `dlaunch report` prints
    heard = []
    with pytest.raises(DlaunchError, match="^no valid metrics files in runs/junk"):
        api.report(["runs/junk"], on_rejected=heard.append)
    assert heard == made.rejected  # heard before the refusal


def test_results_selects_rows_and_notes_a_selector_that_matches_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs" / "e", "good", finished())
    api.status()  # records the ended run
    assert [r.run for r in api.results(["site=local"])] == ["x"]  # the header's run id
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert api.results(["site=nosuch"]) == []
    assert [(w.category, str(w.message)) for w in caught] == [
        (DlaunchNote, "-w site=nosuch matches no run in the database (its values of site: local)")]


def test_sites_images_doctor_and_predict_return_what_their_commands_show(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = {s.name: s for s in api.sites()}
    assert found["juwels-booster"].scheduler == "slurm" and "juwels" in found["juwels-booster"].aliases
    assert found["local"].gpus_per_node is not None and all(s.unreadable is None for s in found.values())
    shown = api.images(site="juwels")
    assert shown and all(i.image.startswith("current-") and i.sites == ["juwels-booster"] for i in shown)
    assert all(i.pins_from.startswith("lock") and i.pins for i in shown)
    checked = api.doctor("local")
    assert checked.site == "local" and not checked.failed
    assert {c.outcome for c in checked.checks} <= {"pass", "skip"}
    predicted = api.predict("juwels", gpus=[4, 8], model="resnet50")
    assert [r.gpus for r in predicted.rows] == [4, 8] and predicted.rows[0].efficiency == 1.0
    assert 0 < predicted.rows[1].efficiency < 1 and predicted.site == "juwels-booster"


def cli_json(capsys, argv, code=0):
    capsys.readouterr()
    assert main(argv) == code
    return json.loads(capsys.readouterr().out)


def test_each_listings_json_round_trips_through_the_api_types(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs" / "e", "good", finished())
    write_run(tmp_path / "runs" / "e", "bad", [header(), end("failed", "oom")], state="finished (exit 1)")
    for argv, kind, code in [(["status", "--json"], api.RunStatus, 0), (["runs", "--json"], api.RunStatus, 0),
                             (["status", "runs/e", "--json"], api.RunStatus, 0), (["sites", "--json"], api.SiteInfo, 0),
                             (["images", "--json"], api.ImageInfo, 0), (["results", "--json"], api.ResultRow, 0),
                             (["results", "--format", "json"], api.ResultRow, 0), (["doctor", "--site", "local", "--json"], api.Doctor, 0)]:
        parsed = cli_json(capsys, argv, code)
        items = parsed if isinstance(parsed, list) else [parsed]
        assert items, argv
        assert [kind.from_dict(item).to_dict() for item in items] == items, argv
    assert [s["name"] for s in cli_json(capsys, ["status", "--json"])] == ["runs/e/bad", "runs/e/good"]  # newest first
    assert cli_json(capsys, ["results", "--json"]) == [r.to_dict() for r in api.results()]


def test_status_json_lists_a_rejected_run_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    broken = write_run(tmp_path / "runs" / "e", "broken", finished())
    (broken / "job_id").write_text("not a job id!\n")
    (item,) = cli_json(capsys, ["status", "runs", "--json"], code=1)
    assert item["rejected"].endswith("is not a job id")


def test_watch_refuses_runs_whose_status_command_is_not_here_as_the_command_line(tmp_path, monkeypatch, capsys):
    """A login node of another cluster: the runs' state would never be known (api.watch waited forever)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no squeue
    write_run(tmp_path / "runs", "r", [header(), epoch(0)], state="submitted", scheduler="slurm", job_id="4711")
    with pytest.raises(DlaunchError) as raised:
        api.watch(["runs/r"], timeout=0)
    assert raised.value.exit_code == 1 and str(raised.value).startswith("squeue: command not found")
    assert main(["watch", "runs/r"]) == 1
    assert capsys.readouterr().err == "dlaunch: error: %s\n" % raised.value


def test_study_renders_submits_and_leaves_alone_as_the_command_line_and_study_status_reads_its_folder(
        tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    listed = api.study("smoke", site="local", list_only=True)
    assert listed[0].label == "scaling/ddp-native-resnet44-g0001-step-r1: no figure, repeat 1 of 2"
    assert [(j.run_name[-13:], j.nodes, j.processes, j.submitted) for j in listed] == [
        ("g0001-step-r1", 1, 1, False), ("g0001-step-r2", 1, 1, False), ("g0002-step-r1", 1, 2, False),
        ("g0002-step-r2", 1, 2, False)]
    assert [j.script for j in api.study("smoke", site="local", dry_run=True)] == [j.script for j in listed]
    assert list(tmp_path.iterdir()) == []  # rendered only
    capfd.readouterr()
    (job,) = api.study("smoke", site="local", only=["gpus=1", "repeat=1"])
    assert (job.submitted, job.exit_code, job.experiment) == (True, 0, "smoke.scaling") and capfd.readouterr().out == ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert api.study("smoke", site="local", only=["gpus=1", "repeat=1"]) == []
    assert [(w.category, str(w.message)) for w in caught] == [(DlaunchNote, "study smoke: 0 jobs (left alone: 1 ended ok)")]
    (seen,) = api.study_status("runs/smoke")
    assert seen.ok and seen.name == "runs/smoke/scaling/ddp-native-resnet44-g0001-step-r1"
    assert main(["study", "status", "runs/smoke", "--json"]) == 0
    assert [api.RunStatus.from_dict(item) for item in json.loads(capfd.readouterr().out)] == [seen]


def test_study_list_and_check_json_are_the_apis_jobs_and_checks(tmp_path, monkeypatch, capsys):
    """`study run --list --json` (the jobs it would submit) and `study check --json` (per site the jobs that cannot
    run there): the API's objects, read back through their types; nothing written."""
    monkeypatch.chdir(tmp_path)
    listed = cli_json(capsys, ["study", "run", "smoke", "--site", "local", "--list", "--json"])
    assert [api.Job.from_dict(item).to_dict() for item in listed] == listed
    assert listed == [j.to_dict() for j in api.study("smoke", site="local", list_only=True)]
    assert [(j["processes"], j["submitted"]) for j in listed] == [(1, False), (1, False), (2, False), (2, False)]
    checked = cli_json(capsys, ["study", "check", "aach2023", "--site", "jureca-dc", "--site", "juwels", "--json"], code=1)
    assert [api.StudyCheck.from_dict(item).to_dict() for item in checked] == checked
    assert checked == [c.to_dict() for c in api.study_check("aach2023", sites=["jureca-dc", "juwels"])]
    jureca, juwels = (api.StudyCheck.from_dict(item) for item in checked)
    assert jureca.failures and all(len(f) == 2 for f in jureca.failures) and not juwels.failures
    assert list(tmp_path.iterdir()) == []


def test_study_run_json_submitting_prints_the_jobs_alone(tmp_path, monkeypatch, capfd):
    """A study job run here with --json: stdout is the JSON of its Job (no live view), the submission on stderr."""
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert main(["study", "run", "smoke", "--site", "local", "--only", "gpus=1", "--only", "repeat=1", "--json"]) == 0
    captured = capfd.readouterr()
    (job,) = [api.Job.from_dict(item) for item in json.loads(captured.out)]
    assert (job.submitted, job.exit_code, job.label) == (True, 0, "scaling/ddp-native-resnet44-g0001-step-r1: no figure, "
                                                                   "repeat 1 of 2")


def test_results_compare_json_is_the_apis_comparison_and_format_json_its_rows(tmp_path, monkeypatch, capsys):
    from test_results import two_experiments

    monkeypatch.chdir(tmp_path)
    two_experiments(tmp_path / "runs")
    assert main(["results", "rebuild", "runs"]) == 0
    compared = cli_json(capsys, ["results", "compare", "exp-ddp", "exp-hvd", "--json"])
    assert api.Comparison.from_dict(compared).to_dict() == compared
    assert compared == api.compare("exp-ddp", "exp-hvd").to_dict()
    comparison = api.Comparison.from_dict(compared)
    assert (comparison.varying, comparison.changed["framework"]) == (["gpus"], ["ddp", "horovod"])
    two = comparison.rows[1]
    assert (two.key["gpus"], two.a_median, two.b_median, two.significant) == (2, 181.5, 196.5, "yes")
    flat = cli_json(capsys, ["results", "compare", "exp-ddp", "exp-hvd", "--format", "json"])
    assert flat == [{**row.key, **{k: v for k, v in row.to_dict().items() if k != "key"}} for row in comparison.rows]


def test_predict_takes_every_option_of_the_command_line_whose_json_is_the_same_object(tmp_path, monkeypatch, capsys):
    """--calibrated, --epoch-overhead, --from-runs (the API had the nominal network only), and `predict --json`."""
    from dlaunch.analysis.perfmodel.nccl import Machine
    from test_perfmodel import _cluster_site, _runs_made_by

    monkeypatch.chdir(tmp_path)
    calibrated = api.predict("juwels", gpus=[4, 256], model="resnet50", calibrated="native", epoch_overhead=30.0)
    assert [r.basis for r in calibrated.rows] == ["fitted", "predicted"]
    assert calibrated.rows[0].paper_comm_share == pytest.approx(0.224) and calibrated.rows[1].paper_efficiency == "<0.44"  # the paper's
    assert calibrated.rows[0].epoch_overhead == {"--epoch-overhead": 30.0} and calibrated.machine.startswith("noise fitted on")
    argv = ["predict", "--site", "juwels", "--gpus", "4,256", "--model", "resnet50", "--calibrated", "native",
            "--epoch-overhead", "30", "--json"]
    assert cli_json(capsys, argv) == calibrated.to_dict()
    assert api.Prediction.from_dict(json.loads(json.dumps(calibrated.to_dict()))) == calibrated
    truth = Machine(gpus_per_node=1, latency_us=40.0, bandwidth_gbps_per_node=10.0, intra_node_gbps=2400.0, noise_s=1e-3)
    _runs_made_by(tmp_path / "runs", truth, nodes=(1, 2))
    site = _cluster_site(tmp_path)
    fitted = api.predict(site, gpus=[1, 2, 4], from_runs=[tmp_path / "runs"])
    assert [r.basis for r in fitted.rows] == ["fitted", "fitted", "predicted"] and fitted.profiled and fitted.runs_gpus == [1, 2]
    assert [(lo.gpus, lo.why != "") for lo in fitted.left_out] == [(1, False), (2, True)]  # 2: no other multi-node run
    assert fitted.left_out_summary.startswith("leave-one-out error (1 of 2 runs predicted from the others)")
    assert cli_json(capsys, ["predict", "--site", str(site), "--gpus", "1,2,4", "--from-runs", str(tmp_path / "runs"),
                             "--json"]) == fitted.to_dict()
    assert api.Prediction.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted
