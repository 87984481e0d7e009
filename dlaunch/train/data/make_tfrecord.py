"""Convert an ImageNet-layout folder (train/<class>/*, val/<class>/*) into TFRecords with DALI's index
files (the layout: dlaunch/train/data/tfrecords.py), the input of Aach et al. 2023's DALI runs.

  python -m dlaunch.train.data.make_tfrecord SRC DST [--train-shards 1024] [--val-shards 128] [--workers N] [--seed 0]

Every image file goes into one tf.train.Example unchanged (no decoding), in a seeded random order, so
that each shard mixes the classes (DALI's reader shuffles only within a buffer). Shard counts default to
those of TensorFlow's ImageNet converter (1024 and 128; fewer when there are fewer images). The shards
are written by `--workers` processes, each file atomically (a temporary name, then renamed); the
manifest is written last, so DST holds a usable set only when the conversion finished. Needs
google-crc32c (the records' CRC32C checksums; the `dali` extra of dlaunch), no TensorFlow: the
protocol-buffer encoding of the few fields is written here.
"""

import json
import os
import random
import struct
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

import google_crc32c

from dlaunch.train.config import IMAGE_EXTENSIONS, ConfigError, OneLineParser, count_image_folder_classes
from dlaunch.train.data.tfrecords import FORMAT, MANIFEST, shard_name

Item = Tuple[str, int, str]  # (image path, class index, class folder name)
_MASK_DELTA = 0xA282EAD8


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _bytes_feature(value: bytes) -> bytes:
    return _length_delimited(1, _length_delimited(1, value))  # Feature.bytes_list { value }


def _int64_feature(value: int) -> bytes:
    return _length_delimited(3, _length_delimited(1, _varint(value)))  # Feature.int64_list { packed value }


def example(features: Sequence[Tuple[str, bytes]]) -> bytes:
    """A serialized tf.train.Example: Example.features (1) { map<string, Feature> feature (1) }."""
    entries = b"".join(
        _length_delimited(1, _length_delimited(1, name.encode()) + _length_delimited(2, feature))
        for name, feature in features
    )
    return _length_delimited(1, entries)


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def tfrecord(payload: bytes) -> bytes:
    """One TFRecord: length, its masked CRC32C, the payload, its masked CRC32C (little-endian)."""
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", _masked_crc(length)) + payload + struct.pack("<I", _masked_crc(payload))


def image_example(path: str, label: int, synset: str) -> bytes:
    with open(path, "rb") as f:
        encoded = f.read()
    extension = os.path.splitext(path)[1].lower().lstrip(".")
    return example(
        [
            ("image/encoded", _bytes_feature(encoded)),
            ("image/format", _bytes_feature(("JPEG" if extension in ("jpg", "jpeg") else extension.upper()).encode())),
            ("image/filename", _bytes_feature(os.path.basename(path).encode())),
            ("image/class/label", _int64_feature(label + 1)),
            ("image/class/synset", _bytes_feature(synset.encode())),
        ]
    )


def write_shard(record_path: str, index_path: str, items: Sequence[Item]) -> int:
    """Write one TFRecord file and its DALI index ("offset size" per record), each atomically."""
    offset, index = 0, []
    tmp = "%s.tmp-%d" % (record_path, os.getpid())
    with open(tmp, "wb") as f:
        for path, label, synset in items:
            record = tfrecord(image_example(path, label, synset))
            f.write(record)
            index.append("%d %d\n" % (offset, len(record)))
            offset += len(record)
    os.replace(tmp, record_path)
    tmp_index = "%s.tmp-%d" % (index_path, os.getpid())
    with open(tmp_index, "w", encoding="utf-8") as f:
        f.write("".join(index))
    os.replace(tmp_index, index_path)
    return len(items)


def list_split(root: str, split: str, classes: List[str]) -> List[Item]:
    items = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, split, name)
        items += [
            (os.path.join(folder, f), label, name)
            for f in sorted(os.listdir(folder))
            if f.lower().endswith(IMAGE_EXTENSIONS)
        ]
    return items


def convert(
    src: str, dst: str, train_shards: int = 1024, val_shards: int = 128, workers: Optional[int] = None, seed: int = 0
) -> dict:
    """Write DST from SRC; returns the manifest."""
    count_image_folder_classes(src)  # the layout check of the trainer (ConfigError naming what is wrong)
    if os.path.exists(os.path.join(dst, MANIFEST)):
        raise ConfigError("%s already holds a TFRecord set (%s); remove it or choose another DST" % (dst, MANIFEST))
    classes = sorted(e.name for e in os.scandir(os.path.join(src, "train")) if e.is_dir())
    manifest: Dict[str, Any] = {
        "format": FORMAT,
        "source": os.path.abspath(src),
        "classes": classes,
        "label_offset": 1,
        "features": {"image": "image/encoded", "label": "image/class/label"},
        "seed": seed,
        "splits": {},
    }
    jobs = []
    for split, wanted in (("train", train_shards), ("val", val_shards)):
        items = list_split(src, split, classes)
        random.Random("%d-%s" % (seed, split)).shuffle(items)
        shards = max(1, min(wanted, len(items)))
        manifest["splits"][split] = {"images": len(items), "shards": shards}
        for folder in (os.path.join(dst, split), os.path.join(dst, "index", split)):
            os.makedirs(folder, exist_ok=True)
        for shard in range(shards):
            name = shard_name(split, shard, shards)
            part = items[shard * len(items) // shards : (shard + 1) * len(items) // shards]
            jobs.append((os.path.join(dst, split, name), os.path.join(dst, "index", split, name + ".idx"), part))
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        written = sum(pool.map(write_shard, *zip(*jobs)))
    assert written == sum(s["images"] for s in manifest["splits"].values())
    tmp = os.path.join(dst, MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    os.replace(tmp, os.path.join(dst, MANIFEST))
    return manifest


def main(argv: Optional[List[str]] = None) -> int:
    p = OneLineParser(prog="python -m dlaunch.train.data.make_tfrecord", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="ImageNet-layout folder (train/<class>/*, val/<class>/*)")
    p.add_argument("dst", help="output folder (created)")
    p.add_argument("--train-shards", type=int, default=1024)
    p.add_argument("--val-shards", type=int, default=128)
    p.add_argument("--workers", type=int, default=None, help="processes writing shards (default: the CPUs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the record order")
    try:
        a = p.parse_args(argv)
        if min(a.train_shards, a.val_shards) < 1 or (a.workers is not None and a.workers < 1):
            raise ConfigError("--train-shards, --val-shards and --workers must be at least 1")
        manifest = convert(a.src, a.dst, a.train_shards, a.val_shards, a.workers, a.seed)
    except ConfigError as e:
        print("make_tfrecord: error: %s" % e, file=sys.stderr)
        return 2
    print(
        "wrote %s: %s"
        % (
            a.dst,
            ", ".join(
                "%s %d images in %d shards" % (s, v["images"], v["shards"]) for s, v in manifest["splits"].items()
            ),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
