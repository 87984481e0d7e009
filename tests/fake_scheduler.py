"""FakeBatch, a batch system that exists only in tests (tests/test_added_backends.py and the battery,
tests/test_backend_battery.py, add it with this file and one row in `dlaunch.schedulers.SCHEDULERS`).

`submit` runs the job script at once in the background as the job's batch host would, with
`FAKEBATCH_JOB_ID`; its output goes to `fakebatch-<id>.log` in the run directory and its exit status to
`$FAKEBATCH_SPOOL/<id>.exit`, which `jobs` reads. The step command `fakebatch-step N COMMAND` (STEP: the test
puts it on PATH) starts COMMAND N times with `FAKEBATCH_TASK`, `FAKEBATCH_LOCAL_TASK`, `FAKEBATCH_NODE`
and `FAKEBATCH_NTASKS`, and ends the others when one fails (as `srun --kill-on-bad-exit` does). `cancel` ends
the job's processes, writes FakeBatch's verdict into the log, and the job reads CANCELLED once it has ended.
"""
import os
import signal
import subprocess
from pathlib import Path
from typing import List, Literal, Optional, Sequence, Tuple

from pydantic import Field, field_validator

from dlaunch.errors import SchedulerError
from dlaunch.schedulers import JobState, JobStatus, Scheduler, Submission
from dlaunch.specs.job import Export, HostList, JobSpec, PreludeItem, ShellWord
from dlaunch.specs.schema import OPTION, Partition, StrictModel, check_partitions
from dlaunch.train import jobenv

STEP = """n=$1; shift; pids=()
for ((t = 0; t < n; t++)); do
  FAKEBATCH_TASK=$t FAKEBATCH_LOCAL_TASK=$t FAKEBATCH_NODE=0 FAKEBATCH_NTASKS=$n "$@" & pids+=($!)
done
code=0
for ((left = n; left > 0; left--)); do
  wait -n; done_code=$?
  if [ "$done_code" != 0 ]; then code=$done_code; kill "${pids[@]}" 2>/dev/null; wait; break; fi
done
exit "$code"
"""


class FakeBatchConfig(StrictModel):
    kind: Literal["fakebatch"]
    partitions: List[Partition] = Field(min_length=1)

    @field_validator("partitions")
    @classmethod
    def _partitions(cls, partitions: List[Partition]) -> List[Partition]:
        return check_partitions(partitions, OPTION, "--name or --name=value")


class FakeBatch(Scheduler):
    kind = "fakebatch"
    label = "FakeBatch"
    directive_prefix = "#FAKEBATCH"
    commands = ("fakebatch-step",)
    Config = FakeBatchConfig
    queued = True
    this_machine = False
    task_variables = ((jobenv.NTASKS, "FAKEBATCH_NTASKS"), (jobenv.TASK_ID, "FAKEBATCH_TASK"),
                      (jobenv.LOCAL_TASK_ID, "FAKEBATCH_LOCAL_TASK"), (jobenv.NODE_ID, "FAKEBATCH_NODE"))
    log_verdicts = (r"^FAKEBATCH: job \S+ cancelled",)

    @property
    def spool(self) -> Path:
        return Path(self.environ["FAKEBATCH_SPOOL"])

    def directives(self, cfg: FakeBatchConfig, job: JobSpec) -> Tuple[str, ...]:
        return ("--name=%s" % job.name, "--nodes=%d" % job.nodes, "--seconds=%d" % job.seconds)

    def job_environment(self, cfg: FakeBatchConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:
        return (Export(jobenv.JOB_ID, ShellWord("$FAKEBATCH_JOB_ID")), Export(jobenv.NNODES, str(job.nodes)),
                HostList(jobenv.NODELIST, self.hosts_command()))

    def step(self, cfg: FakeBatchConfig, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]) -> Tuple[str, ...]:
        return ("fakebatch-step", str(job.tasks)) + tuple(options)

    def job_id_word(self) -> str:
        return ShellWord("$FAKEBATCH_JOB_ID")

    def hosts_command(self) -> Tuple[str, ...]:
        return ("echo", "localhost")

    def submit(self, script: Path, run_dir: Path) -> Submission:
        job_id = str(len(list(self.spool.glob("*.job"))) + 1)
        log = open(run_dir / ("fakebatch-%s.log" % job_id), "ab")
        # The batch host's shell outlives a cancel's SIGTERM (a trap, not an ignore: the job's own processes keep
        # the default) and records the job's exit status.
        proc = subprocess.Popen(["bash", "-c", 'trap : TERM; bash "$1"; echo $? > "$2.tmp" && mv "$2.tmp" "$2"', "fakebatch", str(script),
                                 str(self.spool / ("%s.exit" % job_id))],
                                env=dict(self.environ, FAKEBATCH_JOB_ID=job_id), cwd=run_dir, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        (self.spool / ("%s.job" % job_id)).write_text("%d %s\n" % (proc.pid, run_dir))
        return Submission(job_id)

    def jobs(self, runs: Sequence[Tuple[str, Path]]) -> List[JobStatus]:
        return [self._job(job_id) for job_id, _ in runs]

    def _job(self, job_id: str) -> JobStatus:
        ended = self.spool / ("%s.exit" % job_id)
        if not (self.spool / ("%s.job" % job_id)).is_file():
            return JobStatus("UNKNOWN", JobState.GONE)
        if ended.is_file() and (self.spool / ("%s.cancelled" % job_id)).is_file():
            return JobStatus("CANCELLED", JobState.CANCELLED)
        if ended.is_file():
            code = int(ended.read_text())
            return JobStatus("DONE" if code == 0 else "EXIT %d" % code, JobState.COMPLETED if code == 0 else JobState.FAILED)
        return JobStatus("RUNNING", JobState.RUNNING)

    def end_reason(self, job_id: str) -> Optional[str]:
        ended = self.spool / ("%s.exit" % job_id)
        return "exit %s" % ended.read_text().strip() if ended.is_file() else None

    def cancel(self, job_id: str, run_dir: Path) -> None:
        record = self.spool / ("%s.job" % job_id)
        if not record.is_file():
            raise SchedulerError("FakeBatch knows no job %s" % job_id)
        pid = record.read_text().split()[0]
        with open(run_dir / ("fakebatch-%s.log" % job_id), "a") as log:
            log.write("FAKEBATCH: job %s cancelled\n" % job_id)
        (self.spool / ("%s.cancelled" % job_id)).write_text("")
        try:
            os.killpg(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass

    def log_files(self, run_dir: Path) -> List[Path]:
        return sorted(run_dir.glob("fakebatch-*.log"), key=lambda p: int(p.stem.split("-")[1]))
