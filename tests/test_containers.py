"""The container definition files, the version lock they are rendered from, and the Makefile fragment."""
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import importlib.util

import pytest

from dlaunch.jobs import images
from dlaunch.train.framework_table import FRAMEWORKS, group_engine, group_entry, image_groups, import_checks

REPO = images.REPO
_spec = importlib.util.spec_from_file_location("build_rootfs", REPO / "scripts" / "build-rootfs.py")
build_rootfs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_rootfs)
LOCK = images.load_lock()
CASES = [(stack, fw) for stack, lock_stack in LOCK.stacks.items() for fw in lock_stack.image_groups()]
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
    """spython (with build-rootfs.py's two overrides: debootstrap accepted, %test kept apart) reads every
    section as written: a body line with `bootstrap` or `from:` in it would cut a section short."""
    path = images.definition_path(stack, framework)
    text = path.read_text()
    recipe = build_rootfs.Recipe(str(path)).recipe
    assert len(recipe) == 1
    layer = next(iter(recipe.values()))
    lock_stack = LOCK.stacks[stack]
    if lock_stack.bootstrap == "docker":
        assert layer.fromHeader == lock_stack.base_reference
    else:
        header, _ = build_rootfs.parse(build_rootfs.substitute(text, path, {}), path)
        assert (header["osversion"], header["mirrorurl"]) == (lock_stack.base, lock_stack.mirror)
    body = sections(text)
    assert layer.install == [line.strip() for line in body["post"] if line.strip()]
    assert layer.test == [line.strip() for line in body["test"] if line.strip()]
    assert "dlaunch/train /opt/dlaunch/dlaunch/train" in layer.files
    assert layer.cmd == f'exec python -m {group_entry(framework)} "$@"'
    assert f"DLAUNCH_STACK={stack}" in layer.environ
    assert f"org.dlaunch.framework {framework}" in layer.labels
    assert "org.dlaunch.git-revision {{ GIT_REVISION }}" in layer.labels
    assert REQUIRED_SECTIONS <= set(body)


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
    if LOCK.stacks[stack].bootstrap == "docker":
        assert re.match(r"^[^@]+:[A-Za-z0-9._-]+$", base), "base image must be pinned by tag"
    else:
        assert base == "bookworm" and "Bootstrap: debootstrap" in text
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


def test_horovod_gpu_operations_and_cxx_standard_follow_the_lock():
    for stack_name, stack in LOCK.stacks.items():
        post = "\n".join(sections(definition(stack_name, "horovod"))["post"])
        test = "\n".join(sections(definition(stack_name, "horovod"))["test"])
        assert "HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1" in post and "--no-build-isolation" in post
        assert ("HOROVOD_GPU_OPERATIONS=NCCL" in post) == bool(stack.horovod_gpu)
        assert ("HOROVOD_GPU=ROCM" in post) == (stack.horovod_gpu == "rocm")
        assert ("hvd.nccl_built()" in test) == bool(stack.horovod_gpu)
        assert ("CMAKE_TOOLCHAIN_FILE" in post) == bool(stack.horovod_cxx_std)
        if stack.horovod_cxx_std:
            assert f'-std={stack.horovod_cxx_std}' in post


def test_dali_is_imported_only_by_stacks_that_have_it():
    for stack_name, stack in LOCK.stacks.items():
        for framework in stack.image_groups():
            test = "\n".join(sections(definition(stack_name, framework))["test"])
            assert ("nvidia.dali" in test) == bool(stack.dali_package), (stack_name, framework)
    assert not LOCK.stacks["rocm"].dali_package and not LOCK.stacks["cpu"].dali_package


def test_cpu_stack_is_a_debian_bootstrap_with_the_launchers_torch():
    """The cpu image runs the torch the launcher's tests run (pyproject.toml's pin), so CI tests one build."""
    cpu = LOCK.stacks["cpu"]
    pyproject = (REPO / "pyproject.toml").read_text()
    for name in ("torch", "torchvision", "numpy", "pillow", "nvidia-ml-py"):
        assert f'"{name}=={cpu.pip["common"][name]}"' in pyproject, name
    text = definition("cpu", "horovod")
    assert text.count("Bootstrap: debootstrap") == 1 and "OSVersion: bookworm" in text
    assert "openmpi-bin libopenmpi-dev" in text and "python3.11 -m venv /opt/venv" in text


def test_engine_images_are_in_the_cpu_stack_only_and_every_image_group_has_a_make_target():
    engines = {(stack, group) for stack, group in CASES if group_engine(group) != "torch"}
    assert engines == {("cpu", "tensorflow"), ("cpu", "mxnet")}
    assert set(image_groups()) == {"ddp", "horovod", "deepspeed", "tensorflow", "mxnet"}
    assert {FRAMEWORKS[name].pip_group for name in ("tf-allreduce", "tf-ps-async", "tf-ps-sync")} == {"tensorflow"}
    assert {FRAMEWORKS[name].pip_group for name in ("mx-allreduce", "mx-ps-sync", "mx-ps-async")} == {"mxnet"}


@pytest.mark.parametrize("group,entry,imports", [
    ("tensorflow", "dlaunch.train.tf", ["tensorflow", "dlaunch.train.tf.trainer"]),
    ("mxnet", "dlaunch.train.mx", ["mxnet, horovod.mxnet", "dlaunch.train.mx.trainer"]),
])
def test_engine_images_have_their_own_environment_without_torch(group, entry, imports):
    """The engine images take only their own group (numpy 1.23.5 beside torch's 2.4.6 would not install),
    %test imports the rows' import_check and the trainer's modules, and the runscript starts the engine."""
    text = definition("cpu", group)
    body = sections(text)
    assert "torch" not in LOCK.stacks["cpu"].pip_pins(group) and "torch" not in "\n".join(body["post"])
    tests = [line.strip() for line in body["test"]]
    assert [f"python -c 'import {line}'" for line in imports] == [t for t in tests if re.match(r"python -c 'import [^;]*'$", t)]
    assert set(import_checks(group)) <= {word.strip(",") for line in imports for word in line.split()}
    assert not any("torch" in line for line in tests)
    assert [line.strip() for line in body["runscript"] if line] == [f'exec python -m {entry} "$@"']


def test_engine_pins_are_the_bootstrapped_environments():
    """The images pin what scripts/bootstrap-engines.sh installs for the tests (.venv-tf, .venv-mx); the
    script's tensorflow-cpu is pinned as `tensorflow` (tf-keras requires it; no aarch64 tensorflow-cpu)."""
    script = (REPO / "scripts" / "bootstrap-engines.sh").read_text()
    pip = LOCK.stacks["cpu"].pip
    for array, group in (("TF_PINS", "tensorflow"), ("MX_PINS", "mxnet"), ("HOROVOD_DEPS", "mxnet")):
        specs = re.search(rf"^{array}=\((.*)\)$", script, re.M).group(1).split()
        for spec in specs:
            name, version = spec.split("==")
            name = name.removesuffix("-cpu")
            if array != "HOROVOD_DEPS" or name in pip[group]:
                assert pip[group][name] == version, (array, spec)
    assert pip["mxnet"]["horovod"] == pip["horovod"]["horovod"]  # one Horovod per stack (horovod_build.py)


def test_mxnet_image_builds_horovod_against_mxnet_with_gloo():
    body = sections(definition("cpu", "mxnet"))
    post, test = "\n".join(body["post"]), "\n".join(body["test"])
    assert "HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_PYTORCH=1" in post and "HOROVOD_WITHOUT_MPI=1" in post
    assert "HOROVOD_WITH_PYTORCH" not in post and "CMAKE_TOOLCHAIN_FILE" not in post and " cmake" in post
    assert 'import horovod.mxnet as hvd; assert hvd.gloo_built(), "Horovod lacks Gloo"' in test


def test_lock_keeps_one_version_per_engine_and_engine_images_off_base_pythons(tmp_path):
    lock = tmp_path / "versions.toml"
    text = images.LOCK_PATH.read_text()
    lock.write_text(text.replace('[stacks.cpu.pip.ddp]\n', '[stacks.cpu.pip.ddp]\nnumpy = "1.23.5"\n', 1))
    with pytest.raises(images.LockError, match="numpy: 1.23.5 differs from 2.4.6"):
        images.load_lock(lock)
    lock.write_text(text.replace('[stacks.current.pip.ddp]\n', '[stacks.current.pip.mxnet]\nmxnet = "1.9.1"\n\n'
                                                                '[stacks.current.pip.ddp]\n', 1))
    with pytest.raises(images.LockError, match='pip.mxnet: a mxnet image needs python_source = "apt"'):
        images.load_lock(lock)


def test_current_stack_records_its_driver_floor_and_architectures():
    current = LOCK.stacks["current"]
    assert current.base == "nvcr.io/nvidia/pytorch:25.12-py3" and current.min_driver == "580"
    assert current.architectures == ["x86_64", "aarch64"] and LOCK.stacks["paper"].architectures == ["x86_64"]
    assert "org.dlaunch.min-driver 580" in definition("current", "ddp")


@pytest.mark.parametrize("bad,field", [
    ('base = "bookworm"', 'base = "docker.io/debian:bookworm"'),
    ('mirror = "http://deb.debian.org/debian"', 'mirror = "ftp://x"'),
    ('architectures = ["x86_64"]', 'architectures = ["riscv64"]'),
    ('min_driver = "580"', 'min_driver = "R580"'),
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
    sif = tmp_path / "images" / f"{stack}-{framework}-{platform.machine()}.sif"
    assert words[-2:] == [str(sif), f"containers/{stack}/{framework}.def"]
    assert not (tmp_path / "images").exists()


def test_fake_apptainer_make_images_builds_all_three(fake_apptainer, tmp_path):
    result = _make(["images", "STACK=paper"], fake_apptainer, tmp_path)
    assert result.returncode == 0, result.stderr
    built = re.findall(r"^fake-apptainer build .* (\S+\.sif) (\S+\.def)$", result.stdout, re.M)
    arch = platform.machine()
    assert [Path(sif).name for sif, _ in built] == [f"paper-{fw}-{arch}.sif" for fw in ("ddp", "horovod", "deepspeed")]


def test_fake_apptainer_make_builds_the_engine_images_in_the_cpu_stack_only(fake_apptainer, tmp_path):
    result = _make(["images", "STACK=cpu"], fake_apptainer, tmp_path)
    assert result.returncode == 0, result.stderr
    built = re.findall(r"^fake-apptainer build .* (\S+\.sif) (\S+\.def)$", result.stdout, re.M)
    assert [Path(d).stem for _, d in built] == ["ddp", "horovod", "deepspeed", "tensorflow", "mxnet"]
    refused = _make(["image-tensorflow", "STACK=current"], fake_apptainer, tmp_path / "current")
    assert refused.returncode != 0
    assert "make image-tensorflow: stack current has no tensorflow image (stacks with one: cpu)" in refused.stderr
    assert "fake-apptainer" not in refused.stdout and not (tmp_path / "current").exists()


def test_fake_apptainer_make_rejects_an_unknown_stack(fake_apptainer, tmp_path):
    result = _make(["image-ddp", "STACK=nope"], fake_apptainer, tmp_path)
    assert result.returncode != 0
    assert "unknown STACK (one of: cpu current paper rocm)" in result.stderr
    assert "fake-apptainer" not in result.stdout and not (tmp_path / "images").exists()


def test_git_revision_outside_a_git_checkout_is_unknown(fake_apptainer, tmp_path):
    """A source archive (no .git): the label says `unknown`, not `unknown-dirty`."""
    tree = tmp_path / "tree"
    (tree / "containers" / "cpu").mkdir(parents=True)
    shutil.copy(REPO / "containers" / "images.mk", tree / "containers")
    shutil.copy(images.definition_path("cpu", "ddp"), tree / "containers" / "cpu")
    (tree / "dlaunch" / "train").mkdir(parents=True)
    shutil.copy(REPO / "dlaunch" / "__init__.py", tree / "dlaunch")
    for name in ("__init__.py", "framework_table.py"):  # make's image targets come from the framework table
        shutil.copy(REPO / "dlaunch" / "train" / name, tree / "dlaunch" / "train")
    (tree / "Makefile").write_text("include containers/images.mk\n")
    env = {**os.environ, "PATH": fake_apptainer, "GIT_CEILING_DIRECTORIES": str(tmp_path)}
    result = subprocess.run(["make", "-n", "image-ddp", "STACK=cpu"], cwd=tree, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert '"GIT_REVISION=unknown"' in result.stdout


def test_make_rootfs_runs_the_emulated_build_with_the_revision(tmp_path):
    result = _make(["-n", "rootfs-ddp", "STACK=cpu"], os.environ["PATH"], tmp_path)
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout.strip().splitlines()[-1])
    assert words[1] == "scripts/build-rootfs.py" and words[-1] == "containers/cpu/ddp.def"
    assert words[words.index("--output") + 1] == str(tmp_path / "images" / f"cpu-ddp-{platform.machine()}")


def test_make_without_apptainer_says_so_and_fails(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "git"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))  # the image targets: dlaunch/train/framework_table.py
    result = _make(["image-horovod"], str(bin_dir), tmp_path)
    assert result.returncode != 0
    assert "neither apptainer nor singularity is on PATH" in result.stderr
    assert not (tmp_path / "images").exists()


@pytest.mark.apptainer
def test_build_the_smallest_image_and_run_its_test_section(tmp_path):
    """Builds current-ddp (the NGC base plus the trainer) and runs its %test inside the image."""
    result = subprocess.run(["make", "image-ddp", f"IMAGES_DIR={tmp_path}"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    image = tmp_path / f"current-ddp-{platform.machine()}.sif"
    tested = subprocess.run([images.container_binary(), "test", str(image)], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stderr[-4000:]
    labels = images.image_labels(image, images.container_binary())
    assert labels["org.dlaunch.stack"] == "current"
    assert re.match(r"^[0-9a-f]{40}", labels["org.dlaunch.git-revision"])


# scripts/build-rootfs.py's parts that need no build (the build itself: tests/test_container_build.py)


def test_build_rootfs_refuses_what_it_does_not_emulate():
    path = images.definition_path("current", "ddp")
    with pytest.raises(build_rootfs.BuildError, match="only debootstrap recipes are emulated"):
        build_rootfs.parse(path.read_text(), path)


def test_build_arguments_take_the_given_value_else_the_default_else_fail(tmp_path):
    path = images.definition_path("cpu", "ddp")
    text = path.read_text()
    assert "org.dlaunch.git-revision abc" in build_rootfs.substitute(text, path, {"GIT_REVISION": "abc"})
    assert "org.dlaunch.git-revision unknown" in build_rootfs.substitute(text, path, {})
    with pytest.raises(build_rootfs.BuildError, match="build argument OTHER has no value"):
        build_rootfs.substitute(text + "\n%post\n    echo {{ OTHER }}\n", path, {})


def test_cache_key_follows_the_recipe_but_not_its_labels():
    text = definition("cpu", "ddp")
    key = build_rootfs.cache_key(text, "x86_64")
    assert build_rootfs.cache_key(text.replace("{{ GIT_REVISION }}", "abc"), "x86_64") == key
    assert build_rootfs.cache_key(text.replace("numpy==2.4.6", "numpy==2.4.5"), "x86_64") != key
    assert build_rootfs.cache_key(text, "aarch64") != key


def test_bind_targets_are_the_destinations_of_the_site_profiles_binds(tmp_path, monkeypatch):
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "a.toml").write_text('[container]\nbinds = ["/p/scratch", "/src:/dst:ro", "/usr/lib64/libcxi.so.1"]\n')
    monkeypatch.setattr(build_rootfs, "REPO", tmp_path)
    assert build_rootfs.site_bind_targets() == ["/p/scratch", "/dst", "/usr/lib64/libcxi.so.1"]
