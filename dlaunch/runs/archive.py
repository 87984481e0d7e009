"""`dlaunch archive EXPERIMENT -o FILE.tar.gz`: the bundle a user attaches to a paper or a ticket.

Every file of the experiment (or study) directory except checkpoints (scripts, plans, the site profile
each run was made from (`site.toml`, saved when it was submitted), states, logs, metrics, a report
written inside it), and `manifest.json`: each member's sha256 and size. Only regular files inside the
folder are bundled: symbolic links are left out, never followed (a profile linked to /etc/shadow stays
out). Files are streamed into the bundle (bounded memory for any size). `read_member` reads a run's
metrics back out of such a bundle, after checking its hash (`dlaunch rerun ARCHIVE.tar.gz:RUN`).
"""

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Annotated, BinaryIO, Dict, List, Tuple

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from dlaunch.atomic import atomic_file
from dlaunch.boundary import MAX_FILE_BYTES, display_path, escape, output_file, parse_json, validate
from dlaunch.errors import DlaunchError
from dlaunch.runs.rundir import SITE_PROFILE, RunDir, find_runs
from dlaunch.train.metrics_schema import (
    MAX_METRICS_BYTES,
    METRICS_FILE,
    FileRefused,
    Metrics,
    MetricsError,
    open_regular,
    parse_metrics,
)

MANIFEST = "manifest.json"
SKIPPED_FOLDERS = ("checkpoints",)  # model weights: large, and not a result


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    bytes: int = Field(ge=0)


class Manifest(BaseModel):
    """`manifest.json`: every member's hash and size."""

    model_config = ConfigDict(extra="forbid", strict=True)

    experiment: str
    files: Dict[str, Entry]


def members(folder: Path) -> List[Tuple[str, Path]]:
    """(name in the archive, file) for every regular file to bundle, sorted; links are left out."""
    runs = find_runs([folder])
    if not runs:
        raise DlaunchError("%s: no run directories to archive" % display_path(folder))
    files = []
    for path in sorted(folder.rglob("*")):  # rglob does not descend into linked folders
        relative = path.relative_to(folder)
        if path.is_file() and not path.is_symlink() and not any(part in SKIPPED_FOLDERS for part in relative.parts):
            files.append(("%s/%s" % (folder.name, relative.as_posix()), path))
    return files


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Hashing:
    """A file read through, its sha256 and byte count kept."""

    def __init__(self, f: BinaryIO):
        self.f, self.hash, self.bytes = f, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.hash.update(data)
        self.bytes += len(data)
        return data


def write_archive(folder: Path, output: Path) -> Dict[str, Dict[str, object]]:
    """Bundle `folder` into `output` (written atomically); return the manifest's files."""
    folder = folder.resolve()
    if not folder.is_dir():
        raise DlaunchError("%s: no such directory" % display_path(folder))
    if not output.name.endswith(".tar.gz"):
        raise DlaunchError("--output: %s must end in .tar.gz" % display_path(output))
    output_file("--output", output)
    files = members(folder)
    manifest: Dict[str, Dict[str, object]] = {}

    def write(tmp: str) -> None:
        with tarfile.open(tmp, "w:gz") as tar:
            for name, path in files:
                try:
                    with open_regular(str(path), limit=2**62, follow_links=False) as f:
                        info = tarfile.TarInfo(name)
                        info.size, info.mode, info.mtime = os.fstat(f.fileno()).st_size, 0o644, 0
                        reader = _Hashing(f)
                        tar.addfile(info, reader)  # reads info.size bytes (a log still growing is cut there)
                except (FileRefused, OSError) as e:
                    raise DlaunchError("%s: %s" % (display_path(path), getattr(e, "strerror", None) or e)) from None
                manifest[name] = {"sha256": reader.hash.hexdigest(), "bytes": reader.bytes}
            text = json.dumps({"experiment": folder.name, "files": manifest}, indent=2, sort_keys=True).encode()
            info = tarfile.TarInfo("%s/%s" % (folder.name, MANIFEST))
            info.size, info.mode, info.mtime = len(text), 0o644, 0
            tar.addfile(info, io.BytesIO(text))

    atomic_file(output, write)
    return manifest


def _member(tar: tarfile.TarFile, name: str, limit: int, archive: Path) -> bytes:
    """The bytes of a regular member of at most `limit` bytes."""
    info = tar.getmember(name)
    if not info.isfile():
        raise DlaunchError("%s: %s is not a regular file" % (display_path(archive), escape(name)))
    if info.size > limit:
        raise DlaunchError(
            "%s: %s has %d bytes, more than the %d it may have"
            % (display_path(archive), escape(name), info.size, limit)
        )
    return tar.extractfile(info).read(limit + 1)  # type: ignore[union-attr]  # a regular member (checked above) has its bytes


def _manifest(tar: tarfile.TarFile, name: str, archive: Path) -> Dict[str, Entry]:
    """The files of manifest member `name`, validated."""
    shown = "%s:%s" % (display_path(archive), escape(name))
    text = _member(tar, name, MAX_FILE_BYTES, archive).decode("utf-8", errors="strict")
    return validate(Manifest, parse_json(text, shown), shown).files


def _runs(manifest: Dict[str, Entry]) -> str:
    """The runs (EXPERIMENT/RUN) a manifest lists, for messages."""
    return escape(", ".join(sorted(n.rsplit("/", 1)[0] for n in manifest if n.endswith("/" + METRICS_FILE))))


NOT_AN_ARCHIVE = (OSError, tarfile.TarError, KeyError, UnicodeDecodeError, EOFError)


def archive_runs(archive: Path) -> str:
    """The runs in an archive, as `rerun ARCHIVE.tar.gz:RUN` names them."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            manifests = [n for n in tar.getnames() if n.count("/") == 1 and n.endswith("/" + MANIFEST)]
            if len(manifests) != 1:
                raise KeyError("%d top-level %s" % (len(manifests), MANIFEST))
            return _runs(_manifest(tar, manifests[0], archive))
    except NOT_AN_ARCHIVE as e:
        raise DlaunchError("%s: not a dlaunch archive (%s)" % (display_path(archive), escape(str(e)))) from None


def read_member(archive: Path, member: str) -> Metrics:
    """The metrics of run `member` (EXPERIMENT/RUN..., or its metrics.jsonl) in an archive, hash checked;
    members are read into memory, bounded, never written anywhere."""
    name = member if member.endswith(METRICS_FILE) else member.rstrip("/") + "/" + METRICS_FILE
    shown = "%s:%s" % (display_path(archive), escape(name))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            manifest = _manifest(tar, "%s/%s" % (name.split("/", 1)[0], MANIFEST), archive)
            if name not in manifest:
                raise DlaunchError(
                    "%s: no run %s (runs: %s)" % (display_path(archive), escape(member), _runs(manifest))
                )
            data = _member(tar, name, MAX_METRICS_BYTES, archive)
    except NOT_AN_ARCHIVE as e:
        raise DlaunchError("%s: not a dlaunch archive (%s)" % (display_path(archive), escape(str(e)))) from None
    if sha256(data) != manifest[name].sha256:
        raise DlaunchError("%s: %s does not match its sha256 in %s" % (display_path(archive), escape(name), MANIFEST))
    try:
        metrics = parse_metrics(data, shown)
    except MetricsError as e:
        raise DlaunchError(str(e)) from None
    metrics.path = "%s:%s" % (archive, name)
    return metrics


def runs_without_profile(folder: Path) -> List[RunDir]:
    """The runs under `folder` that kept no site profile (submitted before dlaunch kept the one a job was made from)."""
    return [
        run
        for run in find_runs([folder])
        if (run.path / SITE_PROFILE).is_symlink() or not (run.path / SITE_PROFILE).is_file()
    ]
