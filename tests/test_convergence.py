"""Convergence-aware scaling: MLPerf's RCPs as its checker computes them, epochs and time to target in
the report, the RCP verdict per global batch over runs with recorded accuracy curves."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlaunch.analysis.convergence import RCP_FILE, load_rcps, rcp_at, t_cdf, t_quantile
from dlaunch.cli import app
from prerequisites import require_library
from test_analysis import write_run
from test_report import table_rows

IMAGENET = {"data": "/p/scratch/imagenet", "num_classes": 1000}
RCP_PACKAGE_FILE = "rcp_checker/training_4.0.0/rcps_resnet.json"


def test_t_distribution_agrees_with_scipy():
    require_library("scipy")
    import scipy.stats as stats
    for df in (1, 2, 3, 6, 11, 15, 26):
        for t in (-3.0, -0.4, 0.0, 1.2, 2.7):
            assert t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-12)
        assert t_quantile(0.95, df) == pytest.approx(stats.t.ppf(0.95, df), abs=1e-9)


def test_the_rcps_are_mlperf_loggings_and_give_its_checkers_min_epochs():
    """The copy in data/published is the package's file; pruning, means, min epochs and the RCP at
    any global batch (own, interpolated, below the smallest, none above the largest) as its checker."""
    require_library("mlperf_logging")
    import mlperf_logging
    from mlperf_logging.rcp_checker.rcp_checker import RCP_Checker

    package_file = Path(mlperf_logging.__file__).parent / RCP_PACKAGE_FILE
    assert RCP_FILE.read_bytes() == package_file.read_bytes()
    checker = RCP_Checker("training", "4.0.0", "resnet", False)
    rcps = load_rcps()
    pruned = sorted(checker.pruned_rcp_data.values(), key=lambda r: r["BS"])
    assert [(r.batch, r.mean) for r in rcps] == [(r["BS"], pytest.approx(r["RCP Mean"])) for r in pruned]
    assert [r.min_epochs for r in rcps] == pytest.approx([r["Min Epochs"] for r in pruned], abs=1e-3)
    for batch in (256, 1632, 2000, 4096, 30000, 65536):
        mine = rcp_at(batch, rcps)
        own = checker._find_rcp(batch, "pruned_rcps")
        low, high = checker._find_top_min_rcp(batch, "pruned_rcps"), checker._find_bottom_max_rcp(batch, "pruned_rcps")
        expected = own or (checker._create_interp_rcp(batch, low, high)[1] if low and high else checker._find_min_rcp("pruned_rcps"))
        assert (mine.mean, mine.min_epochs) == (pytest.approx(expected["RCP Mean"]), pytest.approx(expected["Min Epochs"], abs=1e-3))
    assert rcp_at(70000, rcps) is None  # above the largest RCP batch: MLPerf asks for a new RCP


def imagenet_run(root, name, gpus, reach_epoch, epochs=90, batch=64, seconds_per_epoch=100.0):
    """A ResNet-50 ImageNet run whose validation top-1 first reaches 0.759 after `reach_epoch` epochs
    (None: never), with --target-accuracy 0.759."""
    top1 = [0.80 if reach_epoch and e + 1 >= reach_epoch else 0.5 + e / 1000 for e in range(epochs)]
    time_to = reach_epoch * seconds_per_epoch if reach_epoch else None
    return write_run(root, name, gpus, [1000.0 * gpus] * epochs, batch=batch, top1=top1, config=IMAGENET,
                     end={"target_accuracy": 0.759, "time_to_accuracy_s": time_to, "best_top1": max(top1)})


def test_report_states_the_rcp_verdict_per_global_batch_and_time_to_target_beside_speedup(tmp_path):
    runs = tmp_path / "runs"
    imagenet_run(runs, "g4", 4, 34, seconds_per_epoch=1000.0)  # batch 256: below the smallest RCP (1632)
    imagenet_run(runs, "g64", 64, 30, seconds_per_epoch=80.0)  # 4096: interpolated RCP, min 34.9 epochs
    for i, epochs in enumerate((60, 70, 90)):  # 32768: an RCP of its own; olympic mean of 60, 70, 90 = 70
        imagenet_run(runs, "g512-r%d" % i, 512, epochs, seconds_per_epoch=10.0)
    imagenet_run(runs, "g1024", 1024, None)  # 65536: never reached 75.9 %
    imagenet_run(runs, "g2048", 2048, 50)  # 131072: above the largest RCP
    write_run(runs, "synthetic", 8, [10.0, 20.0], top1=[0.1, 0.8], end={"target_accuracy": 0.759})  # no ImageNet
    out = tmp_path / "report"
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["report", str(runs), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    rcp = {row[1]: row[2:] for row in table_rows(text, "## Convergence against MLPerf's reference convergence points")}
    assert sorted(rcp, key=int) == ["256", "4096", "32768", "65536", "131072"]  # the synthetic run is not ImageNet
    assert rcp["256"] == ["1", "1", "34.00", "35.00", "33.80", "resnet_ref_1632", "PASS (0.97x the RCP mean)"]
    assert rcp["4096"][2:4] == ["30.00", "35.74"] and rcp["4096"][5:] == ["interpolated between 3264 and 32768",
                                                                         "FAIL (faster than MLPerf accepts)"]
    assert rcp["32768"] == ["3", "3", "70.00", "56.00", "55.44", "resnet_ref_32768", "PASS (1.25x the RCP mean)"]
    assert rcp["65536"][:3] == ["1", "0", "-"] and rcp["65536"][-1] == "not reached (0 of 1 runs reached 75.9%)"
    assert rcp["131072"][-1] == "no RCP (above the largest RCP batch)"
    assert "mlperf_logging/rcp_checker/training_4.0.0/rcps_resnet.json" in text
    scaling = {row[1]: row for row in table_rows(text, "## Scaling") if row[0].endswith("b64")}
    headers = table_rows(text.replace("## Scaling\n\n", "## Scaling\n\nx\n|-|\n", 1), "## Scaling")[0]
    epochs_col = headers.index("epochs to target")
    # time to target: 34 x 1000 s on 4 GPUs; 70 x 10 s on 512 (median of 600, 700, 900): TTA S_G 34000 / 700
    assert scaling["4"][epochs_col:epochs_col + 3] == ["34", "34000.0", "1.00"]
    assert scaling["512"][epochs_col:epochs_col + 3] == ["70", "700.0", "%.2f" % (34000 / 700)]
    assert scaling["512"][headers.index("S_G")] == "128.00"  # throughput speed-up beside it
    assert (out / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "convergence against MLPerf's RCPs" in result.output


def test_epochs_to_target_and_the_rcp_verdict_reach_the_results_database(tmp_path, results_db):
    imagenet_run(tmp_path, "g4", 4, 34)
    CliRunner().invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "report")])
    shown = CliRunner().invoke(app, ["results", "--format", "json"])
    (row,) = json.loads(shown.stdout)
    assert (row["epochs_to_target"], row["time_to_target_s"], row["target_accuracy"]) == (34, 3400.0, 0.759)
    assert (row["epochs_to_mlperf_target"], row["rcp"]) == (34, "PASS (0.97x the RCP mean)")  # batch 256
