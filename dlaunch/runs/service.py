"""The run service: what every command does with runs, between the command line (which parses and
prints: dlaunch/cli/) and the backends (dlaunch/schedulers/, dlaunch/runtimes/).

- `prepare`: a request resolved against its site, checked and rendered; nothing is written, and the
  warnings come back with the script for the caller to show;
- `submit_all`: the run directories written and the jobs handed to their scheduler, in order, under one
  rule for `run`, `sweep`, `run --repeat` and `study run`: every new run directory is checked to be free
  before the first job goes out; a job the scheduler refuses stops the submission, and the runs after it
  are not created (they would be refused alike: an account, a partition, a server that is down); a run
  that runs here and ends badly does not stop the others (each run is a measurement of its own), and
  while it runs its progress is shown as `dlaunch watch` shows runs (dlaunch/runs/watch.py).
  The exit code is the refusal's (1), else the first failed run's that ran here, else 0;
- `observe`, `why_failed`, `run_figures`: what runs are doing, why one failed, its figures (an ended run's
  kept in the status cache with its snapshot: dlaunch/runs/statuscache.py);
- `resume`, `logs`, `cancel` (a run that has ended: nothing to cancel, no error).
"""

import contextlib
import dataclasses
import functools
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from dlaunch.boundary import display_path, fits_file_system
from dlaunch.errors import DlaunchError, SchedulerError
from dlaunch.jobs.imagepaths import stack_of_image
from dlaunch.jobs.request import LaunchRequest
from dlaunch.paths import JOB_ID_FILE, REPO
from dlaunch.runs.rundir import SITE_PROFILE, RunDir, default_run_name
from dlaunch.schedulers import CANCEL_REQUESTED, FINISHED_HERE, RUNNING_HERE, Running, scheduler_for
from dlaunch.tables import counted
from dlaunch.train.framework_table import image_group

if TYPE_CHECKING:  # the run layer's state stays out of `run --dry-run`'s start-up
    from dlaunch.jobs.plan import LaunchPlan
    from dlaunch.jobs.sites import Site
    from dlaunch.runs.runstate import Snapshot
    from dlaunch.runs.suspects import Suspect

__all__ = [
    "Logs",
    "Prepared",
    "Submitted",
    "cancel",
    "check_new",
    "git_revision",
    "images_folder",
    "logs",
    "observe",
    "prepare",
    "resume",
    "run_figures",
    "runs_folder",
    "submit_all",
    "why_failed",
]


@functools.lru_cache(maxsize=1)
def git_revision() -> Optional[str]:
    """The launcher's own commit, for the trainer's provenance (asked once per command: a sweep renders many jobs)."""
    try:
        result = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


@dataclass(frozen=True)
class Prepared:
    """One job, rendered: the completed request, its plan, the script, and what the user should know."""

    request: LaunchRequest
    plan: "LaunchPlan"
    script: str
    warnings: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()  # what the plan decided for the user (e.g. the partition row picked by size)
    resume: bool = False  # the run directory exists: the job continues it
    files: Tuple[Tuple[str, str], ...] = ()  # (name, text) the run directory gets beside the job (parent.json)

    @property
    def run_dir(self) -> Path:
        return Path(self.plan.run_dir)


def _unset(problem: str, fix: str, dry_run: bool, shown: str) -> Tuple[str, ...]:
    """A profile folder whose variable is not set here: refused (`fix`), or in a dry run a warning (`shown`: the
    path its scripts show instead)."""
    if not dry_run:
        raise DlaunchError("%s: %s" % (problem, fix))
    return ("%s; the dry run shows %s" % (problem, shown),)


def runs_folder(
    site: "Site", output: Optional[str], dry_run: bool = False, environ: Mapping[str, str] = os.environ
) -> Tuple[str, Tuple[str, ...]]:
    """(where runs go, warnings): `output` (--output), else the site's `runs_dir` with its variable expanded here,
    else ./runs. A `runs_dir` whose variable is not set here is refused (a dry run: warned about)."""
    if output is not None:
        return output, ()
    folder, problem = site.folder("runs_dir", environ)
    if problem:
        return str(folder), _unset(problem, "set it, or give --output", dry_run, folder or "")
    return folder or "runs", ()


def images_folder(site: "Site", dry_run: bool = False, environ: Mapping[str, str] = os.environ) -> Tuple[str, ...]:
    """Warnings about the folder a containerized site's default images come from: an `images_dir` whose variable is
    not set here (and no $DLAUNCH_IMAGES_DIR instead) is refused (a dry run: warned about)."""
    folder, problem = site.folder("images_dir", environ)
    if not site.container.containerized or not problem or environ.get("DLAUNCH_IMAGES_DIR"):
        return ()
    return _unset(problem, "set it, or give --image", dry_run, folder or "")


def prepare(
    request: LaunchRequest,
    run_dir: Optional[Path] = None,
    dry_run: bool = False,
    environ: Mapping[str, str] = os.environ,
    require_image: bool = True,
) -> Prepared:
    """Resolve the site, complete and check the request, render the script (nothing is written). A missing image,
    engine environment (runs/engines.py) or profile folder variable stops it (a dry run warns; `require_image=False`
    neither of an image); a job that runs here is stopped by its engine's environment in a dry run too."""
    from dlaunch.jobs.imagepaths import check_loader, default_image_for_site, driver_warning
    from dlaunch.jobs.plan import build_plan, resolve_account
    from dlaunch.jobs.render import render_script
    from dlaunch.jobs.sites import resolve_profile
    from dlaunch.runs.engines import engine
    from dlaunch.runtimes import runtime_class

    if not request.site:
        raise DlaunchError("--site: required (see `dlaunch sites`)")
    site, profile = resolve_profile(request.site)
    experiment = request.experiment or "%s-%s-%s" % (site.name, request.framework, request.option("model", "resnet50"))
    check_loader(site, request.option("loader", "native"))
    warnings: List[str] = []
    output = request.output
    if run_dir is None:
        output, said = runs_folder(site, request.output, dry_run, environ)
        warnings.extend(said)
    image = request.image
    if site.container.containerized:
        if not image:
            warnings.extend(images_folder(site, dry_run, environ))
            image = default_image_for_site(site, request.framework)
        warning = driver_warning(site)
        if warning:
            warnings.append(warning)
    environment = engine(site, request.framework, environ)
    if environment.problem:
        message = "--framework %s: %s" % (request.framework, environment.problem)
        if not dry_run or scheduler_for(site.scheduler.kind).this_machine:
            raise DlaunchError(message)
        warnings.append(message)
    request = dataclasses.replace(request, experiment=experiment, image=image, output=output).normalized()
    if run_dir is None:
        run_dir = Path(request.output) / experiment / (request.run_name or default_run_name())  # type: ignore[arg-type]  # runs_folder gave it above
        fits_file_system(run_dir, {"--experiment": experiment, "--run-name": run_dir.name})
    revision = git_revision()
    if dry_run:
        try:
            resolve_account(site, request.account, environ)
        except DlaunchError as e:
            if resolve_account(site, request.account, environ, required=False) is None:  # missing, not malformed
                warnings.append("%s (the dry run renders the script without it)" % e)
    left_out = suspect_nodes(site.name, request)
    plan = build_plan(
        site,
        request,
        run_dir=str(run_dir),
        git_revision=revision,
        image=request.image,
        environ=environ,
        require_account=not dry_run,
        require_data=not dry_run,
        exclude=tuple(sorted({s.node for s in left_out})),
    )
    plan = dataclasses.replace(plan, profile=profile, notes=plan.notes + suspects_note(site.name, left_out))
    warnings.extend(plan.warnings)
    if require_image and plan.image and runtime_class(plan.runtime).missing(plan.image):
        stack = stack_of_image(plan.image)  # a default image: its group's make target in its stack
        target = "image-%s%s" % (image_group(plan.framework), " STACK=%s" % stack if stack else "")
        message = "--image: %s does not exist (build it with `make %s`; `dlaunch images` lists them)" % (
            plan.image,
            target,
        )
        if not dry_run:
            raise DlaunchError(message)
        warnings.append(message)
    header = "dlaunch %s: site %s, %s, %s x %s%s" % (
        (revision or "unknown")[:12],
        site.name,
        plan.framework,
        counted(plan.nodes, "node"),
        counted(plan.nproc_per_node, "process", "processes"),
        ", partition %s" % plan.partition if plan.partition else "",
    )
    return Prepared(request, plan, render_script(plan, header), tuple(warnings), tuple(plan.notes), request.resume)


def suspect_nodes(site: str, request: LaunchRequest) -> List["Suspect"]:
    """The site's suspect nodes the job leaves out (dlaunch/runs/suspects.py): none with --include-suspect-nodes."""
    from dlaunch.runs import suspects

    return [] if request.include_suspect_nodes else suspects.read(site)


def suspects_note(site: str, left_out: Sequence["Suspect"]) -> Tuple[str, ...]:
    from dlaunch.runs.suspects import INCLUDE_FLAG, describe

    if not left_out:
        return ()
    return (
        "leaves out suspect nodes: %s; %s runs on them, `dlaunch nodes clear --site %s` clears them"
        % (describe(left_out), INCLUDE_FLAG, site),
    )


def resume(
    run_dir: Path,
    dry_run: bool = False,
    allow_large: bool = False,
    include_suspect_nodes: bool = False,
    preflight: bool = False,
    spare_nodes: int = 0,
) -> Prepared:
    """A run directory's job again, from its checkpoint (all options from its plan.json, every field
    checked; `allow_large`, `include_suspect_nodes`, `preflight` and `spare_nodes` (when given) add theirs to the
    stored request's; the site's suspect nodes,
    a hung run's silent ones among them, left out unless included); refused while its job still
    runs: a second job must not append to the metrics and checkpoints of one that runs."""
    from dlaunch.jobs.plan import keeps_checkpoints

    existing = RunDir.open(run_dir)
    stored = existing.request()
    if not keeps_checkpoints(stored.framework):  # its tasks would start again from step 0 over the run's files
        raise DlaunchError(
            "--resume: %s keeps no checkpoints, so its runs cannot resume: run it anew" % stored.framework
        )
    if existing.job_id:
        (job,) = existing.scheduler.jobs([(existing.job_id, existing.path)])
        if job.kind.active:
            raise DlaunchError(
                "--resume: job %s of %s is still %s (dlaunch cancel it first)"
                % (existing.job_id, display_path(existing.path), job.state)
            )
    request = dataclasses.replace(
        stored,
        resume=True,
        allow_large=stored.allow_large or allow_large,
        include_suspect_nodes=stored.include_suspect_nodes or include_suspect_nodes,
        preflight=stored.preflight or preflight,
        spare_nodes=spare_nodes or stored.spare_nodes,
    )
    return prepare(request, run_dir=existing.path.resolve(), dry_run=dry_run)


def check_new(jobs: Sequence[Prepared]) -> None:
    """Refuse, before anything is written, a new run whose directory exists."""
    taken = [job.run_dir for job in jobs if not job.resume and job.run_dir.exists()]
    if taken:
        raise DlaunchError(
            "run directory %s exists (choose another --run-name or --experiment, or --resume it)" % taken[0]
        )


@dataclass(frozen=True)
class Submitted:
    """What `submit_all` did: the runs it created or resumed, in order, and each one's exit code."""

    runs: Tuple[RunDir, ...]
    codes: Tuple[Optional[int], ...]  # a job that ran here: its exit code; None: handed to a batch system

    @property
    def exit_code(self) -> int:
        """The first failed run's exit code (of those that ran here), else 0."""
        return next((code for code in self.codes if code), 0)


@contextlib.contextmanager
def _ctrl_c_reaches(job: Running) -> Iterator[None]:
    """Ctrl-C in the terminal reaches `job` too (its processes have a session of their own), then stops the
    view as before (KeyboardInterrupt); where this process ignores Ctrl-C, or runs it in a thread, nothing changes."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        job.interrupt()
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _follow(run: RunDir, job: Running, say: Callable[[str], None], show_progress: bool) -> int:
    """Wait for the end of a job that runs here, its progress shown as `dlaunch watch` shows runs
    (dlaunch/runs/watch.py) with `show_progress`; its exit code, recorded in the run's state."""
    from dlaunch.runs.watch import follow_job, wait_for_job

    say(
        "running %s on this machine; its log: %s"
        % (display_path(run.path), ", ".join(display_path(p) for p in run.log_files()))
    )
    ended: List[int] = []

    def wait(seconds: Optional[float]) -> bool:
        code = job.wait(seconds)
        if code is not None and not ended:
            if run.state != CANCEL_REQUESTED:  # `dlaunch cancel` ended it: its state keeps saying who did
                run.set_state(FINISHED_HERE % code)
            ended.append(code)
        return code is not None

    with _ctrl_c_reaches(job):
        try:
            if show_progress:
                follow_job(run.path, wait, why_failed)
            else:
                wait_for_job(wait)
        finally:
            wait(None)  # the job's end is recorded whatever became of the view
    return ended[0]


def _submit(job: Prepared, say: Callable[[str], None], show_progress: bool) -> Tuple[RunDir, Optional[int]]:
    """Write the run directory, hand the script to its scheduler, record the outcome; a job that runs here is
    followed to its end (its exit code; None: a batch system has the job)."""
    run = RunDir.open(job.run_dir) if job.resume else RunDir.create(job.run_dir)
    run.write("job.sh", job.script, mode=0o755)
    run.write(SITE_PROFILE, job.plan.profile)  # what the job was made from: `archive` bundles this, never a path
    run.write_plan(job.plan.to_dict(), job.request.to_dict())
    for name, text in job.files:
        run.write(name, text)
    try:
        submission = run.scheduler.submit(run.path / "job.sh", run.path)
    except SchedulerError as e:
        run.set_state("submission failed: %s" % e)
        raise
    if submission.running is None:
        run.write(JOB_ID_FILE, submission.job_id + "\n")
        run.set_state("submitted")
        return run, None
    run.set_state(RUNNING_HERE % os.getpid())  # followed by this process: `dlaunch watch` checks that it lives
    run.write(JOB_ID_FILE, submission.job_id + "\n")
    return run, _follow(run, submission.running, say, show_progress)


def submit_all(jobs: Sequence[Prepared], say: Callable[[str], None], show_progress: bool = False) -> Submitted:
    """Submit `jobs` in order under the module's one rule (a refusal is raised: SchedulerError, exit
    code 1); `say` tells the user about each. A job that runs here is followed to its end, its progress shown
    on stdout only with `show_progress` (the command line's live view); without, it is waited for."""
    check_new(jobs)
    runs: List[RunDir] = []
    codes: List[Optional[int]] = []
    for i, job in enumerate(jobs, 1):
        if len(jobs) > 1 or job.resume:  # which one, as experiment (or matrix)/run
            say(
                "[%d/%d] %s %s/%s"
                % (
                    i,
                    len(jobs),
                    "resubmitting" if job.resume else "submitting",
                    job.run_dir.parent.name,
                    job.run_dir.name,
                )
            )
        try:
            run, code = _submit(job, say, show_progress)
        except SchedulerError:
            if len(jobs) > i:
                say("%d run(s) after it not submitted" % (len(jobs) - i))
            raise
        runs.append(run)
        codes.append(code)
        if code is None:
            say("submitted job %s; run directory %s" % (run.job_id, run.path))
    return Submitted(tuple(runs), tuple(codes))


def failure_reason(run: RunDir) -> Optional[str]:
    """The line that explains a failed run (dlaunch/runs/failures.py ranks them), else the end record's reason."""
    from dlaunch.runs.failures import explain
    from dlaunch.train.metrics_schema import MetricsError, read_metrics

    scheduler = run.scheduler
    cause = explain(scheduler.log_files(run.path), scheduler.log_verdicts, scheduler.log_noise)
    if cause:
        return str(cause)
    try:
        end = read_metrics(str(run.metrics_path), follow_links=False).end if run.metrics_path.is_file() else None
    except MetricsError:
        end = None
    return str(end["reason"]) if end and end.get("reason") else None


def why_failed(snapshot: "Snapshot") -> str:
    """Why a failed run failed: a run that ended at its pre-flight, the nodes it left out (dlaunch/runs/nodechecks.py);
    a hung run's hang record (dlaunch/runs/hangs.py), else `failure_reason`, else the scheduler's verdict, else what its state and metrics say."""
    from dlaunch.runs.hangs import HUNG, hang_reason, hang_record
    from dlaunch.runs.nodechecks import TOO_FEW, preflight_record, too_few_reason

    if snapshot.reason:
        return snapshot.reason
    checked = preflight_record(snapshot.run.path) if snapshot.progress.status == TOO_FEW else None
    if checked is not None:  # the nodes' own checks name them
        return too_few_reason(snapshot.run.path, checked)
    hang = hang_record(snapshot.run.path) if snapshot.progress.status == HUNG else None
    if hang is not None:  # the record names the silent processes; the logs show their peers' symptoms
        return hang_reason(snapshot.run.path, hang)
    reason = failure_reason(snapshot.run)
    if reason:
        return reason
    if snapshot.job != "-":
        scheduler = snapshot.run.scheduler
        ended = scheduler.end_reason(snapshot.job)
        if ended:
            return "%s ended the job (%s); its log says nothing (was the run directory visible on the nodes?)" % (
                scheduler.label,
                ended,
            )
    return "%s, metrics %s" % (snapshot.state, snapshot.progress.status)


def run_figures(snapshot: "Snapshot") -> str:
    """Time and energy to accuracy, the trainer's energy and the scheduler's accounting of it (Slurm's
    `sacct`), each named; '' when none is known."""
    if snapshot.figures is not None:
        return snapshot.figures
    from dlaunch.analysis.scaling import status_figures
    from dlaunch.train.metrics_schema import MetricsError, read_metrics

    f: Any = snapshot.measured  # a Run has StatusFigures' fields
    if f is None:
        try:
            f = status_figures(read_metrics(str(snapshot.run.metrics_path), follow_links=False))
        except (MetricsError, OSError):
            return ""
    parts = []
    if f.time_to_accuracy_s is not None:
        parts.append("time to target accuracy %.0f s" % f.time_to_accuracy_s)
    if f.energy_to_accuracy_j is not None:
        parts.append("energy to target accuracy %.1f kJ" % (f.energy_to_accuracy_j / 1e3))
    if f.energy_j is not None:
        per_image = ", %.3g J/image" % f.joules_per_image if f.joules_per_image is not None else ""
        parts.append("energy %.1f kJ (trainer: %s)%s" % (f.energy_j / 1e3, f.energy_domains, per_image))
    if snapshot.ended and snapshot.job != "-":
        scheduler = snapshot.run.scheduler
        accounted = scheduler.job_energy(snapshot.job)
        if not isinstance(accounted, str):
            parts.append("energy %.1f kJ (%s accounting: the job's nodes)" % (accounted / 1e3, scheduler.label))
    return "; ".join(parts)


def _explained(snapshots: List["Snapshot"]) -> List["Snapshot"]:
    """Ended runs with why each failed ('' for those that did not) and their figures."""
    return [dataclasses.replace(s, reason=why_failed(s) if s.failed else "", figures=run_figures(s)) for s in snapshots]


def observe(runs: Iterable[RunDir], straggler_threshold: Optional[float] = None) -> List["Snapshot"]:
    """Every run's snapshot (dlaunch/runs/runstate.py); an ended one with why it failed and its figures,
    which the status cache keeps with it (asked once of the scheduler, not at every look). `straggler_threshold`:
    flags judged at it instead of each run's profile threshold (runstate.observe)."""
    from dlaunch.runs import runstate

    return runstate.observe(runs, complete=_explained, straggler_threshold=straggler_threshold)


@dataclass(frozen=True)
class Logs:
    files: List[Path]  # oldest first, as the run's scheduler names them
    missing: str = ""  # why there is none
    failed: bool = False  # the run failed without writing one (e.g. a launch failure)


def logs(run: RunDir) -> Logs:
    """The run's logs, or why it has none."""
    files = run.log_files()
    if files:
        return Logs(files)
    (snapshot,) = observe([run])
    if snapshot.failed:
        return Logs(
            [],
            "no log in %s: the run %s (%s)" % (display_path(run.path), snapshot.progress.status, why_failed(snapshot)),
            True,
        )
    return Logs([], "no log in %s yet (state: %s)" % (display_path(run.path), snapshot.state))


def cancel(run: RunDir) -> str:
    """Cancel the run's job; what was done, as a line for the user. A run that has ended is left as it
    is (nothing to cancel, no error)."""
    if not run.job_id:
        raise DlaunchError("%s: no job id (state: %s)" % (display_path(run.path), run.state))
    from dlaunch.runs import runstate

    (snapshot,) = runstate.observe([run])
    if snapshot.ended:
        return "%s had ended (%s; metrics %s): nothing to cancel" % (
            snapshot.name,
            snapshot.state,
            snapshot.progress.status,
        )
    run.scheduler.cancel(run.job_id, run.path)
    run.set_state(CANCEL_REQUESTED)
    return "cancelled job %s" % run.job_id
