"""Bad input: exit code 2, one line `train: error: ...` on stderr, no metrics file written."""
import dataclasses
import os
from typing import Optional

import pytest

from helpers_train import TINY, run_trainer
from dlaunch.train.config import ConfigError, TrainConfig, parse_config
from dlaunch.train.data.make_folder import make_pattern_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("data") / "three")
    make_pattern_folder(root, classes=3, images_per_class=5, val_per_class=2, size=32, seed=1)
    return root


def empty_class_folder(tmp_path):
    for split in ("train", "val"):
        os.makedirs(tmp_path / "empty" / split / "a")
    return str(tmp_path / "empty")


CASES = {
    "unknown model": (["--model", "resnet9"], "--model: invalid choice: 'resnet9'"),
    "unknown schedule": (["--schedule", "linear"], "--schedule: invalid choice: 'linear'"),
    "missing folder": (["--data", "/nonexistent/imagenet"], "--data /nonexistent/imagenet: no such directory"),
    "class without images": (["--data", "EMPTY"], "no images in"),
    "num-classes mismatch": (["--data", "FOLDER", "--num-classes", "10"], "--num-classes 10 does not match 3 classes in"),
    "batch zero": (["--batch-size", "0"], "--batch-size 0 must be at least 1"),
    "epochs and steps": (["--epochs", "2", "--steps", "5"], "not allowed with argument"),
    "resume without dir": (["--resume"], "--resume needs --checkpoint-dir"),
    "accuracy in percent": (["--target-accuracy", "75"], "--target-accuracy 75.0 must be a top-1 fraction"),
    "warm-up eats the run": (["--steps", "4", "--warmup-steps", "4"], "leave none of --steps 4 to measure"),
    "fp16 on cpu": (["--amp", "fp16", "--device", "cpu"], "--amp fp16 needs --device cuda"),
    "lr nan": (["--lr", "nan"], "argument --lr: 'nan' is not a finite number"),
    "weight decay inf": (["--weight-decay", "inf"], "argument --weight-decay: 'inf' is not a finite number"),
    "no non-finite steps allowed": (["--max-nonfinite-steps", "0"], "--max-nonfinite-steps 0 must be at least 1"),
    "batch larger than the folder": (["--data", "FOLDER", "--batch-size", "64", "--steps", "2"],
                                     "--batch-size 64 x 1 ranks is more than the 15 images in"),
    "compile without warm-up": (["--compile", "default", "--steps", "4"], "--compile default needs --warmup-steps >= 1"),
    "cuda graphs on the cpu": (["--cuda-graphs", "--optimizer-impl", "fused", "--warmup-steps", "4", "--steps", "6"],
                               "--cuda-graphs needs --device cuda"),
    "minimal host syncs with fp16's unfused scaler": (["--host-syncs", "minimal", "--amp", "fp16", "--steps", "2"],
                                                      "--host-syncs minimal with --amp fp16 needs --optimizer-impl fused"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case, folder, tmp_path):
    args, message = CASES[case]
    args = [{"FOLDER": folder, "EMPTY": empty_class_folder(tmp_path) if a == "EMPTY" else a}.get(a, a) for a in args]
    metrics = tmp_path / "run" / "metrics.jsonl"
    result = run_trainer(TINY + args + ["--metrics", str(metrics)], timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: error: "), result.stderr
    assert message in lines[0]
    assert not metrics.exists() and not metrics.parent.exists()


def test_existing_metrics_file_needs_resume(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"x": 1}\n')
    result = run_trainer(TINY + ["--steps", "2", "--metrics", str(metrics)], timeout=120)
    assert result.returncode == 2 and "pass --resume" in result.stderr
    assert metrics.read_text() == '{"x": 1}\n'


# Every float field of TrainConfig is a flag; found from the dataclass, so a new float flag is covered too.
FLOAT_FLAGS = sorted("--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)
                     if f.type in (float, Optional[float], "float", "Optional[float]"))


def test_the_float_flags_are_found():
    assert {"--lr", "--momentum", "--weight-decay", "--grad-clip", "--fusion-threshold-mb",
            "--warmup-epochs", "--target-accuracy"} <= set(FLOAT_FLAGS)


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_every_float_flag_refuses_non_finite_values_naming_the_flag(flag, value):
    with pytest.raises(ConfigError) as refused:
        parse_config(["--steps", "2", "%s=%s" % (flag, value)])  # = : argparse takes "-inf" for an option
    assert str(refused.value) == "argument %s: %r is not a finite number" % (flag, value)
