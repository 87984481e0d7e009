"""Issue 36 review: one straggler measure (the forward pass's excess over the median rank, a real rank: the median_low
of the forward passes), used by the flag and predict (the budget takes the median rank's measured wait); older
records ("rank-timers": statistics.median) read as recorded with their measure named; a node's GPU health keeps each
GPU's reasons with it; a throttle flag names the rank. Epoch records come from the trainer's own summary
(dlaunch/train/phases.py's phase_fields) of rows made here; GPU health vectors from the named fake NVML
(tests/fake_nvml.py: no GPU here)."""
from statistics import median

import pytest
import torch

from fake_nvml import FakeNvml
from dlaunch.analysis.budget import budget
from dlaunch.analysis.perfmodel.prediction import slowest_forward_excess
from dlaunch.analysis.scaling import load_runs
from dlaunch.analysis.stragglers import STRAGGLER, THROTTLED, flagged, forward_excess, run_flags, unflagged
from dlaunch.train.gpuhealth import GpuHealth, node_health
from dlaunch.train.metrics_schema import STEP_PHASES, VERSION
from dlaunch.train.phases import PHASES_METHOD, overhead_fields, phase_fields, rank_row
from test_analysis import write_run

NO_GPU_HEALTH = [1.0, 0.0, 0.0, 0.0, 0.0]  # gpuhealth.NO_GPU's vector
OVERHEAD = {"loader_start_s": 0.5, "validation_s": 0.0, "checkpoint_s": 0.0, "barrier_s": 0.25, "metrics_s": 0.125}
FLAG_TAIL = ": a straggler; this run's E_G is understated"


def rank(forward_s, local_rank=0, health=NO_GPU_HEALTH, sync_s=0.02):
    """A rank's row of the epoch's gather: 10 steps, backward twice its forward, data 0.01, `sync_s`, optimizer
    0.005, other 0.001 s per step."""
    compute = 3 * forward_s
    step = 0.01 + compute + sync_s + 0.005 + 0.001
    return rank_row([10.0, 0.01, forward_s, compute, sync_s, 0.005, 0.001, step], local_rank, OVERHEAD, health)


def epoch_fields(rows, hosts):
    """The version 4 fields of an epoch record as the trainer writes them from these ranks' rows."""
    return dict(phase_fields(rows, hosts), measured_steps=10, overhead=overhead_fields(rows[0], 0.0))


def run_of(tmp_path, name, fields, gpus):
    path = write_run(tmp_path, name, gpus, [100.0, 100.0], epoch_fields=[fields, fields], version=VERSION)
    (run,) = [r for r in load_runs([tmp_path]).runs if r.path == str(path)]
    return run


def fake_gpu(clock, reasons, temperature):
    """An epoch's GPU health vector of one GPU read through the fake NVML."""
    nvml = FakeNvml(sm_clock_mhz=clock, max_sm_clock_mhz=1410, reasons=reasons, temperature_c=temperature)
    return GpuHealth.for_device(torch.device("cuda", 0), nvml=nvml).end_epoch()


def test_the_median_rank_is_a_real_rank_the_faster_of_two():
    fields = phase_fields([rank(0.1), rank(0.153)], ["n0", "n1"])
    assert fields["phases"]["method"] == PHASES_METHOD == "rank-timers-median-rank"
    assert fields["phases"]["median"]["forward_s"] == 0.1  # not the mean of the two, 0.1265
    four = phase_fields([rank(0.10, 0), rank(0.12, 1), rank(0.30, 0), rank(0.11, 1)], ["n1", "n1", "n2", "n2"])
    assert four["phases"]["median"]["forward_s"] == 0.11  # rank 3's, not (0.11 + 0.12) / 2
    assert [n["median_forward_s"] for n in four["nodes"]] == [0.10, 0.11]
    # one rank's phases, not a figure per field: the faster rank waits for the slower in sync_s
    waits = phase_fields([rank(0.1, sync_s=0.12), rank(0.2, sync_s=0.02)], ["n0", "n1"])["phases"]["median"]
    assert waits == dict(zip(STEP_PHASES, rank(0.1, sync_s=0.12)))


def test_flag_and_predict_give_the_same_true_excess_over_the_faster_rank_the_budget_its_wait(tmp_path):
    late = 0.1  # the faster rank's wait in sync_s for the slower (measured; their computations differ 0.159 s)
    run = run_of(tmp_path, "two", epoch_fields([rank(0.1, sync_s=0.02 + late), rank(0.153)], ["n0", "n1"]), 2)
    (flag,) = run_flags(run)
    assert (flag.kind, flag.host, flag.rank) == (STRAGGLER, "n1", 1)
    assert flag.message == "n1 rank 1 (local rank 0) computed 53 % slower than the median rank" + FLAG_TAIL
    assert forward_excess(run.phases) == pytest.approx(0.53)
    assert slowest_forward_excess([run]) == {2: pytest.approx(0.53)}  # predict's column
    assert run.phases.wait_s == pytest.approx(late)  # the budget's stragglers: the median rank's wait, measured
    assert [f.rank for f in run_flags(run, threshold=0.6)] == []


def test_an_older_record_is_read_as_recorded_and_names_the_median_of_the_ranks(tmp_path):
    fields = epoch_fields([rank(0.1), rank(0.153)], ["n0", "n1"])
    rows = [dict(zip(STEP_PHASES, rank(f))) for f in (0.1, 0.153)]
    old_median = {p: median(r[p] for r in rows) for p in STEP_PHASES}  # statistics.median: the mean of the two
    fields["phases"] = dict(fields["phases"], method="rank-timers", median=old_median)
    run = run_of(tmp_path, "old", fields, 2)
    (flag,) = run_flags(run)
    assert flag.message == "n1 rank 1 (local rank 0) computed 21 % slower than the median of the ranks" + FLAG_TAIL
    assert forward_excess(run.phases) == pytest.approx(0.153 / 0.1265 - 1)


def test_a_node_keeps_each_gpus_reasons_with_it():
    fast, capped, hot = fake_gpu(1400, 0, 60), fake_gpu(1095, 0x4, 81), fake_gpu(1300, 0x20, 88)
    assert node_health([(0, fast), (1, capped), (2, hot)]) == {
        "sm_clock_mhz": 1095.0, "sm_clock_max_mhz": 1410.0, "local_rank": 1, "throttle": ["power cap"],
        "temperature_c": 81.0}
    slow_unthrottled = fake_gpu(1000, 0, 60)  # a lower clock without a reason (a lighter load)
    assert node_health([(0, slow_unthrottled), (1, hot)]) == {
        "sm_clock_mhz": 1300.0, "sm_clock_max_mhz": 1410.0, "local_rank": 1, "throttle": ["thermal"],
        "temperature_c": 88.0}
    assert node_health([(0, fast), (1, slow_unthrottled)])["local_rank"] == 1  # no reasons: the lowest clock


def test_a_throttled_gpu_is_named_with_its_rank_and_flags_the_run(tmp_path):
    rows = [rank(0.1, health=fake_gpu(1400, 0, 60)), rank(0.1, health=fake_gpu(1095, 0x4, 81))]
    run = run_of(tmp_path, "capped", epoch_fields(rows, ["n0", "n1"]), 2)
    (flag,) = run_flags(run)
    assert (flag.kind, flag.host, flag.rank, flag.local_rank) == (THROTTLED, "n1", 1, 0)
    assert flag.message == "n1 GPU of rank 1 (local rank 0): SM clock 1095 of 1410 MHz (78 %), power cap: throttled"
    assert run.path in flagged([run], 0.1)
    equal = run_of(tmp_path, "equal", epoch_fields([rank(0.1), rank(0.1)], ["n0", "n1"]), 2)
    assert flagged([equal], 0.1) == {}


def test_the_budget_leaves_out_a_throttled_run_unless_included(tmp_path):
    healthy = fake_gpu(1400, 0, 60)
    ok_rows = [rank(0.1, health=healthy), rank(0.1, health=healthy)]
    capped_rows = [rank(0.1, health=healthy), rank(0.1, health=fake_gpu(1095, 0x4, 81))]
    write_run(tmp_path, "g1", 1, [100.0, 100.0], version=VERSION)
    write_run(tmp_path, "g2", 2, [100.0, 180.0], epoch_fields=[epoch_fields(ok_rows, ["n0", "n1"])] * 2,
              version=VERSION)
    capped = epoch_fields(capped_rows, ["n0", "n1"])
    capped["measured_steps"] = 5  # fewer steps counted: a lower images/s
    write_run(tmp_path, "g2-capped", 2, [100.0, 90.0], epoch_fields=[capped] * 2, version=VERSION)
    runs = load_runs([tmp_path]).runs
    healthy_only = [r for r in runs if not r.path.endswith("g2-capped/metrics.jsonl")]
    assert len(healthy_only) == 2
    assert budget(unflagged(runs, flagged(runs))) == budget(healthy_only)
    assert budget(runs)[1].measured_e_g != budget(healthy_only)[1].measured_e_g  # included


def test_a_runs_gpu_health_over_epochs_is_one_gpus():
    """Each epoch names one GPU per node; the run's mean must not join one GPU's clock to another's reasons."""
    from dlaunch.analysis.phases import GpuHealth, _mean_health

    calm = GpuHealth(sm_clock_mhz=1400.0, sm_clock_max_mhz=1410.0, local_rank=0, throttle=(), temperature_c=60.0)
    hot = GpuHealth(sm_clock_mhz=900.0, sm_clock_max_mhz=1410.0, local_rank=1, throttle=("thermal",), temperature_c=90.0)
    mean = _mean_health([calm, hot, calm])
    assert (mean.local_rank, mean.throttle, mean.sm_clock_mhz, mean.temperature_c) == (0, (), 1400.0, 60.0)
