"""The container definition files, the version lock they are rendered from, and the Makefile fragment."""
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

from launcher import images

REPO = images.REPO
LOCK = images.load_lock()
CASES = [(stack, fw) for stack in LOCK.stacks for fw in images.FRAMEWORKS]
IDS = [f"{stack}-{fw}" for stack, fw in CASES]
REQUIRED_SECTIONS = {"arguments", "files", "labels", "environment", "post", "runscript", "test"}


def sections(text):
    """Section name -> body lines of a definition file."""
    found, name = {}, None
    for line in text.splitlines():
        match = re.match(r"^%(\w+)\s*$", line)
        if match:
            name = match.group(1)
            found[name] = []
        elif name is not None:
            found[name].append(line)
    return found


def definition(stack, framework):
    return images.definition_path(stack, framework).read_text()


def test_committed_definition_files_equal_the_rendered_ones():
    rendered = images.render_all(LOCK)
    committed = sorted((REPO / "containers").glob("*/*.def"))
    assert sorted(rendered) == committed, "definition files without a stack in the lock, or missing ones"
    for path, text in rendered.items():
        assert path.read_text() == text, f"{path} is stale: run `dlaunch images --render`"


@pytest.mark.parametrize("stack,framework", CASES, ids=IDS)
def test_definition_parses_with_spython_and_has_every_section(stack, framework):
    path = images.definition_path(stack, framework)
    recipe = SingularityParser(str(path)).recipe
    layer = recipe[max(recipe)] if isinstance(recipe, dict) else recipe
    assert layer.fromHeader == LOCK.stacks[stack].base_reference
    assert "train /opt/dlaunch/train" in layer.files
    assert layer.install and layer.test
    assert layer.cmd == 'exec python -m train "$@"'
    assert f"DLAUNCH_STACK={stack}" in layer.environ
    assert f"org.dlaunch.framework {framework}" in layer.labels
    assert "org.dlaunch.git-revision {{ GIT_REVISION }}" in layer.labels
    assert REQUIRED_SECTIONS <= set(sections(path.read_text()))


@pytest.mark.parametrize("stack,framework", CASES, ids=IDS)
def test_every_pin_of_the_lock_is_in_the_definition_with_exactly_that_version(stack, framework):
    lock_stack = LOCK.stacks[stack]
    body = sections(definition(stack, framework))
    labels = {line.strip() for line in body["labels"]}
    for name, version in lock_stack.pins(framework).items():
        assert f"org.dlaunch.pin.{name} {version}" in labels, (name, version)
    post = "\n".join(body["post"])
    for name, version in lock_stack.pip_pins(framework).items():
        assert re.search(rf"(^|\s){re.escape(name)}=={re.escape(version)}(\s|$)", post, re.M), (name, version)
    for name, version in lock_stack.build_pins(framework).items():
        assert f"{name}-{version}" in post, (name, version)


@pytest.mark.parametrize("stack,framework", CASES, ids=IDS)
def test_pip_installs_only_exact_pins_and_nothing_is_latest(stack, framework):
    text = definition(stack, framework)
    assert "latest" not in text.lower()
    base = LOCK.stacks[stack].base
    assert re.match(r"^[^@]+:[A-Za-z0-9._-]+$", base), "base image must be pinned by tag"
    pins = LOCK.stacks[stack].pip_pins(framework)
    installs = [line for line in sections(text)["post"] if "pip install" in line]
    assert bool(installs) == bool(pins)
    for line in installs:
        words = shlex.split(line)
        words = words[words.index("install") + 1:]
        packages = []
        while words:
            word = words.pop(0)
            if word == "--extra-index-url":
                words.pop(0)
            elif not word.startswith("-"):
                packages.append(word)
        assert packages, line
        for spec in packages:
            name, _, version = spec.partition("==")
            assert pins.get(name) == version, f"unpinned or off-lock install {spec!r}"


@pytest.mark.parametrize("shell", ["bash", "sh"])
@pytest.mark.parametrize("section", ["post", "test", "environment", "runscript"])
@pytest.mark.parametrize("stack,framework", CASES, ids=IDS)
def test_scripts_pass_syntax_check(stack, framework, section, shell, tmp_path):
    script = tmp_path / f"{section}.sh"
    script.write_text("\n".join(sections(definition(stack, framework))[section]) + "\n")
    result = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_horovod_cxx_standard_is_forced_only_where_the_lock_says():
    for stack_name, stack in LOCK.stacks.items():
        post = "\n".join(sections(definition(stack_name, "horovod"))["post"])
        assert "HOROVOD_GPU_OPERATIONS=NCCL" in post and "--no-build-isolation" in post
        assert ("CMAKE_TOOLCHAIN_FILE" in post) == bool(stack.horovod_cxx_std)
        if stack.horovod_cxx_std:
            assert f'-std={stack.horovod_cxx_std}' in post


@pytest.mark.parametrize("bad,field", [
    ('torch = "1.11.0+cu115"', 'torch = "latest"'),
    ('torch = "1.11.0+cu115"', 'torch = ">=1.11"'),
    ('base = "docker.io/nvidia/cuda:11.5.2-cudnn8-devel-ubuntu20.04"', 'base = "docker.io/nvidia/cuda:latest"'),
    ('base = "docker.io/nvidia/cuda:11.5.2-cudnn8-devel-ubuntu20.04"', 'base = "docker.io/nvidia/cuda"'),
    ('numpy = "1.22.4"', 'numpy = "1.22.4"\nbogus-key-without-quotes'),
])
def test_lock_rejects_unpinned_versions_with_a_one_line_error(bad, field, tmp_path):
    lock = tmp_path / "versions.toml"
    text = images.LOCK_PATH.read_text()
    assert bad in text
    lock.write_text(text.replace(bad, field, 1))
    with pytest.raises(images.LockError) as err:
        images.load_lock(lock)
    message = str(err.value)
    assert str(lock) in message and "\n" not in message


def test_lock_rejects_one_package_pinned_twice_differently(tmp_path):
    lock = tmp_path / "versions.toml"
    lock.write_text(images.LOCK_PATH.read_text().replace('packaging = "21.3"', 'packaging = "21.2"', 1))
    with pytest.raises(images.LockError, match="packaging"):
        images.load_lock(lock)


def _make(args, path, tmp_path):
    env = {**os.environ, "PATH": path, "DLAUNCH_IMAGES_DIR": str(tmp_path / "images")}
    env.pop("APPTAINER", None)
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, env=env, capture_output=True, text=True)


@pytest.fixture
def fake_apptainer(tmp_path):
    """A PATH whose `apptainer` only echoes its arguments (no Apptainer here)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text('#!/bin/sh\necho "fake-apptainer $*"\n')
    fake.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.mark.parametrize("stack,framework", CASES, ids=IDS)
def test_fake_apptainer_make_dry_run_prints_the_build_command(stack, framework, fake_apptainer, tmp_path):
    args = [f"image-{framework}"] + ([] if stack == "current" else [f"STACK={stack}"])
    result = _make(["-n", *args], fake_apptainer, tmp_path)
    assert result.returncode == 0, result.stderr
    build = [line for line in result.stdout.splitlines() if " build " in line]
    assert len(build) == 1, result.stdout
    words = shlex.split(build[0])
    assert words[0].endswith("fakebin/apptainer") and "--fakeroot" in words
    assert re.match(r"^GIT_REVISION=[0-9a-f]{40}(-dirty)?$", words[words.index("--build-arg") + 1])
    assert words[-2:] == [str(tmp_path / "images" / f"{stack}-{framework}.sif"), f"containers/{stack}/{framework}.def"]
    assert not (tmp_path / "images").exists()


def test_fake_apptainer_make_images_builds_all_three(fake_apptainer, tmp_path):
    result = _make(["images", "STACK=paper"], fake_apptainer, tmp_path)
    assert result.returncode == 0, result.stderr
    built = re.findall(r"^fake-apptainer build .* (\S+\.sif) (\S+\.def)$", result.stdout, re.M)
    assert [Path(sif).name for sif, _ in built] == ["paper-ddp.sif", "paper-horovod.sif", "paper-deepspeed.sif"]


def test_fake_apptainer_make_rejects_an_unknown_stack(fake_apptainer, tmp_path):
    result = _make(["image-ddp", "STACK=nope"], fake_apptainer, tmp_path)
    assert result.returncode != 0
    assert "unknown STACK (one of: current paper)" in result.stderr
    assert "fake-apptainer" not in result.stdout and not (tmp_path / "images").exists()


def test_make_without_apptainer_says_so_and_fails(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "git"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    result = _make(["image-horovod"], str(bin_dir), tmp_path)
    assert result.returncode != 0
    assert "neither apptainer nor singularity is on PATH" in result.stderr
    assert not (tmp_path / "images").exists()


@pytest.mark.slow
@pytest.mark.skipif(images.container_binary() is None, reason="no apptainer or singularity binary on this machine")
def test_build_the_smallest_image_and_run_its_test_section(tmp_path):
    """Builds current-ddp (the NGC base plus the trainer) and runs its %test inside the image."""
    result = subprocess.run(["make", "image-ddp", f"IMAGES_DIR={tmp_path}"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    image = tmp_path / "current-ddp.sif"
    tested = subprocess.run([images.container_binary(), "test", str(image)], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stderr[-4000:]
    labels = images.image_labels(image, images.container_binary())
    assert labels["org.dlaunch.stack"] == "current"
    assert re.match(r"^[0-9a-f]{40}", labels["org.dlaunch.git-revision"])
