"""Pre-flight's judgement (dlaunch/train/nodecheck.py) with forced figures: no timing, no GPU. The GPU figures and
NVML's reasons below are fakes (this machine has neither); the CPU check runs for real."""
import json

import pytest

from dlaunch.train import nodecheck
from dlaunch.train.errors import EXIT_TOO_FEW_NODES
from fake_nvml import FakeNvml


def node(host, tflops=100.0, error=1e-4, throttle=(), attempt="7.0", problem=None):
    """A node file as `check` writes it, with one fake GPU's forced figures."""
    device = {"device": "cuda:0", "dtype": "float16", "size": 8192, "tflops": tflops, "relative_error": error,
              "tolerance": nodecheck.TOLERANCE["cuda"], "throttle": list(throttle)}
    return {"schema": nodecheck.NODE_SCHEMA, "version": 1, "host": host, "attempt": attempt,
            "devices": [] if problem else [device], "problem": problem, "time": 0.0}


def test_a_wrong_product_a_slow_gpu_a_hw_slowdown_and_silence_are_each_named_with_figure_and_threshold():
    records = {"n1": node("n1"), "n2": node("n2", error=0.4), "n3": node("n3", tflops=40.0),
               "n4": node("n4", throttle=["power cap", "hardware slowdown"]), "n5": None, "n6": node("n6")}
    record = nodecheck.judge(list(records), records, 2, 0.5, 312.0, "[14] NVIDIA A100 datasheet")
    assert record["chosen"] == []  # 100 < 0.5 x 312: no node reaches the expected rate
    record = nodecheck.judge(list(records), records, 2, 0.5, 150.0, "[14] datasheet")
    why = {left["host"]: left["reasons"] for left in record["left_out"]}
    assert why == {
        "n2": ["GEMM result wrong on cuda:0: relative error 0.4 > 0.02"],
        "n3": ["GEMM rate on cuda:0 40 TFLOP/s < 75 ([14] datasheet)"],
        "n4": ["NVML on cuda:0: hardware slowdown"],  # a power cap under load is not a fault
        "n5": ["no answer: its check wrote no result for this attempt"],
    }
    assert record["enough"] and record["chosen"] == ["n1", "n6"]
    assert record["threshold"] == {"expected_tflops_per_gpu": 150.0, "source": "[14] datasheet", "min_tflops": 75.0,
                                   "min_fraction": 0.5}
    assert record["schema"] == "dlaunch.preflight" and record["version"] == 1


def test_without_an_expected_rate_the_allocation_median_is_the_basis_and_the_record_says_so():
    records = {"n1": node("n1", 100.0), "n2": node("n2", 98.0), "n3": node("n3", 30.0)}
    record = nodecheck.judge(["n1", "n2", "n3"], records, 2, 0.5)
    assert record["threshold"]["median_tflops"] == 98.0 and record["threshold"]["min_tflops"] == 49.0
    assert "median" in record["threshold"]["source"] and record["threshold"]["expected_tflops_per_gpu"] is None
    assert record["chosen"] == ["n1", "n2"] and [n["host"] for n in record["left_out"]] == ["n3"]


def test_spare_healthy_nodes_are_not_left_out_and_a_crashed_check_is_its_nodes_verdict():
    records = {"n1": node("n1", problem="check failed: RuntimeError: CUDA error"), "n2": node("n2"), "n3": node("n3")}
    record = nodecheck.judge(["n1", "n2", "n3"], records, 1, 0.5)
    assert record["chosen"] == ["n2"]  # n3 is healthy and not needed: no reason, not left out
    assert record["left_out"] == [{"host": "n1", "reasons": ["check failed: RuntimeError: CUDA error"]}]


def test_select_reads_this_attempts_files_only_and_exits_with_its_own_code_when_too_few(tmp_path, capsys):
    folder = tmp_path / "preflight"
    folder.mkdir()
    for record in (node("n1"), node("n2", attempt="7.")):  # n2's file is an earlier attempt's
        (folder / ("%s.0.json" % record["host"])).write_text(json.dumps(record))
    argv = ["select", "--dir", str(folder), "--attempt", "7.0", "--hosts", "n1,n2", "--record",
            str(tmp_path / "preflight.json")]
    assert nodecheck.main(argv + ["--nodes", "1"]) == 0
    assert capsys.readouterr().out == "n1\n"
    assert nodecheck.main(argv + ["--nodes", "2"]) == EXIT_TOO_FEW_NODES == 68
    out, err = capsys.readouterr()
    assert out == "" and "n2 left out: no answer" in err and "1 healthy node(s) of the 2 needed" in err
    written = json.loads((tmp_path / "preflight.json").read_text())
    assert not written["enough"] and written["chosen"] == []


def test_select_after_a_hang_leaves_out_the_nodes_it_named_and_only_a_hang_of_this_step_naming_a_node_retries(
        tmp_path, capsys):
    """The job script's retry (dlaunch/jobs/render.py): the nodes the hang record names fail with its reason, the
    choice falls on a healthy node the hang did not name, the record keeps the selection before. A record older than
    the step, or one naming no node, gives no retry: exit 69 (the script then ends with its step's exit), nothing
    written."""
    from dlaunch.train import heartbeat as hb
    from dlaunch.train.watchdog import judge

    folder = tmp_path / "preflight"
    folder.mkdir()
    for record in (node("n1"), node("n2"), node("n3")):
        (folder / ("%s.0.json" % record["host"])).write_text(json.dumps(record))
    chosen = tmp_path / "preflight.json"
    argv = ["select", "--dir", str(folder), "--attempt", "7.0", "--hosts", "n1,n2,n3", "--nodes", "2", "--record",
            str(chosen)]
    assert nodecheck.main(argv) == 0 and capsys.readouterr().out == "n1,n2\n"
    silent = hb.node_record("n2", 2, 990.0, 1.0, [dict(rank=2, local_rank=0, role="worker", pid=7, heartbeat=900.0,
                                                        step=30, step_time=899.0, epoch=1, phase="backward",
                                                        phase_since=899.0, timeout_s=60.0, overdue=False)])
    live = hb.node_record("n1", 0, 999.0, 1.0, [dict(rank=0, local_rank=0, role="worker", pid=8, heartbeat=999.0,
                                                      step=31, step_time=930.0, epoch=1, phase="stop check",
                                                      phase_since=930.0, timeout_s=60.0, overdue=True)])
    hang = dict(judge([silent, live], [0, 2], 1000.0, 30.0, 60.0, {"rank": 0, "host": "n1"}),
                stacks=[], flight_recorder_dumps=[])
    (tmp_path / "hang.json").write_text(json.dumps(hang))
    again = argv + ["--after-hang", str(tmp_path / "hang.json"), "--retry", "1"]
    before = chosen.read_text()
    assert nodecheck.main(again + ["--since", "1000.5"]) == 69  # an earlier step's record
    assert chosen.read_text() == before and "no retry" in capsys.readouterr().err
    assert nodecheck.main(again + ["--since", "950"]) == 0
    assert capsys.readouterr().out == "n1,n3\n"
    record = json.loads(chosen.read_text())
    assert record["retry"] == 1 and record["left_out"] == [
        {"host": "n2", "reasons": ["named by the hang: rank 2 no heartbeat for 100 s, at step 30, phase backward "
                                   "(hang.json)"]}]
    assert [e["chosen"] for e in record["earlier"]] == [["n1", "n2"]]
    nobody = dict(hang, silent=[])
    (tmp_path / "hang.json").write_text(json.dumps(nobody))
    assert nodecheck.main(again + ["--since", "950"]) == 69


@pytest.mark.parametrize("fake, faults", [
    (FakeNvml(), []),
    (FakeNvml(remapped_rows=(3, 1, 1, 0)), ["row remapping pending (1 uncorrectable rows): the GPU needs a reset"]),
    (FakeNvml(remapped_rows=(0, 0, 0, 1), ecc_uncorrected=2),
     ["row remapping failed: the GPU needs repair", "2 uncorrectable ECC error(s) since the driver loaded"]),
    (FakeNvml(remapped_rows=None, pages_pending=1, ecc_uncorrected=None), ["retired pages pending: the GPU needs a reset"]),
    (FakeNvml(remapped_rows=None, pages_pending=None, ecc_uncorrected=None),
     "unavailable: NVML reports neither row remapping, retired pages nor ECC errors for this GPU"),
], ids=["healthy", "remap pending", "remap failed and ECC", "pages pending (V100)", "nothing answered"])
def test_nvml_memory_faults_that_need_a_reset_fail_the_node(fake, faults):
    """FAKE NVML (no GPU here): row remapping pending or failed, retired pages pending, uncorrectable ECC errors: a GPU
    DCGM's diagnostics would call unfit. Its own reason line; a GPU whose NVML answers none of these is not failed."""
    import torch

    from dlaunch.train.gpuhealth import GpuHealth

    health = GpuHealth(fake, 0)
    assert health.memory_faults() == faults
    record = node("n1")
    record["devices"][0]["memory"] = health.memory_faults()
    reasons = nodecheck.node_reasons(record, None, "")
    assert reasons == (["NVML on cuda:0: %s" % "; ".join(faults)] if isinstance(faults, list) and faults else [])
    assert GpuHealth.for_device(torch.device("cpu")).memory_faults() == "unavailable: this run uses no GPU"


def test_check_writes_its_node_file_and_a_broken_gemm_is_caught(tmp_path, monkeypatch):
    record = nodecheck.run_check(str(tmp_path), "1.", "n1", min_seconds=0.0)
    device = record["devices"][0]
    assert device["device"] == "cpu" and device["relative_error"] < device["tolerance"] and device["tflops"] > 0
    assert json.loads((tmp_path / "n1.0.json").read_text())["attempt"] == "1."
    monkeypatch.setattr(nodecheck, "gemm", lambda a, b: (a @ b) * 1.5)  # a device that computes wrong numbers
    broken = nodecheck.run_check(str(tmp_path), "1.", "n1", min_seconds=0.0)
    assert nodecheck.node_reasons(broken, None, "")[0].startswith("GEMM result wrong on cpu: relative error 0.5")


def test_nvml_reasons_seen_while_the_gemm_runs_are_the_gpus_even_when_gone_after_it():
    """A fake NVML (no NVIDIA GPU here) reporting HW slowdown (0x8) and a power cap (0x4) while the GEMM runs (here on
    the CPU), none once it has ended: read only after the GEMM, the slowdown went unseen."""
    import torch

    from dlaunch.train import gpuhealth

    fake = FakeNvml(reasons=0x8 | 0x4)
    health = gpuhealth.GpuHealth(fake, 0)
    nodecheck.check_device(torch.device("cpu"), 64, 0.0, health.sample)
    fake.reasons = 0
    assert nodecheck.throttle_of(health) == ["power cap", "hardware slowdown"]


@pytest.mark.parametrize("argv", [["select", "--dir", "d", "--attempt", "a", "--nodes", "0", "--hosts", "n1",
                                   "--record", "r"], ["check", "--dir", "d", "--attempt", "a", "--min-fraction", "2"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        nodecheck.main(argv)
    assert e.value.code == 2


def preflighted_run(root, records, hosts, needed, state_word):
    """A run directory (tests/test_watch.py's) with a pre-flight record judged from forced node files."""
    from test_watch import write_run

    run = write_run(root, "r", records, state=state_word)
    record = nodecheck.judge(hosts, {"dl-node1": node("dl-node1"), "dl-node2": node("dl-node2", error=0.5)}, needed, 0.5)
    record["time"] = 90.0  # before the metrics' first record (100.0): this attempt's pre-flight
    (run / nodecheck.PREFLIGHT_FILE).write_text(json.dumps(record))
    return run


@pytest.fixture
def here(tmp_path, monkeypatch):
    from dlaunch.runs import suspects

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(suspects.FOLDER_ENV, raising=False)
    monkeypatch.setenv("DLAUNCH_RESULTS_DB", str(tmp_path / "runs" / "results.sqlite"))
    return tmp_path


def test_status_names_the_node_left_out_and_the_site_records_it(here, capsys):
    from test_watch import finished

    from dlaunch import api
    from dlaunch.cli import main
    from dlaunch.runs import suspects

    preflighted_run(here / "runs", finished(), ["dl-node1", "dl-node2"], 1, "finished (exit 0)")
    [status] = api.status(["runs"])
    assert status.ok and status.preflight == [
        "pre-flight left out dl-node2 (GEMM result wrong on cuda:0: relative error 0.5 > 0.02); trains on dl-node1"]
    [entry] = suspects.read("local")
    assert entry.node == "dl-node2" and entry.reason == "pre-flight: GEMM result wrong on cuda:0: relative error 0.5 > 0.02"
    assert main(["status", "runs"]) == 0
    assert "runs/r: pre-flight left out dl-node2 (GEMM result wrong" in capsys.readouterr().out


def test_a_run_that_ended_for_lack_of_healthy_nodes_reads_as_such_with_the_nodes_named(here, capsys):
    from dlaunch import api
    from dlaunch.runs import suspects

    preflighted_run(here / "runs", [], ["dl-node1", "dl-node2"], 2, "finished (exit 68)")
    [status] = api.status(["runs"])
    assert (status.status, status.ok) == ("too few healthy nodes", False)
    assert status.why_failed == (
        "too few healthy nodes: 1 of the 2 node(s) it needs passed pre-flight, nothing trained: dl-node2 (GEMM result "
        "wrong on cuda:0: relative error 0.5 > 0.02); runs/r/preflight.json")
    assert [e.node for e in suspects.read("local")] == ["dl-node2"]


def test_a_profiles_expected_rate_needs_its_source_and_the_refusal_names_the_field(tmp_path, capsys):
    from dlaunch.cli import main
    from dlaunch.jobs.sites import SHIPPED_SITES_DIR

    text = (SHIPPED_SITES_DIR / "generic-slurm.toml").read_text() + "\n[preflight]\ngemm_tflops_per_gpu = 312.0\n"
    (tmp_path / "s.toml").write_text(text)
    assert main(["run", "--site", str(tmp_path / "s.toml"), "--preflight", "--dry-run", "--account", "a"]) == 2
    err = capsys.readouterr().err
    assert "preflight" in err and "gemm_tflops_per_gpu needs its source" in err and len(err.strip().splitlines()) == 1


def test_sweep_checks_every_count_with_its_spares(tmp_path, capsys, monkeypatch):
    from dlaunch.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--site", "generic-slurm", "--nodes", "1,2", "--preflight", "--spare-nodes", "2",
                 "--account", "a", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("#SBATCH --nodes=3\n") == 1 and out.count("#SBATCH --nodes=4\n") == 1
    assert out.count("nodecheck select") == 2 * 2 and out.count("--after-hang") == 2 and "torchrun --nnodes=1 " in out and "torchrun --nnodes=2 " in out


def test_study_run_checks_every_jobs_nodes_with_its_spares(tmp_path, capsys, monkeypatch):
    from dlaunch.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["study", "run", "aach2023", "--site", "generic-slurm", "--preflight", "--spare-nodes", "1",
                 "--account", "a", "--data", "DLAUNCH_IMAGENET=/d", "--data", "DLAUNCH_IMAGENET_TFRECORD=/e",
                 "--only", "gpus=8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    jobs = out.count("#!/bin/bash\n")
    assert jobs > 1 and out.count("#SBATCH --nodes=3\n") == out.count("--after-hang") == jobs  # 8 GPUs: 2 + 1
    assert out.count("nodecheck select") == 2 * jobs  # the choice, and again after a hang
