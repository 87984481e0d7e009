"""Slurm: `#SBATCH` directives, `srun` steps; sbatch/squeue/scontrol/sacct/scancel, each with a timeout.

The job's log is `slurm-<job id>.out` in the run directory (`--open-mode=append`: a requeued attempt
adds to it after its banner). A job that left the queue is looked up with `scontrol`, and once the
controller has forgotten it in the accounting database (`sacct`), which also holds Slurm's own energy
figure for the job (`ConsumedEnergyRaw`). `jobs()` asks each of squeue, scontrol and sacct once for all
the jobs it is given, and keeps what it learned of those that left the queue for `end_reason` and
`job_energy` (the run service asks them right after, per run: `_LEFT_QUEUE`).

Slurm's figure comes from its `AcctGatherEnergyType` plugin (RAPL, IPMI, HPE Cray pm_counters, NVML
GPU...), per node over the whole allocation, so it counts what the trainer's counters do not (idle GPUs,
start-up, the container) and, on a shared node, other jobs too (sacct: "only in the case of an
exclusive job allocation does this value reflect the job's real energy consumption"). Where no plugin
is configured Slurm records 0, which is "unavailable", not zero joules.
"""

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Dict, FrozenSet, List, Literal, Optional, Sequence, Tuple

from pydantic import Field, StringConstraints, field_validator, model_validator

from dlaunch.errors import SchedulerError
from dlaunch.schedulers import Figure, JobState, JobStatus, Scheduler, ScriptCheck, Submission
from dlaunch.specs.job import Banner, EndTime, Export, HostList, JobSpec, PreludeItem, ShellWord
from dlaunch.specs.schema import OPTION, Option, Partition, SafeName, StrictModel, check_partitions, format_time
from dlaunch.train import jobenv

GRES = r"^[A-Za-z0-9_:,.-]+$"  # a --gres value (`gpu:4`, `gpu:a100:4,nvme`)
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
# What `sbatch --test-only`'s refusal names, and what to do about it (first match wins; `dlaunch doctor`).
_REFUSALS = (
    (
        "account",
        "pass --account that `sacctmgr show assoc user=$USER` lists (or set the profile's account_env variable)",
    ),
    ("qos", "the partition row's qos is not one the account may use: fix the row or pass --partition"),
    ("partition", "fix the profile's partition names (`sinfo -s` lists the site's) or pass --partition"),
    ("time limit", "the partition row's max_time is above the site's limit: lower it in the profile"),
    ("node count", "the job's node count is outside the partition's limits: fix the row's min_nodes/max_nodes"),
    (
        "node configuration",
        "the job asks a node for more CPUs, GPUs or features than it has: fix cores_per_node, "
        "threads_per_core, gpus_per_node or the directives",
    ),
    ("feature", "a --constraint of the profile's directives names a feature the nodes lack"),
)
# sacct prints ConsumedEnergy with a unit prefix in steps of 1000 (`convert_num_unit2(..., 1000, ...)`).
PREFIXES = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
NO_VALUE = 2**64 - 2  # Slurm's NO_VAL64, printed by some versions for "not recorded"
SHOWN_FIELDS = r"\b(JobId|JobState|ExitCode|Reason)=(\S+)"  # of a `scontrol show job -o` line
END_FIELDS = ("State", "ExitCode", "Reason")  # sacct's names of what end_reason says
ACCOUNTED_FIELDS = END_FIELDS + ("ConsumedEnergyRaw",)  # what jobs() asks sacct of the jobs that left the queue


@dataclass(frozen=True)
class LeftQueue:
    """What one `scontrol show job` and one `sacct` said of the jobs that had left the queue (`asked`):
    scontrol's fields per job it still holds (None: scontrol could not be run, `scontrol_error` says why),
    sacct's ACCOUNTED_FIELDS per job it has a line of, and why it gave none (`sacct_error`: job_energy's reason)."""

    asked: FrozenSet[str]
    shown: Optional[Dict[str, Dict[str, str]]]
    scontrol_error: str
    accounted: Dict[str, List[str]]
    sacct_error: Optional[str]

    def state(self, job_id: str) -> str:
        """The controller's word, else the accounting's, else GONE (as asked of one job alone)."""
        if self.shown is None:
            return "unknown (%s)" % self.scontrol_error
        if job_id in self.shown:
            return self.shown[job_id]["JobState"]
        accounted = self.accounted.get(job_id)
        return accounted[0].split()[0] if accounted and accounted[0] else GONE

    def energy(self, job_id: str) -> Figure:
        """The job's ConsumedEnergyRaw, or why there is none (as job_energy of one job alone says it)."""
        if self.sacct_error:
            return self.sacct_error
        if job_id not in self.accounted:
            return "unavailable: sacct knows no job %s" % job_id
        return energy_figure(self.accounted[job_id][-1])

    def end_fields(self, job_id: str) -> Optional[Dict[str, str]]:
        """JobState, ExitCode, Reason: the controller's, else the accounting's; None when neither has the job."""
        if self.shown is None:
            return None
        if job_id in self.shown:
            return self.shown[job_id]
        accounted = self.accounted.get(job_id)
        return dict(zip(("JobState", "ExitCode", "Reason"), accounted)) if accounted else None


# The last `jobs()`'s LeftQueue per environment (the commands it found, the cluster it asked): a Slurm
# instance is made per use, and end_reason and job_energy follow jobs() on another one.
_LEFT_QUEUE: Dict[Tuple[Tuple[str, str], ...], LeftQueue] = {}


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
        for p in partitions:
            if p.partition == "" and not p.qos:
                raise ValueError('partition %s: partition = "" needs a qos (the job must go somewhere)' % p.name)
        return check_partitions(partitions, OPTION, "--name or --name=value")

    @model_validator(mode="after")
    def _one_gpu_request(self) -> "SlurmConfig":
        if self.gpu_request != "none" and "gpu" in (self.gres or ""):
            raise ValueError("gres and gpu_request both ask for GPUs: keep gpu_request")
        return self


def partition_option(row: Partition) -> Optional[str]:
    """A row's `--partition` value: `partition`, else `name`; None when the queue is chosen by QOS alone
    (`partition = ""`)."""
    return row.name if row.partition is None else (row.partition or None)


class Slurm(Scheduler):
    """sbatch/squeue/scontrol/scancel; `SLURM_CONF` names the controller's configuration."""

    kind = "slurm"
    label = "Slurm"
    directive_prefix = "#SBATCH"
    commands = ("sbatch", "squeue", "scontrol", "scancel")
    status_command = "squeue"
    ping_command = ("scontrol", "ping")  # "Slurmctld(primary) at HOST is UP", exit 1 when down
    server_variable = "SLURM_CONF"
    signal_lead_s = 120  # `--signal=USR1@120`: the trainer checkpoints (dlaunch/train/signals.py)
    step_option_form = (OPTION, "an srun option (--name or --name=value)")
    one_thread_per_core = "--hint=nomultithread"  # implies --threads-per-core=1 (sbatch manual)
    Config = SlurmConfig
    queued = True
    this_machine = False
    # slurmstepd's words when it ends a job (`*** JOB 12 ON n1 CANCELLED AT ... DUE TO TIME LIMIT ***`) or
    # requeues it; srun's and slurmstepd's messages around a task that failed.
    excludes_nodes = True  # sbatch --exclude (its manual page: "Explicitly exclude certain nodes")
    log_verdicts = (r"DUE TO (TIME LIMIT|NODE FAILURE|PREEMPTION)|CANCELLED AT|JOB REQUEUE",)
    log_noise = (r"srun: error:", r"slurmstepd: error:.*(Exited|task \d+)")
    no_test_submission = ""
    # What srun gives every task of a step (sbatch/srun manual pages, "OUTPUT ENVIRONMENT VARIABLES").
    task_variables = (
        (jobenv.NTASKS, "SLURM_NTASKS"),
        (jobenv.TASK_ID, "SLURM_PROCID"),
        (jobenv.LOCAL_TASK_ID, "SLURM_LOCALID"),
        (jobenv.NODE_ID, "SLURM_NODEID"),
        (jobenv.TASKS_PER_NODE, "SLURM_STEP_TASKS_PER_NODE"),
    )

    def directives(self, cfg: SlurmConfig, job: JobSpec) -> Tuple[str, ...]:  # type: ignore[override]  # a scheduler's methods take its own Config; the contract (Scheduler) types it as the base model
        queue = job.queue
        return (
            "--job-name=%s" % job.name,
            "--nodes=%d" % job.nodes,
            # Coordinator tasks make the count uneven: Slurm places --ntasks over the nodes.
            "--ntasks-per-node=%d" % job.tasks_per_node if not job.extra_tasks else "--ntasks=%d" % job.tasks,
            *(("--overcommit",) if job.overcommit else ()),
            "--cpus-per-task=%d" % job.cpus_per_task,
            *((self.one_thread_per_core,) if not job.smt else ()),
            *(("--partition=%s" % partition_option(queue),) if partition_option(queue) else ()),  # type: ignore[arg-type]  # a queued scheduler's job has its queue (jobs/plan.py)
            *(("--qos=%s" % queue.qos,) if queue.qos else ()),  # type: ignore[union-attr]  # a queued scheduler's job has its queue (jobs/plan.py)
            "--time=%s" % format_time(job.seconds),
            *(("--exclude=%s" % ",".join(job.exclude),) if job.exclude else ()),
            *(("--account=%s" % job.account,) if job.account else ()),
            *(("--gres=%s" % cfg.gres,) if cfg.gres else ()),
            *(("--gres=gpu:%d" % job.gpus_per_node,) if cfg.gpu_request == "gres" else ()),
            *(("--gpus-per-node=%d" % job.gpus_per_node,) if cfg.gpu_request == "gpus-per-node" else ()),
            "--output=%s/slurm-%%j.out" % job.run_dir,
            "--open-mode=append",  # a requeued attempt adds to the log instead of replacing it
            "--requeue" if job.requeue else "--no-requeue",
            # To every process of the steps (no `B:`); see launchers.py for torchrun.
            "--signal=USR1@%d" % self.signal_lead_s,
            *cfg.directives,
            *queue.directives,  # type: ignore[union-attr]  # a queued scheduler's job has its queue (jobs/plan.py)
        )

    def prelude(self, cfg: SlurmConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:  # type: ignore[override]  # a scheduler's methods take its own Config; the contract (Scheduler) types it as the base model
        return (
            Banner("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_JOB_NODELIST"),
            # Slurm >= 22.05 no longer hands sbatch's --cpus-per-task to srun; this variable does.
            Export("SRUN_CPUS_PER_TASK", ShellWord("$SLURM_CPUS_PER_TASK")),
            # The trainer tells the time limit's SIGTERM from a cancel by it (dlaunch/train/signals.py).
            EndTime("DLAUNCH_JOB_END_TIME", job.seconds),
        )

    def job_environment(self, cfg: SlurmConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:  # type: ignore[override]  # a scheduler's methods take its own Config; the contract (Scheduler) types it as the base model
        return (
            Export(jobenv.JOB_ID, ShellWord("$SLURM_JOB_ID")),
            Export(jobenv.RESTART_COUNT, ShellWord("$SLURM_RESTART_COUNT")),  # unset before a requeue
            Export(jobenv.NNODES, ShellWord("$SLURM_JOB_NUM_NODES")),
            HostList(jobenv.NODELIST, self.hosts_command()),
        )

    def step(  # type: ignore[override]  # a scheduler's methods take its own Config; the contract (Scheduler) types it as the base model
        self, cfg: SlurmConfig, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]
    ) -> Tuple[str, ...]:
        if mpi and not cfg.mpi_plugin:
            raise SchedulerError("no [scheduler] mpi_plugin for srun --mpi (an MPI-launched framework needs one)")
        tasks = "--ntasks-per-node=%d" % job.tasks_per_node if not job.extra_tasks else "--ntasks=%d" % job.tasks
        return (
            "srun",
            tasks,
            *(("--overcommit",) if job.overcommit else ()),
            *(("--cpu-bind=none",) if whole_node else ()),
            *(("--mpi=%s" % cfg.mpi_plugin,) if mpi else ()),
            KILL_ON_BAD_EXIT,
            *cfg.step_options,
            *options,
        )

    def node_check_step(  # type: ignore[override]  # a scheduler's methods take its own Config; the contract (Scheduler) types it as the base model
        self, cfg: SlurmConfig, nodes: int, timeout_s: int, options: Sequence[str]
    ) -> Tuple[str, ...]:
        # No --kill-on-bad-exit: a node whose check fails must not end the others' (srun's default is 0). The counts
        # are given: srun would take the job's task count (SLURM_NTASKS) otherwise.
        minutes = -(-timeout_s // 60)
        counts = ("--nodes=%d" % nodes, "--ntasks=%d" % nodes, "--ntasks-per-node=1")
        return ("srun", *counts, "--cpu-bind=none", "--time=%d" % minutes, *cfg.step_options, *options)

    def node_select_step(self, cfg: SlurmConfig, options: Sequence[str]) -> Tuple[str, ...]:  # type: ignore[override]  # a scheduler's methods take its own Config; the contract (Scheduler) types it as the base model
        return ("srun", "--nodes=1", "--ntasks=1", *cfg.step_options, *options)

    def chosen_nodes_options(self, nodes: int, tasks: int) -> Tuple[str, ...]:
        # srun would take the job's node and task counts (SLURM_NNODES, SLURM_NTASKS) otherwise.
        return ("--nodes=%d" % nodes, "--ntasks=%d" % tasks, ShellWord("--nodelist=$%s" % jobenv.NODELIST))

    def chosen_hosts_command(self) -> Tuple[str, ...]:
        return ("scontrol", "show", "hostnames", ShellWord("$%s" % jobenv.NODELIST))

    def gpu_request_field(self, cfg: SlurmConfig) -> Optional[str]:  # type: ignore[override]  # a scheduler's methods take its own Config; the contract (Scheduler) types it as the base model
        return "gpu_request" if cfg.gpu_request != "none" else None

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

    def _environment(self) -> Tuple[Tuple[str, str], ...]:
        return tuple(sorted(self.environ.items()))

    def _shown(self, job_id: Optional[str] = None) -> Dict[str, Dict[str, str]]:
        """scontrol's JobState, ExitCode and Reason per job the controller holds: `job_id`'s, or every job's (one
        request: squeue asks the controller for every job too). SchedulerError when scontrol cannot be run."""
        shown = self._run(["scontrol", "show", "job", "-o"] + ([job_id] if job_id else [])).stdout
        found = {}
        for line in shown.splitlines():
            fields = dict(re.findall(SHOWN_FIELDS, line))
            if "JobId" in fields and "JobState" in fields:
                found[fields.pop("JobId")] = fields
        return found

    def _accounted(self, job_ids: Sequence[str], fields: Sequence[str]) -> Tuple[Dict[str, List[str]], Optional[str]]:
        """`fields` of each job's allocation in the accounting database (`sacct`, one call) by job id, and why
        sacct gave nothing ("unavailable: ..."; None when it answered)."""
        try:
            listed = self._run(
                [
                    "sacct",
                    "-j",
                    ",".join(job_ids),
                    "-X",
                    "--noheader",
                    "--parsable2",
                    "-o",
                    ",".join(("JobID",) + tuple(fields)),
                ]
            )
        except SchedulerError as e:
            return {}, "unavailable: %s" % e
        if listed.returncode != 0:
            message = (listed.stderr or "").strip().splitlines()
            return {}, "unavailable: sacct: %s" % (message[-1] if message else "exit %d" % listed.returncode)
        asked = set(job_ids)
        rows = [line.split("|") for line in listed.stdout.splitlines() if line.strip()]
        # each job's first line (reversed: the first overwrites the later ones)
        return {r[0]: r[1:] for r in reversed(rows) if r[0] in asked and len(r) == len(fields) + 1}, None

    def _left_queue(self, job_ids: Sequence[str]) -> LeftQueue:
        """One scontrol and one sacct for the jobs that left the queue, kept for end_reason and job_energy
        (none asked, and nothing kept, when no job did)."""
        if not job_ids:
            _LEFT_QUEUE.pop(self._environment(), None)
            return LeftQueue(frozenset(), {}, "", {}, None)
        try:
            shown: Optional[Dict[str, Dict[str, str]]] = self._shown()
            error = ""
        except SchedulerError as e:
            shown, error = None, str(e)
        accounted, sacct_error = self._accounted(job_ids, ACCOUNTED_FIELDS)
        asked = frozenset(job_ids)
        left = LeftQueue(
            asked,
            {j: fields for j, fields in shown.items() if j in asked} if shown is not None else None,
            error,
            accounted,
            sacct_error,
        )
        _LEFT_QUEUE[self._environment()] = left
        return left

    def _last_left_queue(self, job_id: str) -> Optional[LeftQueue]:
        """The last jobs()'s LeftQueue in this environment, when it asked about `job_id`."""
        left = _LEFT_QUEUE.get(self._environment())
        return left if left is not None and job_id in left.asked else None

    def jobs(self, runs: Sequence[Tuple[str, Path]]) -> List[JobStatus]:
        found = self._jobs(list(dict.fromkeys(job_id for job_id, _ in runs)))
        return [found[job_id] for job_id, _ in runs]

    def _jobs(self, job_ids: Sequence[str]) -> Dict[str, JobStatus]:
        """One `squeue` for all; for the jobs that left the queue one `scontrol` and one `sacct` for all."""
        if not job_ids:
            return {}
        try:
            listed = self._run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%S|%P"])
        except SchedulerError as e:
            return {job_id: JobStatus("unknown (%s)" % e, JobState.UNKNOWN) for job_id in job_ids}
        rows = {}
        for line in listed.stdout.splitlines() if listed.returncode == 0 else ():
            fields = line.strip().split("|")
            if len(fields) == 5:
                rows[fields[0]] = fields
        positions = self._pending_positions(sorted({row[4] for row in rows.values() if row[1] == "PENDING"}))
        # ended and out of squeue (or squeue refused an id it no longer knows)
        left_queue = self._left_queue([job_id for job_id in job_ids if job_id not in rows])
        found = {}
        for job_id in job_ids:
            if job_id in rows:
                _, state, reason, start, _ = rows[job_id]
                found[job_id] = JobStatus(state, classify(state), reason, positions.get(job_id), start)
            else:
                state = left_queue.state(job_id)
                found[job_id] = JobStatus(state, classify(state))
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
        """`FAILED, exit code 1:0, reason NonZeroExitCode`, while Slurm remembers the job (the controller,
        then the accounting database): what the last jobs() learned of it, else asked of this job alone."""
        left = self._last_left_queue(job_id)
        if left is not None:
            fields = left.end_fields(job_id)
        else:
            try:
                fields = self._shown(job_id).get(job_id)
            except SchedulerError:
                return None
            if fields is None:
                accounted = self._accounted([job_id], END_FIELDS)[0].get(job_id)
                fields = dict(zip(("JobState", "ExitCode", "Reason"), accounted)) if accounted else None
        if fields is None:
            return None
        return "%s, exit code %s, reason %s" % (
            fields["JobState"],
            fields.get("ExitCode", "?"),
            fields.get("Reason") or "None",
        )

    def job_energy(self, job_id: str) -> Figure:
        """Slurm's figure for the job's nodes (`sacct -o ConsumedEnergyRaw`): what the last jobs() learned of
        it, else asked of this job alone; a missing or failing sacct is a reason."""
        left = self._last_left_queue(job_id)
        if left is not None:
            return left.energy(job_id)
        try:
            result = self._run(sacct_energy_command(job_id))
        except SchedulerError as e:
            return "unavailable: %s" % e
        if result.returncode != 0:
            message = (result.stderr or "").strip().splitlines()
            return "unavailable: sacct: %s" % (message[-1] if message else "exit %d" % result.returncode)
        return parse_consumed_energy(result.stdout, job_id)

    def check_script(self, script: Path) -> ScriptCheck:
        """`sbatch --test-only`: Slurm validates the account, partition, QOS and options, submits nothing."""
        chosen = (
            " ".join(
                line.split(None, 1)[1]
                for line in script.read_text(encoding="utf-8").splitlines()
                if line.startswith(("#SBATCH --account", "#SBATCH --partition", "#SBATCH --qos"))
            )
            or "no account or partition"
        )
        tested = self._run(["sbatch", "--test-only", str(script)])
        said = " ".join((tested.stderr + tested.stdout).split()).replace("sbatch: ", "")
        if tested.returncode == 0:
            return ScriptCheck(True, "%s: sbatch --test-only accepted (%s)" % (chosen, said))
        fix = next(
            (fix for word, fix in _REFUSALS if word in said.lower()),
            "pass --account/--partition that `sacctmgr show assoc user=$USER` lists, or fix the profile's partitions",
        )
        return ScriptCheck(False, "%s: %s" % (chosen, said), fix)

    def mpi_plugins(self) -> List[str]:
        """`srun --mpi=list` (no allocation needed): one plugin per line, indented (older Slurm: prefixed
        `srun: `); headers are sentences. SchedulerError with srun's own error when it fails (no
        configuration: configless Slurm finds no controller)."""
        listed = self._run(["srun", "--mpi=list"])
        if listed.returncode != 0:
            said = (listed.stderr.strip() or listed.stdout.strip() or "exit %d" % listed.returncode).splitlines()[-1]
            raise SchedulerError(
                "srun --mpi=list: %s (%s)" % (said, self.environ.get("SLURM_CONF", "default slurm.conf"))
            )
        words = [line.replace("srun: ", "").strip() for line in (listed.stdout + listed.stderr).splitlines()]
        return [word for word in words if re.fullmatch(r"[a-z][a-z0-9_]*", word)]

    def log_files(self, run_dir: Path) -> List[Path]:
        """`slurm-<job>.out` of every submission, in job order (`slurm-9.out` before `slurm-10.out`)."""

        def job_number(path: Path) -> int:
            digits = path.stem[len("slurm-") :]
            return int(digits) if digits.isdigit() else -1

        return sorted(run_dir.glob("slurm-*.out"), key=job_number)

    def cancel(self, job_id: str, run_dir: Path) -> None:
        result = self._run(["scancel", job_id])
        if result.returncode != 0:
            raise SchedulerError("scancel %s failed: %s" % (job_id, result.stderr.strip() or result.returncode))


def sacct_energy_command(job_id: str) -> List[str]:
    """The allocation's line only (-X), no header, `|`-separated: JobID|ConsumedEnergyRaw."""
    return ["sacct", "-j", job_id, "-X", "--noheader", "--parsable2", "-o", "JobID,ConsumedEnergyRaw"]


def parse_energy_value(text: str) -> Optional[float]:
    """Joules from a ConsumedEnergy(Raw) cell ("12345", "1.50M"); None for an empty or unknown cell."""
    text = text.strip()
    factor = 1.0
    if text[-1:].isalpha():
        if text[-1].upper() not in PREFIXES:
            return None
        text, factor = text[:-1], PREFIXES[text[-1].upper()]
    try:
        return float(text) * factor
    except ValueError:
        return None


def parse_consumed_energy(output: str, job_id: str) -> Figure:
    """The job's energy from `sacct ... -o JobID,ConsumedEnergy[Raw] --parsable2` output (the line
    whose JobID is `job_id`, or its first line), or "unavailable: <reason>"."""
    rows = [line.split("|") for line in output.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) >= 2]
    if not rows:
        return "unavailable: sacct knows no job %s" % job_id
    row = next((r for r in rows if r[0].strip() == job_id), rows[0])
    return energy_figure(row[1])


def energy_figure(cell: str) -> Figure:
    """Joules from a ConsumedEnergy(Raw) cell, or "unavailable: <reason>" (Slurm records 0 without a plugin)."""
    joules = parse_energy_value(cell)
    if joules is None:
        return "unavailable: sacct gave ConsumedEnergy %r" % cell.strip()
    if joules == 0 or joules >= NO_VALUE:
        return "unavailable: Slurm recorded no energy (no AcctGatherEnergyType plugin on the nodes?)"
    return joules
