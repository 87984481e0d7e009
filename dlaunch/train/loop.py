"""The training loop: framework- and loader-agnostic (it only calls `Framework` and the loader interface).

Per step: set the LR of `global_step` (dlaunch/train/schedule.py), forward (autocast per `--amp`), backward,
gradients ready (`Framework.synchronize_gradients`), optimizer step; every `STOP_CHECK_STEPS` steps, and after
each epoch's checkpoint, all ranks agree whether a stop signal arrived (an all-reduce and a device sync, so not
every step). Per epoch: throughput of the whole job over the non-warm-up, non-profiled steps (rank 0, after a
device sync and a barrier at both ends of the measured window), rank-mean loss and data wait, validation
(counts summed over ranks), a checkpoint, then the `epoch` record (so it carries this epoch's validation and
checkpoint).

Where the time goes (dlaunch/train/phases.py, metrics version 4): every rank times the phases of its measured
steps (data, compute, sync, optimizer; CUDA events on a GPU, no extra device sync) and the epoch's parts outside
the steps (loader start, validation, checkpoint, barriers, metrics); GPU health (dlaunch/train/gpuhealth.py) is
sampled with the energy counters. One gather per epoch brings every rank's figures to rank 0, which writes
`phases` (median and slowest rank), `nodes` (per node) and `overhead` (its own) into the epoch record.

Energy (dlaunch/train/energy.py): every rank reads its counters at each stop check and at the end of each
epoch (after validation), where one sum over ranks gives the run's energy so far; an epoch's energy
is the difference to the epoch's start, energy-to-accuracy the run's energy at the first validation
that reaches `--target-accuracy` (the Zeus definition). A resumed run carries the energy before.

Divergence: each step's loss is checked on the device (no sync); a rank that saw
`--max-nonfinite-steps` consecutive non-finite losses tells the others at the next stop check or
epoch end, and all stop with status `diverged` without checkpointing the non-finite weights.

The MLPerf-format log (`mlperf.log` beside the metrics file, dlaunch/train/mllog.py) is written at the same
moments by rank 0: init and run start, blocks, epochs, evaluations, run stop.

Within an epoch rank 0 writes `progress.json` beside the metrics file after a step every few seconds
(dlaunch/train/progress.py: steps, images/s of the epoch's measured steps so far, its loss, one device sync per
write to read the loss, none more with --host-syncs minimal).

Hang detection (dlaunch/train/watchdog.py, issue 44): the loop tells the process's watchdog its phase (data, forward,
backward, sync, optimizer, stop check, loader start, epoch boundary) and each finished step, and brackets validation and
the checkpoint as sections with allowances of their own; a thread writes the heartbeat and, when no step finishes within
the hang timeout, dumps the stacks and the flight recorder (dlaunch/train/flight_recorder.py, turned on before the process
group starts), and the run ends `hung` (exit 69).

The workload options (dlaunch/train/workload.py) change how a step runs, not what it computes: --compile (the
first step compiles; its wall time is the epoch record's `compile_s`), --cuda-graphs (the step captured at the last
warm-up step and replayed; its parts are not timed), --optimizer-impl, --host-syncs minimal (the losses are read at
the stop checks).

Warm-up and profiled steps (`--warmup-steps`, then `--profile-steps` timed without overlap, then
`--kernel-profile-steps` under torch.profiler) are counted from the start of this process, so a resumed
run warms up again before it measures; none of them count for throughput. A kernel profile may run to
the end of the run (a profiling run then reports no throughput).
"""

import contextlib
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from dlaunch.train import flight_recorder, jobenv
from dlaunch.train.checkpoint import checkpoint_path, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from dlaunch.train.config import (
    EXIT_BAD_INPUT,
    EXIT_CANCELLED,
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ConfigError,
    TrainConfig,
)
from dlaunch.train.data import build_loaders
from dlaunch.train.energy import EnergyMeter, Figure
from dlaunch.train.engines import threads_per_rank
from dlaunch.train.frameworks.base import DistInfo, Framework
from dlaunch.train.gpuhealth import GpuHealth
from dlaunch.train.heartbeat import hung_end_fields
from dlaunch.train.metrics import library_versions
from dlaunch.train.metrics_core import MetricsWriter, git_revision, print_summary, run_id
from dlaunch.train.metrics_schema import UNAVAILABLE, energy_total, is_number, unavailable
from dlaunch.train.mllog import MLPerfLog, hyperparameters, mllog_path
from dlaunch.train.models import build_model
from dlaunch.train.network import NCCL_LOG_DIR, by_node, nccl_warnings, observe, route_nccl_debug
from dlaunch.train.phases import EpochOverhead, StepTimer, gather_rows, overhead_fields, phase_fields, rank_row
from dlaunch.train.profiling import KernelProfiler, StepProfiler, kernel_fields, unavailable_kernel_fields
from dlaunch.train.progress import ProgressFile, finite_or_none, interval_s, progress_path
from dlaunch.train.schedule import LRSchedule
from dlaunch.train.signals import STOP_STATUSES, StopSignals
from dlaunch.train.watchdog import Watchdog
from dlaunch.train.workload import (
    CapturedStep,
    FirstStepClock,
    HostLosses,
    LearningRate,
    TorchFeatures,
    build_optimizer,
    compiled_graphs,
    host_syncs_seen,
    loss_keeper,
    optimizer_impl,
    torch_refusal,
)

# Steps between stop-signal checks: bounds the extra work after Slurm's warning (sent 120 s early)
# while keeping the all-reduce and device sync of a check off most steps.
STOP_CHECK_STEPS = 10
EXIT_CODES = {"ok": EXIT_OK, "interrupted": EXIT_INTERRUPTED, "cancelled": EXIT_CANCELLED, "diverged": EXIT_DIVERGED}


def autocast(cfg: TrainConfig, device: torch.device) -> Any:
    """--amp's autocast (without its cast cache under --cuda-graphs, as torch.cuda.graph requires)."""
    if cfg.amp == "none":
        return contextlib.nullcontext()
    cache = {"cache_enabled": False} if cfg.cuda_graphs else {}
    return torch.autocast(device.type, dtype=torch.bfloat16 if cfg.amp == "bf16" else torch.float16, **cache)


@dataclass
class EpochProgress:
    """Accumulators of one epoch (kept in a mid-epoch checkpoint). Loss and data wait are rank means."""

    steps: int = 0
    loss_sum: float = 0.0
    measured_steps: int = 0
    measured_time: float = 0.0
    data_wait: float = 0.0
    time: float = 0.0
    energy_start_j: Dict[str, float] = field(default_factory=dict)  # the run's energy when the epoch began


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        argv: List[str],
        framework: Framework,
        dist: DistInfo,
        signals: StopSignals,
        watch: Watchdog,
    ):
        self.cfg, self.argv, self.fw, self.dist, self.signals, self.watch = cfg, argv, framework, dist, signals, watch
        self.init_started = time.time()  # MLPerf's init_start
        self.device = dist.device
        self.writer: Optional[MetricsWriter] = None
        self.started = time.perf_counter()
        self.elapsed_before = 0.0  # run time before the checkpoint this process resumed from
        self.best_top1: Optional[float] = None
        self.time_to_accuracy: Optional[float] = None
        self.epoch_records: List[Dict[str, Any]] = []
        self.session_steps = 0
        self.epochs_completed = 0
        self.meter = EnergyMeter.for_rank(dist.device, dist.rank, dist.world_size, dist.local_rank)
        self.health = GpuHealth.for_device(dist.device)
        self.hosts: List[str] = []  # every rank's host, index = rank
        # The next epoch's time outside its steps: writing this epoch's record and the stop check after it count there.
        self.next_overhead = EpochOverhead()
        self.energy_before: Dict[str, float] = {}  # the run's energy before this process (resume)
        self.energy_j: Dict[str, Figure] = {}  # the run's energy at the last reading
        self.energy_to_accuracy: Optional[float] = None
        # The epoch's loss sum and the streaks of non-finite losses (on the device, or read at the stop checks).
        self.losses = loss_keeper(cfg, dist.device)
        self.first_step = FirstStepClock(self.synchronize)  # compile_s (--compile)
        self.graphs_counted = 0  # compiled_graphs() when this epoch's steps after the warm-up began
        self.step_host_syncs: Optional[List[str]] = None  # --host-syncs minimal on CUDA: the checked step's syncs

        torch.set_num_threads(threads_per_rank(cfg.threads, dist.local_world_size))
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        torch.manual_seed(cfg.seed)
        self.loaders = build_loaders(cfg, dist)
        batches = len(self.loaders.train)
        self.steps_per_epoch = min(cfg.steps, batches) if cfg.steps else batches
        self.total_steps = cfg.steps if cfg.steps else cfg.epochs * self.steps_per_epoch  # type: ignore[operator]  # the configuration gives --epochs where --steps is not given
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        self.kernel_steps = min(
            cfg.kernel_profile_steps, max(0, self.total_steps - cfg.warmup_steps - cfg.profile_steps)
        )
        if cfg.warmup_steps + cfg.profile_steps >= self.total_steps:
            raise ConfigError(
                "--warmup-steps %d + --profile-steps %d leave none of the %d steps to measure"
                % (cfg.warmup_steps, cfg.profile_steps, self.total_steps)
            )
        self.global_batch = cfg.batch_size * dist.world_size  # images per loop step
        self.update_batch = self.global_batch * framework.batches_per_update(cfg)  # images per optimizer update
        self.schedule = LRSchedule(
            cfg.lr,
            cfg.reference_batch,
            self.update_batch,
            self.steps_per_epoch,
            self.total_steps,
            cfg.schedule,
            cfg.warmup_epochs,
            cfg.lr_min,
            cfg.gamma,
        )

        memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
        self.model = build_model(cfg.model, cfg.num_classes).to(self.device, memory_format=memory_format)
        self.optimizer = build_optimizer(self.model, cfg)
        self.wrapped, _ = framework.wrap(self.model, self.optimizer, cfg)
        self.timer = StepTimer(self.device)
        if cfg.compile == "off":
            self.timer.install(self.model)  # the model itself: its forward runs inside any wrapper's
        else:  # the forward marks around the compiled call: hooks inside it would be compiled into it
            self.wrapped = framework.compile(self.wrapped, cfg.compile)
            self.timer.install(self.wrapped)
        self.lr = LearningRate(self.device if cfg.cuda_graphs else None)
        self.captured = CapturedStep(self.train_step, cfg.warmup_steps - 1) if cfg.cuda_graphs else None
        self.criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        self.profiler = StepProfiler(framework, framework.parameters(self.model), self.synchronize, dist.world_size)
        self.kernel_profiler = KernelProfiler(self.synchronize) if self.device.type == "cuda" else None
        self.mllog = MLPerfLog(
            mllog_path(cfg.metrics_path) if dist.is_main else None, cfg.target_accuracy, cfg.val_every, self.epochs
        )
        self.progress_file = (
            ProgressFile(progress_path(cfg.metrics_path), interval_s(os.environ)) if dist.is_main else None
        )

    # -- collectives and clocks ------------------------------------------------------------------
    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def synced_time(self) -> float:
        """perf_counter once the device and all ranks are done with everything before."""
        self.synchronize()
        self.fw.barrier()
        return time.perf_counter()

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started

    def rank_means(self, values: List[float]) -> List[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        return self.fw.all_reduce_mean(tensor).tolist()

    def agreed_stop(self) -> Optional[str]:
        """`diverged` / `cancelled` / `interrupted` when any rank diverged / got SIGTERM / SIGUSR1, on every
        rank alike (no checkpoint is worth resuming from non-finite weights, so divergence comes first)."""
        self.watch.phase("stop check")
        flags = torch.tensor(self.signals.flags(), dtype=torch.float64, device=self.device)
        usr1, term, diverged = self.fw.all_reduce_sum(torch.cat([flags, self.losses.diverged_flag()])).tolist()
        if diverged > 0:
            return "diverged"
        if term > 0:
            return "cancelled"
        return "interrupted" if usr1 > 0 else None

    def write_kernel_profile(self) -> None:
        """The `kernel_profile` record: every rank's kernel time per class, summed (one collective)."""
        ranks = self.dist.world_size
        if self.kernel_profiler is None:
            fields = unavailable_kernel_fields("no CUDA device (a %s run)" % self.device.type, self.kernel_steps, ranks)
        else:
            summed = self.fw.all_reduce_sum(
                torch.tensor(self.kernel_profiler.finish(), dtype=torch.float64, device=self.device)
            ).tolist()
            fields = kernel_fields(summed, self.kernel_steps, ranks, self.kernel_profiler.times.top())
        if self.writer:
            self.writer.write("kernel_profile", **fields)

    def read_energy(self) -> Any:
        """The run's energy so far on every rank (one collective); returns the reading."""
        reading = self.meter.reduce(self.fw.all_reduce_sum)
        self.energy_j = {
            d: self.energy_before.get(d, 0.0) + v if is_number(v) else v for d, v in reading.energy_j.items()
        }
        return reading

    def measured_energy(self) -> Dict[str, float]:
        return {d: v for d, v in self.energy_j.items() if is_number(v)}

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> str:
        """Train to the end or to a stop signal; return the end status."""
        cfg = self.cfg
        start_epoch, skip, progress = 0, 0, EpochProgress()
        self.global_step = 0
        state = load_checkpoint(checkpoint_path(cfg.checkpoint_dir)) if cfg.resume else None  # type: ignore[arg-type]  # --resume needs --checkpoint-dir (config.py)
        if state is not None:
            start_epoch, skip, progress = self.restore(state)
        self.hosts = hosts = self.fw.all_gather_object(socket.gethostname())
        network = self.network_records()
        if self.dist.is_main:
            continuing = os.path.exists(cfg.metrics_path) and os.path.getsize(cfg.metrics_path) > 0
            self.writer = MetricsWriter(cfg.metrics_path)
            self.watch.on_hung = self.write_hung_end
            if state is not None and continuing:
                self.writer.write(
                    "resume",
                    epoch=start_epoch,
                    step=self.global_step,
                    checkpoint=checkpoint_path(cfg.checkpoint_dir),  # type: ignore[arg-type]  # a state is read only with --resume, which needs --checkpoint-dir
                    network=network,
                )
                self.mllog.resume()
            else:
                header = self.writer.write("header", network=network, **self.header_fields(hosts))
                self.mllog.run_start(
                    header,
                    hyperparameters(cfg, self.schedule, self.global_batch, self.update_batch, self.steps_per_epoch),
                    self.init_started,
                )
        for epoch in range(start_epoch, self.epochs):
            status = self.train_epoch(epoch, skip, progress)
            if status is None:  # a signal during validation or the checkpoint: no new epoch begins, the run is not ok
                with self.next_overhead.timed("barrier_s"):
                    status = self.agreed_stop()
            if status is not None:
                return status
            skip, progress = 0, EpochProgress()
        return "ok"

    def train_epoch(self, epoch: int, skip: int, progress: EpochProgress) -> Optional[str]:
        cfg = self.cfg
        overhead, self.next_overhead = self.next_overhead, EpochOverhead()
        loader = self.loaders.train
        self.watch.epoch_began(epoch)
        with overhead.timed("loader_start_s"):
            loader.set_epoch(epoch, skip)
        self.model.train()
        if not progress.energy_start_j:
            progress.energy_start_j = self.measured_energy() or dict(self.energy_before)
        self.meter.start_epoch()
        if skip == 0:
            self.mllog.epoch_start(epoch)
        with overhead.timed("loader_start_s"):
            batches = iter(loader)
        epoch_start = time.perf_counter()
        window_start: Optional[float] = None
        self.losses.new_epoch()
        data_wait = 0.0
        measured_steps = 0
        first_step = progress.steps  # this process's first step of the epoch (a resumed one: not 0)
        settled_steps = progress.steps  # the steps whose losses the loss keeper holds read (--host-syncs minimal)
        warmup_and_profile = cfg.warmup_steps + cfg.profile_steps
        kernel_end = warmup_and_profile + self.kernel_steps
        status = None
        while progress.steps < self.steps_per_epoch and self.global_step < self.total_steps:
            measured = self.session_steps >= kernel_end
            profiled = cfg.warmup_steps <= self.session_steps < warmup_and_profile
            kernel_profiled = warmup_and_profile <= self.session_steps < kernel_end
            if kernel_profiled and self.session_steps == warmup_and_profile and self.kernel_profiler:
                self.kernel_profiler.start()
            if measured and window_start is None:
                with overhead.timed("barrier_s"):
                    window_start = self.synced_time()
            if self.session_steps == 0 and cfg.compile != "off":
                self.first_step.start()
            requested = time.perf_counter()
            if (
                measured
                and self.session_steps == kernel_end
                and cfg.host_syncs == "minimal"
                and self.device.type == "cuda"
            ):
                with host_syncs_seen() as self.step_host_syncs:  # the first measured step, under sync debug mode
                    waited = self.step(batches, requested, measured, profiled)
            else:
                waited = self.step(batches, requested, measured, profiled)
            if self.session_steps == 0 and cfg.compile != "off":
                self.first_step.stop()
            data_wait += waited
            progress.steps += 1
            measured_steps += int(measured)
            self.global_step += 1
            self.session_steps += 1
            self.watch.step_done(self.global_step, epoch)
            if self.session_steps == cfg.warmup_steps and cfg.compile != "off":
                self.graphs_counted = compiled_graphs()
            if profiled and self.session_steps == warmup_and_profile and self.writer:
                self.writer.write("profile", **self.profiler.summary())
            if kernel_profiled:
                if self.kernel_profiler:
                    self.kernel_profiler.step()
                if self.session_steps == kernel_end:
                    self.write_kernel_profile()
            if self.global_step % STOP_CHECK_STEPS == 0:
                self.losses.settle()
                settled_steps = progress.steps
                self.meter.poll()
                self.health.sample()
                status = self.agreed_stop()
                if status:
                    break
            if self.progress_file is not None and self.progress_file.due():
                loss_steps = (settled_steps if isinstance(self.losses, HostLosses) else progress.steps) - first_step
                self.progress_file.write(
                    **self.progress_fields(epoch, progress, epoch_start, window_start, measured_steps, loss_steps)
                )
        self.watch.phase("epoch boundary")
        with overhead.timed("barrier_s"):
            now = self.synced_time()
        recompiled = self.graphs_compiled_after_warmup()
        step_means = self.timer.epoch_means()  # every mark is done after the device sync
        health = self.health.end_epoch()
        if window_start is not None:
            progress.measured_time += now - window_start
        progress.time += now - epoch_start
        progress.measured_steps += measured_steps
        with overhead.timed("metrics_s"):
            rank_loss_sum, rank_data_wait, diverged = self.rank_means(
                [self.losses.epoch_sum(), data_wait, self.losses.diverged_flag().item()]
            )
        progress.loss_sum += rank_loss_sum
        progress.data_wait += rank_data_wait
        if diverged > 0 or status == "diverged":
            return "diverged"  # the last checkpoint (finite weights) stays as it is
        if status:
            self.read_energy()
            self.save(epoch, progress)
            return status
        self.finish_epoch(epoch, progress, overhead, step_means, health, self.workload_fields(recompiled))
        return None

    def progress_fields(
        self,
        epoch: int,
        progress: EpochProgress,
        epoch_start: float,
        window_start: Optional[float],
        measured_steps: int,
        loss_steps: int,
    ) -> Dict[str, Any]:
        """The progress file's fields (dlaunch/train/progress.py): `progress` holds the epoch's figures before this
        process (a resumed epoch's), the rest are this process's; the loss kept over `loss_steps` steps is read
        first (the one device sync: the clock then counts finished steps)."""
        loss = finite_or_none(float(self.losses.sum) / loss_steps) if loss_steps > 0 else None
        now = time.perf_counter()
        steps = progress.measured_steps + measured_steps
        seconds = progress.measured_time + (now - window_start if window_start is not None else 0.0)
        return dict(
            epoch=epoch,
            epochs=self.epochs,
            step_in_epoch=progress.steps,
            steps_per_epoch=self.steps_per_epoch,
            global_step=self.global_step,
            total_steps=self.total_steps,
            epoch_time_s=progress.time + now - epoch_start,
            measured_steps=steps,
            images_per_s=steps * self.global_batch / seconds if steps and seconds > 0 else None,
            loss=loss,
            loss_steps=loss_steps if loss is not None else 0,
        )

    def step(self, batches: Any, requested: float, measured: bool, profiled: bool) -> float:
        """One step from asking `batches` for its batch (at `requested`): the train step, its CUDA graph's replay or a
        profiled step; returns the seconds waited for the batch."""
        self.timer.begin(timed=measured and self.captured is None)  # a replay's parts are not timed
        self.watch.phase("data")
        images, labels = next(batches)
        self.watch.phase("compile" if self.session_steps == 0 and self.cfg.compile != "off" else "forward")
        if profiled:
            self.synchronize()
        waited = time.perf_counter() - requested
        self.timer.mark("batch")
        self.lr.set(self.fw.param_groups, self.schedule(self.global_step))
        if self.captured is not None:
            self.captured(self.session_steps, images, labels)
        elif profiled:
            loss = self.profiler.step(lambda: self.forward_backward(images, labels), requested, waited)
            self.losses.add(loss.detach())
        else:
            self.train_step(images, labels)
        return waited

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One step (all that a CUDA graph captures): forward, backward, gradients ready, the update, the loss's
        bookkeeping; returns the loss."""
        self.fw.zero_grad()
        loss = self.forward_backward(images, labels)
        self.watch.phase("sync")
        self.fw.synchronize_gradients()
        self.timer.mark("ready")
        self.watch.phase("optimizer")
        self.fw.step()
        self.timer.end()
        loss = loss.detach()
        self.losses.add(loss)
        return loss

    def forward_backward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with autocast(self.cfg, self.device):
            loss = self.criterion(self.wrapped(images), labels)  # hooks mark the model's forward
        self.watch.phase("backward")
        self.timer.mark("backward_begin")
        self.fw.backward(loss)  # a hook marks the first parameter's gradient
        return loss

    def graphs_compiled_after_warmup(self) -> Optional[int]:
        """Graphs torch.compile compiled in this epoch's steps after the warm-up steps (None without --compile)."""
        if self.cfg.compile == "off":
            return None
        if self.session_steps <= self.cfg.warmup_steps:
            return 0
        now = compiled_graphs()
        recompiled, self.graphs_counted = now - self.graphs_counted, now
        return recompiled

    def workload_fields(self, recompiled: Optional[int]) -> Dict[str, Any]:
        """The epoch record's figures of the workload options (dlaunch/train/workload.py) known by now."""
        fields: Dict[str, Any] = {}
        if recompiled is not None:
            fields["graphs_compiled_after_warmup"] = recompiled
        if self.first_step.seconds is not None:
            fields["compile_s"], self.first_step.seconds = self.first_step.seconds, None
        if self.step_host_syncs is not None:
            fields["step_host_syncs"], self.step_host_syncs = self.step_host_syncs, None
        return fields

    def finish_epoch(
        self,
        epoch: int,
        progress: EpochProgress,
        overhead: EpochOverhead,
        step_means: List[float],
        health: List[float],
        workload: Dict[str, Any],
    ) -> None:
        """Validation, energy, the checkpoint of the next epoch's start, the phase gather, then the epoch record
        (`step_means`: StepTimer.epoch_means, `health`: GpuHealth.end_epoch of this rank, `workload`:
        `workload_fields`)."""
        fields: Dict[str, Any] = {}
        last = epoch == self.epochs - 1
        reached = False
        self.mllog.epoch_stop(epoch)
        block_ends = (epoch + 1) % self.cfg.val_every == 0 or last
        if self.loaders.val is not None and block_ends:
            with overhead.timed("validation_s"), self.watch.section("validation"):
                self.mllog.eval_start(epoch)
                fields = self.validate()
                self.mllog.eval_stop(epoch, fields["top1"], fields.pop("images"))  # type: ignore[arg-type]  # validate()'s image count is an int (int(total)) in its float dict
            if self.best_top1 is None or fields["top1"] > self.best_top1:
                self.best_top1 = fields["top1"]
            target = self.cfg.target_accuracy
            if target is not None and self.time_to_accuracy is None and fields["top1"] >= target:
                self.time_to_accuracy = self.elapsed()
                reached = True
        if block_ends:
            self.mllog.block_stop(epoch)
            self.mllog.reached(fields.get("top1"))
        with overhead.timed("metrics_s"):
            reading = self.read_energy()
        if reached:
            total = energy_total(self.energy_j)
            self.energy_to_accuracy = total[0] if total else None
        epoch_energy = {
            d: v - progress.energy_start_j.get(d, 0.0) if is_number(v) else v for d, v in self.energy_j.items()
        }
        self.epochs_completed = epoch + 1
        with overhead.timed("checkpoint_s"):
            self.save(epoch + 1, EpochProgress())
        gather_began = time.perf_counter()
        rows = gather_rows(
            self.fw.all_reduce_sum,
            rank_row(step_means, self.dist.local_rank, overhead.seconds, health),
            self.dist.rank,
            self.dist.world_size,
            self.device,
        )
        explained = phase_fields(rows, self.hosts) if self.writer else {}
        explained["overhead"] = overhead_fields(rows[0], time.perf_counter() - gather_began)
        images = progress.measured_steps * self.global_batch
        record = dict(
            epoch=epoch,
            steps=progress.steps,
            images=images,
            images_per_s=images / progress.measured_time if progress.measured_time > 0 else 0.0,
            epoch_time_s=progress.time,
            data_wait_s=progress.data_wait,
            loss=progress.loss_sum / max(progress.steps, 1),
            lr=self.schedule(self.global_step - 1),
            energy_j=epoch_energy,
            gpu_utilization_pct=reading.utilization_pct,
            gpu_memory_peak_bytes=reading.memory_peak_bytes,
            measured_steps=progress.measured_steps,
            **explained,
            **workload,
            **fields,
        )
        if self.writer:
            with self.next_overhead.timed("metrics_s"):
                self.epoch_records.append(self.writer.write("epoch", **record))

    def validate(self) -> Dict[str, float]:
        """top-1/top-5 fractions, mean cross-entropy (without label smoothing) and images of the whole val set."""
        module = self.fw.eval_module(self.model)
        module.eval()
        counts = torch.zeros(4, dtype=torch.float64, device=self.device)  # top1, top5, loss sum, images
        with torch.no_grad():
            for images, labels in self.loaders.val:
                with autocast(self.cfg, self.device):
                    logits = module(images)
                top = logits.topk(min(5, logits.shape[1]), dim=1).indices
                hits = top == labels[:, None]
                counts += torch.stack(
                    [
                        hits[:, 0].sum(),
                        hits.any(dim=1).sum(),
                        nn.functional.cross_entropy(logits.float(), labels, reduction="sum"),
                        torch.tensor(labels.numel(), device=self.device),
                    ]
                ).double()
        module.train()
        top1, top5, loss, total = self.fw.all_reduce_sum(counts).tolist()
        return {"top1": top1 / total, "top5": top5 / total, "val_loss": loss / total, "images": int(total)}

    # -- checkpoints ---------------------------------------------------------------------------------
    def save(self, epoch: int, progress: EpochProgress) -> None:
        """Checkpoint the position `epoch` + `progress.steps` (all ranks call; rank 0 writes)."""
        if not self.cfg.checkpoint_dir:
            return
        state = {
            "epoch": epoch,
            "step_in_epoch": progress.steps,
            "global_step": self.global_step,
            "framework": self.fw.state_dict(),
            "rng": rng_state(),
            "progress": asdict(progress),
            "world_size": self.dist.world_size,
            "global_batch": self.global_batch,
            "elapsed_s": self.elapsed(),
            "best_top1": self.best_top1,
            "time_to_accuracy_s": self.time_to_accuracy,
            "energy_j": self.measured_energy(),
            "energy_to_accuracy_j": self.energy_to_accuracy,
        }
        with self.watch.section("checkpoint"):
            if self.dist.is_main:
                save_checkpoint(checkpoint_path(self.cfg.checkpoint_dir), state)
            self.fw.barrier()

    def restore(self, state: Dict[str, Any]) -> tuple:
        path = checkpoint_path(self.cfg.checkpoint_dir)  # type: ignore[arg-type]  # a state is restored only with --resume, which needs --checkpoint-dir
        if (state["world_size"], state["global_batch"]) != (self.dist.world_size, self.global_batch):
            raise ConfigError(
                "--resume: %s was written by %d ranks x batch %d; this run has %d x %d"
                % (
                    path,
                    state["world_size"],
                    state["global_batch"] // state["world_size"],
                    self.dist.world_size,
                    self.cfg.batch_size,
                )
            )
        self.fw.load_state_dict(state["framework"])
        set_rng_state(state["rng"])
        self.global_step = state["global_step"]
        self.elapsed_before = state["elapsed_s"]
        self.best_top1 = state["best_top1"]
        self.time_to_accuracy = state["time_to_accuracy_s"]
        self.energy_before = state.get("energy_j", {})  # absent in checkpoints of older trainers
        self.energy_to_accuracy = state.get("energy_to_accuracy_j")
        self.epochs_completed = state["epoch"]
        return state["epoch"], state["step_in_epoch"], EpochProgress(**state["progress"])

    # -- records -------------------------------------------------------------------------------------
    def network_records(self) -> List[Dict[str, Any]]:
        """What the collective libraries selected, one record per node and library: every rank reads
        its own (after the first collectives, which start NCCL), one gather (dlaunch/train/network.py)."""
        mine = observe(self.fw.collective_libraries(), os.environ)
        return by_node(record for records in self.fw.all_gather_object(mine) for record in records)

    def header_fields(self, hosts: List[str]) -> Dict[str, Any]:
        cfg = self.cfg
        versions = library_versions(self.device.type, self.fw.collective_libraries())
        versions.update(self.fw.versions())
        return dict(
            run_id=run_id(),
            argv=[sys.executable, "-m", "dlaunch.train"] + self.argv,
            config=cfg.to_dict(),
            framework=cfg.framework,
            loader=cfg.loader,
            model=cfg.model,
            device=self.device.type,
            threads=torch.get_num_threads(),
            world_size=self.dist.world_size,
            nodes=len(set(hosts)),
            hosts=hosts,
            batch_per_worker=cfg.batch_size,
            global_batch=self.global_batch,
            lr_scaled=self.schedule.lr_max,
            versions=versions,
            framework_settings=dict(self.fw.settings(), **self.workload_settings()),
            loader_settings=dict(
                getattr(self.loaders.train, "settings", {}),
                data=cfg.data,
                workers=cfg.workers,
                batches_per_epoch=len(self.loaders.train),
                steps_per_epoch=self.steps_per_epoch,
                total_steps=self.total_steps,
            ),
            slurm_job_id=jobenv.job_id(os.environ),
            scheduler=jobenv.scheduler(os.environ),
            site=cfg.site,
            experiment=cfg.experiment,
            image=cfg.image,
            git_revision=git_revision(),
            energy_sources=self.meter.describe(),
        )

    def workload_settings(self) -> Dict[str, Any]:
        """What the workload options did (dlaunch/train/workload.py), for the header's framework_settings: the SGD
        implementation the step runs, what torch.compile compiled, where the CUDA graph is captured."""
        return {
            "sgd": optimizer_impl(self.optimizer),
            "compiled": self.fw.compiled or None,
            "cuda_graph": "the whole step, captured at the last warm-up step" if self.captured is not None else None,
            "watchdog": self.watch.settings(),
        }

    def finish(self, status: str) -> None:
        """Write the `end` record with every rank's parameter digest and the run's energy, and print the summary."""
        self.watch.phase("epoch boundary")
        digests = self.fw.all_gather_object(self.fw.parameter_digest(self.model))
        self.read_energy()
        reason = None
        if status == "diverged":
            reason = (
                "the loss was not finite for %d consecutive steps on some rank (by step %d); "
                "the checkpoint, if any, is of the last finished epoch"
                % (self.cfg.max_nonfinite_steps, self.global_step)
            )
        elif status in STOP_STATUSES:
            reason = self.signals.reason(status)
        if self.writer:
            end = self.writer.write(
                "end",
                status=status,
                total_time_s=self.elapsed(),
                epochs_completed=self.epochs_completed,
                best_top1=self.best_top1,
                target_accuracy=self.cfg.target_accuracy,
                time_to_accuracy_s=self.time_to_accuracy,
                param_digests=digests,
                energy_j=self.energy_j,
                energy_to_accuracy_j=self.energy_to_accuracy,
                reason=reason,
            )
            print_summary(self.epoch_records, end)
        self.mllog.run_stop(status)

    def write_hung_end(self, record: Dict[str, Any]) -> None:
        """The `end` record of a run found hung (the watchdog's thread calls it on rank 0, then the process exits)."""
        fields = hung_end_fields(record)
        if self.writer:
            self.writer.write(
                "end",
                status="hung",
                total_time_s=self.elapsed(),
                epochs_completed=self.epochs_completed,
                best_top1=self.best_top1,
                target_accuracy=self.cfg.target_accuracy,
                time_to_accuracy_s=self.time_to_accuracy,
                energy_j=self.energy_j,
                energy_to_accuracy_j=self.energy_to_accuracy,
                **fields,
            )
        self.mllog.run_stop("hung")


def watch_flight_recorder(watch: Watchdog, framework: Framework, dist: DistInfo, enabled: str) -> None:
    """Give the watchdog this process's flight recorder to dump on a hang (`enabled`: what `flight_recorder.enable`
    did before the process group started), or the reason there is none."""
    backend = framework.flight_recorder_backend()
    release, records_gloo = flight_recorder.this_torch()
    missing = (
        flight_recorder.availability(backend, release, records_gloo)
        if backend
        else unavailable("%s's collectives do not go through torch.distributed" % framework.name)
    )
    if missing or enabled.startswith(UNAVAILABLE) or backend is None:  # no backend: `missing` says why
        watch.flight_recorder_missing = watch.flight_recorder_setting = missing or enabled
        return

    def dump(folder: str) -> Any:
        content = flight_recorder.dump(flight_recorder.dump_path(folder, dist.rank), backend)
        if not content["entries"]:
            return unavailable("the flight recorder holds no collective (%s)" % enabled)
        return flight_recorder.summary(content, dist.rank)

    watch.flight_recorder, watch.flight_recorder_setting = dump, enabled


def run(cfg: TrainConfig, argv: List[str], framework: Framework) -> int:
    """Run the trainer in this process; return the exit code (see dlaunch/train/config.py)."""
    signals = StopSignals().install()
    trainer: Optional[Trainer] = None
    nccl_log = None
    run_dir = os.path.dirname(os.path.abspath(cfg.metrics_path))
    watch = Watchdog(run_dir, cfg.hang_timeout, os.environ, jobenv.this_node(os.environ)).start()
    on_gpu = cfg.device != "cpu" and torch.cuda.is_available()
    if on_gpu:  # before NCCL/RCCL start: they read it once
        nccl_log = route_nccl_debug(os.environ, os.path.join(run_dir, NCCL_LOG_DIR))
    # Before the process group starts, which reads it once.
    recorder = flight_recorder.enable(os.environ, "nccl" if on_gpu else "gloo", *flight_recorder.this_torch())
    try:
        refusal = torch_refusal(cfg, TorchFeatures.of_this_torch())
        if refusal:
            raise ConfigError(refusal)
        dist = framework.init(cfg)
        watch_flight_recorder(watch, framework, dist, recorder)
        trainer = Trainer(cfg, argv, framework, dist, signals, watch)
        status = trainer.run()
        trainer.finish(status)
        framework.barrier()  # no rank tears down the group while another still uses it
        return EXIT_CODES[status]
    except ConfigError as e:
        print("train: error: %s" % e, file=sys.stderr)
        return EXIT_BAD_INPUT
    except BaseException as e:
        if trainer is not None and trainer.writer:
            status = "cancelled" if isinstance(e, KeyboardInterrupt) else "failed"
            trainer.writer.write(
                "end",
                status=status,
                total_time_s=trainer.elapsed(),
                epochs_completed=trainer.epochs_completed,
                best_top1=trainer.best_top1,
                target_accuracy=cfg.target_accuracy,
                time_to_accuracy_s=trainer.time_to_accuracy,
                reason=("%s: %s" % (type(e).__name__, e))[:2000],
            )
            trainer.mllog.run_stop(status)
        for line in nccl_warnings(nccl_log) if nccl_log else ():  # they went to the debug file, not the log
            print(line, file=sys.stderr)
        raise
    finally:
        # The run is over: its teardown has no deadline (joining the loader's workers takes seconds, and a peer that
        # has exited beats no more: a watchdog still running here called a finished run hung).
        watch.stop()
        if trainer is not None:
            trainer.mllog.close()
            if trainer.writer:
                trainer.writer.close()
        trainer = None  # release the model before the process group goes
        framework.shutdown()
