"""`MetricsWriter` (rank 0: one validated JSON line per record, flushed and fsynced, append mode),
provenance capture for the header, and the closing summary table."""
import hashlib
import json
import os
import platform
import subprocess
import time
from typing import Any, Dict, List, Optional

import torch
import torchvision

from train.metrics_schema import abstract_request, energy_total, make_record


class MetricsWriter:
    """Appends records to a metrics file; never truncates (a resumed run continues the same file)."""

    def __init__(self, path: str):
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def write(self, record_type: str, **fields: Any) -> Dict[str, Any]:
        if record_type == "header":
            fields = dict(header_links(), **fields)
            fields.setdefault("request", abstract_request(fields))
        record = make_record(record_type, time.time(), **fields)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        return record

    def close(self) -> None:
        self._file.close()


def header_links() -> Dict[str, Any]:
    """The header's `parent_run` ($DLAUNCH_PARENT_RUN, set by `dlaunch rerun`) and `script_sha256` (the
    run directory's job.sh), where known."""
    links: Dict[str, Any] = {}
    if os.environ.get("DLAUNCH_PARENT_RUN"):
        links["parent_run"] = os.environ["DLAUNCH_PARENT_RUN"]
    script = os.path.join(os.environ.get("DLAUNCH_RUN_DIR") or "", "job.sh")
    if os.environ.get("DLAUNCH_RUN_DIR") and os.path.isfile(script):
        with open(script, "rb") as f:
            links["script_sha256"] = hashlib.sha256(f.read()).hexdigest()
    return links


def library_versions() -> Dict[str, Optional[str]]:
    """python, torch, torchvision, CUDA, NCCL, cuDNN (None where absent)."""
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (RuntimeError, AttributeError):
            nccl = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "cudnn": str(cudnn) if cudnn else None,
    }


def git_revision() -> Optional[str]:
    """$DLAUNCH_GIT_REVISION, else `git rev-parse HEAD` of the trainer's source tree, else None."""
    revision = os.environ.get("DLAUNCH_GIT_REVISION")
    if revision:
        return revision
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode().strip() or None


def run_id() -> str:
    """The run directory's name when the launcher set one, else a fresh id."""
    run_dir = os.environ.get("DLAUNCH_RUN_DIR")
    if run_dir:
        return os.path.basename(os.path.normpath(run_dir))
    return "%s-%s" % (time.strftime("%Y%m%d-%H%M%S"), os.urandom(3).hex())


def print_summary(epochs: List[Dict[str, Any]], end: Dict[str, Any]) -> None:
    """A short table of the epochs and the end record (rich if importable, else plain text)."""
    columns = ("epoch", "images/s", "time s", "loss", "lr", "top1")
    rows = [(str(e["epoch"]), "%.1f" % e["images_per_s"], "%.2f" % e["epoch_time_s"], "%.4f" % e["loss"],
             "%.4g" % e["lr"], "-" if e.get("top1") is None else "%.4f" % e["top1"]) for e in epochs]
    title = "train: %s after %.1f s" % (end["status"], end["total_time_s"])
    if end.get("time_to_accuracy_s") is not None:
        title += ", time to accuracy %.1f s" % end["time_to_accuracy_s"]
    energy = energy_total(end.get("energy_j"))
    if energy is not None:
        title += ", energy %.1f kJ (%s)" % (energy[0] / 1000, energy[1])
    if end.get("energy_to_accuracy_j") is not None:
        title += ", energy to accuracy %.1f kJ" % (end["energy_to_accuracy_j"] / 1000)
    if end.get("reason"):
        title += "\n" + end["reason"]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print("  ".join("%10s" % c for c in columns))
        for row in rows:
            print("  ".join("%10s" % c for c in row))
        return
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)
