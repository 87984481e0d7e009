"""Per-rank step phases, epoch overhead and GPU health (metrics version 4: dlaunch/train/phases.py,
dlaunch/train/gpuhealth.py): the pure per-node summary, the schema's checks, the step timer on real autograd,
GPU health through a fake NVML (tests/fake_nvml.py: no GPU here), and real gloo runs of the trainer, one of them
with a rank slowed from outside by a cgroup v1 CPU quota."""
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from fake_nvml import FakeNvml
from helpers_train import REPO, TINY, assert_ok, run_trainer, trainer_env
from holds import Hold
from prerequisites import require
from slurm import cpu_cgroup
from dlaunch.train.gpuhealth import NO_GPU, GpuHealth, node_health, throttle_names
from dlaunch.train.metrics_schema import (OVERHEAD_FIELDS, STEP_PHASES, UNAVAILABLE, VERSION, MetricsError, check_bounds,
                                          make_record, read_metrics)
from dlaunch.train.phases import ROW, StepTimer, overhead_fields, phase_fields, rank_row

CPU = torch.device("cpu")
NO_GPU_HEALTH = [float(NO_GPU), 0.0, 0.0, 0.0, 0.0]
OVERHEAD = {"loader_start_s": 0.5, "validation_s": 2.0, "checkpoint_s": 1.0, "barrier_s": 0.25, "metrics_s": 0.125}


def row(compute_s, local_rank=0, steps=10, health=NO_GPU_HEALTH, overhead=OVERHEAD):
    """A rank's ROW: data 0.01, sync 0.02, optimizer 0.005, other 0.001 s per step, and `compute_s`, a third of
    it in forward."""
    step = 0.01 + compute_s + 0.02 + 0.005 + 0.001
    return rank_row([float(steps), 0.01, compute_s / 3, compute_s, 0.02, 0.005, 0.001, step], local_rank, overhead, health)


def epoch_record(**fields):
    """A valid version 4 epoch record with `fields` (validated by make_record)."""
    base = dict(epoch=1, steps=10, images=80, images_per_s=100.0, epoch_time_s=1.0, data_wait_s=0.0, loss=1.0, lr=0.1)
    return make_record("epoch", 1.0, **dict(base, **fields))


# -- the pure summary: every rank's row + hosts -> phases and nodes ------------------------------------------------

def test_rows_of_four_ranks_on_two_nodes_give_medians_the_slowest_rank_and_one_entry_per_node():
    hosts = ["n1", "n1", "n2", "n2"]
    rows = [row(0.10, 0), row(0.12, 1), row(0.30, 0), row(0.11, 1)]
    fields = phase_fields(rows, hosts)
    phases = fields["phases"]
    assert (phases["method"], phases["steps"], phases["ranks"]) == ("rank-timers-median-rank", 10, 4)
    assert phases["median"]["compute_s"] == pytest.approx(0.11)  # the median rank (median_low of the forward passes): rank 3
    assert phases["median"]["sync_s"] == pytest.approx(0.02)
    assert phases["median"]["step_s"] == pytest.approx(0.036 + 0.11)
    slowest = phases["slowest"]
    assert (slowest["rank"], slowest["host"], slowest["local_rank"], slowest["compute_s"]) == (2, "n2", 0, 0.30)
    assert set(slowest) == {"rank", "host", "local_rank"} | set(STEP_PHASES)
    assert [n["host"] for n in fields["nodes"]] == ["n1", "n2"]
    n1, n2 = fields["nodes"]
    assert (n1["ranks"], n1["median_compute_s"], n1["median_forward_s"]) == (2, pytest.approx(0.10), pytest.approx(0.10 / 3))
    assert n1["slowest"] == {"rank": 1, "local_rank": 1, "compute_s": 0.12, "forward_s": pytest.approx(0.04)}
    assert n2["median_compute_s"] == pytest.approx(0.11)
    assert n2["slowest"] == {"rank": 2, "local_rank": 0, "compute_s": 0.30, "forward_s": pytest.approx(0.10)}
    assert n1["gpu"] == n2["gpu"] == UNAVAILABLE + "this run uses no GPU"
    epoch_record(**fields)  # the schema accepts what the summary writes


def test_nodes_come_in_order_of_first_rank_and_a_tie_names_the_lower_rank():
    fields = phase_fields([row(0.2, 0), row(0.1, 0), row(0.2, 1), row(0.1, 1)], ["b", "a", "b", "a"])
    assert [(n["host"], n["slowest"]["rank"]) for n in fields["nodes"]] == [("b", 0), ("a", 1)]
    assert fields["phases"]["slowest"]["rank"] == 0


def test_no_phases_when_a_rank_timed_no_step():
    assert phase_fields([row(0.1), row(0.0, steps=0)], ["a", "b"]) == {}


def test_overhead_is_rank_0s_row_with_the_gather_added_to_metrics_and_its_total():
    overhead = overhead_fields(row(0.1), more_metrics_s=0.375)
    assert overhead == {"loader_start_s": 0.5, "validation_s": 2.0, "checkpoint_s": 1.0, "barrier_s": 0.25,
                        "metrics_s": 0.5, "total_s": 4.25}
    assert tuple(overhead) == OVERHEAD_FIELDS
    assert len(row(0.1)) == len(ROW)


# -- the schema: version 4 fields checked, nested numbers finite and >= 0 -------------------------------------------

def test_schema_names_the_nested_field_that_breaks_it():
    good = phase_fields([row(0.1), row(0.2)], ["a", "b"])
    record = epoch_record(overhead=overhead_fields(row(0.1), 0.0), measured_steps=8, **good)
    assert record["version"] >= 4  # the version 4 fields, in a record of the version written now (5: issue 44)
    broken = json.loads(json.dumps(good))
    del broken["phases"]["median"]["sync_s"]
    with pytest.raises(MetricsError, match=r"field phases.median has the keys .*, expected data_s, forward_s, compute_s, sync_s"):
        epoch_record(**broken)
    broken = json.loads(json.dumps(good))
    broken["nodes"][1]["slowest"]["rank"] = "1"
    with pytest.raises(MetricsError, match=r"field nodes\[1\].slowest.rank is '1', expected int"):
        epoch_record(**broken)
    with pytest.raises(MetricsError, match="field nodes.0..gpu.throttle.0. is 'hot', expected one of power cap"):
        epoch_record(nodes=[dict(good["nodes"][0], gpu={"sm_clock_mhz": 1.0, "sm_clock_max_mhz": 2.0, "local_rank": 0,
                                                         "throttle": ["hot"], "temperature_c": 50})])
    with pytest.raises(MetricsError, match="field 'measured_steps' has type float"):
        epoch_record(measured_steps=8.0)


@pytest.mark.parametrize("path, value", [(("overhead", "barrier_s"), -0.5), (("phases", "median", "compute_s"), float("nan")),
                                         (("phases", "slowest", "step_s"), float("inf"))])
def test_a_negative_or_non_finite_nested_figure_is_refused_by_readers(path, value):
    fields = dict(phase_fields([row(0.1), row(0.2)], ["a", "a"]), overhead=overhead_fields(row(0.1), 0.0))
    target = fields
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    record = epoch_record(**fields)  # the writer never stops a run for a figure it measured
    with pytest.raises(MetricsError, match=r"field '%s' is %r, outside 0\.\." % (".".join(path), value)):
        check_bounds(record)


# -- the step timer on real autograd (CPU: perf_counter marks) -------------------------------------------------------

def timed_step(timer: StepTimer, model: torch.nn.Module, optimizer: torch.optim.Optimizer, timed: bool = True) -> None:
    """One training step as the loop marks it."""
    timer.begin(timed)
    images = torch.randn(2, 3, 32, 32)
    timer.mark("batch")
    optimizer.zero_grad()
    loss = model(images).sum()
    timer.mark("backward_begin")
    loss.backward()
    timer.mark("ready")
    optimizer.step()
    timer.end()


def test_step_timer_times_forward_and_backward_through_hooks_and_ignores_untimed_steps():
    from dlaunch.train.models import build_model
    model = build_model("resnet18", 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    timer = StepTimer(CPU)
    timer.install(model)
    timed_step(timer, model, optimizer, timed=False)  # a warm-up step: hooks fire, nothing is timed
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))  # validation's forward
    assert timer.epoch_means()[0] == 0
    for _ in range(3):
        timed_step(timer, model, optimizer)
    steps, data, forward, compute, sync, optimizer_s, other, step = timer.epoch_means()
    assert steps == 3
    assert 0 < forward < compute and optimizer_s > 0 and data >= 0 and sync >= 0 and other >= 0
    assert data + compute + sync + optimizer_s + other == pytest.approx(step)
    assert timer.epoch_means()[0] == 0  # the next epoch starts from nothing


class FakeCudaMarks:
    """A fake of the CUDA events of dlaunch/train/phases.CudaMarks (no GPU here): marks are done only when the test
    says the device got there, and each mark's time is the number of marks recorded before it."""

    made = 0
    device_done = False

    def __init__(self):
        FakeCudaMarks.made += 1
        self.times = {}

    def mark(self, name):
        self.times[name] = float(len(self.times))

    def clear(self):
        self.times.clear()

    def recorded(self):
        return len(self.times) == 8

    def done(self):
        return FakeCudaMarks.device_done

    def seconds(self, begin, end):
        return self.times[end] - self.times[begin]


def test_device_marks_are_read_once_done_never_waited_for_and_reused_from_a_small_pool():
    FakeCudaMarks.made, FakeCudaMarks.device_done = 0, False
    timer = StepTimer(torch.device("cuda", 0), make_marks=FakeCudaMarks)
    for _ in range(3):  # the host runs ahead of the device: nothing is read, nothing blocks
        timer.begin(True)
        for name in ("batch", "forward_begin", "forward_end", "backward_begin", "last_gradient", "ready"):
            timer.mark(name)
        timer.end()
    assert (len(timer.pending), timer.steps, FakeCudaMarks.made) == (3, 0, 3)
    FakeCudaMarks.device_done = True  # the epoch's closing device sync
    assert timer.epoch_means() == [3, 1, 1, 2, 1, 1, 2, 7]  # steps, data, forward, compute, sync, optimizer, other, step
    for _ in range(5):
        timer.begin(True)
        timer.end()  # a step whose marks are incomplete is not counted
    assert timer.epoch_means()[0] == 0 and FakeCudaMarks.made == 3  # the pool's marks were reused


# -- GPU health through a fake NVML --------------------------------------------------------------------------------

def test_clock_event_bits_name_reasons_and_leave_out_idle_and_clock_settings():
    assert throttle_names(0x4 | 0x20 | 0x40) == ["power cap", "thermal"]
    assert throttle_names(0x8 | 0x80 | 0x10) == ["hardware slowdown", "power brake", "sync boost"]
    assert throttle_names(0x1 | 0x2 | 0x100) == []  # idle, application clocks, display clock


def test_health_of_a_power_capped_fake_gpu_with_an_idle_sample_left_out():
    nvml = FakeNvml(sm_clock_mhz=1095, max_sm_clock_mhz=1410, reasons=0x4, temperature_c=71)
    health = GpuHealth.for_device(torch.device("cuda", 0), nvml=nvml)
    health.sample()  # a stop check
    nvml.sm_clock_mhz, nvml.reasons, nvml.temperature_c = 1200, 0, 75
    health.sample()
    nvml.sm_clock_mhz, nvml.reasons = 210, 0x1  # the epoch's end found the GPU idle
    assert health.end_epoch() == [0.0, (1095 + 1200) / 2, 1410.0, float(0x4 | 0x1), 75.0]
    nvml.sm_clock_mhz, nvml.reasons = 1410, 0
    assert health.end_epoch()[1] == 1410.0  # the next epoch's samples start afresh


def test_older_nvidia_ml_py_names_the_reasons_call_differently():
    nvml = FakeNvml(reasons=0x40, event_reasons=False)
    assert GpuHealth.for_device(torch.device("cuda", 0), nvml=nvml).end_epoch()[3] == float(0x40)


def test_a_node_shows_its_most_throttled_gpu_with_its_own_reasons_and_temperature():
    fast = [0.0, 1400.0, 1410.0, 0.0, 60.0]
    capped = [0.0, 1095.0, 1410.0, float(0x4), 81.0]
    hot = [0.0, 1300.0, 1410.0, float(0x20), 88.0]
    assert node_health([(0, fast), (1, capped), (2, hot)]) == {
        "sm_clock_mhz": 1095.0, "sm_clock_max_mhz": 1410.0, "local_rank": 1, "throttle": ["power cap"],
        "temperature_c": 81.0}
    assert node_health([(0, fast), (1, NO_GPU_HEALTH)]) == UNAVAILABLE + "measured on 1 of 2 GPUs only (this run uses no GPU)"
    hosts = ["n1", "n1", "n1"]
    rows = [row(0.1, r, health=h) for r, h in enumerate((fast, capped, hot))]
    epoch_record(**phase_fields(rows, hosts))  # a measured GPU_HEALTH passes the schema


def test_health_says_why_it_is_unavailable_on_this_machine_and_after_an_nvml_error(capsys):
    assert node_health([(0, GpuHealth.for_device(CPU).end_epoch())]) == UNAVAILABLE + "this run uses no GPU"
    # The real binding here: not installed, or installed without NVIDIA's driver library.
    assert node_health([(0, GpuHealth.for_device(torch.device("cuda", 0)).end_epoch())]) in (
        UNAVAILABLE + "nvidia-ml-py not installed", UNAVAILABLE + "NVML error (the rank's standard error names it)")
    nvml = FakeNvml()
    health = GpuHealth.for_device(torch.device("cuda", 0), nvml=nvml)

    def lost(handle, sensor):
        raise nvml.NVMLError("GPU is lost")
    nvml.nvmlDeviceGetTemperature = lost
    assert node_health([(0, health.end_epoch())]) == UNAVAILABLE + "NVML error (the rank's standard error names it)"
    assert "NVML: GPU is lost" in capsys.readouterr().err


# -- the real trainer: two gloo ranks ------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_rank_run_writes_phases_nodes_and_overhead_with_its_validation_and_checkpoint(tmp_path):
    from dlaunch.train.data.make_folder import make_pattern_folder
    folder = str(tmp_path / "folder")
    make_pattern_folder(folder, classes=2, images_per_class=8, val_per_class=2, size=40)
    metrics_path = tmp_path / "metrics.jsonl"
    args = TINY + ["--num-classes", "2", "--data", folder, "--workers", "1", "--epochs", "2", "--warmup-steps", "1",
                   "--metrics", str(metrics_path), "--checkpoint-dir", str(tmp_path / "ckpt")]
    assert_ok(run_trainer(args, nproc=2, timeout=300))
    metrics = read_metrics(str(metrics_path))  # every record validated, nested figures finite and >= 0
    assert [e["version"] for e in metrics.epochs] == [VERSION, VERSION]
    for epoch in metrics.epochs:
        assert epoch["measured_steps"] * metrics.header["global_batch"] == epoch["images"]
        assert epoch["phases"]["ranks"] == 2 and epoch["phases"]["steps"] == epoch["measured_steps"]
        assert epoch["nodes"] == [dict(epoch["nodes"][0], host=metrics.header["hosts"][0], ranks=2,
                                       gpu=UNAVAILABLE + "this run uses no GPU")]
        overhead = epoch["overhead"]
        # This epoch's validation and checkpoint are in the record: it is written after both.
        assert overhead["validation_s"] > 0 and overhead["checkpoint_s"] > 0 and overhead["barrier_s"] > 0
        assert overhead["total_s"] == pytest.approx(sum(overhead[k] for k in OVERHEAD_FIELDS[:-1]))
        median = epoch["phases"]["median"]
        assert median["compute_s"] > 0 and median["step_s"] >= median["compute_s"]


CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
# The slowed rank: a fifth of one core, granted 1 ms in every 5 ms - shorter than one forward pass (about 9 ms
# here), so every forward pass runs throttled. A 100 ms period let a whole forward pass run at full speed inside
# one period's 20 ms, and the slowed rank's forward came out only 2 % slower (CI, stop 40).
QUOTA_US, PERIOD_US = 1_000, 5_000
FAVOURED_SHARES = 10 * 1024  # the other rank: ten times a process's default weight against other work here


def start_rank(rank: int, host: str, port: int, args, env) -> subprocess.Popen:
    """One trainer rank in its own UTS namespace, so that its host name is `host` (two 'nodes' on one machine)."""
    rank_env = dict(env, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host,
               sys.executable, "-m", "dlaunch.train"] + args
    return subprocess.Popen(command, cwd=REPO, env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_rank_slowed_by_a_cpu_quota_is_the_slowest_rank_and_its_nodes_slowest(tmp_path):
    """Two gloo ranks as two 'nodes'; both hold after epoch 0, then rank 1's process gets a fifth of a core
    (cgroup v1 cpu quota), rank 0's ten times the default CPU weight (so that other work on this shared machine
    cannot slow it to rank 1's pace), and both are released: every step of epoch 1 runs so, and rank 1 computes
    several times longer than rank 0, against a 10 % threshold (no speed figure is asserted)."""
    require(os.geteuid() == 0 and (CGROUP_CPU / "cpu.cfs_quota_us").exists(), "needs root and cgroup v1's cpu controller")
    metrics_path = tmp_path / "metrics.jsonl"
    args = TINY + ["--num-classes", "5", "--steps", "8", "--steps-per-epoch", "4", "--warmup-steps", "1",
                   "--metrics", str(metrics_path)]
    hold = Hold(tmp_path)
    env = trainer_env(hold.env(REPO))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    name = "dlaunch-test-%s" % uuid.uuid4().hex[:8]
    slowed, favoured = CGROUP_CPU / (name + "-slowed"), CGROUP_CPU / (name + "-favoured")
    ranks = [start_rank(0, "node-a", port, args, env), start_rank(1, "node-b", port, args, env)]
    try:
        deadline = time.monotonic() + 120
        while not (metrics_path.exists() and '"type": "epoch"' in metrics_path.read_text()):
            assert time.monotonic() < deadline and all(p.poll() is None for p in ranks), "no epoch 0 record"
            time.sleep(0.2)
        slowed.mkdir()
        (slowed / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (slowed / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
        favoured.mkdir()
        (favoured / "cpu.shares").write_text(str(FAVOURED_SHARES))
        (slowed / "cgroup.procs").write_text(str(ranks[1].pid))  # all its threads
        (favoured / "cgroup.procs").write_text(str(ranks[0].pid))
        assert [cpu_cgroup(Path("/proc/%d/cgroup" % p.pid).read_text()) for p in ranks] \
            == ["/" + favoured.name, "/" + slowed.name]
        hold.release()
        outputs = [p.communicate(timeout=180)[0] for p in ranks]
        assert [p.returncode for p in ranks] == [0, 0], outputs
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
        for cgroup in (slowed, favoured):
            if cgroup.exists():
                cgroup.rmdir()
    metrics = read_metrics(str(metrics_path))
    assert metrics.header["hosts"] == ["node-a", "node-b"]
    slowed = metrics.epochs[1]
    phases, (node_a, node_b) = slowed["phases"], slowed["nodes"]
    assert (phases["slowest"]["rank"], phases["slowest"]["host"], phases["slowest"]["local_rank"]) == (1, "node-b", 0)
    assert (node_a["host"], node_b["host"]) == ("node-a", "node-b")
    assert node_b["slowest"]["rank"] == 1 and node_b["slowest"]["forward_s"] == phases["slowest"]["forward_s"]
    assert node_b["slowest"]["forward_s"] > 1.1 * phases["median"]["forward_s"]  # a straggler by the reader's rule
    assert node_a["slowest"]["forward_s"] == phases["median"]["forward_s"]  # the median rank: of 2 ranks the faster
    assert 0 < phases["median"]["forward_s"] < phases["median"]["compute_s"]
