"""podman-hpc (NERSC Perlmutter): `podman-hpc run --rm [flags] --env-host --net=host -v src:dst IMAGE`.

Podman gives a container neither the host's environment nor its network by default; the launch
command needs both (MASTER_ADDR, the site's NCCL settings, provenance; the rendezvous and NCCL talk
over the host's interfaces), hence `--env-host` and `--net=host` (podman run options; with podman-hpc
on Perlmutter unverified here: podman cannot start containers on this machine). Images are names in
podman-hpc's image store (`podman-hpc migrate` makes them visible on compute nodes).
"""

import re
from typing import List, Literal, Optional, Sequence, Tuple

from dlaunch.errors import DlaunchError
from dlaunch.runtimes import Runtime
from dlaunch.specs.job import joined
from dlaunch.specs.schema import Option

_IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$")


class PodmanHpc(Runtime):
    kind: Literal["podman-hpc"]
    flags: List[Option] = []  # e.g. --gpu, --mpi
    image_kind = "name"
    binary = "podman-hpc"

    def check_image(self, image: str) -> str:
        if not _IMAGE_NAME.fullmatch(image):
            raise DlaunchError("--image: %r is not an image name like dlaunch/current-ddp:x86_64 (podman-hpc)" % image)
        return image

    @classmethod
    def missing(cls, image: str) -> bool:
        return False  # in podman-hpc's store, not a file here

    def arch_command(self, image: str) -> Optional[Tuple[str, ...]]:
        return (self.binary, "image", "inspect", "--format", "{{.Architecture}}", image)

    def prefix(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        volumes = tuple(
            arg for bind in self.every_bind(binds) for arg in ("-v", bind if ":" in bind else joined(":", (bind, bind)))
        )
        return (self.binary, "run", "--rm") + tuple(self.flags) + ("--env-host", "--net=host") + volumes + (image,)
