"""`python -m dlaunch.train.loaderbench` (issue 48): the trainer's training loader alone, native and DALI on the CPU,
on a small generated JPEG folder: one JSON line per worker count with the images it timed and its rate."""

import json
import subprocess
import sys

import pytest

from dlaunch.train.data.make_folder import make_pattern_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpegs") / "data"
    make_pattern_folder(str(root), classes=2, images_per_class=24, val_per_class=2, size=48)
    return root


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlaunch.train.loaderbench", *args], capture_output=True, text=True,
                          timeout=240)


@pytest.mark.parametrize("loader", [["--loader", "native"], ["--loader", "dali", "--dali-device", "cpu"]])
def test_loaderbench_times_the_training_loader_alone(folder, loader):
    if "dali" in loader:
        pytest.importorskip("nvidia.dali")
    shown = _bench("--data", str(folder), *loader, "--workers", "1,2", "--batch-size", "4", "--image-size", "32",
                   "--batches", "6", "--warmup-batches", "2")
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [r["workers"] for r in lines] == [1, 2]
    for r in lines:
        assert r["loader"] == ("native" if "native" in loader else "dali-cpu")
        assert r["images"] == 6 * 4 and r["images_per_s"] == pytest.approx(r["images"] / r["seconds"])
        assert r["images_per_s_per_worker"] == pytest.approx(r["images_per_s"] / r["workers"])
        assert r["cores"] >= 1 and r["cpu"] and r["batch"] == 4 and r["image_size"] == 32


@pytest.mark.parametrize("args, message", [
    (["--workers", "1,x"], "--workers"),
    (["--batches", "100"], "--batches 100"),  # more than the folder holds
    (["--loader", "wood"], "--loader"),
])
def test_loaderbench_refuses_bad_input_in_one_line(folder, args, message):
    shown = _bench("--data", str(folder), "--batch-size", "4", "--workers", "1", *args)
    assert shown.returncode == 2 and message in shown.stderr and shown.stderr.count("\n") == 1 and not shown.stdout
