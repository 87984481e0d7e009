"""The TFRecord form of an ImageNet-layout folder (written by `python -m dlaunch.train.data.make_tfrecord`), as
DALI's TFRecord reader takes it (`--loader dali --data DIR`). Standard library only (the launcher's
checks and the trainer's config read it without DALI).

  DIR/tfrecords.json                       the manifest: classes in label order, images and shards per split
  DIR/train/train-00000-of-NNNNN ...       TFRecord files of tf.train.Example records
  DIR/val/validation-00000-of-NNNNN ...
  DIR/index/<split>/<file>.idx             DALI's index of each file: one line "offset size" per record

The records follow TensorFlow's ImageNet converter (build_imagenet_data.py of tensorflow/models):
`image/encoded` (the image file's bytes), `image/format`, `image/filename`, `image/class/synset` and
`image/class/label` = 1 + the class's index in sorted folder order (0 stands for a background class
there), so the trainer's label is `image/class/label` - `label_offset`.
"""

import json
import os
from typing import Any, Dict, List

from dlaunch.train.errors import ConfigError

MANIFEST = "tfrecords.json"
FORMAT = "dlaunch.tfrecords"
SPLITS = {"train": "train", "val": "validation"}  # split folder -> file name prefix


def is_tfrecord_dir(root: str) -> bool:
    return os.path.isfile(os.path.join(root, MANIFEST))


def shard_name(split: str, shard: int, shards: int) -> str:
    return "%s-%05d-of-%05d" % (SPLITS[split], shard, shards)


def read_manifest(root: str) -> Dict[str, Any]:
    """The manifest of a TFRecord directory, its files checked to exist (ConfigError naming the first missing one)."""
    path = os.path.join(root, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("--data %s: unreadable %s (%s)" % (root, MANIFEST, e)) from None
    if manifest.get("format") != FORMAT:
        raise ConfigError("--data %s: %s is not a %s manifest" % (root, path, FORMAT))
    for split in SPLITS:
        for record, index in zip(files(root, manifest, split), index_files(root, manifest, split)):
            for needed in (record, index):
                if not os.path.isfile(needed):
                    raise ConfigError(
                        "--data %s: %s is missing (rerun python -m dlaunch.train.data.make_tfrecord)" % (root, needed)
                    )
    return manifest


def files(root: str, manifest: Dict[str, Any], split: str) -> List[str]:
    shards = manifest["splits"][split]["shards"]
    return [os.path.join(root, split, shard_name(split, i, shards)) for i in range(shards)]


def index_files(root: str, manifest: Dict[str, Any], split: str) -> List[str]:
    shards = manifest["splits"][split]["shards"]
    return [os.path.join(root, "index", split, shard_name(split, i, shards) + ".idx") for i in range(shards)]
