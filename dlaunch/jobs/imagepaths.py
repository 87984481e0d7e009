"""Which image a site runs: `<images dir>/<stack>-<image>-<arch>` plus the runtime's extension, where the
image is the framework's image group (its row's pip group: dlaunch/train/framework_table.py), and the checks of
a site against its stack (architecture, GPU vendor, driver, DALI).

Kept apart from `dlaunch.jobs.images` (the version lock's pydantic models, definition files, `dlaunch
images`): `dlaunch run` reads only the few facts it needs from the lock, with tomllib.
"""

import os
import re
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Tuple

from dlaunch.errors import DlaunchError
from dlaunch.paths import REPO
from dlaunch.train.framework_table import FRAMEWORKS, image_group, image_groups, stack_image_groups

if TYPE_CHECKING:
    from dlaunch.jobs.sites import Site

LOCK_PATH = REPO / "containers" / "versions.toml"
DEFAULT_STACK = "current"
DEFAULT_ARCH = "x86_64"
ARCHITECTURES = ("x86_64", "aarch64")
# File name extension per runtime image kind (CONTRACTS.md section 2); "name" images are registry names.
IMAGE_EXTENSIONS = {"sif": ".sif", "sqsh": ".sqsh", "dir": "", "edf": ".toml"}


def images_dir(site: "Optional[Site]" = None, environ: Mapping[str, str] = os.environ) -> Path:
    """Where images are: $DLAUNCH_IMAGES_DIR, else the site's `images_dir` (its variable expanded here; where it is
    not set, a path that says so: `Site.folder`), else the install tree's images/."""
    if environ.get("DLAUNCH_IMAGES_DIR"):
        return Path(environ["DLAUNCH_IMAGES_DIR"])
    folder = site.folder("images_dir", environ)[0] if site is not None else None
    return Path(folder) if folder else REPO / "images"


def image_name(group: str, stack: str = DEFAULT_STACK, arch: str = DEFAULT_ARCH) -> str:
    """`<stack>-<image group>-<arch>`, the name every image kind is built from."""
    if group not in image_groups():
        raise ValueError(f"unknown image (framework group) {group!r} (one of {', '.join(image_groups())})")
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", stack):
        raise ValueError(f"bad image stack name {stack!r}")
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r} (one of {', '.join(ARCHITECTURES)})")
    return f"{stack}-{group}-{arch}"


def image_reference(
    group: str,
    stack: str = DEFAULT_STACK,
    arch: str = DEFAULT_ARCH,
    image_kind: str = "sif",
    folder: Optional[Path] = None,
) -> str:
    """The default image of one kind: a path in the images dir (`folder`, else `images_dir()`), or
    `dlaunch/<stack>-<group>:<arch>`."""
    if image_kind == "name":
        image_name(group, stack, arch)
        return f"dlaunch/{stack}-{group}:{arch}"
    if image_kind not in IMAGE_EXTENSIONS:
        raise ValueError(f"unknown image kind {image_kind!r}")
    return str((folder or images_dir()) / (image_name(group, stack, arch) + IMAGE_EXTENSIONS[image_kind]))


def default_image(
    group: str, stack: str = DEFAULT_STACK, arch: str = DEFAULT_ARCH, folder: Optional[Path] = None
) -> Path:
    """The Apptainer image (`.sif`) of an image group in `stack` for `arch` (in `folder`, else `images_dir()`)."""
    return Path(image_reference(group, stack, arch, "sif", folder))


def stack_of_image(image: Optional[str]) -> Optional[str]:
    """The stack of an image named as `image_reference` names them (`<stack>-<image group>-<arch>` plus
    an extension, or `dlaunch/<stack>-<image group>:<arch>`); None for an image named otherwise."""
    groups, archs = "|".join(map(re.escape, image_groups())), "|".join(map(re.escape, ARCHITECTURES))
    extensions = "|".join(re.escape(e) for e in IMAGE_EXTENSIONS.values() if e)
    m = re.fullmatch(
        r"(?:.*/)?([a-z][a-z0-9_-]*)-(?:%s)(?:-(?:%s)(?:%s)?/?|:(?:%s))" % (groups, archs, extensions, archs),
        image or "",
    )
    return m.group(1) if m else None


def stack_of(site: "Site") -> Optional[str]:
    """The image stack a site runs (its `[container] stack`); None without a container."""
    if not site.container.containerized:
        return None
    return site.container.stack


@lru_cache(maxsize=4)
def _lock_stacks(path: Path) -> Dict[str, dict]:
    try:
        return tomllib.loads(path.read_text()).get("stacks", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DlaunchError(f"{path}: {exc}") from None


def stack_facts(stack: str) -> dict:
    """A stack's table in the lock (architectures, gpu_vendor, min_driver, ...); DlaunchError if absent."""
    stacks = _lock_stacks(LOCK_PATH)
    if stack not in stacks:
        raise DlaunchError(f"{LOCK_PATH}: no image stack {stack!r} (stacks: {', '.join(stacks)})")
    return stacks[stack]


def stack_groups(stack: str) -> Tuple[str, ...]:
    """The images a stack builds (dlaunch/train/framework_table.py's stack_image_groups of its `pip` groups)."""
    return stack_image_groups(stack_facts(stack).get("pip", {}))


def check_site_stack(site: "Site", stack: str) -> None:
    """DlaunchError (exit 2) when `stack` does not exist for the site's architecture or GPU vendor."""
    facts = stack_facts(stack)
    arch = site.arch
    archs = facts.get("architectures", [DEFAULT_ARCH])
    if arch not in archs:
        raise DlaunchError(
            f"site {site.name} is {arch}, and image stack {stack!r} exists only for "
            f"{', '.join(archs)}; set [container] stack to one built for {arch} or give --image"
        )
    vendor = facts.get("gpu_vendor", "nvidia")
    if vendor != "none" and site.gpu_vendor not in ("none", vendor):
        builds = {"nvidia": "CUDA", "amd": "ROCm"}[vendor]
        raise DlaunchError(
            f"site {site.name} has {site.gpu_vendor} GPUs, and image stack {stack!r} is a {builds} "
            f"build; set [container] stack to one for {site.gpu_vendor} GPUs or give --image"
        )


def default_image_for_site(site: "Site", framework: str, stack: Optional[str] = None) -> str:
    """The image a containerized site runs for `framework` unless `--image` says otherwise, in the form
    its runtime takes (`image_kind`: sif, sqsh, dir, name, edf); `stack`: another than the site's."""
    stack = stack or stack_of(site)
    if stack is None:
        raise DlaunchError(f"--image: site {site.name} runs without a container")
    group = image_group(framework)
    if group not in stack_groups(stack):
        others = [name for name in _lock_stacks(LOCK_PATH) if group in stack_groups(name)]
        where = (
            f"stacks with it: {', '.join(others)} (make image-{group} STACK={others[0]})"
            if others
            else "no stack has it"
        )
        raise DlaunchError(
            f"--framework {framework}: image stack {stack!r} (site {site.name}) has no image of the "
            f"{FRAMEWORKS[framework].engine} trainer ({where}); set [container] stack to one with it "
            f"or give --image with its environment, or use a profile without containers whose "
            f"`interpreters` name its Python"
        )
    check_site_stack(site, stack)
    return image_reference(group, stack, site.arch, site.container.image_kind, images_dir(site))


def version_tuple(version: str) -> tuple:
    """`580.65.06` -> (580, 65, 6): versions compare as tuples."""
    return tuple(int(part) for part in re.findall(r"[0-9]+", version))


def driver_warning(site: "Site", stack: Optional[str] = None) -> Optional[str]:
    """A warning when the site's profile states a GPU driver older than its stack's `min_driver`."""
    stack = stack or stack_of(site)
    driver = site.driver
    if stack is None or not driver:
        return None
    needed = stack_facts(stack).get("min_driver", "")
    if needed and version_tuple(driver) < version_tuple(needed):
        return (
            f"site {site.name} states driver {driver}, and image stack {stack!r} needs R{needed} or newer "
            f"(its CUDA); jobs fail at CUDA initialization unless the nodes have NVIDIA's forward-compatibility "
            f"package"
        )
    return None


def check_loader(site: "Site", loader: str) -> None:
    """DlaunchError (exit 2) for `--loader dali` on a site without NVIDIA GPUs (DALI is NVIDIA-only)."""
    if loader == "dali" and site.gpu_vendor == "amd":
        raise DlaunchError(
            f"--loader dali: site {site.name} has AMD GPUs, and NVIDIA DALI runs only on NVIDIA "
            f"GPUs; use --loader native"
        )
