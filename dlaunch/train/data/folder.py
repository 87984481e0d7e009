"""ImageNet-layout folders (train/<class>/*.JPEG, val/<class>/*.JPEG) via torchvision's ImageFolder.

Training: DistributedSampler (seed, set_epoch; drop_last so every rank runs the same number of full
batches), RandomResizedCrop + horizontal flip. The augmentation of sample i in epoch e is seeded by
(seed, e, i), so it is the same with any number of workers and after a mid-epoch resume.
Validation: resize to image_size*256/224, center crop; every image is evaluated exactly once
(rank r takes images r, r+world, ...), so summed counts give the exact top-1 of the whole set.

Worker processes (`--workers N`, issue 44 item 4) start from a fork server and stay for the run (`worker_options`):
a worker forked from the trainer itself inherits every lock as the trainer's other threads (the watchdog's heartbeat,
torch's and the collectives' own) held it at that moment, and one that needs such a lock waits for ever (seen: a
validation worker stuck in CPython's after-fork handlers while its peer waited in the all-reduce). The fork server is
a process of its own, started by fork and exec before its first worker, with no thread but its main one; it imports
torch, torchvision and this module once, so each worker starts from them. Persistent workers receive the dataset once
(pickled: the fork server shares no memory with the trainer), not at every epoch, so the epoch travels with each
index the sampler hands out, (epoch, index), for the seeded augmentation. benchmarks/bench_loader_start.py measures
what each way to start workers costs at an epoch's start.

A worker's parent is the fork server, not the trainer, and the fork server lives as long as any of its workers does
(each holds its 'alive' pipe): torch's own check (has the worker's parent gone?) never fires, and a trainer that dies
abruptly (a hang's exit, SIGKILL, the OOM killer) left its workers and its fork server running for ever, holding the
job's output. Each worker therefore watches the trainer that started it (`end_with_trainer`) and exits when it is gone.
"""

import functools
import itertools
import multiprocessing
import os
import threading
import time
from typing import Any, Dict, Iterator, Tuple

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler
from torchvision import datasets, transforms

from dlaunch.train.config import ConfigError
from dlaunch.train.data.loaders import Loaders

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# What the fork server imports once, before it forks its first worker (the workers need them to unpickle the dataset).
FORK_SERVER_PRELOAD = ["torch", "torchvision", __name__]


# How often a worker looks whether the trainer that started it is still there.
TRAINER_CHECK_S = 1.0


def worker_options(workers: int) -> Dict[str, Any]:
    """The DataLoader arguments of `workers` worker processes: started from the fork server (never forked from the
    trainer and its threads), kept for the run, ended with the trainer (see the module docstring); none for
    `--workers 0`."""
    if workers == 0:
        return {"num_workers": 0}
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(FORK_SERVER_PRELOAD)  # effective until the fork server has started
    return {
        "num_workers": workers,
        "multiprocessing_context": context,
        "persistent_workers": True,
        "worker_init_fn": functools.partial(end_with_trainer, os.getpid()),
    }


def process_gone(pid: int) -> bool:
    """Whether process `pid` has ended (absent, or a zombie not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def end_with_trainer(trainer_pid: int, worker_id: int) -> None:
    """A loader worker's start (DataLoader's worker_init_fn): a thread that ends this worker once the trainer that
    started it is gone."""

    def watch() -> None:
        while not process_gone(trainer_pid):
            time.sleep(TRAINER_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="dlaunch-end-with-trainer", daemon=True).start()


class SeededImageFolder(datasets.ImageFolder):
    """ImageFolder whose random transforms are a function of (seed, epoch, index); its keys are (epoch, index)."""

    def __init__(self, root: str, transform: Any, seed: int):
        super().__init__(root, transform=transform)
        self.seed = seed

    def __getitem__(self, key: Tuple[int, int]):
        epoch, index = key
        torch.manual_seed(((self.seed * 1000003 + epoch) * 10000019 + index) % (2**63))
        return super().__getitem__(index)


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler that can start the epoch after its first `skip` samples; it hands out (epoch, index)."""

    skip = 0

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        return ((self.epoch, index) for index in itertools.islice(super().__iter__(), self.skip, None))

    def __len__(self) -> int:
        return self.num_samples - self.skip


class ShardSampler(Sampler):
    """Indices rank, rank+world, ...: each sample on exactly one rank, no padding."""

    def __init__(self, size: int, rank: int, world_size: int):
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class DeviceLoader:
    """A DataLoader whose batches arrive on `device` (optionally channels-last)."""

    def __init__(self, loader: DataLoader, device: torch.device, channels_last: bool, batches: int):
        self.loader = loader
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.batches = batches

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        sampler = self.loader.sampler
        if isinstance(sampler, ResumableDistributedSampler):
            sampler.set_epoch(epoch)
            sampler.skip = skip_batches * self.loader.batch_size

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        non_blocking = self.device.type == "cuda"
        for images, labels in self.loader:
            yield (
                images.to(self.device, non_blocking=non_blocking, memory_format=self.memory_format),
                labels.to(self.device, non_blocking=non_blocking),
            )


def build_folder_loaders(cfg: Any, dist: Any) -> Loaders:
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    train_set = SeededImageFolder(
        cfg.data + "/train",
        transforms.Compose(
            [
                transforms.RandomResizedCrop(cfg.image_size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
        cfg.seed,
    )
    val_set = datasets.ImageFolder(
        cfg.data + "/val",
        transforms.Compose(
            [
                transforms.Resize(int(round(cfg.image_size * 256 / 224))),
                transforms.CenterCrop(cfg.image_size),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )
    train_sampler = ResumableDistributedSampler(
        train_set, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    batches = len(train_sampler) // cfg.batch_size
    if batches == 0:
        raise ConfigError(
            "--batch-size %d x %d ranks is more than the %d images in %s/train"
            % (cfg.batch_size, dist.world_size, len(train_set), cfg.data)
        )
    common = dict(batch_size=cfg.batch_size, pin_memory=dist.device.type == "cuda", **worker_options(cfg.workers))
    train = DataLoader(train_set, sampler=train_sampler, drop_last=True, **common)
    val_sampler = ShardSampler(len(val_set), dist.rank, dist.world_size)
    val = DataLoader(val_set, sampler=val_sampler, **common)
    return Loaders(
        DeviceLoader(train, dist.device, cfg.channels_last, batches),
        DeviceLoader(val, dist.device, cfg.channels_last, len(val)),
    )
