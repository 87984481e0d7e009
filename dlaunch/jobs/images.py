"""Container images: the version lock, the definition files rendered from it, and what `dlaunch images` lists
(dlaunch/api/machines.py: `images`).

`containers/versions.toml` holds every pinned version of every stack (one source of truth); a stack
has one image per image group of the framework table (dlaunch/train/framework_table.py: a row's pip group;
every stack builds the torch groups, TensorFlow's and MXNet's only where it pins them), each with the
lock's `pip.<group>` pins (and `pip.common`'s, in the torch images).
`containers/<stack>/<group>.def` are generated from it (`dlaunch images --render`) and built by
`make image-<group> STACK=<stack>` into `images/<stack>-<group>-<arch>.sif` (or, for debootstrap
stacks without Apptainer, `make rootfs-<group>` into an unpacked root file system for Charliecloud).
"""

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Dict, List, Literal, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dlaunch.errors import DlaunchError
from dlaunch.jobs.imagepaths import REPO, stack_of
from dlaunch.jobs.sites import available_sites, load_site
from dlaunch.train.framework_table import (
    EVERY_STACK_ENGINE,
    group_engine,
    group_entry,
    image_groups,
    import_checks,
    stack_image_groups,
    trainer_modules,
)

CONTAINERS = REPO / "containers"
LOCK_PATH = CONTAINERS / "versions.toml"
COMMON = "common"  # the lock's group that goes into every torch image (the other engines have their own)
LABEL_PREFIX = "org.dlaunch."
PIN_LABEL_PREFIX = LABEL_PREFIX + "pin."

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+!_-]*$")
_IMAGE = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+:[A-Za-z0-9._-]+$")
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64})?$")

# How a %test reads a base-provided version: (import, expression). A pin and the reading agree when
# one is a prefix of the other ending at a component boundary (NGC adds local suffixes to torch;
# torch reports CUDA as major.minor).
_PROVIDED_CHECKS = {
    "python": ("import platform", "platform.python_version()"),
    "torch": ("import torch", "torch.__version__"),
    "torchvision": ("import torchvision", "torchvision.__version__"),
    "dali": ("import nvidia.dali", "nvidia.dali.__version__"),
    "cuda": ("import torch", "torch.version.cuda"),
}
# Per engine whose image builds Horovod: its build variables, the module its %test imports, the
# controllers it must have. The host's builds take the same variables (scripts/bootstrap.sh for torch,
# scripts/bootstrap-engines.sh for MXNet, through dlaunch/jobs/horovod_build.py); mx-allreduce runs over Gloo.
_HOROVOD_ENGINES = {
    "torch": (
        "HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 "
        "HOROVOD_WITH_MPI=1",
        "horovod.torch",
        ("mpi", "gloo"),
    ),
    "mxnet": (
        "HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 "
        "HOROVOD_WITHOUT_MPI=1",
        "horovod.mxnet",
        ("gloo",),
    ),
}


def horovod_engine_env(engine: str) -> str:
    """Horovod's build variables for an engine (`torch`, `mxnet`): the frameworks and controllers it is built with."""
    return _HOROVOD_ENGINES[engine][0]


def horovod_cxx_std(stack: "Stack", engine: str) -> str:
    """The C++ standard Horovod's build must be forced to for `engine` in `stack` ('' for none): torch's headers need it."""
    return stack.horovod_cxx_std if engine == EVERY_STACK_ENGINE else ""


_HOROVOD_OPERATIONS = {"nccl": "NCCL", "mpi": "MPI", "gloo": "Gloo"}
# Horovod's GPU operations per stack (`horovod_gpu`); RCCL is NCCL's API on ROCm.
_HOROVOD_GPU_ENV = {
    "": "",
    "cuda": "HOROVOD_GPU_OPERATIONS=NCCL ",
    "rocm": "HOROVOD_GPU=ROCM HOROVOD_GPU_OPERATIONS=NCCL ",
}


class LockError(DlaunchError):
    """The lock file is missing or invalid (message: one line naming the file and field)."""


def _check_versions(table: Dict[str, str], group: str = "") -> Dict[str, str]:
    where = f"{group}." if group else ""
    for name, version in table.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"{where}{name}: bad package name")
        if not _VERSION.fullmatch(version) or version.lower() == "latest":
            raise ValueError(f"{where}{name} = {version!r} is not an exact version")
    return table


class Stack(BaseModel):
    """One stack's pins (see the comment at the top of containers/versions.toml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str
    bootstrap: Literal["docker", "debootstrap"] = "docker"
    base: str
    base_digest: str = ""
    mirror: str = ""
    architectures: List[Literal["x86_64", "aarch64"]] = Field(min_length=1)
    gpu_vendor: Literal["nvidia", "amd", "none"]
    min_driver: str = Field("", pattern=r"^([0-9]+(\.[0-9]+)?)?$")
    dali_package: str = Field("", pattern=r"^(nvidia-dali-cuda[0-9]+)?$")
    python: str = Field(pattern=r"^3\.[0-9]+$")
    python_source: Literal["apt", "base"]
    horovod_gpu: Literal["", "cuda", "rocm"]
    horovod_cxx_std: Literal["", "c++17", "c++20"]
    # Headers force-included into Horovod's C++ (GCC >= 13's libstdc++ no longer includes <string>
    # through other headers: "'string' in namespace 'std' does not name a type", seen on an NGC 25.x base)
    horovod_include: List[Literal["string"]] = []
    pip_index: List[str] = []
    provided: Dict[str, str] = {}
    # Per group: `common` (every torch image) or an image group of the framework table; a torch group may be
    # absent (no pins of its own), another engine's group present makes its image (stack_image_groups).
    apt: Dict[str, List[str]] = {}
    build: Dict[str, Dict[Literal["openmpi"], str]] = {}
    pip: Dict[str, Dict[str, str]]

    @model_validator(mode="after")
    def _pinned_base(self) -> "Stack":
        if self.bootstrap == "docker":
            if not _IMAGE.fullmatch(self.base) or self.base.endswith(":latest"):
                raise ValueError(f"base: {self.base!r} is not a registry/repository:tag reference with a fixed tag")
            if self.mirror:
                raise ValueError('mirror: only for bootstrap = "debootstrap"')
        else:
            if not re.fullmatch(r"^[a-z]+$", self.base):
                raise ValueError(f'base: {self.base!r} is not a Debian suite name (bootstrap = "debootstrap")')
            if not re.fullmatch(r"^https?://[A-Za-z0-9./_-]+$", self.mirror):
                raise ValueError(f'mirror: {self.mirror!r} is not an archive URL (bootstrap = "debootstrap")')
            if self.base_digest:
                raise ValueError("base_digest: a debootstrap base has no digest")
        return self

    @field_validator("apt", "build", "pip")
    @classmethod
    def _known_groups(cls, groups: Dict[str, object]) -> Dict[str, object]:
        known = (COMMON,) + image_groups()
        unknown = [group for group in groups if group not in known]
        if unknown:
            raise ValueError(f"{unknown[0]}: not a group (one of {', '.join(known)}: dlaunch/train/framework_table.py)")
        return groups

    @field_validator("apt")
    @classmethod
    def _package_names(cls, groups: Dict[str, List[str]]) -> Dict[str, List[str]]:
        for group, names in groups.items():
            for name in names:
                if not re.fullmatch(r"^[a-z0-9][a-z0-9.+-]+$", name):
                    raise ValueError(f"{group}: {name!r} is not a distribution package name")
        return groups

    @field_validator("base_digest")
    @classmethod
    def _digest(cls, digest: str) -> str:
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"{digest!r} is not sha256:<64 hex digits> or empty")
        return digest

    @field_validator("pip_index")
    @classmethod
    def _https(cls, urls: List[str]) -> List[str]:
        for url in urls:
            if not re.fullmatch(r"^https://[A-Za-z0-9./_-]+$", url):
                raise ValueError(f"{url!r} is not an https URL")
        return urls

    @field_validator("provided")
    @classmethod
    def _exact_provided(cls, table: Dict[str, str]) -> Dict[str, str]:
        return _check_versions(table)

    @field_validator("build", "pip")
    @classmethod
    def _exact_groups(cls, groups: Dict[str, Dict[str, str]]) -> Dict[str, Dict[str, str]]:
        for group, table in groups.items():
            _check_versions(table, group)
        return groups

    @model_validator(mode="after")
    def _consistent(self) -> "Stack":
        if COMMON not in self.pip:
            raise ValueError(f"pip: missing group {COMMON}")
        seen: Dict[Tuple[str, str], str] = {}
        for group in self.pip:
            engine = EVERY_STACK_ENGINE if group == COMMON else group_engine(group)
            if engine != EVERY_STACK_ENGINE and self.python_source != "apt":
                raise ValueError(
                    f'pip.{group}: a {engine} image needs python_source = "apt" (the base\'s Python has torch)'
                )
            for name, version in self.pip[group].items():
                # One version per engine's images (MXNet needs an older numpy), and one Horovod per stack.
                key = ("", name) if name == "horovod" else (engine, name)
                if seen.setdefault(key, version) != version:
                    raise ValueError(f"pip.{group}.{name}: {version} differs from {seen[key]} in another group")
        return self

    @property
    def base_reference(self) -> str:
        if self.bootstrap == "debootstrap":
            return f"{self.base} {self.mirror}"
        return f"{self.base}@{self.base_digest}" if self.base_digest else self.base

    @property
    def has_dali(self) -> bool:
        return bool(self.dali_package)

    def image_groups(self) -> Tuple[str, ...]:
        """The images this stack builds (every torch group, the other engines' groups it pins)."""
        return stack_image_groups(self.pip)

    def _groups(self, group: str) -> Tuple[str, ...]:
        """The lock's groups an image takes: `common` goes into the torch images only."""
        return (COMMON, group) if group_engine(group) == EVERY_STACK_ENGINE else (group,)

    def apt_packages(self, group: str) -> List[str]:
        return list(dict.fromkeys(name for g in self._groups(group) for name in self.apt.get(g, [])))

    def pip_pins(self, group: str) -> Dict[str, str]:
        return {name: version for g in self._groups(group) for name, version in self.pip.get(g, {}).items()}

    def build_pins(self, group: str) -> Dict[str, str]:
        return {name: version for g in self._groups(group) for name, version in self.build.get(g, {}).items()}

    def pins(self, group: str) -> Dict[str, str]:
        """Every pinned version in an image group's image (the image's `org.dlaunch.pin.*` labels)."""
        return {"python": self.python, **self.provided, **self.build_pins(group), **self.pip_pins(group)}


class Lock(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stacks: Dict[str, Stack]

    @field_validator("stacks")
    @classmethod
    def _names(cls, stacks: Dict[str, Stack]) -> Dict[str, Stack]:
        for name in stacks:
            if not re.fullmatch(r"^[a-z][a-z0-9_-]*$", name):
                raise ValueError(f"stack name {name!r} must be lower-case letters, digits, - or _")
        return stacks


def load_lock(path: Optional[Path] = None) -> Lock:
    """Read and validate the lock file; LockError (one line) when it is missing or invalid."""
    path = path or LOCK_PATH
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LockError(f"{path}: {exc}") from None
    try:
        return Lock.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        raise LockError(f"{path}: {where}: {message}") from None


def definition_path(stack: str, group: str) -> Path:
    return CONTAINERS / stack / f"{group}.def"


# ----------------------------------------------------------------------------------------------
# Rendering the definition files


def _section(name: str, lines: List[str]) -> List[str]:
    return [f"%{name}"] + [f"    {line}" if line else "" for line in lines] + [""]


def _pip_install(stack: Stack, pins: Dict[str, str], *flags: str) -> str:
    index = [f"--extra-index-url {shlex.quote(url)}" for url in stack.pip_index]
    specs = [shlex.quote(f"{name}=={version}") for name, version in pins.items()]
    return " ".join(["python -m pip install --no-cache-dir", *flags, *index, *specs])


def _openmpi_lines(version: str) -> List[str]:
    series = ".".join(version.split(".")[:2])
    url = f"https://download.open-mpi.org/release/open-mpi/v{series}/openmpi-{version}.tar.bz2"
    return [
        f"# Open MPI {version} with CUDA and Slurm support; a site may bind its own MPI over it.",
        f"curl -fsSL -o /tmp/openmpi.tar.bz2 {shlex.quote(url)}",
        "tar -xjf /tmp/openmpi.tar.bz2 -C /tmp",
        f"cd /tmp/openmpi-{version}",
        "./configure --prefix=/opt/openmpi --with-cuda=/usr/local/cuda --with-slurm --enable-orterun-prefix-by-default",
        'make -j"$(nproc)" install',
        "cd /",
        f"rm -rf /tmp/openmpi-{version} /tmp/openmpi.tar.bz2",
        "# Found through ld.so.cache, so a site's LD_LIBRARY_PATH still takes precedence.",
        "echo /opt/openmpi/lib > /etc/ld.so.conf.d/openmpi.conf",
        "ldconfig",
        'export PATH="$PATH:/opt/openmpi/bin"',
    ]


def cxx_standard_files(std: str, folder: str) -> Dict[str, str]:
    """Horovod's CMake asks for C++14, and a -std= in CXXFLAGS is dropped; a torch that needs a newer
    standard builds with these files: path -> text, the toolchain file (CMAKE_TOOLCHAIN_FILE) last."""
    flag = std.replace("c++", "")
    override = f"{folder}/cxx-standard.cmake"
    return {
        override: f'set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++{flag}")\n'
        f'set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++{flag}")\n',
        f"{folder}/toolchain.cmake": f'set(CMAKE_USER_MAKE_RULES_OVERRIDE_CXX "{override}")\n',
    }


def _cxx_standard_lines(std: str) -> List[str]:
    lines = [
        f"# Horovod's CMake asks for C++14; this torch needs {std} (a -std= in CXXFLAGS is dropped).",
        "mkdir -p /opt/dlaunch/cmake",
    ]
    for path, text in cxx_standard_files(std, "/opt/dlaunch/cmake").items():
        lines += [f"echo {shlex.quote(line)} {'>>' if i else '>'} {path}" for i, line in enumerate(text.splitlines())]
    return lines


def _apt_lines(packages: List[str]) -> List[str]:
    return [
        "export DEBIAN_FRONTEND=noninteractive",
        "apt-get update",
        f"apt-get install -y --no-install-recommends {' '.join(packages)}",
        "rm -rf /var/lib/apt/lists/*",
    ]


def _post(stack: Stack, group: str) -> List[str]:
    lines = ["set -eu"]
    extra_apt = stack.apt_packages(group)
    if stack.python_source == "apt":
        py = f"python{stack.python}"
        lines += _apt_lines(
            [py, f"{py}-dev", f"{py}-venv", "ca-certificates", "curl", "bzip2", "build-essential"] + extra_apt
        )
        lines += [f"{py} -m venv /opt/venv", 'export PATH="/opt/venv/bin:$PATH"']
    elif extra_apt:
        lines += _apt_lines(extra_apt)
    openmpi = stack.build_pins(group).get("openmpi")
    if openmpi:
        lines += _openmpi_lines(openmpi)
    pip = dict(stack.pip_pins(group))
    horovod = pip.pop("horovod", None)
    if pip:
        lines.append(_pip_install(stack, pip))
    if horovod:
        engine = group_engine(group)
        env = _HOROVOD_GPU_ENV[stack.horovod_gpu] + horovod_engine_env(engine)
        cxx_std = horovod_cxx_std(stack, engine)
        if cxx_std:
            lines += _cxx_standard_lines(cxx_std)
            env = f"CMAKE_TOOLCHAIN_FILE=/opt/dlaunch/cmake/toolchain.cmake {env}"
        if stack.horovod_include:
            env = "CXXFLAGS='%s' %s" % (" ".join("-include " + h for h in stack.horovod_include), env)
        lines.append(f"{env} {_pip_install(stack, {'horovod': horovod}, '--no-build-isolation')}")
    lines += [
        "# The trainer from this commit (dlaunch/train is Python 3.9 compatible; the launcher is not installed).",
        'echo /opt/dlaunch > "$(python -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')/dlaunch.pth"',
        "python -m pip freeze > /opt/dlaunch/pip-freeze.txt",
    ]
    return lines


def _python_check(code: str) -> str:
    return f"python -c {shlex.quote(code)}"


def _test(stack: Stack, group: str) -> List[str]:
    lines = ["set -eu"]
    engine = group_engine(group)
    torch = engine == EVERY_STACK_ENGINE
    provided = {"python": stack.python, **stack.provided}
    for name, version in provided.items():
        if name in _PROVIDED_CHECKS and (torch or name == "python"):  # the others read torch's or DALI's
            imp, expr = _PROVIDED_CHECKS[name]
            lines.append(
                _python_check(
                    f"{imp}; v = str({expr}); pin = {json.dumps(version)}; a, b = sorted([v, pin], key=len); "
                    f"assert b.startswith(a) and not b[len(a):len(a) + 1].isdigit(), ({json.dumps(name)}, v, pin)"
                )
            )
    pip = stack.pip_pins(group)
    if pip:
        lines.append(
            _python_check(
                f"from importlib.metadata import version; pins = {json.dumps(pip)}; "
                "bad = {n: version(n) for n in pins if version(n) != pins[n]}; assert not bad, bad"
            )
        )
    base = ("torch", "torchvision") + (("nvidia.dali",) if stack.has_dali else ()) if torch else ()
    lines.append(_python_check(f"import {', '.join(base + import_checks(group))}"))
    if "horovod" in pip:  # the image builds Horovod: with the operations the stack asks for
        _, module, controllers = _HOROVOD_ENGINES[engine]
        operations = [_HOROVOD_OPERATIONS[op] for op in (("nccl",) if stack.horovod_gpu else ()) + controllers]
        built = " and ".join(f"hvd.{op.lower()}_built()" for op in operations)
        lacks = " or ".join(filter(None, [", ".join(operations[:-1]), operations[-1]]))
        lines.append(_python_check(f'import {module} as hvd; assert {built}, "Horovod lacks {lacks}"'))
        lines.append("horovodrun --check-build")
    if torch:
        lines.append("python -m dlaunch.train --help > /dev/null")
    else:  # the engine trainers start only as tasks of a job (dlaunch/train/engines.py): their modules import
        lines.append(_python_check(f"import {', '.join(trainer_modules(group))}"))
    return lines


def _header(stack: Stack) -> List[str]:
    if stack.bootstrap == "debootstrap":
        return ["Bootstrap: debootstrap", f"OSVersion: {stack.base}", f"MirrorURL: {stack.mirror}"]
    return ["Bootstrap: docker", f"From: {stack.base_reference}"]


def render_definition(stack_name: str, stack: Stack, group: str) -> str:
    """The Apptainer definition file of an image group's image in `stack` (exact text, committed)."""
    environment = [f"export DLAUNCH_STACK={stack_name}"]
    if stack.python_source == "apt":
        environment.append('export PATH="/opt/venv/bin:$PATH"')
    if stack.build_pins(group).get("openmpi"):
        environment.append('export PATH="$PATH:/opt/openmpi/bin"')
    labels = (
        [
            f"{LABEL_PREFIX}stack {stack_name}",
            f"{LABEL_PREFIX}framework {group}",
            f"{LABEL_PREFIX}git-revision {{{{ GIT_REVISION }}}}",
            f"{LABEL_PREFIX}base {stack.base_reference}",
            f"{LABEL_PREFIX}architectures {' '.join(stack.architectures)}",
        ]
        + ([f"{LABEL_PREFIX}min-driver {stack.min_driver}"] if stack.min_driver else [])
        + [f"{PIN_LABEL_PREFIX}{name} {version}" for name, version in stack.pins(group).items()]
    )
    text = (
        [
            "# Generated by `dlaunch images --render` from containers/versions.toml: edit that, not this.",
            f"# Stack {stack_name}: {stack.description}.",
            f"# Build from the repository root: make image-{group} STACK={stack_name}",
        ]
        + _header(stack)
        + [""]
    )
    text += _section("arguments", ["GIT_REVISION=unknown"])
    text += _section(
        "files",
        [
            "pyproject.toml /opt/dlaunch/pyproject.toml",
            "dlaunch/train /opt/dlaunch/dlaunch/train",
            "dlaunch/__init__.py /opt/dlaunch/dlaunch/__init__.py",
        ],
    )
    text += _section("labels", labels)
    text += _section("environment", environment)
    text += _section("post", _post(stack, group))
    text += _section("runscript", [f'exec python -m {group_entry(group)} "$@"'])
    text += _section("test", _test(stack, group))
    return "\n".join(text).rstrip("\n") + "\n"


def render_all(lock: Lock) -> Dict[Path, str]:
    """Every definition file's path and text."""
    return {
        definition_path(name, group): render_definition(name, stack, group)
        for name, stack in lock.stacks.items()
        for group in stack.image_groups()
    }


# ----------------------------------------------------------------------------------------------
# What each site uses


def site_stacks() -> Dict[str, Tuple[str, str]]:
    """Site name -> (image stack, architecture), for every known site profile that runs in a container."""
    stacks = {}
    for path in available_sites().values():
        site = load_site(path)
        stack = stack_of(site)
        if stack is not None:
            stacks[site.name] = (stack, site.arch)
    return stacks


def container_binary() -> Optional[str]:
    """`apptainer`, else `singularity`, from PATH (None when neither is there)."""
    return shutil.which("apptainer") or shutil.which("singularity")


def image_labels(image: Path, binary: str) -> Dict[str, str]:
    """The labels of a built image (`<binary> inspect --labels --json`)."""
    out = subprocess.run(
        [binary, "inspect", "--labels", "--json", str(image)], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)["data"]["attributes"]["labels"]


def rootfs_labels(image_dir: Path) -> Dict[str, str]:
    """The labels of an unpacked image (`/.singularity.d/labels.json`, written by scripts/build-rootfs.py)."""
    return json.loads((image_dir / ".singularity.d" / "labels.json").read_text())


def pins_of(
    sif: Path, rootfs: Path, stack: Optional[Stack], group: str, binary: Optional[str]
) -> Tuple[Dict[str, str], str]:
    """An image's pins and where they were read: the built image's labels, else the lock."""
    labels, where = None, ""
    if sif.is_file() and binary:
        try:
            labels, where = image_labels(sif, binary), "image"
        except (subprocess.CalledProcessError, ValueError, KeyError) as exc:
            return {}, f"unreadable labels ({exc.__class__.__name__})"
    elif rootfs.is_dir():
        try:
            labels, where = rootfs_labels(rootfs), "root fs"
        except (OSError, ValueError) as exc:
            return {}, f"unreadable labels ({exc.__class__.__name__})"
    if labels is not None:
        pins = {k[len(PIN_LABEL_PREFIX) :]: v for k, v in labels.items() if k.startswith(PIN_LABEL_PREFIX)}
        return pins, f"{where} (rev {labels.get(LABEL_PREFIX + 'git-revision', '?')})"
    if stack is None:
        return {}, "stack not in lock"
    why = "lock" if not sif.is_file() else "lock (no apptainer to inspect)"
    return stack.pins(group), why
