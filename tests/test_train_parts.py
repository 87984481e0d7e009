"""Models, the JPEG folder generator, the folder loader's sharding and resumable sampler."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from dlaunch.train.config import ConfigError
from dlaunch.train.data.folder import ResumableDistributedSampler, ShardSampler
from dlaunch.train.data.make_folder import main as make_folder_main
from dlaunch.train.data.make_folder import make_pattern_folder
from dlaunch.train.models import build_model


def test_resnet44_is_he_et_al_6n_plus_2_with_option_a_shortcuts():
    model = build_model("resnet44", 10)
    weighted = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(weighted) == 44  # 1 stem conv + 3 stages x 7 blocks x 2 convs + 1 linear
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(0.66e6, rel=0.02)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_torchvision_resnet_is_random_init_with_num_classes():
    model = build_model("resnet18", 7)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 7)


def test_pattern_folder_is_deterministic_real_jpegs(tmp_path):
    make_pattern_folder(str(tmp_path / "a"), classes=2, images_per_class=3, val_per_class=1, size=40, seed=7)
    make_pattern_folder(str(tmp_path / "b"), classes=2, images_per_class=3, val_per_class=1, size=40, seed=7)
    files = sorted(os.path.relpath(os.path.join(d, f), tmp_path / "a")
                   for d, _, fs in os.walk(tmp_path / "a") for f in fs)
    assert len(files) == 8 and all(f.endswith(".JPEG") for f in files)
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    with Image.open(tmp_path / "a" / files[0]) as im:
        assert (im.format, im.size, im.mode) == ("JPEG", (40, 40), "RGB")
    means = [np.asarray(Image.open(tmp_path / "a" / "train" / c / "train_00001.JPEG"), dtype=float).mean(axis=(0, 1))
             for c in ("class_000", "class_001")]
    assert abs(means[0] - means[1]).max() > 10  # classes differ in colour


def test_make_folder_refuses_a_non_empty_target(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("")
    assert make_folder_main([str(tmp_path / "x"), "--classes", "2"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(ConfigError):
        make_pattern_folder(str(tmp_path / "x"), 2, 1, 1, 16)


def test_samplers_shard_without_overlap_and_resume_mid_epoch():
    data = list(range(20))
    full = [list(ResumableDistributedSampler(data, 2, rank, seed=1, drop_last=True)) for rank in (0, 1)]
    assert not set(full[0]) & set(full[1])
    skipping = ResumableDistributedSampler(data, 2, 0, seed=1, drop_last=True)
    skipping.skip = 4
    assert list(skipping) == full[0][4:] and len(skipping) == 6
    val = [list(ShardSampler(11, rank, 3)) for rank in range(3)]
    assert sorted(sum(val, [])) == list(range(11))
