"""Atomic file writes: readers see the old file or the new one, never half of one, even after a crash."""

import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_file(path: Path, write: Callable[[str], object], mode: int = 0o644) -> None:
    """Let `write(tmp)` fill a temporary file beside `path`; fsync it and rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` atomically."""
    atomic_file(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), mode)
