"""A campaign on an allocation (issue 46): the cost of many jobs said before they go out and a budget that refuses it,
`--only` naming the values there are, `sweep --repeat`, the profile's runs and images folders, the engines'
environments checked before a job starts, `study list` and the short protocols, a site name two profiles answer to;
and the API's two steps (prepare, then submit) that the command line stands on (issue 45)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dlaunch
from dlaunch import api
from dlaunch.boundary import display_path
from dlaunch.cli import main
from dlaunch.errors import DlaunchError

REPO = Path(__file__).resolve().parents[1]
SITES = REPO / "sites"
TINY = dict(
    model="resnet18",
    image_size=32,
    batch_size=4,
    threads=1,
    device="cpu",
    steps=2,
    steps_per_epoch=1,
    warmup_steps=1,
    num_classes=10,
)


def profile(folder: Path, shipped: str, name: str, **fields: str) -> Path:
    """A copy of a shipped profile named `name`, without aliases, with top-level `fields` added (TOML strings)."""
    text = (SITES / ("%s.toml" % shipped)).read_text()
    text = re.sub(r'(?m)^name = "%s"' % shipped, 'name = "%s"' % name, text, count=1)
    text = re.sub(r"(?m)^aliases = .*$", "aliases = []", text, count=1)
    added = "".join("%s = %s\n" % (key, json.dumps(value)) for key, value in fields.items())
    text = re.sub(r'(?m)^(name = "%s".*\n)' % re.escape(name), lambda m: m.group(1) + added, text, count=1)
    path = folder / ("%s.toml" % name)
    path.write_text(text)
    return path


def stderr_of(capsys, argv, code=0) -> str:
    capsys.readouterr()
    assert main(argv) == code
    return capsys.readouterr().err


def limits(script: str) -> float:
    """Node-hours of one batch script's directives (#SBATCH --nodes and --time), read from the script itself."""
    nodes = int(re.search(r"(?m)^#SBATCH --nodes=(\d+)$", script).group(1))
    d, h, m, s = (int(v or 0) for v in re.search(r"(?m)^#SBATCH --time=(?:(\d+)-)?(\d+):(\d+):(\d+)$", script).groups())
    return nodes * (24 * d + h + m / 60 + s / 3600)


# -- the two steps -----------------------------------------------------------------------------------------------


def test_prepare_writes_nothing_and_submit_takes_only_what_prepare_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shown = dlaunch.prepare_sweep("juwels", nodes=[1, 2], account="p", dry_run=True)
    assert shown.dry_run and [j.run_name for j in shown.jobs] == ["n0001", "n0002"] and list(tmp_path.iterdir()) == []
    with pytest.raises(DlaunchError, match="prepared as a dry run"):
        dlaunch.submit(shown)
    again = api.Prepared.from_dict(json.loads(json.dumps(dlaunch.prepare("local", gpus=1, **TINY).to_dict())))
    with pytest.raises(DlaunchError, match="give the Prepared that prepare"):
        dlaunch.submit(again)
    assert list(tmp_path.iterdir()) == []


# -- cost and budget ---------------------------------------------------------------------------------------------


def test_a_sweeps_cost_is_said_before_it_goes_out_and_a_budget_over_it_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--site", "juwels", "--nodes", "1,2,4", "--time", "02:00:00", "--account", "p", "--dry-run"]
    said = stderr_of(capsys, argv)
    assert "cost: 3 jobs, 14.0 node-hours at their time limits;" in said
    assert "  booster: 3 jobs, 14.0 node-hours, up to 4 nodes" in said.splitlines()
    refused = stderr_of(capsys, argv + ["--budget", "13.9"], code=2)
    assert (
        refused.startswith(
            "dlaunch: error: --budget: the 3 job(s) take 14.0 node-hours at their time limits "
            "(booster: 14.0), over the budget of 13.9"
        )
        and len(refused.splitlines()) == 1
    )
    stderr_of(capsys, argv + ["--budget", "14"])
    capsys.readouterr()
    assert main(argv + ["--json"]) == 0
    shown = api.Prepared.from_dict(json.loads(capsys.readouterr().out))
    assert shown.cost.node_hours == 14.0 and [(q.queue, q.jobs) for q in shown.cost.queues] == [("booster", 3)]
    assert sum(limits(j.script) for j in shown.jobs) == shown.cost.node_hours
    assert list(tmp_path.iterdir()) == []


def test_sweep_repeat_makes_n_runs_of_each_count_and_says_their_cost(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    jobs = dlaunch.sweep("juwels", nodes=[1, 2], repeat=3, account="p", dry_run=True)
    assert [j.run_name for j in jobs] == ["n0001-r1", "n0001-r2", "n0001-r3", "n0002-r1", "n0002-r2", "n0002-r3"]
    said = stderr_of(
        capsys, ["sweep", "--site", "juwels", "--nodes", "1,2", "--repeat", "3", "--account", "p", "--dry-run"]
    )
    assert "dlaunch: 6 runs: 2 counts x 3 repeats (--repeat 3)" in said and "cost: 6 jobs, 9.00 node-hours" in said


def test_aach2023_says_node_hours_per_queue_and_figure_and_the_jobs_figures_share(tmp_path, monkeypatch, capsys):
    """The issue's numbers, each checked against the rendered scripts themselves."""
    monkeypatch.chdir(tmp_path)
    plans = []
    jobs = api.study("aach2023", site="juwels", list_only=True, planned=plans.append)
    (plan,) = plans
    cost = plan.cost
    assert cost.jobs == len(jobs) == 387 and cost.node_hours == pytest.approx(sum(limits(j.script) for j in jobs))
    assert round(cost.node_hours) == 53646
    assert [(q.queue, q.jobs, q.largest_nodes) for q in cost.queues] == [("booster", 387, 256)]
    accuracy = [j for j in jobs if j.label.startswith("accuracy")]
    assert len(accuracy) == 27 and {f.figure: f.node_hours for f in cost.figures}["Fig. 8b"] == pytest.approx(
        sum(limits(j.script) for j in accuracy)
    )
    assert sum(f.jobs for f in cost.figures) == 570
    assert {tuple(s.figures): s.jobs for s in cost.shared} == {
        ("Fig. 3a", "Fig. 4a", "Fig. 6"): 27,
        ("Fig. 3a", "Fig. 4a"): 27,
        ("Fig. 3b", "Fig. 5"): 72,
        ("Fig. 6", "Fig. 7"): 27,
        ("Fig. 8b", "Fig. 9"): 3,
    }
    said = stderr_of(capsys, ["study", "run", "aach2023", "--site", "juwels", "--list"])
    assert (
        "  the figures count 570 jobs: 387 in all, as one job stands for every figure of its matrix block; "
        "shared:" in said.splitlines()
    )
    assert "  booster: 387 jobs, 53,646 node-hours, up to 256 nodes" in said.splitlines()
    leonardo = api.study("aach2023", site="leonardo", list_only=True, planned=plans.append)
    queues = {q.queue: (q.jobs, q.largest_nodes) for q in plans[-1].cost.queues}
    assert queues == {
        "boost_usr_prod": (315, 64),
        "boost_qos_bprod (partition boost_usr_prod, QOS boost_qos_bprod)": (72, 256),
    }
    assert sum(1 for j in leonardo if "#SBATCH --qos=boost_qos_bprod" in j.script) == 72
    refused = stderr_of(capsys, ["study", "run", "aach2023", "--site", "juwels", "--dry-run", "--budget", "50000"], 2)
    assert "--budget: the 387 job(s) take 53,646 node-hours" in refused
    assert list(tmp_path.iterdir()) == []


def test_only_that_matches_nothing_names_the_values_there_are(capsys):
    said = stderr_of(capsys, ["study", "run", "aach2023", "--site", "juwels", "--list", "--only", "figure=Fig.3a"], 2)
    assert said.startswith(
        "dlaunch: error: --only: no job of study aach2023 (protocol short) matches figure=Fig.3a; "
        "figure is one of: Fig. 3a, Fig. 4a, Fig. 6, Fig. 4b,"
    )
    said = stderr_of(capsys, ["study", "run", "smoke", "--site", "local", "--list", "--only", "gpus=4"], 2)
    assert "gpus is one of: 1, 2" in said


def test_the_expected_run_time_comes_from_earlier_runs_of_the_same_request(tmp_path, monkeypatch):
    """A real run here ends and is recorded (status); the same request again expects its trainer time, one that
    differs (another batch size) nothing. The profile's runs folder takes the runs: the working folder stays empty."""
    monkeypatch.chdir(tmp_path)
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("DLAUNCH_TEST_SCRATCH", str(scratch))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    site = str(profile(tmp_path, "local", "local-scratch", runs_dir="$DLAUNCH_TEST_SCRATCH/dl/runs"))
    (job,) = dlaunch.run(site, gpus=1, experiment="e", run_name="first", **TINY)
    assert job.exit_code == 0 and job.run_dir == str(scratch / "dl" / "runs" / "e" / "first")
    (seen,) = dlaunch.status([job.run_dir])
    assert seen.ok and list(Path.cwd().iterdir()) == []
    from dlaunch.train.metrics_schema import read_metrics

    took = read_metrics(str(Path(job.run_dir) / "metrics.jsonl")).end["total_time_s"]
    again = dlaunch.prepare(site, gpus=1, experiment="e", repeat=2, dry_run=True, **TINY)
    assert again.cost.expected_jobs == 2 and again.cost.expected_node_hours == pytest.approx(2 * took / 3600)
    assert again.cost.node_hours is None and "earlier runs of the same request" in again.cost.expected_from
    other = dlaunch.prepare(site, gpus=1, experiment="e", repeat=2, dry_run=True, **dict(TINY, batch_size=2))
    assert other.cost.expected_jobs == 0 and "no earlier run of these requests ended ok" in other.cost.expected_from


# -- the profile's runs and images folders -----------------------------------------------------------------------


def test_a_profiles_runs_and_images_folders_are_used_and_an_unset_variable_is_said(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DLAUNCH_IMAGES_DIR", raising=False)
    site = str(
        profile(
            tmp_path,
            "juwels-booster",
            "jwb-scratch",
            runs_dir="$DLAUNCH_TEST_SCRATCH/dl/runs",
            images_dir="$DLAUNCH_TEST_SCRATCH/dl/images",
        )
    )
    monkeypatch.delenv("DLAUNCH_TEST_SCRATCH", raising=False)
    argv = ["run", "--site", site, "--account", "p", "--run-name", "r"]
    said = stderr_of(capsys, argv + ["--dry-run"])
    assert (
        "runs_dir = $DLAUNCH_TEST_SCRATCH/dl/runs (site jwb-scratch): $DLAUNCH_TEST_SCRATCH is not set here; "
        "the dry run shows /unset/DLAUNCH_TEST_SCRATCH/dl/runs" in said
    )
    refused = stderr_of(capsys, argv, code=2)
    assert (
        "$DLAUNCH_TEST_SCRATCH is not set here: set it, or give --output" in refused
        and not (tmp_path / "runs").exists()
    )

    scratch = tmp_path / "scratch"
    (scratch / "dl" / "images").mkdir(parents=True)
    sif = scratch / "dl" / "images" / "current-ddp-x86_64.sif"
    sif.write_bytes(b"")
    monkeypatch.setenv("DLAUNCH_TEST_SCRATCH", str(scratch))
    capsys.readouterr()
    assert main(argv + ["--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "#SBATCH --output=%s/dl/runs/jwb-scratch-ddp-resnet50/r/slurm-%%j.out" % scratch in captured.out
    assert " %s/dl/images/current-ddp-x86_64.sif " % scratch in captured.out and "does not exist" not in captured.err
    assert main(["run", "--site", site, "--account", "p", "--dry-run", "--output", "mine", "--run-name", "r"]) == 0
    assert "#SBATCH --output=%s/mine/" % tmp_path in capsys.readouterr().out  # --output wins
    (job,) = api.study("smoke", site=site, list_only=True, only=["gpus=1", "repeat=1"], account="p", image=str(sif))
    assert job.run_dir == str(scratch / "dl" / "runs" / "smoke" / "scaling" / "ddp-native-resnet44-g0001-step-r1")
    (image,) = [i for i in api.images(site=site) if i.image == "current-ddp-x86_64"]
    assert image.path == str(scratch / "dl" / "images" / "current-ddp-x86_64.sif") and image.built == ["sif"]
    checks = {c.name: (c.outcome, c.detail) for c in api.doctor(site).checks}
    assert checks["runs folder"] == ("pass", "%s/dl/runs (runs_dir), writable" % scratch)
    assert checks["images folder"] == ("pass", "%s/dl/images (images_dir)" % scratch)
    monkeypatch.delenv("DLAUNCH_TEST_SCRATCH")
    checks = {c.name: c.outcome for c in api.doctor(site).checks}
    assert (checks["runs folder"], checks["images folder"]) == ("fail", "fail")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jwb-scratch.toml", "scratch"]
    assert sorted(p.name for p in (scratch / "dl").iterdir()) == ["images"]  # dry runs and checks wrote nothing


# -- the engines' environments -----------------------------------------------------------------------------------


def test_a_job_whose_engine_environment_is_missing_is_refused_before_it_starts_naming_the_fix(
    tmp_path, monkeypatch, capsys
):
    """No engine environment, made true here: a profile whose interpreter is not there, and one whose Python (a
    fresh venv) has no TensorFlow. Refused before anything is written, a dry run too (the job would run here)."""
    monkeypatch.chdir(tmp_path)
    typo = profile(tmp_path, "local", "local-typo")
    typo.write_text(typo.read_text().replace("../.venv-tf/bin/python", "/nonexistent/venv-tf/bin/python"))
    for dry in (["--dry-run"], []):
        said = stderr_of(capsys, ["run", "--site", str(typo), "--framework", "tf-allreduce"] + dry, code=2)
        assert said == (
            "dlaunch: error: --framework tf-allreduce: interpreters.tensorflow = /nonexistent/venv-tf/bin/"
            "python is not there (site local-typo): it needs the TensorFlow environment: "
            "scripts/bootstrap-engines.sh tf\n"
        )
    assert "interpreters.tensorflow = /nonexistent/venv-tf/bin/python is not there on this machine" in stderr_of(
        capsys, ["sites", "check", str(typo)]
    )
    (engine,) = [c for c in api.doctor(str(typo), framework="tf-allreduce").checks if c.name == "engine environment"]
    assert (
        engine.outcome == "fail" and engine.fix == "install the TensorFlow environment: scripts/bootstrap-engines.sh tf"
    )

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = profile(tmp_path, "local", "local-bare")
    bare.write_text(bare.read_text().replace("../.venv-tf/bin/python", str(tmp_path / "bare" / "bin" / "python")))
    said = stderr_of(capsys, ["run", "--site", str(bare), "--framework", "tf-ps-sync"], code=2)
    assert (
        "(interpreters.tensorflow, site local-bare) has no tensorflow: it needs the TensorFlow environment: "
        "scripts/bootstrap-engines.sh tf" in said
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare", "local-bare.toml", "local-typo.toml"]


def test_a_cluster_without_containers_warns_in_a_dry_run_and_refuses_a_submission(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    site = profile(tmp_path, "generic-slurm", "bare-cluster")
    text = site.read_text().replace('[container]\nkind = "apptainer"\nflags = ["--nv"]\nbinds = []\n', "")
    site.write_text(
        text.replace(
            'name = "bare-cluster"\n',
            'name = "bare-cluster"\ninterpreters = { tensorflow = "/opt/nowhere/bin/python" }\n',
            1,
        )
    )
    argv = ["run", "--site", str(site), "--framework", "tf-allreduce", "--account", "p", "--run-name", "r"]
    assert "interpreters.tensorflow = /opt/nowhere/bin/python is not there" in stderr_of(capsys, argv + ["--dry-run"])
    assert "interpreters.tensorflow = /opt/nowhere/bin/python is not there" in stderr_of(capsys, argv, code=2)


# -- studies ----------------------------------------------------------------------------------------------------


def test_study_list_shows_every_shipped_study_with_its_kind_and_protocols(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    found = {s.name: s for s in api.study_list()}
    assert set(found) == {p.stem for p in (REPO / "studies").glob("*.toml")}
    assert (found["cpu-ps"].kind, found["cpu-ps"].protocols, found["cpu-ps"].jobs) == (
        "cpu",
        ["short", "paper"],
        {"short": 9, "paper": 108},
    )
    assert found["aach2023"].jobs == {"short": 387, "paper": 387} and found["aach2023"].gpu_vendor == "nvidia"
    for study in found.values():  # each study modelled on a paper has a short protocol, its default
        assert study.name == "smoke" or study.protocols[0] == "short", study.name
    capsys.readouterr()
    assert main(["study", "list"]) == 0
    shown = capsys.readouterr().out
    assert "short (default, 9 jobs), paper (108 jobs)" in shown and "smoke" in shown
    assert main(["study", "list", "--json"]) == 0
    assert [api.StudyListing.from_dict(s) for s in json.loads(capsys.readouterr().out)] == list(found.values())


def test_a_studys_list_and_dry_run_need_no_data_here_and_say_what_the_jobs_read(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DLAUNCH_CIFAR10", raising=False)
    capsys.readouterr()
    assert main(["study", "run", "cpu-ps", "--site", "local", "--list"]) == 0
    listed = capsys.readouterr()
    assert len(listed.out.splitlines()) == 9 and "--data" not in listed.err  # the short protocol: synthetic data
    assert (
        main(["study", "run", "cpu-ps", "--site", "local", "--protocol", "paper", "--only", "nodes=1", "--dry-run"])
        == 0
    )
    shown = capsys.readouterr()
    assert "the dry run's jobs read --data /unset/DLAUNCH_CIFAR10" in shown.err
    assert shown.out.count("--data /unset/DLAUNCH_CIFAR10") == 27
    said = stderr_of(capsys, ["study", "run", "cpu-ps", "--site", "local", "--data", "/x"], code=2)
    assert "--data: the jobs of study cpu-ps read the data their recipe names" in said
    assert list(tmp_path.iterdir()) == []


def test_a_study_directory_made_before_its_study_had_protocols_takes_the_plain_one(tmp_path):
    from dlaunch.runs.study import _check_recorded
    from dlaunch.runs.studyfile import load_study

    study = load_study(REPO / "studies" / "mahon2020.toml")
    (tmp_path / "study.json").write_text(
        json.dumps({"study": "mahon2020", "file": "x", "site": "juwels-booster", "protocol": None, "stack": None})
    )
    _check_recorded(tmp_path, "juwels-booster", study, "paper")
    with pytest.raises(DlaunchError, match=r"run with protocol None; .* \(or --protocol paper, the design it was run"):
        _check_recorded(tmp_path, "juwels-booster", study, "short")


# -- a site name two profiles answer to ---------------------------------------------------------------------------


def test_a_site_name_two_profiles_answer_to_is_refused_naming_both_files(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "mysites"
    mine.mkdir()
    profile(mine, "generic-slurm", "leonardo")
    monkeypatch.setenv("DLAUNCH_SITES_DIR", str(mine))
    said = stderr_of(capsys, ["run", "--site", "leonardo", "--dry-run", "--image", "/i.sif"], code=2)
    assert said == (
        "dlaunch: error: --site: leonardo names 2 profiles: %s (its file name) and %s (an alias); give the "
        "one you mean by its path\n"
        % (display_path(mine / "leonardo.toml"), display_path(SITES / "leonardo-booster.toml"))
    )
    assert "#SBATCH --qos" not in stderr_of(
        capsys, ["run", "--site", "leonardo-booster", "--account", "p", "--dry-run"]
    )
    assert main(["run", "--site", str(mine / "leonardo.toml"), "--dry-run", "--image", "/i.sif"]) == 0
    assert "names 2 profiles" in stderr_of(capsys, ["sites", "check", "leonardo"], code=2)
    capsys.readouterr()
    assert main(["sites", "check", "lrd"]) == 0 and "leonardo-booster.toml: ok" in capsys.readouterr().out


@pytest.mark.slow
def test_the_cpu_studys_short_protocol_runs_here(tmp_path, monkeypatch):
    """cpu-ps's short protocol on this machine: its all-reduce block, one mode per engine (TensorFlow and MXNet from
    the environments scripts/bootstrap-engines.sh makes, which the shipped local profile names), each ending ok with
    its metrics; the other six modes run the same way (tests/test_engines.py runs each mode)."""
    for engine in (".venv-tf", ".venv-mx"):
        if not (REPO / engine / "bin" / "python").exists():
            pytest.skip("%s is missing: run scripts/bootstrap-engines.sh" % (REPO / engine))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    jobs = api.study("cpu-ps", site="local", only=["matrix=all-reduce"])
    assert [(j.run_name, j.exit_code) for j in jobs] == [
        ("tf-allreduce-native-resnet44-n0001-step-r1", 0),
        ("ddp-native-resnet44-n0001-step-r1", 0),
        ("mx-allreduce-native-resnet44-n0001-step-r1", 0),
    ]
    assert all(run.ok for run in api.study_status(tmp_path / "runs" / "cpu-ps"))
