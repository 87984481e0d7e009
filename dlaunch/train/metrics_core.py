"""The engine-free part of the metrics: `MetricsWriter` (rank 0: one validated JSON line per record,
flushed and fsynced, append mode), provenance (run id, git revision, rerun links) and the closing
summary table. Torch-free and stdlib-only (Python 3.9), shared by the PyTorch, TensorFlow and MXNet
trainers so that `dlaunch report` reads every engine's runs alike; `dlaunch/train/metrics.py` adds torch's
library versions.
"""

import hashlib
import json
import os
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional

from dlaunch.train import jobenv
from dlaunch.train.heartbeat import hung_end_fields
from dlaunch.train.metrics_schema import STEP_PHASES, abstract_request, energy_total, make_record


class MetricsWriter:
    """Appends records to a metrics file; never truncates (a resumed run continues the same file)."""

    def __init__(self, path: str):
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the run: a record per write)
        # The watchdog's thread writes a hung run's end record (dlaunch/train/watchdog.py).
        self._lock = threading.Lock()

    def write(self, record_type: str, **fields: Any) -> Dict[str, Any]:
        if record_type == "header":
            fields = dict(header_links(), **fields)
            fields.setdefault("request", abstract_request(fields))
        record = make_record(record_type, time.time(), **fields)
        with self._lock:
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


def git_revision() -> Optional[str]:
    """$DLAUNCH_GIT_REVISION, else `git rev-parse HEAD` of the trainer's source tree, else None."""
    revision = os.environ.get("DLAUNCH_GIT_REVISION")
    if revision:
        return revision
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=True,
        )
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
    """A short table of the epochs and the end record (rich if importable, else plain text). Its images/s is each
    epoch's steps-only rate; the time outside the steps (`overhead`) is its own column ("-": not recorded),
    and the last epoch's per-rank phases, where recorded, close the title."""
    columns = ("epoch", "images/s (steps)", "steps s", "overhead s", "loss", "lr", "top1")
    rows = [
        (
            str(e["epoch"]),
            "%.1f" % e["images_per_s"],
            "%.2f" % e["epoch_time_s"],
            "%.2f" % e["overhead"]["total_s"] if "overhead" in e else "-",
            "%.4f" % e["loss"],
            "%.4g" % e["lr"],
            "-" if e.get("top1") is None else "%.4f" % e["top1"],
        )
        for e in epochs
    ]
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
    if epochs and "phases" in epochs[-1]:
        title += "\n" + phases_line(epochs[-1]["phases"])
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


def phases_line(phases: Dict[str, Any]) -> str:
    """One line of an epoch record's `phases`: the median rank's seconds per step and the slowest rank's compute."""
    median, slowest = phases["median"], phases["slowest"]
    return "last epoch, median rank per step: %s; rank %d (%s, local rank %d) computed longest: %.4f s" % (
        ", ".join("%s %.4f s" % (name[:-2], median[name]) for name in STEP_PHASES),
        slowest["rank"],
        slowest["host"],
        slowest["local_rank"],
        slowest["compute_s"],
    )


class RunRecorder:
    """The header, epoch and end records of a task-per-worker engine's run (TensorFlow, MXNet).

    The writing task (`is_main`) writes; the others only keep the bookkeeping. Throughput counts the
    whole job's images between two points at which all workers have finished the steps before.
    """

    def __init__(self, cfg: Any, argv: List[str], entry: str, is_main: bool):
        self.cfg, self.argv, self.entry = cfg, argv, entry
        self.started = time.perf_counter()
        self.writer = MetricsWriter(cfg.metrics_path) if is_main else None
        self.epochs: List[Dict[str, Any]] = []
        self.best_top1: Optional[float] = None
        self.time_to_accuracy: Optional[float] = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def header(self, **fields: Any) -> None:
        """`fields`: device, world_size, hosts, global_batch, lr_scaled, versions, framework_settings,
        loader_settings (the rest comes from the configuration and the environment)."""
        cfg = self.cfg
        if self.writer:
            self.writer.write(
                "header",
                run_id=run_id(),
                argv=[self.entry] + self.argv,
                config=cfg.to_dict(),
                framework=cfg.framework,
                loader="native",
                model=cfg.model,
                nodes=len(set(fields["hosts"])),
                batch_per_worker=cfg.batch_size,
                slurm_job_id=jobenv.job_id(os.environ),
                scheduler=jobenv.scheduler(os.environ),
                site=cfg.site,
                experiment=cfg.experiment,
                image=cfg.image,
                git_revision=git_revision(),
                **fields,
            )

    def epoch(
        self,
        epoch: int,
        steps: int,
        images: int,
        measured_s: float,
        epoch_s: float,
        data_wait_s: float,
        loss: float,
        lr: float,
        validation: Optional[Dict[str, float]] = None,
    ) -> None:
        """One epoch; `validation`: top1, top5, val_loss (fractions, mean cross-entropy)."""
        fields = dict(validation or {})
        if validation:
            if self.best_top1 is None or validation["top1"] > self.best_top1:
                self.best_top1 = validation["top1"]
            target = self.cfg.target_accuracy
            if target is not None and self.time_to_accuracy is None and validation["top1"] >= target:
                self.time_to_accuracy = self.elapsed()
        if self.writer:
            self.epochs.append(
                self.writer.write(
                    "epoch",
                    epoch=epoch,
                    steps=steps,
                    images=images,
                    images_per_s=images / measured_s if measured_s > 0 else 0.0,
                    epoch_time_s=epoch_s,
                    data_wait_s=data_wait_s,
                    loss=loss,
                    lr=lr,
                    **fields,
                )
            )

    def hung(self, record: Dict[str, Any]) -> None:
        """The end record of a run found hung (dlaunch/train/watchdog.py's thread calls it, then the process exits)."""
        if self.writer:
            self.writer.write(
                "end",
                status="hung",
                total_time_s=self.elapsed(),
                epochs_completed=len(self.epochs),
                best_top1=self.best_top1,
                target_accuracy=self.cfg.target_accuracy,
                time_to_accuracy_s=self.time_to_accuracy,
                **hung_end_fields(record),
            )

    def end(self, status: str, reason: Optional[str] = None, param_digests: Optional[List[str]] = None) -> None:
        if not self.writer:
            return
        fields: Dict[str, Any] = {"param_digests": param_digests} if param_digests else {}
        end = self.writer.write(
            "end",
            status=status,
            total_time_s=self.elapsed(),
            epochs_completed=len(self.epochs),
            best_top1=self.best_top1,
            target_accuracy=self.cfg.target_accuracy,
            time_to_accuracy_s=self.time_to_accuracy,
            reason=reason,
            **fields,
        )
        self.writer.close()
        print_summary(self.epochs, end)
