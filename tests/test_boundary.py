"""One regression test per class of issue 25 (bad input at the boundary: dlaunch/boundary.py), each
through `dlaunch` in this process (tests/hostile.py: sandbox, time limit, the promises checked).

Written against main 448d661, where each of them failed (a traceback, a hang, a wrong exit code, a
file read or written where it must not be)."""
import io
import json
import os
import re
import subprocess
import tarfile
import time
import tracemalloc

import pytest

import dlaunch.runs.archive
import dlaunch.runs.study
from hostile import (REPO, header, jsonl, kept_promises, metrics_records, plan_file, sandbox, script_is_sound, scripts_in,
                     time_limit, write_run)
from dlaunch.boundary import LIMITS
from dlaunch.train.metrics_schema import make_record


@pytest.fixture
def box():
    with sandbox() as b:
        yield b


def error_line(outcome) -> str:
    kept_promises(outcome)
    assert outcome.code == 2, outcome
    return outcome.err.strip()


def profile_text(name: str = "generic-slurm") -> str:
    return (REPO / "sites" / ("%s.toml" % name)).read_text()


# -- files outside their place -------------------------------------------------------------------------

def test_archive_bundles_the_runs_own_profile_text_never_a_path_or_link_out_of_it(box):
    secret = box.root / "secret.toml"
    secret.write_text("password = 'hunter2'\n")
    run = write_run(box.work, files={"site.toml": None})
    (run / "site.toml").symlink_to(secret)  # a profile linked out of the run directory
    plan = json.loads((run / "plan.json").read_text())
    plan["request"]["site"] = str(secret)  # and the plan naming it as the profile
    (run / "plan.json").write_text(json.dumps(plan))
    write_run(box.work, "exp/r2")  # a run that kept its profile's text
    outcome = box.run("archive", "runs/exp", "-o", "exp.tar.gz")
    kept_promises(outcome, codes=(0,), may_change=["work/exp.tar.gz"])
    with tarfile.open(box.work / "exp.tar.gz") as tar:
        names = tar.getnames()
        contents = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    assert b"hunter2" not in contents and "exp/r1/site.toml" not in names
    assert "exp/r2/site.toml" in names and b'name = "local"' in contents
    assert "1 run(s) without site.toml" in outcome.err


def test_study_compare_file_outside_data_published_is_refused(box):
    text = (REPO / "studies" / "smoke.toml").read_text()
    name = re.search(r'file = "([^"]+)"', text)
    assert name, "smoke.toml compares with a published file"
    (box.work / "s.toml").write_text(text.replace(name.group(1), "../../../../etc/passwd"))
    line = error_line(box.run("study", "run", "s.toml", "--site", "local", "--dry-run"))
    assert "s.toml: compare.0.file: ../../../../etc/passwd is not a file in data/published/" in line


def test_a_metrics_file_linked_out_of_its_run_is_not_read(box):
    outside = box.root / "outside.jsonl"
    outside.write_text(jsonl([header(experiment="SECRET-EXPERIMENT")] + metrics_records()[1:]))
    run = write_run(box.work, files={"metrics.jsonl": None})
    (run / "metrics.jsonl").symlink_to(outside)
    write_run(box.work, "exp/r2")
    status = box.run("status", "runs")
    kept_promises(status, codes=(0,))
    assert "symbolic link" in status.out and "SECRET" not in status.out
    report = box.run("report", "runs", "-o", "report")
    kept_promises(report, codes=(0,), may_change=["work/report"])
    assert "SECRET" not in report.out + (box.work / "report" / "report.md").read_text()


# -- encodings -----------------------------------------------------------------------------------------

def test_a_non_utf8_profile_among_the_user_s_breaks_no_other_site(box):
    (box.sites / "broken.toml").write_bytes(profile_text().replace("Slurm", "Sl\xfcrm").encode("latin-1"))
    outcome = box.run("run", "--site", "juwels", "--account", "p", "--image", "/x.sif", "--dry-run")
    kept_promises(outcome, codes=(0,))
    listing = box.run("sites")
    kept_promises(listing, codes=(0,))
    assert "unreadable" in listing.out and "not UTF-8" in listing.out
    line = error_line(box.run("sites", "check", box.sites / "broken.toml"))
    assert "broken.toml: not UTF-8 text (byte 0xfc on line" in line


def test_a_non_utf8_study_names_the_file(box):
    (box.work / "s.toml").write_bytes(b'name = "caf\xe9"\n')
    assert "s.toml: not UTF-8 text (byte 0xe9 on line 1)" in error_line(box.run("study", "run", "s.toml", "--site", "local", "--dry-run"))


def test_a_non_utf8_metrics_file_is_rejected_in_a_report_and_the_rest_reported(box):
    write_run(box.work, "exp/bad", files={"metrics.jsonl": jsonl(metrics_records()).replace("h0", "h\xff").encode("latin-1")})
    write_run(box.work, "exp/good")
    report = box.run("report", "runs", "-o", "report")
    kept_promises(report, codes=(1,), may_change=["work/report"])
    assert re.search(r"rejected: .*bad/metrics.jsonl:1: not UTF-8 text \(byte 0xff", report.err)
    assert "good/metrics.jsonl" in (box.work / "report" / "report.md").read_text()
    status = box.run("status", "runs")
    kept_promises(status, codes=(0,))
    assert "unreadable" in status.out
    assert "not UTF-8" in error_line(box.run("predict", "--site", "juwels", "--from-run", "runs/exp/bad"))
    assert "not UTF-8" in error_line(box.run("rerun", "runs/exp/bad", "--site", "local", "--dry-run"))


def test_a_non_utf8_plan_is_a_rejected_run_in_listings_and_an_error_naming_it_on_resume(box):
    write_run(box.work, "exp/bad", files={"plan.json": b'{"plan": "\xff"}'})
    write_run(box.work, "exp/good")
    for argv in (["status", "runs"], ["runs"], ["watch", "--once", "runs"]):
        outcome = box.run(*argv)
        kept_promises(outcome, codes=(1,))
        assert "rejected: runs/exp/bad/plan.json: not UTF-8 text" in outcome.err and "runs/exp/good" in outcome.out
    assert "runs/exp/bad/plan.json: not UTF-8" in error_line(box.run("run", "--resume", "runs/exp/bad", "--dry-run"))


# -- whole strings: a trailing newline ---------------------------------------------------------------

@pytest.mark.parametrize("flag, value", [("--run-name", "r\n"), ("--experiment", "e\n"), ("--account", "a\n"),
                                         ("--data", "/data\n"), ("--partition", "booster\n")])
def test_a_trailing_newline_in_a_name_or_path_is_refused_naming_the_flag(box, flag, value):
    line = error_line(box.run("run", "--site", "juwels", "--account", "p", "--image", "/x.sif", "--dry-run", flag, value))
    assert line.startswith("dlaunch: error: %s" % flag) and "\\n" in line


def test_a_trailing_newline_in_sbatch_account_or_a_pyxis_image_is_refused(box):
    os.environ["SBATCH_ACCOUNT"] = "budget\n"
    assert "--account" in error_line(box.run("run", "--site", "juwels", "--image", "/x.sif", "--dry-run"))
    del os.environ["SBATCH_ACCOUNT"]
    assert "--image" in error_line(box.run("run", "--site", "alps", "--account", "p", "--image", "/x/ddp.toml\n", "--dry-run"))


def test_a_rerun_of_a_header_whose_experiment_ends_in_a_newline_renders_whole_directives(box):
    run = write_run(box.work, files={"metrics.jsonl": jsonl([header(experiment="exp\n")] + metrics_records()[1:])})
    outcome = box.run("rerun", run, "--site", "juwels", "--dry-run")
    os.environ.pop("SBATCH_ACCOUNT", None)
    kept_promises(outcome, codes=(0,))
    (script,) = scripts_in(outcome.out)
    script_is_sound(script)


def test_no_pattern_guard_in_the_launcher_matches_a_prefix():
    """`re.match(...$)` lets `value\\n` through: guards use re.fullmatch (or pydantic, which matches whole)."""
    prefix_matches = []
    for path in sorted((REPO / "dlaunch").rglob("*.py")):
        if REPO / "dlaunch" / "train" in path.parents:
            continue  # the trainer writes no script; it parses libraries' logs
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.match\(", line) and "ATTEMPT.match(line)" not in line:  # failures.py reads log lines
                prefix_matches.append("%s:%d: %s" % (path.relative_to(REPO), number, line.strip()))
    assert not prefix_matches


# -- tampered or partial files -----------------------------------------------------------------------

@pytest.mark.parametrize("plan, named", [
    ({}, "plan.json: plan: Field required"),
    ({"plan": {"scheduler": "local", "site": "local"}, "request": {"framework": "ddp"}}, "plan.json: request: site: Field required"),
    ({"plan": {"scheduler": "local", "site": "local"}, "request": {"site": "local", "gpus": "2"}}, "plan.json: request: gpus: Input should be a valid integer"),
    ({"plan": {"scheduler": "local", "site": "local"}, "request": {"site": "local", "trainer": ["--epochs", "2"]}}, "plan.json: request: trainer: Input should be a valid dictionary"),
    ({"plan": {"scheduler": "cron", "site": "local"}, "request": {}}, "plan.json: plan.scheduler: 'cron' is not one of"),
])
def test_a_tampered_plan_names_the_file_and_field(box, plan, named):
    write_run(box.work, files={"plan.json": json.dumps(plan)})
    assert named in error_line(box.run("run", "--resume", "runs/exp/r1", "--dry-run"))


@pytest.mark.parametrize("files", [{"state": "running here (dlaunch pid abc)\n"}, {"job_id": "--user=me\n"},
                                   {"job_id": b"\xff"}, {"state": b"\x00" * 4}])
def test_a_tampered_state_or_job_id_is_a_rejected_run_or_an_unknown_state(box, files):
    write_run(box.work, files=files)
    write_run(box.work, "exp/good")
    outcome = box.run("status", "runs")
    kept_promises(outcome, codes=(0, 1))
    assert "runs/exp/good" in outcome.out
    assert outcome.code == 1 or "unknown state" in outcome.out


@pytest.mark.parametrize("manifest", [[], {"experiment": "exp", "files": {"exp/r1/metrics.jsonl": {"bytes": 1}}}, "{"])
def test_a_tampered_archive_manifest_is_an_error_naming_it(box, manifest):
    data = jsonl(metrics_records()).encode()
    with tarfile.open(box.work / "a.tar.gz", "w:gz") as tar:
        for name, content in (("exp/r1/metrics.jsonl", data),
                              ("exp/manifest.json", (manifest if isinstance(manifest, str) else json.dumps(manifest)).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    line = error_line(box.run("rerun", "a.tar.gz:exp/r1", "--site", "local", "--dry-run"))
    assert "a.tar.gz:exp/manifest.json" in line


@pytest.mark.parametrize("fields, named", [
    ({"loader_settings": {"total_steps": "x"}}, "loader_settings.total_steps"),
    ({"hosts": [1, 2]}, "'hosts'"), ({"request": {"framework": "ddp", "world_size": 2, "options": []}}, "request.options"),
    ({"world_size": 0}, "'world_size' is 0, outside 1.."),
])
def test_a_metrics_header_with_a_wrong_type_or_value_is_rejected(box, fields, named):
    write_run(box.work, "exp/bad", files={"metrics.jsonl": jsonl([header(**fields)] + metrics_records()[1:])})
    write_run(box.work, "exp/good")
    report = box.run("report", "runs", "-o", "report")
    kept_promises(report, codes=(1,), may_change=["work/report"])
    assert "rejected:" in report.err and named in report.err
    for argv in (["status", "runs"], ["watch", "--once", "runs"]):
        kept_promises(box.run(*argv), codes=(0, 1))
    assert named in error_line(box.run("rerun", "runs/exp/bad", "--site", "local", "--dry-run"))


# -- sizes and counts ----------------------------------------------------------------------------------

def test_a_study_of_a_million_jobs_is_refused_at_once_unless_allowed(box):
    text = (REPO / "studies" / "smoke.toml").read_text()
    big = text.replace("gpus = [1, 2]\nrepeats = 2", "gpus = [%s]\nrepeats = 1000" % ", ".join(map(str, range(1, 1001))))
    (box.work / "big.toml").write_text(big)  # 1000 GPU counts x 1000 repeats
    built = []
    real = dlaunch.runs.study.LaunchRequest

    def counted(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(dlaunch.runs.study, "LaunchRequest", counted)
        line = error_line(box.run("study", "run", "big.toml", "--site", "local", "--dry-run"))
    assert "more than %d jobs" % LIMITS["study jobs"] in line and "--allow-large" in line
    assert len(built) <= LIMITS["study jobs"] + 1  # refused before the million jobs were built, not after


def test_repeat_and_local_processes_have_limits_that_allow_large_lifts(box):
    assert "--repeat: 100000 repeats" in error_line(box.run("run", "--site", "local", "--repeat", "100000", "--dry-run"))
    assert "--gpus: 100000 local processes" in error_line(box.run("run", "--site", "local", "--gpus", "100000", "--dry-run"))
    allowed = box.run("run", "--site", "local", "--gpus", str(LIMITS["local processes"] + 1), "--allow-large", "--dry-run")
    kept_promises(allowed, codes=(0,))


def test_an_experiment_name_longer_than_the_file_system_takes_is_refused_before_submission(box):
    line = error_line(box.run("run", "--site", "local", "--experiment", "e" * 300, "--dry-run"))
    assert "--experiment: 300 characters, more than the 255" in line


def test_status_reads_a_300_mb_log_from_its_end(box):
    run = write_run(box.work, files={"state": "finished (exit 1)\n", "metrics.jsonl": jsonl(metrics_records()[:3])})
    with open(run / "local.log", "wb") as log:
        log.truncate(300 * 2 ** 20)  # sparse: no disk used
        log.seek(0, os.SEEK_END)
        log.write(b"\ntrain: error: --data /x: no such directory\n")
    tracemalloc.start()
    try:
        outcome = box.run("status", "runs")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    kept_promises(outcome, codes=(0,))
    assert "local.log (last 4 MiB):" in outcome.out and "train: error: --data /x" in outcome.out
    assert peak < 64 * 2 ** 20, peak


def test_a_log_that_is_a_fifo_never_blocks(box):
    # a job that failed without an end record: its logs are read for why (a run whose trainer wrote `ok` is ok)
    run = write_run(box.work, files={"state": "finished (exit 1)\n", "local.log": None,
                                     "metrics.jsonl": jsonl(metrics_records()[:-1])})
    os.mkfifo(run / "local.log")
    kept_promises(box.run("status", "runs"), codes=(0,))
    kept_promises(box.run("watch", "--once", "runs"), codes=(1,))
    slurm = write_run(box.work, "exp/slurm", files={"plan.json": json.dumps(plan_file(box.work / "runs/exp/slurm", "slurm")),
                                                    "job_id": "4711\n", "local.log": None})
    os.mkfifo(slurm / "slurm-4711.out")
    assert "slurm-4711.out: not a regular file" in error_line(box.run("logs", slurm))
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    kept_promises(box.run("status", "runs"), codes=(0,))
    report = box.run("report", "runs", "-o", "report")  # the FIFO is no metrics file: left out
    kept_promises(report, codes=(0,), may_change=["work/report"])
    assert "slurm" in report.out and "r1" not in report.out


def test_rerun_of_an_oversized_archive_member_is_refused_without_reading_it(box, monkeypatch):
    monkeypatch.setattr(dlaunch.runs.archive, "MAX_METRICS_BYTES", 1000)
    write_run(box.work)
    kept_promises(box.run("archive", "runs/exp", "-o", "exp.tar.gz"), codes=(0,), may_change=["work/exp.tar.gz"])
    line = error_line(box.run("rerun", "exp.tar.gz:exp/r1", "--site", "local", "--dry-run"))
    assert "exp/r1/metrics.jsonl has" in line and "more than the 1000" in line


# -- values --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["00:99:00", "\u0660\u0661:\u0660\u0660:\u0660\u0660", "0-24:00:00", "01:00:60"])
def test_a_time_limit_that_is_a_typo_is_refused(box, value):
    assert "--time:" in error_line(box.run("run", "--site", "juwels", "--account", "p", "--image", "/x.sif", "--time", value, "--dry-run"))


@pytest.mark.parametrize("change, named", [
    (("gpus_per_node = 4", 'gpus_per_node = "4"'), "gpus_per_node: Input should be a valid integer"),
    (("gpus_per_node = 4", "gpus_per_node = 9223372036854775807"), "gpus_per_node: Input should be less than or equal to 64"),
    (("[env]", '[env]\nX = "a\\u0000b"'), "env.X: String should match pattern"),
    (("latency_us = ", "latency_us = inf #"), "network.latency_us: Input should be a finite number"),
])
def test_a_profile_value_of_the_wrong_type_size_or_content_is_refused(box, change, named):
    text = profile_text("juwels-booster")
    assert change[0] in text
    (box.work / "p.toml").write_text(text.replace(change[0], change[1], 1))
    assert "p.toml: " + named in error_line(box.run("sites", "check", "p.toml"))


@pytest.mark.parametrize("flag, value", [("--seed", str(10 ** 26)), ("--image-size", str(10 ** 8)), ("--seed", "-1")])
def test_a_value_the_trainer_would_refuse_at_start_is_refused_before_it_queues(box, flag, value):
    line = error_line(box.run("run", "--site", "juwels", "--account", "p", "--image", "/x.sif", "--dry-run", flag, value))
    assert flag in line


@pytest.mark.parametrize("epoch_fields, named", [({"images_per_s": float("nan")}, "images_per_s"),
                                                 ({"top1": float("inf")}, "top1"), ({"top1": -0.5}, "top1"),
                                                 ({"epoch_time_s": -1.0}, "epoch_time_s")])
def test_a_non_finite_or_negative_figure_is_rejected_and_the_rest_reported(box, epoch_fields, named):
    records = metrics_records()
    records[1] = dict(records[1], **epoch_fields)
    write_run(box.work, "exp/bad", files={"metrics.jsonl": jsonl(records)})
    write_run(box.work, "exp/good")
    report = box.run("report", "runs", "-o", "report")
    kept_promises(report, codes=(1,), may_change=["work/report"])
    assert "rejected: " in report.err and named in report.err and "bad/metrics.jsonl:2" in report.err
    assert "runs/exp/good" in (box.work / "report" / "report.md").read_text()


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_predict_refuses_a_compute_time_that_is_not_finite(box, value):
    assert "--compute-ms" in error_line(box.run("predict", "--site", "juwels", "--compute-ms", value))


@pytest.mark.parametrize("change, named", [
    (("frameworks = [", 'frameworks = ["ddp", '), "frameworks: 'ddp' appears twice"),
    (("[[matrix]]", '[[matrix]]\nexclude = [{ model = "resnet152" }]'), "exclude.0: {model = 'resnet152'} matches no job"),
])
def test_duplicate_matrix_values_and_exclusions_matching_nothing_are_errors(box, change, named):
    text = (REPO / "studies" / "smoke.toml").read_text()
    assert change[0] in text
    (box.work / "s.toml").write_text(text.replace(change[0], change[1], 1))
    assert named in error_line(box.run("study", "run", "s.toml", "--site", "local", "--dry-run"))


def test_an_exclusion_that_empties_a_matrix_is_blamed_on_the_exclusion(box):
    text = (REPO / "studies" / "smoke.toml").read_text()
    model = re.search(r'models = \["([^"]+)"\]', text).group(1)
    (box.work / "s.toml").write_text(text.replace("[[matrix]]", '[[matrix]]\nexclude = [{ model = "%s" }]' % model, 1))
    line = error_line(box.run("study", "run", "s.toml", "--site", "local", "--dry-run"))
    assert "exclude: the exclusions leave no job of the matrix" in line and "--only" not in line


# -- output --------------------------------------------------------------------------------------------

def test_images_at_80_columns_keeps_every_version_whole(box, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    outcome = box.run("images")
    kept_promises(outcome, codes=(0,))
    words = set(outcome.out.split())
    import tomllib
    lock = tomllib.loads((REPO / "containers" / "versions.toml").read_text())
    pins = {"%s=%s" % (k, v) for stack in lock["stacks"].values() for k, v in stack.get("pip", {}).get("common", {}).items()}
    assert pins and pins <= words, sorted(pins - words)
    assert max(len(line) for line in outcome.out.splitlines()) <= 80


def test_sites_shows_each_description(box, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    outcome = box.run("sites")
    kept_promises(outcome, codes=(0,))
    assert "JUWELS Booster (JSC): 936 nodes" in " ".join(outcome.out.split())


def test_control_characters_in_names_and_profile_values_are_printed_escaped(box, monkeypatch):
    (box.sites / "evil.toml").write_text(profile_text().replace('name = "generic-slurm"', 'name = "evil"')
                                         .replace("aliases = [", "aliases = [\"x\", ").replace('description = "', 'description = "\\u001b[2J\\u0007'))
    write_run(box.work, "exp/\x1b[31mred")
    for argv in (["sites"], ["status", "runs"], ["watch", "--once", "runs"]):
        outcome = box.run(*argv)
        kept_promises(outcome, codes=(0,))
        assert "\x1b" not in outcome.out + outcome.err and "\x07" not in outcome.out
    monkeypatch.setenv("COLUMNS", "400")  # wide enough for the description column (at 80 it gives way)
    assert "\\x1b[2J\\x07" in box.run("sites").out.replace("\n", "")
    assert "exp/\\x1b[31mred" in box.run("status", "runs").out


def test_report_to_an_existing_file_and_archive_to_a_folder_are_refused(box):
    write_run(box.work)
    (box.work / "taken").write_text("mine\n")
    assert "--output: taken is a file" in error_line(box.run("report", "runs", "-o", "taken"))
    (box.work / "folder.tar.gz").mkdir()
    assert "--output: folder.tar.gz is a folder" in error_line(box.run("archive", "runs/exp", "-o", "folder.tar.gz"))
    assert (box.work / "taken").read_text() == "mine\n"


def test_a_state_naming_pid_1_or_a_reused_pid_is_no_live_run(box):
    running = jsonl(metrics_records()[:2])
    write_run(box.work, "exp/init", files={"state": "running here (dlaunch pid 1)\n", "metrics.jsonl": running})
    reused = write_run(box.work, "exp/reused", files={"metrics.jsonl": running})
    (reused / "state").write_text("running here (dlaunch pid 0)\n")
    os.utime(reused / "state", (time.time() - 60, time.time() - 60))
    with subprocess.Popen(["sleep", "600"]) as later:  # started after the state was written
        (reused / "state").write_text("running here (dlaunch pid %d)\n" % later.pid)
        os.utime(reused / "state", (time.time() - 60, time.time() - 60))
        try:
            outcome = box.run("watch", "runs", "--interval", "0.1")
        finally:
            later.kill()
    kept_promises(outcome, codes=(1,))
    for name in ("init", "reused"):
        assert re.search(r"runs/exp/%s: dlaunch \(pid \d+\) ended without recording the job's exit; died" % name, outcome.out)


def test_with_the_limit_the_time_limit_helper_stops_a_hang():
    from hostile import Hang
    with pytest.raises(Hang):
        with time_limit(0.2):
            time.sleep(5)


def test_make_record_still_writes_what_the_reader_reads():
    record = make_record("epoch", 1.0, epoch=0, steps=1, images=1, images_per_s=1.0, epoch_time_s=1.0,
                         data_wait_s=0.0, loss=float("nan"), lr=0.1)  # a diverging run's loss is kept
    from dlaunch.train.metrics_schema import check_bounds
    check_bounds(json.loads(json.dumps(record)))


@pytest.mark.parametrize("command", [["watch", "--once"], ["status"], ["report", "-o", "report"], ["logs"]])
def test_a_path_argument_longer_than_the_file_system_takes_is_an_error_naming_it(box, command):
    """Found by tests/test_boundary_properties.py: Path.exists() raises for a name over NAME_MAX."""
    line = error_line(box.run(*command[:1], "x" * 300, *command[1:]))
    assert "x" * 300 in line or "xxxx" in line


def test_a_plan_whose_request_lacks_trainer_options_resumes_with_none(box):
    """Found by tests/test_boundary_properties.py: the stored request's default for `trainer` was a tuple."""
    run = write_run(box.work)
    plan = json.loads((run / "plan.json").read_text())
    del plan["request"]["trainer"]
    (run / "plan.json").write_text(json.dumps(plan))
    kept_promises(box.run("run", "--resume", run, "--dry-run"), codes=(0,))
