"""Reading an image file's CPU architecture without starting it (`Runtime.read_arch`, for `dlaunch doctor`)."""

import os
from pathlib import Path

# `uname -m` names of ELF e_machine values (the ELF specification's EM_* numbers).
ELF_MACHINES = {3: "i686", 40: "arm", 62: "x86_64", 183: "aarch64", 21: "ppc64le", 243: "riscv64"}
# SIF global header (github.com/sylabs/sif, pkg/sif/sif.go): 32-byte launch line, "SIF_MAGIC\0", a 3-byte
# version, then a 3-byte architecture code.
SIF_MAGIC = b"SIF_MAGIC"
SIF_ARCHES = {b"01": "i686", b"02": "x86_64", b"03": "arm", b"04": "aarch64", b"06": "ppc64le", b"11": "s390x"}


def resolve_in_root(root: Path, path: str, max_links: int = 40) -> Path:
    """`path` inside the file system tree at `root`, following symbolic links as a chroot would."""
    parts = [p for p in path.split("/") if p]
    current = root
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            current = current if current == root else current.parent
            continue
        candidate = current / part
        if part != "." and candidate.is_symlink():
            links += 1
            if links > max_links:
                raise OSError("too many symbolic links under %s" % root)
            target = os.readlink(candidate)
            parts = [p for p in target.split("/") if p] + parts
            current = root if target.startswith("/") else current
        elif part != ".":
            current = candidate
    return current


def elf_machine(path: Path) -> str:
    """The `uname -m` name of an ELF file's machine (e_machine at byte 18, in the file's byte order)."""
    with path.open("rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise ValueError("%s is not an ELF file" % path)
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return ELF_MACHINES.get(machine, "e_machine %d" % machine)


def sif_arch(path: Path) -> str:
    """The architecture in a SIF image's global header (written by apptainer/singularity at build)."""
    with path.open("rb") as f:
        head = f.read(48)
    if head[32:41] != SIF_MAGIC:
        raise ValueError("%s is not a SIF image" % path)
    return SIF_ARCHES.get(head[45:47], "SIF code %s" % head[45:47].decode(errors="replace"))


def tree_arch(root: Path) -> str:
    """The architecture of an unpacked root file system: its /bin/sh's."""
    return elf_machine(resolve_in_root(root, "/bin/sh"))
