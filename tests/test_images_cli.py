"""`dlaunch images` (launcher/images.py) and `default_image` (launcher/imagepaths.py), run through typer on a tiny app."""
import json
import os
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from launcher import images

app = typer.Typer()
app.command("images")(images.images_command)


@app.callback()
def _group() -> None:
    """Keeps `images` a sub-command, as in dlaunch."""


def invoke(*args, **env):
    return CliRunner().invoke(app, ["images", *args], env={"COLUMNS": "1000", **env})


@pytest.fixture
def images_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DLAUNCH_IMAGES_DIR", str(tmp_path / "sif"))
    return tmp_path / "sif"


SITE = """name = "{name}"
description = "test site"
based_on = ["tests"]
scheduler = "slurm"
gpus_per_node = 4
cores_per_node = 48
gpu_vendor = "nvidia"
[[partitions]]
name = "booster"
max_nodes = 4
max_time = "1:00:00"
default = true
[container]
runtime = "{runtime}"
"""


@pytest.fixture
def sites_dir(tmp_path, monkeypatch):
    """Site profiles `booster` (apptainer) and `bare` (no container), besides the shipped ones."""
    folder = tmp_path / "sites"
    folder.mkdir()
    (folder / "booster.toml").write_text(SITE.format(name="booster", runtime="apptainer"))
    (folder / "bare.toml").write_text(SITE.format(name="bare", runtime="none"))
    monkeypatch.setenv("DLAUNCH_SITES_DIR", str(folder))
    return folder


def test_default_image_is_repo_images_stack_framework(monkeypatch):
    monkeypatch.delenv("DLAUNCH_IMAGES_DIR", raising=False)
    assert images.default_image("horovod") == images.REPO / "images" / "current-horovod.sif"
    assert images.default_image("ddp", "paper") == images.REPO / "images" / "paper-ddp.sif"


def test_default_image_honours_dlaunch_images_dir(images_dir):
    assert images.default_image("deepspeed", "paper") == images_dir / "paper-deepspeed.sif"


@pytest.mark.parametrize("framework,stack", [("tensorflow", "current"), ("ddp", "../x")])
def test_default_image_rejects_bad_names(framework, stack):
    with pytest.raises(ValueError, match="framework|stack"):
        images.default_image(framework, stack)


def test_lists_missing_images_with_pins_from_the_lock(images_dir, sites_dir):
    result = invoke(PATH="/nonexistent")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if ".sif" in line]
    assert len(rows) == 2 * len(images.FRAMEWORKS)
    assert all("missing" in row and " lock " in row for row in rows)
    paper_horovod = next(row for row in rows if "paper-horovod.sif" in row)
    for pin in ("torch=1.11.0+cu115", "horovod=0.24.3", "openmpi=4.1.2", "python=3.9", "nvidia-dali-cuda110=1.12.0"):
        assert pin in paper_horovod
    current_deepspeed = next(row for row in rows if "current-deepspeed.sif" in row)
    assert "deepspeed=0.19.8" in current_deepspeed and "horovod=" not in current_deepspeed


def test_lists_the_sites_using_each_stack(images_dir, sites_dir):
    rows = [line for line in invoke().output.splitlines() if ".sif" in line]
    assert all(("booster" in row) == ("current-" in row) and "bare" not in row for row in rows)
    result = invoke("--site", "booster")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if ".sif" in line]
    assert len(rows) == 3 and all("booster" in row and "current-" in row for row in rows)


@pytest.mark.parametrize("site,message", [
    ("nowhere", "--site: unknown site 'nowhere'"),
    ("bare", "--site: site bare runs without a container"),
])
def test_bad_site_is_a_one_line_error_with_exit_2(site, message, images_dir, sites_dir):
    result = invoke("--site", site)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlaunch: error: " + message)


def test_existing_image_without_apptainer_shows_lock_pins(images_dir, sites_dir):
    images_dir.mkdir()
    (images_dir / "paper-ddp.sif").write_bytes(b"not really an image")
    result = invoke(PATH="/nonexistent")
    row = next(line for line in result.output.splitlines() if "paper-ddp.sif" in line)
    assert " yes " in row and "no apptainer to inspect" in row and "torch=1.11.0+cu115" in row


def test_fake_apptainer_inspect_labels_are_the_pins_of_a_built_image(images_dir, sites_dir, tmp_path):
    images_dir.mkdir()
    (images_dir / "current-ddp.sif").write_bytes(b"sif")
    labels = {"org.dlaunch.pin.torch": "2.4.0a0+07cecf4168", "org.dlaunch.git-revision": "abc123", "other": "x"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    reply = json.dumps({"data": {"attributes": {"labels": labels}}})
    fake.write_text(f"#!/bin/sh\n[ \"$1 $2 $3\" = 'inspect --labels --json' ] || exit 9\necho '{reply}'\n")
    fake.chmod(0o755)
    result = invoke(PATH=f"{bin_dir}:{os.environ['PATH']}")
    row = next(line for line in result.output.splitlines() if "current-ddp.sif" in line)
    assert "image (rev abc123)" in row and "torch=2.4.0a0+07cecf4168" in row and "other" not in row


def test_bad_lock_is_a_one_line_error_with_exit_2(images_dir, sites_dir, tmp_path, monkeypatch):
    lock = tmp_path / "versions.toml"
    lock.write_text(images.LOCK_PATH.read_text().replace('deepspeed = "0.19.8"', 'deepspeed = "*"'))
    monkeypatch.setattr(images, "LOCK_PATH", lock)
    result = invoke()
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "stacks.current.pip: deepspeed.deepspeed = '*'" in lines[0] and str(lock) in lines[0]


def test_render_writes_the_definition_files(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "CONTAINERS", tmp_path)
    result = invoke("--render")
    assert result.exit_code == 0, result.output
    expected = images.render_all(images.load_lock())
    assert len(expected) == 2 * len(images.FRAMEWORKS)
    for path, text in expected.items():
        assert path.parent.parent == tmp_path and path.read_text() == text


def test_launcher_images_does_not_import_torch():
    code = "import sys, launcher.images; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=images.REPO)
