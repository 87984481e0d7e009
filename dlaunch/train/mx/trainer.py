"""The MXNet worker loop: Gluon model; key-value store `dist_sync` or `dist_async` with the optimizer on the
servers, or Horovod's all-reduce with the optimizer on every worker (`mx-allreduce`).

The servers' SGD (momentum, weight decay on weights only: BatchNorm and biases have wd_mult 0) takes
its LR from `ScheduleOnServer`, dlaunch/train/schedule.py indexed by the server's update count: one update
per step synchronously, one per worker push asynchronously (a round of `workers` pushes is a step,
with the LR linearly scaled for one worker's batch). Gradients are pushed as the sum over the batch
and rescaled by the images in the update (`trainer.step(images)`).

Throughput: rank 0 times the job's images between two kvstore barriers. Loss, data wait and
validation are rank 0's (the key-value store has no all-reduce besides the model's own keys); with
dist_sync every worker holds the same weights after each step. Stop signals are read every
`STOP_CHECK_STEPS` steps after a barrier, so all workers see a signal Slurm sent to all of them at the
same step.

Hang detection (dlaunch/train/watchdog.py): a worker reports its phases (data, forward, backward, sync: the key-value
store's push and pull or Horovod's all-reduce with the update, stop check, validation, epoch boundary) and steps. Its
watchdog starts once the worker is built: gluon's DataLoader forks its worker pool when the loader is made, and the
watchdog's thread must not exist at that fork (so start-up before it is not watched; mx-allreduce's first worker has
started the Horovod rendezvous server's thread by then, as before the watchdog). The scheduler and the servers only
serve (dlaunch/train/mx/__main__.py). No flight recorder.
"""

import hashlib
import os
import platform
import socket
import time
from typing import Any, List, Optional

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from dlaunch.train import jobenv
from dlaunch.train.config import EXIT_CANCELLED, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK, TrainConfig
from dlaunch.train.engines import NonfiniteStreak, TaskLayout, end_reason, folder_files, mode_settings
from dlaunch.train.framework_table import FrameworkInfo
from dlaunch.train.metrics_core import RunRecorder
from dlaunch.train.mx.models import build_model
from dlaunch.train.mx.roles import horovod_environment, host_interface
from dlaunch.train.mx.schedule import ScheduleOnServer
from dlaunch.train.schedule import LRSchedule
from dlaunch.train.signals import StopSignals
from dlaunch.train.watchdog import Watchdog

STOP_CHECK_STEPS = 10
RENDEZVOUS_TIMEOUT_S = 600.0
EXIT_CODES = {"ok": EXIT_OK, "interrupted": EXIT_INTERRUPTED, "cancelled": EXIT_CANCELLED, "diverged": EXIT_DIVERGED}
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class ShardSampler(gluon.data.Sampler):
    """Per epoch: a permutation seeded by (seed, epoch), worker w takes positions w, w+W, ... (full batches)."""

    def __init__(self, size: int, worker: int, workers: int, batch: int, seed: int):
        self.size, self.worker, self.workers, self.seed, self.epoch = size, worker, workers, seed, 0
        self.length = size // (batch * workers) * batch

    def __iter__(self):
        order = np.random.RandomState((self.seed * 1000003 + self.epoch) % 2**32).permutation(
            self.size
        )  # numpy's seed range
        return iter(order[self.worker :: self.workers][: self.length].tolist())

    def __len__(self) -> int:
        return self.length


def folder_loader(cfg: TrainConfig, split: str, sampler: Optional[gluon.data.Sampler]) -> gluon.data.DataLoader:
    from mxnet.gluon.data.vision import transforms

    steps = [transforms.Resize(cfg.image_size)]
    if split == "train":
        steps.append(transforms.RandomFlipLeftRight())
    steps += [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    dataset = gluon.data.vision.ImageFolderDataset("%s/%s" % (cfg.data, split)).transform_first(
        transforms.Compose(steps)
    )
    if sampler is None:
        return gluon.data.DataLoader(dataset, batch_size=cfg.batch_size, shuffle=False, num_workers=cfg.workers)
    return gluon.data.DataLoader(
        dataset, batch_size=cfg.batch_size, sampler=sampler, num_workers=cfg.workers, last_batch="discard"
    )


def versions() -> dict:
    return {"python": platform.python_version(), "mxnet": mx.__version__, "numpy": np.__version__}


def param_digest(net: gluon.Block) -> str:
    digest = hashlib.sha256()
    for _name, param in sorted(net.collect_params().items()):
        digest.update(param.data().asnumpy().tobytes())
    return digest.hexdigest()


def start_horovod(layout: TaskLayout) -> Any:
    """horovod.mxnet, initialised over gloo without horovodrun: the first worker serves the rendezvous
    (Horovod's own HTTP server) at its port, the others wait for that port before `hvd.init()`."""
    import threading

    import horovod.mxnet as hvd
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    env = horovod_environment(layout)
    os.environ.update(env, HOROVOD_GLOO_IFACE=host_interface(layout.hosts[layout.task]))
    address = (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
    if layout.worker_index == 0:
        plan = []
        for t in layout.ids("worker"):
            slot = horovod_environment(TaskLayout(layout.hosts, layout.ports, layout.roles, t))
            plan.append(
                SlotInfo(
                    slot["HOROVOD_HOSTNAME"],
                    *(
                        int(slot["HOROVOD_" + k])
                        for k in ("RANK", "LOCAL_RANK", "CROSS_RANK", "SIZE", "LOCAL_SIZE", "CROSS_SIZE")
                    ),
                )
            )
        server = RendezvousHTTPServer(("", address[1]), RendezvousHandler, 0)
        server.init(plan)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    else:
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
        while True:
            try:
                socket.create_connection(address, timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    hvd.init()
    return hvd


class Worker:
    def __init__(
        self, cfg: TrainConfig, argv: List[str], mode: FrameworkInfo, layout: TaskLayout, signals: StopSignals
    ):
        self.cfg, self.mode, self.layout, self.signals = cfg, mode, layout, signals
        self.hvd = self.kv = None
        if mode.architecture == "allreduce":
            self.hvd = start_horovod(layout)
            self.rank, self.workers = self.hvd.rank(), self.hvd.size()
        else:
            self.kv = mx.kv.create("dist_sync" if mode.synchronous else "dist_async")
            self.rank, self.workers = self.kv.rank, self.kv.num_workers
        mx.random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        if cfg.synthetic:
            mx.random.seed(cfg.seed * 65536 + self.rank)
            self.batch = (
                mx.nd.random.normal(shape=(cfg.batch_size, 3, cfg.image_size, cfg.image_size)),
                mx.nd.random.randint(0, cfg.num_classes, shape=(cfg.batch_size,)).astype("float32"),
            )
            self.steps_per_epoch = cfg.steps_per_epoch
            self.sampler, self.train, self.val = None, None, None
        else:
            size = len(folder_files(cfg.data, "train")[0])
            self.sampler = ShardSampler(size, self.rank, self.workers, cfg.batch_size, cfg.seed)
            self.train = folder_loader(cfg, "train", self.sampler)
            self.val = folder_loader(cfg, "val", None) if self.rank == 0 else None
            self.steps_per_epoch = max(1, len(self.sampler) // cfg.batch_size)
        self.total_steps = cfg.steps if cfg.steps else cfg.epochs * self.steps_per_epoch  # type: ignore[operator]  # the configuration gives --epochs where --steps is not given
        self.steps_per_epoch = min(self.steps_per_epoch, self.total_steps)
        self.epochs = -(-self.total_steps // self.steps_per_epoch)
        self.update_images = cfg.batch_size * (self.workers if mode.synchronous else 1)
        self.schedule = LRSchedule(
            cfg.lr,
            cfg.reference_batch,
            self.update_images,
            self.steps_per_epoch,
            self.total_steps,
            cfg.schedule,
            cfg.warmup_epochs,
            cfg.lr_min,
            cfg.gamma,
        )
        mx.random.seed(cfg.seed)
        self.net = build_model(cfg.model, cfg.num_classes)
        self.net.initialize(mx.init.MSRAPrelu(factor_type="out", slope=0.0), ctx=mx.cpu())
        self.net.collect_params(".*gamma|.*beta|.*bias").setattr("wd_mult", 0.0)
        self.net.hybridize(static_alloc=True, static_shape=True)
        if self.hvd:
            self.net(mx.nd.zeros((1, 3, cfg.image_size, cfg.image_size)))  # deferred shapes, before the broadcast
            self.hvd.broadcast_parameters(self.net.collect_params(), root_rank=0)
            # Horovod sums the workers' gradients and divides by their number: rescale by one worker's batch.
            self.trainer = self.hvd.DistributedTrainer(
                self.net.collect_params(),
                "sgd",
                {"momentum": cfg.momentum, "wd": cfg.weight_decay, "learning_rate": self.schedule(0)},
            )
            self.step_images = cfg.batch_size
        else:
            scheduler = ScheduleOnServer(self.schedule, 1 if mode.synchronous else self.workers)
            self.trainer = gluon.Trainer(
                self.net.collect_params(),
                "sgd",
                {"momentum": cfg.momentum, "wd": cfg.weight_decay, "lr_scheduler": scheduler},
                kvstore=self.kv,
                update_on_kvstore=True,
            )
            self.step_images = self.update_images
        self.loss = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
        self.recorder = RunRecorder(cfg, argv, "python -m dlaunch.train.mx", self.rank == 0)
        self.global_step = self.session_steps = 0
        self.nonfinite = NonfiniteStreak()

    def batches(self, epoch: int):
        if self.train is None:
            while True:
                yield self.batch
        self.sampler.epoch = epoch  # type: ignore[union-attr]  # a sampler comes with the train loader
        for images, labels in self.train:  # worker processes hand over shared-memory arrays
            yield images.as_in_context(mx.cpu()), labels.astype("float32").as_in_context(mx.cpu())

    def step(self, images: mx.nd.NDArray, labels: mx.nd.NDArray) -> float:
        cfg = self.cfg
        smooth = cfg.label_smoothing
        target = mx.nd.one_hot(labels, cfg.num_classes) * (1 - smooth) + smooth / cfg.num_classes
        self.watch.phase("forward")
        with autograd.record():
            loss = self.loss(self.net(images), target)
        self.watch.phase("backward")
        loss.backward()
        if self.hvd:
            self.trainer.set_learning_rate(self.schedule(self.global_step))
        self.watch.phase("sync")
        self.trainer.step(self.step_images)
        return float(loss.mean().asscalar())

    def validate(self) -> dict:
        totals = np.zeros(4)
        for images, labels in self.val:  # type: ignore[union-attr]  # called only where self.val is set (run)
            logits = self.net(images.as_in_context(mx.cpu()))
            labels_np = labels.asnumpy()
            top = np.argsort(-logits.asnumpy(), axis=1)[:, :5]
            totals += (
                np.sum(top[:, 0] == labels_np),
                np.sum(np.any(top == labels_np[:, None], axis=1)),
                float(mx.nd.softmax_cross_entropy(logits, labels.astype("float32")).asscalar()),
                len(labels_np),
            )
        return {"top1": totals[0] / totals[3], "top5": totals[1] / totals[3], "val_loss": totals[2] / totals[3]}

    def barrier(self) -> None:
        if self.hvd:
            self.hvd.allreduce(mx.nd.zeros((1,)), average=False, name="barrier").asnumpy()
        else:
            self.kv._barrier()  # type: ignore[union-attr]  # no Horovod: the kvstore

    def stop_status(self) -> Optional[str]:
        """Horovod: all workers agree (a sum of their flags); the key-value store has no such collective, so
        each worker reads its own flags right after a barrier."""
        usr1, term = self.signals.flags()
        if self.hvd:
            usr1, term = self.hvd.allreduce(mx.nd.array([usr1, term]), average=False, name="stop").asnumpy()
        if self.nonfinite.diverged(self.cfg):
            return "diverged"
        if term > 0:
            return "cancelled"
        return "interrupted" if usr1 > 0 else None

    def transport(self) -> dict:
        if self.hvd:
            return {"horovod": "gloo (rendezvous at the first worker)", "horovod_version": self.hvd_version()}
        return {"kvstore": self.kv.type, "servers": len(self.layout.ids("server")), "update_on_kvstore": True}  # type: ignore[union-attr]  # no Horovod: the kvstore

    @staticmethod
    def hvd_version() -> str:
        import horovod

        return horovod.__version__

    def run(self, watch: Watchdog) -> int:
        cfg = self.cfg
        self.watch = watch
        if self.recorder.writer:
            watch.on_hung = self.recorder.hung
        hosts = [self.layout.hosts[t] for t in self.layout.ids("worker")]
        staleness = (
            {"staleness_bound": 0}
            if self.mode.synchronous
            else {
                "staleness_bound": None,
                "staleness": "unbounded: a server applies each worker's gradients as they arrive (dist_async)",
            }
        )
        self.recorder.header(
            device="cpu",
            threads=self.layout.threads(cfg.threads),
            world_size=self.workers,
            hosts=hosts,
            global_batch=cfg.batch_size * self.workers,
            lr_scaled=self.schedule.lr_max,
            versions=versions(),
            framework_settings=dict(
                mode_settings(self.mode), watchdog=watch.settings(), **self.transport(), **staleness
            ),
            loader_settings={
                "data": cfg.data,
                "pipeline": "gluon" if self.train else "synthetic",
                "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps,
                "loss_and_data_wait": "rank 0's",
            },
        )
        status = "ok"
        for epoch in range(self.epochs):
            status = self.train_epoch(epoch) or "ok"
            if status != "ok":
                break
        self.recorder.end(
            status,
            end_reason(status, cfg, self.global_step, "MXNet"),
            [param_digest(self.net)] if status != "diverged" else None,
        )
        self.barrier()
        return EXIT_CODES[status]

    def train_epoch(self, epoch: int) -> Optional[str]:
        cfg = self.cfg
        epoch_start = time.perf_counter()
        window_start: Optional[float] = None
        loss_sum, data_wait, steps, measured = 0.0, 0.0, 0, 0
        self.watch.epoch_began(epoch)
        batches = self.batches(epoch)
        while steps < self.steps_per_epoch and self.global_step < self.total_steps:
            if self.session_steps >= cfg.warmup_steps and window_start is None:
                self.barrier()
                window_start = time.perf_counter()
            requested = time.perf_counter()
            self.watch.phase("data")
            images, labels = next(batches)
            data_wait += time.perf_counter() - requested
            loss = self.step(images, labels)
            self.nonfinite.count(loss)
            loss_sum += loss
            steps += 1
            measured += int(window_start is not None)
            self.global_step += 1
            self.session_steps += 1
            self.watch.step_done(self.global_step, epoch)
            if self.global_step % STOP_CHECK_STEPS == 0:
                self.watch.phase("stop check")
                self.barrier()
                status = self.stop_status()
                if status:
                    return status
        self.watch.phase("epoch boundary")
        mx.nd.waitall()
        self.barrier()
        now = time.perf_counter()
        validation = None
        if self.val is not None:
            with self.watch.section("validation"):
                validation = self.validate()
        self.recorder.epoch(
            epoch,
            steps,
            measured * cfg.batch_size * self.workers,
            now - window_start if window_start else 0.0,
            now - epoch_start,
            data_wait,
            loss_sum / max(steps, 1),
            self.schedule(self.global_step - 1),
            validation,
        )
        return None


def run(cfg: TrainConfig, argv: List[str], mode: FrameworkInfo, layout: TaskLayout) -> int:
    worker = Worker(cfg, argv, mode, layout, StopSignals().install())  # its loaders' worker pool forks in here
    watch = Watchdog(
        os.path.dirname(os.path.abspath(cfg.metrics_path)), cfg.hang_timeout, os.environ, jobenv.this_node(os.environ)
    ).start()
    try:
        return worker.run(watch)
    finally:
        watch.stop()
