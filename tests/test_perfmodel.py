"""dlaunch/analysis/perfmodel/: NCCL cost model, buckets, stragglers, fits against Aach et al. 2023 and the user's runs,
`dlaunch predict`."""
import math
import subprocess
import sys
from dataclasses import replace
from statistics import mean

import pytest
from typer.testing import CliRunner

from dlaunch.cli import app
from dlaunch.errors import DlaunchError
from dlaunch.analysis.perfmodel.fit import calibration_runs, fit_machine, fit_runs, leave_one_out
from dlaunch.analysis.perfmodel.model import (IMAGENET_VAL_IMAGES, NATIVE_WORKER_IMAGES_PER_S, NATIVE_WORKERS, Workload,
                                              gradient_bytes, loader_spread, messages, predict,
                                              step_times, steps_per_epoch)
from dlaunch.analysis.perfmodel.nccl import Machine, harmonic, straggler_factor
from dlaunch.analysis.perfmodel.overhead import (OVERHEAD_SHARE_LIMIT, FixedOverhead, PaperOverhead, checkpoint_bytes,
                                                 overhead_passes)
from dlaunch.analysis.perfmodel.paper import (AACH2023_MACHINE, AACH2023_STATEMENTS, CALIBRATION_MAX_GPUS, STATEMENT_TOLERANCE,
                                              PublishedFit, calibrated_workload, fit_published, io_kernel_s, load_published,
                                              load_statements, paper_overhead, paper_workload, published_workload,
                                              storage_floor)
from dlaunch.analysis.perfmodel.prediction import workload_from_options
from dlaunch.train.metrics_schema import VERSION
from test_analysis import v4_fields, write_run

# Extrapolated from Table 2a's 4-64 GPUs to 128-1024: the errors recorded in benchmarks/README.md
# (comm share, percentage points, rounded up): NCCL's share of all kernel time as published, and
# renormalised to NCCL + cuDNN + I/O kernels (the v2 yardstick). DALI meets the issue's goal (mean 5,
# max 10) on both; the native loader does not at 128 GPUs (its storage knee, see the README).
EXTRAPOLATION_BOUNDS_PP = {"dali": (1.5, 2.0), "native": (5.5, 11.5)}
GOAL_PP = (5.0, 10.0)

JUWELS_LIKE = Machine(gpus_per_node=4, latency_us=5.0, bandwidth_gbps_per_node=800.0, intra_node_gbps=2400.0)
RUNNER = CliRunner(env={"COLUMNS": "320"})  # wide enough for every column, whole numbers
RESNET50 = Workload(compute_s=0.2, batch=64, gradient_bytes=102.4e6, data_s=0.05)


def test_gradient_bytes_from_the_parameter_table():
    assert gradient_bytes("resnet50") == pytest.approx(4 * 25.6e6)
    assert gradient_bytes("resnet44") == pytest.approx(4 * 0.66e6)
    with pytest.raises(ValueError, match="resnet9000"):
        gradient_bytes("resnet9000")


def test_ring_allreduce_counts_intra_and_inter_node_steps_after_nccl():
    # 8 GPUs on 2 nodes: 14 ring steps, 2 of them across nodes (x1.9 plateau); the node's 100 GB/s carry 14/8 of the bytes
    latency_us = (8.4 + 12 * 3.4 + 2 * (9.6 + 5.0)) * 1.9
    assert JUWELS_LIKE.ring_allreduce_s(8, 102.4e6) == pytest.approx(latency_us * 1e-6 + 14 / 8 * 102.4e6 / 100e9)
    # 4 GPUs in one node: NVLink, 300 GB/s, no plateau
    assert JUWELS_LIKE.ring_allreduce_s(4, 102.4e6) == pytest.approx((8.4 + 6 * 3.4) * 1e-6 + 6 / 4 * 102.4e6 / 300e9)
    assert JUWELS_LIKE.allreduce(1, 102.4e6) == (0.0, "-")


def test_tree_latency_grows_with_log2_of_the_nodes_and_nccl_picks_the_cheaper():
    small = 64e3  # latency-bound
    tree = [JUWELS_LIKE.tree_allreduce_s(4 * n, small) for n in (4, 16, 256)]
    assert tree[1] - tree[0] == pytest.approx(tree[2] - tree[1] - 2 * 2 * (50.0 + 5.0) * 1e-6)  # 2 vs 4 more levels
    ring = [JUWELS_LIKE.ring_allreduce_s(4 * n, small) for n in (4, 256)]
    assert ring[1] / ring[0] > 30  # linear in the GPU count
    assert JUWELS_LIKE.allreduce(1024, small) == (tree[2], "tree")
    assert JUWELS_LIKE.allreduce(8, 102.4e6)[1] == "ring"  # bandwidth-bound on 2 nodes: the ring's 2(p-1)/p wins


def test_reduce_scatter_and_all_gather_move_half_an_all_reduce():
    ring = JUWELS_LIKE.ring_allreduce_s(64, 1e9)
    half = JUWELS_LIKE.ring_half_s(64, 1e9)
    assert 2 * half == pytest.approx(ring, rel=0.05)


def test_framework_messages():
    ddp = messages(RESNET50)
    assert ddp[0].nbytes == 1024 ** 2 and all(m.nbytes <= 25 * 1024 ** 2 for m in ddp)
    assert sum(m.nbytes for m in ddp) == pytest.approx(102.4e6) and ddp[-1].ready == pytest.approx(1.0)
    assert [m.ready for m in ddp] == sorted(m.ready for m in ddp) and ddp[0].ready < 0.05
    horovod = messages(replace(RESNET50, framework="horovod", fusion_mb=32.0))
    assert len(horovod) == 4 and horovod[0].nbytes == 32 * 1024 ** 2
    zero0 = messages(replace(RESNET50, framework="deepspeed"))
    assert [(m.collective, m.ready) for m in zero0] == [("allreduce", 1.0)]
    zero2 = messages(replace(RESNET50, framework="deepspeed", zero_stage=2))
    assert [m.collective for m in zero2] == ["reduce_scatter", "all_gather"]
    with pytest.raises(ValueError, match="ZeRO stage 3"):
        messages(replace(RESNET50, framework="deepspeed", zero_stage=3))


def test_step_time_throughput_and_efficiency():
    one, eight = predict(RESNET50, JUWELS_LIKE, [8, 1])
    assert (one.gpus, one.comm_s, one.step_s, one.efficiency, one.kernel_comm_s) == (1, 0.0, pytest.approx(0.25), 1.0, 0.0)
    assert eight.step_s == pytest.approx(0.25 + eight.exposed_comm_s)
    assert eight.images_per_s == pytest.approx(8 * 64 / eight.step_s)
    assert eight.efficiency == pytest.approx(0.25 / eight.step_s)
    assert eight.comm_share == pytest.approx(eight.kernel_comm_s / (eight.kernel_comm_s + 0.2))  # of kernel time: no data wait
    assert eight.nodes == 2


def test_buckets_overlap_back_propagation_and_only_the_rest_is_exposed():
    keeps_up = replace(RESNET50, data_s=0.0)  # no loader waits
    (long,) = predict(keeps_up, JUWELS_LIKE, [64])
    last = JUWELS_LIKE.allreduce_s(64, messages(keeps_up)[-1].nbytes)
    assert long.exposed_comm_s == pytest.approx(last)  # the earlier buckets finish during back-propagation
    short = replace(keeps_up, compute_s=0.0003)
    (capped,) = predict(short, JUWELS_LIKE, [64])
    assert capped.exposed_comm_s == pytest.approx(capped.comm_s - 0.0002, rel=1e-3)  # nearly all of it waits
    zero0 = replace(keeps_up, framework="deepspeed")
    (after,) = predict(zero0, JUWELS_LIKE, [64])
    assert after.exposed_comm_s == pytest.approx(after.comm_s)  # ZeRO-0 all-reduces after back-propagation


def test_every_kernel_waits_for_the_slowest_peer_but_the_step_only_at_the_last_message():
    workload = replace(RESNET50, data_s=0.005)
    machine = replace(JUWELS_LIKE, noise_s=1e-6, beside_compute=0.2)
    (p,) = predict(workload, machine, [64])
    spread = straggler_factor(64)
    assert loader_spread(64, 64) == pytest.approx(spread / 8)  # a batch of 64 samples read one after another

    def lag(t):  # the noise accumulated until t, the loader's straggling
        return math.sqrt(1e-6 * t) * spread + 0.005 * spread / 8

    assert p.wait_s == pytest.approx(lag(0.205))
    (bare,) = predict(replace(workload, data_s=0.0), JUWELS_LIKE, [64])
    assert p.step_s == pytest.approx(0.205 + bare.exposed_comm_s + lag(0.205))  # only the last wait is exposed
    # the buckets are ready during back-propagation (after 0.005 s data + 1/3 x 0.2 s forward); each
    # kernel waits lag(ready) for its peers (here less than the time to the next bucket)
    ready = [0.005 + 0.2 / 3 + m.ready * 0.2 * 2 / 3 for m in messages(workload)]
    assert all(lag(t) < after - t for t, after in zip(ready, ready[1:]))
    hidden = sum(lag(t) for t in ready[:-1])
    assert p.hidden_wait_s == pytest.approx(hidden) and hidden > 2 * p.wait_s
    overlapped = 0.2 * 2 / 3 * (1 - messages(workload)[0].ready)
    assert p.kernel_comm_s == pytest.approx(p.comm_s + hidden + p.wait_s + 0.2 * overlapped)


def test_a_wait_ends_when_the_next_bucket_is_ready_on_one_nccl_stream():
    late = replace(JUWELS_LIKE, noise_s=1.0)  # the slowest rank seconds late: every wait fills the gap to the next bucket
    (p,) = predict(replace(RESNET50, data_s=0.0), late, [64])
    msgs = messages(RESNET50)
    gaps = (msgs[-1].ready - msgs[0].ready) * 0.2 * 2 / 3
    assert p.hidden_wait_s == pytest.approx(gaps)
    # DeepSpeed ZeRO-0 all-reduces once after back-propagation: no hidden waits, nothing beside compute
    (after,) = predict(replace(RESNET50, framework="deepspeed"), replace(late, beside_compute=0.5), [64])
    assert after.hidden_wait_s == 0.0 and after.kernel_comm_s == pytest.approx(after.comm_s + after.wait_s)


def test_straggler_waits_add_up_over_the_rounds_of_the_collective():
    # rounds of 2, 4 and 6 ranks for 6 GPUs; each waits for the slowest of its ranks
    assert straggler_factor(2) == pytest.approx(0.5)
    assert straggler_factor(6) == pytest.approx(harmonic(2) + harmonic(4) + harmonic(6) - 3)
    # more than logarithmic: each doubling adds a round that waits longer than the one before
    steps = [straggler_factor(2 ** (k + 1)) - straggler_factor(2 ** k) for k in range(1, 10)]
    assert all(b > a for a, b in zip(steps, steps[1:]))


def test_timing_noise_costs_a_longer_step_a_smaller_share():
    machine = replace(JUWELS_LIKE, noise_s=1e-4)
    assert machine.lateness_s(0.4, 64) == pytest.approx(2 * machine.lateness_s(0.1, 64))  # square root of busy time
    short, long = (predict(replace(RESNET50, compute_s=c, data_s=0.0), machine, [4, 1024])[1] for c in (0.1, 0.4))
    assert long.efficiency > short.efficiency


def test_storage_ceiling_stalls_only_a_loader_that_reads_files_beyond_it():
    machine = replace(JUWELS_LIKE, storage_images_per_s=20000.0)
    native = replace(RESNET50, reads_files=True)
    small, large = predict(native, machine, [8, 1024])
    assert small.step_s == predict(native, JUWELS_LIKE, [8])[0].step_s  # 8 * 64 images in 0.25 s: below the ceiling
    assert large.step_s == pytest.approx(1024 * 64 / 20000.0)  # the file system sets the pace
    (unlimited,) = predict(native, JUWELS_LIKE, [1024])
    stall = step_times(native, machine, 1024).stall
    assert stall == pytest.approx((large.step_s - unlimited.step_s) / (1 + loader_spread(1024, 64)))
    assert large.wait_s == pytest.approx(unlimited.wait_s + large.step_s - unlimited.step_s)
    assert large.kernel_comm_s > unlimited.kernel_comm_s + stall * loader_spread(1024, 64)  # the others wait for the last
    (dali,) = predict(RESNET50, machine, [1024])
    assert dali.step_s == unlimited.step_s


def test_efficiency_falls_with_gpus_beyond_a_node():
    curve = predict(RESNET50, replace(JUWELS_LIKE, noise_s=1e-4), [4, 8, 64, 1024])
    assert [p.gpus for p in curve] == [4, 8, 64, 1024]
    assert curve[0].efficiency == 1.0
    assert all(a.efficiency > b.efficiency for a, b in zip(curve, curve[1:]))


def test_machine_fit_recovers_the_noise_and_kernels_beside_compute_that_made_the_shares():
    truth = replace(JUWELS_LIKE, noise_s=2e-4, beside_compute=0.3)
    shares = [(p.gpus, p.comm_share) for p in predict(RESNET50, truth, [4, 8, 16, 32, 64])]
    fitted = fit_machine(shares, RESNET50, JUWELS_LIKE)
    assert fitted.noise_s == pytest.approx(2e-4, rel=1e-6)
    assert fitted.beside_compute == pytest.approx(0.3, rel=1e-6)
    with pytest.raises(ValueError, match="needs >= 2 GPUs"):
        fit_machine([(1, 0.2)], RESNET50, JUWELS_LIKE)


def test_published_table_is_complete():
    published = load_published()
    assert [r.gpus for r in published["dali"]] == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert [r.gpus for r in published["native"]] == [4, 8, 16, 32, 64, 128, 256, 512]
    assert published["dali"][0].comm_share == pytest.approx(0.154)
    assert published["dali"][0].renormalised_share == pytest.approx(15.40 / (15.40 + 22.00 + 32.50))


def test_published_workload_is_a_whole_training_step_plus_the_loaders_io_kernels():
    rows = [r for r in load_published()["dali"] if r.gpus <= 64]
    other = sum(100 - r.comm - r.io for r in rows)  # cuDNN and the other kernels: NVIDIA's whole step
    assert published_workload().compute_s == pytest.approx(64 / 938.0 * (1 + sum(r.io for r in rows) / other))
    io = io_kernel_s("dali", 64)
    assert io == pytest.approx(64 / 938.0 * sum(r.io for r in rows) / other)
    # the I/O kernels are per image: the same for every network and precision; the training step scales by FLOPs
    assert (published_workload("resnet152").compute_s - io) / (published_workload().compute_s - io) == pytest.approx(11.56 / 4.11)
    assert published_workload(precision="fp16").compute_s - io == pytest.approx(64 / 2470.0)
    assert published_workload(loader="native").reads_files and not published_workload().reads_files


def _extrapolation_errors(loader, renormalised=False):
    fit = fit_published()
    workload = calibrated_workload(published_workload(loader=loader), fit, loader)
    rows = load_published()[loader]
    fitted = [r for r in rows if r.gpus <= CALIBRATION_MAX_GPUS]
    cudnn_io = sum(r.compute + r.io for r in fitted) / sum(100 - r.comm for r in fitted)
    errors = []
    for p, r in zip(predict(workload, fit.machine, [r.gpus for r in rows]), rows):
        if r.gpus > CALIBRATION_MAX_GPUS:
            model = p.kernel_comm_s / (p.kernel_comm_s + p.kernel_comm_s / p.comm_share * (1 - p.comm_share) * cudnn_io)
            errors.append(100 * abs(model - r.renormalised_share) if renormalised else 100 * abs(p.comm_share - r.comm_share))
    return errors


@pytest.mark.parametrize("loader", ["dali", "native"])
def test_extrapolated_comm_shares_stay_within_the_recorded_errors(loader):
    """Fitted on 4-64 GPUs only; 128-1024 are out of sample (numbers in benchmarks/README.md)."""
    errors = _extrapolation_errors(loader)
    mean_bound, max_bound = EXTRAPOLATION_BOUNDS_PP[loader]
    assert mean(errors) <= mean_bound and max(errors) <= max_bound


def test_dali_comm_share_meets_the_issue_goal_as_published_and_renormalised():
    for renormalised in (False, True):
        errors = _extrapolation_errors("dali", renormalised)
        assert len(errors) == 4 and mean(errors) <= GOAL_PP[0] and max(errors) <= GOAL_PP[1]


def _efficiency(fit, model, loader, framework, gpus):
    """E_G of the paper's 90-epoch runs: its workload and its epoch overhead."""
    return predict(paper_workload(fit, model, loader, framework), fit.machine, [4, gpus], paper_overhead(loader))[1].efficiency


def test_resnet50_dali_efficiency_stays_above_0_85_up_to_256_gpus():
    """The paper's statement (not used in any fit) from the same machine fit that gives the kernel shares."""
    fit = fit_published()
    for framework in ("ddp", "horovod"):
        assert min(_efficiency(fit, "resnet50", "dali", framework, g) for g in (8, 16, 32, 64, 128, 256)) > 0.85


def test_native_loader_statements():
    """Checked: DDP below 0.44 at 256, all below 0.24 at 512. Fitted (the storage ceiling, one parameter
    for both): Horovod 0.50 and DeepSpeed 0.33 at 128 hold within the tolerance (recorded +0.03 and -0.05,
    benchmarks/README.md)."""
    fit = fit_published()
    assert _efficiency(fit, "resnet50", "native", "ddp", 256) < 0.44
    assert max(_efficiency(fit, "resnet50", "native", f, 512) for f in ("ddp", "horovod", "deepspeed")) < 0.24
    horovod, deepspeed = (_efficiency(fit, "resnet50", "native", f, 128) for f in ("horovod", "deepspeed"))
    assert abs(horovod - 0.50) <= STATEMENT_TOLERANCE and abs(deepspeed - 0.33) <= STATEMENT_TOLERANCE


def test_deepspeed_is_slower_to_scale_because_its_fp16_reference_is_faster_behind_the_same_file_system():
    """The paper's DeepSpeed runs are assumed fp16: one node trains faster, as fast as the native loader's CPU
    feeds it; at 128 GPUs every framework takes what the file system gives, so DeepSpeed's E_G is lower by
    its reference's lead. In TF32 DeepSpeed scales as Horovod does."""
    fit = fit_published()
    horovod, fp16 = (predict(paper_workload(fit, loader="native", framework=f), fit.machine, [4, 128])
                     for f in ("horovod", "deepspeed"))
    assert fp16[1].images_per_s == pytest.approx(horovod[1].images_per_s) == pytest.approx(fit.machine.storage_images_per_s)
    assert fp16[0].images_per_s > 1.5 * horovod[0].images_per_s
    assert fp16[1].efficiency == pytest.approx(horovod[1].efficiency * horovod[0].images_per_s / fp16[0].images_per_s)
    tf32 = replace(calibrated_workload(published_workload(loader="native"), fit, "native"), framework="deepspeed")
    assert predict(tf32, fit.machine, [4, 128])[1].efficiency == pytest.approx(horovod[1].efficiency, abs=0.01)


def test_published_compute_time_by_precision_and_the_native_loaders_cpu():
    tf32, fp16 = (published_workload(loader="native", precision=p) for p in ("tf32", "fp16"))
    io = io_kernel_s("native", 64)  # per image, the same in both precisions
    assert (fp16.compute_s - io, tf32.compute_s - io) == pytest.approx((64 / 2470.0, 64 / 938.0))
    fit = PublishedFit(JUWELS_LIKE, native_data_fraction=0.02, storage_floor=1.0)
    assert calibrated_workload(tf32, fit, "native").data_s == pytest.approx(0.02 * tf32.compute_s)
    assert calibrated_workload(replace(fp16, data_s=0.001), fit, "native", measured_data=True).data_s == 0.001
    assert calibrated_workload(fp16, fit, "dali") == fp16
    cpu = NATIVE_WORKERS * NATIVE_WORKER_IMAGES_PER_S
    assert paper_workload(fit, loader="native").input_images_per_s == cpu  # the paper's 8 workers at the measured rate
    fast = replace(paper_workload(fit, loader="native"), compute_s=0.5 * 64 / cpu, data_s=0.0)  # twice the loader's pace
    (p,) = predict(fast, JUWELS_LIKE, [8])
    assert p.step_s == pytest.approx(64 / cpu) and p.bound == "input" and p.input_wait_s > 0


def test_storage_ceiling_is_fitted_on_the_point_statements_not_below_what_the_native_rows_drew(tmp_path):
    fit = fit_published()
    native = calibrated_workload(published_workload(loader="native"), fit, "native")
    assert fit.storage_floor == pytest.approx(storage_floor([4, 8, 16, 32, 64], native, fit.machine))
    assert fit.machine.storage_images_per_s > 1.1 * fit.storage_floor  # DeepSpeed's faster reference asks for more
    lower = tmp_path / "lower.csv"
    lower.write_text(AACH2023_STATEMENTS.read_text().replace(",0.50\n", ",0.30\n").replace(",0.33\n", ",0.15\n"))
    assert fit_published(statements=lower).machine.storage_images_per_s == pytest.approx(fit.storage_floor)  # bounded
    higher = tmp_path / "statements.csv"
    higher.write_text(AACH2023_STATEMENTS.read_text().replace(",0.50\n", ",0.80\n").replace(
        "resnet50,native,deepspeed,128,128,=,0.33\n", ""))
    raised = fit_published(statements=higher).machine.storage_images_per_s
    assert raised > 1.5 * fit.storage_floor
    assert _efficiency(replace(fit, machine=replace(fit.machine, storage_images_per_s=raised)), "resnet50", "native",
                       "horovod", 128) == pytest.approx(0.80, abs=1e-3)
    bounds = tmp_path / "bounds.csv"
    bounds.write_text(AACH2023_STATEMENTS.read_text().replace("<,0.44", "<,0.99").replace(">,0.85", ">,0.01"))
    assert fit_published(statements=bounds) == fit  # the bounds are only checked


def test_statements_are_read_from_the_published_file():
    statements = load_statements()
    said = {(s.loader, s.relation, s.value) for s in statements}
    assert said == {("dali", ">", 0.85), ("native", "<", 0.44), ("native", "=", 0.50), ("native", "=", 0.33),
                    ("native", "<", 0.24)}
    (dali,) = [s for s in statements if s.loader == "dali"]
    assert dali.covers("resnet50", "dali", "horovod", 256) and not dali.covers("resnet50", "dali", "horovod", 512)
    assert dali.holds(0.86) and not dali.holds(0.85) and dali.error(0.86) == 0.0 and dali.error(0.8) == pytest.approx(-0.05)


def test_published_fit_uses_only_counts_up_to_64_gpus(tmp_path):
    changed = tmp_path / "table.csv"
    lines = load_published.__defaults__[0].read_text().splitlines()
    changed.write_text("\n".join(lines[:6] + [",".join([line.split(",")[0]] + ["1.0", "1.0", "97.0"] * 2) for line in lines[6:]]) + "\n")
    assert fit_published(path=changed) == fit_published()


def test_one_machine_fit_resnet152_scales_better_and_native_well_below_dali_beyond_its_knee():
    fit = fit_published()
    gpus = [4, 8, 64, 128, 256, 512, 1024]
    curves = {(model, loader): [p.efficiency for p in predict(calibrated_workload(published_workload(model, loader), fit, loader),
                                                              fit.machine, gpus)]
              for model in ("resnet50", "resnet152") for loader in ("dali", "native")}
    for loader in ("dali", "native"):  # more work per step averages the ranks' noise out
        assert all(b > a for a, b in zip(curves["resnet50", loader][1:], curves["resnet152", loader][1:]))
    assert all(d - n >= 0.35 for d, n in zip(curves["resnet50", "dali"][3:], curves["resnet50", "native"][3:]))


def _runs_made_by(tmp_path, truth, model="resnet18", batch=8, nodes=(1, 2, 4), fields_for=None, config_for=None,
                  site="cluster", device="cpu"):
    """Runs on `site`'s `device` whose profile and throughput the model itself produced on `truth` (1 GPU per node);
    `fields_for(n)`: more fields of the epochs of the run on n nodes (metrics version 4), `config_for(n)`: more of its
    header's config."""
    workload = Workload(0.5, batch, gradient_bytes(model), data_s=0.02, other_s=0.03, reads_files=True)
    paths = []
    for n in nodes:
        (p,) = predict(workload, truth, [n])
        comm = step_times(workload, truth, n).profiled_comm
        profile = dict(step_s=workload.compute_s + comm + workload.data_s + workload.other_s,
                       compute_s=workload.compute_s, comm_s=comm, data_s=workload.data_s)
        v4 = dict(epoch_fields=[fields_for(n)] * 2, version=VERSION) if fields_for else {}
        path = write_run(tmp_path, "n%d" % n, n, [p.images_per_s, p.images_per_s], batch=batch, model=model, site=site,
                         profile=profile, gpus_per_node=1, config=config_for(n) if config_for else None, **v4)
        path.write_text(path.read_text().replace('"device": "cuda"', '"device": "%s"' % device, 1))
        paths.append(path)
    return paths


def test_fit_on_runs_recovers_network_and_noise_and_predicts_the_left_out_runs(tmp_path):
    truth = Machine(gpus_per_node=1, latency_us=40.0, bandwidth_gbps_per_node=10.0, intra_node_gbps=2400.0, noise_s=1e-3)
    _runs_made_by(tmp_path, truth)
    runs, step_options, _ = calibration_runs([tmp_path])
    assert step_options == ""  # made without the workload options
    fitted = fit_runs(runs, Machine(1, 0.0, 100.0))
    assert fitted.bandwidth_gbps_per_node == pytest.approx(10.0, rel=1e-6)
    assert fitted.latency_us == pytest.approx(40.0, rel=1e-6)
    assert fitted.noise_s == pytest.approx(1e-3, rel=1e-6)
    first, second, third = leave_one_out(runs, None, 1)
    assert first.predicted.gpus == 1 and abs(first.step_error) < 1e-9 and first.share_error == 0.0
    # one multi-node run left: bandwidth and noise fitted with the latency unknown (0), still predicted
    for left in (second, third):
        assert 0 < abs(left.step_error) < 0.2 and 0 < abs(left.share_error) < 0.1
        assert left.measured_share == pytest.approx(left.run.profile.comm_s / (0.5 + 0.02 + left.run.profile.comm_s))


def test_profiled_comm_is_one_ring_all_reduce_after_compute_plus_the_slowest_ranks_lag():
    machine = replace(JUWELS_LIKE, noise_s=1e-4)
    (p,) = predict(RESNET50, machine, [64])
    comm = machine.ring_allreduce_s(64, 102.4e6) + p.wait_s
    assert p.profiled_comm_share == pytest.approx(comm / (comm + 0.2 + 0.05))


def _predict(*args: object):
    return RUNNER.invoke(app, ["predict", *(str(a) for a in args)])


@pytest.fixture
def site_file(tmp_path):
    path = tmp_path / "testsite.toml"
    path.write_text(
        'name = "testsite"\ndescription = "test"\nbased_on = ["nothing"]\nscheduler = "slurm"\n'
        'gpus_per_node = 4\ncores_per_node = 8\ngpu_vendor = "nvidia"\n'
        '[[partitions]]\nname = "big"\nmax_nodes = 256\nmax_time = "01:00:00"\ndefault = true\n'
        "[network]\nlatency_us = 5.0\nbandwidth_gbps_per_node = 800.0\n"
        '[predict]\nintra_node_gbps_per_gpu = 2400.0\nintra_node_source = "as JUWELS_LIKE"\n'
    )
    return path


def test_predict_prints_the_curve(site_file):
    result = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--data-ms", "50",
                      "--batch", "64", "--gpus", "4,8,1024")
    assert result.exit_code == 0, result.output
    for p in predict(RESNET50, JUWELS_LIKE, [4, 8, 1024]):
        assert "%.1f" % p.images_per_s in result.output
        assert "%.3f" % p.efficiency in result.output
    assert "102.4 MB" in result.output and "ddp" in result.output


def test_predict_models_the_framework(site_file):
    base = ["--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--batch", "64", "--gpus", "4,64"]
    result = _predict(*base, "--framework", "deepspeed", "--zero-stage", "1")
    assert result.exit_code == 0, result.output
    zero1 = Workload(0.2, 64, 102.4e6, framework="deepspeed", zero_stage=1)
    assert "%.1f" % predict(zero1, JUWELS_LIKE, [4, 64])[1].images_per_s in result.output


def test_predict_takes_compute_time_and_batch_from_a_run(tmp_path, site_file):
    run = write_run(tmp_path, "profiled", 4, [100.0], batch=64,
                    profile=dict(step_s=0.3, compute_s=0.2, comm_s=0.05, data_s=0.05))
    result = _predict("--site", site_file, "--from-run", run.parent, "--gpus", "8")
    assert result.exit_code == 0, result.output
    (expected,) = predict(RESNET50, JUWELS_LIKE, [8])
    assert "%.1f" % expected.images_per_s in result.output


def test_predict_from_a_run_of_another_model_refuses_to_transfer_its_compute_time(tmp_path, site_file):
    run = write_run(tmp_path, "profiled", 4, [100.0], batch=64,
                    profile=dict(step_s=0.3, compute_s=0.2, comm_s=0.05, data_s=0.05))
    other = _predict("--site", site_file, "--from-run", run.parent, "--model", "resnet152", "--gpus", "8")
    assert isinstance(other.exception, DlaunchError)
    assert "--from-run: %s trains resnet50, not --model resnet152" % run in str(other.exception)


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4,x"], "--gpus"),
    (["--gpus", "0,4"], "--gpus"),
    (["--gpus", "4,100000000"], "--gpus"),
    (["--gpus", "4,1028"], "--gpus"),  # 257 nodes of 4 GPUs: one node more than the largest partition
    (["--model", "vgg16"], "--model"),
    (["--compute-ms", "-1"], "--compute-ms"),
    (["--batch", "0"], "--batch"),
    (["--data-ms", "-1"], "--data-ms"),
    (["--storage-images-per-s", "0"], "--storage-images-per-s"),
    (["--precision", "fp16"], "--precision"),  # a measured compute time has its own precision
    (["--epoch-overhead", "-1"], "--epoch-overhead"),
    (["--epoch-images", "0"], "--epoch-images"),
])
def test_predict_rejects_bad_flags_by_name(site_file, args, message):
    base = {"--model": "resnet50", "--compute-ms": "200", "--batch": "64", "--gpus": "4,8"}
    base.update(dict(zip(args[::2], args[1::2])))
    result = _predict("--site", site_file, *[x for kv in base.items() for x in kv])
    assert isinstance(result.exception, DlaunchError) and message in str(result.exception)
    assert "\n" not in str(result.exception)


def test_predict_names_an_unknown_model_even_without_a_measurement():
    result = _predict("--site", "juwels", "--model", "vgg16")
    assert isinstance(result.exception, DlaunchError)
    assert str(result.exception).startswith("--model: unknown model 'vgg16'") and "resnet50" in str(result.exception)


def test_predict_refuses_batch_0_instead_of_using_64():
    result = _predict("--site", "juwels", "--model", "resnet50", "--batch", "0")
    assert isinstance(result.exception, DlaunchError) and str(result.exception).startswith("--batch")


def test_predict_exits_2_with_one_line_for_bad_input():
    shown = subprocess.run([sys.executable, "-m", "dlaunch.cli", "predict", "--site", "juwels", "--gpus", "4,100000000",
                            "--model", "resnet50"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 2
    assert shown.stderr.strip().count("\n") == 0 and "--gpus" in shown.stderr and "1536" in shown.stderr


def test_predict_help_shows_the_network_section_literally():
    result = RUNNER.invoke(app, ["predict", "--help"])
    assert result.exit_code == 0 and "[network] section" in result.output


def test_predict_needs_a_site_with_network_and_a_profiled_run(tmp_path, site_file):
    site_file.write_text(site_file.read_text().split("[network]")[0])
    result = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "1", "--batch", "1")
    assert isinstance(result.exception, DlaunchError) and "no [network] section" in str(result.exception)
    assert "--from-runs" in str(result.exception)
    run = write_run(tmp_path, "unprofiled", 4, [100.0])
    with pytest.raises(DlaunchError, match="no profile record"):
        workload_from_options(None, None, None, None, run)


def test_predict_calibrated_to_the_published_table(site_file):
    result = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--data-ms", "50",
                      "--batch", "64", "--gpus", "4,1024", "--calibrated", "dali")
    assert result.exit_code == 0, result.output
    fit = fit_published()
    machine = replace(JUWELS_LIKE, noise_s=fit.machine.noise_s, beside_compute=fit.machine.beside_compute)

    def overhead(loader: str) -> PaperOverhead:
        """The paper's epoch for the user's ResNet-50 workload: no Table 2a I/O kernels in it, its checkpoint."""
        return PaperOverhead(loader, 0.0, checkpoint_bytes("resnet50"))
    for p in predict(RESNET50, machine, [4, 1024], overhead("dali")):
        assert "%.3f" % p.efficiency in result.output and "%.1f" % (100 * p.comm_share) in result.output
    assert "Table 2a" in result.output and "paper E_G" not in result.output  # the user's workload: nothing to compare
    native = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--batch", "64",
                      "--gpus", "4,1024", "--calibrated", "native")
    loaded = replace(RESNET50, data_s=fit.native_data_fraction * 0.2, reads_files=True)
    fitted_storage = replace(machine, storage_images_per_s=fit.machine.storage_images_per_s)
    assert "%.3f" % predict(loaded, fitted_storage, [4, 1024], overhead("native"))[1].efficiency in native.output
    assert "%.0f images/s" % fit.machine.storage_images_per_s in native.output and "statements" in native.output
    ceiling = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--batch", "64",
                       "--gpus", "4,1024", "--calibrated", "native", "--storage-images-per-s", "20000")
    stalled = predict(loaded, replace(machine, storage_images_per_s=20000.0), [4, 1024], overhead("native"))[1]
    assert "%.3f" % stalled.efficiency in ceiling.output and "20000 images/s" in ceiling.output
    assert stalled.efficiency < predict(loaded, machine, [4, 1024], overhead("native"))[1].efficiency
    bad = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "1", "--batch", "1", "--calibrated", "x")
    assert isinstance(bad.exception, DlaunchError) and "--calibrated" in str(bad.exception)


def _table(output):
    """{GPUs: cells} of the prediction table (rows starting with a GPU count)."""
    return {int(line.split()[0]): line.split()[1:] for line in output.splitlines() if line.split() and line.split()[0].isdigit()}


def test_predict_shows_kernel_share_and_efficiency_beside_the_papers_values_with_their_errors():
    result = _predict("--site", "juwels-booster", "--model", "resnet50", "--calibrated", "dali")
    assert result.exit_code == 0, result.output
    fit = fit_published()
    curve = {p.gpus: p for p in predict(published_workload(), fit.machine, [4, 8, 16, 32, 64, 128, 256, 512, 1024],
                                        paper_overhead("dali"))}
    published = {r.gpus: r.comm_share for r in load_published()["dali"]}
    table = _table(result.output)
    assert sorted(table) == sorted(curve)
    for gpus, cells in table.items():
        p = curve[gpus]
        statement = [">0.85", "holds"] if 8 <= gpus <= 256 else ["-", "-"]
        share = ["%.1f" % (100 * p.comm_share), "%.1f" % (100 * published[gpus]),
                 "%+.1f" % (100 * (p.comm_share - published[gpus]))]
        basis = "fitted" if gpus <= 64 else "predicted"
        overhead = ["%.2f" % p.epoch_overhead_s, "%.1f" % (100 * p.overhead_share)]
        run = ["compute", "%.3g" % (p.run_s(90) / 3600), "%.0f" % (p.run_s(90) * p.nodes / 3600)]
        expected = ["%.3f" % p.efficiency] + statement + share + overhead + run + [basis]
        assert [c.replace("+0.0", "0.0").replace("-0.0", "0.0") for c in cells[-12:]] == [
            c.replace("+0.0", "0.0").replace("-0.0", "0.0") for c in expected], (gpus, cells)
    assert "NCCL kernel share vs Table 2a, predicted counts: mean 1.1 pp, max 1.9 pp" in result.output
    assert "E_G vs the paper's statements: 6 of 6 hold" in result.output
    horovod = _predict("--site", "juwels-booster", "--model", "resnet50", "--calibrated", "native", "--framework",
                       "horovod", "--gpus", "4,64,128,512")
    rows = _table(horovod.output)
    assert rows[128][-9:-7] == ["0.50", "+0.02"] and rows[128][-1] == "fitted"  # the storage ceiling is fitted there
    assert rows[512][-9:-7] == ["<0.24", "holds"] and rows[512][-1] == "predicted"
    assert rows[64][-9:-7] == ["-", "-"] and "paper %" not in horovod.output  # Table 2a is DDP's
    assert [rows[g][-4] for g in (64, 128, 512)] == ["compute", "storage", "storage"]


def test_predict_names_what_it_assumes_about_the_papers_deepspeed_runs():
    args = ["--site", "juwels-booster", "--model", "resnet50", "--calibrated", "native", "--framework", "deepspeed",
            "--gpus", "4,128,512"]
    fit = fit_published()
    assumed = _predict(*args)
    assert assumed.exit_code == 0, assumed.output
    line = next(x for x in assumed.output.splitlines() if x.startswith("assumption"))
    assert "DeepSpeedExamples" in line and "fp16" in line and "ZeRO stage 0" in line
    workload = paper_workload(fit, loader="native", framework="deepspeed")
    assert "mixed precision" in assumed.output and "compute %.2f ms" % (1e3 * workload.compute_s) in assumed.output
    rows = _table(assumed.output)
    expected = predict(workload, fit.machine, [4, 128], paper_overhead("native"))[1].efficiency
    assert rows[128][-10] == "%.3f" % expected and rows[128][-9] == "0.33" and abs(expected - 0.33) <= STATEMENT_TOLERANCE
    assert "E_G vs the paper's statements: 2 of 2 hold" in assumed.output
    tf32 = _predict(*args, "--precision", "tf32", "--zero-stage", "1")  # both given: nothing assumed, and 0.33 fails
    assert tf32.exit_code == 0, tf32.output
    assert "assumption" not in tf32.output and "TF32" in tf32.output and "1 of 2 hold" in tf32.output
    staged = _predict(*args, "--zero-stage", "1")
    assert "fp16" in next(x for x in staged.output.splitlines() if x.startswith("assumption")) and "ZeRO stage 0" not in staged.output
    for others in (["--framework", "horovod"], ["--framework", "deepspeed", "--compute-ms", "100", "--batch", "64"]):
        plain = _predict("--site", "juwels-booster", "--model", "resnet50", "--calibrated", "native", *others)
        assert plain.exit_code == 0 and "fp16" not in plain.output, plain.output


def test_predict_takes_the_published_figure_of_the_precision():
    result = _predict("--site", "juwels", "--model", "resnet50", "--precision", "fp16", "--gpus", "4,8", "--calibrated",
                      "none")
    assert result.exit_code == 0, result.output
    assert "compute %.2f ms" % (1e3 * 64 / 2470.0) in result.output and "mixed precision" in result.output


def test_predict_compares_with_the_paper_only_for_its_workload_and_machine():
    for args in (["--site", "jureca-dc"], ["--site", "juwels-booster", "--batch", "128"],
                 ["--site", "juwels-booster", "--gpus", "8,16"], ["--site", "juwels-booster", "--model", "resnet152"],
                 ["--site", "juwels-booster", "--framework", "deepspeed"]):  # DeepSpeed cannot use DALI: no value
        result = _predict(*(["--model", "resnet50", "--calibrated", "dali"] + args))
        assert result.exit_code == 0, result.output
        assert "paper E_G" not in result.output and "paper %" not in result.output and "fitted" in result.output


def test_predict_calibrated_starts_without_numpy():
    shown = subprocess.run([sys.executable, "-c", "import sys\nfrom dlaunch.cli import main\ntry:\n    main(['predict', "
                            "'--site', 'juwels-booster', '--model', 'resnet50', '--calibrated', 'native'])\n"
                            "except SystemExit:\n    pass\nprint('numpy' in sys.modules)"],
                           capture_output=True, text=True, timeout=120)
    assert shown.stdout.strip().endswith("False"), shown.stdout + shown.stderr


def test_predict_from_runs_reports_leave_one_out_errors(tmp_path):
    truth = Machine(gpus_per_node=1, latency_us=40.0, bandwidth_gbps_per_node=10.0, intra_node_gbps=2400.0, noise_s=1e-3)
    _runs_made_by(tmp_path / "runs", truth, nodes=(1, 2))
    site = tmp_path / "cluster.toml"
    site.write_text('name = "cluster"\ndescription = "test"\nbased_on = ["nothing"]\nscheduler = "slurm"\n'
                    'gpus_per_node = 1\ncores_per_node = 2\ngpu_vendor = "none"\n'
                    '[[partitions]]\nname = "p"\nmax_nodes = 4\nmax_time = "01:00:00"\ndefault = true\n')
    result = _predict("--site", site, "--from-runs", tmp_path / "runs", "--gpus", "1,2,4")
    assert result.exit_code == 0, result.output
    assert ("leave-one-out error (1 of 2 runs predicted from the others): step time mean 0.0 %, max 0.0 %; "
            "profiled comm share mean 0.0 pp, max 0.0 pp") in result.output
    assert "the others hold no multi-node run" in result.output
    workload = Workload(0.5, 8, gradient_bytes("resnet18"), data_s=0.02, other_s=0.03, reads_files=True)
    one, two, four = predict(workload, truth, [1, 2, 4])
    for p in (two, four):
        assert "%.1f" % p.images_per_s in result.output and "%.1f" % (100 * p.profiled_comm_share) in result.output
    rows = {line.split()[0]: line.split()[-1] for line in result.output.splitlines() if line.split() and line.split()[0] in "124"}
    assert rows == {"1": "fitted", "2": "fitted", "4": "predicted"} and "profiled" in result.output


def test_predict_from_runs_fits_the_runs_of_a_site_with_a_network(tmp_path):
    truth = Machine(gpus_per_node=1, latency_us=40.0, bandwidth_gbps_per_node=10.0, intra_node_gbps=2400.0, noise_s=1e-3)
    _runs_made_by(tmp_path / "runs", truth, nodes=(1, 2, 4, 8))
    site = tmp_path / "cluster.toml"
    site.write_text('name = "cluster"\ndescription = "test"\nbased_on = ["nothing"]\nscheduler = "slurm"\n'
                    'gpus_per_node = 1\ncores_per_node = 2\ngpu_vendor = "none"\n'
                    '[[partitions]]\nname = "p"\nmax_nodes = 16\nmax_time = "01:00:00"\ndefault = true\n'
                    "[network]\nlatency_us = 5.0\nbandwidth_gbps_per_node = 100.0\n")
    result = _predict("--site", site, "--from-runs", tmp_path / "runs", "--gpus", "1,2,3,4,8,16")
    assert result.exit_code == 0, result.output
    assert "(4 of 4 runs predicted from the others)" in result.output
    rows = {line.split()[0]: line.split()[-1] for line in result.output.splitlines()
            if line.split() and line.split()[0] in ("1", "2", "3", "4", "8", "16")}
    assert rows == {"1": "fitted", "2": "fitted", "3": "range", "4": "fitted", "8": "fitted", "16": "predicted"}  # 3: in range


@pytest.mark.parametrize("make, message", [
    (lambda root: write_run(root, "one", 1, [10.0, 10.0], profile=dict(step_s=1, compute_s=1, comm_s=0, data_s=0)), "at least 2"),
    (lambda root: [write_run(root, "a", 1, [10.0, 10.0]), write_run(root, "b", 2, [10.0, 10.0])], "no profile record"),
])
def test_predict_from_runs_says_how_to_make_a_calibration_run(tmp_path, site_file, make, message):
    make(tmp_path / "runs")
    result = _predict("--site", site_file, "--from-runs", tmp_path / "runs", "--gpus", "4,8")
    assert isinstance(result.exception, DlaunchError) and message in str(result.exception)
    assert str(result.exception).startswith("--from-runs") and "--profile-steps" in str(result.exception)


def test_predict_for_the_issue_command_shows_the_calibrated_model_and_the_nominal_one_as_an_upper_bound():
    """`dlaunch predict --site juwels --model resnet50` (issue 48): the calibrated model by default (E_G 0.78 at 1024
    GPUs, as `--calibrated dali`), named in the first line with how to get the others; `--calibrated none` is the
    nominal model (E_G 0.980 there), labelled an upper bound."""
    result = _predict("--site", "juwels", "--model", "resnet50", "--gpus", "4,1024")
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("model: calibrated on Aach et al. 2023 Table 2a's DALI column") and "--calibrated dali|native|none (none: nominal, an upper bound)" in first
    assert "with the loader of the paper's main results (DALI" in first  # why DALI, not native
    fit = fit_published()
    calibrated = predict(paper_workload(fit, loader="dali"), fit.machine, [4, 1024], paper_overhead("dali"))[1]
    assert _table(result.output)[1024][4] == "%.3f" % calibrated.efficiency == "0.780"
    assert _table(_predict("--site", "juwels", "--model", "resnet50", "--gpus", "4,1024", "--calibrated", "dali").output) \
        == _table(result.output)
    nominal = _predict("--site", "juwels", "--model", "resnet50", "--gpus", "4,1024", "--calibrated", "none")
    assert nominal.exit_code == 0, nominal.output
    assert nominal.output.splitlines()[0].startswith("model: nominal") and "upper bound" in nominal.output
    compute_ms = 1e3 * 64 / 938.0  # NVIDIA's A100 TF32 ResNet-50 row, carried to the paper's batch of 64
    assert "compute %.2f ms" % compute_ms in nominal.output
    (_, largest) = predict(Workload(compute_ms / 1e3, 64, gradient_bytes("resnet50")), Machine(4, 1.5, 800.0, 2400.0),
                           [4, 1024])
    assert _table(nominal.output)[1024][4] == "%.3f" % largest.efficiency == "0.980"
    other = _predict("--site", "jureca-dc", "--model", "resnet50", "--gpus", "4,8")  # no calibration of its machine
    assert other.output.splitlines()[0].startswith("model: nominal") and "no calibration exists" in other.output
    deepspeed = _predict("--site", "juwels", "--model", "resnet50", "--gpus", "4,8", "--framework", "deepspeed")
    assert "Table 2a's native loader column" in deepspeed.output and "DeepSpeed cannot use DALI" in deepspeed.output


def test_predict_without_a_published_figure_asks_for_a_measurement():
    result = _predict("--site", "lumi-g", "--model", "resnet50")  # AMD GPUs: no published figure built in
    assert isinstance(result.exception, DlaunchError) and "--compute-ms" in str(result.exception)


def test_importing_the_model_does_not_import_numpy():
    shown = subprocess.run([sys.executable, "-c", "import sys, dlaunch.analysis.perfmodel.prediction; print('numpy' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)
    assert shown.stdout.strip() == "False", shown.stderr


def test_published_machine_is_juwels_booster():
    from dlaunch.jobs.sites import resolve_site

    site = resolve_site("juwels-booster")
    assert (AACH2023_MACHINE.gpus_per_node, AACH2023_MACHINE.latency_us, AACH2023_MACHINE.bandwidth_gbps_per_node) == (
        site.gpus_per_node, site.network.latency_us, site.network.bandwidth_gbps_per_node)
    assert not math.isnan(fit_published().machine.noise_s)


def test_predict_by_default_goes_up_to_what_the_site_has():
    result = _predict("--site", "jureca-dc", "--model", "resnet50")  # 512 GPUs in its largest partition
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.output.splitlines() if line.split() and line.split()[0].isdigit()]
    assert rows == ["4", "8", "16", "32", "64", "128", "256", "512"]


def test_predict_calibrated_native_keeps_a_measured_data_wait_of_zero(site_file):
    result = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--data-ms", "0", "--batch", "64",
                      "--gpus", "4,8", "--calibrated", "native")
    assert result.exit_code == 0, result.output
    assert "compute 200.00 ms + data 0.00 ms" in result.output


def test_epoch_overhead_is_shared_by_the_epochs_steps():
    plain = predict(RESNET50, JUWELS_LIKE, [4, 1024])
    fixed = predict(RESNET50, JUWELS_LIKE, [4, 1024], FixedOverhead(2.0, "--epoch-overhead"))
    assert (steps_per_epoch(4, 64), steps_per_epoch(1024, 64)) == (5005, 20)  # ceil(1,281,167 / global batch)
    for p, q in zip(plain, fixed):
        assert q.step_s == p.step_s and q.steps_per_epoch == steps_per_epoch(p.gpus, 64)
        assert q.images_per_s == pytest.approx(p.gpus * 64 / (p.step_s + 2.0 / q.steps_per_epoch))
        assert q.overhead_share == pytest.approx(2.0 / (q.steps_per_epoch * q.step_s + 2.0))
    assert fixed[1].efficiency < plain[1].efficiency - 0.05  # 2 s against 20 steps of 0.2 s
    none = predict(RESNET50, JUWELS_LIKE, [4, 1024], FixedOverhead(0.0, "--epoch-overhead"))
    assert [(p.images_per_s, p.efficiency) for p in none] == [(p.images_per_s, p.efficiency) for p in plain]
    smaller = predict(RESNET50, JUWELS_LIKE, [4, 1024], FixedOverhead(2.0, "--epoch-overhead"), epoch_images=200000)
    assert smaller[1].steps_per_epoch == 4 and smaller[1].efficiency < fixed[1].efficiency


def test_the_papers_epoch_overhead_comes_from_its_stated_setup():
    fit = fit_published()
    dali = paper_workload(fit, loader="dali")
    io = io_kernel_s("dali", 64)
    parts = paper_overhead("dali").parts(dali, fit.machine, 1024)
    forward = (io + (dali.compute_s - io) / 3) / 64  # per image: the I/O kernels and forward
    assert parts["validation"] == pytest.approx(-(-IMAGENET_VAL_IMAGES // 1024) * forward)  # 49 images per GPU
    assert (parts["loader start"], parts["logging"]) == (0.0, 0.0)
    assert parts["checkpoint"] == pytest.approx(8 * 25.6e6 / 1e9)  # weights + momentum of ResNet-50 at 1 GB/s
    assert paper_overhead("dali", model="resnet152").parts(dali, fit.machine, 1024)["checkpoint"] == pytest.approx(8 * 60.2e6 / 1e9)
    assert 0 < parts["synchronisation"] < 0.1
    native = paper_workload(fit, loader="native")
    at = {g: paper_overhead("native").parts(native, fit.machine, g) for g in (4, 1024)}
    assert at[1024]["loader start"] == pytest.approx(2 * 64 / NATIVE_WORKER_IMAGES_PER_S)  # training and validation
    assert at[1024]["validation"] == pytest.approx(IMAGENET_VAL_IMAGES / fit.machine.storage_images_per_s)  # the file system
    assert at[4]["validation"] == pytest.approx(IMAGENET_VAL_IMAGES / 4 / (NATIVE_WORKERS * NATIVE_WORKER_IMAGES_PER_S))  # the workers' CPU


def test_overhead_passes_names_the_first_count_above_a_tenth():
    overhead = FixedOverhead(2.0, "--epoch-overhead")
    first = overhead_passes(RESNET50, JUWELS_LIKE, overhead, 4, 4096)
    shares = {g: predict(RESNET50, JUWELS_LIKE, [g], overhead)[0].overhead_share for g in range(4, 4097, 4)}
    assert first == min(g for g, share in shares.items() if share > OVERHEAD_SHARE_LIMIT)
    assert overhead_passes(RESNET50, JUWELS_LIKE, FixedOverhead(0.01, "x"), 4, 1024) is None


def test_predict_shows_a_stated_epoch_overhead_and_where_it_passes_a_tenth(site_file):
    result = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--data-ms", "50", "--batch", "64",
                      "--gpus", "4,64,1024", "--epoch-overhead", "2")
    assert result.exit_code == 0, result.output
    overhead = FixedOverhead(2.0, "--epoch-overhead")
    rows = _table(result.output)
    for p in predict(RESNET50, JUWELS_LIKE, [4, 64, 1024], overhead):
        assert rows[p.gpus][-6:-4] == ["2.00", "%.1f" % (100 * p.overhead_share)]
        assert rows[p.gpus][-8] == "%.3f" % p.efficiency
    first = overhead_passes(RESNET50, JUWELS_LIKE, overhead, 4, 1024)
    assert "epoch overhead 2.000 s per epoch (given)" in result.output
    assert "more than 10 %% of it from %d GPUs on" % first in result.output
    plain = _predict("--site", site_file, "--model", "resnet50", "--compute-ms", "200", "--batch", "64", "--gpus", "4,8")
    assert "epoch overhead: none" in plain.output and "overhead %" not in plain.output


def test_predict_calibrated_prints_the_assumptions_of_the_papers_epoch():
    for loader, start in (("dali", "DALI's pipelines are built once"), ("native", "persistent_workers=False")):
        result = _predict("--site", "juwels-booster", "--model", "resnet152", "--calibrated", loader)
        assert result.exit_code == 0, result.output
        assert "epoch overhead from Aach et al.'s stated setup (50,000 validation images every epoch" in result.output
        assert start in result.output and "a checkpoint every epoch (not stated;" in result.output
        fit = fit_published()
        big = predict(paper_workload(fit, "resnet152", loader), fit.machine, [4, 1024],
                      paper_overhead(loader, model="resnet152"))[1]
        assert "%.3f" % big.efficiency in _table(result.output)[1024]


def test_predict_from_runs_measures_the_epoch_overhead_and_the_slowest_forward_excess(tmp_path):
    truth = Machine(gpus_per_node=1, latency_us=40.0, bandwidth_gbps_per_node=10.0, intra_node_gbps=2400.0, noise_s=1e-3)
    computes = {1: [0.5], 2: [0.5, 0.55], 4: [0.5, 0.5, 0.5, 0.6]}
    _runs_made_by(tmp_path / "runs", truth, nodes=(1, 2, 4), fields_for=lambda n: v4_fields(computes[n], overhead_s=n * 1.0))
    site = tmp_path / "cluster.toml"
    site.write_text('name = "cluster"\ndescription = "test"\nbased_on = ["nothing"]\nscheduler = "slurm"\n'
                    'gpus_per_node = 1\ncores_per_node = 2\ngpu_vendor = "none"\n'
                    '[[partitions]]\nname = "p"\nmax_nodes = 8\nmax_time = "01:00:00"\ndefault = true\n')
    result = _predict("--site", site, "--from-runs", tmp_path / "runs", "--gpus", "1,2,4,8")
    assert result.exit_code == 0, result.output
    assert "epoch overhead %.3f s per epoch (your runs' mean)" % (7.0 / 3) in result.output
    rows = _table(result.output)
    assert [rows[g][-5] for g in (1, 2, 4, 8)] == ["0", "%.0f" % (100 * (0.55 / 0.525 - 1)), "20", "-"]  # v4_fields: median of the ranks
    assert [rows[g][-7] for g in (1, 8)] == ["%.2f" % (7.0 / 3)] * 2
    old = tmp_path / "old"
    _runs_made_by(old, truth, nodes=(1, 2))  # metrics before version 4
    result = _predict("--site", site, "--from-runs", old, "--gpus", "1,2")
    assert "epoch overhead: not recorded by your runs" in result.output
    assert [" ".join(_table(result.output)[g][-6:-4]) for g in (1, 2)] == ["not recorded"] * 2


def _cluster_site(tmp_path):
    site = tmp_path / "cluster.toml"
    site.write_text('name = "cluster"\ndescription = "test"\nbased_on = ["nothing"]\nscheduler = "slurm"\n'
                    'gpus_per_node = 1\ncores_per_node = 2\ngpu_vendor = "none"\n'
                    '[[partitions]]\nname = "p"\nmax_nodes = 8\nmax_time = "01:00:00"\ndefault = true\n')
    return site


COMPILED = {"compile": "default", "optimizer_impl": "fused"}


def test_predict_from_runs_takes_the_compiled_step_time_and_names_the_compiled_runs(tmp_path):
    """Runs made with --compile feed the fit like eager runs of the same step times: the compile time their first
    epoch records (compile_s, in the warm-up steps) does not enter it, and the basis line says they were compiled."""
    truth = Machine(gpus_per_node=1, latency_us=40.0, bandwidth_gbps_per_node=10.0, intra_node_gbps=2400.0, noise_s=1e-3)
    site = _cluster_site(tmp_path)
    _runs_made_by(tmp_path / "eager", truth)
    _runs_made_by(tmp_path / "compiled", truth, config_for=lambda n: COMPILED,
                  fields_for=lambda n: {"compile_s": 95.0, "graphs_compiled_after_warmup": 0})
    eager = _predict("--site", site, "--from-runs", tmp_path / "eager", "--gpus", "1,2,4,8")
    compiled = _predict("--site", site, "--from-runs", tmp_path / "compiled", "--gpus", "1,2,4,8")
    assert eager.exit_code == 0 and compiled.exit_code == 0, eager.output + compiled.output
    assert _table(compiled.output) == _table(eager.output)
    assert ("the 3 runs' step: --compile default --optimizer-impl fused (compiled, their compile time in the warm-up "
            "steps and left out)") in compiled.output
    assert "the 3 runs' step: eager, torch's optimizer, default host syncs" in eager.output


def test_predict_from_runs_refuses_a_run_that_compiled_after_its_warm_up_and_runs_of_mixed_step_options(tmp_path):
    truth = Machine(gpus_per_node=1, latency_us=40.0, bandwidth_gbps_per_node=10.0, intra_node_gbps=2400.0, noise_s=1e-3)
    site = _cluster_site(tmp_path)
    _runs_made_by(tmp_path / "late", truth, config_for=lambda n: COMPILED,
                  fields_for=lambda n: {"graphs_compiled_after_warmup": 1 if n == 2 else 0})
    result = _predict("--site", site, "--from-runs", tmp_path / "late", "--gpus", "1,2,4")
    assert isinstance(result.exception, DlaunchError)
    assert str(result.exception).startswith("--from-runs: ") and "n2/metrics.jsonl compiled 2 graph(s) after its " \
        "warm-up steps, so its step times hold compile time; rerun it with more --warmup-steps" in str(result.exception)
    _runs_made_by(tmp_path / "mixed", truth, config_for=lambda n: COMPILED if n == 4 else {"host_syncs": "minimal"})
    result = _predict("--site", site, "--from-runs", tmp_path / "mixed", "--gpus", "1,2,4")
    assert isinstance(result.exception, DlaunchError)
    message = str(result.exception)
    assert message.startswith("--from-runs: the runs mix step options: ")
    assert "n1/metrics.jsonl: --host-syncs minimal;" in message and "n4/metrics.jsonl: --compile default " \
        "--optimizer-impl fused" in message
