"""dlaunch/analysis/scaling.py on hand-made metrics files: throughput, S_G, E_G, grouping, rejects, verdicts."""
import dataclasses
import json
from pathlib import Path
from statistics import median
from typing import Dict, List, Optional, Sequence

import pytest

from dlaunch.analysis.scaling import (Spread, find_metrics_files, group_runs, interval_rank, load_runs, scaling, status_figures,
                                      verdict)
from dlaunch.errors import DlaunchError
from dlaunch.jobs.sites import Reference
from dlaunch.train.metrics_schema import (VERSION, MetricsError, energy_total, make_record, read_metrics, unavailable,
                                          validate_record)

NO_GPU = unavailable("this run uses no GPU (device cpu)")


def write_run(root: Path, name: str, world_size: int, throughputs: Sequence[float], batch: int = 8,
              model: str = "resnet50", loader: str = "native", site: Optional[str] = "testsite",
              experiment: str = "scaling", top1: Optional[Sequence[float]] = None, schedule: str = "step",
              profile: Optional[dict] = None, gpus_per_node: int = 4, energy: Optional[Sequence[dict]] = None,
              end: Optional[dict] = None, version: int = 2, amp: str = "none", config: Optional[dict] = None,
              epoch_fields: Optional[Sequence[dict]] = None) -> Path:
    """A run directory `<root>/<experiment>/<name>/metrics.jsonl` built with make_record: `energy` per
    epoch (`energy_j`), `end` fields of the end record, `config` more trainer settings of the header,
    `version` 1 for a file of the first schema, `epoch_fields` more fields per epoch record (`v4_fields`)."""
    nodes = -(-world_size // gpus_per_node)
    records = [make_record(
        "header", 1000.0, run_id=name, argv=["python", "-m", "dlaunch.train"], config={"schedule": schedule, "amp": amp, **(config or {})},
        framework="ddp", loader=loader, model=model, device="cuda", world_size=world_size, nodes=nodes,
        hosts=["node%d" % (r // gpus_per_node) for r in range(world_size)], batch_per_worker=batch,
        global_batch=batch * world_size, lr_scaled=0.1, versions={"torch": "2.14.1"}, slurm_job_id=None,
        site=site, experiment=experiment, image=None, git_revision=None)]
    for epoch, x in enumerate(throughputs):  # 0 images/s: an epoch of warm-up steps only
        fields = dict(epoch=epoch, steps=10, images=10 * batch * world_size if x else 0, images_per_s=x,
                      epoch_time_s=10 * batch * world_size / (x or 1.0), data_wait_s=0.1, loss=1.0, lr=0.1)
        if top1 is not None:
            fields["top1"] = top1[epoch]
        if energy is not None:
            fields["energy_j"] = energy[epoch]
        if epoch_fields is not None:
            fields.update(epoch_fields[epoch])
        records.append(make_record("epoch", 1001.0 + epoch, **fields))
    if profile is not None:
        records.append(make_record("profile", 1100.0, steps=5, method="timers", **profile))
    records.append(make_record("end", 1200.0, **dict(dict(status="ok", total_time_s=200.0,
                                                          epochs_completed=len(throughputs)), **(end or {}))))
    for record in records:
        record["version"] = version
    path = root / experiment / name / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


OVERHEAD_SPLIT = {"loader_start_s": 0.25, "validation_s": 0.5, "checkpoint_s": 0.125, "barrier_s": 0.0625, "metrics_s": 0.0625}


def v4_fields(compute: Sequence[float], ranks_per_node: int = 1, data_s: float = 0.01, sync_s: float = 0.02,
              optimizer_s: float = 0.005, other_s: float = 0.001, overhead_s: Optional[float] = None,
              gpu: Optional[Sequence[object]] = None, measured_steps: int = 10, steps: int = 10) -> dict:
    """The version 4 fields of an epoch record for ranks computing `compute` s per step (rank r on host
    n<r // ranks_per_node>): each waits in sync_s for the slowest rank beyond `sync_s` of its own; `phases`
    (median per field, the slowest rank's vector), `nodes` (with `gpu` per node: GPU_HEALTH, default
    unavailable), `overhead` (`overhead_s` split as OVERHEAD_SPLIT) and `measured_steps`."""
    slowest = max(range(len(compute)), key=lambda r: compute[r])
    vectors: List[Dict[str, float]] = []
    for c in compute:
        v = {"data_s": data_s, "compute_s": c, "sync_s": sync_s + compute[slowest] - c, "optimizer_s": optimizer_s,
             "other_s": other_s}
        vectors.append(dict(v, step_s=sum(v.values()), forward_s=c / 3))  # forward: a third of the computation
    hosts = ["n%d" % (r // ranks_per_node) for r in range(len(compute))]
    fields: dict = {"measured_steps": measured_steps, "phases": {
        "method": "rank-timers", "steps": steps, "ranks": len(compute),
        "median": {k: median(v[k] for v in vectors) for k in vectors[0]},
        "slowest": dict(vectors[slowest], rank=slowest, host=hosts[slowest], local_rank=slowest % ranks_per_node)}}
    nodes = []
    for n, host in enumerate(dict.fromkeys(hosts)):
        mine = [r for r in range(len(compute)) if hosts[r] == host]
        worst = max(mine, key=lambda r: compute[r])
        nodes.append({"host": host, "ranks": len(mine), "median_compute_s": median(compute[r] for r in mine),
                      "median_forward_s": median(compute[r] / 3 for r in mine),
                      "slowest": {"rank": worst, "local_rank": worst % ranks_per_node, "compute_s": compute[worst],
                                  "forward_s": compute[worst] / 3},
                      "gpu": gpu[n] if gpu else NO_GPU})
    fields["nodes"] = nodes
    if overhead_s is not None:
        parts = {k: share * overhead_s for k, share in OVERHEAD_SPLIT.items()}
        fields["overhead"] = dict(parts, total_s=sum(parts.values()))
    return fields


def test_throughput_leaves_out_the_first_of_several_epochs(tmp_path):
    write_run(tmp_path, "three", 1, [50.0, 200.0, 300.0])
    write_run(tmp_path, "one", 2, [120.0])
    runs = {r.world_size: r for r in load_runs([tmp_path]).runs}
    assert runs[1].throughput == pytest.approx(250.0)
    assert runs[2].throughput == pytest.approx(120.0)


def test_epochs_without_measured_steps_do_not_count(tmp_path):
    write_run(tmp_path, "warm", 1, [0.0, 0.0, 80.0, 100.0, 120.0])  # two epochs of warm-up steps only
    (run,) = load_runs([tmp_path]).runs
    assert run.throughput == 110.0  # the first measured epoch left out, as for any run


def test_speedup_and_efficiency_against_the_smallest_gpu_count(tmp_path):
    # names sort the biggest run first: the reference must still be G = 2
    write_run(tmp_path, "a-g8", 8, [1.0, 640.0])
    write_run(tmp_path, "b-g4", 4, [1.0, 360.0])
    write_run(tmp_path, "c-g2", 2, [1.0, 200.0])
    write_run(tmp_path, "d-g2-repeat", 2, [1.0, 220.0])
    (runs,) = group_runs(load_runs([tmp_path]).runs).values()
    points = scaling(runs)
    assert [p.gpus for p in points] == [2, 4, 8]
    assert [p.runs for p in points] == [2, 1, 1]
    assert [p.images_per_s for p in points] == pytest.approx([210.0, 360.0, 640.0])
    assert [p.speedup for p in points] == pytest.approx([1.0, 360 / 210, 640 / 210])
    assert [p.efficiency for p in points] == pytest.approx([1.0, (360 / 210) / 2, (640 / 210) / 4])
    assert [p.nodes for p in points] == [1, 1, 2]


def test_batch_sizes_per_gpu_are_separate_groups_with_their_own_reference(tmp_path):
    write_run(tmp_path, "b8-g1", 1, [100.0], batch=8)
    write_run(tmp_path, "b8-g4", 4, [300.0], batch=8)
    write_run(tmp_path, "b32-g2", 2, [500.0], batch=32)
    write_run(tmp_path, "b32-g4", 4, [900.0], batch=32)
    groups = group_runs(load_runs([tmp_path]).runs)
    assert [k.batch_per_worker for k in groups] == [8, 32]
    by_batch = {k.batch_per_worker: scaling(v) for k, v in groups.items()}
    assert [(p.gpus, p.efficiency) for p in by_batch[8]] == [(1, 1.0), (4, pytest.approx(0.75))]
    assert [(p.gpus, p.efficiency) for p in by_batch[32]] == [(2, 1.0), (4, pytest.approx(0.9))]


def test_time_shares_from_profile_records(tmp_path):
    write_run(tmp_path, "g4", 4, [100.0], profile=dict(step_s=0.5, compute_s=0.3, comm_s=0.1, data_s=0.1))
    (point,) = scaling(load_runs([tmp_path]).runs)
    assert (point.shares.comm, point.shares.compute, point.shares.data) == pytest.approx((0.2, 0.6, 0.2))


def test_accuracy_is_the_best_epoch_top1(tmp_path):
    write_run(tmp_path, "acc", 1, [10.0, 10.0, 10.0], top1=[0.2, 0.5, 0.4], schedule="cosine")
    (run,) = load_runs([tmp_path]).runs
    assert run.best_top1 == 0.5
    assert run.schedule == "cosine"
    assert run.global_batch == 8


@pytest.mark.parametrize("content, expected", [
    ('{"schema": "dlaunch.metrics", "version": 1, "type": "header", "ti', "line 1"),  # truncated
    ('{"name": "somebody else\'s file"}\n', "not a dlaunch.metrics record"),  # foreign
    ("", "no header record"),  # empty
    ("not json at all\n", "line 1"),  # broken
])
def test_broken_foreign_or_truncated_files_are_rejected_by_name(tmp_path, content, expected):
    good = write_run(tmp_path, "good", 1, [100.0])
    bad = tmp_path / "scaling" / "bad" / "metrics.jsonl"
    bad.parent.mkdir()
    bad.write_text(content)
    loaded = load_runs([tmp_path])
    assert [r.path for r in loaded.runs] == [str(good)]
    (message,) = loaded.rejected
    assert str(bad) in message and expected in message


def test_a_bad_record_after_a_good_header_rejects_the_file(tmp_path):
    path = write_run(tmp_path, "cut", 1, [100.0, 100.0])
    path.write_text(path.read_text()[:-30])  # the end record cut mid-line
    loaded = load_runs([path])
    assert loaded.runs == [] and str(path) in loaded.rejected[0]


def test_paths_may_be_files_or_directories_and_missing_ones_are_named(tmp_path):
    a = write_run(tmp_path, "a", 1, [1.0])
    b = write_run(tmp_path / "deeper" / "still", "b", 2, [1.0])
    assert find_metrics_files([tmp_path, a]) == sorted([str(a), str(b)])
    with pytest.raises(DlaunchError, match="nowhere: no such file"):
        find_metrics_files([tmp_path / "nowhere"])


def test_reference_verdicts_use_the_tolerance_below_the_reference(tmp_path):
    write_run(tmp_path, "slow", 4, [1.0, 850.0])
    write_run(tmp_path, "ok", 4, [1.0, 950.0], loader="dali")
    write_run(tmp_path, "other-count", 8, [1.0, 10.0])
    refs = [Reference(model="resnet50", gpus=4, images_per_s=1000.0, tolerance=0.1)]
    runs = {r.key.loader + str(r.world_size): r for r in load_runs([tmp_path]).runs}
    assert not verdict(runs["native4"], refs).passed
    assert verdict(runs["native4"], refs).deviation == pytest.approx(-0.15)
    assert verdict(runs["dali4"], refs).passed
    assert verdict(runs["native8"], refs) is None


def test_a_reference_without_amp_judges_only_full_precision_runs(tmp_path):
    write_run(tmp_path, "tf32", 4, [1.0, 950.0])
    write_run(tmp_path, "fp16", 4, [1.0, 2500.0], loader="dali", amp="fp16")
    refs = [Reference(model="resnet50", gpus=4, images_per_s=1000.0, tolerance=0.1)]
    runs = {r.amp: r for r in load_runs([tmp_path]).runs}
    assert verdict(runs["none"], refs).passed
    assert verdict(runs["fp16"], refs) is None  # 2.5x faster in half precision is no pass of a TF32 figure


def test_spread_is_min_max_below_six_runs_and_a_95_percent_ci_of_the_median_from_six():
    assert Spread.of([5.0]) == Spread(5.0, 5.0, 5.0, 1, "min-max")
    assert Spread.of([3.0, 1.0, 2.0, 10.0, 4.0]) == Spread(3.0, 1.0, 10.0, 5, "min-max")
    # n = 6: P(all above or all below the median) = 2 / 64 = 3.1 %, so [x_(1), x_(6)] covers 96.9 %
    assert Spread.of([6.0, 1.0, 2.0, 3.0, 4.0, 5.0]) == Spread(3.5, 1.0, 6.0, 6, "95% CI")
    # n = 9: [x_(2), x_(8)] covers 1 - 2 (1 + 9) / 512 = 96.1 %; [x_(3), x_(7)] only 82 %
    assert Spread.of([float(v) for v in range(1, 10)]) == Spread(5.0, 2.0, 8.0, 9, "95% CI")
    # n = 20: [x_(6), x_(15)] covers 95.9 %; [x_(7), x_(14)] 88.5 %
    spread = Spread.of([float(v) for v in range(1, 21)])
    assert (spread.low, spread.high, spread.median) == (6.0, 15.0, 10.5)


def test_repeats_give_the_median_and_spread_of_each_figure_per_gpu_count(tmp_path):
    for i, x in enumerate([100.0, 90.0, 130.0]):
        write_run(tmp_path, "g1-r%d" % (i + 1), 1, [1.0, x], energy=[{"gpu": 1.0}, {"gpu": 80.0 * (i + 1)}])
    for i, x in enumerate([360.0, 300.0]):
        write_run(tmp_path, "g4-r%d" % (i + 1), 4, [1.0, x])
    g1, g4 = scaling(load_runs([tmp_path]).runs)
    assert (g1.runs, g1.images_per_s, g1.throughput.kind) == (3, 100.0, "min-max")
    assert (g1.throughput.low, g1.throughput.high) == (90.0, 130.0)
    assert (g1.speedups.low, g1.speedup, g1.speedups.high) == pytest.approx((0.9, 1.0, 1.3))  # each X over the median X_ref
    assert g4.images_per_s == 330.0  # the median of two is their mean
    assert (g4.efficiencies.low, g4.efficiency, g4.efficiencies.high) == pytest.approx((300 / 400, 330 / 400, 360 / 400))
    # J/img of the measured epoch: 80, 160, 240 J over 10 steps x 8 images
    assert (g1.energy.low, g1.joules_per_image, g1.energy.high) == pytest.approx((1.0, 2.0, 3.0))
    assert g4.energy is None and g4.joules_per_image is None


def test_a_version_1_file_is_read_without_energy_figures(tmp_path):
    path = write_run(tmp_path, "old", 4, [100.0, 400.0], version=1)
    assert '"version": 1' in path.read_text()
    (run,) = load_runs([tmp_path]).runs
    assert run.throughput == 400.0
    assert (run.joules_per_image, run.energy_per_epoch, run.energy_j) == (None, None, None)
    figures = status_figures(read_metrics(str(path)))
    assert (figures.joules_per_image, figures.energy_to_accuracy_j, figures.diverged) == (None, None, False)


def test_unknown_versions_and_zero_standing_for_unmeasured_are_refused():
    record = make_record("epoch", 1.0, epoch=0, steps=1, images=1, images_per_s=1.0, epoch_time_s=1.0,
                         data_wait_s=0.0, loss=1.0, lr=0.1, energy_j={"gpu": 5.0, "cpu": NO_GPU})
    with pytest.raises(MetricsError, match="unsupported schema version %d" % (VERSION + 1)):
        validate_record(dict(record, version=VERSION + 1))
    for bad in ({"gpu": "n/a"}, {"gpu": None}, {"disk": 1.0}, {"gpu": True}):
        with pytest.raises(MetricsError, match="field 'energy_j' is"):
            validate_record(dict(record, energy_j=bad))
    with pytest.raises(MetricsError, match="field 'gpu_utilization_pct' is ''"):
        validate_record(dict(record, gpu_utilization_pct=""))


def test_energy_total_prefers_the_node_counter_and_never_counts_unavailable_as_zero():
    assert energy_total({"gpu": 100.0, "cpu": 20.0, "dram": NO_GPU, "node": 500.0}) == (500.0, "node")
    assert energy_total({"gpu": 100.0, "cpu": 20.0, "dram": NO_GPU, "node": NO_GPU}) == (120.0, "gpu+cpu")
    assert energy_total({"gpu": NO_GPU, "cpu": NO_GPU}) is None
    assert energy_total(None) is None


def test_joules_per_image_over_the_measured_epochs(tmp_path):
    # batch 8 x 2 GPUs x 10 steps = 160 images per epoch; the first epoch is left out like for X
    energy = [{"gpu": 9999.0, "cpu": NO_GPU}, {"gpu": 320.0, "cpu": NO_GPU}, {"gpu": 480.0, "cpu": NO_GPU}]
    write_run(tmp_path, "e", 2, [50.0, 100.0, 100.0], energy=energy,
              end=dict(energy_j={"gpu": 10799.0, "cpu": NO_GPU}, time_to_accuracy_s=12.5, energy_to_accuracy_j=7000.0,
                       target_accuracy=0.5))
    (run,) = load_runs([tmp_path]).runs
    assert run.joules_per_image == pytest.approx((320 + 480) / 320)
    assert run.energy_per_epoch == pytest.approx(400.0)
    assert (run.energy_j, run.energy_domains) == (10799.0, "gpu")
    (point,) = scaling([run])
    assert point.joules_per_image == pytest.approx(2.5)
    figures = status_figures(read_metrics(run.path))
    assert (figures.time_to_accuracy_s, figures.energy_to_accuracy_j) == (12.5, 7000.0)
    assert figures.joules_per_image == pytest.approx(2.5) and figures.energy_domains == "gpu"


def test_runs_without_energy_give_no_energy_figure_in_a_point(tmp_path):
    write_run(tmp_path, "measured", 2, [100.0], energy=[{"gpu": 160.0}])
    write_run(tmp_path, "unmeasured", 2, [120.0], energy=[{"gpu": NO_GPU}])
    (point,) = scaling(load_runs([tmp_path]).runs)
    assert point.runs == 2 and point.images_per_s == 110.0
    assert point.joules_per_image == 1.0  # the unmeasured run is not a zero in the mean


def test_diverged_runs_enter_no_scaling_point(tmp_path):
    write_run(tmp_path, "good", 2, [100.0])
    write_run(tmp_path, "nan", 2, [5000.0], end=dict(status="diverged", reason="the loss was not finite"))
    loaded = load_runs([tmp_path]).runs
    assert [r.diverged for r in loaded] == [False, True]
    (point,) = scaling(loaded)
    assert (point.runs, point.images_per_s) == (1, 100.0)
    assert status_figures(read_metrics(loaded[1].path)).diverged


def test_throughput_includes_each_epochs_overhead_and_keeps_the_steps_only_rate(tmp_path):
    # batch 8 x 2 GPUs, 10 steps of which 10 counted: 160 images in 1.6 s of steps (100 images/s);
    # 0.4 s of overhead in the epoch: X = 160 / (1.6 + 0.4) = 80 images/s
    fields = [v4_fields([0.1, 0.1], overhead_s=9.0), v4_fields([0.1, 0.1], overhead_s=0.4), v4_fields([0.1, 0.1], overhead_s=0.4)]
    write_run(tmp_path, "v4", 2, [50.0, 100.0, 100.0], epoch_fields=fields, version=VERSION)
    write_run(tmp_path, "v3", 2, [50.0, 100.0, 100.0], version=3)
    runs = {r.key.experiment + Path(r.path).parent.name: r for r in load_runs([tmp_path]).runs}
    new, old = runs["scalingv4"], runs["scalingv3"]
    assert new.throughput == pytest.approx(80.0) and new.steps_images_per_s == pytest.approx(100.0)
    assert new.overhead_included and new.epoch_overhead_s == pytest.approx(0.4)  # the first epoch's 9 s left out
    assert new.overhead.validation_s == pytest.approx(0.2) and new.overhead_per_step_s == pytest.approx(0.04)
    assert (old.throughput, old.steps_images_per_s, old.overhead_included, old.epoch_overhead_s) == (100.0, 100.0, False, None)
    (point,) = scaling([new])
    assert point.images_per_s == pytest.approx(80.0)


def test_overhead_is_shared_by_the_counted_steps_only(tmp_path):
    # 10 steps, 5 of them counted (the others warm-up): 80 images in 0.8 s; half of 0.4 s overhead is theirs
    fields = [v4_fields([0.1, 0.1], overhead_s=0.4, measured_steps=5)]
    path = write_run(tmp_path, "half", 2, [100.0], epoch_fields=fields, version=VERSION)
    path.write_text(path.read_text().replace('"images": 160', '"images": 80'))
    (run,) = load_runs([tmp_path]).runs
    assert run.throughput == pytest.approx(80 / (0.8 + 0.2))


def test_phases_and_nodes_are_the_mean_over_the_measured_epochs(tmp_path):
    fields = [v4_fields([5.0, 5.0]), v4_fields([0.1, 0.2]), v4_fields([0.1, 0.3])]
    write_run(tmp_path, "p", 2, [10.0, 100.0, 100.0], epoch_fields=fields, version=VERSION)
    (run,) = load_runs([tmp_path]).runs
    assert run.phases.slowest.compute_s == pytest.approx(0.25)  # epochs 1 and 2; epoch 0 (warm-up) left out
    assert run.phases.median.compute_s == pytest.approx((0.15 + 0.2) / 2)
    assert run.phases.slowest_rank.host == "n1" and run.phases.wait_s == pytest.approx(0.25 - 0.175)
    assert [(n.host, n.slowest_compute_s) for n in run.node_figures] == [("n0", pytest.approx(0.1)), ("n1", pytest.approx(0.25))]
    assert run.node_figures[0].gpu.unavailable.startswith("unavailable: ")


def test_a_runs_figures_are_computed_once_and_it_stays_a_frozen_value(tmp_path):
    fields = [v4_fields([5.0, 5.0]), v4_fields([0.1, 0.2]), v4_fields([0.1, 0.3])]
    write_run(tmp_path, "p", 2, [10.0, 100.0, 100.0], epoch_fields=fields, version=VERSION)
    (run,) = load_runs([tmp_path]).runs
    (again,) = load_runs([tmp_path]).runs
    assert run.phases is run.phases and run.node_figures is run.node_figures and run.overhead is run.overhead
    assert run == again and run.throughput == again.throughput
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = "failed"  # type: ignore[misc]


def test_a_version_3_file_has_no_phases_nodes_or_overhead(tmp_path):
    write_run(tmp_path, "old", 2, [10.0, 100.0], version=3)
    (run,) = load_runs([tmp_path]).runs
    assert (run.phases, run.node_figures, run.overhead, run.overhead_per_step_s) == (None, None, None, None)


def exact_interval_rank(n: int) -> int:
    """The largest k whose [x_(k), x_(n+1-k)] covers the median with probability >= 95 %, in exact integers:
    1 - 2 P(B <= k - 1) >= 19 / 20, i.e. 40 sum_{i < k} C(n, i) <= 2^n."""
    k, below, term = 0, 0, 1  # term = C(n, k)
    while 40 * (below + term) <= 2 ** n:
        below += term
        term = term * (n - k) // (k + 1)
        k += 1
    return k


def test_confidence_interval_in_floating_point_picks_the_exact_order_statistics():
    assert [exact_interval_rank(n) for n in (5, 6, 9, 20)] == [0, 1, 2, 6]  # the cases worked out above
    assert all(interval_rank(n) == exact_interval_rank(n) for n in range(6, 2001))
