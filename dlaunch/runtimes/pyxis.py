"""Pyxis (NVIDIA's Slurm SPANK plugin for enroot): the container is an option of `srun` itself.

`srun --container-image=IMAGE --container-mounts=src:dst[:ro],...` where IMAGE is an enroot
squashfs file or a registry reference (`nvcr.io#nvidia/pytorch:25.12-py3`; enroot separates
registry and image with `#`). CSCS Alps wraps this in an environment definition file (EDF, a TOML
file naming image, mounts and environment): `srun --environment=EDF` (`environment = true`); the
EDF must then mount the run directory's file system itself. Pyxis passes the environment through.
"""

import re
from typing import Literal, Optional, Sequence, Tuple

from dlaunch.errors import DlaunchError
from dlaunch.runtimes import Runtime
from dlaunch.specs.job import joined
from dlaunch.specs.schema import PATH, SAFE_NAME

_REGISTRY_REF = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?#[a-z0-9._/-]+(:[A-Za-z0-9._-]+)?$")


class Pyxis(Runtime):
    kind: Literal["pyxis"]
    environment: bool = False  # CSCS: the image is an EDF (path or name), rendered --environment=
    binary = "srun"  # with the pyxis SPANK plugin
    enters_by_step = True

    @property
    def image_kind(self) -> str:  # type: ignore[override]
        return "edf" if self.environment else "sqsh"

    @property
    def required_option(self) -> Optional[str]:
        """srun lists the option only where the pyxis SPANK plugin is loaded."""
        return "--environment" if self.environment else "--container-image"

    def check_image(self, image: str) -> str:
        if self.environment:
            if re.fullmatch(PATH, image) or re.fullmatch(SAFE_NAME, image):
                return image
            raise DlaunchError(
                "--image: %r is neither an EDF file path nor an EDF name (pyxis with environment = true)" % image
            )
        if re.fullmatch(PATH, image) or _REGISTRY_REF.fullmatch(image):
            return image
        raise DlaunchError(
            "--image: %r is neither a squashfs path nor an enroot registry reference like "
            "nvcr.io#nvidia/pytorch:25.12-py3 (pyxis)" % image
        )

    def warnings(self, binds: Sequence[str]) -> Tuple[str, ...]:
        if not self.environment:
            return ()
        return (
            "the environment definition file must mount %s (pyxis takes mounts from it, not from dlaunch)"
            % ", ".join(self.every_bind(binds)),
        )

    def step_options(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        if self.environment:
            return ("--environment=%s" % image,)
        every = self.every_bind(binds)
        return ("--container-image=%s" % image,) + (
            (joined("", ("--container-mounts=", joined(",", every))),) if every else ()
        )
