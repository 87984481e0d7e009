"""The throw-away Slurm cluster of scripts/slurm-cluster.sh, seen from the tests: start/stop, commands, site profile."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
# A fixed folder: a crashed session's cluster is found (and stopped) by the next one.
SESSION_DIR = Path("/tmp/dlaunch-slurm-pytest")
SESSION_NODES = 2
# The session's nodes also carry a second network named like JSC's InfiniBand addresses (<host>i on ib0).
SESSION_SECOND_NETWORK = "i"
COMMAND_TIMEOUT_S = 30
JOB_END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
PREREQUISITES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "sinfo", "scontrol", "ip", "nsenter", "unshare", "mpicc")


def missing_prerequisite() -> Optional[str]:
    """Why this machine cannot run the cluster (None: it can)."""
    if os.geteuid() != 0:
        return "the throw-away Slurm cluster needs root"
    absent = [tool for tool in PREREQUISITES if shutil.which(tool) is None]
    if absent:
        return "not installed: %s (scripts/bootstrap.sh full)" % ", ".join(absent)
    return None


def cluster_script(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Cluster:
    conf: Path
    node_names: Tuple[str, ...]
    cpus_per_node: int
    ifname: str  # the nodes' network interface (GLOO_SOCKET_IFNAME)
    partition: str
    dir: Optional[Path]  # set when this session started the cluster (and may stop it)
    second_suffix: str = ""  # host-name suffix of the nodes' second network ("" when there is none)
    second_ifname: str = ""  # its interface
    small_disk: str = ""  # a 16 MiB file system every node sees ("" when there is none)
    node_cores: Tuple[int, ...] = ()  # the core each node runs on, in node order (started with --pin-cores), else ()
    gpus_per_node: int = 0  # pretend GPUs per node of `psslurm_partition` (there are none here)
    psslurm_partition: str = ""  # the partition whose tasks see them as psslurm shows them ("" when there is none)

    @property
    def nodes(self) -> int:
        return len(self.node_names)

    def env(self, **extra: str) -> Dict[str, str]:
        """This process's environment with SLURM_CONF pointing at the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def run(self, argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S, **extra_env: str) -> subprocess.CompletedProcess:
        """A client command against the cluster (output captured, never hangs past `timeout`)."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env(**extra_env))

    def slow_node(self, node: str, cpu_percent: int = 30) -> None:
        """Limit `node` (its slurmd, its running job steps and what they start) to `cpu_percent` % of one CPU
        (`slurm-cluster.sh node-slow`: a cgroup v1 CPU quota)."""
        self._node_command("node-slow", node, "--cpu-percent", str(cpu_percent))

    def restore_node(self, node: str) -> None:
        """Lift `slow_node`'s limit (`slurm-cluster.sh node-restore`)."""
        self._node_command("node-restore", node)

    def _node_command(self, command: str, node: str, *args: str) -> None:
        if self.dir is None:
            pytest.skip("the cluster given by $SLURM_CONF was not started by slurm-cluster.sh here")
        done = cluster_script(command, node, *args, "--dir", str(self.dir))
        if done.returncode != 0:
            pytest.fail("slurm-cluster.sh %s %s failed (%d): %s" % (command, node, done.returncode, done.stderr.strip()))

    def job_state(self, job_id: str) -> str:
        shown = self.run(["scontrol", "show", "job", "-o", job_id])
        m = re.search(r"\bJobState=(\S+)", shown.stdout)
        return m.group(1) if m else "unknown (%s)" % (shown.stderr.strip() or "no record")

    def wait_job(self, job_id: str, timeout: float = 120) -> str:
        """The job's final state; fails the test when it has not ended within `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in JOB_END_STATES:
                return state
            time.sleep(0.5)
        self.run(["scancel", job_id])
        pytest.fail("job %s still %s after %g s" % (job_id, self.job_state(job_id), timeout))

    def site_profile(self, path: Path, max_nodes: Optional[int] = None, sbatch_directives: Sequence[str] = (),
                     second_network: bool = False, container: Optional[Dict[str, Any]] = None,
                     extra: Optional[Dict[str, Any]] = None, gpus_per_node: int = 1, gpu_vendor: str = "none",
                     partition: Optional[str] = None) -> Path:
        """Write a launcher site profile for this cluster (gloo on CPU, one worker slot per node; no
        container unless `container` gives the `[container]` section).

        `second_network`: rendezvous and collectives on the nodes' second network, the way JSC's profiles
        use InfiniBand (host-name suffix, NCCL/Gloo interface). `extra`: more top-level keys
        (e.g. `interpreters`). `gpus_per_node`, `gpu_vendor` and `partition` for the partition whose nodes have
        pretend GPUs (`psslurm_partition`; the trainer still runs on CPU)."""
        extra = extra or {}
        venv_bin = os.path.dirname(sys.executable)
        if second_network and not self.second_suffix:
            pytest.skip("the cluster given by $SLURM_CONF has no second network")
        ifname = self.second_ifname if second_network else self.ifname
        env = {
            "GLOO_SOCKET_IFNAME": ifname,
            "NCCL_SOCKET_IFNAME": ifname,
            # Jobs share this filesystem: the trainer runs from the test's own environment.
            "PATH": venv_bin + ":/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        }
        lines = [
            "name = %s" % json.dumps(path.stem),
            'description = "The throw-away Slurm cluster of scripts/slurm-cluster.sh (%d nodes, CPU only)"' % self.nodes,
            'based_on = ["scripts/slurm-cluster.sh", %s]' % json.dumps(str(self.conf)),
            "gpus_per_node = %d" % gpus_per_node,
            "cores_per_node = %d" % self.cpus_per_node,
            "threads_per_core = 1",
            "gpu_vendor = %s" % json.dumps(gpu_vendor),
            "rendezvous_host_suffix = %s" % json.dumps(self.second_suffix if second_network else ""),
            *("%s = %s" % (key, toml_value(value)) for key, value in extra.items()),
            "",
            "[scheduler]",
            'kind = "slurm"',
            'mpi_plugin = "pmix"',
            "directives = %s" % json.dumps(list(sbatch_directives)),
            "",
            "[[scheduler.partitions]]",
            "name = %s" % json.dumps(partition or self.partition),
            "max_nodes = %d" % (max_nodes or self.nodes),
            'max_time = "04:00:00"',
            "default = true",
            "",
            "[env]",
            *("%s = %s" % (name, json.dumps(value)) for name, value in env.items()),
            "",
            "[container]",
            *("%s = %s" % (key, toml_value(value)) for key, value in (container or {"kind": "none"}).items()),
        ]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path


def toml_value(value: Any) -> str:
    """A TOML value: strings, numbers, booleans and lists as JSON spells them, tables inline."""
    if isinstance(value, dict):
        return "{ %s }" % ", ".join("%s = %s" % (k, toml_value(v)) for k, v in value.items())
    return json.dumps(value)


def read_cluster_env(path: Path) -> Dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text(encoding="utf-8").splitlines() if "=" in line)


def cluster_at(conf: Path, owned_dir: Optional[Path]) -> Cluster:
    """The cluster of a slurm.conf: described by its cluster.env when slurm-cluster.sh wrote it, else asked of sinfo."""
    info_file = conf.parent.parent / "cluster.env"
    if info_file.is_file():
        info = read_cluster_env(info_file)
        names = tuple(info["NODE_NAMES"].split(","))
        cores = tuple(int(core) for core in info.get("NODE_CORES", "").split(",") if core)
        return Cluster(conf, names, int(info["CPUS_PER_NODE"]), info["IFNAME"], info["PARTITION"], owned_dir,
                       info.get("SECOND_SUFFIX", ""), info.get("SECOND_IFNAME", ""), info.get("SMALL_DISK", ""), cores,
                       int(info.get("GPUS_PER_NODE") or 0), info.get("PSSLURM_PARTITION", ""))
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %P"], capture_output=True, text=True,
                           timeout=COMMAND_TIMEOUT_S, env={**os.environ, "SLURM_CONF": str(conf)})
    rows = [line.split() for line in sinfo.stdout.splitlines() if line.strip()]
    if sinfo.returncode != 0 or not rows:
        pytest.fail("SLURM_CONF=%s: sinfo lists no nodes: %s" % (conf, sinfo.stderr.strip()))
    names = tuple(dict.fromkeys(row[0] for row in rows))
    partition = next((row[2].rstrip("*") for row in rows if row[2].endswith("*")), rows[0][2])
    return Cluster(conf, names, min(int(row[1]) for row in rows), os.environ.get("GLOO_SOCKET_IFNAME", "lo"), partition, None)


def start_cluster(directory: Path, nodes: int, second_network: str = "", pin_cores: bool = False) -> Cluster:
    """Start (or find running) the cluster of `directory`; `pin_cores`: each node's slurmd and its jobs on a core
    of their own (on this 2-core machine, two nodes no longer compete for both cores)."""
    extra = (("--second-network", second_network) if second_network else ()) + (("--pin-cores",) if pin_cores else ())
    started = cluster_script("start", "--nodes", str(nodes), "--dir", str(directory), *extra)
    if started.returncode != 0:
        pytest.fail("slurm-cluster.sh start failed (%d): %s" % (started.returncode, started.stderr.strip()))
    return cluster_at(Path(started.stdout.strip()), directory)


def stop_cluster(directory: Path) -> None:
    stopped = cluster_script("stop", "--dir", str(directory))
    if stopped.returncode != 0:
        pytest.fail("slurm-cluster.sh stop failed (%d): %s" % (stopped.returncode, stopped.stderr.strip()))


def daemon_pids(directory: Path) -> Dict[str, int]:
    """Daemon name -> pid, from the cluster's pid files."""
    return {p.stem: int(p.read_text().strip()) for p in sorted((directory / "run").glob("*.pid"))}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def cpu_cgroup(proc_cgroup: str) -> str:
    """The cgroup v1 `cpu` hierarchy's path in a /proc/<pid>/cgroup text ("" when it has none)."""
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return ""


def cpu_list(text: str) -> List[int]:
    """The cores of a Cpus_allowed_list such as "0-2,5"."""
    cores: List[int] = []
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cores += range(int(first), int(last or first) + 1)
    return cores


def network_namespaces() -> List[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, timeout=COMMAND_TIMEOUT_S).returncode == 0
