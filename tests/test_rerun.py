"""`dlaunch rerun`: a result's request resolved on another site, the differences printed, the parent linked."""
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers_train import TINY, run_trainer
from dlaunch.train.metrics_schema import abstract_request, make_record, read_metrics

REPO = Path(__file__).resolve().parents[1]
DLAUNCH = ("import sys; from dlaunch.cli import app, main; from dlaunch.cli.rerun import rerun_command; "
           "app.command('rerun')(rerun_command); sys.exit(main(sys.argv[1:]))")


def dlaunch(cwd: Path, *args: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SBATCH_ACCOUNT", "DLAUNCH_PARENT_RUN")}
    env.update(PYTHONPATH=str(REPO), COLUMNS="200", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", DLAUNCH, *(str(a) for a in args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def rows(stdout: str):
    """attribute -> (parent, rerun) from the differences table."""
    found = {}
    for line in stdout.split("what differs", 1)[1].splitlines():
        cells = re.split(r"\s{2,}", line.strip())  # fit_table's columns: 2 spaces apart
        if len(cells) == 3 and cells[0] and cells[0] != "attribute":
            found[cells[0]] = (cells[1], cells[2])
    return found


def local_result(tmp_path: Path) -> Path:
    """A real run of the trainer on this machine (site local, whose script exports its scheduler), 3 steps."""
    metrics = tmp_path / "run" / "metrics.jsonl"
    result = run_trainer(TINY + ["--data", "synthetic", "--steps", "3", "--metrics", str(metrics), "--seed", "7",
                                 "--checkpoint-dir", str(tmp_path / "run" / "checkpoints"), "--site", "local"],
                         env={"DLAUNCH_SCHEDULER": "local"})
    assert result.returncode == 0, result.stderr[-2000:]
    return metrics


def test_a_metrics_file_alone_is_rerun_on_jureca_with_the_differences(tmp_path):
    metrics = local_result(tmp_path)
    header = read_metrics(str(metrics)).header
    assert header["request"]["options"]["model"] == "resnet18" and header["request"]["options"]["seed"] == 7
    assert "metrics" not in header["request"]["options"]  # the run directory's, not the request's
    alone = tmp_path / "empty"
    alone.mkdir()
    shutil.copy(metrics, alone / "metrics.jsonl")
    result = dlaunch(alone, "rerun", "metrics.jsonl", "--site", "jureca-dc", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash") and "--model resnet18" in result.stdout and "--seed 7" in result.stdout
    assert "what differs" not in result.stdout  # `--dry-run > job.sh` is the script alone: the table is on stderr
    assert subprocess.run(["bash", "-n"], input=result.stdout, text=True).returncode == 0
    diff = rows(result.stderr)
    assert diff["site"] == ("local", "jureca-dc")
    assert diff["scheduler"] == ("local", "slurm")
    assert diff["image"][0] == "-" and diff["image"][1].endswith(".sif")
    assert diff["version torch"][1] == "the image's (known when it runs)"
    assert "--model" not in diff  # the same request
    assert sorted(p.name for p in alone.iterdir()) == ["metrics.jsonl"]  # a dry run writes nothing


def test_gpus_and_nodes_change_the_shape_and_are_listed(tmp_path):
    metrics = local_result(tmp_path)
    result = dlaunch(tmp_path, "rerun", metrics, "--site", "jureca-dc", "--gpus", "8", "--dry-run")
    assert result.returncode == 0, result.stderr
    diff = rows(result.stderr)
    assert diff["nodes"] == ("1", "2") and diff["GPUs (world size)"] == ("1", "8")
    assert diff["global batch"] == ("4", "32")
    both = dlaunch(tmp_path, "rerun", metrics, "--site", "jureca-dc", "--gpus", "8", "--nodes", "2", "--dry-run")
    assert both.returncode == 2 and "--nodes/--gpus" in both.stderr


def test_a_version_1_file_without_request_is_rerun_from_its_argv(tmp_path):
    """A file of a trainer before the package move (`python -m train`) is rerun with today's module."""
    header = make_record("header", 1.0, run_id="old", argv=["python", "-m", "train", "--model", "resnet44",
                                                            "--image-size", "32", "--metrics", "/gone/m.jsonl"],
                         config={"model": "resnet44", "image_size": 32, "metrics": "/gone/m.jsonl"},
                         framework="horovod", loader="native", model="resnet44", device="cuda", world_size=4, nodes=1,
                         hosts=["a"] * 4, batch_per_worker=64, global_batch=256, lr_scaled=0.1, versions={},
                         slurm_job_id="12", site="juwels-booster", experiment="old", image="/x.sif", git_revision=None)
    header["version"] = 1
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(header) + "\n")
    assert abstract_request(read_metrics(str(path)).header)["options"] == {"model": "resnet44", "image-size": 32}
    result = dlaunch(tmp_path, "rerun", path, "--site", "jureca-dc", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "--framework horovod" in result.stdout and "--image-size 32" in result.stdout
    assert "-m dlaunch.train" in result.stdout and "-m train " not in result.stdout
    assert "/gone/m.jsonl" not in result.stdout
    assert rows(result.stderr)["site"] == ("juwels-booster", "jureca-dc")


def test_a_rerun_here_links_its_parent(tmp_path):
    metrics = local_result(tmp_path)
    result = dlaunch(tmp_path, "rerun", tmp_path / "run", "--site", "local", "--output", tmp_path / "runs")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (run,) = (tmp_path / "runs").glob("*/*/plan.json")
    child = read_metrics(str(run.parent / "metrics.jsonl")).header
    assert child["parent_run"] == str(metrics.resolve())
    assert child["request"]["options"] == read_metrics(str(metrics)).header["request"]["options"]
    assert json.loads((run.parent / "parent.json").read_text())["parent"] == str(metrics.resolve())
    assert len(child["script_sha256"]) == 64
