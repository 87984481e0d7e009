"""dlaunch/train/energy.py: each source against the real interface where this machine has it (it has no
GPU, no readable RAPL, no HPE Cray counters: then the reason is tested), and the parsing of
sysfs-style files written by the test. NVML, amdsmi and rocm-smi counters, which cannot exist here,
are fed by fakes named as such (NVML's: tests/fake_nvml.py). The all-rank sum runs on two real gloo ranks."""
import os
import socket
import stat
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from fake_nvml import FakeNvml
from helpers_train import REPO, TINY, assert_ok, run_trainer
from dlaunch.train.energy import (NOT_LEADER, AmdSmiGpu, CrayNodeCounter, EnergyMeter, NvmlGpu, RaplCounter, RocmSmiGpu,
                          Unavailable, probe_sources)
from dlaunch.train.metrics_schema import ENERGY_DOMAINS, UNAVAILABLE, read_metrics

CPU = torch.device("cpu")


def write_rapl_zone(path, name, energy_uj, max_uj=1_000_000_000):
    os.makedirs(path, exist_ok=True)
    for field, value in (("name", name), ("energy_uj", energy_uj), ("max_energy_range_uj", max_uj)):
        with open(os.path.join(path, field), "w") as f:
            f.write("%s\n" % value)


def write_rapl_tree(root, package_uj=(1_000_000, 2_000_000), dram_uj=(500_000, 700_000)):
    """Two packages, each with a core and a dram sub-zone, like /sys/class/powercap on a 2-socket node."""
    for i, (package, dram) in enumerate(zip(package_uj, dram_uj)):
        write_rapl_zone(root / ("intel-rapl:%d" % i), "package-%d" % i, package)
        write_rapl_zone(root / ("intel-rapl:%d:0" % i), "core", 1)
        write_rapl_zone(root / ("intel-rapl:%d:1" % i), "dram", dram)


# -- real interfaces of this machine ---------------------------------------------------------------

def test_nvml_on_this_machine_says_why_it_is_unavailable():
    with pytest.raises(Unavailable) as why:
        NvmlGpu(0)
    assert str(why.value) in ("nvidia-ml-py not installed", "NVML: NVML Shared Library Not Found")


def test_amd_sources_on_this_machine_say_why_they_are_unavailable():
    with pytest.raises(Unavailable, match="amdsmi not installed"):
        AmdSmiGpu(0)
    with pytest.raises(Unavailable, match="rocm-smi not found"):
        RocmSmiGpu(0, command="rocm-smi-is-not-installed-here")


@pytest.mark.skipif(os.path.exists("/sys/class/powercap/intel-rapl:0/energy_uj"), reason="this machine has RAPL")
def test_rapl_on_this_machine_says_why_it_is_unavailable():
    if os.path.isdir("/sys/class/powercap/intel-rapl:0"):
        pytest.skip("RAPL zones exist here (the next test reads them)")
    with pytest.raises(Unavailable, match="no RAPL zones in /sys/class/powercap"):
        RaplCounter("cpu")


def test_rapl_on_this_machine_when_readable():
    try:
        counter = RaplCounter("cpu")
    except Unavailable as e:
        pytest.skip("RAPL here: %s" % e)
    sum(range(10 ** 6))
    assert counter.update() > 0


@pytest.mark.skipif(os.path.exists("/sys/cray/pm_counters"), reason="this is an HPE Cray node")
def test_cray_counters_on_this_machine_say_why_they_are_unavailable():
    with pytest.raises(Unavailable, match="not an HPE Cray node"):
        CrayNodeCounter()


def test_probe_on_this_cpu_machine_names_a_reason_for_every_domain():
    leader = probe_sources(CPU, node_leader=True)
    assert sorted(leader) == sorted(ENERGY_DOMAINS)
    assert leader["gpu"] == UNAVAILABLE + "this run uses no GPU (device cpu)"
    follower = probe_sources(CPU, node_leader=False)
    assert follower["cpu"] == follower["dram"] == follower["node"] == NOT_LEADER


# -- sysfs-style files written by the test -----------------------------------------------------------

def test_rapl_parses_sysfs_files_written_by_the_test(tmp_path):
    write_rapl_tree(tmp_path)
    cpu, dram = RaplCounter("cpu", root=str(tmp_path)), RaplCounter("dram", root=str(tmp_path))
    assert cpu.description == "RAPL cpu (intel-rapl:0, intel-rapl:1)"
    assert dram.description == "RAPL dram (intel-rapl:0:1, intel-rapl:1:1)"
    write_rapl_zone(tmp_path / "intel-rapl:0", "package-0", 4_000_000)  # +3 J
    write_rapl_zone(tmp_path / "intel-rapl:1:1", "dram", 950_000)  # +0.25 J
    assert cpu.update() == pytest.approx(3.0)
    assert dram.update() == pytest.approx(0.25)


def test_rapl_follows_a_wrapping_counter_in_sysfs_files_written_by_the_test(tmp_path):
    write_rapl_zone(tmp_path / "intel-rapl:0", "package-0", 900_000, max_uj=1_000_000)
    counter = RaplCounter("cpu", root=str(tmp_path))
    write_rapl_zone(tmp_path / "intel-rapl:0", "package-0", 100_000, max_uj=1_000_000)  # wrapped: +0.2 J
    assert counter.update() == pytest.approx(0.2)
    write_rapl_zone(tmp_path / "intel-rapl:0", "package-0", 600_000, max_uj=1_000_000)
    assert counter.update() == pytest.approx(0.7)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_rapl_unreadable_sysfs_file_written_by_the_test_is_a_reason(tmp_path):
    write_rapl_tree(tmp_path)
    os.chmod(tmp_path / "intel-rapl:0" / "energy_uj", 0)
    with pytest.raises(Unavailable, match="energy_uj: Permission denied"):
        RaplCounter("cpu", root=str(tmp_path))


def test_rapl_without_dram_zone_in_files_written_by_the_test(tmp_path):
    write_rapl_zone(tmp_path / "intel-rapl:0", "package-0", 1)
    with pytest.raises(Unavailable, match="no RAPL dram zone"):
        RaplCounter("dram", root=str(tmp_path))


def test_cray_parses_pm_counters_files_written_by_the_test(tmp_path):
    (tmp_path / "energy").write_text("123456 J\n")
    counter = CrayNodeCounter(root=str(tmp_path))
    (tmp_path / "energy").write_text("123500 J\n")
    assert counter.update() == 44.0
    (tmp_path / "energy").write_text("garbage\n")
    with pytest.raises(Unavailable, match="cannot parse 'garbage'"):
        counter.update()


# -- fakes for the GPU libraries that cannot exist here ------------------------------------------------

def test_nvml_counter_in_millijoules_with_a_fake_nvml(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    nvml = FakeNvml()
    gpu = NvmlGpu(1, nvml=nvml)
    assert nvml.by == [("index", 3)]  # torch's device 1 is the node's GPU 3
    assert gpu.description == "NVML total-energy counter of Fake H100"
    nvml.mj += 2_500
    assert gpu.update() == 2.5 and gpu.utilization_pct() == 87.0


def test_nvml_errors_become_reasons_with_a_fake_nvml():
    nvml = FakeNvml()

    def unsupported(handle):
        raise nvml.NVMLError("Not Supported")
    nvml.nvmlDeviceGetTotalEnergyConsumption = unsupported
    with pytest.raises(Unavailable, match="NVML: Not Supported"):
        NvmlGpu(0, nvml=nvml)


@pytest.mark.parametrize("key", ["energy_accumulator", "power"])  # amdsmi >= 6.2.1, and before
def test_amdsmi_accumulator_times_resolution_with_a_fake_amdsmi(key):
    counts = {key: 1000, "counter_resolution": 15.3, "timestamp": 0}
    fake = SimpleNamespace(AmdSmiException=RuntimeError, amdsmi_init=lambda: None,
                           amdsmi_get_processor_handles=lambda: ["h0", "h1"],
                           amdsmi_get_energy_count=lambda h: dict(counts),
                           amdsmi_get_gpu_activity=lambda h: {"gfx_activity": 55})
    gpu = AmdSmiGpu(1, amdsmi=fake)
    counts[key] += 2000
    assert gpu.update() == pytest.approx(2000 * 15.3 / 1e6)
    assert gpu.utilization_pct() == 55.0


def test_rocm_smi_json_with_a_fake_rocm_smi_command(tmp_path):
    fake = tmp_path / "fake-rocm-smi"
    state = tmp_path / "uj"
    state.write_text("1000000")
    fake.write_text(textwrap.dedent("""\
        #!/bin/sh
        case "$3" in
          --showenergycounter) echo '{"card0": {"Energy counter": "65", "Accumulated Energy (uJ)": "'$(cat %s)'"}}';;
          --showuse) echo '{"card0": {"GPU use (%%)": "42"}}';;
        esac
        """ % state))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    gpu = RocmSmiGpu(0, command=str(fake))
    state.write_text("4000000")
    assert gpu.update() == 3.0 and gpu.utilization_pct() == 42.0


# -- the meter: figures summed over ranks ---------------------------------------------------------------

def test_meter_reports_unavailable_never_zero_in_one_process():
    meter = EnergyMeter.for_rank(CPU, rank=0, world_size=1, local_rank=0)
    reading = meter.reduce(lambda t: t.clone())
    assert all(v.startswith(UNAVAILABLE) for v in reading.energy_j.values())
    assert reading.utilization_pct == reading.memory_peak_bytes == UNAVAILABLE + "this run uses no GPU (device cpu)"


def test_meter_names_ranks_that_did_not_measure():
    """Summed vector of 2 node leaders where only the other node read RAPL: not a partial sum."""
    meter = EnergyMeter({"gpu": UNAVAILABLE + "x", "cpu": UNAVAILABLE + "no RAPL zones", "dram": UNAVAILABLE + "y",
                         "node": UNAVAILABLE + "z"}, CPU, rank=0, world_size=2, node_leader=True)
    other = [0.0] * len(meter.local_vector())
    other[3:6] = [7.0, 1.0, 1.0]  # cpu: 7 J, measured, expected
    summed = [a + b for a, b in zip(meter.local_vector(), other)]
    assert meter.interpret(summed).energy_j["cpu"] == UNAVAILABLE + "no RAPL zones"


RANK_SCRIPT = """
import os, sys
sys.path.insert(0, %(repo)r)
import torch
from dlaunch.train.config import parse_config
from dlaunch.train.energy import EnergyMeter, RaplCounter
from dlaunch.train.frameworks.ddp import DDP

fw = DDP()
dist = fw.init(parse_config(["--device", "cpu"]))  # the trainer's own config, every field set
root = os.path.join(%(tmp)r, "node%%d" %% dist.rank)
meter = EnergyMeter({"gpu": "unavailable: cpu", "cpu": RaplCounter("cpu", root=root), "dram": "unavailable: -",
                     "node": "unavailable: -"}, torch.device("cpu"), dist.rank, dist.world_size, node_leader=True)
with open(os.path.join(root, "intel-rapl:0", "energy_uj"), "w") as f:
    f.write("%%d\\n" %% (1_000_000 + (dist.rank + 1) * 2_000_000))  # rank 0: +2 J, rank 1: +4 J
reading = meter.reduce(fw.all_reduce_sum)
print("cpu", reading.energy_j["cpu"])
fw.shutdown()
"""


@pytest.mark.slow
def test_two_gloo_ranks_sum_rapl_files_written_by_the_test_with_one_collective(tmp_path):
    """Each rank plays the leader of its own node, with its own RAPL tree written by the test."""
    for rank in (0, 1):
        write_rapl_zone(tmp_path / ("node%d" % rank) / "intel-rapl:0", "package-0", 1_000_000)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT % {"repo": REPO, "tmp": str(tmp_path)})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in (0, 1)]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
        assert out.strip() == "cpu 6.0"  # 2 J + 4 J, on every rank


@pytest.mark.slow
def test_two_process_run_writes_energy_fields_in_header_epochs_and_end(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert_ok(run_trainer(TINY + ["--num-classes", "5", "--steps", "4", "--steps-per-epoch", "2",
                                  "--metrics", str(metrics)], nproc=2, timeout=300))
    m = read_metrics(str(metrics))  # schema-valid: every figure a number or "unavailable: <reason>"
    assert m.header["version"] >= 2 and sorted(m.header["energy_sources"]) == sorted(ENERGY_DOMAINS)
    for record in m.epochs + [m.end]:
        assert sorted(record["energy_j"]) == sorted(ENERGY_DOMAINS)
        assert all(isinstance(v, float) or v.startswith(UNAVAILABLE) for v in record["energy_j"].values())
    assert [e["gpu_utilization_pct"] for e in m.epochs] == [UNAVAILABLE + "this run uses no GPU (device cpu)"] * 2
    assert "energy_to_accuracy_j" in m.end and m.end["status"] == "ok"


# -- Slurm's figure: sacct output written by the test (a fake sacct) -----------------------------------

@pytest.mark.parametrize("output, expected", [
    ("4711|1830421\n", 1830421.0),  # ConsumedEnergyRaw
    ("4711|1.83M\n4711.batch|1.20M\n", 1.83e6),  # ConsumedEnergy with its unit prefix (steps of 1000)
    ("4711.batch|5\n4711|12K\n", 12e3),  # the allocation's line, wherever it is
    ("4711|0\n", "unavailable: Slurm recorded no energy (no AcctGatherEnergyType plugin on the nodes?)"),
    ("4711|\n", "unavailable: sacct gave ConsumedEnergy ''"),
    ("4711|12X\n", "unavailable: sacct gave ConsumedEnergy '12X'"),
    ("", "unavailable: sacct knows no job 4711"),
])
def test_consumed_energy_parses_fake_sacct_output(output, expected):
    from dlaunch.schedulers.slurm import parse_consumed_energy
    assert parse_consumed_energy(output, "4711") == expected


def test_slurm_job_energy_runs_sacct_and_turns_failures_into_reasons(tmp_path):
    """The Slurm backend's accounting query against fake sacct commands (no accounting database here)."""
    from dlaunch.schedulers.slurm import Slurm, sacct_energy_command

    def slurm_with_sacct(body: str) -> Slurm:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "sacct").write_text('#!/bin/bash\necho "$*" > %s/argv\n%s\n' % (folder, body))
        (folder / "sacct").chmod(0o755)
        return Slurm(environ=dict(os.environ, PATH="%s:/usr/bin:/bin" % folder))

    working = slurm_with_sacct('echo "42|7200"')
    assert working.job_energy("42") == 7200.0
    assert (tmp_path / "0" / "argv").read_text().split() == sacct_energy_command("42")[1:]
    failing = slurm_with_sacct('echo "sacct: error: Problem talking to the database" >&2; exit 1')
    assert failing.job_energy("42") == "unavailable: sacct: sacct: error: Problem talking to the database"
    missing = Slurm(environ=dict(os.environ, PATH=str(tmp_path / "empty")))
    assert missing.job_energy("42").startswith("unavailable: sacct: command not found")
