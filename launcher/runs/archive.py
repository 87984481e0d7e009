"""`dlaunch archive EXPERIMENT -o FILE.tar.gz`: the bundle a user attaches to a paper or a ticket.

Every file of the experiment (or study) directory except checkpoints (scripts, plans, states, logs,
metrics, a report written inside it), the site profiles its runs used (`profiles/`), and
`manifest.json`: each member's sha256 and size. `read_member` reads a run's metrics back out of such a
bundle, after checking its hash (`dlaunch rerun ARCHIVE.tar.gz:RUN`).
"""
import hashlib
import io
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Annotated, Dict, List, Tuple

import typer

from launcher.atomic import atomic_file
from launcher.errors import DlaunchError
from launcher.runs.rundir import RunDir, display_path, find_runs
from launcher.terminal import out
from train.metrics_schema import METRICS_FILE, Metrics, MetricsError, read_metrics

MANIFEST = "manifest.json"
SKIPPED_FOLDERS = ("checkpoints",)  # model weights: large, and not a result


def _profiles(runs: List[RunDir]) -> Dict[str, Path]:
    """Site profile file per name, for the sites the runs' requests named."""
    from launcher.jobs.sites import available_sites

    found = {}
    known = available_sites()
    for run in runs:
        asked = run.plan()["request"]["site"]
        path = Path(asked) if asked.endswith(".toml") else known.get(asked) or known.get(run.plan()["plan"]["site"])
        if path and path.is_file():
            found[path.name] = path
    return found


def members(folder: Path) -> List[Tuple[str, Path]]:
    """(name in the archive, file) for every file to bundle, sorted."""
    runs = find_runs([folder])
    if not runs:
        raise DlaunchError("%s: no run directories to archive" % folder)
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and not path.is_symlink() and not any(part in SKIPPED_FOLDERS for part in relative.parts):
            files.append(("%s/%s" % (folder.name, relative.as_posix()), path))
    files += [("%s/profiles/%s" % (folder.name, name), path) for name, path in sorted(_profiles(runs).items())]
    return files


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_archive(folder: Path, output: Path) -> Dict[str, Dict[str, object]]:
    """Bundle `folder` into `output` (written atomically); return the manifest's files."""
    folder = folder.resolve()
    if not folder.is_dir():
        raise DlaunchError("%s: no such directory" % folder)
    if not output.name.endswith(".tar.gz"):
        raise DlaunchError("--output: %s must end in .tar.gz" % output)
    contents = [(name, path.read_bytes()) for name, path in members(folder)]
    manifest = {name: {"sha256": sha256(data), "bytes": len(data)} for name, data in contents}
    text = json.dumps({"experiment": folder.name, "files": manifest}, indent=2, sort_keys=True).encode()

    def write(tmp: str) -> None:
        with tarfile.open(tmp, "w:gz") as tar:
            for name, data in contents + [("%s/%s" % (folder.name, MANIFEST), text)]:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))

    atomic_file(output, write)
    return manifest


def read_member(archive: Path, member: str) -> Metrics:
    """The metrics of run `member` (EXPERIMENT/RUN..., or its metrics.jsonl) in an archive, hash checked."""
    name = member if member.endswith(METRICS_FILE) else member.rstrip("/") + "/" + METRICS_FILE
    try:
        with tarfile.open(archive, "r:gz") as tar:
            manifest = json.load(tar.extractfile("%s/%s" % (name.split("/", 1)[0], MANIFEST)))["files"]
            if name not in manifest:
                runs = sorted(n.rsplit("/", 1)[0] for n in manifest if n.endswith("/" + METRICS_FILE))
                raise DlaunchError("%s: no run %s (runs: %s)" % (archive, member, ", ".join(runs)))
            data = tar.extractfile(name).read()
    except (OSError, tarfile.TarError, KeyError) as e:
        raise DlaunchError("%s: not a dlaunch archive (%s)" % (archive, e)) from None
    if sha256(data) != manifest[name]["sha256"]:
        raise DlaunchError("%s: %s does not match its sha256 in %s" % (archive, name, MANIFEST))
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as tmp:
        tmp.write(data)
        tmp.flush()
        try:
            metrics = read_metrics(tmp.name)
        except MetricsError as e:
            raise DlaunchError(str(e).replace(tmp.name, "%s:%s" % (archive, name))) from None
    metrics.path = "%s:%s" % (archive, name)
    return metrics


def archive_command(
    experiment: Annotated[Path, typer.Argument(help="experiment or study directory")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the bundle, FILE.tar.gz")],
) -> int:
    """Bundle an experiment's scripts, plans, profiles, metrics, logs and report with a sha256 manifest."""
    manifest = write_archive(experiment, output)
    size = sum(int(entry["bytes"]) for entry in manifest.values())
    out.print("wrote %s: %d files, %d bytes before compression, manifest %s/%s"
              % (display_path(output), len(manifest), size, experiment.resolve().name, MANIFEST), markup=False, highlight=False)
    return 0
