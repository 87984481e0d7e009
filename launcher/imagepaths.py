"""Where the launcher finds a framework's default image (`<images dir>/<stack>-<framework>.sif`).

Kept apart from `launcher.images` (the version lock's pydantic models, definition files, `dlaunch
images`) so that `dlaunch run` does not load the lock to name an image path.
"""
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from launcher.errors import DlaunchError
from train.config import FRAMEWORKS

if TYPE_CHECKING:
    from launcher.sites import Site

REPO = Path(__file__).resolve().parent.parent
DEFAULT_STACK = "current"


def default_image(framework: str, stack: str = DEFAULT_STACK) -> Path:
    """The image the launcher uses for `framework` by default: `<images dir>/<stack>-<framework>.sif`."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r} (one of {', '.join(FRAMEWORKS)})")
    if not re.match(r"^[a-z][a-z0-9_-]*$", stack):
        raise ValueError(f"bad image stack name {stack!r}")
    images_dir = Path(os.environ.get("DLAUNCH_IMAGES_DIR") or REPO / "images")
    return images_dir / f"{stack}-{framework}.sif"


def stack_of(site: "Site") -> Optional[str]:
    """The image stack a site runs: its `[container] stack`; None without a container, and on
    non-NVIDIA GPUs, since every stack here is a CUDA build."""
    if site.container.runtime == "none" or site.gpu_vendor != "nvidia":
        return None
    return site.container.stack


def default_image_for_site(site: "Site", framework: str) -> Path:
    """The image a containerized site runs for `framework` unless `--image` says otherwise."""
    stack = stack_of(site)
    if stack is None:
        raise DlaunchError("--image: site %s has %s GPUs and dlaunch's images are CUDA builds; give --image PATH "
                           "(e.g. a ROCm PyTorch image with the trainer installed)" % (site.name, site.gpu_vendor))
    return default_image(framework, stack)
