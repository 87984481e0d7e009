"""`dlaunch doctor` on the real throw-away Slurm cluster: on the login side (sbatch --test-only) and inside a
two-node allocation whose nodes have a second network named like JSC's (`<node>i` on ib0)."""
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

import slurm

DLAUNCH = os.path.join(os.path.dirname(sys.executable), "dlaunch")


def doctor(cluster: slurm.Cluster, site: Path, *srun: str) -> subprocess.CompletedProcess:
    """`dlaunch doctor --site SITE`, here or (with `srun` options) as one task per node (wide tables)."""
    command = ["srun", "--label", "--time=4", *srun] if srun else []
    return cluster.run([*command, DLAUNCH, "doctor", "--site", str(site)], timeout=240, COLUMNS="400")


def rows_by_task(output: str) -> Dict[str, List[str]]:
    """srun --label's lines (`N: text`) per task."""
    tasks: Dict[str, List[str]] = {}
    for line in output.splitlines():
        m = re.match(r"^\s*(\d+): (.*)$", line)
        if m:
            tasks.setdefault(m.group(1), []).append(m.group(2))
    return tasks


def row(lines: List[str], check: str) -> str:
    return next(line for line in lines if line.startswith(check))


@pytest.fixture(scope="module")
def jsc_like(slurm_cluster, tmp_path_factory) -> Path:
    """JSC-like profile: rendezvous at `<first node>i`, NCCL/Gloo on ib0, which its `[network]` expects."""
    network = {"latency_us": 50.0, "bandwidth_gbps_per_node": 10.0,  # a veth pair's order of magnitude (test only)
               "transport": "socket", "interfaces": [slurm_cluster.second_ifname]}
    return slurm_cluster.site_profile(tmp_path_factory.mktemp("sites") / "doctor-jsc-like.toml", second_network=True,
                                      extra={"network": network})


def test_rendezvous_and_interfaces_pass_inside_the_allocation(two_nodes, jsc_like):
    ran = doctor(two_nodes, jsc_like, "-N2", "--ntasks-per-node=1")
    tasks = rows_by_task(ran.stdout)
    assert sorted(tasks) == ["0", "1"] and ran.returncode == 0, ran.stdout + ran.stderr
    first = two_nodes.node_names[0]
    own = row(tasks["0"], "rendezvous host")
    assert " pass " in own and first + "i" in own and "ib0, this node" in own
    other = row(tasks["1"], "rendezvous host")
    assert " pass " in other and first + "i" in other and "the first node checks" in other
    for lines in tasks.values():
        assert " pass " in row(lines, "interface NCCL_SOCKET_IFNAME") and "ib0" in row(lines, "interface NCCL_SOCKET_IFNAME")
        assert " pass " in row(lines, "account and partition") and "--test-only accepted" in row(lines, "account and partition")
        assert " pass " in row(lines, "scheduler controller") and " pass " in row(lines, "MPI plugin")
        # one all-reduce across both nodes (dlaunch/train/netcheck.py in the job's environment): transport and bandwidth
        measured = row(lines, "network all-reduce")
        assert " pass " in measured and "Gloo: TCP sockets over ib0 on %s" % ", ".join(two_nodes.node_names[:2]) in measured
        assert re.search(r"bus bandwidth [0-9.e+]+ Gbit/s \(2 nodes, 2 ranks, 8 MiB\), nominal 10 Gbit/s per node: \d+%", measured)
        # pre-flight's check of the node (dlaunch/train/nodecheck.py in the job's environment), judged as a job's is
        checked = row(lines, "node check (pre-flight)")
        assert re.search(r" pass .*cpu float32 GEMM [0-9.e+-]+ TFLOP/s, relative error [0-9.e+-]+; no expected rate", checked)


def test_a_wrong_suffix_fails_naming_the_fix(two_nodes, jsc_like, tmp_path):
    wrong = tmp_path / "doctor-suffix-x.toml"
    wrong.write_text(jsc_like.read_text().replace('rendezvous_host_suffix = "i"', 'rendezvous_host_suffix = "x"'))
    ran = doctor(two_nodes, wrong, "-N2", "--ntasks-per-node=1")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    for lines in rows_by_task(ran.stdout).values():
        check = row(lines, "rendezvous host")
        assert " fail " in check and two_nodes.node_names[0] + "x does not resolve" in check
        assert "set rendezvous_host_suffix (now 'x')" in check


def test_login_side_submission_check_accepts_and_rejects_a_partition(slurm_cluster, slurm_site, tmp_path):
    """Outside an allocation: sbatch --test-only of the rendered script; the node checks are skipped."""
    ran = doctor(slurm_cluster, slurm_site)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "--partition=%s" % slurm_cluster.partition in row(ran.stdout.splitlines(), "account and partition")
    assert " skip " in row(ran.stdout.splitlines(), "rendezvous host")
    bad = tmp_path / "doctor-bad-partition.toml"
    bad.write_text(slurm_site.read_text().replace('name = "%s"' % slurm_cluster.partition, 'name = "nosuch"'))
    ran = doctor(slurm_cluster, bad)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    check = row(ran.stdout.splitlines(), "account and partition")
    assert " fail " in check and "partition" in check.lower() and "--partition" in check
