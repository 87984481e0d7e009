"""The run's MLPerf-format log: `:::MLLOG {json}` lines in `mlperf.log` beside the metrics file.

The keys are those MLPerf's training rules ask of a ResNet run (mlperf-logging's compliance checker,
ruleset training 4.0.0, the last with ResNet): submission and system info, global batch, optimizer and
learning-rate schedule, seed, samples, init/run start and stop, blocks of epochs between evaluations,
epochs, evaluations with their accuracy, the run's status. What a dlaunch run cannot meet (not
ImageNet to 75.9 %, no polynomial LR decay) is listed in README.md ("MLPerf-format logs").

MLPerf's clock stops at the first evaluation that reaches the quality target (`--target-accuracy`,
else MLPerf ResNet's 0.759): `run_stop` with status `success` is written then and the log ends there,
while the trainer trains on (the metrics file has the rest). A run that ends without reaching it
stops `aborted`; an interrupted run writes no `run_stop` and its resumption continues the log.

Written with this small writer, not mlperf-logging's `mllog`: the trainer runs inside images that
carry nothing but it (the paper's image is Python 3.9 with a pinned stack), and the format is one
JSON object per line. Its output is checked with mlperf-logging's own parser and checker in the
tests. Torch-free, standard library only (Python 3.9); rank 0 writes, each line flushed.
"""

import json
import os
import time
from typing import Any, Dict, Optional

MLLOG_FILE = "mlperf.log"
TOKEN = ":::MLLOG "
BENCHMARK = "resnet"
# MLPerf ResNet's quality target: top-1 0.759 (training_4.0.0/closed_resnet.yaml).
MLPERF_TARGET_TOP1 = 0.759
# The division whose rules the log is checked against (the checker lists what a run breaks).
DIVISION = "closed"
SUBMISSION_STATUS = "research"
ORG = "dlaunch"
START, END, POINT = "INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"


def mllog_path(metrics_path: str) -> str:
    """`mlperf.log` in the metrics file's folder (the run directory)."""
    return os.path.join(os.path.dirname(os.path.abspath(metrics_path)), MLLOG_FILE)


class MLPerfLog:
    """Writes `:::MLLOG` lines to `path` (None: nothing, as on ranks other than 0) from `run_start`
    (a new file) or `resume` (appended) on, each line flushed.

    `val_every` and `epochs` give the blocks: epochs `k * val_every ...` up to an evaluation."""

    def __init__(self, path: Optional[str], target: Optional[float], val_every: int, epochs: int):
        self.path = path
        self._file: Any = None
        self.target = MLPERF_TARGET_TOP1 if target is None else target
        self.val_every, self.epochs = val_every, epochs
        self.stopped = False
        self._block_first: Optional[int] = None
        self._eval_samples_logged = False

    def event(
        self,
        key: str,
        value: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        event_type: str = POINT,
        time_s: Optional[float] = None,
    ) -> None:
        if self._file is None or self.stopped:
            return
        line = {
            "namespace": "",
            "time_ms": int(1000 * (time.time() if time_s is None else time_s)),
            "event_type": event_type,
            "key": key,
            "value": value,
            "metadata": metadata or {},
        }
        self._file.write(TOKEN + json.dumps(line) + "\n")
        self._file.flush()

    def run_start(self, header: Dict[str, Any], hyperparameters: Dict[str, Any], init_started_s: float) -> None:
        """Init (from `init_started_s`, the trainer's start) to now, the submission info, the
        hyperparameters and `run_start`; `header`: the metrics header record."""
        self._open("w")
        self.event("init_start", event_type=START, time_s=init_started_s)
        platform = "%dx%s" % (header["nodes"], header.get("site") or (header["hosts"] or ["unknown"])[0])
        for key, value in (
            ("submission_org", ORG),
            ("submission_platform", platform),
            ("submission_division", DIVISION),
            ("submission_status", SUBMISSION_STATUS),
            ("submission_benchmark", BENCHMARK),
            ("dlaunch_run", header["run_id"]),
            ("dlaunch_model", header["model"]),
            ("cache_clear", False),
        ):
            self.event(key, value)
        for key, value in hyperparameters.items():
            self.event(key, value)
        self.event("init_stop", event_type=END)
        self.event("run_start", event_type=START)

    def resume(self) -> None:
        """A resumed run continues its log (one run_start, one run_stop)."""
        self._open("a")

    def _open(self, mode: str) -> None:
        if self.path:
            self._file = open(self.path, mode, encoding="utf-8")  # noqa: SIM115 (open for the run)

    def epoch_start(self, epoch: int) -> None:
        """`epoch` is 0-based; MLPerf counts from 1. A block begins at every `val_every`-th epoch."""
        if epoch % self.val_every == 0:
            self._block_first = epoch + 1
            self.event(
                "block_start",
                event_type=START,
                metadata={"first_epoch_num": epoch + 1, "epoch_count": min(self.val_every, self.epochs - epoch)},
            )
        self.event("epoch_start", event_type=START, metadata={"epoch_num": epoch + 1})

    def epoch_stop(self, epoch: int) -> None:
        self.event("epoch_stop", event_type=END, metadata={"epoch_num": epoch + 1})

    def eval_start(self, epoch: int) -> None:
        self.event("eval_start", event_type=START, metadata={"epoch_num": epoch + 1})

    def eval_stop(self, epoch: int, top1: float, samples: int) -> None:
        """The evaluation's accuracy over `samples` images (logged once as `eval_samples`)."""
        if not self._eval_samples_logged:
            self.event("eval_samples", samples)
            self._eval_samples_logged = True
        self.event("eval_accuracy", top1, metadata={"epoch_num": epoch + 1})
        self.event("eval_stop", event_type=END, metadata={"epoch_num": epoch + 1})

    def block_stop(self, epoch: int) -> None:
        """End of the block that holds `epoch`."""
        if self._block_first is not None:
            self.event("block_stop", event_type=END, metadata={"first_epoch_num": self._block_first})
            self._block_first = None

    def reached(self, top1: Optional[float]) -> None:
        """MLPerf's clock stops at the first evaluation at or above the target."""
        if top1 is not None and top1 >= self.target:
            self.run_stop("success")

    def run_stop(self, status: str) -> None:
        """`success` (the target was reached) or any trainer end status: `interrupted` writes nothing
        (the run resumes), the others stop the run `aborted` (it ended without reaching the target)."""
        if status == "interrupted":
            return
        self.event("run_stop", event_type=END, metadata={"status": "success" if status == "success" else "aborted"})
        self.stopped = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def hyperparameters(
    cfg: Any, schedule: Any, step_batch: int, update_batch: float, steps_per_epoch: int
) -> Dict[str, Any]:
    """MLPerf's optimizer, schedule and batch keys of a run: `schedule` is the trainer's LRSchedule,
    `step_batch` the images of one loop step (all ranks), `update_batch` those of one optimizer update
    (several steps with Horovod's gradient accumulation, one worker's batch with an asynchronous
    parameter server)."""
    values: Dict[str, Any] = {
        "seed": cfg.seed,
        "global_batch_size": int(round(update_batch)),
        "gradient_accumulation_steps": max(1, int(round(update_batch / step_batch))),
        "train_samples": steps_per_epoch * step_batch,
        "opt_name": "sgd",
        "sgd_opt_base_learning_rate": schedule.lr_max,
        "sgd_opt_end_learning_rate": schedule(schedule.total_steps),  # the schedule's value at its end
        "sgd_opt_learning_rate_decay_steps": schedule.total_steps - schedule.warmup_steps,
        "sgd_opt_weight_decay": cfg.weight_decay,
        "sgd_opt_momentum": cfg.momentum,
        "opt_learning_rate_warmup_epochs": cfg.warmup_epochs,
        "opt_learning_rate_decay_schedule": cfg.schedule,
        "model_bn_span": step_batch if cfg.sync_bn else cfg.batch_size,
    }
    if cfg.schedule == "step":
        values.update(
            opt_learning_rate_decay_boundary_epochs=list(schedule.milestones), opt_learning_rate_decay_factor=0.1
        )
    elif cfg.schedule == "exponential":
        values["opt_learning_rate_decay_factor"] = cfg.gamma
    return values
