"""The `dlaunch` command line. `dlaunch <run options>` without a sub-command is `dlaunch run`.

Start-up matters on login nodes (every command, every TAB): this module imports only what every
command needs; each command imports its own heavy parts (site profiles and pydantic, rich tables,
the image lock, the performance model, matplotlib) when it runs.
"""
import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, List, Literal, Optional, Tuple

import typer
import typer.main
from rich.console import Console
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandInfo

from launcher.boundary import ALLOW_LARGE, NAME, check_limit, escape, finite_number, fits_file_system, whole
from launcher.errors import DlaunchError, SchedulerError
from launcher.jobs.request import FRAMEWORKS, TRAINER_FLAGS, LaunchRequest
from launcher.runs.rundir import SITE_PROFILE, RunDir, default_run_name, display_path, find_runs, newest_first, readable
from launcher.paths import REPO

if TYPE_CHECKING:
    from launcher.jobs.plan import LaunchPlan
    from launcher.runs.runstate import Snapshot

# Options of the whole program, not of `run` (which `dlaunch <run options>` stands for).
TOP_LEVEL_OPTIONS = ("--help", "-h", "--install-completion", "--show-completion")
# Commands defined in modules too heavy to import for every command: name -> (module, function).
LAZY_COMMANDS = {
    "images": ("launcher.jobs.images", "images_command"),
    "report": ("launcher.analysis.report", "report_command"),
    "predict": ("launcher.analysis.perfmodel", "predict_command"),
    "rerun": ("launcher.runs.rerun", "rerun_command"),
    "archive": ("launcher.runs.archive", "archive_command"),
    "doctor": ("launcher.doctor", "doctor_command"),
}
# Command groups defined in heavy modules: name -> (module, typer.Typer attribute, one-line help).
LAZY_GROUPS = {
    "study": ("launcher.runs.study", "study_app", "Studies: run a study file's matrix, its status, its report."),
    "results": ("launcher.results.command", "results_app", "The results database: list runs, compare, rebuild."),
}


def _first_docstring_line(module: str, function: str) -> str:
    """A function's one-line summary, read from its source without importing the module."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    return (ast.get_docstring(node) or "").split("\n")[0]


class DlaunchGroup(TyperGroup):
    """`dlaunch <run options>` is `dlaunch run <run options>` (also for shell completion). Imports a
    lazy command's module when the command runs; its line in `dlaunch --help` comes from the source,
    so the help imports none of them."""

    listing = False

    def parse_args(self, ctx: Any, args: List[str]) -> List[str]:
        if args and args[0].startswith("-") and args[0] not in TOP_LEVEL_OPTIONS:
            args = ["run"] + args
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: Any) -> List[str]:
        return super().list_commands(ctx) + [name for name in [*LAZY_COMMANDS, *LAZY_GROUPS] if name not in self.commands]

    def get_command(self, ctx: Any, name: str) -> Any:
        if name in LAZY_GROUPS and name not in self.commands:
            module, attribute, help_text = LAZY_GROUPS[name]
            if self.listing:
                return TyperCommand(name, help=help_text)
            self.commands[name] = typer.main.get_group(getattr(importlib.import_module(module), attribute))
            self.commands[name].name = name
        if name in LAZY_COMMANDS and name not in self.commands:
            module, function = LAZY_COMMANDS[name]
            if self.listing:
                return TyperCommand(name, help=_first_docstring_line(module, function))
            callback = getattr(importlib.import_module(module), function)
            self.commands[name] = typer.main.get_command_from_info(
                CommandInfo(name=name, callback=callback), pretty_exceptions_short=app.pretty_exceptions_short,
                rich_markup_mode=app.rich_markup_mode)
        return super().get_command(ctx, name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = typer.Typer(help="Launch distributed training benchmarks on Slurm sites or this machine.",
                  no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False, cls=DlaunchGroup)
sites_app = typer.Typer(help="Site profiles: list (no sub-command), show, check, migrate.", invoke_without_command=True)
app.add_typer(sites_app, name="sites")
out = Console(soft_wrap=True, markup=False)
err = Console(stderr=True, soft_wrap=True, markup=False)


def complete_site(incomplete: str) -> List[str]:
    """Site profile names and aliases starting with `incomplete` (TAB after --site)."""
    from launcher.boundary import decode, parse_toml, read_bytes
    from launcher.jobs.sites import available_sites

    names = []
    for name, path in available_sites().items():
        names.append(name)
        try:
            data = parse_toml(decode(read_bytes(path), name), name)
        except DlaunchError:
            continue
        aliases = data.get("aliases")
        if isinstance(aliases, list):
            names.extend(alias for alias in aliases if whole(NAME, alias))
    return sorted(name for name in set(names) if name.startswith(incomplete))


def complete_run_dir(incomplete: str) -> List[str]:
    """Run directories (and the experiment and study folders above them) starting with `incomplete`:
    those under ./runs, or under the folder typed so far."""
    typed = Path(incomplete).parent if "/" in incomplete else Path("runs")
    found = set()
    for run in find_runs([typed, Path("runs")]):
        found.update(str(p) for p in [run.path, *run.path.parents] if str(p) != ".")
    return sorted(p for p in found if p.startswith(incomplete))


@functools.lru_cache(maxsize=1)
def git_revision() -> Optional[str]:
    """The launcher's own commit, for the trainer's provenance (asked once per command: a sweep renders many jobs)."""
    try:
        result = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _trainer_parameters() -> List[inspect.Parameter]:
    params = []
    for flag in TRAINER_FLAGS:
        if flag.kind is bool:
            annotation: Any = Annotated[bool, typer.Option("--" + flag.name, help=flag.help, rich_help_panel="Trainer")]
            default: Any = False
        else:
            kind = Literal[flag.choices] if flag.choices and flag.kind is str else flag.kind  # int choices: checked by the request
            option = typer.Option("--" + flag.name, help=flag.help, rich_help_panel="Trainer")
            annotation, default = Annotated[Optional[kind], option], None
        params.append(inspect.Parameter(flag.attr, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return params


def with_trainer_options(command: Callable) -> Callable:
    """Give `command` one option per trainer flag; it receives the ones set as `trainer` (name, value) pairs."""
    own = [p for name, p in inspect.signature(command).parameters.items() if name != "trainer"]
    extra = _trainer_parameters()

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        values = [(flag.name, kwargs.pop(flag.attr)) for flag in TRAINER_FLAGS]
        # `is`, not `in`: 0 == False, and --workers 0 or --label-smoothing 0 must reach the trainer.
        return command(trainer=tuple((k, v) for k, v in values if v is not None and v is not False), **kwargs)

    wrapper.__signature__ = inspect.Signature(own + extra)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
    return wrapper


Site_ = Annotated[Optional[str], typer.Option("--site", help="profile name, alias or path to a .toml", autocompletion=complete_site)]
Framework = Annotated[Literal[FRAMEWORKS], typer.Option(help="training framework")]
Partition = Annotated[Optional[str], typer.Option(help="partition (or QOS); default: the site's default")]
TimeLimit = Annotated[str, typer.Option("--time", help="time limit (HH:MM:SS or D-HH:MM:SS)")]
Account = Annotated[Optional[str], typer.Option(help="account/budget; default: the site's account variable")]
Image = Annotated[Optional[str], typer.Option(help="container image (.sif); default: images/<stack>-<framework>.sif")]
Output = Annotated[str, typer.Option(help="runs go to OUTPUT/EXPERIMENT/RUN_NAME")]
Experiment = Annotated[Optional[str], typer.Option(help="experiment name (groups runs)")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="print the script; write and submit nothing")]
Follow = Annotated[bool, typer.Option("--follow", help="after submitting, watch the job(s) to their end (as `dlaunch watch`)")]
AllowLarge = Annotated[bool, typer.Option(ALLOW_LARGE, help="go beyond the limits that catch typos: --repeat over 100, more than 64 processes on this machine, a study of over 1000 jobs (README: Bad input and limits)")]
Requeue = Annotated[Optional[bool], typer.Option("--requeue/--no-requeue", help="after a node failure Slurm runs the job again and it resumes from its checkpoint (default: the site's `requeue`)")]
RunDirArg = Annotated[Path, typer.Argument(help="run directory", autocompletion=complete_run_dir)]


def prepare(request: LaunchRequest, run_dir: Optional[Path] = None,
            dry_run: bool = False) -> Tuple[LaunchRequest, "LaunchPlan", str]:
    """Resolve the site, complete and check the request, render the script (nothing is written)."""
    from launcher.jobs.plan import build_plan, resolve_account
    from launcher.jobs.render import render_script
    from launcher.jobs.sites import resolve_profile

    if not request.site:
        raise DlaunchError("--site: required (see `dlaunch sites`)")
    site, profile = resolve_profile(request.site)
    experiment = request.experiment or "%s-%s-%s" % (site.name, request.framework, request.option("model", "resnet50"))
    from launcher.jobs.imagepaths import check_loader, default_image_for_site, driver_warning

    check_loader(site, request.option("loader", "native"))
    image = request.image
    if site.container.kind != "none":
        if not image:
            image = default_image_for_site(site, request.framework)
        warning = driver_warning(site)
        if warning:
            err.print("dlaunch: warning: %s" % warning)
    request = dataclasses.replace(request, experiment=experiment, image=image).normalized()
    if run_dir is None:
        run_dir = Path(request.output) / experiment / (request.run_name or default_run_name())
        fits_file_system(run_dir, {"--experiment": experiment, "--run-name": run_dir.name})
    revision = git_revision()
    if dry_run:
        try:
            resolve_account(site, request.account, os.environ)
        except DlaunchError as e:
            if resolve_account(site, request.account, os.environ, required=False) is None:  # missing, not malformed
                err.print("dlaunch: warning: %s (the dry run renders the script without it)" % e)
    plan = build_plan(site, request, run_dir=str(run_dir), git_revision=revision, image=request.image,
                      environ=os.environ, require_account=not dry_run)
    plan = dataclasses.replace(plan, profile=profile)
    for warning in plan.warnings:
        err.print("dlaunch: warning: %s" % warning)
    for note in plan.notes:
        err.print("dlaunch: note: %s" % note)
    header = "dlaunch %s: site %s, %s, %d node(s) x %d processes%s" % (
        (revision or "unknown")[:12], site.name, plan.framework, plan.nodes, plan.nproc_per_node,
        ", partition %s" % plan.partition if plan.partition else "")
    return request, plan, render_script(plan, header)


def submit(request: LaunchRequest, plan: "LaunchPlan", script: str, run: RunDir) -> int:
    """Write the run directory, hand the script to the scheduler, record the outcome."""
    from launcher.runs.runstate import LOCAL_RUNNING
    from launcher.schedulers import scheduler_for

    run.write("job.sh", script, mode=0o755)
    run.write(SITE_PROFILE, plan.profile)  # what the job was made from: `archive` bundles this, never a path
    run.write_plan(plan.to_dict(), request.to_dict())
    scheduler = scheduler_for(plan.scheduler)
    if plan.scheduler == "local":  # runs in this process's child: `dlaunch watch` checks that it lives
        run.set_state(LOCAL_RUNNING % os.getpid())
    try:
        submission = scheduler.submit(run.path / "job.sh", run.path)
    except SchedulerError as e:
        run.set_state("submission failed: %s" % e)
        raise
    run.write("job_id", submission.job_id + "\n")
    if submission.exit_code is None:
        run.set_state("submitted")
        err.print("submitted job %s; run directory %s" % (submission.job_id, run.path))
        return 0
    run.set_state("finished (exit %d)" % submission.exit_code)
    show_status([run])
    return submission.exit_code


def check_image(plan: "LaunchPlan", dry_run: bool) -> None:
    """A missing image stops a submission (a dry run warns)."""
    from launcher.runtimes import runtime_class

    if plan.image and runtime_class(plan.runtime).missing(plan.image):
        message = "--image: %s does not exist (build it with `make image-%s`; `dlaunch images` lists them)" % (plan.image, plan.framework)
        if not dry_run:
            raise DlaunchError(message)
        err.print("dlaunch: warning: " + message)


@app.command()
@with_trainer_options
def run(site: Site_ = None, framework: Framework = "ddp",
        nodes: Annotated[Optional[int], typer.Option(help="nodes (default 1)")] = None,
        gpus: Annotated[Optional[int], typer.Option(help="GPUs in all (local site: worker processes)")] = None,
        partition: Partition = None, time_limit: TimeLimit = "01:00:00", account: Account = None,
        image: Image = None, output: Output = "runs", experiment: Experiment = None,
        run_name: Annotated[Optional[str], typer.Option(help="run directory name (default: a time stamp)")] = None,
        resume: Annotated[Optional[Path], typer.Option(help="resubmit this run directory from its checkpoint (all other options come from its plan.json)", autocompletion=complete_run_dir)] = None,
        requeue: Requeue = None, dry_run: DryRun = False, follow: Follow = False,
        repeat: Annotated[int, typer.Option(min=1, help="N runs of this request in one experiment (RUN_NAME-r1..-rN): `dlaunch report` gives their median and spread")] = 1,
        allow_large: AllowLarge = False, trainer: Tuple[Tuple[str, Any], ...] = ()) -> int:
    """Render a job for a site and submit it (or run it here with --site local)."""
    check_limit("--repeat", repeat, "repeats", allow_large)
    if repeat > 1 and resume is not None:
        raise DlaunchError("--repeat: not with --resume (resume each run directory on its own)")
    if resume is not None:
        existing = RunDir.open(resume)
        _refuse_if_active(existing)
        stored = existing.request()
        request = dataclasses.replace(stored, resume=True, allow_large=stored.allow_large or allow_large)
        request, plan, script = prepare(request, run_dir=existing.path.resolve(), dry_run=dry_run)
    else:
        request = LaunchRequest(site=site, framework=framework, nodes=nodes, gpus=gpus, partition=partition,
                               time=time_limit, account=account, image=image, output=output, experiment=experiment,
                               run_name=run_name, trainer=trainer, requeue=requeue, allow_large=allow_large)
        if repeat > 1:
            from launcher.runs.repeat import run_repeats

            return run_repeats(request, repeat, dry_run=dry_run, follow=follow)
        request, plan, script = prepare(request, dry_run=dry_run)
    check_image(plan, dry_run)
    if dry_run:
        out.out(script, end="")
        return 0
    run_dir = RunDir.open(Path(plan.run_dir)) if resume is not None else RunDir.create(Path(plan.run_dir))
    code = submit(request, plan, script, run_dir)
    if follow and plan.scheduler != "local":  # a local run was followed in the foreground already
        return watch_runs([run_dir.path])
    return code


def _refuse_if_active(run: RunDir) -> None:
    """A second job must not append to the metrics and checkpoints of one that still runs."""
    from launcher.schedulers import scheduler_for

    kind = run.plan()["plan"]["scheduler"]
    if kind != "local" and run.job_id:
        job = scheduler_for(kind).jobs([run.job_id])[run.job_id]
        if job.kind.active:
            raise DlaunchError("--resume: job %s of %s is still %s (dlaunch cancel it first)" % (run.job_id, run.path, job.state))


def _counts(flag: str, text: str) -> List[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DlaunchError("%s: %r is not a comma-separated list of numbers" % (flag, text)) from None
    if not counts or min(counts) < 1:
        raise DlaunchError("%s: give positive counts, e.g. 1,2,4" % flag)
    if len(set(counts)) != len(counts):
        raise DlaunchError("%s: %s lists a count twice" % (flag, text))
    return counts


@app.command()
@with_trainer_options
def sweep(site: Site_ = None, framework: Framework = "ddp",
          nodes: Annotated[Optional[str], typer.Option(help="node counts, e.g. 1,2,4,8")] = None,
          gpus: Annotated[Optional[str], typer.Option(help="GPU counts instead of node counts")] = None,
          partition: Partition = None, time_limit: TimeLimit = "01:00:00", account: Account = None,
          image: Image = None, output: Output = "runs", experiment: Experiment = None,
          requeue: Requeue = None, dry_run: DryRun = False, follow: Follow = False, allow_large: AllowLarge = False,
          trainer: Tuple[Tuple[str, Any], ...] = ()) -> int:
    """One job per node (or GPU) count, grouped as one experiment."""
    if (nodes is None) == (gpus is None):
        raise DlaunchError("--nodes/--gpus: give exactly one list of counts")
    key, flag, text = ("nodes", "--nodes", nodes) if nodes is not None else ("gpus", "--gpus", gpus)
    experiment = experiment or "sweep-%s-%s" % (framework, default_run_name())
    jobs = []
    for count in _counts(flag, text or ""):
        request = LaunchRequest(site=site, framework=framework, partition=partition, time=time_limit, account=account,
                                image=image, output=output, experiment=experiment, requeue=requeue,
                                run_name="%s%04d" % (key[0], count), trainer=trainer, allow_large=allow_large, **{key: count})
        request, plan, script = prepare(request, dry_run=dry_run)
        check_image(plan, dry_run)
        jobs.append((request, plan, script))
    if dry_run:
        for _, _, script in jobs:
            out.out(script)
        return 0
    taken = [plan.run_dir for _, plan, _ in jobs if Path(plan.run_dir).exists()]
    if taken:
        raise DlaunchError("run directory %s exists (choose another --experiment)" % taken[0])
    for request, plan, script in jobs:  # stop at the first refusal; later runs are not created
        code = submit(request, plan, script, RunDir.create(Path(plan.run_dir)))
        if code:
            return code
    if follow and jobs[0][1].scheduler != "local":
        return watch_runs([Path(jobs[0][1].run_dir).parent])
    return 0


def failure_reason(run: RunDir) -> Optional[str]:
    """The line that explains a failed run (launcher/runs/failures.py ranks them), else the end record's reason."""
    from launcher.runs.failures import explain

    cause = explain(run.log_files())
    if cause:
        return str(cause)
    from train.metrics_schema import MetricsError, read_metrics

    try:
        end = read_metrics(str(run.metrics_path)).end if run.metrics_path.is_file() else None
    except MetricsError:
        end = None
    return str(end["reason"]) if end and end.get("reason") else None


def why_failed(snapshot: "Snapshot") -> str:
    """Why a failed run failed: `failure_reason`, else Slurm's verdict, else what its state and metrics say."""
    reason = failure_reason(snapshot.run)
    if reason:
        return reason
    kind = snapshot.run.plan()["plan"]["scheduler"]
    if snapshot.job != "-" and kind != "local":
        from launcher.schedulers import scheduler_for

        ended = scheduler_for(kind).end_reason(snapshot.job)
        if ended:
            return "%s ended the job (%s); its log says nothing (was the run directory visible on the nodes?)" % (scheduler_for(kind).label, ended)
    return "%s, metrics %s" % (snapshot.state, snapshot.progress.status)


STATUS_HEADERS = ("run", "site", "job", "scheduler", "metrics", "epochs", "images/s", "results")
# Left out in this order when the columns' longest words do not fit the console side by side.
STATUS_LEAVE_OUT = ("results", "site", "job", "images/s", "epochs")


def show_status(runs: List[RunDir]) -> int:
    """A table of the runs (scheduler state, metrics status, epochs done, images/s), then why any failed,
    and a `rejected:` line for each run whose files cannot be read (exit code 1, else 0)."""
    from launcher.runs.failures import scheduler_label
    from launcher.runs.runstate import observe
    from launcher.tables import fit_table

    runs, rejected = readable(runs)
    rows, reasons = [], []
    for snapshot in observe(runs):
        p = snapshot.progress
        epochs = "%d/%d" % (p.epochs_done, p.epochs_total) if p.epochs_total else (str(p.epochs_done) if p.epochs_done else "-")
        speed = "%.1f" % p.images_per_s if p.images_per_s is not None else "-"
        rows.append((snapshot.name, snapshot.site, snapshot.job, scheduler_label(snapshot.state, p.status), p.status, epochs, speed,
                     display_path(snapshot.run.metrics_path)))
        if snapshot.failed:
            reasons.append("%s: %s" % (snapshot.name, why_failed(snapshot)))
        figures = run_figures(snapshot)
        if figures:
            reasons.append("%s: %s" % (snapshot.name, figures))
    if rows:
        out.print(fit_table("dlaunch runs", STATUS_HEADERS, rows, out.width, leave_out=STATUS_LEAVE_OUT))
    for line in reasons:
        out.print(line, markup=False, highlight=False)
    record_results([run.metrics_path for run in runs])
    for message in rejected:
        err.print("rejected: %s" % escape(message), highlight=False)
    return 1 if rejected else 0


def record_results(metrics_files: List[Path]) -> None:
    """Rows for the runs that ended into the results database (launcher/results/store.py); a
    database that cannot be written is a warning."""
    from launcher.results.store import record

    warning = record(metrics_files).warning
    if warning:
        err.print("dlaunch: warning: %s" % warning)


def run_figures(snapshot: "Snapshot") -> str:
    """Time and energy to accuracy, the trainer's energy and Slurm's (`sacct`), each named; '' when none is known."""
    from launcher.analysis.scaling import status_figures
    from launcher.runs.energy_accounting import slurm_job_energy
    from train.metrics_schema import MetricsError, read_metrics

    try:
        f = status_figures(read_metrics(str(snapshot.run.metrics_path)))
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
    if snapshot.ended and snapshot.job != "-" and snapshot.run.plan()["plan"]["scheduler"] == "slurm":
        accounted = slurm_job_energy(snapshot.job)
        if not isinstance(accounted, str):
            parts.append("energy %.1f kJ (Slurm sacct ConsumedEnergy: the job's nodes)" % (accounted / 1e3))
    return "; ".join(parts)


RunDirs = Annotated[Optional[List[Path]], typer.Argument(help="run directories, or folders holding them (default: ./runs)",
                                                         autocompletion=complete_run_dir)]


@app.command()
def status(run_dirs: RunDirs = None) -> int:
    """Scheduler state and metrics status of runs (without arguments: `dlaunch runs`)."""
    if not run_dirs:
        return runs()
    found = find_runs(run_dirs)
    if not found:
        raise DlaunchError("no run directories under %s" % ", ".join(escape(str(p)) for p in run_dirs))
    return show_status(found)


@app.command()
def runs(directory: Annotated[Path, typer.Argument(help="folder holding run directories", autocompletion=complete_run_dir)] = Path("runs")) -> int:
    """The run directories under DIRECTORY (default ./runs), newest first, with state and figures."""
    found = newest_first(find_runs([directory]))
    if not found:
        raise DlaunchError("no run directories under %s" % escape(str(directory)))
    return show_status(found)


def watch_runs(targets: List[Path], interval: float = 5.0, once: bool = False) -> int:
    """Follow runs to their end (see launcher/runs/watch.py); 1 when one failed."""
    from launcher.runs.watch import follow

    try:
        code = follow(targets, why_failed, out, interval=interval, once=once)
    except KeyboardInterrupt:
        err.print("dlaunch: stopped watching; the runs go on (dlaunch watch %s)" % " ".join(str(t) for t in targets))
        return 130
    record_results([run.metrics_path for run in find_runs(targets)])
    return code


@app.command()
def watch(targets: Annotated[List[Path], typer.Argument(help="run, experiment or study directories (or an experiment's name under ./runs)",
                                                      autocompletion=complete_run_dir, show_default=False)],
          once: Annotated[bool, typer.Option("--once", help="show the state once and exit (for cron): 1 when a run failed")] = False,
          interval: Annotated[float, typer.Option(parser=finite_number(low=0.1), help="seconds between looks at the runs (at least 0.1)")] = 5.0) -> int:
    """Follow runs to their end: progress, images/s, loss, ETA, queue place, why one failed.

    Live in a terminal; through a pipe one plain line per change. Ends when every run has ended;
    exit code 1 when one failed."""
    from launcher.runs.watch import resolve_targets

    return watch_runs(resolve_targets(targets), interval=interval, once=once)


@app.command()
def logs(run_dir: RunDirArg) -> int:
    """Print a run's logs."""
    run = RunDir.open(run_dir)
    files = run.log_files()
    if not files:
        from launcher.runs.runstate import observe

        (snapshot,) = observe([run])
        if snapshot.failed:  # a job that ended without writing its log (e.g. a launch failure)
            err.print("no log in %s: the run %s (%s)" % (display_path(run.path), snapshot.progress.status, why_failed(snapshot)))
            return 1
        err.print("no log in %s yet (state: %s)" % (display_path(run.path), snapshot.state))
    from launcher.boundary import check_regular, copy_log

    for path in [check_regular(p) for p in files]:  # all checked before the first is printed
        err.rule(display_path(path))
        copy_log(path, lambda text: out.out(text, end="", highlight=False))
    return 0


@app.command()
def cancel(run_dir: RunDirArg) -> int:
    """Cancel a run's Slurm job."""
    from launcher.schedulers import scheduler_for

    run = RunDir.open(run_dir)
    if not run.job_id:
        raise DlaunchError("%s: no job id (state: %s)" % (display_path(run.path), run.state))
    scheduler_for(run.plan()["plan"]["scheduler"]).cancel(run.job_id)
    run.set_state("cancel requested")
    err.print("cancelled job %s" % run.job_id)
    return 0


SITES_HEADERS = ("name", "aliases", "scheduler", "GPUs per node", "container", "description", "file")
SITES_LEAVE_OUT = ("container", "scheduler", "GPUs per node", "aliases")


@sites_app.callback()
def sites(ctx: typer.Context) -> None:
    """List the profiles."""
    if ctx.invoked_subcommand is not None:
        return
    from launcher.jobs.sites import available_sites, load_site
    from launcher.tables import fit_table

    rows = []
    for name, path in available_sites().items():
        try:
            site = load_site(path)
        except DlaunchError as e:  # listed, not fatal: `dlaunch sites check FILE` says more
            rows.append((escape(name), "", "unreadable", "", "", escape(str(e)), display_path(path)))
            continue
        rows.append((site.name, ", ".join(site.aliases), site.scheduler.kind, str(site.gpus_per_node),
                     site.container.kind, escape(site.description), display_path(path)))
    out.print(fit_table("sites", SITES_HEADERS, rows, out.width, leave_out=SITES_LEAVE_OUT))


@sites_app.command("show")
def sites_show(name: Annotated[str, typer.Argument(help="profile name, alias or path", autocompletion=complete_site)]) -> int:
    """Print one profile, resolved and with defaults filled in; warn when its sources are old."""
    import datetime

    from launcher.jobs.sitecheck import age_warnings
    from launcher.jobs.sites import resolve_site

    site = resolve_site(name)
    out.print_json(site.model_dump_json())
    for warning in age_warnings(site, datetime.date.today()):
        err.print("dlaunch: warning: site %s: %s" % (site.name, warning))
    return 0


@sites_app.command("check")
def sites_check(path: Annotated[Path, typer.Argument(help="profile file")]) -> int:
    """Validate one profile file; warn about the first schema, contradictions, shadowed names, old sources."""
    import datetime

    from launcher.jobs.sitecheck import check_warnings
    from launcher.jobs.sites import load_site

    site = load_site(path)
    warnings = check_warnings(path, datetime.date.today())
    for warning in warnings:
        err.print("dlaunch: warning: %s: %s" % (display_path(path), escape(warning)), highlight=False)
    out.print("%s: ok (site %s%s)" % (display_path(path), site.name, ", %d warning(s)" % len(warnings) if warnings else ""),
              highlight=False)
    return 0


@sites_app.command("migrate")
def sites_migrate(path: Annotated[Path, typer.Argument(help="profile file of the first schema")],
                  output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write here (may be PATH itself) instead of printing")] = None) -> int:
    """Rewrite a first-schema profile in the current schema, comments kept (printed, or written with -o)."""
    from launcher.atomic import write_atomic
    from launcher.boundary import output_file
    from launcher.jobs.sitecheck import migrate

    if output is not None:
        output_file("--output", output)
    text, changed = migrate(path)
    if not changed:
        err.print("dlaunch: note: %s is in the current schema already" % display_path(path))
    if output is None:
        out.out(text, end="")
    else:
        write_atomic(output, text)
        err.print("dlaunch: wrote %s" % display_path(output))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit code (2: bad input, 1: the scheduler refused or a watched run
    failed, 130: interrupted). An OSError that reaches here concerns a path the user gave or one
    dlaunch writes (a name too long for the file system, no permission, a full disk): one line naming
    it, exit code 2."""
    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    try:
        result = app(args=args, prog_name="dlaunch", standalone_mode=False)
    except DlaunchError as e:
        err.print("dlaunch: error: %s" % escape(str(e)), highlight=False)
        return e.exit_code
    except typer.Abort:
        return 130
    except typer.TyperException as e:
        err.print("dlaunch: error: %s" % escape(e.format_message()), highlight=False)
        return e.exit_code
    except OSError as e:
        where = "%s: " % display_path(Path(os.fsdecode(e.filename))) if e.filename is not None else ""
        err.print("dlaunch: error: %s%s" % (where, e.strerror or escape(str(e))), highlight=False)
        return 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
