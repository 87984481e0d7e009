"""The trainer's MLPerf-format log (dlaunch/train/mllog.py), checked by mlperf-logging's own compliance checker."""
import dataclasses
import json
import subprocess
import sys

import pytest

from helpers_train import assert_ok, run_trainer
from prerequisites import require_library
from dlaunch.train.mllog import MLLOG_FILE, MLPerfLog

# What a dlaunch run cannot meet of the closed ResNet rules (training 4.0.0), each listed in README.md
# ("MLPerf-format logs") with the reason; the checker must find these and nothing else.
EXPECTED_FINDINGS = {
    # the trainer decays the LR step-wise, by cosine or exponentially (the paper's schedules), never polynomially
    "Required EXACTLY_ONE occurrence of 'sgd_opt_learning_rate_decay_poly_power' but found 0",
    # a tiny CPU run on a small folder, not ImageNet to 75.9 % top-1
    "Failed checks for eval_accuracy : v['value'] >= 0.7590 and v['value'] < 1.0",
}


def lines(path):
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()]


def compliance_findings(log, tmp_path):
    """Run the checker's command line (ResNet's last ruleset, offline): (exit code, the first line of
    each finding)."""
    checked = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                              "--ruleset", "4.0.0", "--log_output", str(tmp_path / "checker.log"), str(log)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    output = checked.stdout + checked.stderr
    assert "training_4.0.0/closed_resnet.yaml" in output and "Log lines had parsing errors" not in output, output
    warnings = output.split("WARNING - ", 1)[1].rsplit("ERROR - FAILED", 1)[0] if "WARNING - " in output else ""
    findings = {block.strip().splitlines()[0] for block in warnings.split("-" * 30) if block.strip()}
    return checked.returncode, findings


@pytest.fixture(scope="module")
def pattern_folder(tmp_path_factory):
    from dlaunch.train.data.make_folder import make_pattern_folder
    root = str(tmp_path_factory.mktemp("patterns") / "data")
    make_pattern_folder(root, classes=4, images_per_class=8, val_per_class=4, size=32)
    return root


def test_a_real_runs_log_passes_mlperfs_checker_but_for_the_listed_exceptions(pattern_folder, tmp_path):
    require_library("mlperf_logging")
    run_dir = tmp_path / "run"
    # base LR 0.064 x 8 / 64 = 0.008 (a multiple of 0.001), cosine down to MLPerf's end LR 0.0001, weight decay 1e-4
    result = run_trainer(["--model", "resnet18", "--image-size", "32", "--data", pattern_folder, "--workers", "0",
                          "--batch-size", "8", "--epochs", "2", "--lr", "0.064", "--warmup-epochs", "1",
                          "--schedule", "cosine", "--lr-min", "0.0001", "--threads", "1", "--device", "cpu",
                          "--checkpoint-dir", str(run_dir)])
    assert_ok(result)
    log = run_dir / MLLOG_FILE
    events = lines(log)
    keys = [e["key"] for e in events]
    assert keys.count("run_start") == keys.count("run_stop") == 1 and keys.index("init_stop") < keys.index("run_start")
    assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "eval_accuracy"] == [1, 2]
    values = {e["key"]: e["value"] for e in events}
    assert (values["global_batch_size"], values["train_samples"], values["eval_samples"]) == (8, 32, 16)
    assert values["sgd_opt_base_learning_rate"] == pytest.approx(0.008)
    assert values["sgd_opt_end_learning_rate"] == pytest.approx(0.0001)
    assert events[-1]["metadata"] == {"status": "aborted"}  # ended without reaching 0.759
    code, findings = compliance_findings(log, tmp_path)
    assert (code, findings) == (1, EXPECTED_FINDINGS)


def test_the_log_stops_at_the_first_evaluation_that_reaches_the_target(tmp_path):
    log = MLPerfLog(str(tmp_path / MLLOG_FILE), 0.5, val_every=2, epochs=6)
    log.run_start({"nodes": 2, "site": "juwels-booster", "hosts": [], "run_id": "r", "model": "resnet50"}, {}, 0.0)
    for epoch, top1 in ((0, None), (1, 0.3), (2, None), (3, 0.6), (4, None), (5, 0.7)):
        log.epoch_start(epoch)
        log.epoch_stop(epoch)
        if top1 is not None:
            log.eval_start(epoch)
            log.eval_stop(epoch, top1, 100)
            log.block_stop(epoch)
            log.reached(top1)
    log.run_stop("ok")  # the trainer's end: already stopped
    events = lines(tmp_path / MLLOG_FILE)
    assert [e["key"] for e in events if e["key"] in ("block_start", "eval_accuracy", "run_stop")] == [
        "block_start", "eval_accuracy", "block_start", "eval_accuracy", "run_stop"]
    assert events[-1]["metadata"] == {"status": "success"} and events[-2]["key"] == "block_stop"
    assert [e["metadata"] for e in events if e["key"] == "block_start"] == [
        {"first_epoch_num": 1, "epoch_count": 2}, {"first_epoch_num": 3, "epoch_count": 2}]
    assert {e["value"] for e in events if e["key"] == "submission_platform"} == {"2xjuwels-booster"}


def test_an_interrupted_run_writes_no_run_stop_and_its_resumption_continues_the_log(tmp_path):
    path = str(tmp_path / MLLOG_FILE)
    first = MLPerfLog(path, None, val_every=1, epochs=3)
    first.run_start({"nodes": 1, "site": None, "hosts": ["n1"], "run_id": "r", "model": "resnet50"}, {}, 0.0)
    first.epoch_start(0)
    first.run_stop("interrupted")
    first.close()
    second = MLPerfLog(path, None, val_every=1, epochs=3)
    second.resume()
    second.epoch_start(1)
    second.run_stop("failed")
    keys = [e["key"] for e in lines(tmp_path / MLLOG_FILE)]
    assert keys.count("run_start") == 1 and keys.count("run_stop") == 1 and keys[-2:] == ["epoch_start", "run_stop"]
    assert lines(tmp_path / MLLOG_FILE)[-1]["metadata"] == {"status": "aborted"}
    assert {e["value"] for e in lines(tmp_path / MLLOG_FILE) if e["key"] == "submission_platform"} == {"1xn1"}


def test_batch_keys_follow_the_optimizer_update():
    """Horovod's gradient accumulation: 4 steps of 16 images per update; an asynchronous parameter server
    with 4 workers: one worker's 4 images per update."""
    from dlaunch.train.config import TrainConfig
    from dlaunch.train.mllog import hyperparameters
    from dlaunch.train.schedule import LRSchedule

    cfg = TrainConfig(batch_size=4, schedule="exponential", lr=0.064, warmup_epochs=1)
    accumulated = hyperparameters(cfg, LRSchedule(0.064, 64, 64, 10, 30, "exponential", 1.0), 16, 64, 10)
    assert [accumulated[k] for k in ("global_batch_size", "gradient_accumulation_steps", "train_samples")] == [64, 4, 160]
    assert (accumulated["sgd_opt_learning_rate_decay_steps"], accumulated["opt_learning_rate_decay_factor"]) == (20, 0.95)
    step = dataclasses.replace(cfg, schedule="step")
    asynchronous = hyperparameters(step, LRSchedule(0.064, 64, 4, 10, 30), 16, 16 / 4, 10)
    assert [asynchronous[k] for k in ("global_batch_size", "gradient_accumulation_steps", "model_bn_span")] == [4, 1, 4]
    assert asynchronous["opt_learning_rate_decay_boundary_epochs"] == [1, 2, 3]  # 30, 60, 80 of 90 on 3 epochs
