"""The `dlaunch` command line against fake Slurm commands on PATH (no cluster here)."""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import dlaunch.cli
from dlaunch.cli import main
from dlaunch.errors import SchedulerError
from dlaunch.schedulers.slurm import Slurm
from test_launcher_fakes import install_fakes, read_args
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.train.metrics_schema import make_record

JUWELS = ["--site", "juwels", "--nodes", "2", "--account", "proj42", "--experiment", "exp"]
FAKE_SLURM = {
    "sbatch": 'printf "%s\\0" "$@" > "$FAKE_LOG/sbatch.args"; echo "${SLURM_CONF:-none}" > "$FAKE_LOG/slurm_conf"; echo "4711;cluster"\n',
    "squeue": 'for job in ${3//,/ }; do echo "$job|RUNNING|None|N/A|booster"; done\n',  # -h -j IDS -o %i|%T|%r|%S|%P
    "scancel": 'printf "%s\\0" "$@" > "$FAKE_LOG/scancel.args"\n',
    # no accounting here: without this fake the real sacct retried a cluster that does not exist for 60 s (dlaunch's
    # own timeout gave up after 30 s), in every test that asked it
    "sacct": "exit 1\n",
}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """A working directory with fake sbatch/squeue/scancel first on PATH and an existing image."""
    fakes = install_fakes(tmp_path / "bin", FAKE_SLURM)
    monkeypatch.setenv("PATH", "%s:%s" % (fakes, os.environ["PATH"]))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path))
    monkeypatch.setenv("SLURM_CONF", "/tmp/throwaway/slurm.conf")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 300)  # rich tables: no wrapped cells, whatever the terminal
    (tmp_path / "img.sif").write_text("")
    return tmp_path


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_issue_command_dry_run_prints_script_and_writes_nothing(tmp_path):
    """`dlaunch --site juwels --nodes 256 --framework ddp` (no sub-command = run), as a real process."""
    result = subprocess.run([sys.executable, "-m", "dlaunch.cli", "--site", "juwels", "--nodes", "256",
                             "--framework", "ddp", "--account", "proj42", "--dry-run"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert re.match(r"#!/bin/bash\n#SBATCH --job-name=juwels-booster-ddp-resnet50-\d{8}-\d{6}-\d{3}-[0-9a-f]{4}\n"
                    r"#SBATCH --nodes=256\n", result.stdout)
    assert "does not exist" in result.stderr  # the default image is only warned about in a dry run
    assert list(tmp_path.iterdir()) == []


def test_engine_frameworks_run_the_cpu_stacks_images_and_other_stacks_name_the_fix(tmp_path):
    """JUWELS Cluster (cpu stack) runs tf-allreduce from cpu-tensorflow; JUWELS Booster (current) refuses it."""
    def run(site, framework):
        return subprocess.run([sys.executable, "-m", "dlaunch.cli", "run", "--site", site, "--nodes", "2",
                               "--framework", framework, "--account", "p", "--dry-run"],
                              cwd=tmp_path, capture_output=True, text=True)
    cluster = run("juwels-cluster", "tf-allreduce")
    assert cluster.returncode == 0, cluster.stderr
    assert "cpu-tensorflow-x86_64.sif does not exist (build it with `make image-tensorflow STACK=cpu`" in cluster.stderr
    assert re.search(r"cpu-tensorflow-x86_64\.sif \\\n\s+python -m dlaunch\.train\.tf ", cluster.stdout)
    booster = run("juwels-booster", "mx-ps-async")
    assert booster.returncode == 2 and len(booster.stderr.strip().splitlines()) == 1
    assert "image stack 'current' (site juwels-booster) has no image of the mxnet trainer (stacks with it: cpu " \
           "(make image-mxnet STACK=cpu)); set [container] stack to one with it or give --image" in booster.stderr
    assert list(tmp_path.iterdir()) == []


def test_readme_dry_run_without_account_warns_and_renders_no_account(tmp_path):
    """The README's first cluster example has no --account: a dry run warns, a submission refuses."""
    env = {k: v for k, v in os.environ.items() if k != "SBATCH_ACCOUNT"}
    result = subprocess.run([sys.executable, "-m", "dlaunch.cli", "--site", "juwels", "--nodes", "256",
                             "--framework", "ddp", "--dry-run"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "warning: --account: site juwels-booster needs an account" in result.stderr
    assert "#SBATCH --nodes=256\n" in result.stdout and "--account" not in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_bad_input_exits_2_with_one_line_as_a_process(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dlaunch.cli", "run", "--site", "juwels", "--nodes", "999",
                             "--account", "p", "--dry-run"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr == ("dlaunch: error: --nodes: no partition of site juwels-booster takes 999 node(s) for 01:00:00; "
                             "its partitions: booster (1-384 nodes, up to 1-00:00:00), develbooster (1-4 nodes, up to 02:00:00)\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["--site", "nowhere"], "dlaunch: error: --site: unknown site 'nowhere'"),
    (["--site", "local", "--framework", "mxnet"], "dlaunch: error: "),
    (["--site", "juwels", "--nodes", "2", "--account", "p", "--time", "25:00:00"], "dlaunch: error: --time: no partition of site juwels-booster takes 2 node(s) for 1-01:00:00"),
    (["--site", "juwels", "--nodes", "2", "--account", "p", "--image", "missing.sif"], "dlaunch: error: --image: "),
    (["--site", "juwels", "--nodes", "2"], "dlaunch: error: --account: site juwels-booster needs an account"),
    # the trainer's own checks run before submission (its parser, torch-free)
    (["--site", "juwels", "--account", "p", "--epochs", "2", "--steps", "10"],
     "dlaunch: error: trainer options: argument --steps: not allowed with argument --epochs"),
    (["--site", "juwels", "--account", "p", "--gamma", "2"], "dlaunch: error: trainer options: --gamma 2.0 must be in (0, 1]"),
    (["--site", "lumi", "--account", "p", "--loader", "dali", "--data", "/scratch/imagenet"],
     "dlaunch: error: --loader dali: site lumi-g has AMD GPUs"),
    (["sweep", "--site", "juwels", "--account", "p", "--image", "img.sif", "--nodes", "1,2,1"],
     "dlaunch: error: --nodes: 1,2,1 lists a count twice"),
])
def test_bad_input_is_one_line_exit_2_nothing_written_or_submitted(fake_slurm, capsys, argv, message):
    assert main(argv) == 2
    assert error_line(capsys).startswith(message)
    assert not (fake_slurm / "runs").exists() and not (fake_slurm / "sbatch.args").exists()


def test_nodes_and_gpus_together_spread_the_gpus_evenly(fake_slurm, capsys):
    assert main(["--site", "juwels", "--account", "p", "--image", "img.sif", "--dry-run", "--nodes", "2", "--gpus", "4"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --nodes=2\n" in script and "--nproc_per_node=2" in script
    assert main(["--site", "juwels", "--account", "p", "--image", "img.sif", "--dry-run", "--nodes", "2", "--gpus", "3"]) == 2
    assert "--gpus: 3 GPUs do not spread evenly over --nodes 2" in error_line(capsys)


def test_the_scripts_header_counts_nodes_and_processes_in_their_number(fake_slurm, capsys):
    for nodes, gpus, counts in (("1", "1", "1 node x 1 process"), ("2", "8", "2 nodes x 4 processes")):
        assert main(["--site", "juwels", "--account", "p", "--image", "img.sif", "--dry-run", "--nodes", nodes, "--gpus", gpus]) == 0
        (header,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# dlaunch ")]
        assert header.endswith(": site juwels-booster, ddp, %s, partition booster" % counts), header


def test_zero_valued_trainer_options_reach_the_trainer(fake_slurm, capsys):
    assert main(["--site", "juwels", "--account", "p", "--image", "img.sif", "--dry-run",
                 "--label-smoothing", "0", "--workers", "0", "--seed", "0"]) == 0
    script = capsys.readouterr().out
    assert "--label-smoothing 0.0 \\\n" in script and "--workers 0 \\\n" in script and "--seed 0 \\\n" in script


def test_bad_profile_names_file_and_field(fake_slurm, capsys):
    text = (Path(__file__).parents[1] / "sites" / "generic-slurm.toml").read_text()
    Path("bad.toml").write_text(text.replace("max_nodes = 64", 'max_nodes = "many"'))
    assert main(["sites", "check", "bad.toml"]) == 2
    assert error_line(capsys) == "dlaunch: error: bad.toml: scheduler.partitions.0.max_nodes: Input should be a valid integer"
    Path("bad.toml").write_text(text.replace('gpu_vendor = "nvidia"\n', ""))
    assert main(["run", "--site", "bad.toml", "--dry-run"]) == 2
    assert error_line(capsys) == "dlaunch: error: bad.toml: gpu_vendor: Field required"


def test_run_submits_and_records_the_job(fake_slurm, capsys):
    assert main(["run"] + JUWELS + ["--image", "img.sif", "--run-name", "r1", "--model", "resnet18"]) == 0
    run = fake_slurm / "runs" / "exp" / "r1"
    assert (run / "job_id").read_text() == "4711\n"
    assert (run / "state").read_text() == "submitted\n"
    assert (run / "checkpoints").is_dir()
    assert read_args(fake_slurm / "sbatch.args") == ["--parsable", str(run / "job.sh")]
    assert (fake_slurm / "slurm_conf").read_text() == "/tmp/throwaway/slurm.conf\n"
    plan = json.loads((run / "plan.json").read_text())
    assert plan["plan"]["trainer_argv"][-4:] == ["--metrics", str(run / "metrics.jsonl"), "--checkpoint-dir", str(run / "checkpoints")]
    assert plan["request"]["trainer"] == {"model": "resnet18"}
    # paths are stored absolute, so `run --resume` works from any directory
    assert (plan["request"]["image"], plan["request"]["output"]) == (str(fake_slurm / "img.sif"), str(fake_slurm / "runs"))
    assert subprocess.run(["bash", "-n", str(run / "job.sh")]).returncode == 0


def test_refused_submission_shows_reason_and_is_recorded(fake_slurm, capsys):
    install_fakes(fake_slurm / "bin", {"sbatch": 'echo "sbatch: error: Batch job submission failed: Invalid account" >&2; exit 1\n'})
    assert main(["run"] + JUWELS + ["--image", "img.sif", "--run-name", "r1"]) == 1
    assert error_line(capsys) == "dlaunch: error: sbatch refused the job: sbatch: error: Batch job submission failed: Invalid account"
    assert (fake_slurm / "runs/exp/r1/state").read_text().startswith("submission failed: sbatch refused the job")


def test_slurm_commands_time_out(fake_slurm):
    install_fakes(fake_slurm / "bin", {"sbatch": "sleep 5\n"})
    with pytest.raises(SchedulerError, match="sbatch did not answer within 0.2 s .*/tmp/throwaway/slurm.conf"):
        Slurm(timeout_s=0.2).submit(fake_slurm / "job.sh", fake_slurm)


def test_status_logs_cancel_and_resume(fake_slurm, capsys):
    assert main(["run"] + JUWELS + ["--image", "img.sif", "--run-name", "r1"]) == 0
    run = fake_slurm / "runs" / "exp" / "r1"
    header = make_record("header", 1.0, run_id="x", argv=[], config={}, framework="ddp", loader="native",
                         model="resnet50", device="cuda", world_size=8, nodes=2, hosts=[], batch_per_worker=64,
                         global_batch=512, lr_scaled=0.8, versions={}, slurm_job_id="4711", site="juwels-booster",
                         experiment="exp", image=None, git_revision=None)
    epoch = make_record("epoch", 2.0, epoch=0, steps=10, images=5120, images_per_s=2560.0, epoch_time_s=2.0,
                        data_wait_s=0.1, loss=6.9, lr=0.8)
    (run / "metrics.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(epoch) + "\n")
    (run / "slurm-4711.out").write_text("epoch 0 done\n")
    capsys.readouterr()
    assert main(["status", str(fake_slurm / "runs")]) == 0
    table = capsys.readouterr().out
    assert "RUNNING" in table and "running" in table and "2560.0" in table
    assert main(["logs", str(run)]) == 0
    assert "epoch 0 done" in capsys.readouterr().out
    assert main(["cancel", str(run)]) == 0
    assert read_args(fake_slurm / "scancel.args") == ["4711"]
    assert (run / "state").read_text() == "cancel requested\n"
    capsys.readouterr()
    assert main(["run", "--resume", str(run)]) == 2  # the fake squeue still says RUNNING
    refused = error_line(capsys)
    assert "job 4711" in refused and "still RUNNING" in refused
    install_fakes(fake_slurm / "bin", {"squeue": "exit 0\n", "scontrol": 'echo "JobId=4711 JobState=CANCELLED"\n'})
    assert main(["run", "--resume", str(run)]) == 0
    assert (run / "job.sh").read_text().endswith(" \\\n  --resume\n")
    assert (run / "state").read_text() == "submitted\n"


def test_sweep_is_one_experiment_with_one_job_per_node_count(fake_slurm, capsys):
    assert main(["sweep", "--site", "juwels", "--nodes", "1,2,4", "--account", "p", "--image", "img.sif",
                 "--experiment", "scaling"]) == 0
    runs = sorted(p.name for p in (fake_slurm / "runs" / "scaling").iterdir())
    assert runs == ["n0001", "n0002", "n0004"]
    assert "#SBATCH --nodes=4\n" in (fake_slurm / "runs/scaling/n0004/job.sh").read_text()
    names = [(fake_slurm / "runs/scaling" / run / "job.sh").read_text().splitlines()[1] for run in runs]
    assert names == ["#SBATCH --job-name=scaling-%s" % run for run in runs]  # one per job in squeue


def test_sweep_refuses_all_before_writing_any(fake_slurm, capsys):
    assert main(["sweep", "--site", "juwels", "--nodes", "1,512", "--account", "p", "--image", "img.sif"]) == 2
    assert not (fake_slurm / "runs").exists()


def test_user_sites_dir_and_sites_commands(fake_slurm, monkeypatch, capsys):
    text = (Path(__file__).parents[1] / "sites" / "generic-slurm.toml").read_text()
    (fake_slurm / "mysites").mkdir()
    (fake_slurm / "mysites" / "mycluster.toml").write_text(text.replace('name = "generic-slurm"', 'name = "mycluster"')
                                                           .replace('aliases = ["slurm"]', 'aliases = ["mine"]'))
    monkeypatch.setenv("DLAUNCH_SITES_DIR", str(fake_slurm / "mysites"))
    assert main(["sites"]) == 0
    assert "mycluster" in capsys.readouterr().out
    assert main(["sites", "show", "mine"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "mycluster"
    assert main(["--site", "mine", "--dry-run", "--image", "img.sif"]) == 0
    assert "#SBATCH --partition=gpu" in capsys.readouterr().out
    # a broken profile beside it is listed as unreadable and hides no other site or alias
    (fake_slurm / "mysites" / "broken.toml").write_text("name = [\n")
    assert main(["sites"]) == 0
    listed = capsys.readouterr().out
    assert "unreadable" in listed and "mycluster" in listed
    assert listed.splitlines()[-1].startswith("broken: unreadable: ") and "broken.toml: invalid TOML" in listed  # at any width
    assert main(["--site", "juwels", "--account", "p", "--dry-run", "--image", "img.sif"]) == 0
    capsys.readouterr()
    assert main(["--site", "nowhere"]) == 2
    assert "unreadable profile" in error_line(capsys)


def test_launcher_never_imports_torch():
    code = "import sys, dlaunch.cli; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_make_demo_command_renders_a_two_worker_torchrun(fake_slurm, capsys):
    """The Makefile's (and README's) demo command, here as a dry run."""
    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    demo = next(line for line in makefile.splitlines() if line.startswith("\tdlaunch run --site local"))
    assert main(shlex.split(demo)[1:] + ["--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "exec torchrun --standalone --nnodes=1 --nproc_per_node=2 -m dlaunch.train \\\n  --framework ddp \\\n  --model resnet50" in script
    assert not (fake_slurm / "runs").exists()


def test_sites_table_at_80_columns_through_a_pipe_cuts_no_name_or_path(tmp_path):
    """`dlaunch sites` as a process whose stdout is a pipe (laid out for 80 columns): with this long name,
    the container column gives way too (named below the table); every name stays whole."""
    text = (Path(__file__).parents[1] / "sites" / "generic-slurm.toml").read_text()
    long_name = "a-site-with-a-long-name-like-juwels-booster-dc"
    (tmp_path / "mysites").mkdir()
    (tmp_path / "mysites" / (long_name + ".toml")).write_text(
        text.replace('name = "generic-slurm"', 'name = "%s"' % long_name).replace('aliases = ["slurm"]', 'aliases = ["mine"]'))
    env = dict(os.environ, COLUMNS="80", DLAUNCH_SITES_DIR=str(tmp_path / "mysites"))
    listed = subprocess.run([sys.executable, "-m", "dlaunch.cli", "sites"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "…" not in listed.stdout and max(len(line) for line in listed.stdout.splitlines()) <= 80
    words = listed.stdout.replace(",", " ").split()
    for name in ("juwels-booster", "juwels", "jureca-dc", "generic-slurm", long_name, "mine"):
        assert name in words, listed.stdout
    assert listed.stdout.splitlines()[-1] == "left out at 80 columns: description, file, container"


def test_runs_at_80_columns_through_a_pipe_cuts_no_run_path(fake_slurm):
    for name in ("juwels-booster-ddp-resnet50/20261122-101010", "sweep-ddp-20261122-101010/n0256"):
        run = fake_slurm / "runs" / name
        run.mkdir(parents=True)
        (run / "plan.json").write_text(json.dumps({"plan": {"scheduler": "slurm", "site": "juwels-booster"}, "request": {}}))
        (run / "job_id").write_text("4711\n")
    listed = subprocess.run([sys.executable, "-m", "dlaunch.cli", "runs"], cwd=fake_slurm, capture_output=True,
                            text=True, env=dict(os.environ, COLUMNS="80"))
    assert listed.returncode == 0, listed.stderr
    assert "…" not in listed.stdout and max(len(line) for line in listed.stdout.splitlines()) <= 80
    words = listed.stdout.split()
    assert "runs/juwels-booster-ddp-resnet50/20261122-101010" in words and "runs/sweep-ddp-20261122-101010/n0256" in words
    assert words.count("RUNNING") == 2  # the fake squeue's answer


def test_completion_functions_complete_sites_aliases_and_run_directories(fake_slurm):
    assert dlaunch.cli.terminal.complete_site("jur") == ["jureca", "jureca-dc"]
    assert "localhost" in dlaunch.cli.terminal.complete_site("")
    for name in ("exp/r1", "exp/r2", "study/exp2/n0001"):
        (fake_slurm / "runs" / name).mkdir(parents=True)
        (fake_slurm / "runs" / name / "plan.json").write_text("{}")
    assert dlaunch.cli.terminal.complete_run_dir("runs/e") == ["runs/exp", "runs/exp/r1", "runs/exp/r2"]
    assert dlaunch.cli.terminal.complete_run_dir("runs/study/") == ["runs/study/exp2", "runs/study/exp2/n0001"]
    assert dlaunch.cli.terminal.complete_run_dir("") == ["runs", "runs/exp", "runs/exp/r1", "runs/exp/r2", "runs/study",
                                                 "runs/study/exp2", "runs/study/exp2/n0001"]


def bash_complete(words: str, cwd: Path, home: Path) -> list:
    """What bash offers for `words` + TAB with the script `dlaunch --install-completion bash` installed."""
    script = ('source %s/.bash_completions/dlaunch.sh\nCOMP_WORDS=(%s)\nCOMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n'
              '[ "${COMP_WORDS[COMP_CWORD]}" = "" ] || true\n_dlaunch_completion dlaunch\nprintf "%%s\\n" "${COMPREPLY[@]}"\n'
              % (home, words))
    env = dict(os.environ, HOME=str(home), PATH="%s:%s" % (os.path.dirname(sys.executable), os.environ["PATH"]))
    done = subprocess.run(["bash", "--norc", "-c", script], cwd=cwd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_install_completion_for_bash_and_complete_through_bash(fake_slurm):
    home = fake_slurm / "home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    installed = subprocess.run([sys.executable, "-m", "dlaunch.cli", "--install-completion", "bash"], cwd=fake_slurm,
                               capture_output=True, text=True, env=env)
    assert installed.returncode == 0, installed.stderr
    assert "source '%s/.bash_completions/dlaunch.sh'" % home in (home / ".bashrc").read_text()
    (fake_slurm / "runs" / "exp" / "r1").mkdir(parents=True)
    (fake_slurm / "runs" / "exp" / "r1" / "plan.json").write_text("{}")
    assert bash_complete('dlaunch run --framework ""', fake_slurm, home) == list(FRAMEWORKS)
    assert bash_complete("dlaunch --site jure", fake_slurm, home) == ["jureca", "jureca-dc"]  # no sub-command = run
    assert bash_complete("dlaunch watch runs/", fake_slurm, home) == ["runs/exp", "runs/exp/r1"]
    assert bash_complete("dlaunch wa", fake_slurm, home) == ["watch"]


def test_run_follow_submits_then_watches_to_the_end_with_fake_slurm(fake_slurm, monkeypatch, capsys):
    """Fake sbatch: the job 'ran' at once (it writes an ok metrics file); squeue no longer lists it and
    scontrol says COMPLETED, or FAILED for the second submission."""
    header = make_record("header", 1.0, run_id="x", argv=[], config={}, framework="ddp", loader="native",
                         model="resnet50", device="cuda", world_size=8, nodes=2, hosts=[], batch_per_worker=64,
                         global_batch=512, lr_scaled=0.8, versions={}, slurm_job_id="4711", site="juwels-booster",
                         experiment="exp", image=None, git_revision=None, loader_settings={"total_steps": 10, "steps_per_epoch": 10})
    epoch = make_record("epoch", 2.0, epoch=0, steps=10, images=5120, images_per_s=2560.0, epoch_time_s=2.0,
                        data_wait_s=0.1, loss=6.9, lr=0.8)
    end = make_record("end", 3.0, status="ok", total_time_s=2.0, epochs_completed=1)
    (fake_slurm / "ok.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (header, epoch, end)))
    install_fakes(fake_slurm / "bin", {
        "sbatch": 'cp "$FAKE_LOG/ok.jsonl" "$(dirname "$2")/metrics.jsonl"; echo "4711;cluster"\n',
        "squeue": "exit 0\n",
        "scontrol": 'echo "JobId=4711 JobState=${FAKE_STATE:-COMPLETED}"\n',
    })
    assert main(["run"] + JUWELS + ["--image", "img.sif", "--run-name", "r1", "--follow"]) == 0
    assert capsys.readouterr().out.endswith("runs/exp/r1: COMPLETED; ok; steps 10/10, epoch 1/1, 2560.0 images/s, loss 6.900\n")
    monkeypatch.setenv("FAKE_STATE", "FAILED")  # after the trainer's `ok` end record: the run is ok, and says so
    assert main(["run"] + JUWELS + ["--image", "img.sif", "--run-name", "r2", "--follow"]) == 0
    assert capsys.readouterr().out.endswith("runs/exp/r2: FAILED; ok; steps 10/10, epoch 1/1, 2560.0 images/s, loss "
                                            "6.900; its job ended FAILED after the trainer's end record: the run's "
                                            "figures are whole\n")


def test_run_repeat_dry_run_prints_n_scripts_named_r1_to_rn(tmp_path, capsys):
    assert main(["run", "--site", "local", "--gpus", "1", "--model", "resnet44", "--data", "synthetic",
                 "--output", str(tmp_path), "--experiment", "e", "--run-name", "x", "--repeat", "3", "--dry-run"]) == 0
    shown, notes = capsys.readouterr()
    assert shown.count("#!/bin/bash") == 3 and "3 runs of one request (--repeat 3)" in notes
    assert all(str(tmp_path / "e" / name) in shown for name in ("x-r1", "x-r2", "x-r3"))
    assert not list(tmp_path.iterdir())  # a dry run writes nothing
    assert main(["run", "--site", "local", "--repeat", "2", "--resume", str(tmp_path)]) == 2
    assert "--repeat: not with --resume" in capsys.readouterr().err
