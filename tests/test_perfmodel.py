"""launcher/perfmodel.py: the ring all-reduce model, its calibration against Aach et al. 2023, `predict`."""
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import DlaunchError
from launcher.perfmodel import (
    Interconnect,
    Workload,
    calibrate,
    gradient_bytes,
    load_published,
    predict,
    workload_from_options,
)
from test_analysis import write_run

# The bounds documented in benchmarks/README.md ("Performance model vs Aach et al. 2023"), in
# percentage points of comm share, for the model calibrated on all points of a column.
MAX_ERROR_PP = {"dali": 5.0, "native": 15.0}

JUWELS_LIKE = Interconnect(gpus_per_node=4, latency_us=5.0, bandwidth_gbps_per_node=800.0, intra_node_gbps=2400.0)
RUNNER = CliRunner(env={"COLUMNS": "200"})  # wide enough for rich to print whole numbers
RESNET50 = Workload(compute_s=0.2, batch=64, gradient_bytes=102.4e6, data_s=0.05)


def test_gradient_bytes_from_the_parameter_table():
    assert gradient_bytes("resnet50") == pytest.approx(4 * 25.6e6)
    assert gradient_bytes("resnet44") == pytest.approx(4 * 0.66e6)
    with pytest.raises(ValueError, match="resnet9000"):
        gradient_bytes("resnet9000")


def test_ring_allreduce_uses_the_per_gpu_share_of_the_node_network_across_nodes():
    # 8 GPUs on 2 nodes: 14 hops of 5 us + 14/8 of 102.4 MB at 800/4 Gbit/s = 25 GB/s per GPU
    assert JUWELS_LIKE.allreduce_s(8, 102.4e6) == pytest.approx(14 * 5e-6 + 14 / 8 * 102.4e6 / 25e9)
    # 4 GPUs in one node: NVLink, 300 GB/s
    assert JUWELS_LIKE.allreduce_s(4, 102.4e6) == pytest.approx(6 * 5e-6 + 6 / 4 * 102.4e6 / 300e9)
    assert JUWELS_LIKE.allreduce_s(1, 102.4e6) == 0.0


def test_step_time_throughput_and_efficiency():
    one, eight = predict(RESNET50, JUWELS_LIKE, [8, 1], overlap=0.0)
    assert (one.gpus, one.comm_s, one.step_s, one.efficiency) == (1, 0.0, pytest.approx(0.25), 1.0)
    comm = JUWELS_LIKE.allreduce_s(8, 102.4e6)
    assert eight.step_s == pytest.approx(0.25 + comm)
    assert eight.images_per_s == pytest.approx(8 * 64 / (0.25 + comm))
    assert eight.efficiency == pytest.approx(0.25 / (0.25 + comm))
    assert eight.comm_share == pytest.approx(comm / (comm + 0.25))
    assert eight.nodes == 2


def test_overlap_hides_communication_up_to_the_backward_time():
    comm = JUWELS_LIKE.allreduce_s(64, 102.4e6)
    (half,) = predict(RESNET50, JUWELS_LIKE, [64], overlap=0.5)
    assert half.exposed_comm_s == pytest.approx(0.5 * comm)
    short = Workload(compute_s=0.003, batch=64, gradient_bytes=102.4e6)
    (capped,) = predict(short, JUWELS_LIKE, [64], overlap=1.0)
    assert capped.exposed_comm_s == pytest.approx(comm - 0.002)
    with pytest.raises(ValueError, match="overlap"):
        predict(RESNET50, JUWELS_LIKE, [4], overlap=1.5)


def test_efficiency_falls_with_gpus_beyond_a_node():
    curve = predict(RESNET50, JUWELS_LIKE, [4, 8, 64, 1024])
    assert [p.gpus for p in curve] == [4, 8, 64, 1024]
    assert curve[0].efficiency == 1.0
    assert all(a.efficiency > b.efficiency for a, b in zip(curve, curve[1:]))


def test_calibration_recovers_the_parameters_that_made_the_shares():
    truth = Interconnect(gpus_per_node=4, latency_us=40.0, bandwidth_gbps_per_node=150.0, intra_node_gbps=50.0)
    gpus = [4, 8, 16, 64, 256]
    shares = [(p.gpus, p.comm_share) for p in predict(RESNET50, truth, gpus)]
    fitted = calibrate(shares, RESNET50, gpus_per_node=4)
    assert fitted.latency_us == pytest.approx(40.0, rel=1e-6)
    assert fitted.bandwidth_gbps_per_node == pytest.approx(150.0, rel=1e-6)
    assert fitted.intra_node_gbps == pytest.approx(50.0, rel=1e-6)


def test_published_table_is_complete():
    published = load_published()
    assert [r.gpus for r in published["dali"]] == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert [r.gpus for r in published["native"]] == [4, 8, 16, 32, 64, 128, 256, 512]
    assert published["dali"][0].comm_share == pytest.approx(15.40 / (15.40 + 22.00 + 32.50))


@pytest.mark.parametrize("loader", ["dali", "native"])
def test_calibrated_model_reproduces_the_published_comm_shares(loader):
    rows = load_published()[loader]
    network = calibrate([(r.gpus, r.comm_share) for r in rows], RESNET50, gpus_per_node=4)
    predicted = predict(RESNET50, network, [r.gpus for r in rows])
    errors = [100 * abs(p.comm_share - r.comm_share) for p, r in zip(predicted, rows)]
    assert max(errors) <= MAX_ERROR_PP[loader]


def _predict(*args: object):
    return RUNNER.invoke(app, ["predict", *(str(a) for a in args)])


@pytest.fixture
def site_file(tmp_path):
    path = tmp_path / "testsite.toml"
    path.write_text(
        'name = "testsite"\ndescription = "test"\nbased_on = ["nothing"]\nscheduler = "local"\n'
        'gpus_per_node = 4\ncores_per_node = 8\ngpu_vendor = "nvidia"\n'
        "[network]\nlatency_us = 5.0\nbandwidth_gbps_per_node = 800.0\n"
    )
    return path


def test_predict_prints_the_curve(site_file):
    result = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--data-ms", "50",
                      "--batch", "64", "--gpus", "4,8,1024", "--overlap", "0")
    assert result.exit_code == 0, result.output
    expected = predict(RESNET50, JUWELS_LIKE, [4, 8, 1024], overlap=0.0)
    for p in expected:
        assert "%.1f" % p.images_per_s in result.output
        assert "%.3f" % p.efficiency in result.output
    assert "102.4 MB" in result.output


def test_predict_takes_compute_time_and_batch_from_a_run(tmp_path, site_file):
    run = write_run(tmp_path, "profiled", 4, [100.0], batch=64,
                    profile=dict(step_s=0.3, compute_s=0.2, comm_s=0.05, data_s=0.05))
    result = _predict("--site", site_file, "--from-run", run.parent, "--gpus", "8")
    assert result.exit_code == 0, result.output
    (expected,) = predict(RESNET50, JUWELS_LIKE, [8])
    assert "%.1f" % expected.images_per_s in result.output


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4,x"], "--gpus"),
    (["--gpus", "0,4"], "--gpus"),
    (["--model", "vgg16"], "--model"),
    (["--compute-ms", "-1"], "--compute-ms"),
])
def test_predict_rejects_bad_flags_by_name(site_file, args, message):
    base = {"--model": "resnet50", "--compute-ms": "200", "--batch": "64", "--gpus": "4,8"}
    base.update(dict(zip(args[::2], args[1::2])))
    result = _predict("--site", site_file, *[x for kv in base.items() for x in kv])
    assert isinstance(result.exception, DlaunchError) and message in str(result.exception)


def test_predict_needs_a_site_with_network_and_a_profiled_run(tmp_path, site_file):
    site_file.write_text(site_file.read_text().split("[network]")[0])
    result = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "1", "--batch", "1")
    assert isinstance(result.exception, DlaunchError) and "no [network] section" in str(result.exception)
    run = write_run(tmp_path, "unprofiled", 4, [100.0])
    with pytest.raises(DlaunchError, match="no profile record"):
        workload_from_options(None, None, None, None, run)


def test_predict_calibrated_to_the_published_column(site_file):
    result = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--data-ms", "50",
                      "--batch", "64", "--gpus", "4,1024", "--calibrated", "dali")
    assert result.exit_code == 0, result.output
    published = {r.gpus: r for r in load_published()["dali"]}
    network = calibrate([(r.gpus, r.comm_share) for r in published.values()], RESNET50, gpus_per_node=4)
    for p in predict(RESNET50, network, [4, 1024]):
        assert "%.3f" % p.efficiency in result.output and "%.1f" % (100 * p.comm_share) in result.output
        assert abs(p.comm_share - published[p.gpus].comm_share) <= MAX_ERROR_PP["dali"] / 100
    bad = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "1", "--batch", "1", "--calibrated", "x")
    assert isinstance(bad.exception, DlaunchError) and "--calibrated" in str(bad.exception)


def test_predict_for_the_issue_command_uses_the_published_a100_throughput():
    """`dlaunch predict --site juwels --model resnet50 --gpus ...` needs no measurement on an A100 site."""
    result = _predict("--site", "juwels", "--model", "resnet50", "--gpus", "4,1024")
    assert result.exit_code == 0, result.output
    compute_ms = 1e3 * 64 / 2470.0  # NVIDIA's A100 AMP ResNet-50 figure, the paper's batch of 64
    assert "compute %.2f ms" % compute_ms in result.output and "published A100-40GB" in result.output
    (_, largest) = predict(Workload(compute_ms / 1e3, 64, gradient_bytes("resnet50")),
                                   Interconnect(4, 1.5, 800.0, 2400.0), [4, 1024])
    assert "%.3f" % largest.efficiency in result.output


def test_predict_without_a_published_figure_asks_for_a_measurement():
    result = _predict("--site", "lumi-g", "--model", "resnet50")  # AMD GPUs: no published figure built in
    assert isinstance(result.exception, DlaunchError) and "--compute-ms" in str(result.exception)
