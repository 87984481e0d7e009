"""Pre-flight on the real test cluster (issue 44, done-when): node n2's GEMM is broken on purpose (the failpoint of
tests/failpoints/sitecustomize.py, DLAUNCH_TEST_BROKEN_GEMM_HOST: a fake of a GPU that computes wrong numbers; the real
check runs on the CPU). With a spare the job trains on the other node and says why n2 was left out; without one it ends
before training with its own exit code, naming n2. Either way the site's suspect-node record holds n2.

Before the change (main 7d385a7) both tests failed (`dlaunch run --preflight`: "No such option"), and nothing checked a
node: there, a 2-node job with dl-node2's GEMM broken the same way COMPLETED, training on dl-node1 and dl-node2."""

import json
import os

import pytest

from holds import FAILPOINTS
from test_slurm_dlaunch import dlaunch, job_id, submit
from dlaunch.runs import suspects
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture
def preflight_site(slurm_cluster, tmp_path):
    """The cluster's profile with a rate threshold no healthy node of the cluster misses (1 % of the allocation's
    median: the test turns on a wrong product, never on timing)."""
    return slurm_cluster.site_profile(tmp_path / "slurm-preflight.toml", extra={"preflight": {"min_fraction": 0.01}})


def broken(cluster, tmp_path):
    """The variables that break the second node's GEMM, and keep the suspect-node record in the test's folder."""
    path = os.pathsep.join([str(FAILPOINTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {"PYTHONPATH": path, "DLAUNCH_TEST_BROKEN_GEMM_HOST": cluster.node_names[1],
            suspects.FOLDER_ENV: str(tmp_path / "suspect-nodes")}


def shown(cluster, tmp_path, run_dir, env):
    [status] = json.loads(dlaunch(cluster, tmp_path, "status", "--json", str(run_dir), **env).stdout)
    return status


def test_a_spare_replaces_the_node_whose_check_fails(two_nodes, preflight_site, tmp_path, monkeypatch):
    n1, n2 = two_nodes.node_names[:2]
    env = broken(two_nodes, tmp_path)
    run_dir = submit(two_nodes, tmp_path, preflight_site, "spare", "--nodes", "1", "--preflight", "--spare-nodes", "1",
                     "--steps", "2", **env)
    assert two_nodes.wait_job(job_id(run_dir), 240) == "COMPLETED"
    assert set(read_metrics(str(run_dir / "metrics.jsonl")).header["hosts"]) == {n1}
    record = json.loads((run_dir / "preflight.json").read_text())
    assert record["chosen"] == [n1] and [n["host"] for n in record["left_out"]] == [n2]
    # The fabric check ran between the 2 nodes (dlaunch/train/fabric.py): one pair, measured, naming nobody.
    assert record["fabric"]["measured"] and [p["hosts"] for p in record["fabric"]["pairs"]] == [[n1, n2]], record
    status = shown(two_nodes, tmp_path, run_dir, env)
    assert status["ok"], status
    assert status["preflight"] == ["pre-flight left out %s (GEMM result wrong on cpu: relative error 0.5 > 0.001); "
                                   "trains on %s" % (n2, n1)], status
    assert [(e.node, e.reason.split(":")[0]) for e in suspects_of(tmp_path, monkeypatch)] == [(n2, "pre-flight")]


def test_without_a_spare_the_job_ends_before_training_with_its_own_exit_code_naming_the_node(
        two_nodes, preflight_site, tmp_path, monkeypatch):
    n2 = two_nodes.node_names[1]
    env = broken(two_nodes, tmp_path)
    run_dir = submit(two_nodes, tmp_path, preflight_site, "no-spare", "--nodes", "2", "--preflight", "--steps", "2",
                     **env)
    assert two_nodes.wait_job(job_id(run_dir), 240) == "FAILED"
    assert not (run_dir / "metrics.jsonl").exists()  # nothing trained
    status = shown(two_nodes, tmp_path, run_dir, env)
    assert (status["state"], status["status"]) == (
        "FAILED (exit 68: pre-flight left too few healthy nodes, nothing trained)", "too few healthy nodes"), status
    assert status["why_failed"].startswith(
        "too few healthy nodes: 1 of the 2 node(s) it needs passed pre-flight, nothing trained: %s (GEMM result wrong "
        "on cpu: relative error 0.5 > 0.001)" % n2), status
    assert [e.node for e in suspects_of(tmp_path, monkeypatch)] == [n2]


def suspects_of(tmp_path, monkeypatch):
    """The test site's suspect-node record (in the test's folder: `broken`)."""
    monkeypatch.setenv(suspects.FOLDER_ENV, str(tmp_path / "suspect-nodes"))
    return suspects.read("slurm-preflight")
