"""`dlaunch` against the real throw-away Slurm cluster: tiny DDP trainings across two nodes (gloo on CPU)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

import slurm
from holds import Hold
from prerequisites import require_library
from dlaunch.train.metrics_schema import MetricsError, read_metrics

pytestmark = pytest.mark.slow

DLAUNCH = os.path.join(os.path.dirname(sys.executable), "dlaunch")
# ResNet-18 at 32 px, batch 4 per rank, one torch thread per rank.
TINY = ["--model", "resnet18", "--image-size", "32", "--num-classes", "10", "--batch-size", "4", "--threads", "1",
        "--device", "cpu", "--data", "synthetic", "--workers", "0", "--warmup-steps", "1", "--steps-per-epoch", "2"]
JOB_TIMEOUT_S = 180


def dlaunch(cluster: slurm.Cluster, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The dlaunch CLI of this environment, in `cwd`, talking to the cluster (wide tables for assertions)."""
    return subprocess.run([DLAUNCH, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=cluster.env(COLUMNS="300", **env))


def submit(cluster: slurm.Cluster, cwd: Path, site: Path, run_name: str, *args: str, **env: str) -> Path:
    """`dlaunch run` on the cluster (`env`: more variables for it and the job); the run directory."""
    ran = dlaunch(cluster, cwd, "run", "--site", str(site), "--experiment", "tests", "--run-name", run_name,
                  "--time", "00:10:00", *TINY, *args, **env)
    assert ran.returncode == 0, ran.stderr
    return cwd / "runs" / "tests" / run_name


def job_id(run_dir: Path) -> str:
    return (run_dir / "job_id").read_text().strip()


def wait_for(condition, what: str, timeout: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "%s did not happen within %g s" % (what, timeout)
        time.sleep(0.5)


def epochs_written(run_dir: Path) -> int:
    """Epoch records so far (0 while the trainer has opened the file but not yet written its header)."""
    path = run_dir / "metrics.jsonl"
    try:
        return len(read_metrics(str(path)).epochs)
    except MetricsError:
        return 0


def log_text(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in run_dir.glob("slurm-*.out"))


@pytest.fixture(scope="module")
def jsc_like_site(slurm_cluster, tmp_path_factory) -> Path:
    """A profile like JSC's: rendezvous at `<first node>i`, Gloo/NCCL on the second network's interface."""
    return slurm_cluster.site_profile(tmp_path_factory.mktemp("sites") / "slurm-jsc-like.toml", second_network=True)


# `jsc_like_site`: torch's c10d rendezvous finds no host for an endpoint named after a secondary interface
# (pytorch/pytorch#73656); every agent waited as a client until it timed out, before torchrun_jsc.
@pytest.mark.parametrize("site_fixture", ["slurm_site", "jsc_like_site"])
@pytest.mark.parametrize("framework", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod),
                                       pytest.param("deepspeed", marks=pytest.mark.deepspeed)])
def test_run_completes_on_two_hosts(framework, site_fixture, two_nodes, request, tmp_path):
    if framework != "ddp":
        require_library(framework)
    site = request.getfixturevalue(site_fixture)
    run_dir = submit(two_nodes, tmp_path, site, framework, "--framework", framework, "--nodes", "2", "--steps", "4")
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.header["world_size"] == 2
    assert len(set(metrics.header["hosts"])) == 2 and set(metrics.header["hosts"]) <= set(two_nodes.node_names)
    assert metrics.header["slurm_job_id"] == job_id(run_dir)
    assert metrics.status == "ok" and len(metrics.epochs) == 2
    if framework != "horovod":  # Gloo on the profile's interface, read from the trainers' own sockets (dlaunch/train/network.py)
        second = site_fixture == "jsc_like_site"
        gloo = {r["host"]: r for r in metrics.header["network"] if r["library"] == "gloo"}
        assert sorted(gloo) == sorted(set(metrics.header["hosts"])), metrics.header["network"]
        assert {tuple(r["interfaces"]) for r in gloo.values()} == {(two_nodes.second_ifname if second else two_nodes.ifname,)}
        assert all(r["addresses"][0].startswith("10.78.0." if second else "10.77.0.") for r in gloo.values())  # slurm-cluster.sh
    else:  # Horovod's MPI controller: Open MPI's selected point-to-point components, read from the process
        assert {r["library"] for r in metrics.header["network"]} == {"mpi"}, metrics.header["network"]
        assert all(any(c.startswith("pml ") for c in r["components"]) for r in metrics.header["network"])
    shown = dlaunch(two_nodes, tmp_path, "status", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if job_id(run_dir) in line)
    assert "COMPLETED" in row and " ok " in row and "metrics.jsonl" in row


def test_one_task_per_gpu_without_torchrun_completes(two_nodes, tmp_path):
    """A profile's `task-per-gpu` mode (OLCF's prescription): one srun task per worker, no torchrun, ranks from the
    task's neutral variables, MASTER_ADDR from `hostname -i` on the first node."""
    launch = {"rendezvous_command": ["hostname", "-i"], "ddp": {"mode": "task-per-gpu"}}
    site = two_nodes.site_profile(tmp_path / "slurm-task-per-gpu.toml", extra={"launch": launch})
    run_dir = submit(two_nodes, tmp_path, site, "per-gpu", "--framework", "ddp", "--nodes", "2", "--steps", "4")
    script = (run_dir / "job.sh").read_text()
    assert "torchrun" not in script and 'MASTER_ADDR="$(hostname -i)"' in script
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.header["world_size"] == 2 and len(set(metrics.header["hosts"])) == 2
    assert metrics.status == "ok" and len(metrics.epochs) == 2


def test_sweep_groups_one_run_per_node_count(two_nodes, slurm_site, tmp_path):
    swept = dlaunch(two_nodes, tmp_path, "sweep", "--site", str(slurm_site), "--nodes", "1,2", "--experiment", "scaling",
                    "--time", "00:10:00", *TINY, "--steps", "2")
    assert swept.returncode == 0, swept.stderr
    runs = sorted(p for p in (tmp_path / "runs" / "scaling").iterdir() if p.is_dir())
    assert len(runs) == 2
    for run_dir in runs:
        assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    assert [read_metrics(str(r / "metrics.jsonl")).header["world_size"] for r in runs] == [1, 2]
    assert {read_metrics(str(r / "metrics.jsonl")).header["experiment"] for r in runs} == {"scaling"}
    shown = dlaunch(two_nodes, tmp_path, "status", str(tmp_path / "runs" / "scaling"))
    assert shown.returncode == 0 and all(job_id(r) in shown.stdout for r in runs), shown.stdout + shown.stderr


def test_cancel_keeps_finished_epochs_and_resume_continues(two_nodes, slurm_site, tmp_path):
    hold = Hold(tmp_path)  # the job holds after its first epoch: the cancel comes mid-run on any machine
    run_dir = submit(two_nodes, tmp_path, slurm_site, "cancelled", "--nodes", "2", "--steps", "24", **hold.env())
    wait_for(lambda: epochs_written(run_dir) >= 1 and (run_dir / "checkpoints" / "last.pt").is_file(), "a first epoch")
    cancelled = dlaunch(two_nodes, tmp_path, "cancel", str(run_dir))
    assert cancelled.returncode == 0, cancelled.stderr
    assert two_nodes.wait_job(job_id(run_dir), 60) == "CANCELLED"
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "cancelled", log_text(run_dir)
    finished = [e["epoch"] for e in metrics.epochs]
    assert finished == [0]  # the cancel came between epochs 0 and 1 (held): the run stops there
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert "CANCELLED" in dlaunch(two_nodes, tmp_path, "status", str(run_dir)).stdout

    hold.release()
    resumed = dlaunch(two_nodes, tmp_path, "run", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "ok"
    assert [e["epoch"] for e in metrics.epochs][:len(finished)] == finished
    assert metrics.epochs[-1]["epoch"] == 11
    records = [json.loads(line)["type"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "resume" in records


def test_usr1_to_the_running_step_checkpoints_and_marks_the_run_interrupted(two_nodes, slurm_site, tmp_path):
    # Slurm's warning (`--signal=USR1@120`) goes to every process of the job's steps, as `scancel --signal`
    # does; sent here once training runs, instead of timed by a short limit (Slurm may send it up to a
    # minute early or late, so a one-minute job gets it anywhere from start-up to after the limit).
    run_dir = submit(two_nodes, tmp_path, slurm_site, "warned", "--nodes", "2", "--steps", "100000")
    wait_for(lambda: epochs_written(run_dir) >= 1, "a first epoch")
    signalled = two_nodes.run(["scancel", "--signal=USR1", job_id(run_dir)])
    assert signalled.returncode == 0, signalled.stderr
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "FAILED"  # the trainer exits 75, resumable
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "interrupted", log_text(run_dir)
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert "interrupted" in dlaunch(two_nodes, tmp_path, "status", str(run_dir)).stdout


def test_a_job_ended_by_its_time_limit_reads_as_interrupted(two_nodes, tmp_path):
    # `--signal=URG@1` replaces the USR1 warning with a signal every process ignores: the time limit's
    # SIGTERM is all the trainer gets, and it must read as a resumable interruption, not a cancel.
    site = two_nodes.site_profile(tmp_path / "slurm-no-warning.toml", sbatch_directives=["--signal=URG@1"])
    # The run holds after its first epoch (never released): the limit strikes it there, mid-way, however
    # fast the machine; the minute (Slurm's shortest limit) only bounds the start and first epoch.
    hold = Hold(tmp_path)
    ran = dlaunch(two_nodes, tmp_path, "run", "--site", str(site), "--experiment", "tests", "--run-name", "limit",
                  "--nodes", "2", "--time", "00:01:00", *TINY, "--steps", "100000", **hold.env())
    assert ran.returncode == 0, ran.stderr
    run_dir = tmp_path / "runs" / "tests" / "limit"
    wait_for(lambda: epochs_written(run_dir) >= 1 and (run_dir / "checkpoints" / "last.pt").is_file(), "a first epoch",
             timeout=120)
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "TIMEOUT"
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "interrupted", log_text(run_dir)
    assert metrics.epochs and (run_dir / "checkpoints" / "last.pt").is_file()
    shown = dlaunch(two_nodes, tmp_path, "status", str(run_dir)).stdout
    assert "TIMEOUT" in shown and "interrupted" in shown


def test_a_killed_rank_fails_the_job_promptly(two_nodes, slurm_site, tmp_path):
    if two_nodes.dir is None:
        pytest.skip("reaching a rank needs the namespaces of a cluster started by slurm-cluster.sh")
    # both ranks hold after their first epoch: rank 1 dies at the same place in every run, and rank 0 leaves
    # the hold only on the step's SIGTERM (--kill-on-bad-exit)
    run_dir = submit(two_nodes, tmp_path, slurm_site, "killed", "--nodes", "2", "--steps", "100000", **Hold(tmp_path).env())
    wait_for(lambda: epochs_written(run_dir) >= 1, "a first epoch")
    victims = trainer_pids(two_nodes.node_names[1])
    assert victims, "no trainer process on %s" % two_nodes.node_names[1]
    os.kill(victims[0], signal.SIGKILL)
    assert two_nodes.wait_job(job_id(run_dir), 60) == "FAILED"
    assert read_metrics(str(run_dir / "metrics.jsonl")).status == "failed"
    status = dlaunch(two_nodes, tmp_path, "status", str(run_dir)).stdout
    assert "FAILED" in status
    assert "Signal 9 (SIGKILL) received by PID %d" % victims[0] in status  # the line that explains it


def trainer_pids(namespace: str) -> List[int]:
    """The `python -m dlaunch.train` worker processes inside a node's network namespace."""
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    pids = []
    for pid in map(int, listed.stdout.split()):
        try:
            argv = Path("/proc/%d/cmdline" % pid).read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"dlaunch.train" in argv and b"-m" in argv and not any(a.endswith(b"torchrun") for a in argv):
            pids.append(pid)
    return pids


def test_sbatch_refusal_reaches_the_user_and_the_run_directory(two_nodes, tmp_path):
    # The profile promises one node more than the cluster has, so the launcher lets sbatch decide.
    site = two_nodes.site_profile(tmp_path / "slurm-too-big.toml", max_nodes=two_nodes.nodes + 1)
    ran = dlaunch(two_nodes, tmp_path, "run", "--site", str(site), "--experiment", "tests", "--run-name", "refused",
                  "--nodes", str(two_nodes.nodes + 1), *TINY, "--steps", "2")
    assert ran.returncode != 0
    assert "sbatch refused the job: sbatch: error: Batch job submission failed: " in ran.stderr
    reason = ran.stderr.strip().split("Batch job submission failed: ", 1)[1]  # Slurm's words
    state = (tmp_path / "runs" / "tests" / "refused" / "state").read_text()
    assert state.startswith("submission failed") and reason in state


USER_TRAINER = "import sys\nprint('a user trainer ran, not the benchmark')\nsys.exit(3)\n"


@pytest.mark.parametrize("shadow", ["train.py", "train/__main__.py", "dlaunch/train/__main__.py"])
def test_a_job_submitted_beside_a_users_train_module_runs_the_benchmark(shadow, two_nodes, slurm_site, tmp_path):
    """Most ML projects hold a train.py or a train/ package: a job submitted from such a folder (or from one
    holding a package named like dlaunch's own trainer) must still run dlaunch's trainer (sbatch starts the
    script in the folder it was submitted from; `python -m` looks there first)."""
    user_module = tmp_path / shadow
    user_module.parent.mkdir(parents=True, exist_ok=True)
    user_module.write_text(USER_TRAINER)
    for package in user_module.relative_to(tmp_path).parents:
        if package != Path("."):
            (tmp_path / package / "__init__.py").write_text("")
    run_dir = submit(two_nodes, tmp_path, slurm_site, "beside-" + shadow.split("/")[0].replace(".", "-"),
                     "--nodes", "1", "--steps", "2")
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    assert "a user trainer ran" not in log_text(run_dir)
    assert read_metrics(str(run_dir / "metrics.jsonl")).status == "ok"
