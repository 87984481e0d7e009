"""The DALI loader (CPU pipelines, real DALI) against the folder it reads and the native loader, and
against the TFRecords that `python -m dlaunch.train.data.make_tfrecord` makes of that folder (DALI's TFRecord
reader with the converter's index files).

Every image of the test folder is one solid colour: red identifies the image (augmentation keeps a
solid colour), green is fixed (to check normalisation), blue encodes the class. Class folders are
named so that their sorted order differs from the order they were written in.
"""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from prerequisites import require_library
from dlaunch.train.config import parse_config
from dlaunch.train.frameworks.base import DistInfo

pytestmark = pytest.mark.dali

CLASSES = ["zebra", "apple", "mango"]  # sorted: apple=0, mango=1, zebra=2
TRAIN_PER_CLASS, VAL_PER_CLASS, SIZE, BATCH = 8, 3, 32, 4
GREEN = 100
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def red_of(index: int) -> int:
    return 16 + 8 * index


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """{split: {red value: class name}} and the folder's path."""
    root = tmp_path_factory.mktemp("solid")
    written = {}
    for split, count in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        written[split] = {}
        index = 0
        for c, name in enumerate(CLASSES):
            os.makedirs(root / split / name)
            for i in range(count):
                pixels = np.empty((40, 48, 3), np.uint8)
                pixels[...] = (red_of(index), GREEN, 40 + 80 * c)
                Image.fromarray(pixels).save(root / split / name / ("%03d.JPEG" % i), quality=95)
                written[split][red_of(index)] = name
                index += 1
    return str(root), written


@pytest.fixture(scope="module")
def tfrecords(folder, tmp_path_factory):
    """The folder as TFRecords (3 training shards, 2 validation shards, by 2 worker processes)."""
    require_library("google_crc32c")
    from dlaunch.train.data.make_tfrecord import main

    out = tmp_path_factory.mktemp("tfrecord") / "set"
    assert main([folder[0], str(out), "--train-shards", "3", "--val-shards", "2", "--workers", "2"]) == 0
    return str(out), folder[1]


@pytest.fixture(params=["image folder", "tfrecord"])
def source(request, folder):
    """Each test below reads the images as a folder and as TFRecords."""
    return request.getfixturevalue("tfrecords") if request.param == "tfrecord" else folder


def loaders(root, rank, world, tmp_path, loader="dali", extra=()):
    require_library("nvidia.dali")
    from dlaunch.train.data import build_loaders

    cfg = parse_config(["--loader", loader, "--data", root, "--batch-size", str(BATCH), "--image-size", str(SIZE),
                        "--workers", "1", "--seed", "3", "--metrics", str(tmp_path / "unused.jsonl")] + list(extra))
    return build_loaders(cfg, DistInfo(rank, world, rank, world, torch.device("cpu")))


def identify(images, labels, written_split):
    """(red value, class name by label) per image, after undoing the normalisation."""
    sorted_classes = sorted(CLASSES)
    pixels = images.mean(dim=(2, 3)) * torch.tensor(STD)[None] + torch.tensor(MEAN)[None]  # 0..1
    found = []
    for (red, green, _), label in zip((pixels * 255).tolist(), labels.tolist()):
        assert abs(green - GREEN) < 4  # the image was normalised with ImageNet's mean and std
        nearest = min(written_split, key=lambda r: abs(r - red))
        assert abs(nearest - red) < 3
        found.append((nearest, sorted_classes[label]))
    return found


def test_two_shards_cover_the_folder_once_per_epoch_with_the_folders_labels(source, tmp_path):
    root, written = source
    shards = [loaders(root, rank, 2, tmp_path).train for rank in range(2)]
    for epoch in range(2):
        seen = []
        for loader in shards:
            loader.set_epoch(epoch)
            batches = list(loader)
            assert len(batches) == len(loader) == len(written["train"]) // 2 // BATCH
            for images, labels in batches:
                assert images.shape == (BATCH, 3, SIZE, SIZE) and images.dtype == torch.float32
                assert labels.dtype == torch.int64
                seen += identify(images, labels, written["train"])
        assert sorted(red for red, _ in seen) == sorted(written["train"])  # all images, no duplicates
        assert all(written["train"][red] == name for red, name in seen)  # labels = sorted class folders


def test_validation_shards_evaluate_every_image_once(source, tmp_path):
    root, written = source
    seen = []
    for rank in range(2):
        val = loaders(root, rank, 2, tmp_path).val
        batches = list(val)
        assert len(batches) == len(val)
        for images, labels in batches:
            assert images.shape[1:] == (3, SIZE, SIZE)
            seen += identify(images, labels, written["val"])
    assert sorted(red for red, _ in seen) == sorted(written["val"])
    assert all(written["val"][red] == name for red, name in seen)


def test_same_training_batches_per_epoch_as_the_native_loader(folder, tmp_path):
    """Also with uneven shards (24 images on 5 ranks: DALI's shards hold 4 or 5, every rank yields one
    batch). Validation shards differ: contiguous in DALI, strided natively; both cover the set once."""
    root, _ = folder
    for world in (1, 2, 5):
        for rank in range(world):
            native = loaders(root, rank, world, tmp_path, loader="native")
            dali = loaders(root, rank, world, tmp_path)
            assert len(dali.train) == len(native.train) == len(list(dali.train))


def test_gpu_pipeline_without_gpu_is_refused(folder, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from dlaunch.train.config import ConfigError

    with pytest.raises(ConfigError, match="--dali-device gpu needs a CUDA GPU"):
        loaders(folder[0], 0, 1, tmp_path, extra=["--dali-device", "gpu"])


def test_tfrecord_set_reports_its_format_and_counts_and_only_dali_reads_it(tfrecords, tmp_path):
    import json
    import shutil

    from dlaunch.train.config import ConfigError
    from dlaunch.train.data.make_tfrecord import main

    root, _ = tfrecords
    manifest = json.loads(open(os.path.join(root, "tfrecords.json")).read())
    assert manifest["classes"] == sorted(CLASSES) and manifest["label_offset"] == 1
    assert {s: v["images"] for s, v in manifest["splits"].items()} == {"train": 24, "val": 9}
    index = open(os.path.join(root, "index", "train", "train-00000-of-00003.idx")).read().split()
    assert len(index) == 2 * 8 and index[0] == "0"  # 8 records: offset and size each, from offset 0
    assert loaders(root, 0, 1, tmp_path).train.settings["format"] == "tfrecord"
    assert parse_config(["--loader", "dali", "--data", root]).num_classes == 3  # from the manifest
    with pytest.raises(ConfigError, match="holds TFRecords, which only --loader dali reads"):
        parse_config(["--data", root, "--metrics", str(tmp_path / "m.jsonl")])
    assert main([manifest["source"], root]) == 2  # an existing set is not overwritten
    broken = shutil.copytree(root, tmp_path / "broken")
    os.remove(broken / "index" / "val" / "validation-00001-of-00002.idx")
    with pytest.raises(ConfigError, match="validation-00001-of-00002.idx is missing"):
        parse_config(["--loader", "dali", "--data", str(broken)])
