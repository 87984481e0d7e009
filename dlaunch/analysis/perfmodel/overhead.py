"""An epoch's time outside its steps (loader start, validation, checkpoint, barriers, logging), which `predict` shares
out over the epoch's steps as the metrics-v4 reader does: stated (`--epoch-overhead`) or the runs' measured mean
(`FixedOverhead`), or Aach et al.'s stated setup (`PaperOverhead`), and the GPU count from which it is more than a
tenth of a run's time."""

from dataclasses import dataclass
from statistics import fmean
from typing import Dict, List, Optional, Sequence

from dlaunch.analysis.perfmodel.model import (
    BACKWARD_FRACTION,
    IMAGENET_TRAIN_IMAGES,
    IMAGENET_VAL_IMAGES,
    MODEL_PARAMS_M,
    NATIVE_WORKER_IMAGES_PER_S,
    EpochOverhead,
    Machine,
    Workload,
    predict,
)
from dlaunch.analysis.scaling import Run

# `predict` names the GPU count from which epoch overhead is more than this share of a run's time.
OVERHEAD_SHARE_LIMIT = 0.10
# A checkpoint every epoch, as the reference ImageNet scripts such studies start from write one (PyTorch's
# examples/imagenet, Horovod's pytorch_imagenet_resnet50.py, DALI's PyTorch ResNet-50 example; so does dlaunch's
# trainer): the weights and SGD's momentum, fp32, while the other ranks wait at the next collective.
CHECKPOINT_BYTES_PER_PARAM = 8
# Assumed (no published JUWELS figure): one rank's write of a few hundred MB. The trainer's own writer into memory, no
# file system, reaches 1.6 GB/s on a quiet core and 0.7 GB/s on a loaded one (benchmarks/bench_checkpoint.py); a write
# to GPFS adds its own time, so the real rate lies below that ceiling: 1 GB/s assumes the file system costs about 60 %
# of the serialisation again.
CHECKPOINT_WRITE_BYTES_PER_S = 1e9


def checkpoint_bytes(model: str) -> float:
    """The bytes of `model`'s checkpoint: its weights and momentum buffers."""
    return CHECKPOINT_BYTES_PER_PARAM * MODEL_PARAMS_M[model] * 1e6


@dataclass(frozen=True)
class FixedOverhead:
    """An epoch overhead of `seconds` per epoch whatever the GPU count (stated, or measured by runs)."""

    seconds: float
    source: str

    def parts(self, workload: Workload, machine: Machine, gpus: int) -> Dict[str, float]:
        return {self.source: self.seconds}


@dataclass(frozen=True)
class PaperOverhead:
    """Aach et al.'s epoch outside its steps (seconds), from the paper's stated setup
    (../shared/papers/aach2023-design.md: ImageNet's 50,000 validation images every epoch, batch 64 per GPU,
    DALI or the native loader with 8 CPU threads per loader, 90 epochs); what it leaves unstated is
    assumed (`paper_overhead_assumptions`, printed by `predict`):

    validation      forward only over ceil(50,000 / p) images per GPU: per image the loader's I/O kernels
                    (`io_s` per batch, inside compute_s) and the rest of compute without back-propagation;
                    the loader makes at most the workload's input_images_per_s, and all ranks together read at
                    most the file system's images/s.
    loader start    native: the DataLoader's workers start again for training and validation every epoch
                    (PyTorch's default, persistent_workers=False): each waits for its first batch, made by
                    one worker (batch / NATIVE_WORKER_IMAGES_PER_S); DALI: none (its pipelines are built
                    once and prefetch across the iterator's reset at an epoch's end).
    synchronisation the validation's accuracy all-reduce and the epoch's closing barrier (two small
                    all-reduces), after the slowest rank's lag over the validation pass.
    checkpoint      not stated: one every epoch as the reference scripts write it (`checkpoint_bytes`, written at
                    CHECKPOINT_WRITE_BYTES_PER_S while the other ranks wait).
    logging         not stated: none (0 s).
    """

    loader: str  # 'dali' or 'native'
    io_s: float = 0.0  # the loader's I/O kernel seconds per batch within the workload's compute_s
    checkpoint_bytes: float = 0.0  # `checkpoint_bytes(model)` of the workload's model

    def parts(self, workload: Workload, machine: Machine, gpus: int) -> Dict[str, float]:
        forward_per_image = (self.io_s + (workload.compute_s - self.io_s) * (1.0 - BACKWARD_FRACTION)) / workload.batch
        if workload.input_images_per_s:
            forward_per_image = max(forward_per_image, 1.0 / workload.input_images_per_s)
        validation = -(-IMAGENET_VAL_IMAGES // gpus) * forward_per_image
        if workload.reads_files and machine.storage_images_per_s:
            validation = max(validation, IMAGENET_VAL_IMAGES / machine.storage_images_per_s)
        start = 2 * workload.batch / NATIVE_WORKER_IMAGES_PER_S if self.loader == "native" else 0.0
        sync = machine.lateness_s(validation, gpus) + 2 * machine.allreduce_s(gpus, 8.0)
        return {
            "validation": validation,
            "loader start": start,
            "synchronisation": sync,
            "checkpoint": self.checkpoint_bytes / CHECKPOINT_WRITE_BYTES_PER_S,
            "logging": 0.0,
        }


def paper_overhead_assumptions(loader: str) -> List[str]:
    """What `PaperOverhead` assumes where Aach et al. are silent (printed by `predict`)."""
    start = (
        "the native loader's DataLoader workers start again every epoch for training and validation "
        "(PyTorch's default persistent_workers=False), each first batch made by one worker at %.0f images/s"
        % NATIVE_WORKER_IMAGES_PER_S
        if loader == "native"
        else "DALI's pipelines are built once and prefetch across epoch ends (no start cost)"
    )
    checkpoint = (
        "a checkpoint every epoch (not stated; the reference ImageNet scripts of PyTorch, Horovod and DALI "
        "write one): weights and momentum, %d bytes per parameter, by one rank at %.0f GB/s (assumed; the "
        "trainer's writer reaches 1.6 GB/s into memory alone) while the others wait"
        % (CHECKPOINT_BYTES_PER_PARAM, CHECKPOINT_WRITE_BYTES_PER_S / 1e9)
    )
    return [
        start,
        checkpoint,
        "no logging cost (not stated; 0 s)",
        "validation in forward only (a third of the step's non-I/O kernels, its I/O kernels per image)",
    ]


def measured_overhead(runs: Sequence[Run]) -> Optional[FixedOverhead]:
    """The runs' mean epoch overhead (seconds per epoch); None when none recorded one (metrics before version 4)."""
    recorded = [r.epoch_overhead_s for r in runs if r.epoch_overhead_s is not None]
    return FixedOverhead(fmean(recorded), "measured") if recorded else None


def overhead_passes(
    workload: Workload,
    machine: Machine,
    overhead: EpochOverhead,
    start: int,
    limit: int,
    epoch_images: int = IMAGENET_TRAIN_IMAGES,
) -> Optional[int]:
    """The smallest GPU count from `start` (then whole nodes) up to `limit` at which epoch overhead is more
    than OVERHEAD_SHARE_LIMIT of the run's time; None when it stays below up to `limit`."""
    node = machine.gpus_per_node
    counts = [start] + list(range(-(-(start + 1) // node) * node, limit + 1, node))
    for gpus in counts:
        if predict(workload, machine, [gpus], overhead, epoch_images)[0].overhead_share > OVERHEAD_SHARE_LIMIT:
            return gpus
    return None


def describe_epochs(overhead: EpochOverhead, workload: Workload, epoch_images: int) -> str:
    """What the epochs are and where their overhead comes from (with `PaperOverhead`'s assumptions)."""
    epochs = "epochs of %d training images (%s)" % (
        epoch_images,
        "ImageNet-1k" if epoch_images == IMAGENET_TRAIN_IMAGES else "--epoch-images",
    )
    if isinstance(overhead, FixedOverhead):
        source = "given" if overhead.source == "--epoch-overhead" else "your runs' mean"
        return "%s; epoch overhead %.3f s per epoch (%s)" % (epochs, overhead.seconds, source)
    return (
        "%s; epoch overhead from Aach et al.'s stated setup (50,000 validation images every epoch, batch %d per GPU, "
        "8 CPU threads per %s loader): validation, loader start, synchronisation; assumed: %s"
        % (epochs, workload.batch, overhead.loader, "; ".join(paper_overhead_assumptions(overhead.loader)))
    )
