"""Explaining efficiency on the analysis side (issue 36): stragglers and throttled GPUs named, runs with a
straggler out of the scaling figures unless included, the efficiency budget, the site's threshold.

Metrics files are fabricated with make_record (tests/test_analysis.py's write_run and v4_fields, which writes records
of the older phases method "rank-timers": their median is statistics.median, flags name it "the median of the ranks";
tests/test_stragglers_median_rank.py has the trainer's own records, whose median is the median rank). GPU health
comes from no real GPU here: the `gpu` entries below are what a fake NVML would report (named FAKE_*)."""
from pathlib import Path

import pytest

from dlaunch.analysis.budget import PARTS, budget
from dlaunch.analysis.scaling import group_runs, load_runs, run_from_metrics, scaling
from dlaunch.analysis.stragglers import STRAGGLER, THROTTLED, flagged, live_flags, run_flags, unflagged
from dlaunch.errors import DlaunchError
from dlaunch.thresholds import DEFAULT_THRESHOLD
from dlaunch.jobs.sites import load_site
from dlaunch.train.metrics_schema import VERSION, read_metrics
from test_analysis import write_run, v4_fields

# GPU health as a fake NVML would report it for one node (no GPU on this machine).
FAKE_POWER_CAPPED = {"sm_clock_mhz": 1095.0, "sm_clock_max_mhz": 1410.0, "local_rank": 1, "throttle": ["power cap"],
                     "temperature_c": 71.0}
FAKE_CAPPED_AT_FULL_CLOCK = dict(FAKE_POWER_CAPPED, sm_clock_mhz=1400.0)
FAKE_HOT_AT_FULL_CLOCK = dict(FAKE_POWER_CAPPED, sm_clock_mhz=1410.0, throttle=["thermal"], temperature_c=91.0)
FAKE_HEALTHY = {"sm_clock_mhz": 1410.0, "sm_clock_max_mhz": 1410.0, "local_rank": 0, "throttle": [], "temperature_c": 60.0}


def one_run(tmp_path: Path, per_epoch, name: str = "r", gpus: int = 4, **kwargs):
    """A run of len(per_epoch) epochs at 100 images/s whose epochs carry v4_fields(**per_epoch[i])."""
    path = write_run(tmp_path, name, gpus, [100.0] * len(per_epoch), epoch_fields=[v4_fields(**f) for f in per_epoch],
                     version=VERSION, **kwargs)
    (run,) = [r for r in load_runs([path]).runs]
    return run


def test_a_rank_computing_48_percent_slower_is_named_with_host_rank_and_local_rank(tmp_path):
    slow = dict(compute=[0.1, 0.1, 0.1, 0.148], ranks_per_node=2)
    run = one_run(tmp_path, [slow, slow])
    (flag,) = run_flags(run)
    assert (flag.kind, flag.host, flag.rank, flag.local_rank) == (STRAGGLER, "n1", 3, 1)
    assert flag.message == ("n1 rank 3 (local rank 1) computed 48 % slower than the median of the ranks: a straggler; "
                            "this run's E_G is understated")
    assert run.path in flagged([run])
    assert run_flags(run_from_metrics(read_metrics(run.path))) == [flag]  # from the parsed file as well


def test_equal_ranks_are_not_flagged_and_the_threshold_decides(tmp_path):
    near = dict(compute=[0.1, 0.1, 0.1, 0.108], ranks_per_node=2)
    run = one_run(tmp_path, [near, near])
    assert run_flags(run) == [] and flagged([run]) == {}
    assert [f.rank for f in run_flags(run, threshold=0.05)] == [3]
    with pytest.raises(ValueError, match="must be a fraction in"):
        run_flags(run, threshold=1.5)


def test_a_finished_run_is_judged_on_its_measured_epochs_a_live_one_on_its_last(tmp_path):
    equal, warm, late = dict(compute=[0.1, 0.1]), dict(compute=[0.1, 0.5]), dict(compute=[0.1, 0.14])
    # a slow first epoch (warm-up, left out of X) flags nothing; the last epoch's 40 % (vs the median of the ranks,
    # 0.12: 17 %) is diluted over the measured epochs (mean 0.1133 vs 0.1067: 6 %)
    run = one_run(tmp_path, [warm, equal, equal, late])
    assert run_flags(run) == []
    (flag,) = live_flags(run)
    assert (flag.host, flag.rank) == ("n1", 1) and "computed 17 % slower" in flag.message


def test_a_whole_slow_node_is_flagged_once_naming_its_slowest_rank(tmp_path):
    slow_node = dict(compute=[0.1, 0.1, 0.3, 0.31], ranks_per_node=2)  # the median of the ranks: 0.2
    (flag,) = run_flags(one_run(tmp_path, [slow_node]))
    assert (flag.host, flag.rank, flag.local_rank) == ("n1", 3, 1) and "computed 55 % slower" in flag.message


def test_throttled_gpus_from_a_fake_nvml(tmp_path):
    gpus = [FAKE_HEALTHY, FAKE_POWER_CAPPED, FAKE_CAPPED_AT_FULL_CLOCK, FAKE_HOT_AT_FULL_CLOCK]
    run = one_run(tmp_path, [dict(compute=[0.1] * 4, gpu=gpus)])
    flags = run_flags(run)
    assert [f.kind for f in flags] == [THROTTLED, THROTTLED]
    assert flags[0].message == "n1 GPU of local rank 1: SM clock 1095 of 1410 MHz (78 %), power cap: throttled"
    assert flags[1].message == "n3 GPU of local rank 1: SM clock 1410 of 1410 MHz (100 %), thermal: throttled"
    assert run.path in flagged([run])  # throttled, no rank slower: flagged


def test_gpu_health_is_averaged_over_the_measured_epochs(tmp_path):
    dip = dict(FAKE_HEALTHY, sm_clock_mhz=1200.0, throttle=["power cap"])  # one epoch 15 % below the maximum
    epochs = [dict(compute=[0.1], gpu=[FAKE_HEALTHY]), dict(compute=[0.1], gpu=[dip]), dict(compute=[0.1], gpu=[FAKE_HEALTHY])]
    run = one_run(tmp_path, epochs, gpus=1)
    (node,) = run.node_figures
    assert node.gpu.sm_clock_mhz == pytest.approx(1305.0) and node.gpu.throttle == ("power cap",)
    assert run_flags(run) == []  # 7 % below the maximum over the measured epochs
    assert [f.kind for f in run_flags(run, threshold=0.05)] == [THROTTLED]


def test_files_without_phases_have_no_flags(tmp_path):
    path = write_run(tmp_path, "v3", 2, [100.0, 100.0], version=3)
    (run,) = load_runs([path]).runs
    assert run_flags(run) == [] and live_flags(run_from_metrics(read_metrics(str(path)))) == []
    assert flagged([run]) == {}


def test_runs_with_a_straggler_stay_out_of_scaling_unless_included(tmp_path):
    equal, slow = v4_fields([0.1, 0.1]), v4_fields([0.1, 0.2])
    write_run(tmp_path, "g1", 1, [1.0, 100.0], version=VERSION)
    write_run(tmp_path, "g2-ok", 2, [1.0, 180.0], epoch_fields=[equal, equal], version=VERSION)
    write_run(tmp_path, "g2-slow", 2, [1.0, 60.0], epoch_fields=[slow, slow], version=VERSION)
    runs = load_runs([tmp_path]).runs
    judged = unflagged(runs, flagged(runs))  # at the default threshold
    (kept,) = group_runs(judged).values()
    assert sorted(Path(r.path).parent.name for r in kept) == ["g1", "g2-ok"]
    assert [(p.gpus, p.runs, p.images_per_s) for p in scaling(judged)] == [(1, 1, 100.0), (2, 1, 180.0)]
    (everything,) = group_runs(runs).values()  # included
    assert len(everything) == 3
    assert [(p.gpus, p.runs, p.images_per_s) for p in scaling(runs)] == [(1, 1, 100.0), (2, 2, 120.0)]
    # 0.2 vs the median of the ranks, 0.15: 33 %
    assert len(group_runs(unflagged(runs, flagged(runs, 0.5)))[everything[0].key]) == 3


def steps_rate(fields: dict, images: int) -> float:
    """images/s of the counted steps of an epoch whose ranks step as `fields`' median rank (10 steps)."""
    return images / (10 * fields["phases"]["median"]["step_s"])


def budget_runs(root: Path, include_reference_phases: bool = True) -> None:
    """Batch 8 per GPU, 10 steps per epoch. G = 2: compute 0.1 s, data 0.01, sync 0.02, epoch overhead
    0.136 s; G = 4: one rank 8 % slower (0.108, not a straggler), data 0.02, sync 0.03 + the wait,
    overhead 0.3 s."""
    ref = v4_fields([0.1, 0.1], overhead_s=0.136)
    big = v4_fields([0.1, 0.1, 0.1, 0.108], data_s=0.02, sync_s=0.03, overhead_s=0.3)
    if include_reference_phases:
        write_run(root, "g2", 2, [1.0, steps_rate(ref, 160)], epoch_fields=[ref, ref], version=VERSION)
    else:
        write_run(root, "g2", 2, [1.0, 160 / 1.36], version=3)
    write_run(root, "g4", 4, [1.0, steps_rate(big, 320)], epoch_fields=[big, big], version=VERSION)


def test_budget_from_ideal_to_the_measured_efficiency(tmp_path):
    budget_runs(tmp_path)
    runs = load_runs([tmp_path]).runs
    g2, g4 = budget(runs)
    # t(2) = 0.136 + 0.0136 per step; t(4) = 0.164 + 0.03 (the median rank: data 0.02, compute 0.1,
    # sync 0.03 + its 0.008 wait for the slowest, optimizer 0.005, other 0.001; overhead 0.3 s / 10 steps)
    assert (g2.step_s, g4.step_s) == pytest.approx((0.1496, 0.194))
    assert g4.measured_e_g == pytest.approx(0.1496 / 0.194) == scaling(runs)[1].efficiency
    assert list(g4.lost) == list(PARTS)
    assert g4.lost["communication"] == pytest.approx((0.03 - 0.02) / 0.194)
    assert g4.lost["stragglers"] == pytest.approx(0.008 / 0.194)
    assert g4.lost["data"] == pytest.approx(0.01 / 0.194)
    assert g4.lost["epoch overhead"] == pytest.approx((0.03 - 0.0136) / 0.194)
    assert g4.lost["compute"] == pytest.approx(0.0)  # the median rank computes 0.1 s at both counts
    assert g4.lost["other"] == pytest.approx(0.0, abs=1e-12)  # compute and optimizer did not change
    for row in (g2, g4):
        assert 1.0 - sum(row.lost.values()) == pytest.approx(row.measured_e_g, abs=1e-12)
    assert set(g2.lost.values()) == {0.0} and g2.measured_e_g == 1.0
    assert g4.per_step_s["stragglers"] == pytest.approx(0.028 - 0.02)  # the median rank's sync_s over the slowest's


def test_budget_says_not_recorded_where_the_runs_lack_phases(tmp_path):
    budget_runs(tmp_path, include_reference_phases=False)  # the reference run is a version 3 file
    g2, g4 = budget(load_runs([tmp_path]).runs)
    assert all(g4.lost[part] is None for part in list(PARTS)[:-1])
    assert g4.lost["other"] == pytest.approx(1.0 - g4.measured_e_g)  # all that is lost, unexplained
    assert g4.per_step_s["data"] == pytest.approx(0.02) and g2.per_step_s["data"] is None


def test_budget_leaves_out_runs_with_a_straggler_unless_included(tmp_path):
    budget_runs(tmp_path)
    slow = v4_fields([0.1, 0.1, 0.1, 0.3])
    write_run(tmp_path, "g4-slow", 4, [1.0, steps_rate(slow, 320)], epoch_fields=[slow, slow], version=VERSION)
    runs = load_runs([tmp_path]).runs
    assert budget(unflagged(runs, flagged(runs)))[1].measured_e_g == pytest.approx(0.1496 / 0.194)
    included = budget(runs)[1]
    assert included.measured_e_g < 0.1496 / 0.194 and included.per_step_s["stragglers"] > 0.008


def test_site_profile_straggler_threshold(tmp_path):
    assert load_site(Path("sites/local.toml")).straggler_threshold == 0.30  # local ranks share the cores
    text = Path("sites/local.toml").read_text().replace("straggler_threshold = 0.30\n", "")
    default, good, bad = tmp_path / "default.toml", tmp_path / "good.toml", tmp_path / "bad.toml"
    default.write_text(text)
    assert load_site(default).straggler_threshold == DEFAULT_THRESHOLD  # a profile without one
    good.write_text("straggler_threshold = 0.25\n" + text)  # a top-level key: before the profile's tables
    bad.write_text("straggler_threshold = 1.5\n" + text)
    assert load_site(good).straggler_threshold == 0.25
    with pytest.raises(DlaunchError, match="straggler_threshold"):
        load_site(bad)


def test_compute_that_grows_with_the_gpu_count_is_its_own_part(tmp_path):
    """Communication beside back-propagation slows it (the GPU's SMs, a CPU's cores are shared): the median rank's
    compute growing from 0.1 to 0.13 s per step is lost to `compute`, not left in `other`."""
    ref = v4_fields([0.1, 0.1], overhead_s=0.136)
    big = v4_fields([0.13, 0.13, 0.13, 0.13], overhead_s=0.136)
    write_run(tmp_path, "g2", 2, [1.0, steps_rate(ref, 160)], epoch_fields=[ref, ref], version=VERSION)
    write_run(tmp_path, "g4", 4, [1.0, steps_rate(big, 320)], epoch_fields=[big, big], version=VERSION)
    g2, g4 = budget(load_runs([tmp_path]).runs)
    assert g4.lost["compute"] == pytest.approx(0.03 / g4.step_s)
    assert g4.lost["other"] == pytest.approx(0.0, abs=1e-9)
