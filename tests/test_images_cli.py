"""`dlaunch images` (dlaunch/cli/images.py over dlaunch/api/machines.py's `images`, dlaunch/jobs/images.py) and `default_image`
(dlaunch/jobs/imagepaths.py)."""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace
from unittest import mock

import pytest

from dlaunch.cli import main
from dlaunch.jobs import imagepaths
from dlaunch.jobs import images
from dlaunch.errors import DlaunchError
from dlaunch.jobs.sites import Site


def invoke(*args, **env):
    """`dlaunch images ARGS` in this process, with `env` added to its environment; its exit code and output."""
    with mock.patch.dict(os.environ, {"COLUMNS": "1000", **env}), contextlib.redirect_stdout(io.StringIO()) as output, \
            contextlib.redirect_stderr(output):
        code = main(["images", *args])
    return SimpleNamespace(exit_code=code, output=output.getvalue())


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


def test_default_image_is_repo_images_stack_framework_arch(monkeypatch):
    monkeypatch.delenv("DLAUNCH_IMAGES_DIR", raising=False)
    assert imagepaths.default_image("horovod") == images.REPO / "images" / "current-horovod-x86_64.sif"
    assert imagepaths.default_image("ddp", "paper") == images.REPO / "images" / "paper-ddp-x86_64.sif"
    assert imagepaths.default_image("ddp", "current", "aarch64") == images.REPO / "images" / "current-ddp-aarch64.sif"


def test_default_image_honours_dlaunch_images_dir(images_dir):
    assert imagepaths.default_image("deepspeed", "paper") == images_dir / "paper-deepspeed-x86_64.sif"


@pytest.mark.parametrize("kind,expected", [
    ("sif", "{dir}/cpu-ddp-aarch64.sif"), ("sqsh", "{dir}/cpu-ddp-aarch64.sqsh"), ("dir", "{dir}/cpu-ddp-aarch64"),
    ("edf", "{dir}/cpu-ddp-aarch64.toml"), ("name", "dlaunch/cpu-ddp:aarch64"),
])
def test_image_reference_per_runtime_image_kind(kind, expected, images_dir):
    assert imagepaths.image_reference("ddp", "cpu", "aarch64", kind) == expected.format(dir=images_dir)


@pytest.mark.parametrize("framework,stack,arch", [("tf-allreduce", "current", "x86_64"), ("ddp", "../x", "x86_64"),
                                                  ("ddp", "current", "ppc64le")])
def test_default_image_rejects_bad_names(framework, stack, arch):
    with pytest.raises(ValueError, match="image|stack|architecture"):
        imagepaths.default_image(framework, stack, arch)


def fake_site(name="s", arch=None, gpu_vendor="nvidia", stack="current", kind="apptainer", driver=None, **container):
    """A site profile (validated as `sites.py` reads one) with what imagepaths reads; defaults x86_64, no driver."""
    profile = dict(name=name, description="test", based_on=["test"], gpus_per_node=4, cores_per_node=8,
                   gpu_vendor=gpu_vendor, scheduler={"kind": "slurm", "partitions": [
                       {"name": "p", "max_nodes": 2, "max_time": "01:00:00", "default": True}]},
                   container=dict({"kind": kind}, **({} if kind == "none" else dict(stack=stack, **container))))
    if arch:
        profile["arch"] = arch
    if driver:
        profile["driver"] = driver
    return Site.model_validate(profile)


@pytest.mark.parametrize("arch,vendor,stack,kind,image", [
    (None, "nvidia", "current", "apptainer", "{dir}/current-ddp-x86_64.sif"),
    ("aarch64", "nvidia", "current", "pyxis", "{dir}/current-ddp-aarch64.sqsh"),
    ("aarch64", "none", "cpu", "charliecloud", "{dir}/cpu-ddp-aarch64"),
    ("x86_64", "amd", "rocm", "apptainer", "{dir}/rocm-ddp-x86_64.sif"),
    ("x86_64", "nvidia", "cpu", "podman-hpc", "dlaunch/cpu-ddp:x86_64"),
])
def test_default_image_for_site_names_the_architecture_and_kind(arch, vendor, stack, kind, image, images_dir):
    site = fake_site(arch=arch, gpu_vendor=vendor, stack=stack, kind=kind)
    assert imagepaths.default_image_for_site(site, "ddp") == image.format(dir=images_dir)


def test_default_image_for_site_takes_the_runtimes_image_kind(images_dir):
    site = fake_site(kind="pyxis", arch="aarch64", environment=True)  # CSCS: an environment definition file
    assert imagepaths.default_image_for_site(site, "horovod") == str(images_dir / "current-horovod-aarch64.toml")


def test_v1_site_reads_runtime_and_defaults_to_x86_64(images_dir):
    site = Site.model_validate(dict(name="old", description="v1", based_on=["test"], scheduler="slurm",
                                    partitions=[{"name": "p", "max_nodes": 2, "max_time": "01:00:00", "default": True}],
                                    gpus_per_node=4, cores_per_node=8, gpu_vendor="nvidia",
                                    container={"runtime": "apptainer", "stack": "paper"}))
    assert imagepaths.default_image_for_site(site, "ddp") == str(images_dir / "paper-ddp-x86_64.sif")


@pytest.mark.parametrize("arch,vendor,stack,message", [
    ("aarch64", "nvidia", "paper", "site s is aarch64, and image stack 'paper' exists only for x86_64"),
    ("aarch64", "amd", "rocm", "site s is aarch64, and image stack 'rocm' exists only for x86_64"),
    ("x86_64", "amd", "current", "site s has amd GPUs, and image stack 'current' is a CUDA build"),
    ("x86_64", "nvidia", "rocm", "site s has nvidia GPUs, and image stack 'rocm' is a ROCm build"),
    ("x86_64", "nvidia", "nope", "no image stack 'nope'"),
])
def test_wrong_stack_for_the_site_is_a_dlaunch_error(arch, vendor, stack, message):
    with pytest.raises(DlaunchError) as err:
        imagepaths.default_image_for_site(fake_site(arch=arch, gpu_vendor=vendor, stack=stack), "ddp")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("framework,group", [("tf-allreduce", "tensorflow"), ("tf-ps-sync", "tensorflow"),
                                             ("mx-allreduce", "mxnet"), ("mx-ps-async", "mxnet")])
def test_engine_images_are_the_cpu_stacks_and_other_stacks_name_it(framework, group, images_dir):
    cpu = fake_site(gpu_vendor="none", stack="cpu", kind="charliecloud")
    assert imagepaths.default_image_for_site(cpu, framework) == str(images_dir / f"cpu-{group}-x86_64")
    for stack in ("current", "paper"):
        with pytest.raises(DlaunchError) as err:
            imagepaths.default_image_for_site(fake_site(stack=stack), framework)
        message = str(err.value)
        assert f"--framework {framework}: image stack '{stack}' (site s) has no image of the" in message
        assert f"stacks with it: cpu (make image-{group} STACK=cpu)" in message and "--image" in message
        assert "\n" not in message


def test_image_names_give_back_their_stack_also_for_engine_images(images_dir):
    assert imagepaths.stack_of_image(imagepaths.image_reference("mxnet", "cpu", "x86_64", "dir")) == "cpu"
    assert imagepaths.stack_of_image("dlaunch/cpu-tensorflow:aarch64") == "cpu"
    assert imagepaths.stack_of_image("/x/cpu-tf-allreduce-x86_64.sif") is None  # a framework, not an image group


def test_site_without_a_container_has_no_default_image():
    with pytest.raises(DlaunchError, match="runs without a container"):
        imagepaths.default_image_for_site(fake_site(kind="none"), "ddp")


@pytest.mark.parametrize("driver,warns", [("535.104", True), ("575.57", True), ("580.65", False), ("590", False),
                                          (None, False)])
def test_driver_older_than_the_stacks_floor_warns(driver, warns):
    warning = imagepaths.driver_warning(fake_site(driver=driver))
    assert bool(warning) == warns
    if warns:
        assert f"states driver {driver}" in warning and "R580" in warning


def test_paper_stack_states_no_driver_floor():
    assert imagepaths.driver_warning(fake_site(driver="470.57", stack="paper")) is None


@pytest.mark.parametrize("vendor,loader,refused", [("amd", "dali", True), ("amd", "native", False),
                                                   ("nvidia", "dali", False), ("none", "native", False)])
def test_dali_loader_is_refused_on_amd_sites(vendor, loader, refused):
    site = fake_site(gpu_vendor=vendor)
    if refused:
        with pytest.raises(DlaunchError, match="--loader dali: site s has AMD GPUs"):
            imagepaths.check_loader(site, loader)
    else:
        imagepaths.check_loader(site, loader)


def rows_of(output):
    """Table rows (each names its image, `<stack>-<framework>-<arch>`)."""
    return [line for line in output.splitlines() if re.search(r"-(x86_64|aarch64) ", line)]


def test_lists_every_stack_per_architecture_with_pins_from_the_lock(images_dir, sites_dir):
    result = invoke(PATH="/nonexistent")
    assert result.exit_code == 0, result.output
    rows = rows_of(result.output)
    lock = images.load_lock()
    assert len(rows) == sum(len(stack.architectures) * len(stack.image_groups()) for stack in lock.stacks.values())
    for name in ("cpu-tensorflow-x86_64", "cpu-mxnet-aarch64"):
        assert any(f"{name} " in row for row in rows), name
    assert not any("current-tensorflow" in row or "paper-mxnet" in row for row in rows)
    assert f"dlaunch images in {images_dir}" in result.output
    assert all("missing" in row and " lock " in row for row in rows)
    for name in ("cpu-ddp-x86_64", "cpu-ddp-aarch64", "current-ddp-aarch64", "rocm-horovod-x86_64", "paper-ddp-x86_64"):
        assert any(f"{name} " in row for row in rows), name
    assert not any("paper-ddp-aarch64" in row or "rocm-ddp-aarch64" in row for row in rows)
    paper_horovod = next(row for row in rows if "paper-horovod-x86_64" in row)
    for pin in ("torch=1.11.0+cu115", "horovod=0.24.3", "openmpi=4.1.2", "python=3.9", "nvidia-dali-cuda110=1.12.0"):
        assert pin in paper_horovod
    current_deepspeed = next(row for row in rows if "current-deepspeed-aarch64" in row)
    assert "deepspeed=0.19.8" in current_deepspeed and "torch=2.10.0a0+b4e4ee81d3" in current_deepspeed
    assert "horovod=" not in current_deepspeed
    assert "torch=2.14.1" in next(row for row in rows if "cpu-ddp-x86_64" in row)


def test_lists_the_sites_using_each_stack(images_dir, sites_dir):
    rows = rows_of(invoke().output)
    assert all(("booster" in row) == ("current-" in row and "x86_64" in row) and "bare" not in row for row in rows)
    result = invoke("--site", "booster")
    assert result.exit_code == 0, result.output
    rows = rows_of(result.output)
    assert len(rows) == 3 and all("booster" in row and "current-" in row and "x86_64" in row for row in rows)


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
    (images_dir / "paper-ddp-x86_64.sif").write_bytes(b"not really an image")
    result = invoke(PATH="/nonexistent")
    row = next(line for line in result.output.splitlines() if "paper-ddp-x86_64 " in line)
    assert " sif " in row and "no apptainer to inspect" in row and "torch=1.11.0+cu115" in row


def test_fake_apptainer_inspect_labels_are_the_pins_of_a_built_image(images_dir, sites_dir, tmp_path):
    images_dir.mkdir()
    (images_dir / "current-ddp-x86_64.sif").write_bytes(b"sif")
    labels = {"org.dlaunch.pin.torch": "2.4.0a0+07cecf4168", "org.dlaunch.git-revision": "abc123", "other": "x"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    reply = json.dumps({"data": {"attributes": {"labels": labels}}})
    fake.write_text(f"#!/bin/sh\n[ \"$1 $2 $3\" = 'inspect --labels --json' ] || exit 9\necho '{reply}'\n")
    fake.chmod(0o755)
    result = invoke(PATH=f"{bin_dir}:{os.environ['PATH']}")
    row = next(line for line in result.output.splitlines() if "current-ddp-x86_64 " in line)
    assert "image (rev abc123)" in row and "torch=2.4.0a0+07cecf4168" in row and "other" not in row


def test_an_unpacked_root_fs_shows_the_pins_of_its_labels(images_dir, sites_dir):
    """scripts/build-rootfs.py's images (Charliecloud directories) carry Apptainer's labels.json."""
    meta = images_dir / "cpu-ddp-x86_64" / ".singularity.d"
    meta.mkdir(parents=True)
    (meta / "labels.json").write_text(json.dumps({"org.dlaunch.pin.torch": "2.14.1", "org.dlaunch.git-revision": "f00"}))
    result = invoke(PATH="/nonexistent")
    row = next(line for line in result.output.splitlines() if "cpu-ddp-x86_64 " in line)
    assert " root fs " in row and "root fs (rev f00)" in row and "torch=2.14.1" in row and "numpy" not in row


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
    assert len(expected) == 4 * 3 + 2  # every stack's torch images, the cpu stack's TensorFlow and MXNet ones
    for path, text in expected.items():
        assert path.parent.parent == tmp_path and path.read_text() == text


def test_launcher_images_does_not_import_torch():
    code = "import sys, dlaunch.jobs.images; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=images.REPO)


def test_bootstrap_builds_horovod_with_the_cpu_stacks_pin_and_cxx_standard(tmp_path):
    """scripts/bootstrap*.sh take Horovod's pin and CMake workaround from the lock's cpu stack (that image
    reuses their wheel), through dlaunch/jobs/horovod_build.py: no copy in the scripts."""
    from dlaunch.jobs import horovod_build

    cpu = images.load_lock().stacks["cpu"]
    assignments = dict(line.split("=", 1) for line in horovod_build.settings("cpu", tmp_path))
    assert assignments["HOROVOD_VERSION"] == cpu.pip["horovod"]["horovod"]
    assert "CMAKE_TOOLCHAIN_FILE=%s/toolchain.cmake HOROVOD_WITH_PYTORCH=1" % tmp_path in assignments["HOROVOD_BUILD_ENV"]
    assert '"-std=%s"' % cpu.horovod_cxx_std in (tmp_path / "cxx-standard.cmake").read_text()
    mxnet = dict(line.split("=", 1) for line in horovod_build.settings("cpu", tmp_path / "mx", "mxnet"))
    assert mxnet["HOROVOD_VERSION"] == assignments["HOROVOD_VERSION"]
    assert "HOROVOD_WITH_MXNET=1" in mxnet["HOROVOD_BUILD_ENV"] and "CMAKE_TOOLCHAIN_FILE" not in mxnet["HOROVOD_BUILD_ENV"]
    assert mxnet["HOROVOD_BUILD_ENV"].strip("'") in images.render_definition("cpu", cpu, "mxnet")  # as its image builds it
    assert not (tmp_path / "mx").exists()
    for script in ("bootstrap.sh", "bootstrap-engines.sh"):
        text = (images.REPO / "scripts" / script).read_text()
        assert not re.search(r"HOROVOD_VERSION=[0-9]|CMAKE_CXX14|HOROVOD_WITH_(PYTORCH|MXNET)", text), script
    assert horovod_build.main(["cpu", str(tmp_path), "tensorflow"]) == 2
