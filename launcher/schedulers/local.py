"""This machine: the script runs in the foreground, its output streamed to the terminal and `local.log`."""
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Sequence, TextIO, Tuple

from rich.console import Console

from launcher.errors import SchedulerError
from launcher.jobs.jobspec import Export, JobSpec, PreludeItem, ShellWord
from launcher.runs.rundir import LOCAL_LOG
from launcher.schedulers import Job, JobState, Scheduler, Submission
from launcher.jobs.schema import StrictModel
from train import jobenv


class LocalConfig(StrictModel):
    kind: Literal["local"]


class Local(Scheduler):
    kind = "local"
    label = "this machine"
    Config = LocalConfig

    def __init__(self, console: Optional[Console] = None):
        super().__init__()
        self.console = console or Console(soft_wrap=True)

    def job_environment(self, cfg: LocalConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:
        """The job id `local-<pid of the script's shell>` (what `submit` records), one node, one task."""
        return (
            Export(jobenv.JOB_ID, ShellWord("local-$BASHPID")),
            Export(jobenv.NNODES, "1"),
            Export(jobenv.NODELIST, "localhost"),
            *(Export(name, value) for name, value in jobenv.step_environment(0, 1, 0, 0).items()),
        )

    def step(self, cfg: LocalConfig, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]) -> Tuple[str, ...]:
        return ("exec",)

    def command(self, step: Tuple[str, ...], *rest: Tuple[Any, ...]) -> Tuple[Tuple[Any, ...], ...]:
        return (step + tuple(word for line in rest for word in line),)

    def submit(self, script: Path, run_dir: Path) -> Submission:
        env = dict(os.environ)
        # torchrun/horovodrun/python of the environment dlaunch runs in, even when it is not activated.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        with open(run_dir / LOCAL_LOG, "a", encoding="utf-8") as log:  # a resumed run keeps the earlier log
            proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1, env=env, cwd=run_dir)
            try:
                with self.console.status("running %s on this machine (log: %s)" % (script.name, log.name)):
                    self._copy_output(proc, log)
            except KeyboardInterrupt:
                # The terminal's SIGINT reached the job too: the trainer checkpoints and ends `cancelled`.
                self._copy_output(proc, log)
        return Submission("local-%d" % proc.pid, proc.wait())

    def _copy_output(self, proc: subprocess.Popen, log: TextIO) -> None:
        for line in proc.stdout:
            log.write(line)
            log.flush()
            self.console.out(line, end="", highlight=False)

    def jobs(self, job_ids: Sequence[str]) -> Dict[str, Job]:
        return {job_id: Job("local", JobState.UNKNOWN) for job_id in job_ids}

    def cancel(self, job_id: str) -> None:
        raise SchedulerError("local runs end with the dlaunch command that started them (Ctrl-C)")
