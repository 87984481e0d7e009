"""Schedulers: `slurm` (sbatch/squeue/scontrol/scancel, each with a timeout) and `local` (this machine)."""
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, TextIO

from rich.console import Console

from launcher.errors import SchedulerError
from launcher.rundir import LOCAL_LOG


@dataclass(frozen=True)
class Submission:
    job_id: str
    exit_code: Optional[int] = None  # set when the job already ran (local)


class SlurmScheduler:
    """Slurm's commands; `SLURM_CONF` and the rest of the environment are passed on as they are.

    Every command has a timeout: against a dead controller they hang for many seconds.
    """

    def __init__(self, timeout_s: float = 30.0, environ: Optional[Mapping[str, str]] = None):
        self.timeout_s = timeout_s
        self.environ = dict(os.environ if environ is None else environ)

    def _run(self, argv: List[str]) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, env=self.environ)
        except FileNotFoundError:
            raise SchedulerError("%s: command not found (is this a Slurm login node?)" % argv[0]) from None
        except subprocess.TimeoutExpired:
            conf = self.environ.get("SLURM_CONF", "default slurm.conf")
            raise SchedulerError("%s did not answer within %g s (controller down? %s)" % (argv[0], self.timeout_s, conf)) from None

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
        return m.group(1) if m else "unknown (not in Slurm any more)"

    def end_reason(self, job_id: str) -> Optional[str]:
        """How Slurm says the job ended (`FAILED, exit code 1:0, reason NonZeroExitCode`), while it remembers."""
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


class LocalScheduler:
    """Runs the job script on this machine, streaming its output to the terminal and `local.log`."""

    def __init__(self, console: Optional[Console] = None):
        self.console = console or Console(soft_wrap=True)

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

    def state(self, job_id: str) -> str:
        return "local"

    def cancel(self, job_id: str) -> None:
        raise SchedulerError("local runs end with the dlaunch command that started them (Ctrl-C)")


def scheduler_for(name: str):
    return LocalScheduler() if name == "local" else SlurmScheduler()
