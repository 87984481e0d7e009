"""A scheduler, a container runtime and a framework added as one file and one registry row each, from the
test (tests/fake_scheduler.py, fake_runtime.py, fake_framework.py: test-only backends, named as such):
the job renders, `images` and `predict` know the framework, and the run's life (submit, status, logs,
why it failed) goes through the new scheduler's protocol against its fake commands."""
import os
import sys
import time
from pathlib import Path

import pytest

import fake_framework
import fake_scheduler
import dlaunch.cli
from dlaunch.cli import main
from dlaunch.runtimes import RUNTIMES
from dlaunch.schedulers import SCHEDULERS
from dlaunch.specs.registration import Registration
from dlaunch.schedulers.local import free_port_base
from test_launcher_fakes import install_fakes
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.train.metrics_schema import read_metrics

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TINY = ["--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--threads", "1", "--device", "cpu",
        "--steps", "3", "--steps-per-epoch", "3", "--warmup-steps", "1", "--workers", "0"]
# The fakes the new backends call: FakeBatch's step (tasks on this machine with its task variables) and
# the fakebox container (records image and binds, runs the command on the host).
FAKES = {
    "fakebatch-step": fake_scheduler.STEP,
    "fakebox": '''[ "$1" = run ] && [ "$2" = --bind ] || exit 64
echo "$4 $3" >> "$FAKEBATCH_SPOOL/fakebox"; shift 5; exec "$@"
''',
}


@pytest.fixture
def added(tmp_path, monkeypatch):
    """The three rows registered, their fakes on PATH, and a site profile that uses them."""
    monkeypatch.setitem(SCHEDULERS, "fakebatch", Registration("fake_scheduler:FakeBatch"))
    monkeypatch.setitem(RUNTIMES, "fakebox", Registration("fake_runtime:Fakebox"))
    monkeypatch.setitem(FRAMEWORKS, fake_framework.ROW.name, fake_framework.ROW)
    spool = tmp_path / "spool"
    spool.mkdir()
    fakes = install_fakes(tmp_path / "bin", FAKES)
    monkeypatch.setenv("PATH", "%s:%s:/usr/bin:/bin" % (fakes, os.path.dirname(sys.executable)))
    monkeypatch.setenv("FAKEBATCH_SPOOL", str(spool))
    monkeypatch.setenv("PYTHONPATH", "%s:%s" % (REPO, TESTS))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 300)
    (tmp_path / "fake.sif").write_text("")
    site = tmp_path / "added.toml"
    site.write_text("\n".join([
        'name = "added"', 'description = "test-only backends (tests/test_added_backends.py)"', 'based_on = ["tests"]',
        "gpus_per_node = 2", "cores_per_node = 2", 'gpu_vendor = "none"', "master_port = %d" % free_port_base(1),
        "[env]", 'GLOO_SOCKET_IFNAME = "lo"',
        "[scheduler]", 'kind = "fakebatch"', "[[scheduler.partitions]]", 'name = "q"', "max_nodes = 4",
        'max_time = "01:00:00"', "default = true",
        "[container]", 'kind = "fakebox"',
        "[network]", "latency_us = 2.0", "bandwidth_gbps_per_node = 200.0",
        "[predict]", "intra_node_gbps_per_gpu = 100.0", 'intra_node_source = "a test figure"', ""]))
    return site


def run(site: Path, *args: str) -> int:
    return main(["run", "--site", str(site), "--framework", "fake-ddp", "--gpus", "2", "--image", "fake.sif",
                 "--experiment", "e", *args] + TINY)


def test_render_images_and_predict_know_the_added_backends(added, capsys):
    assert run(added, "--dry-run") == 0
    script = capsys.readouterr().out
    assert "#FAKEBATCH --nodes=1" in script and "fakebatch-step 1" in script
    assert 'DLAUNCH_TASK_ID="$FAKEBATCH_TASK"' in script and 'export DLAUNCH_JOB_ID="$FAKEBATCH_JOB_ID"' in script
    assert "fakebox run --bind" in script and "-m fake_framework" in script and "--framework fake-ddp" in script
    assert main(["images"]) == 0
    listed = capsys.readouterr().out
    assert "current-fake-ddp-x86_64" in listed and "current-ddp-x86_64" in listed
    assert main(["predict", "--site", str(added), "--framework", "fake-ddp", "--model", "resnet50", "--compute-ms", "100",
                 "--batch", "64", "--gpus", "4,8"]) == 0
    assert "fake-ddp" in capsys.readouterr().out


def wait_for(spool: Path, job_id: str, timeout_s: float = 600) -> int:
    """The FakeBatch job's exit status once it has ended."""
    deadline = time.monotonic() + timeout_s
    while not (spool / ("%s.exit" % job_id)).is_file():
        assert time.monotonic() < deadline, "FakeBatch job %s did not end" % job_id
        time.sleep(0.5)
    return int((spool / ("%s.exit" % job_id)).read_text())


@pytest.mark.slow
def test_a_run_on_the_added_backends_submits_ends_and_explains_its_failure(added, capsys):
    spool = Path(os.environ["FAKEBATCH_SPOOL"])
    assert run(added, "--run-name", "ok") == 0
    assert wait_for(spool, "1") == 0, (Path("runs/e/ok/fakebatch-1.log")).read_text()[-3000:]
    metrics = read_metrics("runs/e/ok/metrics.jsonl")
    assert metrics.status == "ok" and metrics.header["framework"] == "fake-ddp" and metrics.header["world_size"] == 2
    assert metrics.header["scheduler"] == "fakebatch" and metrics.header["slurm_job_id"] == "1"
    assert (spool / "fakebox").read_text().split()[0] == str(added.parent / "fake.sif")
    capsys.readouterr()
    assert main(["status", "runs/e/ok"]) == 0
    assert " DONE " in capsys.readouterr().out
    assert main(["logs", "runs/e/ok"]) == 0
    assert "fakebatch-1.log" in capsys.readouterr().err
    # A run whose trainer refuses its input on the nodes: status and watch say why, from FakeBatch's log.
    assert run(added, "--run-name", "bad", "--data", "/nonexistent/imagenet") == 0
    assert wait_for(spool, "2") != 0
    capsys.readouterr()
    assert main(["status", "runs/e/bad"]) == 0
    shown = capsys.readouterr().out
    assert "EXIT" in shown and "runs/e/bad: fakebatch-2.log:" in shown and "train: error: " in shown
    assert main(["watch", "--once", "runs/e/bad"]) == 1
