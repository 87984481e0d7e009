"""Provenance shows only what a run used (issue 47 item 6): a CPU/gloo run of a CUDA build of torch records no CUDA,
cuDNN or NCCL version (it recorded `cuda 13.0, cudnn 92400, nccl None`), and the report's provenance leaves out a
library an older trainer recorded as absent (`nccl None`). A real CPU run's header: tests/test_interrupted_runs.py."""
import json

from typer.testing import CliRunner

from dlaunch.cli import app
from dlaunch.train.metrics import library_versions
from test_analysis import write_run


def test_a_cpu_run_records_python_and_torchs_versions_only():
    assert set(library_versions("cpu", ("gloo",))) == {"python", "torch", "torchvision"}
    assert set(library_versions("cpu", ("nccl",))) == {"python", "torch", "torchvision"}  # no GPU: no NCCL either


def test_a_gpu_run_records_the_toolkit_and_nccl_only_where_its_collectives_use_it():
    """On this machine (no GPU) the device type is given, not found: a fake of a GPU run's call."""
    gloo = library_versions("cuda", ("gloo",))
    assert "nccl" not in gloo and None not in gloo.values()
    assert set(gloo) & {"cuda", "hip"}  # the build's toolkit, which a GPU run uses


def test_the_reports_provenance_leaves_out_libraries_recorded_as_absent(tmp_path, results_db):
    for name, gpus in (("g1", 1), ("g2", 2)):
        path = write_run(tmp_path / "runs", name, gpus, [1.0, 10.0 * gpus])
        records = [json.loads(line) for line in path.read_text().splitlines()]
        records[0]["versions"] = {"python": "3.11.7", "torch": "2.14.1", "nccl": None, "cudnn": None}
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    shown = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "-o", str(tmp_path / "report")])
    assert shown.exit_code == 0, shown.output
    provenance = (tmp_path / "report" / "report.md").read_text().split("## Provenance")[1]
    assert "python 3.11.7, torch 2.14.1 |" in provenance and "None" not in provenance
