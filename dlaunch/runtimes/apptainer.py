"""Apptainer and Singularity: `apptainer exec [flags] --bind a,b IMAGE` (the same command line).

Apptainer passes the host's environment into the container except LD_LIBRARY_PATH, which it sets
itself; a site's library folders (a NCCL network plugin) go in through `APPTAINERENV_LD_LIBRARY_PATH`
(`SINGULARITYENV_` for Singularity), as ALCF's and OLCF's container guides do.
"""

from pathlib import Path
from typing import List, Literal, Optional, Sequence, Tuple

from dlaunch.runtimes import Runtime
from dlaunch.runtimes.imagearch import sif_arch, tree_arch
from dlaunch.specs.job import PreludeItem, Prepend, joined
from dlaunch.specs.schema import Option


class Apptainer(Runtime):
    kind: Literal["apptainer", "singularity"]
    flags: List[Option] = []  # e.g. --nv (NVIDIA GPUs), --rocm (AMD GPUs)

    @property
    def binary(self) -> str:  # type: ignore[override]
        return self.kind

    def read_arch(self, image: str) -> Optional[str]:
        """A SIF file's header, or a sandbox directory's /bin/sh."""
        if image.endswith(".sif"):
            return sif_arch(Path(image))
        return tree_arch(Path(image)) if Path(image).is_dir() else None

    def exports(self, prepends: Sequence[Prepend]) -> Tuple[PreludeItem, ...]:
        inside = "%sENV_LD_LIBRARY_PATH" % self.kind.upper()
        return tuple(Prepend(inside, p.value) for p in prepends if p.name == "LD_LIBRARY_PATH")

    def prefix(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        every = self.every_bind(binds)
        return (self.binary, "exec") + tuple(self.flags) + (("--bind", joined(",", every)) if every else ()) + (image,)
