"""Real learning on real JPEGs: scikit-learn's digits exported as an ImageNet-layout folder."""
import pytest

from helpers_train import assert_ok, run_trainer
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow  # real multi-process / multi-epoch training runs


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from dlaunch.train.data.make_folder import make_digits_folder
    root = str(tmp_path_factory.mktemp("digits") / "digits")
    make_digits_folder(root, size=32)
    return root


def test_resnet18_learns_digits_from_the_folder_loader(digits, tmp_path):
    result = run_trainer(["--model", "resnet18", "--image-size", "32", "--data", digits, "--workers", "1",
                          "--batch-size", "32", "--epochs", "3", "--lr", "0.05", "--warmup-epochs", "0.3",
                          "--schedule", "cosine", "--threads", "1", "--device", "cpu", "--target-accuracy", "0.5",
                          "--checkpoint-dir", str(tmp_path)])
    assert_ok(result)
    metrics = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert metrics.header["config"]["num_classes"] == 10  # taken from the folder
    epochs = metrics.epochs
    assert len(epochs) == 3
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    assert epochs[-1]["top1"] > 0.5  # chance is 0.1
    assert epochs[-1]["top5"] >= epochs[-1]["top1"]
    assert metrics.end["best_top1"] == max(e["top1"] for e in epochs)
    assert 0 < metrics.end["time_to_accuracy_s"] <= metrics.end["total_time_s"]
