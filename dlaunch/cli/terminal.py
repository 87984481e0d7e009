"""What the commands share at the terminal: the consoles, the help's layout, the option types and their
completion, the trainer's flags as options, `--json`, and the status table. The command modules of dlaunch/cli/
import these; none of them imports dlaunch/cli/__init__.py (the app and main).

Start-up matters on login nodes (every command, every TAB): only what every command needs is imported
here; the status table imports its parts when it is printed.
"""

import functools
import inspect
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Dict, List, Literal, Optional, Sequence, Set, Tuple, Union

import typer
from rich.console import Console
from typer._click import Context as ClickContext  # typer's own copy of click
from typer._click.formatting import HelpFormatter as ClickHelpFormatter
from typer.core import TyperCommand, TyperGroup

from dlaunch.boundary import ALLOW_LARGE, NAME, escape, quoted, whole
from dlaunch.errors import DlaunchError
from dlaunch.jobs.request import TRAINER_FLAGS
from dlaunch.runs.rundir import find_runs
from dlaunch.thresholds import DEFAULT_THRESHOLD

if TYPE_CHECKING:
    from dlaunch.api import Record, RunStatus

out = Console(soft_wrap=True, markup=False)
err = Console(stderr=True, soft_wrap=True, markup=False)


# Help text is wrapped with its hyphens held as this character (which no line break follows), so that a
# line never ends inside `--from-runs` or `<stack>-<framework>`; the formatter writes them back.
HELD_HYPHEN = "\u2011"


class HelpFormatter(ClickHelpFormatter):
    """click's plain help layout, with words whole: broken at spaces only, never at a hyphen."""

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        super().write_dl([(first, second.replace("-", HELD_HYPHEN)) for first, second in rows], col_max, col_spacing)

    def write_text(self, text: str) -> None:
        super().write_text(text.replace("-", HELD_HYPHEN))

    def write(self, string: str) -> None:
        super().write(string.replace(HELD_HYPHEN, "-"))


class HelpContext(ClickContext):
    formatter_class = HelpFormatter


class DlaunchCommand(TyperCommand):
    """A command whose plain help lists its options in sections by their `rich_help_panel` (the
    trainer's flags under "Trainer"), as rich's help draws its panels."""

    context_class = HelpContext

    def format_options(self, ctx: Any, formatter: Any) -> None:
        sections: Dict[str, List[Tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                plain = "Arguments" if param.param_type_name == "argument" else "Options"
                sections.setdefault(getattr(param, "rich_help_panel", None) or plain, []).append(record)
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl(rows)


class PlainGroup(TyperGroup):
    """A command group whose help lists each command with its whole first sentence (click shortens it
    to one line, cutting words with `...`)."""

    context_class = HelpContext

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        rows = [
            (name, command.get_short_help_str(limit=sys.maxsize))
            for name, command in commands
            if command is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class CommandGroup(typer.Typer):
    """A typer app whose commands are DlaunchCommands."""

    def command(self, name: Optional[str] = None, *, cls: Any = None, **settings: Any) -> Any:
        return super().command(name, cls=cls or DlaunchCommand, **settings)


def command_group(**settings: Any) -> typer.Typer:
    """A typer app whose help is plain text: wrapped at spaces to the terminal, words whole (rich's help
    tables cut them at 80 columns), and taken literally (rich markup swallowed `[dataset]`)."""
    return CommandGroup(**{"rich_markup_mode": None, "cls": PlainGroup, **settings})


def finite_number(low: Optional[float] = None) -> Callable[[str], float]:
    """A typer `parser` for a float option: a finite number (`inf`, `nan` refused), at least `low`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter("%s is not a number" % quoted(text)) from None
        if not math.isfinite(value):
            raise typer.BadParameter("%s is not a finite number" % quoted(text))
        if low is not None and value < low:
            raise typer.BadParameter("%s is below %g" % (quoted(text), low))
        return value

    return parse


def fraction(text: str) -> float:
    """A typer `parser` for --straggler-threshold: a number strictly between 0 and 1 (the range checked, and said,
    as the API checks it: stragglers.threshold_option)."""
    from dlaunch.analysis.stragglers import threshold_option

    value = finite_number()(text)
    threshold_option(value)
    return value


StragglerThreshold = Annotated[
    Optional[float],
    typer.Option(
        parser=fraction,
        help="a rank whose forward pass takes this fraction longer than the median rank's is a straggler (default: each run's site profile's straggler_threshold, else %g)"
        % DEFAULT_THRESHOLD,
    ),
]

Json = Annotated[
    bool, typer.Option("--json", help="print the objects of the Python API as JSON (docs/API.md), nothing else")
]


# `--json` (and `--format json`): stdout holds one JSON document whatever happens. A listing with nothing to list
# (no run under the folder, no run ended yet) prints `[]` and exits 0; a command that cannot answer (bad input, a
# path that does not exist, nothing to compare) prints JSON_ERROR's object with the exit code it exits with, beside
# its `dlaunch: error:` line on stderr.
JSON_ERROR = ("error", "exit_code")


def print_json(objects: "Union[Sequence[Record], Record]") -> None:
    """API objects as JSON on stdout (a list, or one object), and nothing else there."""
    data = objects.to_dict() if not isinstance(objects, (list, tuple)) else [o.to_dict() for o in objects]  # type: ignore[union-attr]  # a Sequence given here is a list or a tuple
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def json_requested(args: Sequence[str]) -> bool:
    """Whether a command line asks for JSON: `--json`, `--format json` or `--format=json` before any `--`."""
    args = list(args)[: list(args).index("--")] if "--" in args else list(args)
    return (
        "--json" in args
        or "--format=json" in args
        or ["--format", "json"] in [args[i : i + 2] for i in range(len(args))]
    )


def print_json_error(message: str, exit_code: int) -> None:
    """The error a `--json` command ends with, as JSON on stdout: {"error": the one line, "exit_code": ...}."""
    sys.stdout.write(json.dumps(dict(zip(JSON_ERROR, (message, exit_code))), indent=2, sort_keys=True) + "\n")


def complete_site(incomplete: str) -> List[str]:
    """Site profile names and aliases starting with `incomplete` (TAB after --site)."""
    from dlaunch.boundary import decode, parse_toml, read_bytes
    from dlaunch.jobs.sites import available_sites

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


def complete_framework(incomplete: str) -> List[str]:
    """The framework table's names starting with `incomplete` (TAB after --framework)."""
    from dlaunch.train.framework_table import FRAMEWORKS

    return [name for name in FRAMEWORKS if name.startswith(incomplete)]


def complete_run_dir(incomplete: str) -> List[str]:
    """Run directories (and the experiment and study folders above them) starting with `incomplete`:
    those under ./runs, or under the folder typed so far."""
    typed = Path(incomplete).parent if "/" in incomplete else Path("runs")
    found: Set[str] = set()
    for run in find_runs([typed, Path("runs")]):
        found.update(str(p) for p in [run.path, *run.path.parents] if str(p) != ".")
    return sorted(p for p in found if p.startswith(incomplete))


def _trainer_parameters() -> List[inspect.Parameter]:
    params = []
    for flag in TRAINER_FLAGS:
        if flag.kind is bool:
            annotation: Any = Annotated[bool, typer.Option("--" + flag.name, help=flag.help, rich_help_panel="Trainer")]
            default: Any = False
        else:
            kind = (
                Literal[flag.values] if flag.values and flag.kind is str else flag.kind
            )  # int choices: checked by the request
            option = typer.Option("--" + flag.name, help=flag.help, rich_help_panel="Trainer")
            annotation, default = Annotated[Optional[kind], option], None
        params.append(
            inspect.Parameter(flag.attr, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
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

    wrapper.__signature__ = inspect.Signature(own + extra)  # type: ignore[attr-defined]  # the signature typer reads, set on the wrapper
    wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
    return wrapper


Site_ = Annotated[
    Optional[str], typer.Option("--site", help="profile name, alias or path to a .toml", autocompletion=complete_site)
]
# Checked against the framework table when the request is made (a row added later counts too).
Framework = Annotated[
    str,
    typer.Option(
        help="training framework (dlaunch/train/framework_table.py; TAB lists them)", autocompletion=complete_framework
    ),
]
Partition = Annotated[Optional[str], typer.Option(help="partition (or QOS); default: the site's default")]
TimeLimit = Annotated[
    str, typer.Option("--time", help="time limit as Slurm writes it: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
]
Account = Annotated[Optional[str], typer.Option(help="account/budget; default: the site's account variable")]
Image = Annotated[
    Optional[str],
    typer.Option(
        help="container image; default: images/<stack>-<framework>-<arch> in the form the site's runtime takes (.sif, .sqsh, a folder, a name: `dlaunch images`)"
    ),
]
Output = Annotated[
    Optional[str],
    typer.Option(help="runs go to OUTPUT/EXPERIMENT/RUN_NAME (default: the site's runs_dir, else ./runs)"),
]
Experiment = Annotated[Optional[str], typer.Option(help="experiment name (groups runs)")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="print the script; write and submit nothing")]
Follow = Annotated[
    bool, typer.Option("--follow", help="after submitting, watch the job(s) to their end (as `dlaunch watch`)")
]
AllowLarge = Annotated[
    bool,
    typer.Option(
        ALLOW_LARGE,
        help="go beyond the limits that catch typos: --repeat over 100, more than 64 processes on this machine, a study of over 1000 jobs (README: Bad input and limits)",
    ),
]
Requeue = Annotated[
    Optional[bool],
    typer.Option(
        "--requeue/--no-requeue",
        help="after a node failure the scheduler runs the job again and it resumes from its checkpoint (default: the site's `requeue`)",
    ),
]
RunDirArg = Annotated[Path, typer.Argument(help="run directory", autocompletion=complete_run_dir)]
RunDirs = Annotated[
    Optional[List[Path]],
    typer.Argument(help="run directories, or folders holding them (default: ./runs)", autocompletion=complete_run_dir),
]

STATUS_HEADERS = ("run", "site", "job", "GPUs", "scheduler", "metrics", "epochs", "images/s", "results")
# Left out in this order when the columns' longest words do not fit the console side by side: what a
# user comes for (which run, on how many GPUs, its state, its images/s) stays longest.
STATUS_LEAVE_OUT = ("results", "job", "site", "epochs", "metrics")


def images_per_s_cell(status: "RunStatus") -> str:
    """The run's throughput X once its metrics end (dlaunch/analysis/scaling.py: Run.throughput); while
    it runs, within an epoch the epoch's images/s so far (steps only), else its last epoch's part of X,
    labelled as such."""
    if status.images_per_s is not None:
        return "%.1f" % status.images_per_s
    if status.epoch_so_far_images_per_s is not None:
        from dlaunch.runs.runstate import EPOCH_SO_FAR

        return "%.1f (%s)" % (status.epoch_so_far_images_per_s, EPOCH_SO_FAR)
    if status.last_epoch_images_per_s is not None:
        return "%.1f (last epoch)" % status.last_epoch_images_per_s
    return "-"


def show_status(statuses: Sequence["RunStatus"]) -> int:
    """The runs (dlaunch.api.status) as a table (scheduler state, metrics status, GPUs, epochs done, images/s), then
    why any failed, its network problems, stragglers and throttled GPUs, and each run's figures, and a `rejected:`
    line for each run whose files cannot be read (exit code 1, else 0)."""
    from dlaunch.tables import print_lines, print_table
    from dlaunch.train.metrics_schema import METRICS_FILE

    rows, notes = [], []
    for s in statuses:
        if s.rejected is not None:
            continue
        epochs = (
            "%d/%d" % (s.epochs_done, s.epochs_total)
            if s.epochs_total
            else (str(s.epochs_done) if s.epochs_done else "-")
        )
        # display_path(the metrics file), from the run directory's as shown (a relpath per run less)
        results = METRICS_FILE if s.name == "." else "%s/%s" % (s.name, METRICS_FILE)
        rows.append(
            (
                s.name,
                s.site,
                s.job,
                "-" if s.gpus is None else str(s.gpus),
                s.state,
                s.status,
                epochs,
                images_per_s_cell(s),
                results,
            )
        )
        if s.why_failed is not None:
            notes.append("%s: %s" % (s.name, s.why_failed))
        if s.stopped_by is not None:
            notes.append("%s: %s" % (s.name, s.stopped_by))
        notes += ["%s: network: %s" % (s.name, problem) for problem in s.network]
        notes += ["%s: %s" % (s.name, flag) for flag in s.flags]
        notes += ["%s: %s" % (s.name, line) for line in s.preflight]
        notes += ["%s: %s" % (s.name, node) for node in s.nodes]
        if s.quality is not None:
            notes.append("%s: %s" % (s.name, s.quality))
        if s.figures:
            notes.append("%s: %s" % (s.name, s.figures))
    if rows:
        print_table(out, "dlaunch runs", STATUS_HEADERS, rows, leave_out=STATUS_LEAVE_OUT)
    print_lines(out, [escape(line) for line in notes])
    rejected = [s.rejected for s in statuses if s.rejected is not None]
    for message in rejected:
        err.print("rejected: %s" % escape(message), highlight=False)
    return 1 if rejected else 0
