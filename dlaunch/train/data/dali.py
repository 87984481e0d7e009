"""NVIDIA DALI loaders (`--loader dali`) over the same ImageNet-layout folder as `dlaunch.train.data.folder`, or
over its TFRecord form (dlaunch/train/data/tfrecords.py, made by `python -m dlaunch.train.data.make_tfrecord`; Aach et
al. 2023's DALI input), read with DALI's TFRecord reader and its index files.

Decoding and augmentation run in DALI pipelines on the CPU (`--dali-device cpu`: CPU decoder and
operators, no GPU needed) or on the GPU (`--dali-device gpu`: the `mixed` nvJPEG decoder, GPU resize).
Training: random-resized crop (area 0.08-1, aspect 3/4-4/3), horizontal flip, ImageNet normalisation;
validation: resize the shorter side to image_size*256/224, center crop; as in the native loader.
Batches arrive as NCHW float32 images and int64 labels on `dist.device`. Labels are the index of the
class folder in sorted order (as ImageFolder's `class_to_idx`).

Data order, compared with the native DistributedSampler (one permutation seeded by seed + epoch):
DALI's file reader shuffles the file list once (the TFRecord reader keeps the records' order, which the
converter shuffled with its own seed) with a seed shared by all ranks, cuts it into `world`
contiguous shards, and moves every rank to the next shard each epoch; within its shard a rank reads
through a shuffle buffer (DALI's `initial_fill`, 1024 samples) seeded by `--seed`. Each epoch the
shards partition the training set (no image on two ranks), but the order is DALI's, not the
sampler's, and it is not restored on resume (a mid-epoch resume reads and drops the batches to
skip). Augmentation is seeded by (seed, rank).

Epoch length: every rank yields floor(floor(N / world) / batch) training batches (the native
loader's count); batches past that on a larger shard are read and dropped, so all ranks step equally
(LastBatchPolicy.DROP). Validation uses LastBatchPolicy.PARTIAL on fixed shards (stick_to_shard): every
validation image is evaluated exactly once, the last batch of a rank may be smaller.
"""

import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Tuple

import nvidia.dali
import nvidia.dali.tfrecord as tfrec
import torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

import dlaunch.train.data.tfrecords as tfrecords
from dlaunch.train.config import ConfigError
from dlaunch.train.data.folder import IMAGENET_MEAN, IMAGENET_STD
from dlaunch.train.data.loaders import Loaders

READER = "Reader"
_MEAN = [255.0 * m for m in IMAGENET_MEAN]
_STD = [255.0 * s for s in IMAGENET_STD]


@dataclass(frozen=True)
class Source:
    """What a reader reads for one split: the class folders of an image folder, or TFRecord files."""

    root: str  # the split's folder
    images: int
    records: Tuple[str, ...] = ()  # TFRecord files (empty: an image folder)
    indexes: Tuple[str, ...] = ()
    label_offset: int = 0

    @property
    def format(self) -> str:
        return "tfrecord" if self.records else "image folder"


def _read(source: Source, shard_id: int, num_shards: int, training: bool, reader_seed: int = 0) -> Tuple[Any, Any]:
    """(encoded images, labels) of this rank's shard: shuffled for training, fixed shards for validation."""
    order = (
        dict(random_shuffle=True, seed=reader_seed)
        if training
        else dict(random_shuffle=False, stick_to_shard=True, pad_last_batch=True)
    )
    if not source.records:
        return fn.readers.file(file_root=source.root, shard_id=shard_id, num_shards=num_shards, name=READER, **order)  # type: ignore[return-value]  # DALI's stubs type a reader's outputs as a Sequence; readers.file gives (images, labels)
    inputs = fn.readers.tfrecord(
        path=list(source.records),
        index_path=list(source.indexes),
        shard_id=shard_id,
        num_shards=num_shards,
        name=READER,
        features={
            "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),  # type: ignore[arg-type]  # DALI takes a shape tuple; its stub says list
            "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
        },
        **order,
    )
    return inputs["image/encoded"], inputs["image/class/label"] - source.label_offset  # type: ignore[call-overload,index]  # readers.tfrecord gives a dict by feature name; its stub says a Sequence


@pipeline_def
def _train_pipeline(source: Source, shard_id: int, num_shards: int, reader_seed: int, size: int, device: str):
    jpegs, labels = _read(source, shard_id, num_shards, True, reader_seed)
    images = fn.decoders.image_random_crop(
        jpegs,
        device="mixed" if device == "gpu" else "cpu",
        output_type=types.RGB,
        random_area=[0.08, 1.0],
        random_aspect_ratio=[3.0 / 4.0, 4.0 / 3.0],
    )
    images = fn.resize(images, device=device, resize_x=size, resize_y=size)
    images = fn.crop_mirror_normalize(
        images,
        device=device,
        dtype=types.FLOAT,
        output_layout="CHW",
        mean=_MEAN,
        std=_STD,
        mirror=fn.random.coin_flip(probability=0.5),
    )
    return images, labels


@pipeline_def
def _val_pipeline(source: Source, shard_id: int, num_shards: int, size: int, device: str):
    jpegs, labels = _read(source, shard_id, num_shards, False)
    images = fn.decoders.image(jpegs, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)
    images = fn.resize(images, device=device, resize_shorter=int(round(size * 256 / 224)))
    images = fn.crop_mirror_normalize(
        images, device=device, dtype=types.FLOAT, output_layout="CHW", crop=(size, size), mean=_MEAN, std=_STD
    )
    return images, labels


def shard_size(samples: int, shard_id: int, num_shards: int) -> int:
    """Samples in DALI's shard `shard_id` (contiguous cuts at floor(i * samples / num_shards))."""
    return (shard_id + 1) * samples // num_shards - shard_id * samples // num_shards


class DaliLoader:
    """A DALIGenericIterator as a trainer loader: `batches` per epoch, batches moved to `device`."""

    def __init__(
        self,
        pipeline: Any,
        policy: Any,
        batches: int,
        device: torch.device,
        channels_last: bool,
        settings: Dict[str, Any],
    ):
        pipeline.build()
        self.iterator = DALIGenericIterator(
            [pipeline], ["images", "labels"], reader_name=READER, last_batch_policy=policy, auto_reset=True
        )
        self.batches = batches
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.settings = settings
        self._skip = 0
        self._unfinished = False

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """The reader advances its own shuffle each epoch; `skip_batches` are read and dropped."""
        self._skip = skip_batches

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        if self._unfinished:  # a consumer stopped early last time: finish that epoch first
            for _ in self.iterator:
                pass
        self._unfinished = True
        skip, self._skip = self._skip, 0
        non_blocking = self.device.type == "cuda"
        for index, outputs in enumerate(self.iterator):
            if index >= self.batches:
                continue  # the rest of a larger shard: read, dropped
            images, labels = outputs[0]["images"], outputs[0]["labels"]
            if index < skip or images.shape[0] == 0:
                continue
            yield (
                images.to(self.device, non_blocking=non_blocking, memory_format=self.memory_format),
                labels.reshape(-1).to(self.device, dtype=torch.int64, non_blocking=non_blocking),
            )
        self._unfinished = False


def sources(data: str) -> Dict[str, Source]:
    """The train and val sources of `--data`: its TFRecords when it holds a manifest, else its class folders."""
    if tfrecords.is_tfrecord_dir(data):
        manifest = tfrecords.read_manifest(data)
        return {
            split: Source(
                os.path.join(data, split),
                manifest["splits"][split]["images"],
                tuple(tfrecords.files(data, manifest, split)),
                tuple(tfrecords.index_files(data, manifest, split)),
                manifest["label_offset"],
            )
            for split in tfrecords.SPLITS
        }
    from torchvision import datasets

    return {
        split: Source(os.path.join(data, split), len(datasets.ImageFolder(os.path.join(data, split))))
        for split in tfrecords.SPLITS
    }


def build_dali_loaders(cfg: Any, dist: Any) -> Loaders:
    """Train and val DALI loaders for this rank (ConfigError when a GPU is asked for but absent)."""
    if cfg.dali_device == "gpu" and not torch.cuda.is_available():
        raise ConfigError("--dali-device gpu needs a CUDA GPU and none is visible (use --dali-device cpu)")
    device_id = None
    if cfg.dali_device == "gpu":
        device_id = dist.device.index if dist.device.type == "cuda" else dist.local_rank
    threads = max(1, cfg.workers)
    train_source, val_source = (sources(cfg.data)[split] for split in ("train", "val"))
    batches = (train_source.images // dist.world_size) // cfg.batch_size
    if batches == 0:
        raise ConfigError(
            "--batch-size %d x %d ranks is more than the %d images in %s"
            % (cfg.batch_size, dist.world_size, train_source.images, train_source.root)
        )
    settings = {
        "dali": nvidia.dali.__version__,
        "dali_device": cfg.dali_device,
        "threads": threads,
        "format": train_source.format,
        "train_last_batch": "DROP",
        "val_last_batch": "PARTIAL",
        "shuffle": ("TFRecord reader" if train_source.records else "file reader")
        + ": fixed-seed shard split, shard rotation per epoch, seeded shuffle buffer",
    }
    common = dict(
        batch_size=cfg.batch_size,
        num_threads=threads,
        device_id=device_id,
        shard_id=dist.rank,
        num_shards=dist.world_size,
        size=cfg.image_size,
        device=cfg.dali_device,
    )
    train = DaliLoader(
        _train_pipeline(source=train_source, reader_seed=cfg.seed, seed=cfg.seed * 65536 + dist.rank, **common),
        LastBatchPolicy.DROP,
        batches,
        dist.device,
        cfg.channels_last,
        settings,
    )
    val_batches = math.ceil(shard_size(val_source.images, dist.rank, dist.world_size) / cfg.batch_size)
    val = DaliLoader(
        _val_pipeline(source=val_source, seed=cfg.seed * 65536 + dist.rank, **common),
        LastBatchPolicy.PARTIAL,
        val_batches,
        dist.device,
        cfg.channels_last,
        settings,
    )
    return Loaders(train, val)
