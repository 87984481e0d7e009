"""scripts/slurm-cluster.sh: a real throw-away Slurm cluster (slurmctld, slurmd per network namespace, munge, PMIx)."""
import os
import re
import socket
from shlex import quote as shlex_quote
import subprocess
import time
from pathlib import Path

import pytest

import slurm
from dlaunch.jobs.sites import load_site

MPI_HELLO = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  int rank, size, len, sum = 0;
  char host[MPI_MAX_PROCESSOR_NAME];
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(host, &len);
  MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("rank %d of %d on %s rank-sum %d\n", rank, size, host, sum);
  MPI_Finalize();
  return 0;
}
"""


def test_second_start_is_a_no_op(slurm_cluster):
    if slurm_cluster.dir is None:
        pytest.skip("the cluster given by $SLURM_CONF was not started by slurm-cluster.sh here")
    before = slurm.daemon_pids(slurm_cluster.dir)
    second = ("--second-network", slurm_cluster.second_suffix) if slurm_cluster.second_suffix else ()
    pinned = ("--pin-cores",) if slurm_cluster.node_cores else ()
    again = slurm.cluster_script("start", "--nodes", str(slurm_cluster.nodes), "--dir", str(slurm_cluster.dir), *second,
                                 *pinned)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == str(slurm_cluster.conf)
    assert slurm.daemon_pids(slurm_cluster.dir) == before
    assert len(before) == 2 + slurm_cluster.nodes  # munged, slurmctld, one slurmd per node


def test_a_running_cluster_refuses_another_node_count(slurm_cluster):
    if slurm_cluster.dir is None:
        pytest.skip("the cluster given by $SLURM_CONF was not started by slurm-cluster.sh here")
    other = slurm.cluster_script("start", "--nodes", str(slurm_cluster.nodes + 1), "--dir", str(slurm_cluster.dir))
    assert other.returncode == 2
    assert "already running with %d nodes" % slurm_cluster.nodes in other.stderr


def test_second_network_names_each_node_like_jsc(slurm_cluster, tmp_path):
    """`<node>i` resolves on every node to that node's own ib0 address (the jobs below use it for real)."""
    if not slurm_cluster.second_suffix or slurm_cluster.nodes < 2:
        pytest.skip("the cluster given by $SLURM_CONF has no second network")
    suffix, ifname = slurm_cluster.second_suffix, slurm_cluster.second_ifname
    probe = ('me=$(hostname); echo "$me $(getent ahostsv4 "${me}%s" | head -n 1 | cut -d" " -f1)" '
             '"$(ip -4 -o addr show %s | tr -s " " | cut -d" " -f4 | cut -d/ -f1)"' % (suffix, ifname))
    out = tmp_path / "second.out"
    submitted = slurm_cluster.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "--output=%s" % out,
                                   "--wrap", "srun bash -c %s" % shlex_quote(probe)])
    assert submitted.returncode == 0, submitted.stderr
    assert slurm_cluster.wait_job(submitted.stdout.strip().split(";")[0]) == "COMPLETED", out.read_text()
    rows = sorted(line.split() for line in out.read_text().splitlines() if line.strip())
    assert [row[0] for row in rows] == sorted(slurm_cluster.node_names)
    for name, resolved, own in rows:
        assert resolved == own and own.startswith("10.78.0."), rows  # the name is this node's ib0 address


def test_sinfo_shows_every_node_idle(slurm_cluster):
    sinfo = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N %T %c"])
    assert sinfo.returncode == 0, sinfo.stderr
    rows = sorted(set(tuple(line.split()) for line in sinfo.stdout.splitlines()))
    assert rows == [(name, "idle", str(slurm_cluster.cpus_per_node)) for name in sorted(slurm_cluster.node_names)]


def test_batch_job_runs_on_two_distinct_hosts(slurm_cluster, tmp_path):
    out = tmp_path / "hostnames.out"
    submitted = slurm_cluster.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "--output=%s" % out,
                                   "--wrap", "srun hostname"])
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    assert slurm_cluster.wait_job(job_id, timeout=60) == "COMPLETED", out.read_text() if out.exists() else ""
    hosts = out.read_text().split()
    assert len(hosts) == 2 and len(set(hosts)) == 2
    assert set(hosts) <= set(slurm_cluster.node_names)


@pytest.fixture(scope="module")
def mpi_hello(tmp_path_factory) -> Path:
    """A C MPI program (each rank prints its host and an Allreduce of the ranks), built with mpicc."""
    folder = tmp_path_factory.mktemp("mpi")
    (folder / "hello.c").write_text(MPI_HELLO)
    subprocess.run(["mpicc", "-o", str(folder / "hello"), str(folder / "hello.c")], check=True, timeout=120)
    return folder / "hello"


def run_mpi_hello(cluster: slurm.Cluster, program: Path, nodes: int, tasks: int):
    """Hosts of the ranks 0..tasks-1 of `srun --mpi=pmix`; every rank saw the full Allreduce."""
    ran = cluster.run(["srun", "--mpi=pmix", "-N%d" % nodes, "-n%d" % tasks, str(program)], timeout=60)
    assert ran.returncode == 0, ran.stderr
    found = [re.match(r"rank (\d+) of (\d+) on (\S+) rank-sum (\d+)$", line) for line in ran.stdout.splitlines()]
    assert all(found) and len(found) == tasks, ran.stdout
    by_rank = {int(m.group(1)): m for m in found}
    assert sorted(by_rank) == list(range(tasks))
    assert {(int(m.group(2)), int(m.group(4))) for m in found} == {(tasks, sum(range(tasks)))}
    return [by_rank[rank].group(3) for rank in range(tasks)]


def test_srun_pmix_runs_an_mpi_program_across_nodes(slurm_cluster, mpi_hello):
    hosts = run_mpi_hello(slurm_cluster, mpi_hello, nodes=2, tasks=4)
    assert len(set(hosts)) == 2 and set(hosts) <= set(slurm_cluster.node_names)


def test_site_profile_describes_the_cluster(slurm_cluster, slurm_site):
    site = load_site(slurm_site)
    assert site.scheduler.kind == "slurm" and site.container.kind == "none"
    assert site.partition(None).name == slurm_cluster.partition
    assert site.partition(None).max_nodes == slurm_cluster.nodes
    assert site.cores_per_node == slurm_cluster.cpus_per_node
    assert site.scheduler.mpi_plugin == "pmix"
    assert site.env["GLOO_SOCKET_IFNAME"] == slurm_cluster.ifname


CPU_CGROUP = "/sys/fs/cgroup/cpu"
CPU_PROBE = (r'''echo "$(hostname)|$(tr '\n' ';' < /proc/self/cgroup)|'''
             r'''$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)"''')


def probe_steps(cluster: slurm.Cluster) -> dict:
    """node -> (cpu cgroup, allowed cores) of a job step started there now, one task per node."""
    ran = cluster.run(["srun", "-N%d" % cluster.nodes, "--ntasks-per-node=1", "bash", "-c", CPU_PROBE], timeout=60)
    assert ran.returncode == 0, ran.stderr
    rows = [line.split("|") for line in ran.stdout.splitlines() if line.strip()]
    return {host: (slurm.cpu_cgroup(groups.replace(";", "\n")), slurm.cpu_list(cores)) for host, groups, cores in rows}


def test_a_slowed_node_runs_its_new_job_steps_under_a_cpu_quota_until_restored(two_nodes):
    """`node-slow` puts a node's slurmd into a cgroup v1 CPU quota that the job steps it starts inherit; the other
    node's steps run outside it, and after `node-restore` none does. Each step's cores are its node's own
    (started with --pin-cores) or all of this machine's. The state is asserted, not a speed."""
    if not Path(CPU_CGROUP, "cpu.cfs_quota_us").exists():
        pytest.skip("this machine has no cgroup v1 cpu controller")
    if two_nodes.dir is None:
        pytest.skip("the cluster given by $SLURM_CONF was not started by slurm-cluster.sh here")
    other, slowed = two_nodes.node_names[:2]
    group = "/dlaunch-slurm-" + slowed
    slurmd = (two_nodes.dir / "run" / ("slurmd-%s.pid" % slowed)).read_text().strip()
    outside = slurm.cpu_cgroup(Path("/proc/%s/cgroup" % slurmd).read_text())
    try:
        two_nodes.slow_node(slowed, cpu_percent=30)
        quota = (int(Path(CPU_CGROUP + group, name).read_text()) for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        assert tuple(quota) == (3000, 10000)  # 30 % of a 10 ms period: slowed evenly, not in 100 ms bursts
        steps = probe_steps(two_nodes)
        assert steps[slowed][0] == group and steps[other][0] != group
    finally:
        two_nodes.restore_node(slowed)
    after = probe_steps(two_nodes)
    assert after[slowed][0] == after[other][0] == outside and not Path(CPU_CGROUP + group).exists()
    machine = sorted(os.sched_getaffinity(0))
    for i, node in enumerate(two_nodes.node_names[:2]):
        assert after[node][1] == ([two_nodes.node_cores[i]] if two_nodes.node_cores else machine)


@pytest.mark.parametrize("args, flag", [
    (["start", "--nodes", "0", "--dir", "{dir}"], "--nodes"),
    (["start", "--nodes", "two", "--dir", "{dir}"], "--nodes"),
    (["start", "--dir", "relative/dir"], "--dir"),
    (["start", "--dir", "{dir}/with space"], "--dir"),
    (["start", "--dir", "{dir}", "--bogus"], "--bogus"),
    (["restart", "--dir", "{dir}"], "restart"),
])
def test_bad_arguments_exit_2_with_one_line_and_start_nothing(args, flag, tmp_path):
    target = tmp_path / "never-created"
    argv = [arg.replace("{dir}", str(target)) for arg in args]
    result = subprocess.run([str(slurm.CLUSTER_SCRIPT), *argv], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and flag in result.stderr
    assert not target.exists()


def test_stop_leaves_nothing_behind_and_a_single_node_cluster_runs(slurm_cluster, mpi_hello, tmp_path):
    """Stops the session's cluster (then starts it again): no daemon, namespace or bridge is left."""
    if slurm_cluster.dir is None:
        pytest.skip("the cluster given by $SLURM_CONF is not this session's to stop")
    try:
        busy = slurm_cluster.run(["sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap", "srun sleep 300"])
        assert busy.returncode == 0, busy.stderr
        _wait_running(slurm_cluster, busy.stdout.strip())
        _assert_stop_leaves_nothing(slurm_cluster.dir)

        single = slurm.start_cluster(tmp_path / "single", nodes=1)
        assert single.node_names == (socket.gethostname().split(".")[0],) and single.ifname == "lo"
        assert run_mpi_hello(single, mpi_hello, nodes=1, tasks=2) == list(single.node_names) * 2
        _assert_stop_leaves_nothing(tmp_path / "single")
    finally:
        slurm.stop_cluster(tmp_path / "single")
        slurm.start_cluster(slurm_cluster.dir, slurm_cluster.nodes, slurm_cluster.second_suffix,
                            pin_cores=bool(slurm_cluster.node_cores))


def _assert_stop_leaves_nothing(directory: Path) -> None:
    pids = slurm.daemon_pids(directory)
    assert pids and all(slurm.pid_alive(pid) for pid in pids.values())
    step_pids = _processes_in_namespaces()
    slurm.stop_cluster(directory)
    assert [name for name, pid in pids.items() if slurm.pid_alive(pid)] == []
    assert [pid for pid in step_pids if slurm.pid_alive(pid)] == []
    assert [ns for ns in slurm.network_namespaces() if ns.startswith("dl-node")] == []
    assert not slurm.link_exists("dlaunch-br0") and not slurm.link_exists("dlaunch-br1")
    assert subprocess.run(["mountpoint", "-q", str(directory / "small-disk")], timeout=30).returncode != 0
    status = slurm.cluster_script("status", "--dir", str(directory))
    assert status.returncode == 3 and "stopped" in status.stdout


def _wait_running(cluster: slurm.Cluster, job_id: str) -> None:
    """Until the job runs and its step's `sleep` has started in a node's namespace (so the processes that stop
    must end include it)."""
    deadline = time.monotonic() + 180
    while cluster.job_state(job_id) != "RUNNING" or not any(_command(pid) == b"sleep" for pid in _processes_in_namespaces()):
        assert time.monotonic() < deadline, "job %s never started its step" % job_id
        time.sleep(0.3)


def _command(pid: int) -> bytes:
    try:
        return Path("/proc/%d/comm" % pid).read_bytes().strip()
    except OSError:
        return b""


def _processes_in_namespaces():
    pids = []
    for ns in slurm.network_namespaces():
        listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
        pids += [int(p) for p in listed.stdout.split()]
    return pids
