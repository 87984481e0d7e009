"""Charliecloud: `ch-run [flags] -b src:dst ... IMAGE_DIR -- COMMAND`.

The image is an unpacked root file system (a directory). ch-run passes the environment through and
binds read-write; it cannot create a bind's target inside the image, so images carry the targets
(`scripts/build-rootfs.py` creates them). A `:ro` bind is refused: ch-run has no such option.
"""

from pathlib import Path
from typing import List, Literal, Sequence, Tuple

from pydantic import field_validator

from dlaunch.runtimes import Runtime
from dlaunch.runtimes.imagearch import tree_arch
from dlaunch.specs.schema import Option


class Charliecloud(Runtime):
    kind: Literal["charliecloud"]
    flags: List[Option] = []  # e.g. --set-env (the image's /ch/environment)
    image_kind = "dir"
    binary = "ch-run"

    @field_validator("binds")
    @classmethod
    def _writable(cls, binds: List[str]) -> List[str]:
        for bind in binds:
            if bind.endswith(":ro"):
                raise ValueError("%s: ch-run binds cannot be read-only (drop :ro)" % bind)
        return binds

    def read_arch(self, image: str) -> str:
        return tree_arch(Path(image))

    def prefix(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        mounts = tuple(arg for bind in self.every_bind(binds) for arg in ("-b", bind))
        return (self.binary,) + tuple(self.flags) + mounts + (image, "--")
