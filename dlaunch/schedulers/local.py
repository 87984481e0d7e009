"""This machine: the job script runs here and now, in a session of its own (its process group: the job's
id is `local-<group>`), its output written to `local.log`; the command that started it follows it to its
end and shows the run's progress meanwhile (dlaunch/runs/watch.py), Ctrl-C passed on to it. The run
directory's `state` holds its course as the run service recorded it (RUNNING_HERE, FINISHED_HERE), which
`jobs` reads back, and its process group is found from its `job_id` whatever became of that command:
`cancel` ends it.

A step of one task is the launch command itself (`exec torchrun --standalone ...`); a step of several
(one task per process of the engine modes) is `python -m dlaunch.schedulers.local --tasks N -- COMMAND`,
which does here what srun does on a cluster: it starts COMMAND N times with each task's neutral
variables (dlaunch/train/jobenv.py) and a free port base for the tasks to listen on, passes SIGTERM and SIGUSR1
on to the tasks, ends the others as soon as one fails (`--kill-on-bad-exit`), and exits with the first
failure's code.
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence, TextIO, Tuple

from dlaunch.boundary import alive_since, escape, group_alive_since, read_text
from dlaunch.errors import SchedulerError
from dlaunch.paths import JOB_ID_FILE, STATE_FILE
from dlaunch.schedulers import (
    CANCEL_REQUESTED,
    FINISHED_HERE,
    RUNNING_HERE,
    JobState,
    JobStatus,
    Running,
    Scheduler,
    Submission,
)
from dlaunch.specs.job import Export, JobSpec, PreludeItem, ShellWord
from dlaunch.specs.schema import StrictModel
from dlaunch.train import jobenv
from dlaunch.train.engines import ENGINE_PORT

LOCAL_LOG = "local.log"
# After one task failed, the others get SIGTERM, then SIGKILL this much later (srun's KillWait default).
KILL_WAIT_S = 30.0
_JOB_ID = re.compile(r"local-([0-9]{1,9})")


def _pattern(word: str) -> "re.Pattern[str]":
    return re.compile(re.escape(word).replace("%d", "([0-9]{1,9})"))


_RUNNING_HERE, _FINISHED_HERE = _pattern(RUNNING_HERE), _pattern(FINISHED_HERE)


class LocalConfig(StrictModel):
    kind: Literal["local"]


class Local(Scheduler):
    kind = "local"
    label = "this machine"
    Config = LocalConfig
    queued = False
    this_machine = True
    no_test_submission = "no scheduler"
    # torchrun's and the step's words around a failed task.
    log_noise = (r"dlaunch-local-step: task \d+ (exited|killed)",)

    def job_environment(self, cfg: LocalConfig, job: JobSpec) -> Tuple[PreludeItem, ...]:
        """The job id `local-<pid of the script's shell>` (what `submit` records), one node; a step of
        one task gets that task's variables here, a step of several from `run_step`."""
        one_task = jobenv.step_environment(0, 1, 0, 0) if job.tasks == 1 else {}
        return (
            Export(jobenv.JOB_ID, ShellWord("local-$BASHPID")),
            Export(jobenv.NNODES, "1"),
            Export(jobenv.NODELIST, "localhost"),
            *(Export(name, value) for name, value in one_task.items()),
        )

    def step(
        self, cfg: LocalConfig, job: JobSpec, mpi: bool, whole_node: bool, options: Sequence[str]
    ) -> Tuple[str, ...]:
        if job.tasks == 1:
            return ("exec",)
        return ("exec", "python", "-m", "dlaunch.schedulers.local", "--tasks", str(job.tasks), "--")

    def command(self, step: Tuple[str, ...], *rest: Tuple[Any, ...]) -> Tuple[Tuple[Any, ...], ...]:
        return (step + tuple(word for line in rest for word in line),)

    def job_id_word(self) -> str:
        return ShellWord("$" + jobenv.JOB_ID)

    def hosts_command(self) -> Tuple[str, ...]:
        return ("echo", "localhost")

    def submit(self, script: Path, run_dir: Path) -> Submission:
        """Start the job script here in a session of its own (the job's processes are its process group, which
        `cancel` finds without this process); the caller follows it (`Submission.running`)."""
        env = dict(os.environ)
        # torchrun/horovodrun/python of the environment dlaunch runs in, even when it is not activated.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        with open(run_dir / LOCAL_LOG, "a", encoding="utf-8") as log:  # a resumed run keeps the earlier log
            proc = subprocess.Popen(
                ["bash", str(script)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=run_dir,
                start_new_session=True,
            )
        return Submission("local-%d" % proc.pid, LocalJob(proc))

    def jobs(self, runs: Sequence[Tuple[str, Path]]) -> List[JobStatus]:
        return [self._status(job_id, run_dir) for job_id, run_dir in runs]

    def _status(self, job_id: str, run_dir: Path) -> JobStatus:
        """The job's state as its run directory records it (the run service following it: RUNNING_HERE, then
        FINISHED_HERE), its processes asked while it has not ended."""
        path = run_dir / STATE_FILE
        state = escape(read_text(path, follow_links=False).strip()) if os.path.lexists(path) else ""
        finished = _FINISHED_HERE.fullmatch(state)
        if finished:
            return JobStatus(state, JobState.COMPLETED if finished.group(1) == "0" else JobState.FAILED)
        runs_on = job_group(job_id, run_dir) is not None
        followed = _RUNNING_HERE.fullmatch(state)
        if followed:
            pid = int(followed.group(1))
            if alive_since(pid, path.lstat().st_mtime):
                return JobStatus(state, JobState.RUNNING)
            if runs_on:
                return JobStatus("running here (dlaunch pid %d has ended)" % pid, JobState.RUNNING)
            return JobStatus("dlaunch (pid %d) ended without recording the job's exit" % pid, JobState.FAILED)
        if runs_on:
            return JobStatus(state or "running here", JobState.RUNNING)
        if state == CANCEL_REQUESTED:
            return JobStatus(state, JobState.CANCELLED)
        return JobStatus("unknown state: %s" % (state or "none recorded"), JobState.FAILED)

    def cancel(self, job_id: str, run_dir: Path) -> None:
        """SIGTERM to the job's process group (the step passes it on to its tasks, torchrun to its workers)."""
        group = job_group(job_id, run_dir)
        if group is None:
            raise SchedulerError("job %s: none of its processes runs here any more" % job_id)
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            raise SchedulerError("job %s: none of its processes runs here any more" % job_id) from None

    def log_files(self, run_dir: Path) -> List[Path]:
        return [p for p in [run_dir / LOCAL_LOG] if p.is_file()]


def job_group(job_id: str, run_dir: Path) -> Optional[int]:
    """The process group of job `local-<group>` while one of its processes runs in its run directory, started
    before the job's id was recorded there (a reused id is not the job: boundary.group_alive_since)."""
    found = _JOB_ID.fullmatch(job_id)
    try:
        recorded = (run_dir / JOB_ID_FILE).lstat().st_mtime
    except OSError:
        return None
    group = int(found.group(1)) if found else 0
    return group if group_alive_since(group, recorded, run_dir) else None


class LocalJob(Running):
    """The job's shell, a child of this process and the leader of the job's session."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def interrupt(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass


def free_port_base(count: int) -> int:
    """A port with `count` free ports from it on (each task of a local step may listen on base + its index)."""
    import random

    for _ in range(50):
        base = random.randint(20000, 60000)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("", port))
            return base
        except OSError:
            continue
    raise SchedulerError("no %d consecutive free ports on this machine" % count)


def task_environments(ntasks: int, environ: Dict[str, str]) -> List[Dict[str, str]]:
    """Every task's environment: `environ`, the task's neutral variables, the step's tasks per node and,
    unless set, a free port base."""
    port = environ.get(ENGINE_PORT) or str(free_port_base(ntasks))
    return [
        dict(
            environ,
            **jobenv.step_environment(task, ntasks, task, 0),
            **{jobenv.TASKS_PER_NODE: str(ntasks), ENGINE_PORT: port},
        )
        for task in range(ntasks)
    ]


@dataclass(frozen=True)
class StepEnd:
    """How a step's tasks ended: each one's exit code (a signal as its negative number), and the task whose
    failure ended the others (None: none failed)."""

    codes: List[int]
    first_failed: Optional[int]

    @property
    def exit_code(self) -> int:
        """The step's: the first failure's, not that of the tasks ended for it (a signal as 128 + its number, as a
        shell says)."""
        if self.first_failed is None:
            return 0
        code = self.codes[self.first_failed]
        return code if code > 0 else 128 - code


def run_step(
    command: List[str],
    ntasks: int,
    environ: Optional[Dict[str, str]] = None,
    output: Optional[TextIO] = None,
    cwd: Optional[str] = None,
    timeout: Optional[float] = None,
) -> StepEnd:
    """Start `command` as every task of a one-node step and wait for all. One task failing ends the others at
    once (SIGTERM, SIGKILL after KILL_WAIT_S), as do SIGTERM and SIGUSR1 sent to this process (passed on);
    `timeout` kills all. `output`: where the tasks write (default: inherited)."""
    envs = task_environments(ntasks, dict(os.environ if environ is None else environ))
    procs = [
        subprocess.Popen(
            command, env=env, cwd=cwd, stdout=output, stderr=subprocess.STDOUT if output is not None else None
        )
        for env in envs
    ]

    def forward(signum: int, frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to the tasks too
    deadline = time.monotonic() + timeout if timeout else None
    stop_at: Optional[float] = None
    first_failed: Optional[int] = None
    try:
        # Every task is polled in every round: a failure behind a live task is seen at once.
        while [proc.poll() for proc in procs].count(None):
            now = time.monotonic()
            failed = [t for t, proc in enumerate(procs) if proc.returncode not in (None, 0)]
            if failed and first_failed is None:
                first_failed = failed[0]
                print(
                    "dlaunch-local-step: task %d exited with %d; ending the others"
                    % (first_failed, procs[first_failed].returncode),
                    file=sys.stderr,
                    flush=True,
                )
                forward(signal.SIGTERM, None)
                stop_at = now + KILL_WAIT_S
            if (stop_at is not None and now > stop_at) or (deadline is not None and now > deadline):
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
            time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    codes = [proc.returncode for proc in procs]
    if first_failed is None:  # ended by a signal or the timeout, or failed in the last round
        first_failed = next((t for t, code in enumerate(codes) if code != 0), None)
    return StepEnd(codes, first_failed)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dlaunch.schedulers.local", description="Run COMMAND as every task of a step on this machine."
    )
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.tasks < 1 or not command:
        parser.error("give --tasks N (N >= 1) and a command after --")
    return run_step(command, args.tasks).exit_code


if __name__ == "__main__":
    sys.exit(main())
