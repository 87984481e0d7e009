"""Container runtimes: what goes in front of the launch command on a compute node."""
from typing import Sequence, Tuple

from launcher.sites import Container


class NoContainer:
    """Run on the host (the `local` site, or sites that load a software stack by modules)."""

    def prefix(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        return ()


class Apptainer:
    """`apptainer exec [flags] --bind a,b IMAGE` (Singularity has the same command line)."""

    def __init__(self, binary: str, flags: Sequence[str], binds: Sequence[str]):
        self.binary = binary
        self.flags = tuple(flags)
        self.site_binds = tuple(binds)

    def prefix(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        every_bind = tuple(dict.fromkeys(self.site_binds + tuple(binds)))
        bind_args = ("--bind", ",".join(every_bind)) if every_bind else ()
        return (self.binary, "exec") + self.flags + bind_args + (image,)


def runtime_for(container: Container):
    """The runtime class of a site's `[container]` section."""
    if container.runtime == "none":
        return NoContainer()
    return Apptainer(container.runtime, container.flags, container.binds)
