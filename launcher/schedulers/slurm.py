"""Slurm: `#SBATCH` directives, `srun` steps; sbatch/squeue/scontrol/scancel, each with a timeout."""
import re
import subprocess
from pathlib import Path
from typing import Annotated, Dict, List, Literal, Optional, Sequence, Tuple

from pydantic import Field, StringConstraints, field_validator

from launcher.errors import SchedulerError
from launcher.jobs.jobspec import Banner, EndTime, Export, HostList, JobSpec, PreludeItem, ShellWord
from launcher.schedulers import Job, JobState, Scheduler, Submission
from launcher.jobs.schema import GRES, OPTION, Option, Partition, SafeName, StrictModel, format_time
from launcher.jobs.schema import check_partitions
from train import jobenv

SIGNAL_LEAD_S = 120  # seconds before the time limit at which the job is told to checkpoint
# One failed task (a crashed node's torchrun, a dead MPI rank) ends the whole step instead of leaving
# the other nodes waiting in a collective until the time limit.
KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"
# Slurm's state words by what they mean to dlaunch (prefixes: `CANCELLED by 0`).
_STATES = (
    (("PENDING", "CONFIGURING"), JobState.PENDING),
    (("RUNNING",), JobState.RUNNING),
    (("COMPLETING",), JobState.COMPLETING),
    (("COMPLETED",), JobState.COMPLETED),
    (("FAILED", "BOOT_FAIL", "DEADLINE"), JobState.FAILED),
    (("CANCELLED",), JobState.CANCELLED),
    (("TIMEOUT",), JobState.TIMEOUT),
    (("NODE_FAIL",), JobState.NODE_FAIL),
    (("PREEMPTED",), JobState.PREEMPTED),
    (("OUT_OF_MEMORY",), JobState.OUT_OF_MEMORY),
    (("REQUEUE",), JobState.REQUEUED),
    (("SUSPENDED", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT"), JobState.SUSPENDED),
)
GONE = "unknown (not in Slurm any more)"


def classify(state: str) -> JobState:
    if state == GONE:
        return JobState.GONE
    for words, meaning in _STATES:
        if state.startswith(words):
            return meaning
    return JobState.UNKNOWN


class SlurmConfig(StrictModel):
    kind: Literal["slurm"]
    partitions: List[Partition] = Field(min_length=1)
    mpi_plugin: Optional[SafeName] = None  # srun --mpi=... for MPI-launched frameworks
    gres: Optional[Annotated[str, StringConstraints(pattern=GRES)]] = None
    # How the job asks for its GPUs, following the GPUs per node it uses (--gpus): `--gres=gpu:N` or
    # `--gpus-per-node=N`; "none": the site's directives (or nothing) ask.
    gpu_request: Literal["none", "gres", "gpus-per-node"] = "none"
    directives: List[Option] = []  # extra #SBATCH options
    step_options: List[Option] = []  # extra srun options

    @field_validator("partitions")
    @classmethod
    def _partitions(cls, partitions: List[Partition]) -> List[Partition]:
        return check_partitions(partitions, OPTION, "--name or --name=value")


class Slurm(Scheduler):
    """sbatch/squeue/scontrol/scancel; `SLURM_CONF` names the controller's configuration."""

    kind = "slurm"
    label = "Slurm"
    directive_prefix = "#SBATCH"
    commands = ("sbatch", "squeue", "scontrol", "scancel")
    ping_command = ("scontrol", "ping")  # "Slurmctld(primary) at HOST is UP", exit 1 when down
    Config = SlurmConfig
    # What srun gives every task of a step (sbatch/srun manual pages, "OUTPUT ENVIRONMENT VARIABLES").
    task_variables = ((jobenv.NTASKS, "SLURM_NTASKS"), (jobenv.TASK_ID, "SLURM_PROCID"),
                      (jobenv.LOCAL_TASK_ID, "SLURM_LOCALID"), (jobenv.NODE_ID, "SLURM_NODEID"),
                      (jobenv.TASKS_PER_NODE, "SLURM_STEP_TASKS_PER_NODE"))

    def directives(self, cfg: SlurmConfig, job: JobSpec) -> Tuple[str, ...]:
        queue = job.queue
        return (
            "--job-name=%s" % job.name,
            "--nodes=%d" % job.nodes,
            # Coordinator tasks make the count uneven: Slurm places --ntasks over the nodes.
            "--ntasks-per-node=%d" % job.tasks_per_node if not job.extra_tasks else "--ntasks=%d" % job.tasks,
            *(("--overcommit",) if job.overcommit else ()),
            "--cpus-per-task=%d" % job.cpus_per_task,
            *(("--partition=%s" % queue.slurm_partition,) if queue.slurm_partition else ()),
            *(("--qos=%s" % queue.qos,) if queue.qos else ()),
            "--time=%s" % format_time(job.seconds),
            *(("--account=%s" % job.account,) if job.account else ()),
            *(("--gres=%s" % cfg.gres,) if cfg.gres else ()),
            *(("--gres=gpu:%d" % job.gpus_per_node,) if cfg.gpu_request == "gres" else ()),
            *(("--gpus-per-node=%d" % job.gpus_per_node,) if cfg.gpu_request == "gpus-per-node" else ()),
            "--output=%s/slurm-%%j.out" % job.run_dir,
            "--open-mode=append",  # a requeued attempt adds to the log instead of replacing it
            "--requeue" if job.requeue else "--no-requeue",
            # To every process of the steps (no `B:`); see launchers.py for torchrun.
            "--signal=USR1@%d" % SIGNAL_LEAD_S,
            *cfg.directives,
            *queue.directives,
        )

    def prelude(self, cfg: SlurmConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:
        return (
            Banner("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_JOB_NODELIST"),
            # Slurm >= 22.05 no longer hands sbatch's --cpus-per-task to srun; this variable does.
            Export("SRUN_CPUS_PER_TASK", ShellWord("$SLURM_CPUS_PER_TASK")),
            # The trainer tells the time limit's SIGTERM from a cancel by it (train/signals.py).
            EndTime("DLAUNCH_JOB_END_TIME", job.seconds),
        )

    def job_environment(self, cfg: SlurmConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:
        return (
            Export(jobenv.JOB_ID, ShellWord("$SLURM_JOB_ID")),
            Export(jobenv.RESTART_COUNT, ShellWord("$SLURM_RESTART_COUNT")),  # unset before a requeue
            Export(jobenv.NNODES, ShellWord("$SLURM_JOB_NUM_NODES")),
            HostList(jobenv.NODELIST, self.hosts_command()),
        )

    def step(self, cfg: SlurmConfig, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]) -> Tuple[str, ...]:
        if mpi and not cfg.mpi_plugin:
            raise SchedulerError("no [scheduler] mpi_plugin for srun --mpi (an MPI-launched framework needs one)")
        tasks = "--ntasks-per-node=%d" % job.tasks_per_node if not job.extra_tasks else "--ntasks=%d" % job.tasks
        return ("srun", tasks, *(("--overcommit",) if job.overcommit else ()),
                *(("--cpu-bind=none",) if whole_node else ()),
                *(("--mpi=%s" % cfg.mpi_plugin,) if mpi else ()),
                KILL_ON_BAD_EXIT, *cfg.step_options, *options)

    def node_count_word(self, nodes: int) -> str:
        return ShellWord("$SLURM_JOB_NUM_NODES")

    def job_id_word(self) -> str:
        return ShellWord("$SLURM_JOB_ID")

    def hosts_command(self) -> Tuple[str, ...]:
        return ("scontrol", "show", "hostnames", ShellWord("$SLURM_JOB_NODELIST"))

    # -- the batch system ---------------------------------------------------------------------------
    def _run(self, argv: List[str]) -> subprocess.CompletedProcess:
        try:
            return super()._run(argv)
        except SchedulerError as e:  # name the controller's configuration: the usual culprit in tests
            raise SchedulerError("%s (%s)" % (e, self.environ.get("SLURM_CONF", "default slurm.conf"))) from None

    def submit(self, script: Path, run_dir: Path) -> Submission:
        result = self._run(["sbatch", "--parsable", str(script)])
        job_id = result.stdout.strip().split(";")[0]
        if result.returncode != 0 or not job_id.isdigit():
            reason = (result.stderr.strip() or result.stdout.strip() or "no reason given").splitlines()[-1]
            raise SchedulerError("sbatch refused the job: %s" % reason)
        return Submission(job_id)

    def state(self, job_id: str) -> str:
        """PENDING, RUNNING, COMPLETED, ... or `unknown (...)` when Slurm no longer knows the job."""
        try:
            squeue = self._run(["squeue", "-h", "-j", job_id, "-o", "%T"])
            if squeue.returncode == 0 and squeue.stdout.strip():
                return squeue.stdout.split()[0]
            scontrol = self._run(["scontrol", "show", "job", "-o", job_id])
        except SchedulerError as e:
            return "unknown (%s)" % e
        m = re.search(r"\bJobState=(\S+)", scontrol.stdout)
        return m.group(1) if m else GONE

    def jobs(self, job_ids: Sequence[str]) -> Dict[str, Job]:
        """One `squeue` for all; `scontrol` only for jobs that left the queue."""
        if not job_ids:
            return {}
        try:
            listed = self._run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%S|%P"])
        except SchedulerError as e:
            return {job_id: Job("unknown (%s)" % e, JobState.UNKNOWN) for job_id in job_ids}
        rows = {}
        for line in listed.stdout.splitlines() if listed.returncode == 0 else ():
            fields = line.strip().split("|")
            if len(fields) == 5:
                rows[fields[0]] = fields
        positions = self._pending_positions(sorted({row[4] for row in rows.values() if row[1] == "PENDING"}))
        found = {}
        for job_id in job_ids:
            if job_id in rows:
                _, state, reason, start, _ = rows[job_id]
                found[job_id] = Job(state, classify(state), reason, positions.get(job_id), start)
            else:  # ended and out of squeue (or squeue refused an id it no longer knows)
                state = self.state(job_id)
                found[job_id] = Job(state, classify(state))
        return found

    def _pending_positions(self, partitions: Sequence[str]) -> Dict[str, int]:
        """Job id -> place among the pending jobs of its partitions, highest priority first."""
        if not partitions:
            return {}
        try:
            listed = self._run(["squeue", "-h", "-t", "PENDING", "-p", ",".join(partitions), "-o", "%i", "--sort=-p,i"])
        except SchedulerError:
            return {}
        ids = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
        return {job_id: place for place, job_id in enumerate(ids, 1)}

    def end_reason(self, job_id: str) -> Optional[str]:
        """`FAILED, exit code 1:0, reason NonZeroExitCode`, while Slurm remembers the job."""
        try:
            shown = self._run(["scontrol", "show", "job", "-o", job_id]).stdout
        except SchedulerError:
            return None
        fields = dict(re.findall(r"\b(JobState|ExitCode|Reason)=(\S+)", shown))
        if "JobState" not in fields:
            return None
        return "%s, exit code %s, reason %s" % (fields["JobState"], fields.get("ExitCode", "?"), fields.get("Reason", "None"))

    def cancel(self, job_id: str) -> None:
        result = self._run(["scancel", job_id])
        if result.returncode != 0:
            raise SchedulerError("scancel %s failed: %s" % (job_id, result.stderr.strip() or result.returncode))
