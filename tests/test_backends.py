"""Scheduler and container-runtime backends (PBS: tests/test_pbs.py): Slurm's states, pyxis step options,
Apptainer's library path, architecture- and vendor-aware images, and profiles of the first schema."""
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from dlaunch.cli import main
from dlaunch.errors import DlaunchError
from dlaunch.jobs.request import LaunchRequest
from dlaunch.schedulers import JobState, scheduler_for
from dlaunch.schedulers.slurm import classify
from dlaunch.jobs.sites import SHIPPED_SITES_DIR, Site, load_site
from test_launcher_fakes import plan_for, script_for

REQUEST = dict(nodes=2, account="proj42", experiment="exp", trainer=(("steps", 20),))


def shipped(name: str) -> Site:
    return load_site(SHIPPED_SITES_DIR / ("%s.toml" % name))


def lines(script: str):
    return [line.strip().rstrip("\\").strip() for line in script.splitlines()]


# -- Slurm -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("word, meaning", [("PENDING", JobState.PENDING), ("CANCELLED by 0", JobState.CANCELLED),
                                           ("REQUEUE_HOLD", JobState.REQUEUED), ("NODE_FAIL", JobState.NODE_FAIL),
                                           ("unknown (not in Slurm any more)", JobState.GONE), ("???", JobState.UNKNOWN)])
def test_slurm_states(word, meaning):
    assert classify(word) is meaning and meaning.active == (meaning in (JobState.PENDING, JobState.REQUEUED))


def test_what_is_slurms_own_in_a_profile_is_checked_by_slurm():
    """A row without a partition needs a QOS, directives are srun's form, one way to ask for GPUs, none on a
    site without GPUs (dlaunch/schedulers/slurm.py)."""
    data = shipped("generic-slurm").model_dump(by_alias=True)
    row = data["scheduler"]["partitions"][0]
    for scheduler, refusal in (
            (dict(partitions=[dict(row, partition="", qos=None)]), 'partition = "" needs a qos'),
            (dict(partitions=[dict(row, directives=["-l walltime=1:00:00"])]), "is not of the form --name or --name=value"),
            (dict(gres="gpu:4", gpu_request="gres"), "gres and gpu_request both ask for GPUs")):
        with pytest.raises(ValueError, match=refusal):
            Site.model_validate(dict(data, scheduler=dict(data["scheduler"], **scheduler)))
    with pytest.raises(ValueError, match="scheduler.gpu_request: a site without GPUs"):
        Site.model_validate(dict(data, gpu_vendor="none", scheduler=dict(data["scheduler"], gpu_request="gres")))


@pytest.mark.parametrize("framework, mode", [("ddp", "torchrun-per-node"), ("ddp", "task-per-gpu"),
                                             ("horovod", "mpi-per-gpu"), ("horovod", "mpirun"),
                                             ("mx-ps-sync", None), ("tf-allreduce", None)])
def test_every_launch_mode_ends_the_step_when_one_task_fails(framework, mode):
    """srun's steps, in every launch mode, end the step on a task's failure (--kill-on-bad-exit=1): a crashed node's
    torchrun or a dead rank does not leave the others waiting in a collective until the time limit. The mpirun mode's
    step is Open MPI's mpirun, which aborts the job itself when a rank exits non-zero ("Per user-direction, the job
    has been aborted")."""
    data = shipped("generic-slurm").model_dump(by_alias=True)
    data.update(container={"kind": "none"}, gpus_per_node=2)
    if mode:
        data["launch"] = {framework: {"mode": mode}}
    step = plan_for(Site.model_validate(data), LaunchRequest(site="generic-slurm", framework=framework, **REQUEST)).command[0]
    assert step[0] == ("mpirun" if mode == "mpirun" else "srun")
    assert ("--kill-on-bad-exit=1" in step) == (step[0] == "srun")


def test_unknown_scheduler_kind_is_named():
    with pytest.raises(DlaunchError, match="scheduler 'lsf' is not one of slurm, pbs, local"):
        scheduler_for("lsf")


# -- container runtimes ------------------------------------------------------------------------------

def test_pyxis_puts_the_container_into_srun_options_not_in_front_of_the_command():
    site = Site.model_validate(dict(shipped("generic-slurm").model_dump(), container={"kind": "pyxis", "binds": ["/p/data:/data:ro"]}))
    plan = plan_for(site, LaunchRequest(site="generic-slurm", framework="ddp", image="nvcr.io#nvidia/pytorch:25.12-py3", **REQUEST))
    step = plan.command[0]
    assert step[0] == "srun" and "--container-image=nvcr.io#nvidia/pytorch:25.12-py3" in step
    assert "--container-mounts=/p/data:/data:ro,/scratch/runs/exp/run" in step
    assert plan.command[2] == ()  # nothing in front of torchrun but the task variables (command[1])
    with pytest.raises(DlaunchError, match="--image: 'nvcr.io/nvidia/pytorch' is neither"):
        plan_for(site, LaunchRequest(site="generic-slurm", framework="ddp", image="nvcr.io/nvidia/pytorch", **REQUEST))


def test_alps_environment_definition_file_and_its_mounts_warning():
    plan = plan_for(shipped("alps"), LaunchRequest(site="alps", framework="ddp", **REQUEST))
    assert [o for o in plan.command[0] if o.startswith("--environment=")]
    assert any("must mount /scratch/runs/exp/run" in w for w in plan.warnings)


def test_apptainer_gets_the_plugin_library_path_through_apptainerenv():
    data = shipped("generic-slurm").model_dump()
    data["nccl_net_plugin"] = {"name": "aws-ofi-nccl", "library_dir": "/opt/aws-ofi-nccl/lib"}
    script = script_for(Site.model_validate(data), LaunchRequest(site="generic-slurm", framework="ddp", **REQUEST))
    assert "export LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib\"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\"" in script
    assert "export APPTAINERENV_LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib" in script
    assert "--bind /scratch/runs/exp/run,/opt/aws-ofi-nccl/lib" in script


def test_charliecloud_refuses_read_only_binds():
    data = dict(shipped("generic-slurm").model_dump(), container={"kind": "charliecloud", "binds": ["/p:/p:ro"]})
    with pytest.raises(ValueError, match="ch-run binds cannot be read-only"):
        Site.model_validate(data)


# -- architectures and vendors ----------------------------------------------------------------------

def test_aarch64_site_gets_the_aarch64_image_and_refuses_an_x86_only_stack(tmp_path, capsys):
    assert main(["run", "--site", "jupiter", "--nodes", "2", "--account", "p", "--dry-run"]) == 0
    assert "-aarch64" in capsys.readouterr().out
    profile = (SHIPPED_SITES_DIR / "jupiter.toml").read_text()
    data = tomllib.loads(profile)
    assert data["arch"] == "aarch64"
    paper = tmp_path / "jupiter-paper.toml"
    paper.write_text(profile.replace("[container]\n", '[container]\nstack = "paper"\n', 1) if "stack =" not in profile
                     else profile.replace('stack = "%s"' % data["container"]["stack"], 'stack = "paper"'))
    capsys.readouterr()
    assert main(["run", "--site", str(paper), "--nodes", "2", "--account", "p", "--dry-run"]) == 2
    assert "aarch64" in capsys.readouterr().err and "paper" in paper.read_text()


def test_amd_site_gets_a_rocm_image_and_refuses_dali(capsys):
    assert main(["run", "--site", "frontier", "--nodes", "2", "--account", "p", "--dry-run"]) == 0
    assert "rocm-ddp-x86_64" in capsys.readouterr().out
    assert main(["run", "--site", "frontier", "--nodes", "2", "--account", "p", "--loader", "dali",
                 "--data", "/lustre/imagenet", "--dry-run"]) == 2
    assert "--loader dali" in capsys.readouterr().err


# -- profiles ----------------------------------------------------------------------------------------

V1 = '''name = "old"
description = "a profile of the first schema"
based_on = ["x"]
scheduler = "slurm"
partition_directive = "qos"
gres = "gpu:4"
gpus_per_node = 4
cores_per_node = 32
gpu_vendor = "nvidia"
mpi_plugin = "pmix"
srun_args = ["--gpu-bind=closest"]
sbatch_directives = ["--constraint=gpu"]

[[partitions]]
name = "regular"
max_nodes = 8
max_time = "01:00:00"
default = true

[container]
runtime = "apptainer"
flags = ["--nv"]
'''
V2 = '''name = "old"
description = "a profile of the first schema"
based_on = ["x"]
gpus_per_node = 4
cores_per_node = 32
gpu_vendor = "nvidia"

[scheduler]
kind = "slurm"
gres = "gpu:4"
mpi_plugin = "pmix"
step_options = ["--gpu-bind=closest"]
directives = ["--constraint=gpu"]

[[scheduler.partitions]]
name = "regular"
partition = ""
qos = "regular"
max_nodes = 8
max_time = "01:00:00"
default = true

[container]
kind = "apptainer"
flags = ["--nv"]
'''


def test_profiles_of_the_first_schema_still_read(tmp_path):
    (tmp_path / "v1.toml").write_text(V1)
    (tmp_path / "v2.toml").write_text(V2)
    assert load_site(tmp_path / "v1.toml") == load_site(tmp_path / "v2.toml")
    script = script_for(load_site(tmp_path / "v1.toml"), LaunchRequest(site="old", framework="ddp", **REQUEST))
    assert "#SBATCH --qos=regular" in script and "--partition" not in script


def test_minimum_nodes_of_a_partition(tmp_path):
    leonardo = shipped("leonardo-booster")
    big = [p for p in leonardo.partitions if p.min_nodes > 1]
    assert big, "Leonardo's production QOS has a minimum node count"
    with pytest.raises(DlaunchError, match="takes jobs of %d nodes or more" % big[0].min_nodes):
        plan_for(leonardo, LaunchRequest(site="leonardo-booster", framework="ddp", partition=big[0].name,
                                         **dict(REQUEST, nodes=2)))


def test_every_shipped_profile_renders_for_every_framework_and_passes_bash_n():
    names = sorted(p.stem for p in SHIPPED_SITES_DIR.glob("*.toml"))
    assert len(names) >= 12
    for name in names:
        site = shipped(name)
        for framework in ("ddp", "horovod", "deepspeed"):
            nodes = None if site.scheduler.kind == "local" else max(2, site.partition(None).min_nodes)
            request = LaunchRequest(site=name, framework=framework, nodes=nodes, account="proj42", experiment="exp")
            subprocess.run(["bash", "-n"], input=script_for(site, request), text=True, check=True)


# -- task-per-worker engines ------------------------------------------------------------------------

def test_parameter_server_job_places_coordinator_servers_and_workers():
    """2 nodes x (1 worker + 1 server) + 1 coordinator = 5 tasks that Slurm places; the engine's own
    interpreter; every task learns the hosts and the port base from the batch script."""
    data = shipped("generic-slurm").model_dump()
    data.update(container={"kind": "none"}, gpus_per_node=1, interpreters={"mxnet": "/opt/mx/bin/python"})
    site = Site.model_validate(data)
    script = script_for(site, LaunchRequest(site="generic-slurm", framework="mx-ps-async", **REQUEST))
    assert "#SBATCH --ntasks=5" in script and "--ntasks-per-node" not in script
    assert 'DLAUNCH_NODELIST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)"' in script
    assert "srun --ntasks=5 --kill-on-bad-exit=1 \\\n  bash -c " in script
    assert "dlaunch-task \\\n  /opt/mx/bin/python -m dlaunch.train.mx \\\n  --framework mx-ps-async" in script
    assert "--checkpoint-dir" not in script and "--overcommit" not in script  # no checkpoints; 32 cores per node
    allreduce = script_for(site, LaunchRequest(site="generic-slurm", framework="tf-allreduce", **REQUEST))
    assert "#SBATCH --ntasks-per-node=1" in allreduce and "python -m dlaunch.train.tf" in allreduce
    small = Site.model_validate(dict(data, cores_per_node=2))  # 2 x (1 + 1) + 1 tasks on 2-CPU nodes
    assert script_for(small, LaunchRequest(site="generic-slurm", framework="mx-ps-sync", **REQUEST)).count("--overcommit") == 2
    with pytest.raises(DlaunchError, match="--amp bf16: not supported by the tensorflow trainer"):
        plan_for(site, LaunchRequest(site="generic-slurm", framework="tf-allreduce", **dict(REQUEST, trainer=(("amp", "bf16"),))))


def test_engine_modes_that_cannot_run_are_refused_with_the_reason(capsys, monkeypatch):
    import dataclasses

    from dlaunch.train.framework_table import FRAMEWORKS

    row = dataclasses.replace(FRAMEWORKS["mx-allreduce"], refused="Horovod does not build against this MXNet")
    monkeypatch.setitem(FRAMEWORKS, "mx-allreduce", row)  # a row as the table marks a combination that cannot run
    assert main(["run", "--site", "generic-slurm", "--framework", "mx-allreduce", "--nodes", "2", "--dry-run"]) == 2
    assert "dlaunch: error: --framework mx-allreduce: Horovod does not build against this MXNet" in capsys.readouterr().err
    assert main(["run", "--site", "local", "--framework", "mx-ps-sync", "--dry-run"]) == 0  # the local step starts its tasks
    # the engine's own interpreter (the local profile's, the one scripts/bootstrap-engines.sh makes) under the local step
    shown = capsys.readouterr().out
    assert re.search(r"exec python -m dlaunch\.schedulers\.local --tasks 4 -- \S*python -m dlaunch\.train\.mx", shown), shown
