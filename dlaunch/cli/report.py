"""`dlaunch report`: the Python API's report (dlaunch/api/reports.py: its tables on the console; report.md, report.html and the
plots written by it)."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer
from rich.console import Console

from dlaunch.analysis.quality import DEFAULT_NOISE, HERE_NOISE
from dlaunch.boundary import escape
from dlaunch.cli.terminal import StragglerThreshold, finite_number
from dlaunch.reporting.html import PAGE
from dlaunch.tables import counted, print_table

if TYPE_CHECKING:
    from dlaunch.api import Report

# The options that decide which runs the tables and plots keep (report and study report).
IncludeNetworkMismatches = Annotated[
    bool,
    typer.Option(
        "--include-network-mismatches",
        help="keep runs whose network is not the site's [network] in the tables and plots",
    ),
]
IncludeStragglers = Annotated[
    bool,
    typer.Option(
        "--include-stragglers",
        help="keep runs with a straggler or a throttled GPU in the tables and plots (their E_G is understated)",
    ),
]

IncludeDoubtful = Annotated[
    bool,
    typer.Option(
        "--include-doubtful",
        help="keep scaling points the measurement-quality verdict doubts (noisy, an unstable reference, E_G beyond "
        "what noise allows) in the tables, plots and budget",
    ),
]


def noise_fraction(text: str) -> float:
    """A typer `parser` for --noise-threshold: a number strictly between 0 and 1 (checked, and said, as the API checks
    it: quality.noise_option)."""
    from dlaunch.analysis.quality import noise_option

    value = finite_number()(text)
    noise_option(value)
    return value


NoiseThreshold = Annotated[
    Optional[float],
    typer.Option(
        parser=noise_fraction,
        help="a scaling point whose runs' images/s spread more than this fraction of their median is noisy "
        "(default: %g, %g for runs made on this machine: --site local)" % (DEFAULT_NOISE, HERE_NOISE),
    ),
]


def doubtful_lines(made: "Report") -> List[str]:
    """A line per point the quality verdict doubts: its group and count, the verdict, its figures and likely causes."""
    from dlaunch.analysis.scaling import count_name

    return [
        "doubtful: %s at %s: %s%s"
        % (
            group.label,
            counted(q.gpus, count_name(group.unit)[: -len(" count")], group.unit),
            "; ".join(q.problems),
            "; likely: %s" % "; ".join(q.causes) if q.causes else "",
        )
        for group in made.groups
        for q in group.quality
        if q.verdict != "ok"
    ]


def report_command(
    paths: Annotated[
        List[Path], typer.Argument(help="Run directories (searched recursively for metrics.jsonl) or metrics files.")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder for report.md, report.html and the PNG plots.")
    ] = Path("report"),
    site: Annotated[
        Optional[str],
        typer.Option(
            help="Site profile (name or TOML path) for every run; default: the one each run's directory kept (site.toml), else its site's name."
        ),
    ] = None,
    include_network_mismatches: IncludeNetworkMismatches = False,
    include_stragglers: IncludeStragglers = False,
    straggler_threshold: StragglerThreshold = None,
    include_doubtful: IncludeDoubtful = False,
    noise_threshold: NoiseThreshold = None,
) -> None:
    """Turn run directories into the study's tables, report.md, report.html (one page to share) and plots.

    Exit code 0; 1 when some metrics files were rejected (each named on stderr, the rest reported);
    2 on bad input (nothing written).
    """
    from dlaunch import api

    console, errors = Console(soft_wrap=True, markup=False), Console(stderr=True, soft_wrap=True, markup=False)
    made = api.report(
        paths,
        output=output,
        site=site,
        include_network_mismatches=include_network_mismatches,
        include_stragglers=include_stragglers,
        straggler_threshold=straggler_threshold,
        include_doubtful=include_doubtful,
        noise_threshold=noise_threshold,
        on_rejected=lambda message: errors.print("rejected: %s" % escape(message), highlight=False),
    )
    for table in made.tables:  # fitted to the console without cutting a name, saying what they left out
        print_table(console, table.title, table.headers, table.rows, leave_out=table.leave_out, wrap_caption=True)
    for line in doubtful_lines(made):
        console.print(line, highlight=False)
    for note in made.notes:
        errors.print("note: %s" % note, highlight=False)
    console.print("wrote %s and %s" % (output / "report.md", output / PAGE), highlight=False)
    if made.rejected:
        raise typer.Exit(1)
