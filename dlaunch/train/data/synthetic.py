"""Synthetic data: one fixed random batch per rank, already on the device, repeated every step.

Rank r's batch is drawn from a generator seeded by `(seed, r)` (`synthetic_batch`), so a test can
replay exactly what every rank trained on. There is no validation set.
"""

from typing import Any, Tuple

import torch

from dlaunch.train.data.loaders import Loaders


def synthetic_batch(cfg: Any, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s images (normal noise, NCHW float32) and labels, on the CPU."""
    generator = torch.Generator().manual_seed(cfg.seed * 65536 + rank)
    images = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, generator=generator)
    labels = torch.randint(0, cfg.num_classes, (cfg.batch_size,), generator=generator)
    return images, labels


class SyntheticLoader:
    """`batches` repetitions of one device-resident batch per epoch."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batches: int):
        self.images = images
        self.labels = labels
        self.batches = batches
        self._skip = 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self._skip = skip_batches

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        for _ in range(self.batches - self._skip):
            yield self.images, self.labels


def build_synthetic_loaders(cfg: Any, dist: Any) -> Loaders:
    images, labels = synthetic_batch(cfg, dist.rank)
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    images = images.to(dist.device, memory_format=memory_format)
    return Loaders(SyntheticLoader(images, labels.to(dist.device), cfg.steps_per_epoch), None)
