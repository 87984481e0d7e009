"""The `dlaunch` command line: the app and its entry point. Each command lives in the module named by it
(dlaunch/cli/run.py: run and sweep, runs.py: status, runs, watch, logs and cancel, sites.py, images.py,
doctor.py, report.py, predict.py, study.py, results.py, rerun.py, archive.py); a command parses, calls the
Python API (dlaunch/api/; `run`, `sweep` and `rerun` its two steps, prepare and submit, to print between them and
show a local run's progress) and prints; `--json` prints the API's objects (`to_dict()`) instead of a table. Outside the
API (docs/API.md): `watch`'s live view, `study report`'s published comparison, `results rebuild`, `sites
show/check/migrate`. `dlaunch <run options>` without a sub-command is `dlaunch run`.

Start-up matters on login nodes (every command, every TAB): this module imports only what every
command needs; each command imports its own heavy parts (site profiles and pydantic, rich tables,
the image lock, the performance model, matplotlib) when it runs, and the commands of LAZY_COMMANDS and
LAZY_GROUPS load their modules only then.
"""

import ast
import importlib
import importlib.util
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any, List, Optional

import typer
import typer.main
from typer.core import TyperCommand
from typer.models import CommandInfo

from dlaunch.boundary import escape
from dlaunch.cli import doctor, images, run, runs, sites
from dlaunch.cli.terminal import (
    DlaunchCommand,
    PlainGroup,
    command_group,
    err,
    json_requested,
    out,
    print_json_error,
)
from dlaunch.errors import DlaunchError, DlaunchWarning

# Options of the whole program, not of `run` (which `dlaunch <run options>` stands for).
TOP_LEVEL_OPTIONS = ("--help", "-h", "--version", "--install-completion", "--show-completion")
# Commands whose modules are too heavy to import for every command: name -> (module, function).
LAZY_COMMANDS = {
    "report": ("dlaunch.cli.report", "report_command"),
    "predict": ("dlaunch.cli.predict", "predict_command"),
    "rerun": ("dlaunch.cli.rerun", "rerun_command"),
    "archive": ("dlaunch.cli.archive", "archive_command"),
}
# Command groups in heavy modules: name -> (module, typer.Typer attribute, one-line help).
LAZY_GROUPS = {
    "study": (
        "dlaunch.cli.study",
        "study_app",
        "Studies: list them, run a study file's matrix, its status, its report.",
    ),
    "results": ("dlaunch.cli.results", "results_app", "The results database: list runs, compare, rebuild."),
    "nodes": ("dlaunch.cli.nodes", "nodes_app", "Suspect nodes of a site: list, clear."),
}


def _first_docstring_line(module: str, function: str) -> str:
    """A function's one-line summary, read from its source without importing the module."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))  # type: ignore[arg-type,union-attr]  # dlaunch's own command modules, found as source files
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
        return super().list_commands(ctx) + [
            name for name in [*LAZY_COMMANDS, *LAZY_GROUPS] if name not in self.commands
        ]

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
                pretty_exceptions_short=app.pretty_exceptions_short,
                rich_markup_mode=app.rich_markup_mode,
            )
        return super().get_command(ctx, name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = command_group(
    help="Launch distributed training benchmarks on Slurm sites or this machine.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=DlaunchGroup,
)


def _print_version(asked: bool) -> None:
    if asked:
        from dlaunch.runs.service import git_revision
        from dlaunch.version import __version__

        revision = git_revision()
        out.out("dlaunch %s%s" % (__version__, " (git %s)" % revision[:12] if revision else ""), highlight=False)
        raise typer.Exit(0)


@app.callback()
def options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="print dlaunch's version (and git revision) and exit",
        ),
    ] = False,
) -> None:
    """The program's own options (its help text is the app's)."""


for command in (run.run, run.sweep, runs.status, runs.runs, runs.watch, runs.logs, runs.cancel):
    app.command()(command)
app.add_typer(sites.sites_app, name="sites")
app.command()(images.images)
app.command()(doctor.doctor)


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
    it, exit code 2 (dlaunch/api/calls.py: os_error)."""
    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", DlaunchWarning)
            warnings.showwarning = _show_warning
            result = app(args=args, prog_name="dlaunch", standalone_mode=False)
    except DlaunchError as e:
        return _error(args, escape(str(e)), e.exit_code)
    except typer.Abort:
        return _error(args, "interrupted", 130, shown=False)
    except typer.TyperException as e:
        return _error(args, escape(e.format_message()), e.exit_code)
    except OSError as e:
        from dlaunch.api import os_error

        return _error(args, escape(str(os_error(e))), 2)
    return result if isinstance(result, int) else 0


def _error(args: List[str], message: str, code: int, shown: bool = True) -> int:
    """`dlaunch: error: MESSAGE` on stderr (unless not `shown`), and with --json the error as JSON on stdout too
    (terminal.print_json_error); the exit code."""
    if shown:
        err.print("dlaunch: error: %s" % message, highlight=False)
    if json_requested(args):
        print_json_error(message, code)
    return code
