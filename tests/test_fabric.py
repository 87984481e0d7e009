"""Pre-flight's fabric check (issue 44 item 3, dlaunch/train/fabric.py): the pairs' rounds, the verdict from forced
figures (no timing), and the real check: three processes of this machine as three nodes, gloo over loopback, through
`python -m dlaunch.train.nodecheck fabric` and `select`."""
import json
import os
import socket
import subprocess
import sys

import pytest

from dlaunch.train import fabric, nodecheck

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9])
def test_every_neighbouring_pair_is_measured_once_and_no_node_is_in_two_pairs_at_once(n):
    rounds = fabric.pair_rounds(n)
    pairs = [p for r in rounds for p in r]
    expected = {(0, 1)} if n == 2 else {(i, (i + 1) % n) for i in range(n)}
    assert sorted(pairs) == sorted(expected)
    for r in rounds:
        members = [m for p in r for m in p]
        assert len(members) == len(set(members))
    assert len(rounds) == (1 if n == 2 else 2 + n % 2)


def record(gbps, attempt="7.0"):
    """fabric.json as rank 0 writes it, with forced pair figures {(a, b): GB/s} of hosts n0, n1, ..."""
    pairs = [{"ranks": [a, b], "hosts": ["n%d" % a, "n%d" % b], "gbps": v} for (a, b), v in sorted(gbps.items())]
    return {"schema": fabric.FABRIC_SCHEMA, "version": 1, "attempt": attempt, "hosts": [], "backend": "nccl",
            "bytes": 256 << 20, "all_gbps": 9.0, "pairs": pairs, "problem": None}


def test_a_node_whose_every_pair_is_slow_is_named_with_the_figures_and_a_slow_pair_alone_names_nobody():
    hosts = ["n0", "n1", "n2"]
    found, named = fabric.judge(record({(0, 1): 20.0, (1, 2): 2.0, (2, 0): 2.1}), hosts, "7.0", 0.5)
    assert named == {"n2": ["fabric: all-reduce with n1 2 GB/s, with n0 2.1 GB/s < 10 GB/s (0.5 x the nodes' median "
                            "best pair, 20)"]}
    assert found["measured"] and found["median_best_pair_gbps"] == 20.0 and len(found["pairs"]) == 3
    five = ["n%d" % i for i in range(5)]
    healthy = {(i, (i + 1) % 5): 20.0 + i for i in range(5)}
    assert fabric.judge(record(healthy), five, "7.0", 0.5)[1] == {}
    found, named = fabric.judge(record({**healthy, (1, 2): 3.0}), five, "7.0", 0.5)  # one link, not a node
    assert named == {} and found["note"] == "slow pair(s) n1-n2 3 GB/s: not attributable to one node (5 nodes)"
    found, named = fabric.judge(record({(0, 1): 0.5}), ["n0", "n1"], "7.0", 0.5)
    assert named == {}  # 2 nodes: a pair's figure cannot say which


def test_a_missing_failed_or_earlier_record_and_one_node_are_not_measured():
    assert fabric.judge(None, ["n0", "n1"], "7.0", 0.5) == (
        {"measured": False, "why": "no fabric record of this attempt (its step did not finish)"}, {})
    assert fabric.judge(record({(0, 1): 1.0}, attempt="6.0"), ["n0", "n1"], "7.0", 0.5)[0]["measured"] is False
    failed = dict(record({}), problem="fabric check failed: RuntimeError: timed out")
    assert fabric.judge(failed, ["n0", "n1"], "7.0", 0.5)[0] == {"measured": False,
                                                                 "why": "fabric check failed: RuntimeError: timed out"}
    assert fabric.judge(None, ["n0"], "7.0", 0.5)[0]["why"] == "one node: no fabric between nodes to check"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_three_processes_as_three_nodes_measure_every_pair_and_select_reads_it(tmp_path):
    """The real check (gloo over loopback), as the job's fabric step runs it: one task per node, the neutral task
    variables, rank 0 writes fabric.json; select keeps it in preflight.json. The figures are not judged here (three
    processes on this 2-core machine are no fabric): only that each was measured."""
    folder, hosts, port = tmp_path / "preflight", ["na", "nb", "nc"], free_port()
    base = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", DLAUNCH_NODELIST=",".join(hosts),
                DLAUNCH_NTASKS="3", DLAUNCH_LOCAL_TASK_ID="0", GLOO_SOCKET_IFNAME="lo")
    command = [sys.executable, "-m", "dlaunch.train.nodecheck", "fabric", "--dir", str(folder), "--attempt", "9.0",
               "--master", "127.0.0.1", "--port", str(port)]
    tasks = [subprocess.Popen(command, env=dict(base, DLAUNCH_NODE_ID=str(i), DLAUNCH_TASK_ID=str(i)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    outputs = [t.communicate(timeout=300) for t in tasks]
    assert [t.returncode for t in tasks] == [0, 0, 0], outputs
    written = json.loads((folder / fabric.FABRIC_FILE).read_text())
    assert written["problem"] is None and written["backend"] == "gloo" and written["attempt"] == "9.0"
    assert sorted(tuple(p["hosts"]) for p in written["pairs"]) == [("na", "nb"), ("nb", "nc"), ("nc", "na")]
    assert written["all_gbps"] > 0 and all(p["gbps"] > 0 for p in written["pairs"])
    for host in hosts:  # the nodes' own checks, forced (not this test's subject)
        (folder / ("%s.0.json" % host)).write_text(json.dumps(dict(
            schema=nodecheck.NODE_SCHEMA, version=1, host=host, attempt="9.0", problem=None,
            devices=[dict(device="cpu", dtype="float32", size=1024, tflops=0.1, relative_error=1e-7,
                          tolerance=1e-3)])))
    chosen = tmp_path / "preflight.json"
    assert nodecheck.main(["select", "--dir", str(folder), "--attempt", "9.0", "--hosts", ",".join(hosts),
                           "--nodes", "1", "--record", str(chosen), "--min-fraction", "0.01"]) == 0
    kept = json.loads(chosen.read_text())["fabric"]
    assert kept["measured"] and len(kept["pairs"]) == 3 and kept["all_gbps"] == written["all_gbps"]


def test_status_says_what_the_fabric_found_that_names_no_node():
    from dlaunch.runs.nodechecks import left_out_lines

    base = {"hosts": ["n0", "n1"], "left_out": [], "chosen": ["n0"], "enough": True}
    found, _ = fabric.judge(record({(0, 1): 0.5, (1, 2): 20.0, (2, 3): 21.0, (3, 0): 22.0}), ["n0", "n1", "n2", "n3"],
                            "7.0", 0.5)
    assert left_out_lines(dict(base, fabric=found)) == [
        "pre-flight fabric: slow pair(s) n0-n1 0.5 GB/s: not attributable to one node (4 nodes)"]
    missing, _ = fabric.judge(None, ["n0", "n1"], "7.0", 0.5)
    assert left_out_lines(dict(base, fabric=missing)) == [
        "pre-flight fabric not measured: no fabric record of this attempt (its step did not finish)"]
    assert left_out_lines(dict(base, hosts=["n0"], fabric=fabric.judge(None, ["n0"], "7.0", 0.5)[0])) == []
