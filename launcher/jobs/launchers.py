"""Launch modes: how many processes start where, and with which command in front of the trainer.

DDP and DeepSpeed start one `torchrun` per node: a single c10d rendezvous for the whole job, restart and
failure handling by torchrun, and one container start per node instead of one per GPU. Horovod starts
one task per GPU through srun's MPI plugin, which is how MPI wires its ranks.
The rendezvous address is computed by the batch script on the host (`scontrol` is usually missing
inside images). torchrun flags use the underscore spelling that torch 1.11 (the paper's image) and
current torch both accept. The torchrun task owns its node (`--cpu-bind=none`, all of the node's CPUs,
as JSC's examples do); an MPI task gets its share of the node's CPUs and Slurm's default binding.

Sites whose rendezvous host carries a suffix (JSC: `<host>i` is the InfiniBand address) start
`python -m torchrun_jsc` instead of torchrun. torch's c10d rendezvous picks the agent that hosts the
store by matching the endpoint against the machine's own host name and addresses; an address of a
secondary interface does not match (pytorch/pytorch#73656), so no agent hosts it and all time out.
torchrun_jsc (JSC's drop-in replacement, torch >= 1.9) makes the agent of SLURM_NODEID 0 the host
(`--rdzv_conf=is_host=`) and hands the workers the endpoint's name as MASTER_ADDR (torch >= 2.5:
`--local_addr`; older torch: a patched `_get_fq_hostname`), so the store traffic uses that network too.

Stop signals: Slurm sends SIGUSR1 to every process of the job step 120 s before the time limit
(`--signal=USR1@120`); the trainer checkpoints on it (status `interrupted`, resumable), and on SIGTERM
(`scancel`: status `cancelled`). torchrun forwards SIGTERM to its workers but does not handle SIGUSR1
(torch < 2.9 has no TORCHELASTIC_SIGNALS_TO_HANDLE), so SIGUSR1 would kill it and, with it, the step.
torchrun therefore starts with SIGUSR1 ignored (`IGNORE_USR1`, inherited through exec); the workers
install their own handler and receive the signal from Slurm directly.
"""
from dataclasses import dataclass
from typing import Tuple

from launcher.errors import DlaunchError
from launcher.jobs.jobspec import Export, FirstHost, PreludeItem, ShellWord
from launcher.schedulers import Scheduler
from launcher.jobs.sites import Site
from train.framework_table import FRAMEWORKS, FrameworkInfo


@dataclass(frozen=True)
class LaunchSpec:
    tasks_per_node: int
    cpus_per_task: int
    prelude: Tuple[PreludeItem, ...]  # run on the batch host before the step
    mpi: bool  # the tasks are MPI ranks (the scheduler wires them)
    whole_node: bool  # one task owns its node's CPUs (not bound)
    launch_prefix: Tuple[str, ...]  # the program and its arguments in front of the trainer's
    extra_tasks: int = 0  # tasks beyond tasks_per_node x nodes (coordinators), placed by the scheduler
    overcommit: bool = False  # more tasks than CPUs on a node (light server and coordinator tasks share)


def rendezvous_prelude(site: Site, scheduler: Scheduler) -> Tuple[PreludeItem, ...]:
    """MASTER_ADDR: the first host of the allocation (+ the site's suffix, e.g. `i` for InfiniBand)."""
    return (
        FirstHost("MASTER_ADDR", scheduler.hosts_command(), site.rendezvous_host_suffix),
        Export("MASTER_PORT", str(site.master_port)),
    )


def _option(name: str, value: str) -> str:
    """`--name=value`, still a ShellWord when the value expands a variable."""
    return ShellWord(name + value) if isinstance(value, ShellWord) else name + value


# `bash -c 'trap "" USR1; exec "$@"' ignore-usr1 PROGRAM ARGS...`: PROGRAM runs with SIGUSR1 ignored.
IGNORE_USR1 = ("bash", "-c", 'trap "" USR1; exec "$@"', "ignore-usr1")


class LaunchStyle:
    """How a framework's processes start (its row's `launch`)."""

    def __init__(self, info: FrameworkInfo):
        self.info = info

    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        raise NotImplementedError


class TorchrunPerNode(LaunchStyle):
    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        torchrun = ("python", "-m", "torchrun_jsc") if site.rendezvous_host_suffix else ("torchrun",)
        return LaunchSpec(
            tasks_per_node=1,
            cpus_per_task=site.cpus_per_node,
            prelude=rendezvous_prelude(site, scheduler),
            mpi=False,
            whole_node=True,
            launch_prefix=IGNORE_USR1 + torchrun + (
                _option("--nnodes=", scheduler.node_count_word(nodes)),
                "--nproc_per_node=%d" % nproc_per_node,
                "--rdzv_backend=c10d",
                ShellWord("--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT"),
                _option("--rdzv_id=", scheduler.job_id_word()),
                "-m",
                "train",
            ),
        )


class MpiPerGpu(LaunchStyle):
    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        return LaunchSpec(
            tasks_per_node=nproc_per_node,
            cpus_per_task=max(1, site.cpus_per_node // nproc_per_node),
            prelude=(),
            mpi=True,
            whole_node=False,
            launch_prefix=("python", "-m", "train"),
        )


class LocalTorchrun(LaunchStyle):
    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        prefix = ("torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=%d" % nproc_per_node, "-m", "train")
        return LaunchSpec(1, site.cpus_per_node, (), False, True, prefix)


class LocalHorovod(LaunchStyle):
    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        prefix = ("horovodrun", "--gloo", "-np", str(nproc_per_node), "python", "-m", "train")
        return LaunchSpec(nproc_per_node, max(1, site.cpus_per_node // nproc_per_node), (), False, False, prefix)


class TaskPerWorker(LaunchStyle):
    """One task per process: workers (`--gpus` per node), the row's servers on every node and its
    coordinators; each task takes its role from its task id (train/engines.py), and finds the others
    through the job's DLAUNCH_NODELIST and MASTER_PORT. The interpreter is the site's for the engine
    (`interpreters`)."""

    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        info = self.info
        per_node = nproc_per_node + info.servers_per_node
        slots = per_node + (1 if info.coordinators else 0)  # the first node also holds the coordinators
        python = site.interpreters.get(info.engine, "python")
        return LaunchSpec(
            tasks_per_node=per_node,
            cpus_per_task=max(1, site.cpus_per_node // slots),
            prelude=rendezvous_prelude(site, scheduler),
            mpi=False,
            whole_node=False,
            launch_prefix=(python, "-m", info.entry),
            extra_tasks=info.coordinators,
            overcommit=slots > site.cpus_per_node,
        )


class NotHere(LaunchStyle):
    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        raise DlaunchError("--framework %s: starts one scheduler task per process (roles from Slurm's task ids); "
                           "run it on a Slurm site, not on %s" % (self.info.name, site.name))


# (the framework table's launch style, on a batch system | on this machine)
LAUNCH_STYLES = {
    "torchrun-per-node": (TorchrunPerNode, LocalTorchrun),
    "mpi-per-gpu": (MpiPerGpu, LocalHorovod),
    "task-per-worker": (TaskPerWorker, NotHere),
}


def launch_mode(scheduler_kind: str, framework: str) -> LaunchStyle:
    """The launch mode of a framework under a scheduler."""
    info = FRAMEWORKS[framework]
    if info.launch not in LAUNCH_STYLES:
        raise DlaunchError("--framework %s: launch style %r has no launcher" % (framework, info.launch))
    batch, local = LAUNCH_STYLES[info.launch]
    return local(info) if scheduler_kind == "local" else batch(info)
