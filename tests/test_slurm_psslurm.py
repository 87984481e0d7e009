"""The test world differs from plain Slurm the way JSC's systems do: on the cluster's partition `psslurm` the
TaskProlog (scripts/psslurm-task-prolog.sh) shows each task of a step its own GPU of the node, as ParaStation's
psslurm does (psmgmt psslurmenv.c: setGPUEnv; the nodes' GPUs are pretend ones), and keeps a CUDA_VISIBLE_DEVICES
the job script set.

A job with one task per GPU (Horovod, a profile's `task-per-gpu` mode) whose ranks each see only their own GPU
cannot reach the node's other GPUs through CUDA IPC, so NCCL uses host memory instead of NVLink (NVIDIA/nccl#324,
#1066: 687 against 791 images/s per A100). JSC's scripts export all of the node's GPUs and each rank takes its
local rank's. No GPU here: the trainer runs on CPU, and each run's network record says what its ranks saw
(`visible_devices`). Before the launcher exported the GPUs for a task per GPU (only for torchrun per node), the
ranks of these jobs saw CUDA_VISIBLE_DEVICES=0 and =1: test_a_task_per_gpu_job_shows_every_rank_its_nodes_gpus
failed."""
import pytest
import slurm
from prerequisites import require_library
from test_slurm_dlaunch import JOB_TIMEOUT_S, job_id, log_text, submit

from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture
def psslurm(two_nodes: slurm.Cluster) -> slurm.Cluster:
    if not two_nodes.psslurm_partition or two_nodes.gpus_per_node != 2:
        pytest.skip("the cluster given by $SLURM_CONF has no psslurm-like partition with 2 GPUs per node (2 CPUs)")
    return two_nodes


def test_psslurm_binds_each_task_of_a_step_its_own_gpu_and_keeps_the_scripts_value(psslurm, tmp_path):
    """The test world itself: what the batch script, the tasks of a step and the lone task of a step see."""
    script = tmp_path / "job.sh"
    script.write_text("""#!/bin/bash
echo "batch:[$CUDA_VISIBLE_DEVICES]:[$__AUTO_CUDA_VISIBLE_DEVICES]"
show='echo "task $SLURM_NODEID.$SLURM_LOCALID:[${CUDA_VISIBLE_DEVICES-unset}]:[$PSSLURM_BIND_GPUS]:[${__AUTO_CUDA_VISIBLE_DEVICES-gone}]"'
echo "== two per node"
srun --ntasks-per-node=2 bash -c "$show" | sort
echo "== one per node"
srun --ntasks=2 --ntasks-per-node=1 bash -c "$show" | sort
export CUDA_VISIBLE_DEVICES=0,1
echo "== the script's value"
srun --ntasks-per-node=2 bash -c "$show" | sort
""")
    submitted = psslurm.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=2", "-p",
                             psslurm.psslurm_partition, "-o", str(tmp_path / "out"), str(script)])
    assert submitted.returncode == 0, submitted.stderr
    assert psslurm.wait_job(submitted.stdout.strip().split(";")[0]) == "COMPLETED", (tmp_path / "out").read_text()
    out = (tmp_path / "out").read_text()
    assert "batch:[0,1     ]:[0,1     ]" in out  # psslurm's padding marks the value as its own
    _, two, one, kept = out.split("== ")
    assert two.splitlines()[1:] == ["task %d.%d:[%d]:[%d]:[gone]" % (n, g, g, g) for n in (0, 1) for g in (0, 1)], out
    assert one.splitlines()[1:] == ["task 0.0:[0,1]:[0,1]:[gone]", "task 1.0:[0,1]:[0,1]:[gone]"], out
    assert kept.splitlines()[1:] == ["task %d.%d:[0,1]:[%d]:[gone]" % (n, g, g) for n in (0, 1) for g in (0, 1)], out


@pytest.mark.parametrize("framework", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod)])
def test_a_task_per_gpu_job_shows_every_rank_its_nodes_gpus(psslurm, tmp_path, framework):
    """What psslurm would do to a task per GPU: each rank its own GPU, unless the job script exported them all."""
    if framework == "horovod":
        require_library("horovod")
    launch = {"binds_gpu_per_task": True, "ddp": {"mode": "task-per-gpu"}}
    site = psslurm.site_profile(tmp_path / "psslurm-like.toml", gpus_per_node=2,
                                gpu_vendor="nvidia", partition=psslurm.psslurm_partition, extra={"launch": launch})
    run_dir = submit(psslurm, tmp_path, site, framework, "--framework", framework, "--nodes", "2", "--steps", "2")
    assert psslurm.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    records = read_metrics(str(run_dir / "metrics.jsonl")).header["network"]
    seen = {r["host"]: r.get("visible_devices") for r in records}
    assert sorted(seen) == sorted(psslurm.node_names[:2]), records
    assert all(v == ["CUDA_VISIBLE_DEVICES=0,1"] for v in seen.values()), seen
