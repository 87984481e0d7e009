"""Fakebox, a container runtime that exists only in tests (tests/test_added_backends.py adds it with this
file and one row in `dlaunch.runtimes.RUNTIMES`): `fakebox run --bind SRC,... IMAGE -- COMMAND`. The
`fakebox` command the test puts on PATH records its image and binds and runs COMMAND on the host."""
from typing import ClassVar, Literal, Sequence, Tuple

from dlaunch.runtimes import Runtime


class Fakebox(Runtime):
    kind: Literal["fakebox"]
    binary: ClassVar[str] = "fakebox"

    def prefix(self, image: str, binds: Sequence[str]) -> Tuple[str, ...]:
        return (self.binary, "run", "--bind", ",".join(self.every_bind(binds)), image, "--")
