"""PBS Professional (e.g. ALCF Polaris): `#PBS` directives, `mpiexec` steps; qsub/qstat/qdel.

Rendered after the PBS Professional Reference Guide (qsub: -N -l -q -A -o -j -k -r; `-l select=N`
chunks, `-l walltime`) and ALCF's Polaris job scripts (`mpiexec -n TOTAL --ppn PER_NODE --depth D
--cpu-bind depth`, hosts in `$PBS_NODEFILE`). PBS cannot run here: tests check the script against
those documents and drive qsub/qstat/qdel through fakes named as such, which run the real script.

The log is `pbs.out` in the run directory, written there directly while the job runs (`-k doe`, PBS
Professional's direct write; OpenPBS opens it with O_APPEND, src/resmom/start_exec.c, so a rerun
attempt adds to it). A job is rerunnable (`-r y`, ALCF: "To make your job re-runable add ... #PBS -r y",
docs.alcf.anl.gov/polaris/running-jobs/, read 2026-11-24) unless the site or `--no-requeue` says
otherwise. PBS keeps a rerun job's id and tells the job no restart count (OpenPBS sets no such variable:
src/resmom/start_exec.c), so the script counts its own starts in the run directory (`pbs-attempts`);
from the second on the trainer resumes from its checkpoint. PBS writes its verdict into the log
(`=>> PBS: job killed: walltime 3610 exceeded limit 3600`, src/resmom/mom_main.c).
"""

import json
import re
from pathlib import Path
from typing import Annotated, Dict, List, Literal, Optional, Sequence, Tuple

from pydantic import Field, StringConstraints, field_validator

from dlaunch.errors import SchedulerError
from dlaunch.schedulers import JobState, JobStatus, Scheduler, Submission
from dlaunch.specs.job import AttemptCount, Banner, EndTime, Export, HostList, JobSpec, PreludeItem, ShellWord
from dlaunch.specs.schema import Partition, StrictModel, Word, check_partitions
from dlaunch.train import jobenv

# A directive line after `#PBS `: one option letter and one value (`-l filesystems=home:eagle`).
DIRECTIVE = r"^-[A-Za-z] [A-Za-z0-9_.,:/@+=-]+$"
RESOURCES = r"^(:[A-Za-z0-9_]+=[A-Za-z0-9_.+-]+)*$"  # of a `-l select` chunk: `:system=polaris:ngpus=4`
_JOB_ID = re.compile(r"^\d+(\[\d*\])?(\.[A-Za-z0-9.-]+)?$")
# qstat's job_state letters (Reference Guide, "Job States").
_STATES = {
    "Q": JobState.PENDING,
    "H": JobState.PENDING,
    "W": JobState.PENDING,
    "T": JobState.PENDING,
    "B": JobState.RUNNING,
    "R": JobState.RUNNING,
    "E": JobState.COMPLETING,
    "S": JobState.SUSPENDED,
    "U": JobState.SUSPENDED,
    "M": JobState.PENDING,
}
EXIT_DELETED = 271  # Exit_status of a job killed by qdel: 256 + SIGTERM (Reference Guide, "Job Exit Status")
LOG = "pbs.out"
ATTEMPTS = "pbs-attempts"  # one line per start of a job in this run directory: its id


class PbsConfig(StrictModel):
    kind: Literal["pbs"]
    partitions: List[Partition] = Field(min_length=1)  # queues (`-q`)
    select_resources: Annotated[str, StringConstraints(pattern=RESOURCES)] = ""  # e.g. ":system=polaris"
    directives: List[Annotated[str, StringConstraints(pattern=DIRECTIVE)]] = []  # e.g. "-l filesystems=home:eagle"
    mpiexec_options: List[Word] = []

    @field_validator("partitions")
    @classmethod
    def _partitions(cls, partitions: List[Partition]) -> List[Partition]:
        for p in partitions:
            if p.qos is not None:
                raise ValueError("partition %s: qos: PBS has no QOS (a row's queue is its `partition`)" % p.name)
        return check_partitions(partitions, DIRECTIVE, "'-X value'")


def queue_name(row: Partition) -> str:
    """A row's queue (`-q`): `partition`, else `name` (rows of one routing queue share it)."""
    return row.partition or row.name


def classify(state: str, exit_status: object = None) -> JobState:
    if state in ("F", "X"):
        if exit_status in (0, "0"):
            return JobState.COMPLETED
        return JobState.CANCELLED if str(exit_status) == str(EXIT_DELETED) else JobState.FAILED
    return _STATES.get(state, JobState.UNKNOWN)


class Pbs(Scheduler):
    kind = "pbs"
    label = "PBS"
    directive_prefix = "#PBS"
    commands = ("qsub", "qstat", "qdel")
    status_command = "qstat"
    ping_command = ("qstat", "-B")  # the server's status line, an error when it does not answer
    server_variable = "PBS_SERVER"
    Config = PbsConfig
    queued = True
    this_machine = False
    # What Cray PALS' mpiexec gives every rank (HPE's pals.h, "Environment variables available for
    # applications"; PALS runs Polaris' mpiexec).
    task_variables = (
        (jobenv.TASK_ID, "PALS_RANKID"),
        (jobenv.LOCAL_TASK_ID, "PALS_LOCAL_RANKID"),
        (jobenv.NODE_ID, "PALS_NODEID"),
    )
    log_verdicts = (r"=>> PBS: job killed: ",)
    # PALS mpiexec's report of a rank that failed (as seen in ALCF users' logs; unverified here).
    log_noise = (r"\brank \d+ (exited with code|died from signal) \d+",)
    no_test_submission = "PBS has no test-only submission; `qsub` checks the queue at submission"

    def directives(self, cfg: PbsConfig, job: JobSpec) -> Tuple[str, ...]:
        return (
            "-N %s" % job.name,
            "-l select=%d%s" % (job.nodes, cfg.select_resources),
            "-l walltime=%d:%02d:%02d" % (job.seconds // 3600, job.seconds % 3600 // 60, job.seconds % 60),
            "-q %s" % queue_name(job.queue),
            *(("-A %s" % job.account,) if job.account else ()),
            "-o %s/%s" % (job.run_dir, LOG),
            "-j oe",  # the error stream into the same file
            "-k doe",  # written directly into the run directory while the job runs, appended by a rerun
            "-r y" if job.requeue else "-r n",  # see the module docstring
            *cfg.directives,
            *job.queue.directives,
        )

    def prelude(self, cfg: PbsConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:
        return (
            Banner(jobenv.JOB_ID, jobenv.RESTART_COUNT, jobenv.NODELIST),
            EndTime("DLAUNCH_JOB_END_TIME", job.seconds),
        )

    def job_environment(self, cfg: PbsConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:
        """mpiexec starts `--ppn` tasks on every node: the counts are the job's own."""
        return (
            Export(jobenv.JOB_ID, ShellWord("$PBS_JOBID")),
            AttemptCount(jobenv.RESTART_COUNT, "PBS_JOBID", "%s/%s" % (job.run_dir, ATTEMPTS)),
            Export(jobenv.NNODES, str(job.nodes)),
            HostList(jobenv.NODELIST, self.hosts_command()),
            Export(jobenv.NTASKS, str(job.tasks)),
            Export(jobenv.TASKS_PER_NODE, "%d(x%d)" % (job.tasks_per_node, job.nodes)),
        )

    def step(
        self, cfg: PbsConfig, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]
    ) -> Tuple[str, ...]:
        binding = ("--cpu-bind", "none") if whole_node else ("--depth=%d" % job.cpus_per_task, "--cpu-bind", "depth")
        if job.extra_tasks:
            raise SchedulerError(
                "mpiexec starts the same number of tasks on every node; coordinator tasks are not placed"
            )
        return (
            "mpiexec",
            "-n",
            str(job.tasks),
            "--ppn",
            str(job.tasks_per_node),
            *binding,
            *cfg.mpiexec_options,
            *options,
        )

    def job_id_word(self) -> str:
        return ShellWord("$PBS_JOBID")

    def hosts_command(self) -> Tuple[str, ...]:
        return ("cat", ShellWord("$PBS_NODEFILE"))

    def submit(self, script: Path, run_dir: Path) -> Submission:
        result = self._run(["qsub", str(script)])
        job_id = result.stdout.strip()
        if result.returncode != 0 or not _JOB_ID.fullmatch(job_id):
            reason = (result.stderr.strip() or job_id or "no reason given").splitlines()[-1]
            raise SchedulerError("qsub refused the job: %s" % reason)
        return Submission(job_id)

    def jobs(self, runs: Sequence[Tuple[str, Path]]) -> List[JobStatus]:
        found = self._jobs(list(dict.fromkeys(job_id for job_id, _ in runs)))
        return [found[job_id] for job_id, _ in runs]

    def _jobs(self, job_ids: Sequence[str]) -> Dict[str, JobStatus]:
        """One `qstat -x -f -F json` for all (finished jobs too, while the server keeps their history)."""
        if not job_ids:
            return {}
        try:
            listed = self._run(["qstat", "-x", "-f", "-F", "json", *job_ids])
        except SchedulerError as e:
            return {job_id: JobStatus("unknown (%s)" % e, JobState.UNKNOWN) for job_id in job_ids}
        try:
            known = json.loads(listed.stdout or "{}").get("Jobs", {})
        except ValueError:
            known = {}
        found = {}
        for job_id in job_ids:
            fields = known.get(job_id)
            if fields is None:
                found[job_id] = JobStatus("unknown (not in PBS any more)", JobState.GONE)
                continue
            state = fields.get("job_state", "?")
            estimated = fields.get("estimated") if isinstance(fields.get("estimated"), dict) else {}
            found[job_id] = JobStatus(
                state,
                classify(state, fields.get("Exit_status")),
                fields.get("comment", ""),
                start=str(estimated.get("start_time", "")),
            )
        return found

    def end_reason(self, job_id: str) -> Optional[str]:
        """`failed (Job run at ... and finished)`: the accounting's state and comment, while PBS keeps the job."""
        job = self._jobs([job_id])[job_id]
        if job.kind in (JobState.UNKNOWN, JobState.GONE):
            return None
        return "%s (%s)" % (job.kind.value, job.reason) if job.reason else job.kind.value

    def cancel(self, job_id: str, run_dir: Path) -> None:
        result = self._run(["qdel", job_id])
        if result.returncode != 0:
            raise SchedulerError("qdel %s failed: %s" % (job_id, result.stderr.strip() or result.returncode))

    def log_files(self, run_dir: Path) -> List[Path]:
        return [p for p in [run_dir / LOG] if p.is_file()]
