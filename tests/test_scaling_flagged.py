"""One rule for which runs leave the scaling figures: flagged runs (a straggler or a throttled GPU,
stragglers.flagged, left out by stragglers.unflagged), in scaling's groups and points and in a study's published comparison, as in `dlaunch report`.
GPU health comes from no real GPU here: FAKE_POWER_CAPPED is what a fake NVML would report."""
from dlaunch.analysis.published import throughput_ratios
from dlaunch.analysis.scaling import group_runs, load_runs, scaling
from dlaunch.analysis.stragglers import flagged, unflagged
from dlaunch.train.metrics_schema import VERSION
from test_analysis import v4_fields, write_run
from test_efficiency import FAKE_POWER_CAPPED


def _runs(root):
    """ddp and horovod at 2 GPUs; a ddp run whose GPUs are power-capped (no rank slower than another: no straggler)."""
    equal, capped = v4_fields([0.1, 0.1]), v4_fields([0.1, 0.1], gpu=[FAKE_POWER_CAPPED, FAKE_POWER_CAPPED])
    write_run(root, "ddp", 2, [1.0, 200.0], epoch_fields=[equal, equal], version=VERSION, experiment="ddp")
    write_run(root, "ddp-capped", 2, [1.0, 20.0], epoch_fields=[capped, capped], version=VERSION, experiment="ddp")
    hvd = write_run(root, "hvd", 2, [1.0, 100.0], epoch_fields=[equal, equal], version=VERSION, experiment="hvd")
    hvd.write_text(hvd.read_text().replace('"framework": "ddp"', '"framework": "horovod"'))
    return load_runs([str(root)]).runs


def test_a_throttled_gpu_leaves_a_run_out_of_groups_and_points_unless_included(tmp_path):
    runs = [r for r in _runs(tmp_path) if r.key.framework == "ddp"]
    judged = unflagged(runs, flagged(runs))
    (kept,) = group_runs(judged).values()
    assert [r.path.split("/")[-2] for r in kept] == ["ddp"]
    assert [(p.runs, p.images_per_s) for p in scaling(judged)] == [(1, 200.0)]
    assert [(p.runs, p.images_per_s) for p in scaling(runs)] == [(2, 110.0)]  # included


def test_a_throttled_gpu_leaves_a_run_out_of_a_published_comparison(tmp_path):
    runs = _runs(tmp_path)
    ((gpus, ratio),) = throughput_ratios(unflagged(runs, flagged(runs)), "ddp", "horovod", {})
    assert (gpus, ratio.median, ratio.n) == (2, 2.0, 2)  # the capped run's 20 images/s would make it 1.1
