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
from launcher.sites import Site


class ShellWord(str):
    """An argument that expands shell variables of the batch script; rendered in double quotes."""


@dataclass(frozen=True)
class LaunchSpec:
    tasks_per_node: int
    cpus_per_task: int
    prelude: Tuple[str, ...]  # shell lines run on the batch host before srun
    srun_args: Tuple[str, ...]
    launch_prefix: Tuple[str, ...]  # the program and its arguments in front of the trainer's


def rendezvous_prelude(site: Site) -> Tuple[str, ...]:
    """MASTER_ADDR: the first host of the allocation (+ the site's suffix, e.g. `i` for InfiniBand)."""
    return (
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)%s"' % site.rendezvous_host_suffix,
        "export MASTER_ADDR",
        "export MASTER_PORT=%d" % site.master_port,
    )


# One failed task (a crashed node's torchrun, a dead MPI rank) ends the whole step instead of leaving
# the other nodes waiting in a collective until the time limit.
KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"

# `bash -c 'trap "" USR1; exec "$@"' ignore-usr1 PROGRAM ARGS...`: PROGRAM runs with SIGUSR1 ignored.
IGNORE_USR1 = ("bash", "-c", 'trap "" USR1; exec "$@"', "ignore-usr1")


class TorchrunPerNode:
    def spec(self, site: Site, nproc_per_node: int) -> LaunchSpec:
        torchrun = ("python", "-m", "torchrun_jsc") if site.rendezvous_host_suffix else ("torchrun",)
        return LaunchSpec(
            tasks_per_node=1,
            cpus_per_task=site.cpus_per_node,
            prelude=rendezvous_prelude(site),
            srun_args=("--ntasks-per-node=1", "--cpu-bind=none", KILL_ON_BAD_EXIT),
            launch_prefix=IGNORE_USR1 + torchrun + (
                ShellWord("--nnodes=$SLURM_JOB_NUM_NODES"),
                "--nproc_per_node=%d" % nproc_per_node,
                "--rdzv_backend=c10d",
                ShellWord("--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT"),
                ShellWord("--rdzv_id=$SLURM_JOB_ID"),
                "-m",
                "train",
            ),
        )


class MpiPerGpu:
    def spec(self, site: Site, nproc_per_node: int) -> LaunchSpec:
        if not site.mpi_plugin:
            raise DlaunchError("--framework horovod: site %s has no mpi_plugin for srun --mpi" % site.name)
        return LaunchSpec(
            tasks_per_node=nproc_per_node,
            cpus_per_task=max(1, site.cpus_per_node // nproc_per_node),
            prelude=(),
            srun_args=("--ntasks-per-node=%d" % nproc_per_node, "--mpi=%s" % site.mpi_plugin, KILL_ON_BAD_EXIT),
            launch_prefix=("python", "-m", "train"),
        )


class LocalTorchrun:
    def spec(self, site: Site, nproc_per_node: int) -> LaunchSpec:
        prefix = ("torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=%d" % nproc_per_node, "-m", "train")
        return LaunchSpec(1, site.cpus_per_node, (), (), prefix)


class LocalHorovod:
    def spec(self, site: Site, nproc_per_node: int) -> LaunchSpec:
        prefix = ("horovodrun", "--gloo", "-np", str(nproc_per_node), "python", "-m", "train")
        return LaunchSpec(nproc_per_node, max(1, site.cpus_per_node // nproc_per_node), (), (), prefix)


def launch_mode(scheduler: str, framework: str):
    """The launch mode of a framework under a scheduler."""
    per_gpu = framework == "horovod"
    if scheduler == "local":
        return LocalHorovod() if per_gpu else LocalTorchrun()
    return MpiPerGpu() if per_gpu else TorchrunPerNode()
