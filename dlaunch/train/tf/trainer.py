"""The TensorFlow training loops: MultiWorkerMirroredStrategy (`tf-allreduce`) and ParameterServerStrategy
(`tf-ps-async`; `tf-ps-sync`: the chief averages one gradient per worker and applies it), custom loops so that the LR follows dlaunch/train/schedule.py per step and stop signals are
checked as in the PyTorch trainer.

SGD with momentum is Keras's (velocity = momentum * velocity - lr * gradient) with the optimizer's rate
fixed at 1 and the gradients scaled by the step's LR, so a scheduled step can carry its own LR (no
shared LR variable written by concurrent parameter-server steps). Weight decay is added to the
gradients of kernels only (not BatchNorm or biases), as in the PyTorch trainer.

Steps: a synchronous step updates the model once with the gradients of every worker's batch
(`--batch-size` x workers images). An asynchronous round is one update per worker (the same images);
the LR schedule counts rounds, linearly scaled for one worker's batch (each update is one worker's
gradient). Throughput is the job's images between two points at which all workers were done.

Hang detection (dlaunch/train/watchdog.py): the processes that run steps (the all-reduce workers, the parameter-server
chief) report their phases (data, step: the whole tf.function, stop check, validation, epoch boundary) and steps; the
parameter servers and the chief's workers only serve (they beat, no deadline of their own). No flight recorder.
"""

import hashlib
import json
import os
import platform
import socket
import time
from typing import Any, Dict, List, Optional

import tensorflow as tf
import tf_keras as keras

from dlaunch.train import jobenv
from dlaunch.train.config import EXIT_CANCELLED, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK, TrainConfig
from dlaunch.train.engines import COORDINATOR, SERVER, WORKER, NonfiniteStreak, TaskLayout, end_reason, mode_settings
from dlaunch.train.framework_table import FrameworkInfo
from dlaunch.train.metrics_core import RunRecorder
from dlaunch.train.schedule import LRSchedule
from dlaunch.train.signals import StopSignals
from dlaunch.train.tf import data
from dlaunch.train.tf.models import build_model
from dlaunch.train.watchdog import Watchdog

STOP_CHECK_STEPS = 10
EXIT_CODES = {"ok": EXIT_OK, "interrupted": EXIT_INTERRUPTED, "cancelled": EXIT_CANCELLED, "diverged": EXIT_DIVERGED}
# Parameter servers and workers wait this long for the chief to come up before giving up.
CHIEF_START_TIMEOUT_S = 600.0
# A server's inter-op threads: a worker's remote step blocks one while another runs its ops. TF's default, one per
# schedulable core, deadlocks a task bound to one core (Slurm's --cpu-bind, the test cluster's --pin-cores).
SERVER_INTER_OP_THREADS = 2


def tf_config(layout: TaskLayout, mode: FrameworkInfo) -> Dict[str, Any]:
    """TF_CONFIG for this task: workers only (all-reduce), or chief + workers + ps."""
    if mode.architecture == "allreduce":
        return {
            "cluster": {"worker": layout.addresses(WORKER)},
            "task": {"type": "worker", "index": layout.worker_index},
        }
    kind = {COORDINATOR: "chief", SERVER: "ps", WORKER: "worker"}[layout.role]
    return {
        "cluster": {
            "chief": layout.addresses(COORDINATOR),
            "worker": layout.addresses(WORKER),
            "ps": layout.addresses(SERVER),
        },
        "task": {"type": kind, "index": layout.ids(layout.role).index(layout.task)},
    }


def versions() -> Dict[str, Optional[str]]:
    return {"python": platform.python_version(), "tensorflow": tf.__version__, "tf_keras": keras.__version__}


def model_digest(model: keras.Model) -> str:
    digest = hashlib.sha256()
    for v in model.weights:
        digest.update(v.numpy().tobytes())
    return digest.hexdigest()


class Step:
    """The model, its SGD and the replica step function (forward, backward, scaled update)."""

    def __init__(self, cfg: TrainConfig, strategy: tf.distribute.Strategy, loss_batch: int):
        self.cfg = cfg
        with strategy.scope():
            tf.random.set_seed(cfg.seed)
            self.model = build_model(cfg.model, cfg.num_classes, cfg.image_size)
            self.optimizer = keras.optimizers.SGD(learning_rate=1.0, momentum=cfg.momentum)
        self.decayed = {v.ref() for v in self.model.trainable_variables if len(v.shape) > 1}
        self.loss = keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=cfg.label_smoothing, reduction=keras.losses.Reduction.NONE
        )
        self.loss_batch = loss_batch

    def replica(self, images: tf.Tensor, labels: tf.Tensor, lr: tf.Tensor) -> tf.Tensor:
        """One replica's part of a step; returns its share of the mean loss."""
        with tf.GradientTape() as tape:
            logits = self.model(images, training=True)
            per_image = self.loss(tf.one_hot(labels, self.cfg.num_classes), logits)
            loss = tf.nn.compute_average_loss(per_image, global_batch_size=self.loss_batch)
        variables = self.model.trainable_variables
        replicas = tf.cast(tf.distribute.get_replica_context().num_replicas_in_sync, tf.float32)
        grads = tape.gradient(loss, variables)
        # The optimizer sums gradients over replicas: each adds its share of the weight decay.
        grads = [
            lr * (g + self.cfg.weight_decay / replicas * v if v.ref() in self.decayed else g)
            for g, v in zip(grads, variables)
        ]
        self.optimizer.apply_gradients(zip(grads, variables))
        return loss


def run(cfg: TrainConfig, argv: List[str], mode: FrameworkInfo, layout: TaskLayout) -> int:
    os.environ["TF_CONFIG"] = json.dumps(tf_config(layout, mode))
    threads = layout.threads(cfg.threads)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    watch = Watchdog(
        os.path.dirname(os.path.abspath(cfg.metrics_path)),
        cfg.hang_timeout,
        os.environ,
        jobenv.this_node(os.environ),
        layout.role,
    ).start()
    if layout.role != (WORKER if mode.architecture == "allreduce" else COORDINATOR):
        watch.serving(layout.role)
        return serve(mode, layout, threads, watch)
    signals = StopSignals().install()
    try:
        if mode.architecture == "allreduce":
            return AllReduceTrainer(cfg, argv, mode, layout, signals, watch).run()
        return ParameterServerTrainer(cfg, argv, mode, layout, signals, watch).run()
    finally:
        watch.stop()


def serve(mode: FrameworkInfo, layout: TaskLayout, threads: int, watch: Watchdog) -> int:
    """A parameter server or a worker of ParameterServerStrategy: serve until the chief's port closes."""
    config = tf_config(layout, mode)
    pools = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=SERVER_INTER_OP_THREADS
    )
    tf.distribute.Server(
        tf.train.ClusterSpec(config["cluster"]),
        job_name=config["task"]["type"],
        task_index=config["task"]["index"],
        protocol="grpc",
        start=True,
        config=pools,
    )
    chief = layout.ids(COORDINATOR)[0]
    address = (layout.hosts[chief], layout.ports[chief])
    seen, started = False, time.monotonic()
    while True:
        try:
            socket.create_connection(address, timeout=5).close()
            seen = True
        except OSError:
            if seen:
                break
            if time.monotonic() - started > CHIEF_START_TIMEOUT_S:
                print(
                    "dlaunch.train.tf: error: the chief %s:%d did not come up in %.0f s"
                    % (address + (CHIEF_START_TIMEOUT_S,))
                )
                watch.stop()
                os._exit(1)
        time.sleep(1.0)
    watch.stop()
    os._exit(0)  # the gRPC server has no clean stop; the chief is gone, so is the job


class _Trainer:
    """What both loops share: the schedule, the records, the end."""

    def __init__(
        self,
        cfg: TrainConfig,
        argv: List[str],
        mode: FrameworkInfo,
        layout: TaskLayout,
        signals: StopSignals,
        watch: Watchdog,
        writes: bool,
    ):
        self.cfg, self.mode, self.layout, self.signals, self.watch = cfg, mode, layout, signals, watch
        self.workers = layout.num_workers
        self.steps_per_epoch = data.steps_per_epoch(cfg, self.workers)
        self.total_steps = cfg.steps if cfg.steps else cfg.epochs * self.steps_per_epoch  # type: ignore[operator]  # the configuration gives --epochs where --steps is not given
        self.steps_per_epoch = min(self.steps_per_epoch, self.total_steps)
        self.epochs = -(-self.total_steps // self.steps_per_epoch)
        update_batch = cfg.batch_size * (self.workers if mode.synchronous else 1)
        self.schedule = LRSchedule(
            cfg.lr,
            cfg.reference_batch,
            update_batch,
            self.steps_per_epoch,
            self.total_steps,
            cfg.schedule,
            cfg.warmup_epochs,
            cfg.lr_min,
            cfg.gamma,
        )
        self.recorder = RunRecorder(cfg, argv, "python -m dlaunch.train.tf", writes)
        if writes:
            watch.on_hung = self.recorder.hung
        self.global_step = 0
        self.session_steps = 0
        self.nonfinite = NonfiniteStreak()

    def header(self, settings: Dict[str, Any], **loader: Any) -> None:
        cfg = self.cfg
        self.recorder.header(
            device="cpu",
            threads=self.layout.threads(cfg.threads),
            world_size=self.workers,
            hosts=self.layout.worker_hosts,
            global_batch=cfg.batch_size * self.workers,
            lr_scaled=self.schedule.lr_max,
            versions=versions(),
            framework_settings=dict(mode_settings(self.mode), watchdog=self.watch.settings(), **settings),
            loader_settings={
                "data": cfg.data,
                "pipeline": "tf.data",
                "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps,
                **loader,
            },
        )

    def stop_status(self, usr1: float, term: float, diverged: float) -> Optional[str]:
        if diverged > 0:
            return "diverged"
        if term > 0:
            return "cancelled"
        return "interrupted" if usr1 > 0 else None

    def finish(self, status: str, digests: List[str]) -> int:
        self.recorder.end(status, end_reason(status, self.cfg, self.global_step, "TensorFlow"), digests)
        return EXIT_CODES[status]


class AllReduceTrainer(_Trainer):
    """MultiWorkerMirroredStrategy: every worker a replica, gradients summed by collective all-reduce."""

    def __init__(
        self,
        cfg: TrainConfig,
        argv: List[str],
        mode: FrameworkInfo,
        layout: TaskLayout,
        signals: StopSignals,
        watch: Watchdog,
    ):
        super().__init__(cfg, argv, mode, layout, signals, watch, writes=layout.worker_index == 0)
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        self.worker = layout.worker_index
        self.step = Step(cfg, self.strategy, cfg.batch_size * self.workers)
        dataset = self.strategy.distribute_datasets_from_function(
            lambda context: data.train_dataset(cfg, self.worker, self.workers)
        )
        self.iterator = iter(dataset)
        self.val = data.val_dataset(cfg, self.worker, self.workers)

    @tf.function
    def train_step(self, images: Any, labels: Any, lr: tf.Tensor) -> tf.Tensor:
        losses = self.strategy.run(self.step.replica, args=(images, labels, lr))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    @tf.function
    def all_sum(self, values: tf.Tensor) -> tf.Tensor:
        """Sum over workers (a collective, so also a barrier)."""
        per_replica = self.strategy.run(tf.identity, args=(values,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def sum_list(self, values: List[float]) -> List[float]:
        return self.all_sum(tf.constant(values, tf.float64)).numpy().tolist()

    def gather_digests(self) -> List[str]:
        own = tf.constant(list(bytes.fromhex(model_digest(self.step.model))), tf.int32)
        per_replica = self.strategy.run(tf.identity, args=(own,))
        gathered = self.strategy.gather(per_replica, axis=0).numpy().tolist()
        return [bytes(gathered[i : i + 32]).hex() for i in range(0, len(gathered), 32)]

    def run(self) -> int:
        self.header({"strategy": "MultiWorkerMirroredStrategy", "staleness_bound": 0})
        status = "ok"
        for epoch in range(self.epochs):
            status = self.train_epoch(epoch) or "ok"
            if status != "ok":
                break
        return self.finish(status, self.gather_digests() if status != "diverged" else [])

    def train_epoch(self, epoch: int) -> Optional[str]:
        cfg = self.cfg
        self.watch.epoch_began(epoch)
        epoch_start = time.perf_counter()
        window_start: Optional[float] = None
        loss_sum, data_wait, steps, measured = 0.0, 0.0, 0, 0
        status = None
        while steps < self.steps_per_epoch and self.global_step < self.total_steps:
            if self.session_steps >= cfg.warmup_steps and window_start is None:
                self.sum_list([0.0])
                window_start = time.perf_counter()
            requested = time.perf_counter()
            self.watch.phase("data")
            images, labels = next(self.iterator)
            data_wait += time.perf_counter() - requested
            self.watch.phase("step")
            loss = float(self.train_step(images, labels, tf.constant(self.schedule(self.global_step), tf.float32)))
            self.nonfinite.count(loss)
            loss_sum += loss
            steps += 1
            measured += int(window_start is not None)
            self.global_step += 1
            self.session_steps += 1
            self.watch.step_done(self.global_step, epoch)
            if self.global_step % STOP_CHECK_STEPS == 0:
                self.watch.phase("stop check")
                diverged = float(self.nonfinite.diverged(cfg))
                status = self.stop_status(*self.sum_list(self.signals.flags() + [diverged]))
                if status:
                    break
        self.watch.phase("epoch boundary")
        (wait_sum,) = self.sum_list([data_wait])
        now = time.perf_counter()
        if status:
            return status
        validation = None
        if self.val is not None:
            with self.watch.section("validation"):
                top1, top5, loss, images = self.sum_list(list(data.counts(self.step.model, self.val)))
            validation = {"top1": top1 / images, "top5": top5 / images, "val_loss": loss / images}
        self.recorder.epoch(
            epoch,
            steps,
            measured * cfg.batch_size * self.workers,
            now - window_start if window_start else 0.0,
            now - epoch_start,
            wait_sum / self.workers,
            loss_sum / max(steps, 1),
            self.schedule(self.global_step - 1),
            validation,
        )
        return None


class ParameterServerTrainer(_Trainer):
    """ParameterServerStrategy on the chief: steps scheduled onto whichever worker is free."""

    def __init__(
        self,
        cfg: TrainConfig,
        argv: List[str],
        mode: FrameworkInfo,
        layout: TaskLayout,
        signals: StopSignals,
        watch: Watchdog,
    ):
        super().__init__(cfg, argv, mode, layout, signals, watch, writes=True)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        self.strategy = tf.distribute.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        self.step = Step(cfg, self.strategy, cfg.batch_size)

        @tf.function
        def per_worker_dataset():
            return self.strategy.distribute_datasets_from_function(lambda context: data.train_dataset(cfg, None, 0))

        self.iterator = iter(self.coordinator.create_per_worker_dataset(per_worker_dataset))
        self.val = data.val_dataset(cfg, 0, 1)
        if mode.synchronous:  # SGD momentum buffers of the chief's updates, on the servers beside the variables
            with self.strategy.scope():
                self.velocity = [
                    tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)
                    for v in self.step.model.trainable_variables
                ]

    @tf.function
    def remote_step(self, iterator: Any, lr: tf.Tensor) -> tf.Tensor:
        images, labels = next(iterator)
        losses = self.strategy.run(self.step.replica, args=(images, labels, lr))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    @tf.function
    def remote_gradients(self, iterator: Any) -> Any:
        """One worker's batch: its mean loss and gradients, sent back to the chief (synchronous mode)."""
        images, labels = next(iterator)
        step = self.step

        def replica(images: tf.Tensor, labels: tf.Tensor) -> Any:
            with tf.GradientTape() as tape:
                logits = step.model(images, training=True)
                per_image = step.loss(tf.one_hot(labels, self.cfg.num_classes), logits)
                loss = tf.nn.compute_average_loss(per_image, global_batch_size=self.cfg.batch_size)
            return loss, tape.gradient(loss, step.model.trainable_variables)

        loss, grads = self.strategy.run(replica, args=(images, labels))
        reduce = lambda value: self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
        return reduce(loss), [reduce(g) for g in grads]

    def synchronous_rounds(self, count: int) -> List[float]:
        """`count` updates, each with the mean gradient of one batch per worker: the chief waits for every
        worker's gradients, then applies their mean to the servers' variables (staleness 0)."""
        losses = []
        variables = self.step.model.trainable_variables
        for r in range(count):
            lr = self.schedule(self.global_step + r)
            results = [
                self.coordinator.schedule(self.remote_gradients, args=(self.iterator,)) for _ in range(self.workers)
            ]
            self.coordinator.join()
            fetched = [result.fetch() for result in results]
            losses.append(sum(float(loss) for loss, _ in fetched) / self.workers)
            mean = [sum(grads[i] for _, grads in fetched) / self.workers for i in range(len(variables))]
            update = [
                lr * (g + self.cfg.weight_decay * v if v.ref() in self.step.decayed else g)
                for g, v in zip(mean, variables)
            ]
            # Keras's SGD, applied from the chief (its apply_gradients needs a replica context, which the
            # chief has not): velocity = momentum x velocity - update; variable += velocity.
            for variable, velocity, step in zip(variables, self.velocity, update):
                velocity.assign(self.cfg.momentum * velocity - step)
                variable.assign_add(velocity)
        return losses

    def rounds(self, count: int) -> List[float]:
        """Schedule `count` rounds (one update per worker each) and wait for all; their losses."""
        if self.mode.synchronous:
            return self.synchronous_rounds(count)
        results = []
        for r in range(count):
            lr = tf.constant(self.schedule(self.global_step + r), tf.float32)
            results += [
                self.coordinator.schedule(self.remote_step, args=(self.iterator, lr)) for _ in range(self.workers)
            ]
        self.coordinator.join()
        return [float(r.fetch()) for r in results]

    def run(self) -> int:
        if self.mode.synchronous:
            staleness = {
                "staleness_bound": 0,
                "staleness": "none: every update is the mean gradient of one batch "
                "per worker, all computed on the same variables (the chief waits for all, then applies)",
            }
        else:
            staleness = {
                "staleness_bound": None,
                "staleness": "unbounded: each step reads the servers' current "
                "variables and applies its gradients without waiting for other workers",
                "chief_joins_every_rounds": STOP_CHECK_STEPS,
            }
        self.header(
            dict({"strategy": "ParameterServerStrategy", "servers": len(self.layout.ids(SERVER))}, **staleness),
            data_wait="not observable on the chief: the workers read their data (recorded as 0)",
        )
        status = "ok"
        for epoch in range(self.epochs):
            status = self.train_epoch(epoch) or "ok"
            if status != "ok":
                break
        return self.finish(status, [model_digest(self.step.model)] if status != "diverged" else [])

    def train_epoch(self, epoch: int) -> Optional[str]:
        cfg = self.cfg
        self.watch.epoch_began(epoch)
        epoch_start = time.perf_counter()
        window_start: Optional[float] = None
        losses: List[float] = []
        steps = measured = 0
        while steps < self.steps_per_epoch and self.global_step < self.total_steps:
            if self.session_steps >= cfg.warmup_steps and window_start is None:
                window_start = time.perf_counter()
            chunk = min(
                STOP_CHECK_STEPS - self.global_step % STOP_CHECK_STEPS,
                self.steps_per_epoch - steps,
                self.total_steps - self.global_step,
            )
            if window_start is None:
                chunk = min(chunk, cfg.warmup_steps - self.session_steps)
            self.watch.phase("step")
            for loss in self.rounds(chunk):
                self.nonfinite.count(loss)
                losses.append(loss)
            steps += chunk
            measured += chunk if window_start is not None else 0
            self.global_step += chunk
            self.session_steps += chunk
            self.watch.step_done(self.global_step, epoch)
            status = self.stop_status(*self.signals.flags(), float(self.nonfinite.diverged(cfg)))  # type: ignore[call-arg]  # flags() gives [interrupt, cancel]
            if status:
                return status
        self.watch.phase("epoch boundary")
        now = time.perf_counter()
        validation = None
        if self.val is not None:
            with self.watch.section("validation"):
                top1, top5, loss, images = data.counts(self.step.model, self.val)
            validation = {"top1": top1 / images, "top5": top5 / images, "val_loss": loss / images}
        # Data wait happens on the workers, out of the chief's sight: recorded as 0 (see loader_settings).
        self.recorder.epoch(
            epoch,
            steps,
            measured * cfg.batch_size * self.workers,
            now - window_start if window_start else 0.0,
            now - epoch_start,
            0.0,
            sum(losses) / max(len(losses), 1),
            self.schedule(self.global_step - 1),
            validation,
        )
        return None
