"""`dlaunch report`: run directories -> rich tables, report.md and PNG plots (deterministic).

The same inputs give byte-identical outputs: rows are sorted, the report carries no time stamps
but the data's, plots are written with a fixed DPI and without PNG software/date metadata.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Sequence, Tuple

import typer
from rich.console import Console

from launcher.analysis import GroupKey, Run, ScalingPoint, group_runs, load_runs, rich_table, scaling, verdict
from launcher.atomic import atomic_file, write_atomic
from launcher.errors import DlaunchError
from launcher.perfmodel import MODEL_PARAMS_M, Prediction, Workload, gradient_bytes, interconnect_of_site, predict
from launcher.sites import Site, resolve_site

DPI = 100
PLOTS = {
    "throughput.png": "Throughput (images/s) against GPUs, per framework and loader",
    "efficiency.png": "Parallel efficiency E_G against GPUs (dotted: ideal)",
    "time_shares.png": "Share of time in communication, computation and data loading per GPU count",
    "accuracy_vs_batch.png": "Best validation top-1 against global batch, per LR schedule",
    "accuracy_vs_epoch.png": "Validation top-1 against epoch",
}
DEFINITIONS = """\
- Throughput X: mean of the epochs' images/s (whole job), leaving out the first epoch when a run
  has two or more (warm-up); repeated runs at one GPU count are averaged.
- Groups: experiment, site, model, framework, loader and batch per GPU (`bN`); different batch
  sizes per GPU are separate curves.
- Reference G_ref: the smallest GPU count of a group. Speed-up S_G = X_G / X_ref; parallel
  efficiency E_G = S_G / (G / G_ref), which equals (T_ref / T_G) / (G / G_ref) for a fixed amount
  of work.
- Time shares: comm, compute and data time per step from the trainer's `profile` record
  (`--profile-steps`), each divided by their sum.
- Reference verdict: PASS when X is at least (1 - tolerance) x the site's reference images/s for
  the model and GPU count, with X's deviation from the reference in percent.
- Predicted E_G: the ring all-reduce model (`dlaunch predict`), fed with the group's reference
  run's profile and the site's `[network]` section.
"""


@dataclass
class GroupResult:
    key: GroupKey
    runs: List[Run]
    points: List[ScalingPoint]
    predictions: Dict[int, Prediction] = field(default_factory=dict)


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else "%.1f" % (100 * value)


def _number(value: Optional[float], fmt: str = "%.1f") -> str:
    return "-" if value is None else fmt % value


def _group_predictions(runs: Sequence[Run], points: Sequence[ScalingPoint], site: Optional[Site]) -> Dict[int, Prediction]:
    """The model's curve over the group's GPU counts, from the reference point's profile."""
    network = interconnect_of_site(site) if site else None
    if network is None or not points or runs[0].key.model not in MODEL_PARAMS_M:
        return {}
    g_ref = points[0].gpus
    profiled = [r for r in runs if r.world_size == g_ref and r.profile is not None]
    if not profiled:
        return {}
    profile = profiled[0].profile
    workload = Workload(profile.compute_s, runs[0].key.batch_per_worker, gradient_bytes(runs[0].key.model), profile.data_s)
    return {p.gpus: p for p in predict(workload, network, [pt.gpus for pt in points])}


SCALING_HEADERS = ["GPUs", "nodes", "runs", "images/s", "S_G", "E_G", "pred. E_G", "comm %", "compute %", "data %"]
RUN_HEADERS = ["run", "GPUs", "global batch", "schedule", "status", "images/s", "best top-1", "reference", "metrics file"]


def scaling_rows(g: GroupResult) -> List[List[str]]:
    rows = []
    for pt in g.points:
        pred = g.predictions.get(pt.gpus)
        s = pt.shares
        rows.append([
            str(pt.gpus), str(pt.nodes), str(pt.runs), "%.1f" % pt.images_per_s,
            "%.2f" % pt.speedup, "%.3f" % pt.efficiency, _number(pred.efficiency if pred else None, "%.3f"),
            _percent(s.comm if s else None), _percent(s.compute if s else None), _percent(s.data if s else None),
        ])
    return rows


def run_rows(g: GroupResult, site: Optional[Site]) -> List[List[str]]:
    rows = []
    for run in g.runs:
        v = verdict(run, site.reference) if site else None
        check = "-" if v is None else "%s %+.1f%%" % ("PASS" if v.passed else "FAIL", 100 * v.deviation)
        rows.append([
            Path(run.path).parent.name, str(run.world_size), str(run.global_batch), run.schedule, run.status,
            _number(run.throughput), _number(run.best_top1, "%.4f"), check, run.path,
        ])
    return rows


def markdown_table(headers: Sequence[str], groups: Sequence[Tuple[GroupResult, List[List[str]]]]) -> str:
    """One table, the group label as first column."""
    headers = ["group", *headers]
    rows = [[g.key.label, *row] for g, group_rows in groups for row in group_rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _log2_axis(ax, label: str) -> None:
    """A base-2 log x axis with plain numbers (4, 8, 16, ...)."""
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel(label)
    ax.grid(True, which="both", alpha=0.3)


def plot_scaling(ax_x, ax_e, results: Sequence[GroupResult]) -> None:
    """Fig. 3 (throughput) and Fig. 4-7 (E_G) with dashed predictions where available."""
    for i, g in enumerate(r for r in results if r.points):
        color = "C%d" % (i % 10)
        gpus = [p.gpus for p in g.points]
        ax_x.plot(gpus, [p.images_per_s for p in g.points], "o-", color=color, label=g.key.label)
        ax_e.plot(gpus, [p.efficiency for p in g.points], "o-", color=color, label=g.key.label)
        if g.predictions:
            pred = [g.predictions[n] for n in gpus]
            ax_x.plot(gpus, [p.images_per_s for p in pred], "--", color=color, label=g.key.label + " (model)")
            ax_e.plot(gpus, [p.efficiency for p in pred], "--", color=color, label=g.key.label + " (model)")
    ax_e.axhline(1.0, color="black", linestyle=":", label="ideal")
    ax_x.set_yscale("log")
    ax_x.set_ylabel("images/s")
    ax_e.set_ylabel("E_G")
    ax_e.set_ylim(bottom=0)
    for ax in (ax_x, ax_e):
        _log2_axis(ax, "GPUs")
        ax.legend(fontsize="x-small")


def plot_shares(fig, results: Sequence[GroupResult]) -> None:
    """Table 2 as stacked bars: one panel per group with profile records."""
    with_shares = [g for g in results if any(p.shares for p in g.points)]
    if not with_shares:
        _note(fig.add_subplot(), "no profile records (run the trainer with --profile-steps N)")
        return
    axes = fig.subplots(len(with_shares), 1, squeeze=False)[:, 0]
    for ax, g in zip(axes, with_shares):
        points = [p for p in g.points if p.shares]
        labels = [str(p.gpus) for p in points]
        bottom = [0.0] * len(points)
        for part, color in (("comm", "C3"), ("compute", "C0"), ("data", "C2")):
            values = [100 * getattr(p.shares, part) for p in points]
            ax.bar(labels, values, bottom=bottom, color=color, label=part)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_title(g.key.label, fontsize="small")
        ax.set_ylabel("% of step")
        ax.legend(fontsize="x-small")
    axes[-1].set_xlabel("GPUs")


def plot_accuracy_vs_batch(ax, runs: Sequence[Run]) -> None:
    """Fig. 8b: best top-1 against global batch, one series per model and LR schedule."""
    series: Dict[Tuple[str, str], List[Tuple[int, float]]] = {}
    for run in runs:
        if run.best_top1 is not None:
            series.setdefault((run.key.model, run.schedule), []).append((run.global_batch, run.best_top1))
    if not series:
        _note(ax, "no validation accuracy in the runs")
        return
    for (model, schedule), values in sorted(series.items()):
        values.sort()
        ax.plot([b for b, _ in values], [a for _, a in values], "o-", label="%s, %s" % (model, schedule))
    _log2_axis(ax, "global batch")
    ax.set_ylabel("best top-1")
    ax.legend(fontsize="x-small")


def plot_accuracy_vs_epoch(ax, runs: Sequence[Run]) -> None:
    """Fig. 9: top-1 against epoch, one line per run."""
    drawn = False
    for run in runs:
        points = [(e.epoch, e.top1) for e in run.epochs if e.top1 is not None]
        if points:
            label = "%s G=%d %s" % (run.key.label, run.world_size, run.schedule)
            ax.plot([e for e, _ in points], [a for _, a in points], "o-", label=label)
            drawn = True
    if not drawn:
        _note(ax, "no validation accuracy in the runs")
        return
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("top-1")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")


def write_plots(output: Path, results: Sequence[GroupResult]) -> None:
    """Write every file of PLOTS into `output`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for g in results for r in g.runs]
    figures = {name: plt.figure(figsize=(7, 4.5)) for name in PLOTS}
    figures["time_shares.png"].set_size_inches(7, 2.5 + 2.5 * max(1, sum(1 for g in results if any(p.shares for p in g.points))))
    ax_x = figures["throughput.png"].add_subplot()
    ax_e = figures["efficiency.png"].add_subplot()
    if any(g.points for g in results):
        plot_scaling(ax_x, ax_e, results)
    else:
        _note(ax_x, "no epoch records")
        _note(ax_e, "no epoch records")
    plot_shares(figures["time_shares.png"], results)
    plot_accuracy_vs_batch(figures["accuracy_vs_batch.png"].add_subplot(), runs)
    plot_accuracy_vs_epoch(figures["accuracy_vs_epoch.png"].add_subplot(), runs)
    for name, fig in figures.items():
        fig.suptitle(PLOTS[name], fontsize="medium")
        fig.tight_layout()
        atomic_file(output / name, lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None}))
        plt.close(fig)


def markdown_report(results: Sequence[GroupResult], sites: Dict[str, Site], rejected: Sequence[str], notes: Sequence[str]) -> str:
    n_runs = sum(len(g.runs) for g in results)
    parts = [
        "# dlaunch report",
        "%d runs in %d groups; %d files rejected." % (n_runs, len(results), len(rejected)),
        "## Definitions",
        DEFINITIONS.rstrip(),
        "## Scaling",
        markdown_table(SCALING_HEADERS, [(g, scaling_rows(g)) for g in results]),
        "## Runs",
        markdown_table(RUN_HEADERS, [(g, run_rows(g, sites.get(g.key.site))) for g in results]),
        "## Plots",
        "\n\n".join("![%s](%s)" % (title, name) for name, title in PLOTS.items()),
    ]
    if rejected:
        parts += ["## Rejected files", "\n".join("- `%s`" % msg for msg in rejected)]
    if notes:
        parts += ["## Notes", "\n".join("- %s" % note for note in notes)]
    return "\n\n".join(parts) + "\n"


def build_results(runs: Sequence[Run], sites: Dict[str, Site]) -> List[GroupResult]:
    results = []
    for key, group in group_runs(runs).items():
        points = scaling(group)
        results.append(GroupResult(key, group, points, _group_predictions(group, points, sites.get(key.site))))
    return results


def load_sites(names: Sequence[str], override: Optional[str]) -> Tuple[Dict[str, Site], List[str]]:
    """Site profiles by the runs' site names (all `override` when given) and notes on missing ones."""
    if override:
        site = resolve_site(override)  # a bad --site is bad input
        return {name: site for name in names}, []
    sites, notes = {}, []
    for name in names:
        try:
            sites[name] = resolve_site(name)
        except DlaunchError as e:
            notes.append("site %r of the runs: no profile, so no reference verdicts or predictions (%s)" % (name, e))
    return sites, notes


def write_report(output: Path, results: Sequence[GroupResult], sites: Dict[str, Site], rejected: Sequence[str], notes: Sequence[str]) -> None:
    """report.md and the plots into `output` (created), each file written atomically."""
    output.mkdir(parents=True, exist_ok=True)
    write_plots(output, results)
    text = markdown_report(results, sites, rejected, notes)
    write_atomic(output / "report.md", text)


def report_command(
    paths: Annotated[List[Path], typer.Argument(help="Run directories (searched recursively for metrics.jsonl) or metrics files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for report.md and the PNG plots.")] = Path("report"),
    site: Annotated[Optional[str], typer.Option(help="Site profile (name or TOML path) for every run; default: each run's own site.")] = None,
) -> None:
    """Turn run directories into the study's tables, report.md and plots.

    Exit code 0; 1 when some metrics files were rejected (each named on stderr, the rest reported);
    2 on bad input (nothing written).
    """
    loaded = load_runs(str(p) for p in paths)
    console, errors = Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)
    for message in loaded.rejected:
        errors.print("rejected: %s" % message, markup=False, highlight=False)
    if not loaded.runs:
        raise DlaunchError("no valid metrics files in %s" % ", ".join(str(p) for p in paths))
    names = {r.key.site for r in loaded.runs}
    sites, notes = load_sites(sorted(names if site else names - {"-"}), site)  # --site covers site-less runs too
    results = build_results(loaded.runs, sites)
    for g in results:
        console.print(rich_table(g.key.label, SCALING_HEADERS, scaling_rows(g)))
        rows = [row[:-1] for row in run_rows(g, sites.get(g.key.site))]  # metrics file paths: report.md
        console.print(rich_table(g.key.label + ": runs", RUN_HEADERS[:-1], rows))
    for note in notes:
        errors.print("note: %s" % note, markup=False, highlight=False)
    write_report(output, results, sites, loaded.rejected, notes)
    console.print("wrote %s" % (output / "report.md"), markup=False, highlight=False)
    if loaded.rejected:
        raise typer.Exit(1)
