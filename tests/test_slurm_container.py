"""`dlaunch` on the throw-away Slurm cluster with a Charliecloud site profile: the trainer runs inside the
cpu image (built from containers/cpu/*.def by scripts/build-rootfs.py) on two nodes, and Slurm's signals
reach it through `ch-run`."""
import os
import subprocess
from pathlib import Path

import pytest

import slurm
from holds import Hold
from test_slurm_dlaunch import DLAUNCH, JOB_TIMEOUT_S, TINY, dlaunch, epochs_written, job_id, log_text, wait_for
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow

ARCH = os.uname().machine


@pytest.fixture(scope="module")
def images_dir(cpu_image) -> Path:
    """DLAUNCH_IMAGES_DIR with cpu-ddp-<arch> and cpu-horovod-<arch> (links to the cached root fs builds)."""
    cpu_image("horovod")
    return cpu_image("ddp").parent


@pytest.fixture(scope="module")
def charliecloud_site(slurm_cluster: slurm.Cluster, tmp_path_factory) -> Path:
    """The cluster's profile with `[container] kind = "charliecloud"`, stack cpu: `--set-env` applies the
    image's /ch/environment (its PATH, over the job's); /tmp holds the run directories and Slurm's spool."""
    return slurm_cluster.site_profile(tmp_path_factory.mktemp("sites") / "slurm-charliecloud.toml",
                                      container={"kind": "charliecloud", "stack": "cpu", "flags": ["--set-env"], "binds": ["/tmp"]})


def run_in_container(cluster, cwd: Path, site: Path, images: Path, name: str, *args: str, **env: str) -> Path:
    ran = subprocess.run([DLAUNCH, "run", "--site", str(site),
                          "--experiment", "tests", "--run-name", name, "--time", "00:10:00", *TINY, *args],
                         cwd=cwd, capture_output=True, text=True, timeout=120,
                         # ch-run refuses to start without $USER, which a login shell always has and this
                         # test's environment may not
                         env=cluster.env(COLUMNS="300", DLAUNCH_IMAGES_DIR=str(images), USER=os.environ.get("USER", "root"),
                                         **env))
    assert ran.returncode == 0, ran.stderr
    return cwd / "runs" / "tests" / name


def assert_ran_in_the_image(run_dir: Path, framework: str, images: Path) -> None:
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.header["argv"][0] == "/opt/venv/bin/python", "the trainer ran outside the image"
    assert metrics.header["image"] == str(images / f"cpu-{framework}-{ARCH}")


@pytest.mark.parametrize("framework", ["ddp", "horovod"])
def test_two_node_job_runs_inside_the_cpu_image(framework, two_nodes, charliecloud_site, images_dir, tmp_path):
    run_dir = run_in_container(two_nodes, tmp_path, charliecloud_site, images_dir, framework,
                               "--framework", framework, "--nodes", "2", "--steps", "4")
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "ok" and metrics.header["world_size"] == 2 and len(metrics.epochs) == 2
    assert len(set(metrics.header["hosts"])) == 2
    assert_ran_in_the_image(run_dir, framework, images_dir)


def test_usr1_reaches_the_trainer_inside_the_container(two_nodes, charliecloud_site, images_dir, tmp_path):
    # held after its first epoch (the failpoint copied under the bound /tmp): the signal comes mid-run
    run_dir = run_in_container(two_nodes, tmp_path, charliecloud_site, images_dir, "warned", "--nodes", "2",
                               "--steps", "100000", **Hold(tmp_path).container_env())
    wait_for(lambda: epochs_written(run_dir) >= 1, "a first epoch")
    assert two_nodes.run(["scancel", "--signal=USR1", job_id(run_dir)]).returncode == 0
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "FAILED"  # exit 75: resumable
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "interrupted", log_text(run_dir)
    assert len(metrics.epochs) == 1  # held inside the image, stopped where the signal found it
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert_ran_in_the_image(run_dir, "ddp", images_dir)


def test_scancel_reaches_the_trainer_inside_the_container(two_nodes, charliecloud_site, images_dir, tmp_path):
    # held after its first epoch: the cancel comes between epochs, where the trainer stops at once (well
    # within the test cluster's KillWait of 5 s) instead of wherever a free-running job happened to be
    run_dir = run_in_container(two_nodes, tmp_path, charliecloud_site, images_dir, "cancelled", "--nodes", "2",
                               "--steps", "100000", **Hold(tmp_path).container_env())
    wait_for(lambda: epochs_written(run_dir) >= 1, "a first epoch")
    cancelled = dlaunch(two_nodes, tmp_path, "cancel", str(run_dir))
    assert cancelled.returncode == 0, cancelled.stderr
    assert two_nodes.wait_job(job_id(run_dir), 60) == "CANCELLED"
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "cancelled", log_text(run_dir)
    assert len(metrics.epochs) == 1
    assert_ran_in_the_image(run_dir, "ddp", images_dir)
