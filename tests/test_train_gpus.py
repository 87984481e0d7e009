"""The trainer refuses, before NCCL starts, a node whose workers outnumber the GPUs they see. There is no GPU
here: the tests stub torch's device count (FAKE_CUDA below, named as such) and set CUDA_VISIBLE_DEVICES as a
site that binds one GPU per task would."""
import os
import subprocess
import sys
import textwrap

import pytest

from dlaunch.train.config import ConfigError
from dlaunch.train.gpus import device_index

JSC_LIKE = {"CUDA_VISIBLE_DEVICES": "0"}  # psslurm's view of a task bound to one GPU


@pytest.mark.parametrize("local_rank, workers, visible, one_launcher, expected", [
    (3, 4, 4, True, 3),  # torchrun on a node whose task sees its 4 GPUs
    (3, 4, 4, False, 3),  # a task per GPU, each sees the node's 4
    (3, 4, 1, False, 0),  # a task per GPU, each sees its own (--gpus-per-task=1)
    (1, 2, 4, True, 1),  # --gpus 2 on a 4-GPU node
])
def test_each_worker_takes_a_gpu_of_its_own(local_rank, workers, visible, one_launcher, expected):
    assert device_index(local_rank, workers, visible, one_launcher, {}) == expected


def test_workers_of_one_launcher_that_see_one_gpu_are_refused_naming_the_cause():
    with pytest.raises(ConfigError, match=r"this node's launcher starts 4 workers, but they see 1 GPU\(s\) "
                                          r"\(CUDA_VISIBLE_DEVICES=0\): the site probably binds one GPU per task; "
                                          r"set binds_gpu_per_task = true"):
        device_index(2, 4, 1, True, JSC_LIKE)


def test_tasks_that_see_some_but_not_all_gpus_are_refused():
    with pytest.raises(ConfigError, match=r"this node runs 4 tasks that see 2 GPUs each"):
        device_index(2, 4, 2, False, {"CUDA_VISIBLE_DEVICES": "0,1"})


# A process whose torch believes in CUDA devices it does not have: FAKE_CUDA stubs is_available and
# device_count, and init_process_group fails the test if reached (the refusal must come first).
FAKE_CUDA = textwrap.dedent("""
    import sys, torch, torch.distributed
    torch.cuda.is_available = lambda: True
    visible = int(sys.argv.pop(1))
    torch.cuda.device_count = lambda: visible
    def no_nccl(*args, **kwargs):
        raise SystemExit("init_process_group reached")
    torch.distributed.init_process_group = no_nccl
    from dlaunch.train.__main__ import main
    sys.exit(main())
""")


@pytest.mark.parametrize("framework", ["ddp", "deepspeed"])
def test_the_trainer_exits_2_before_nccl_when_torchrun_workers_share_one_visible_gpu(tmp_path, framework):
    if framework == "deepspeed":
        pytest.importorskip("deepspeed")
    env = dict(os.environ, TORCHELASTIC_RUN_ID="42", RANK="2", LOCAL_RANK="2", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", **JSC_LIKE)
    ran = subprocess.run([sys.executable, "-c", FAKE_CUDA, "1", "--framework", framework, "--data", "synthetic",
                          "--steps", "1", "--metrics", str(tmp_path / "m.jsonl")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 2, ran.stderr
    assert "train: error: this node's launcher starts 4 workers, but they see 1 GPU(s) (CUDA_VISIBLE_DEVICES=0)" in ran.stderr
    assert "init_process_group reached" not in ran.stderr and not (tmp_path / "m.jsonl").exists()


def test_one_task_per_gpu_takes_its_rank_from_the_tasks_neutral_variables():
    from dlaunch.train.frameworks.ddp import rank_environment

    task = {"DLAUNCH_NTASKS": "8", "DLAUNCH_TASK_ID": "5", "DLAUNCH_LOCAL_TASK_ID": "1", "DLAUNCH_NODE_ID": "1",
            "DLAUNCH_NODELIST": "n1,n2", "DLAUNCH_TASKS_PER_NODE": "4(x2)"}
    assert rank_environment(task) == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert rank_environment(dict(task, RANK="3")) == {}  # torchrun's workers keep torchrun's
    assert rank_environment({}) == {}  # outside a job step: a job of one
