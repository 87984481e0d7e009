"""Container runtimes: one file each, registered by `kind` in `RUNTIMES` (a site's `[container] kind`).

A runtime is its own profile section (a pydantic model: flags, binds, default image stack) plus what
it adds to a job: options of the scheduler's step (pyxis: `srun --container-image`), a command in
front of the launch command (`apptainer exec ... IMAGE`), and a check of the image reference.
Binds are `src[:dst][:ro]`; the job adds its run directory and data folder.
"""

import os
import re
from typing import Any, ClassVar, List, Literal, Optional, Sequence, Tuple, Type

from dlaunch.errors import DlaunchError
from dlaunch.specs.job import PreludeItem, Prepend
from dlaunch.specs.registration import Registration, registered, validate_section
from dlaunch.specs.schema import PATH, Bind, SafeName, StrictModel

# kind -> registration; adding a runtime is its file plus one row here.
RUNTIMES = {
    "none": Registration("dlaunch.runtimes:NoContainer"),
    "apptainer": Registration("dlaunch.runtimes.apptainer:Apptainer"),
    "singularity": Registration("dlaunch.runtimes.apptainer:Apptainer"),
    "pyxis": Registration("dlaunch.runtimes.pyxis:Pyxis"),
    "podman-hpc": Registration("dlaunch.runtimes.podman_hpc:PodmanHpc"),
    "charliecloud": Registration("dlaunch.runtimes.charliecloud:Charliecloud"),
}


class Runtime(StrictModel):
    """The protocol, and what every runtime's section has."""

    kind: str
    binds: List[Bind] = []
    stack: SafeName = "current"  # the default image stack (containers/versions.toml)
    containerized: ClassVar[bool] = True  # False: the job runs on the host (no image)
    image_kind: ClassVar[str] = (
        "sif"  # sif | sqsh | dir | name | edf: how an image is named (dlaunch/jobs/imagepaths.py)
    )
    binary: ClassVar[str] = ""  # the command a node needs to start the container (`dlaunch doctor`)
    enters_by_step: ClassVar[bool] = False  # True: the image enters through the step's options, no prefix command

    @property
    def required_option(self) -> Optional[str]:
        """An option `binary --help` must list on a node that can start the container (`dlaunch doctor`)."""
        return None

    def arch_command(self, image: str) -> Optional[Tuple[str, ...]]:
        """A command that prints the image's architecture where the image is no file to read (`doctor`)."""
        return None

    def read_arch(self, image: str) -> Optional[str]:
        """The architecture read from the image's files (`doctor`); None where this runtime's images cannot be read here."""
        return None

    def check_image(self, image: str) -> str:
        """The image reference, or DlaunchError naming --image."""
        if not _is_path(image):
            raise DlaunchError(
                "--image: %r is not an absolute path of letters, digits and _./+@=- (%s)" % (image, self.kind)
            )
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
    containerized: ClassVar[bool] = False


def runtime_class(kind: str) -> Type[Runtime]:
    """The class registered as a `[container] kind` (also `plan.json`'s `runtime`)."""
    return registered(RUNTIMES, kind, "container runtime")


def validate_config(data: Any) -> Any:
    """A `[container]` section as its runtime's model."""
    return validate_section(RUNTIMES, data, runtime_class)
