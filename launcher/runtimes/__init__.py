"""Container runtimes: one file each, registered by `kind` in `RUNTIMES` (a site's `[container] kind`).

A runtime is its own profile section (a pydantic model: flags, binds, default image stack) plus what
it adds to a job: options of the scheduler's step (pyxis: `srun --container-image`), a command in
front of the launch command (`apptainer exec ... IMAGE`), and a check of the image reference.
Binds are `src[:dst][:ro]`; the job adds its run directory and data folder.
"""
import importlib
import os
import re
from typing import Annotated, ClassVar, List, Literal, Sequence, Tuple, Union

from pydantic import Field

from launcher.errors import DlaunchError
from launcher.jobs.jobspec import PreludeItem, Prepend
from launcher.jobs.schema import PATH, Bind, SafeName, StrictModel

# kind -> "module:Class"; adding a runtime is its file plus one row here.
RUNTIMES = {
    "none": "launcher.runtimes:NoContainer",
    "apptainer": "launcher.runtimes.apptainer:Apptainer",
    "singularity": "launcher.runtimes.apptainer:Apptainer",
    "pyxis": "launcher.runtimes.pyxis:Pyxis",
    "podman-hpc": "launcher.runtimes.podman_hpc:PodmanHpc",
    "charliecloud": "launcher.runtimes.charliecloud:Charliecloud",
}


class Runtime(StrictModel):
    """The protocol, and what every runtime's section has."""

    kind: str
    binds: List[Bind] = []
    stack: SafeName = "current"  # the default image stack (containers/versions.toml)
    image_kind: ClassVar[str] = "sif"  # sif | sqsh | dir | name | edf: how an image is named (launcher/jobs/imagepaths.py)
    binary: ClassVar[str] = ""  # the command a node needs to start the container (`dlaunch doctor`)

    def check_image(self, image: str) -> str:
        """The image reference, or DlaunchError naming --image."""
        if not _is_path(image):
            raise DlaunchError("--image: %r is not an absolute path of letters, digits and _./+@=- (%s)" % (image, self.kind))
        return image

    @classmethod
    def missing(cls, image: str) -> bool:
        """The image is a path that does not exist on this machine."""
        return _is_path(image) and not os.path.exists(image)

    def step_options(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        return ()

    def warnings(self, binds: Sequence[str]) -> Tuple[str, ...]:
        """What the user must make sure of before the job runs."""
        return ()

    def exports(self, prepends: Sequence[Prepend]) -> Tuple[PreludeItem, ...]:
        """What the batch host must export so that the site's path lists reach the container too."""
        return ()

    def prefix(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        return ()

    def every_bind(self, binds: Sequence[str]) -> Tuple[str, ...]:
        """The site's binds, then the job's, each once."""
        return tuple(dict.fromkeys(tuple(self.binds) + tuple(binds)))


def _is_path(image: str) -> bool:
    return bool(re.fullmatch(PATH, image))


class NoContainer(Runtime):
    """Run on the host (the `local` site, or sites that load a software stack by modules)."""

    kind: Literal["none"] = "none"


def runtime_class(kind: str) -> type:
    module, name = RUNTIMES[kind].split(":")
    return getattr(importlib.import_module(module), name)


def config_union() -> object:
    """The `[container]` section's type: the runtimes' models, told apart by `kind`."""
    models = tuple(dict.fromkeys(runtime_class(kind) for kind in RUNTIMES))
    return Annotated[Union[models], Field(discriminator="kind")]  # type: ignore[valid-type]
