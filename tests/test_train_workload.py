"""The trainer's workload options (dlaunch/train/workload.py: --compile, --cuda-graphs, --optimizer-impl,
--host-syncs) on the CPU: real trainer runs (one process, and two gloo ranks under torchrun), their refusals, the
paper stack's torch, and the loss bookkeeping of both host-sync modes. The CUDA paths (a captured step, the sync
check) run on a GPU only: benchmarks/gpu_validate.sh measures them against benchmarks/bare_loop_gpu.py."""
import dataclasses
import math
import warnings

import pytest
import torch

from helpers_train import TINY, assert_ok, run_trainer
from dlaunch.train.config import ConfigError, TrainConfig, parse_config, workload_flags
from dlaunch.train.metrics_schema import read_metrics
from dlaunch.train.workload import (DeviceLosses, HostLosses, LearningRate, TorchFeatures, build_optimizer,
                                    host_syncs_of, torch_refusal)

STEPS = ["--steps", "12", "--steps-per-epoch", "6", "--warmup-steps", "2"]

# What torch 1.11 (the paper's stack, containers/versions.toml) offers, as data standing in for that image (a fake:
# no torch 1.11 here, so this is what its sources say, not what an image answered): no torch.compile, an SGD without
# foreach= and fused=, a multi-tensor SGD as torch.optim._multi_tensor.SGD. The trainer asks its torch for these
# (TorchFeatures.of_this_torch), so the real image decides; only the refusals' wording comes from here.
TORCH_1_11 = TorchFeatures("1.11.0", compile=False, sgd_options=(), multi_tensor_sgd=True, fused_tensor_lr=False)


def train(tmp_path, *options, nproc=None):
    """A real trainer run (ResNet-18, 32 px, 12 steps in 2 epochs, 2 warm-up steps); its parsed metrics."""
    metrics = tmp_path / "metrics.jsonl"
    assert_ok(run_trainer(TINY + STEPS + list(options) + ["--metrics", str(metrics)], nproc=nproc, timeout=900))
    return read_metrics(str(metrics))


def config(*argv):
    return parse_config(TINY + list(argv), check_paths=False)


@pytest.mark.parametrize("argv, message", [
    (["--compile", "default", "--warmup-steps", "0"],
     "--compile default needs --warmup-steps >= 1 (the first step compiles; it must not be measured)"),
    (["--host-syncs", "minimal", "--amp", "fp16", "--optimizer-impl", "foreach", "--device", "cuda"],
     "--host-syncs minimal with --amp fp16 needs --optimizer-impl fused"),
    (["--cuda-graphs", "--amp", "bf16", "--warmup-steps", "5"], "--cuda-graphs needs --optimizer-impl fused"),
    (["--cuda-graphs", "--optimizer-impl", "fused", "--compile", "reduce-overhead", "--warmup-steps", "5"],
     "--cuda-graphs with --compile reduce-overhead: that mode captures CUDA graphs itself"),
    (["--cuda-graphs", "--optimizer-impl", "fused", "--warmup-steps", "3"], "--cuda-graphs needs --warmup-steps > 3"),
    (["--cuda-graphs", "--optimizer-impl", "fused", "--warmup-steps", "5"], "--cuda-graphs needs --device cuda"),
    (["--cuda-graphs", "--optimizer-impl", "fused", "--warmup-steps", "5", "--device", "cuda", "--profile-steps", "2"],
     "--cuda-graphs with --profile-steps"),
    (["--compile", "fast"], "argument --compile: invalid choice: 'fast'"),
    (["--optimizer-impl", "apex"], "argument --optimizer-impl: invalid choice: 'apex'"),
])
def test_combinations_that_cannot_run_are_refused_naming_the_flag(argv, message):
    with pytest.raises(ConfigError) as refused:
        config(*argv)
    assert str(refused.value).startswith(message), str(refused.value)


def test_the_paper_stacks_torch_refuses_what_it_lacks_and_runs_foreach_through_its_multi_tensor_sgd():
    refusals = {options: torch_refusal(config(*options), TORCH_1_11) for options in (
        ("--compile", "default", "--warmup-steps", "1"), ("--optimizer-impl", "fused"), ("--optimizer-impl", "foreach"),
        ())}
    assert refusals == {("--compile", "default", "--warmup-steps", "1"): "--compile needs torch >= 2.0 (this image "
                                                                          "has 1.11.0)",
                        ("--optimizer-impl", "fused"): "--optimizer-impl fused needs torch >= 2.3 (this image has 1.11.0)",
                        ("--optimizer-impl", "foreach"): None, (): None}
    graphs = dataclasses.replace(TrainConfig(), cuda_graphs=True, optimizer_impl="fused")
    older = TORCH_1_11._replace(version="2.3.0", compile=True, sgd_options=("foreach", "fused"))
    assert torch_refusal(graphs, older) == ("--cuda-graphs needs a fused SGD that reads the LR from a device tensor "
                                            "(aten::_fused_sgd_.tensor_lr), which torch 2.3.0 lacks")
    here = TorchFeatures.of_this_torch()  # this image's torch has all of them
    assert (here.compile, here.sgd_options, here.fused_tensor_lr) == (True, ("foreach", "fused"), True)
    assert torch_refusal(graphs, here) is None


def test_an_option_this_torch_lacks_is_one_line_exit_2_and_nothing_written(tmp_path):
    """Through the real trainer: --cuda-graphs with --device auto passes the flag checks on this CPU-only machine and
    is refused once the device is known."""
    metrics = tmp_path / "run" / "metrics.jsonl"
    argv = [a for a in TINY if a not in ("--device", "cpu")] + ["--cuda-graphs", "--optimizer-impl", "fused",
                                                              "--steps", "6", "--warmup-steps", "4"]
    result = run_trainer(argv + ["--metrics", str(metrics)], timeout=300)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "train: error: --cuda-graphs needs a CUDA device"]
    assert not metrics.parent.exists()


def test_optimizer_implementations_and_minimal_host_syncs_train_alike_and_are_recorded(tmp_path):
    """foreach, fused and minimal host syncs change how a step runs, not what it computes: on the CPU the losses and
    the parameters equal the default run's bit for bit; the header records each option (config) and what it did
    (framework_settings)."""
    runs = {name: train(tmp_path / name, *options) for name, options in (
        ("default", ()), ("foreach", ("--optimizer-impl", "foreach")),
        ("fused minimal", ("--optimizer-impl", "fused", "--host-syncs", "minimal")))}
    reference = runs["default"]
    for name, run in runs.items():
        assert [e["loss"] for e in run.epochs] == [e["loss"] for e in reference.epochs], name
        assert run.end["param_digests"] == reference.end["param_digests"], name
    assert workload_flags(runs["fused minimal"].header["config"]) == "--optimizer-impl fused --host-syncs minimal"
    assert workload_flags(reference.header["config"]) == ""
    assert [run.header["framework_settings"]["sgd"] for run in runs.values()] == ["for-loop", "foreach", "fused"]
    assert all(run.header["framework_settings"]["compiled"] is None for run in runs.values())
    # no compile, no figures of it; the sync check is a CUDA one
    assert not any(key in e for run in runs.values() for e in run.epochs
                   for key in ("compile_s", "graphs_compiled_after_warmup", "step_host_syncs"))


@pytest.mark.parametrize("host_syncs", ["default", "minimal"])
def test_a_diverging_run_stops_at_the_same_stop_check_with_either_host_sync_mode(host_syncs, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = run_trainer(TINY + ["--steps", "30", "--steps-per-epoch", "30", "--lr", "1e12", "--max-nonfinite-steps",
                                 "3", "--host-syncs", host_syncs, "--metrics", str(metrics)], timeout=300)
    assert result.returncode == 65, result.stderr[-2000:]
    end = read_metrics(str(metrics)).end
    assert end["status"] == "diverged" and "(by step 10)" in end["reason"]


@pytest.mark.slow  # ~30-60 s: inductor compiles ResNet-18's forward and backward (cold cache: minutes)
def test_a_compiled_run_records_its_compile_time_apart_from_the_measured_steps(tmp_path):
    run = train(tmp_path, "--compile", "default", "--optimizer-impl", "fused")
    first, second = run.epochs
    assert run.header["config"]["compile"] == "default"
    assert run.header["framework_settings"]["compiled"] == "torch.compile(ResNet, mode=default)"
    assert first["compile_s"] > 0 and "compile_s" not in second  # the first step's, in the epoch it ran in
    assert first["graphs_compiled_after_warmup"] == second["graphs_compiled_after_warmup"] == 0
    assert (first["measured_steps"], second["measured_steps"]) == (4, 6)  # the compiling first step is not measured


@pytest.mark.slow  # ~40-90 s: two ranks each compile on a 2-core machine
def test_two_ddp_ranks_compiled_with_the_foreach_optimizer_train_identically(tmp_path):
    """torch.compile of DDP's wrapper (dynamo splits the graph at DDP's buckets), the profiled steps under DDP's
    no_sync included: no graph is compiled after the warm-up steps, and the ranks' parameters agree."""
    run = train(tmp_path, "--compile", "default", "--optimizer-impl", "foreach", "--profile-steps", "2", nproc=2)
    assert run.header["world_size"] == 2 and run.status == "ok"
    digests = run.end["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert run.header["framework_settings"]["compiled"] == "torch.compile(DistributedDataParallel, mode=default)"
    assert run.header["framework_settings"]["sgd"] == "foreach"
    assert [e["graphs_compiled_after_warmup"] for e in run.epochs] == [0, 0]
    assert [p["steps"] for p in run.profiles] == [2]


LOSSES = [2.5, float("nan"), float("inf"), 1.5, float("nan"), float("nan"), float("-inf"), 0.5]


@pytest.mark.parametrize("max_nonfinite, diverged", [(3, True), (4, False)])
def test_both_loss_keepers_count_the_same_sum_and_consecutive_non_finite_losses(max_nonfinite, diverged):
    """HostLosses (read at the stop checks) and DeviceLosses (on the device each step) agree on the epoch's sum and on
    divergence: the longest run of consecutive non-finite losses here is 3, split by a finite one before it."""
    kept = {keeper: keeper(torch.device("cpu"), max_nonfinite) for keeper in (DeviceLosses, HostLosses)}
    for keeper in kept.values():
        keeper.new_epoch()
        for i, loss in enumerate(LOSSES):
            keeper.add(torch.tensor(loss))
            if i == 3:
                keeper.settle()  # a stop check in between
    sums = [keeper.epoch_sum() for keeper in kept.values()]
    assert all(math.isnan(s) for s in sums)
    assert [keeper.diverged_flag().tolist() for keeper in kept.values()] == [[float(diverged)]] * 2
    for keeper in kept.values():
        keeper.new_epoch()
        keeper.add(torch.tensor(1.25))
    assert [keeper.epoch_sum() for keeper in kept.values()] == [1.25, 1.25]


def test_only_a_synchronising_call_counts_as_a_host_sync_not_the_warning_that_turns_the_debug_mode_on():
    """torch's warnings as an H100 run gave them (torch 2.11): turning the sync debug mode on warns that it is a
    prototype, which step_host_syncs recorded as a sync (a step with none read as one with one)."""
    def warning(message, filename):
        return warnings.WarningMessage(UserWarning(message), UserWarning, filename, 1270)

    caught = [warning("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
                      "operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)",
                      "/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/__init__.py"),
              warning("called a synchronizing CUDA operation (Triggered internally at "
                      "/pytorch/c10/cuda/CUDAFunctions.cpp:178.)", "/work/dlaunch/train/loop.py")]
    assert host_syncs_of(caught[:1]) == []
    assert host_syncs_of(caught) == ["loop.py:1270: called a synchronizing CUDA operation (Triggered internally at "
                                     "/pytorch/c10/cuda/CUDAFunctions.cpp:178.)"]


def uninitialised_memory_as_nan(monkeypatch):
    """torch.empty_like's memory holds what it held before (junk on this CPU, NaN on the H100 run that diverged):
    forced to NaN here, so that a buffer left uninitialised shows in every run."""
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: empty_like(t, **kw).fill_(math.nan))


def test_the_fused_sgd_skips_an_overflowing_first_step_as_the_foreach_sgd_does(monkeypatch):
    """fp16's loss scale starts at 65,536, so a first step often overflows and GradScaler skips it. torch's fused
    SGD (which skips on the device) left the momentum buffers it made in that step uninitialised: NaN weights one
    step later (ResNet-50 on an H100). Here the first and third steps overflow: the fused SGD's weights follow the
    foreach SGD's."""
    uninitialised_memory_as_nan(monkeypatch)

    def train(impl):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        initial = [p.detach().clone() for p in model.parameters()]
        optimizer = build_optimizer(model, dataclasses.replace(TrainConfig(), optimizer_impl=impl))
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
        inputs = torch.randn(16, 8)
        for step in range(4):
            scale = math.inf if step in (0, 2) else 1.0
            loss = model(inputs).square().mean() * scale
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if step == 0:  # skipped: the weights untouched
                assert scaler.get_scale() == 2.0 ** 15
                assert all(torch.equal(a, b) for a, b in zip(initial, model.parameters()))
        final = [p.detach() for p in model.parameters()]
        assert not any(torch.equal(a, b) for a, b in zip(initial, final)), "the two finite steps moved every weight"
        return final

    fused, foreach = train("fused"), train("foreach")
    assert all(torch.isfinite(p).all() for p in fused)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(fused, foreach))


def test_the_fused_sgds_zero_momentum_follows_masters_swapped_in_and_groups_stepped_one_at_a_time(monkeypatch):
    """DeepSpeed's fp16 and ZeRO optimizers put fp32 master copies in the groups after build_optimizer, and ZeRO
    steps one group at a time (param_groups set to that group alone): each group's masters get zero buffers before
    their first step, which overflows and is skipped here (state kept for the swapped-out parameters made
    state_dict fail with a KeyError)."""
    uninitialised_memory_as_nan(monkeypatch)
    model = torch.nn.Linear(3, 2)
    optimizer = build_optimizer(model, dataclasses.replace(TrainConfig(), optimizer_impl="fused", weight_decay=0.0))
    for group in optimizer.param_groups:
        group["params"] = [p.detach().clone().requires_grad_() for p in group["params"]]
    masters = [p for group in optimizer.param_groups for p in group["params"]]
    initial = [p.detach().clone() for p in masters]
    for master in masters:
        master.grad = torch.ones_like(master)

    def step_group_by_group(overflowed):
        groups = optimizer.param_groups
        for group in groups:
            optimizer.param_groups = [group]
            optimizer.found_inf = torch.tensor(float(overflowed))  # what GradScaler hands a fused optimizer
            optimizer.step()
        optimizer.param_groups = groups

    step_group_by_group(overflowed=True)
    assert all(torch.equal(p, p0) for p, p0 in zip(masters, initial))
    step_group_by_group(overflowed=False)  # the first update: momentum = the gradient, 1
    lr = optimizer.param_groups[0]["lr"]
    assert all(torch.allclose(p, p0 - lr) for p, p0 in zip(masters, initial))
    assert set(optimizer.state) == set(masters)
    assert len(optimizer.state_dict()["state"]) == len(masters)


def test_the_fused_sgd_follows_a_device_tensor_lr_that_is_filled_each_step_and_survives_a_checkpoint_load():
    """--cuda-graphs' LR: one tensor in every parameter group, read by the fused SGD's step (here on the CPU); filling
    it changes the next update without touching the groups, and a loaded optimizer state gets it back."""
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)  # updates of 0.5 and 0.25 from 0 are exact in float32
    optimizer = build_optimizer(model, dataclasses.replace(TrainConfig(), optimizer_impl="fused", momentum=0.0,
                                                           weight_decay=0.0))
    lr = LearningRate(torch.device("cpu"))

    def update(value):
        before = model.weight.detach().clone()
        lr.set(optimizer.param_groups, value)
        model.weight.grad = torch.ones_like(model.weight)
        optimizer.step()
        return (before - model.weight.detach()).tolist()

    assert update(0.5) == [[0.5, 0.5]]
    assert all(group["lr"] is lr.tensor for group in optimizer.param_groups)
    saved = optimizer.state_dict()
    for group in saved["param_groups"]:
        group["lr"] = 0.125  # as an eager run's checkpoint holds it
    optimizer.load_state_dict(saved)
    assert update(0.25) == [[0.25, 0.25]] and optimizer.param_groups[0]["lr"] is lr.tensor


def test_the_workload_fields_of_an_epoch_record_are_checked_when_read(tmp_path):
    """compile_s and graphs_compiled_after_warmup are figures like the others: a negative one is refused."""
    from dlaunch.train.metrics_schema import MetricsError, check_bounds, make_record, validate_record

    record = make_record("epoch", 1.0, epoch=0, steps=4, images=8, images_per_s=2.0, epoch_time_s=4.0, data_wait_s=0.0,
                         loss=1.0, lr=0.1, compile_s=1.5, graphs_compiled_after_warmup=0, step_host_syncs=[])
    validate_record(record)
    check_bounds(record)
    for field, bad in (("compile_s", -1.0), ("graphs_compiled_after_warmup", -1), ("compile_s", "1.5")):
        with pytest.raises(MetricsError, match=field):
            bad_record = dict(record, **{field: bad})
            validate_record(bad_record)
            check_bounds(bad_record)
