"""Property-based tests of the boundary (dlaunch/boundary.py): per surface, random and hostile bytes,
JSON and TOML in every file dlaunch reads and random text in every name and path flag; each outcome
keeps the promises of tests/hostile.py (exit 0, or 2 with one `dlaunch: error:` line; listings 1 with
`rejected:` lines; no traceback, no hang, nothing written outside what the command writes), and a
rendered script is valid bash with its directives in one block.

In-process through `dlaunch.cli.main`, a modest number of examples each (CI time)."""
import hashlib
import io
import json
import os
import tarfile
import tomllib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile import (REPO, hostile_bytes, hostile_text, jsonl, kept_promises, metrics_records, mutated, plan_file, sandbox,
                     script_is_sound, scripts_in, toml_text, write_run)
from dlaunch.boundary import NAME, escape, has_control, printable, whole

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHIPPED = ["generic-slurm", "juwels-booster", "alps", "polaris", "local"]
SLURM = ("--account", "p", "--image", "/images/x.sif")  # what a Slurm site's dry run needs besides the flag


def shipped(name: str) -> dict:
    return tomllib.loads((REPO / "sites" / ("%s.toml" % name)).read_text())


def dry_run_sound(outcome) -> None:
    """A dry run that rendered: each script it printed is sound."""
    if outcome.code == 0:
        for script in scripts_in(outcome.out):
            script_is_sound(script)


# -- site profiles ---------------------------------------------------------------------------------------

@SETTINGS
@given(data=hostile_bytes)
def test_any_bytes_as_a_user_profile(data):
    with sandbox() as box:
        (box.sites / "mine.toml").write_bytes(data)
        kept_promises(box.run("sites"), codes=(0,))
        kept_promises(box.run("sites", "check", box.sites / "mine.toml"))
        outcome = box.run("run", "--site", "juwels", *SLURM, "--dry-run")  # the alias lookup reads every profile
        kept_promises(outcome, codes=(0,))
        kept_promises(box.run("run", "--site", "mine", *SLURM, "--dry-run"))


@SETTINGS
@given(data=st.data(), name=st.sampled_from(SHIPPED))
def test_any_value_in_a_profile(data, name):
    document = data.draw(mutated(shipped(name)))
    with sandbox() as box:
        (box.work / "p.toml").write_text(toml_text(document) if isinstance(document, dict) else "x = 1\n")
        kept_promises(box.run("sites", "check", "p.toml"))
        outcome = box.run("run", "--site", "p.toml", *SLURM, "--dry-run")
        kept_promises(outcome)
        dry_run_sound(outcome)
        kept_promises(box.run("sites", "show", "p.toml"))


# -- studies -----------------------------------------------------------------------------------------------

@SETTINGS
@given(data=st.data())
def test_any_value_or_bytes_in_a_study(data):
    study = tomllib.loads((REPO / "studies" / "smoke.toml").read_text())
    raw = data.draw(st.one_of(hostile_bytes, mutated(study).map(lambda d: toml_text(d if isinstance(d, dict) else {}).encode())))
    with sandbox() as box:
        (box.work / "s.toml").write_bytes(raw)
        outcome = box.run("study", "run", "s.toml", "--site", "local", "--dry-run", *data.draw(st.lists(
            st.sampled_from(["--only", "--output", "--data"]).flatmap(lambda f: st.tuples(st.just(f), hostile_text)),
            max_size=1).map(lambda pairs: [x for pair in pairs for x in pair])))
        kept_promises(outcome)
        dry_run_sound(outcome)


# -- run files -----------------------------------------------------------------------------------------------

RUN_FILES = ["plan.json", "state", "job_id", "metrics.jsonl", "local.log", "site.toml"]


def listed(box, metrics: bool = True) -> None:
    """Every command that reads the run directory, each keeping the promises (`metrics`: also those
    that read only its metrics file: report, predict)."""
    kept_promises(box.run("status", "runs"), codes=(0, 1))
    kept_promises(box.run("watch", "--once", "runs"), codes=(0, 1, 2))
    kept_promises(box.run("logs", "runs/exp/r1"), codes=(0, 1, 2))
    if metrics:
        kept_promises(box.run("report", "runs", "-o", "report"), codes=(0, 1, 2), may_change=["work/report"])
        kept_promises(box.run("predict", "--site", "juwels", "--from-run", "runs/exp/r1"))
    for argv in (["run", "--resume", "runs/exp/r1", "--dry-run"], ["rerun", "runs/exp/r1", "--site", "local", "--dry-run"]):
        outcome = box.run(*argv)
        kept_promises(outcome)
        dry_run_sound(outcome)


@settings(SETTINGS, max_examples=12)
@given(file=st.sampled_from(RUN_FILES), data=hostile_bytes)
def test_any_bytes_in_a_run_file(file, data):
    with sandbox() as box:
        write_run(box.work, files={file: data})
        write_run(box.work, "exp/r2")
        listed(box, metrics=file == "metrics.jsonl")


@settings(SETTINGS, max_examples=12)
@given(data=st.data())
def test_any_value_in_plan_json(data):
    with sandbox() as box:
        run = box.work / "runs" / "exp" / "r1"
        plan = data.draw(mutated(plan_file(run)))
        write_run(box.work, files={"plan.json": json.dumps(plan)})
        listed(box, metrics=False)


@settings(SETTINGS, max_examples=12)
@given(data=st.data())
def test_any_value_in_a_metrics_record(data):
    records = metrics_records()
    i = data.draw(st.integers(0, len(records) - 1))
    records[i] = data.draw(mutated(records[i]))
    with sandbox() as box:
        write_run(box.work, files={"metrics.jsonl": jsonl(records), "state": data.draw(st.sampled_from(
            ["finished (exit 0)\n", "finished (exit 1)\n", "running here (dlaunch pid 1)\n"]))})
        write_run(box.work, "exp/r2")
        listed(box)


@settings(SETTINGS, max_examples=12)
@given(data=st.data())
def test_any_manifest_or_member_in_an_archive(data):
    metrics = jsonl(metrics_records()).encode()
    entry = {"sha256": hashlib.sha256(metrics).hexdigest(), "bytes": len(metrics)}
    manifest = {"experiment": "exp", "files": {"exp/r1/metrics.jsonl": entry}}
    members = {"exp/r1/metrics.jsonl": metrics, "exp/manifest.json": json.dumps(manifest).encode()}
    target = data.draw(st.sampled_from(sorted(members)))
    members[target] = data.draw(st.one_of(hostile_bytes, mutated(manifest).map(lambda m: json.dumps(m).encode())))
    with sandbox() as box:
        with tarfile.open(box.work / "a.tar.gz", "w:gz") as tar:
            for name, content in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
        outcome = box.run("rerun", "a.tar.gz:exp/r1", "--site", "local", "--dry-run")
        kept_promises(outcome)
        dry_run_sound(outcome)


# -- name and path flags ------------------------------------------------------------------------------------

RUN_FLAGS = ["--experiment", "--run-name", "--output", "--account", "--partition", "--time", "--image", "--data",
             "--site", "--seed", "--image-size", "--gpus", "--nodes", "--repeat", "--batch-size", "--lr", "--zero-stage"]
number_text = st.one_of(hostile_text, st.integers().map(str), st.floats().map(str))


@settings(SETTINGS, max_examples=60)
@given(flag=st.sampled_from(RUN_FLAGS), value=number_text, site=st.sampled_from(["local", "juwels", "alps", "polaris"]))
def test_any_text_in_a_run_flag(flag, value, site):
    with sandbox() as box:
        argv = ["run", "--site", site, "--dry-run", flag, value]
        if site != "local":
            argv += [f for f in ("--account", "p") if flag != "--account"]
            argv += [f for f in ("--image", "/x/img.toml" if site == "alps" else "/x/img.sif") if flag != "--image"]
        outcome = box.run(*argv)
        kept_promises(outcome)
        dry_run_sound(outcome)


@SETTINGS
@given(value=hostile_text, name=st.sampled_from(["SBATCH_ACCOUNT", "DLAUNCH_PARENT_RUN", "BUDGET"]))
def test_any_text_in_the_environment_a_script_takes(value, name):
    with sandbox() as box:
        if "\x00" not in value:
            os.environ[name] = value
        outcome = box.run("run", "--site", "juwels", "--image", "/x/img.sif", "--dry-run")
        kept_promises(outcome)
        dry_run_sound(outcome)
        if outcome.code == 0:
            assert not any(c in outcome.out for c in "\x00\x1b")


PATH_COMMANDS = [["status", "{}"], ["watch", "--once", "{}"], ["logs", "{}"], ["cancel", "{}"], ["runs", "{}"],
                 ["report", "{}", "-o", "report"], ["archive", "{}", "-o", "x.tar.gz"], ["study", "status", "{}"],
                 ["study", "report", "{}", "-o", "report"], ["rerun", "{}", "--site", "local", "--dry-run"],
                 ["sites", "check", "{}"], ["sites", "show", "{}"], ["predict", "--site", "{}"],
                 ["study", "run", "{}", "--site", "local", "--dry-run"]]


@settings(SETTINGS, max_examples=40)
@given(command=st.sampled_from(PATH_COMMANDS), value=hostile_text.filter(lambda v: v and "\x00" not in v))
def test_any_text_as_a_path_argument(command, value):
    with sandbox() as box:
        write_run(box.work)
        outcome = box.run(*(value if a == "{}" else a for a in command))
        kept_promises(outcome, codes=(0, 1, 2), may_change=["work/report", "work/x.tar.gz"])


# -- the boundary's own functions ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_escape_leaves_no_control_character_and_changes_nothing_else(text):
    shown = escape(text)
    assert not has_control(shown) and not has_control(printable(text))
    assert (shown == text) == (not has_control(text))


@settings(max_examples=200, deadline=None)
@given(name=st.from_regex(NAME, fullmatch=True), tail=st.sampled_from(["\n", "\r", " ", "\x00", "/x", "\n--x"]))
def test_a_name_matches_whole_and_nothing_appended_to_it_does(name, tail):
    assert whole(NAME, name) and not whole(NAME, name + tail)
