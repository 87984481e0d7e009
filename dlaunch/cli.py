"""The `dlaunch` command line: it parses, calls the Python API (dlaunch/api.py; `run` and `sweep` its two
steps, dlaunch/launch.py) and prints; `--json` prints the API's objects (`to_dict()`) instead of a table. `dlaunch <run options>` without a sub-command is `dlaunch run`.

Start-up matters on login nodes (every command, every TAB): this module imports only what every
command needs; each command imports its own heavy parts (site profiles and pydantic, rich tables,
the image lock, the performance model, matplotlib) when it runs.
"""
import ast
import importlib
import importlib.util
import json
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, List, Optional, Sequence, Tuple

import typer
import typer.main
from typer.core import TyperCommand
from typer.models import CommandInfo

from dlaunch.boundary import escape, finite_number
from dlaunch.errors import DlaunchError, DlaunchWarning
from dlaunch.runs.rundir import display_path, find_runs, newest_first
from dlaunch.terminal import (Account, AllowLarge, DlaunchCommand, DryRun, Experiment, Follow, Framework, Image, Output,
                               Partition, PlainGroup, Requeue, RunDirArg, RunDirs, Site_, TimeLimit, command_group,
                               complete_run_dir, complete_site, err, out, record_results, show_status,
                               with_trainer_options)

if TYPE_CHECKING:
    from dlaunch.api import Record
    from dlaunch.runs.service import Prepared

# Options of the whole program, not of `run` (which `dlaunch <run options>` stands for).
TOP_LEVEL_OPTIONS = ("--help", "-h", "--version", "--install-completion", "--show-completion")
# Commands defined in modules too heavy to import for every command: name -> (module, function).
LAZY_COMMANDS = {
    "report": ("dlaunch.analysis.report", "report_command"),
    "predict": ("dlaunch.analysis.perfmodel", "predict_command"),
    "rerun": ("dlaunch.runs.rerun", "rerun_command"),
    "archive": ("dlaunch.runs.archive", "archive_command"),
}
# Command groups defined in heavy modules: name -> (module, typer.Typer attribute, one-line help).
LAZY_GROUPS = {
    "study": ("dlaunch.runs.study", "study_app", "Studies: run a study file's matrix, its status, its report."),
    "results": ("dlaunch.resultsdb.command", "results_app", "The results database: list runs, compare, rebuild."),
}


def _first_docstring_line(module: str, function: str) -> str:
    """A function's one-line summary, read from its source without importing the module."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    return (ast.get_docstring(node) or "").split("\n")[0]


class DlaunchGroup(PlainGroup):
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
                CommandInfo(name=name, callback=callback, cls=DlaunchCommand),
                pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode)
        return super().get_command(ctx, name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = command_group(help="Launch distributed training benchmarks on Slurm sites or this machine.",
                    no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False, cls=DlaunchGroup)


def _print_version(asked: bool) -> None:
    if asked:
        from dlaunch.version import __version__
        from dlaunch.runs.service import git_revision

        revision = git_revision()
        out.out("dlaunch %s%s" % (__version__, " (git %s)" % revision[:12] if revision else ""), highlight=False)
        raise typer.Exit(0)


@app.callback()
def options(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                  help="print dlaunch's version (and git revision) and exit")] = False) -> None:
    """The program's own options (its help text is the app's)."""


sites_app = command_group(help="Site profiles: list (no sub-command), show, check, migrate.", invoke_without_command=True)
app.add_typer(sites_app, name="sites")


Json = Annotated[bool, typer.Option("--json", help="print the objects of the Python API as JSON (docs/API.md), nothing else")]


def print_json(objects: "Sequence[Record] | Record") -> None:
    """API objects as JSON on stdout (a list, or one object), and nothing else there."""
    data = objects.to_dict() if not isinstance(objects, (list, tuple)) else [o.to_dict() for o in objects]
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _deliver(jobs: Sequence["Prepared"], dry_run: bool, follow: bool, summary: str = "") -> int:
    """Print the scripts (--dry-run; notes on stderr), or submit the jobs (the run service's one rule),
    show the runs that ran in the foreground, and follow the others (--follow)."""
    from dlaunch import launch

    for line in dict.fromkeys(warning for job in jobs for warning in job.warnings):
        err.print("dlaunch: warning: %s" % line)
    for line in dict.fromkeys(note for job in jobs for note in job.notes):
        err.print("dlaunch: note: %s" % line)
    if dry_run:  # stdout is the script(s) alone: `--dry-run > job.sh`
        for job in jobs:
            out.out(job.script, end="" if len(jobs) == 1 else "\n")
        if summary:
            err.print("dlaunch: %s" % summary, highlight=False)
        return 0
    submitted = launch.submit(jobs, err.print, show_progress=True)
    foreground = [run for job, run in zip(jobs, submitted.runs) if job.foreground]
    if foreground:
        show_status(foreground)
    if follow and len(foreground) < len(submitted.runs):
        return watch_runs([run.path for run in submitted.runs]) or submitted.exit_code
    return submitted.exit_code


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
    from dlaunch import launch

    jobs = launch.prepare_run(site, framework=framework, nodes=nodes, gpus=gpus, partition=partition, time=time_limit,
                           account=account, image=image, output=output, experiment=experiment, run_name=run_name,
                           repeat=repeat, requeue=requeue, resume=None if resume is None else str(resume),
                           dry_run=dry_run, allow_large=allow_large, trainer=trainer)
    return _deliver(jobs, dry_run, follow, "%d runs of one request (--repeat %d)" % (repeat, repeat) if repeat > 1 else "")


def _counts(flag: str, text: Optional[str]) -> Optional[List[int]]:
    """A comma-separated list of counts (checked by the API), None when the option was not given."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DlaunchError("%s: %r is not a comma-separated list of numbers" % (flag, text)) from None


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
    from dlaunch import launch

    jobs = launch.prepare_sweep(site, framework=framework, nodes=_counts("--nodes", nodes), gpus=_counts("--gpus", gpus),
                             partition=partition, time=time_limit, account=account, image=image, output=output,
                             experiment=experiment, requeue=requeue, dry_run=dry_run, allow_large=allow_large,
                             trainer=trainer)
    return _deliver(jobs, dry_run, follow)


def print_statuses(statuses: Sequence[Any]) -> int:
    """`--json` of status and runs: the runs' RunStatus objects; a `rejected:` line on stderr for each run whose
    files cannot be read (exit code 1, else 0)."""
    print_json(statuses)
    rejected = [s.rejected for s in statuses if s.rejected]
    for message in rejected:
        err.print("rejected: %s" % escape(message), highlight=False)
    return 1 if rejected else 0


@app.command()
def status(run_dirs: RunDirs = None, as_json: Json = False) -> int:
    """Scheduler state and metrics status of runs (without arguments: `dlaunch runs`)."""
    if not run_dirs:
        return runs(as_json=as_json)
    if as_json:
        from dlaunch import api

        return print_statuses(api.status(run_dirs))
    found = find_runs(run_dirs)
    if not found:
        raise DlaunchError("no run directories under %s" % ", ".join(escape(str(p)) for p in run_dirs))
    return show_status(found)


@app.command()
def runs(directory: Annotated[Path, typer.Argument(help="folder holding run directories", autocompletion=complete_run_dir)] = Path("runs"),
         as_json: Json = False) -> int:
    """The run directories under DIRECTORY (default ./runs), newest first, with state and figures."""
    if as_json:
        from dlaunch import api

        return print_statuses(api.status([directory], newest_first=True))
    found = newest_first(find_runs([directory]))
    if not found:
        raise DlaunchError("no run directories under %s" % escape(str(directory)))
    return show_status(found)


def watch_runs(targets: List[Path], interval: float = 5.0, once: bool = False) -> int:
    """Follow runs to their end (see dlaunch/runs/watch.py); 1 when one failed."""
    from dlaunch.runs.service import why_failed
    from dlaunch.runs.watch import follow

    try:
        code = follow(targets, why_failed, out, interval=interval, once=once)
    except KeyboardInterrupt:
        err.print("dlaunch: stopped watching; the runs go on (dlaunch watch %s)" % " ".join(str(t) for t in targets))
        return 130
    record_results(find_runs(targets))
    return code


@app.command()
def watch(targets: Annotated[List[Path], typer.Argument(help="run, experiment or study directories (or an experiment's name under ./runs)",
                                                      autocompletion=complete_run_dir, show_default=False)],
          once: Annotated[bool, typer.Option("--once", help="show the state once and exit (for cron): 1 when a run failed")] = False,
          interval: Annotated[float, typer.Option(parser=finite_number(low=0.1), help="seconds between looks at the runs (at least 0.1)")] = 5.0) -> int:
    """Follow runs to their end: progress, images/s, loss, ETA, queue place, why one failed.

    Live in a terminal; through a pipe one plain line per change. Ends when every run has ended;
    exit code 1 when one failed."""
    from dlaunch.runs.watch import resolve_targets

    return watch_runs(resolve_targets(targets), interval=interval, once=once)


@app.command()
def logs(run_dir: RunDirArg) -> int:
    """Print a run's logs."""
    from dlaunch import api
    from dlaunch.boundary import check_regular, copy_log

    found = api.logs(run_dir)
    if found.missing:
        err.print(found.missing, highlight=False)
    for path in [check_regular(Path(p)) for p in found.files]:  # all checked before the first is printed
        err.rule(display_path(path))
        copy_log(path, lambda text: out.out(text, end="", highlight=False))
    return 1 if found.failed else 0


@app.command()
def cancel(run_dir: RunDirArg) -> int:
    """Cancel a run's job (a run that has ended is left as it is: exit 0)."""
    from dlaunch import api

    err.print(api.cancel(run_dir), highlight=False)
    return 0


SITES_HEADERS = ("name", "aliases", "scheduler", "GPUs per node", "container", "description", "file")
# What a user picks a site by comes last: its names, scheduler and GPUs per node; a description is shown
# on one line or not at all (`sites show NAME` prints it).
SITES_LEAVE_OUT = ("description", "file", "container", "GPUs per node", "scheduler", "aliases")


@sites_app.callback()
def sites(ctx: typer.Context, as_json: Json = False) -> None:
    """List the profiles."""
    if ctx.invoked_subcommand is not None:
        return
    from dlaunch import api
    from dlaunch.tables import fit_table

    found = api.sites()
    if as_json:
        return print_json(found)
    rows, unreadable = [], []
    for site in found:
        if site.unreadable is not None:  # listed, not fatal; the reason below the table, whatever the table leaves out
            rows.append((escape(site.name), "", "unreadable", "", "", escape(site.unreadable), display_path(Path(site.file))))
            unreadable.append("%s: unreadable: %s" % (escape(site.name), escape(site.unreadable)))
            continue
        rows.append((site.name, ", ".join(site.aliases), site.scheduler, str(site.gpus_per_node), site.container,
                     escape(site.description), display_path(Path(site.file))))
    out.print(fit_table("sites", SITES_HEADERS, rows, out.width, leave_out=SITES_LEAVE_OUT, one_line=("description",)))
    for line in unreadable:
        out.print(line, highlight=False)


@sites_app.command("show")
def sites_show(name: Annotated[str, typer.Argument(help="profile name, alias or path", autocompletion=complete_site)]) -> int:
    """Print one profile, resolved and with defaults filled in; warn when its sources are old."""
    import datetime

    from dlaunch.jobs.sitecheck import age_warnings
    from dlaunch.jobs.sites import resolve_site

    site = resolve_site(name, given_by="sites show NAME")
    out.print_json(site.model_dump_json())
    for warning in age_warnings(site, datetime.date.today()):
        err.print("dlaunch: warning: site %s: %s" % (site.name, warning))
    return 0


@sites_app.command("check")
def sites_check(path: Annotated[Path, typer.Argument(help="profile file")]) -> int:
    """Validate one profile file; warn about the first schema, contradictions, shadowed names, old sources."""
    import datetime

    from dlaunch.jobs.sitecheck import check_warnings
    from dlaunch.jobs.sites import load_site

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
    from dlaunch.atomic import write_atomic
    from dlaunch.boundary import output_file
    from dlaunch.jobs.sitecheck import migrate

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


IMAGES_HEADERS = ("image", "sites", "built", "pins from", "pins")
IMAGES_LEAVE_OUT = ("pins from", "sites", "pins")


@app.command()
def images(site: Annotated[Optional[str], typer.Option("--site", help="Only the images this site uses (name, alias or file).", autocompletion=complete_site)] = None,
           render: Annotated[bool, typer.Option("--render", help="Regenerate containers/<stack>/<image>.def from containers/versions.toml.")] = False,
           as_json: Json = False) -> int:
    """List the container images (per stack, framework image and architecture), the sites using them, whether they are built and their pins."""
    from rich.console import Console

    from dlaunch import api
    from dlaunch.jobs.imagepaths import images_dir
    from dlaunch.jobs.images import container_binary
    from dlaunch.tables import fit_table

    if render:
        for path in api.render_images():
            out.print("wrote %s" % path, highlight=False)
        return 0
    found = api.images(site)
    if as_json:
        print_json(found)
        return 0
    title = "dlaunch images in %s%s" % (images_dir(), "" if container_binary() else " (no apptainer/singularity on PATH)")
    # The image name is <stack>-<image group>-<arch>: no separate columns for them (80 columns). Every
    # pin is one word: the table wraps between pins, never inside a version (dlaunch/tables.py).
    rows = [(i.image, ", ".join(i.sites) or "-", ", ".join(i.built) or "missing", i.pins_from,
             " ".join(escape("%s=%s" % pin) for pin in i.pins.items())) for i in found]
    console = Console(soft_wrap=True, markup=False)  # its width from $COLUMNS now
    console.print(fit_table(title, IMAGES_HEADERS, rows, console.width, leave_out=IMAGES_LEAVE_OUT))
    console.print("image: NAME.sif (Apptainer) or NAME/ (unpacked root fs, Charliecloud)", highlight=False)
    return 0


@app.command()
def doctor(site: Annotated[str, typer.Option("--site", help="profile name, alias or path to a .toml", autocompletion=complete_site)],
           partition: Partition = None, account: Account = None, image: Image = None, framework: Framework = "ddp",
           as_json: Json = False) -> int:
    """Check a site before submitting: scheduler, account, MPI, modules, image, rendezvous, interfaces, GPUs, driver, network.

    Run it on the login node, and inside an allocation (`srun -N2 --ntasks-per-node=1 dlaunch doctor
    --site S`) for the node's checks and one all-reduce across the nodes (its transport and bus
    bandwidth). Exit code 0 when no check fails, 1 when one does, 2 on bad input.
    """
    from dlaunch import api
    from dlaunch.tables import fit_table

    found = api.doctor(site, partition=partition, account=account, image=image, framework=framework)
    if as_json:
        print_json(found)
        return 1 if found.failed else 0
    place = "%s %s" % ("node" if found.on_node else "login node (no compute node checks)", found.host)
    rows = [[c.name, c.outcome, c.detail, c.fix] for c in found.checks]
    out.print(fit_table("dlaunch doctor: site %s on %s" % (found.site, place), ["check", "result", "found", "fix / why"], rows, out.width))
    if found.failed:
        out.print("%d check(s) failed: %s" % (len(found.failed), ", ".join(found.failed)), highlight=False)
        return 1
    return 0


def _show_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    """The API's DlaunchWarnings as `dlaunch: warning: ...` (or `note:`) lines on stderr, others as Python shows them."""
    if issubclass(category, DlaunchWarning):
        err.print("dlaunch: %s: %s" % (category.label, escape(str(message))), highlight=False)
    else:
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit code (2: bad input, 1: the scheduler refused or a watched run
    failed, 130: interrupted). An OSError that reaches here concerns a path the user gave or one
    dlaunch writes (a name too long for the file system, no permission, a full disk): one line naming
    it, exit code 2 (dlaunch/api.py: os_error)."""
    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", DlaunchWarning)
            warnings.showwarning = _show_warning
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
        from dlaunch.api import os_error

        err.print("dlaunch: error: %s" % os_error(e), highlight=False)
        return 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
