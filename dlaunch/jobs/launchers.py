"""Launch modes: how many processes start where, and with which command in front of the trainer.

By default DDP and DeepSpeed start one `torchrun` per node: a single c10d rendezvous for the whole job,
restart and failure handling by torchrun, and one container start per node instead of one per GPU.
Horovod starts one task per GPU through srun's MPI plugin, which is how MPI wires its ranks.
A profile chooses another mode per framework where its operator prescribes one (`[launch.<framework>]
mode`): `task-per-gpu` starts one scheduler task per GPU and no torchrun (OLCF on Frontier: "the two
task managers clash"; ALCF on Polaris: mpiexec per GPU); the trainer takes RANK, LOCAL_RANK and
WORLD_SIZE from the task's neutral variables (dlaunch/train/jobenv.py). `mpirun` starts Horovod with the MPI's
own launcher (Open MPI's `mpirun` on the batch host) instead of the scheduler's MPI plugin.
The rendezvous address is computed by the batch script on the host (`scontrol` is usually missing
inside images), from the first host's name (+ the site's suffix) or by the profile's command
(`hostname -i`), which the batch script runs on the first node. torchrun flags use the underscore spelling that torch 1.11 (the paper's image) and
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
from typing import Any, Tuple

from dlaunch.errors import DlaunchError
from dlaunch.jobs.sites import Site
from dlaunch.schedulers import Scheduler, scheduler_for
from dlaunch.specs.job import CommandOutput, Export, FirstHost, PreludeItem, ShellWord
from dlaunch.train.framework_table import FRAMEWORKS, FrameworkInfo


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
    own_step: Tuple[str, ...] = ()  # the launcher's own command instead of the scheduler's step (mpirun)


# The variable that lists the GPUs a process may use, by vendor (AMD: the ROCm runtime's, which Slurm sets).
VISIBLE_DEVICES = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}


def rendezvous_prelude(site: Site, scheduler: Scheduler, chosen: bool = False) -> Tuple[PreludeItem, ...]:
    """MASTER_ADDR: the profile's command run on the first node (the batch host), else the first host of
    the allocation (+ the site's suffix, e.g. `i` for InfiniBand); `chosen`: of the nodes pre-flight chose."""
    command = tuple(site.launch.rendezvous_command)
    hosts = scheduler.chosen_hosts_command() if chosen else scheduler.hosts_command()
    return (
        CommandOutput("MASTER_ADDR", command)
        if command
        else FirstHost("MASTER_ADDR", hosts, site.rendezvous_host_suffix),
        Export("MASTER_PORT", str(site.master_port)),
    )


def visible_gpus(site: Site, nproc_per_node: int) -> Tuple[PreludeItem, ...]:
    """Where the site shows a task only its own GPU (`binds_gpu_per_task`), every task is shown the first
    `nproc_per_node` GPUs of its node, as JSC's scripts export them: a per-node launcher's workers need
    them all, and a task per GPU takes its local rank's among them, so that NCCL can reach the node's
    other GPUs through CUDA IPC (NVLink; with only its own GPU visible it cannot: NVIDIA/nccl#324).
    psslurm keeps a value the job script set (psmgmt psslurmenv.c: setGPUEnv, PSIDpin_checkAutoVar)."""
    if not site.launch.binds_gpu_per_task or site.gpu_vendor not in VISIBLE_DEVICES:
        return ()
    return (Export(VISIBLE_DEVICES[site.gpu_vendor], ",".join(str(i) for i in range(nproc_per_node))),)


def _option(name: str, value: str) -> str:
    """`--name=value`, still a ShellWord when the value expands a variable."""
    return ShellWord(name + value) if isinstance(value, ShellWord) else name + value


# `bash -c 'trap "" USR1; exec "$@"' ignore-usr1 PROGRAM ARGS...`: PROGRAM runs with SIGUSR1 ignored.
IGNORE_USR1 = ("bash", "-c", 'trap "" USR1; exec "$@"', "ignore-usr1")


class LaunchStyle:
    """How a framework's processes start (its row's `launch`)."""

    def __init__(self, info: FrameworkInfo, chosen_nodes: bool = False):
        self.info = info
        # The job trains on the nodes pre-flight chose (`--preflight`): its node count and hosts are fixed by then.
        self.chosen_nodes = chosen_nodes

    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        raise NotImplementedError

    def rank_per_gpu(self, site: Site, nproc_per_node: int, **how: Any) -> LaunchSpec:
        """One task per GPU with its share of the node's CPUs, each starting the row's entry."""
        return LaunchSpec(
            tasks_per_node=nproc_per_node,
            cpus_per_task=max(1, site.cpus_for(self.info.name) // nproc_per_node),
            whole_node=False,
            launch_prefix=("python", "-m", self.info.entry),
            **how,
        )


class TorchrunPerNode(LaunchStyle):
    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        torchrun = ("python", "-m", "torchrun_jsc") if site.rendezvous_host_suffix else ("torchrun",)
        return LaunchSpec(
            tasks_per_node=1,
            cpus_per_task=site.cpus_for(self.info.name),
            prelude=rendezvous_prelude(site, scheduler, self.chosen_nodes) + visible_gpus(site, nproc_per_node),
            mpi=False,
            whole_node=True,
            launch_prefix=IGNORE_USR1
            + torchrun
            + (
                _option("--nnodes=", str(nodes) if self.chosen_nodes else scheduler.node_count_word(nodes)),
                "--nproc_per_node=%d" % nproc_per_node,
                "--rdzv_backend=c10d",
                ShellWord("--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT"),
                _option("--rdzv_id=", scheduler.job_id_word()),
                "-m",
                self.info.entry,
            ),
        )


class MpiPerGpu(LaunchStyle):
    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        return self.rank_per_gpu(site, nproc_per_node, prelude=visible_gpus(site, nproc_per_node), mpi=True)


class TaskPerGpu(LaunchStyle):
    """One scheduler task per GPU with its share of the node's CPUs, no torchrun: the trainer takes its
    rank from the task's variables; MASTER_ADDR/MASTER_PORT come from the batch script."""

    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        prelude = rendezvous_prelude(site, scheduler, self.chosen_nodes) + visible_gpus(site, nproc_per_node)
        return self.rank_per_gpu(site, nproc_per_node, prelude=prelude, mpi=False)


class Mpirun(LaunchStyle):
    """Open MPI's `mpirun` on the batch host starts one rank per GPU (`--map-by ppr:G:node`), each in
    its container, where the scheduler's MPI plugin does not fit the image's MPI."""

    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        step = ("mpirun", "-np", str(nodes * nproc_per_node), "--map-by", "ppr:%d:node" % nproc_per_node)
        return self.rank_per_gpu(
            site,
            nproc_per_node,
            prelude=(),
            mpi=True,
            own_step=step + tuple(site.launch.framework(self.info.name).step_options),
        )


class LocalTorchrun(LaunchStyle):
    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        prefix = (
            "torchrun",
            "--standalone",
            "--nnodes=1",
            "--nproc_per_node=%d" % nproc_per_node,
            "-m",
            self.info.entry,
        )
        return LaunchSpec(1, site.cpus_per_node, (), False, True, prefix)


class LocalHorovod(LaunchStyle):
    """horovodrun is the one task; it starts the ranks."""

    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        prefix = ("horovodrun", "--gloo", "-np", str(nproc_per_node), "python", "-m", self.info.entry)
        return LaunchSpec(1, site.cpus_per_node, (), False, True, prefix)


class TaskPerWorker(LaunchStyle):
    """One task per process: workers (`--gpus` per node), the row's servers on every node and its
    coordinators; each task takes its role from its task id (dlaunch/train/engines.py), and finds the others
    through the job's DLAUNCH_NODELIST and MASTER_PORT. The interpreter is the site's for the engine
    (`interpreters`)."""

    def spec(self, site: Site, scheduler: Scheduler, nodes: int, nproc_per_node: int) -> LaunchSpec:
        info = self.info
        per_node = nproc_per_node + info.servers_per_node
        slots = per_node + (1 if info.coordinators else 0)  # the first node also holds the coordinators
        python = site.interpreters.get(info.engine, "python")  # type: ignore[call-overload]  # info.engine is an interpreters key (torch, tensorflow, mxnet)
        return LaunchSpec(
            tasks_per_node=per_node,
            cpus_per_task=max(1, site.cpus_per_node // slots),
            prelude=rendezvous_prelude(site, scheduler, self.chosen_nodes),
            mpi=False,
            whole_node=False,
            launch_prefix=(python, "-m", info.entry),
            extra_tasks=info.coordinators,
            overcommit=slots > site.cpus_per_node,
        )


# (a launch mode on a cluster's nodes | on this machine alone): the framework table's styles and
# the modes a profile may choose instead (sites.LAUNCH_MODES)
LAUNCH_STYLES = {
    "torchrun-per-node": (TorchrunPerNode, LocalTorchrun),
    "task-per-gpu": (TaskPerGpu, LocalTorchrun),
    "mpi-per-gpu": (MpiPerGpu, LocalHorovod),
    "mpirun": (Mpirun, LocalHorovod),
    "task-per-worker": (TaskPerWorker, TaskPerWorker),  # the local scheduler starts the tasks itself
}


def launch_mode(site: Site, framework: str, chosen_nodes: bool = False) -> LaunchStyle:
    """How a framework starts on a site: the profile's mode for it, else the framework table's style; its
    form on this machine alone where the site's scheduler runs its jobs there (`Scheduler.this_machine`).
    `chosen_nodes`: on the nodes pre-flight chose (`LaunchStyle.chosen_nodes`)."""
    info = FRAMEWORKS[framework]
    mode = site.launch_mode(framework)
    if mode not in LAUNCH_STYLES:
        raise DlaunchError("--framework %s: launch style %r has no launcher" % (framework, mode))
    on_nodes, here = LAUNCH_STYLES[mode]
    return here(info) if scheduler_for(site.scheduler.kind).this_machine else on_nodes(info, chosen_nodes)
