"""The report's figures (matplotlib, Agg), each written only when it has data to draw.

Axes a reviewer accepts: GPU counts (and global batches) on a base-2 log axis with integer ticks at the
powers of two around the data (and at any other count drawn, such as the paper's 12 GPUs); values on
plain-number ticks ("20", "50", "100", never "2.9x10^1") whose lowest and highest tick enclose every
point, error bar and ideal line, so that no point lies below the lowest tick. Ideal lines are dotted,
the model's curve dashed; each framework has its own marker (as the paper's figures tell frameworks
apart); repeats are drawn as their median with the spread as error bars. Text is never read as
mathtext: an experiment called "cost$_$" is drawn as written. Files are written atomically, with a
fixed DPI and without software or date metadata, so the same inputs give the same bytes.
"""

import math
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

from dlaunch.analysis.budget import PARTS
from dlaunch.analysis.published import Comparison
from dlaunch.analysis.scaling import Run, ScalingPoint, Spread, count_name, count_unit
from dlaunch.atomic import atomic_file
from dlaunch.train.framework_table import FRAMEWORKS

if TYPE_CHECKING:
    from dlaunch.reporting.report import GroupResult

DPI = 100
PLOTS = {
    "throughput.png": "Throughput (images/s) against GPUs (dotted: ideal, X_ref G / G_ref)",
    "speedup.png": "Speed-up S_G against GPUs (dotted: ideal, G / G_ref)",
    "efficiency.png": "Parallel efficiency E_G against GPUs (dotted: ideal)",
    "time_shares.png": "Share of time in communication, computation and data loading per GPU count",
    "accuracy_vs_batch.png": "Best validation top-1 against global batch, per LR schedule",
    "accuracy_vs_epoch.png": "Validation top-1 against epoch",
}
# Written beside efficiency.png whenever some run measured energy.
ENERGY_PLOT = "energy_per_image.png"
ENERGY_PLOT_TITLE = "Energy per image (J) against GPUs, per framework and loader"
# Written after the E_G (and energy) plots whenever a group's budget names a cause (metrics version 4 phases).
BUDGET_PLOT = "efficiency_budget.png"
BUDGET_TITLE = "Efficiency budget: the share of the ideal lost (up) or gained (down) per cause, and E_G"
COMPARISON_PLOT = "published_vs_this_run.png"
COMPARISON_TITLE = "Published values (markers) and this run (lines)"
METRIC_LABELS = {
    "images_per_s": "images/s",
    "speedup": "speed-up S_G",
    "efficiency": "E_G",
    "comm_share": "comm share of comm + compute + data",
    "kernel_comm_share": "NCCL share of kernel time",
    "kernel_compute_share": "cuDNN share of kernel time",
    "kernel_io_share": "I/O share of kernel time",
    "throughput_ratio": "images/s ratio",
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")
NICE_MANTISSAS = (1, 2, 5)
T = TypeVar("T")
RESIDUE = 1e-9  # a budget part this small is a rounding residue of 1 - E_G - the others, not drawn
MAX_GROUPS = 10  # groups one figure draws (one colour each); the tables hold every group
MAX_PANELS = 4  # groups drawn as panels of their own (time shares, budget)
LEGEND_INSIDE = 6  # legend entries drawn inside the axes; more go beside them
MARGIN = 1.12  # the room a log axis leaves beyond its outer ticks (a factor)


def marker(framework: str) -> str:
    """The framework's marker: by its place in the framework table (DDP a circle, Horovod a square, DeepSpeed a triangle)."""
    names = list(FRAMEWORKS)
    return MARKERS[names.index(framework) % len(MARKERS)] if framework in names else "."


def plain(value: float) -> str:
    """A tick label without exponent: 1000 -> "1000", 0.25 -> "0.25"."""
    if value >= 1 and float(value).is_integer():
        return "%d" % value
    return ("%.6f" % value).rstrip("0").rstrip(".")


def legend_label(text: str) -> str:
    """`text` as a legend entry: matplotlib hides labels that start with "_"."""
    return " " + text if text.startswith("_") else text


def enclosing(candidates: Iterable[float], low: float, high: float) -> List[float]:
    """The candidates from the largest at or below `low` to the smallest at or above `high`."""
    ordered = sorted(candidates)
    bottom = max(v for v in ordered if v <= low * (1 + 1e-9))
    top = min(v for v in ordered if v >= high * (1 - 1e-9))
    return [v for v in ordered if bottom <= v <= top]


def log2_ticks(low: float, high: float) -> List[float]:
    """Powers of two enclosing [low, high] (low > 0), at least two."""
    first, last = math.floor(math.log2(low)), math.ceil(math.log2(high))
    return enclosing([2.0**k for k in range(first, max(last, first + 1) + 1)], low, max(high, 2.0 ** (first + 1)))


def log10_ticks(low: float, high: float) -> List[float]:
    """1-2-5 ticks (1, 2, 5, 10, 20, ...) enclosing [low, high] (low > 0)."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    return enclosing([m * 10.0**k for k in range(first, last + 1) for m in NICE_MANTISSAS], low, high)


def linear_ticks(high: float, low: float = 0.0) -> List[float]:
    """Evenly spaced plain ticks from `low` (at most 0; 0 is a tick) or just below it to at least `high`."""
    from matplotlib.ticker import MaxNLocator

    high = high or 1.0
    ticks = [float(t) for t in MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)]
    slack = 1e-9 * (high - low)
    bottom = max(t for t in ticks if t <= low + slack)
    return [t for t in ticks if t >= bottom]


def set_ticks(axis, ticks: Sequence[float], log: bool) -> None:
    """Exactly `ticks`, labelled as plain numbers, the limits just outside the outer ones."""
    from matplotlib.ticker import NullLocator

    axis.set_ticks(list(ticks), [plain(t) for t in ticks])
    axis.set_minor_locator(NullLocator())
    setter = axis.axes.set_xlim if axis is axis.axes.xaxis else axis.axes.set_ylim
    if log:
        setter(ticks[0] / MARGIN, ticks[-1] * MARGIN)
    else:
        pad = 0.03 * (ticks[-1] - ticks[0])
        setter(ticks[0] - pad, ticks[-1] + pad)


def count_axis(ax, counts: Iterable[int], label: str) -> None:
    """A base-2 log x axis of GPU counts (or batches): ticks at the powers of two around them and at every count."""
    drawn = sorted(set(counts))
    ax.set_xscale("log", base=2)
    set_ticks(ax.xaxis, sorted(set(log2_ticks(drawn[0], drawn[-1])) | set(float(c) for c in drawn)), log=True)
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)


def value_axis(ax, values: Iterable[float], label: str, scale: str = "linear") -> None:
    """The y axis of `values` (every point, bar end and line drawn): `linear` from 0 (or the lowest negative value),
    `log10` on 1-2-5 ticks, `log2` on powers of two."""
    drawn = [v for v in values if v is not None and math.isfinite(v)]
    if scale == "linear":
        set_ticks(ax.yaxis, linear_ticks(max(drawn, default=1.0), min([0.0, *drawn])), log=False)
    else:
        positive = [v for v in drawn if v > 0] or [1.0]
        ax.set_yscale("log", base=2 if scale == "log2" else 10)
        ticks = (log2_ticks if scale == "log2" else log10_ticks)(min(positive), max(positive))
        set_ticks(ax.yaxis, ticks, log=True)
    ax.set_ylabel(label)


def error_bars(ax, gpus: Sequence[int], spreads: Sequence[Spread], color: str, label: str, shape: str) -> List[float]:
    """Medians joined by a line, each with its spread as an error bar (none for a single run); the values drawn."""
    err = [[s.median - s.low for s in spreads], [s.high - s.median for s in spreads]]
    ax.errorbar(
        gpus,
        [s.median for s in spreads],
        yerr=err,
        fmt="-",
        marker=shape,
        color=color,
        capsize=3,
        label=legend_label(label),
    )
    return [v for s in spreads for v in (s.low, s.median, s.high)]


def spread_label(points: Sequence[ScalingPoint]) -> str:
    kinds = sorted({p.throughput.kind for p in points if p.runs > 1})
    return " (median, bars: %s)" % " or ".join(kinds) if kinds else ""


def groups_drawn(
    results: Sequence["GroupResult"], has: Callable[["GroupResult"], bool], limit: int = MAX_GROUPS
) -> List["GroupResult"]:
    """The groups a figure draws: the first `limit` of those that `has` data for it."""
    return [g for g in results if has(g)][:limit]


def left_out(results: Sequence["GroupResult"]) -> Optional[str]:
    """What the figures leave out of a report with many groups (None: nothing)."""
    scaled = sum(1 for g in results if g.points)
    panels = max(sum(1 for g in results if any(p.shares for p in g.points)), sum(1 for g in results if g.explained))
    lines = len(_epoch_accuracies([r for g in results for r in g.runs]))
    if scaled <= MAX_GROUPS and panels <= MAX_PANELS and lines <= MAX_GROUPS:
        return None
    return (
        "The figures draw the first %d of the %d groups with data (the time shares and the budget the first %d, "
        "top-1 against epoch the first %d of %d lines); the tables above hold every group."
        % (MAX_GROUPS, scaled, MAX_PANELS, MAX_GROUPS, lines)
    )


def legend(ax, beside: bool = False) -> None:
    """Inside the axes while a few entries fit there, else (or when `beside`) beside them on the right."""
    if not beside and len(ax.get_legend_handles_labels()[1]) <= LEGEND_INSIDE:
        ax.legend(fontsize="x-small")
    else:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)


def plot_scaling(ax_x, ax_s, ax_e, results: Sequence["GroupResult"]) -> None:
    """Fig. 3 (throughput), the speed-up S_G and Fig. 4-7 (E_G): medians with error bars over repeats, the
    ideal lines dotted, the model's dashed where there is one; `ax_s` and `ax_e` None: not drawn (`scaled`)."""
    shown: Dict[object, List[float]] = {ax_x: [], ax_s: [], ax_e: [1.0]}
    counts: List[int] = []
    ideal_labelled = set()
    for i, g in enumerate(groups_drawn(results, lambda g: bool(g.points))):
        color, shape = "C%d" % i, marker(g.key.framework)
        gpus = [p.gpus for p in g.points]
        counts += gpus
        label = g.key.label + spread_label(g.points)
        shown[ax_x] += error_bars(ax_x, gpus, [p.throughput for p in g.points], color, label, shape)
        if ax_s is not None:
            shown[ax_s] += error_bars(ax_s, gpus, [p.speedups for p in g.points], color, label, shape)
            shown[ax_e] += error_bars(ax_e, gpus, [p.efficiencies for p in g.points], color, label, shape)
        ideal = [n / gpus[0] for n in gpus]
        x_ref = g.points[0].images_per_s
        for ax, values in ((ax_x, [x_ref * s for s in ideal]), (ax_s, ideal)):
            if ax is not None:
                ax.plot(gpus, values, ":", color=color, label=None if ax in ideal_labelled else "ideal (dotted)")
                ideal_labelled.add(ax)
                shown[ax] += values
        if g.predictions:
            pred = [g.predictions[n] for n in gpus]
            for ax, values in ((ax_x, [p.images_per_s for p in pred]), (ax_e, [p.efficiency for p in pred])):
                if ax is not None:
                    ax.plot(gpus, values, "--", color=color, label=legend_label(g.key.label + " (model, dashed)"))
                    shown[ax] += values
    if ax_e is not None:
        ax_e.axhline(1.0, color="black", linestyle=":", label="ideal (dotted)")
    for ax, label, scale in ((ax_x, "images/s", "log10"), (ax_s, "S_G", "log2"), (ax_e, "E_G", "linear")):
        if ax is None:
            continue
        value_axis(ax, shown[ax], label, scale)
        count_axis(ax, counts, count_unit(r for g in results for r in g.runs))
        legend(ax)


def plot_energy_per_image(ax, results: Sequence["GroupResult"]) -> None:
    """J/img against GPUs, one line per group (the points of runs that measured energy)."""
    values: List[float] = []
    counts: List[int] = []
    for i, g in enumerate(groups_drawn(results, lambda g: any(p.energy is not None for p in g.points))):
        points = [p for p in g.points if p.energy is not None]
        counts += [p.gpus for p in points]
        values += error_bars(
            ax,
            [p.gpus for p in points],
            [p.energy for p in points],
            "C%d" % i,  # type: ignore[misc]
            g.key.label + spread_label(points),
            marker(g.key.framework),
        )
    value_axis(ax, values, "J per image")
    count_axis(ax, counts, count_unit(r for g in results for r in g.runs))
    legend(ax)


def plot_shares(fig, results: Sequence["GroupResult"]) -> None:
    """Table 2 as stacked bars: one panel per group with profile records."""
    with_shares = groups_drawn(results, lambda g: any(p.shares for p in g.points), MAX_PANELS)
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
        value_axis(ax, [100.0], "% of step")
        legend(ax, beside=True)
    axes[-1].set_xlabel(count_unit(r for g in with_shares for r in g.runs))


def plot_budget(fig, results: Sequence["GroupResult"]) -> None:
    """One panel per group whose budget names a cause: per GPU count the shares of the ideal lost stacked upwards from
    0 and those gained (a part faster than at G_ref, negative in the budget) apart, stacked downwards; a cause has one
    colour either way and a legend entry only where it is drawn; the measured E_G is written above each GPU count
    (lost - gained = 1 - E_G)."""
    explained = groups_drawn(results, lambda g: g.explained, MAX_PANELS)
    axes = fig.subplots(len(explained), 1, squeeze=False)[:, 0]
    for ax, g in zip(axes, explained):
        labels = [str(row.gpus) for row in g.budget]
        up, down = [0.0] * len(labels), [0.0] * len(labels)
        for part in PARTS.values():  # colours and legend from the budget's table of parts
            values = [row.lost[part.name] or 0.0 for row in g.budget]  # not recorded: inside `other`
            values = [0.0 if abs(v) < RESIDUE else v for v in values]
            if not any(values):
                continue
            lost, gained = [max(v, 0.0) for v in values], [min(v, 0.0) for v in values]
            ax.bar(labels, lost, bottom=up, color=part.colour, label=part.name)
            ax.bar(labels, gained, bottom=down, color=part.colour)
            up = [u + v for u, v in zip(up, lost)]
            down = [d + v for d, v in zip(down, gained)]
        ax.axhline(0.0, color="black", linewidth=0.8)
        for x, row, top in zip(labels, g.budget, up):
            ax.annotate(
                "E_G %.3f" % row.measured_e_g,
                (x, top),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize="small",
            )
        value_axis(ax, [max(up) * 1.15, *down], "share of the ideal:\nlost (up), gained (down)")
        ax.set_title(g.key.label, fontsize="small")
        ax.set_xlabel(count_unit(g.runs))
        handles, names = ax.get_legend_handles_labels()
        if names:  # the order of the stack, its top first
            ax.legend(handles[::-1], names[::-1], fontsize="x-small", loc="upper left", bbox_to_anchor=(1.02, 1.0))


def _accuracy_series(runs: Sequence[Run]) -> Dict[Tuple[str, str], List[Tuple[int, float]]]:
    series: Dict[Tuple[str, str], List[Tuple[int, float]]] = {}
    for run in runs:
        if run.best_top1 is not None:
            series.setdefault((run.key.model, run.schedule), []).append((run.global_batch, run.best_top1))
    return series


def plot_accuracy_vs_batch(ax, runs: Sequence[Run]) -> None:
    """Fig. 8b: best top-1 against global batch, one series per model and LR schedule."""
    shown: List[float] = []
    batches: List[int] = []
    for (model, schedule), values in sorted(_accuracy_series(runs).items()):
        values.sort()
        ax.plot([b for b, _ in values], [a for _, a in values], "o-", label=legend_label("%s, %s" % (model, schedule)))
        batches += [b for b, _ in values]
        shown += [a for _, a in values]
    count_axis(ax, batches, "global batch")
    value_axis(ax, shown, "best top-1")
    legend(ax)


def _epoch_accuracies(runs: Sequence[Run]) -> Dict[Tuple[str, str, int, str], List[Tuple[int, float]]]:
    """(group label, framework, GPUs, schedule) -> (epoch, median top-1 of its runs) for the runs that validated."""
    found: Dict[Tuple[str, str, int, str], Dict[int, List[float]]] = {}
    for run in runs:
        for e in run.epochs:
            if e.top1 is not None:
                key = (run.key.label, run.key.framework, run.world_size, run.schedule)
                found.setdefault(key, {}).setdefault(e.epoch, []).append(e.top1)
    return {
        key: [(epoch, median(values)) for epoch, values in sorted(epochs.items())]
        for key, epochs in sorted(found.items())
    }


def plot_accuracy_vs_epoch(ax, runs: Sequence[Run]) -> None:
    """Fig. 9: top-1 against epoch, one line per group, GPU count and schedule (the median of its runs; the first MAX_GROUPS)."""
    shown: List[float] = []
    for (label, framework, gpus, schedule), points in list(_epoch_accuracies(runs).items())[:MAX_GROUPS]:
        ax.plot(
            [e for e, _ in points],
            [a for _, a in points],
            "-",
            marker=marker(framework),
            label=legend_label("%s G=%d %s" % (label, gpus, schedule)),
        )
        shown += [a for _, a in points]
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    value_axis(ax, shown, "top-1 (median of the runs)")
    ax.grid(True, alpha=0.3)
    legend(ax)


def scaled(results: Sequence["GroupResult"]) -> bool:
    """Whether some group has points at two GPU counts or more: a speed-up or E_G to draw."""
    return any(len(g.points) >= 2 for g in results)


def plot_titles(results: Sequence["GroupResult"]) -> Dict[str, str]:
    """The figures of this report that have data (file name -> title), in report order: a figure with
    nothing to draw is neither written nor embedded (S_G and E_G only where some group has two GPU counts: one
    count has only the reference's 1)."""
    runs = [r for g in results for r in g.runs]
    has = {
        "throughput.png": any(g.points for g in results),
        "speedup.png": scaled(results),
        "efficiency.png": scaled(results),
        "time_shares.png": any(p.shares for g in results for p in g.points),
        "accuracy_vs_batch.png": bool(_accuracy_series(runs)),
        "accuracy_vs_epoch.png": bool(_epoch_accuracies(runs)),
    }
    titles = {}
    unit = count_unit(runs)
    for name, title in PLOTS.items():
        if has[name]:
            titles[name] = title.replace("GPU count", count_name(unit)).replace("GPUs", unit)
        if name == "efficiency.png" and any(p.joules_per_image is not None for g in results for p in g.points):
            titles[ENERGY_PLOT] = ENERGY_PLOT_TITLE
        if name == "efficiency.png" and any(g.explained for g in results):
            titles[BUDGET_PLOT] = BUDGET_TITLE
    return titles


def save(output: Path, name: str, fig, title: str) -> None:
    """`fig` as `output`/`name`, titled, written atomically without metadata that changes between runs."""
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    atomic_file(output / name, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None}))


def drawing(draw: Callable[..., T]) -> Callable[..., T]:
    """`draw` run with matplotlib's Agg backend and mathtext off (names with `$` are drawn as written)."""

    def run(*args, **kwargs):
        import matplotlib

        matplotlib.use("Agg")
        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    run.__doc__ = draw.__doc__
    return run


@drawing
def write_plots(output: Path, results: Sequence["GroupResult"]) -> Dict[str, str]:
    """Write every figure of `plot_titles` into `output` and return them; a figure of the report's that has
    no data now is removed (a stale one from an earlier report of that folder would look like this report's)."""
    import matplotlib.pyplot as plt

    titles = plot_titles(results)
    runs = [r for g in results for r in g.runs]
    panels = {
        "time_shares.png": len(groups_drawn(results, lambda g: any(p.shares for p in g.points), MAX_PANELS)),
        BUDGET_PLOT: len(groups_drawn(results, lambda g: g.explained, MAX_PANELS)),
    }
    figures = {name: plt.figure(figsize=(7, 2.5 + 2.5 * panels[name] if name in panels else 4.5)) for name in titles}
    if "throughput.png" in figures:
        plot_scaling(
            *(
                figures[n].add_subplot() if n in figures else None
                for n in ("throughput.png", "speedup.png", "efficiency.png")
            ),
            results,
        )
    if "time_shares.png" in figures:
        plot_shares(figures["time_shares.png"], results)
    if "accuracy_vs_batch.png" in figures:
        plot_accuracy_vs_batch(figures["accuracy_vs_batch.png"].add_subplot(), runs)
    if "accuracy_vs_epoch.png" in figures:
        plot_accuracy_vs_epoch(figures["accuracy_vs_epoch.png"].add_subplot(), runs)
    if ENERGY_PLOT in figures:
        plot_energy_per_image(figures[ENERGY_PLOT].add_subplot(), results)
    if BUDGET_PLOT in figures:
        plot_budget(figures[BUDGET_PLOT], results)
    for name, fig in figures.items():
        save(output, name, fig, titles[name])
        plt.close(fig)
    for name in (*PLOTS, ENERGY_PLOT, BUDGET_PLOT):
        if name not in titles and (output / name).is_file() and not (output / name).is_symlink():
            (output / name).unlink()
    return titles


def plot_comparisons(fig, comparisons: Sequence[Comparison]) -> None:
    """One panel per comparison: published values as markers, this run's medians as lines with their spread as bars."""
    axes = fig.subplots(len(comparisons), 1, squeeze=False)[:, 0]
    for ax, c in zip(axes, comparisons):
        shown: List[float] = []
        if c.published:
            ax.plot(
                [g for g, _ in c.published],
                [v for _, v in c.published],
                "s",
                color="black",
                markersize=7,
                linestyle="none",
                label=legend_label("published (%s)" % c.source),
            )
            shown += [v for _, v in c.published]
        for i, (label, points) in enumerate(sorted(c.measured.items())):
            kinds = " or ".join(sorted({s.kind for _, s in points}))
            shown += error_bars(
                ax,
                [g for g, _ in points],
                [s for _, s in points],
                "C%d" % (i % 10),
                "this run: %s (median, bars: %s)" % (label, kinds),
                "o",
            )
        if not c.measured:
            ax.text(0.5, 0.5, "no run of this study matches", ha="center", va="center", transform=ax.transAxes)
        count_axis(ax, [g for g, _ in c.published] + [g for points in c.measured.values() for g, _ in points], "GPUs")
        value_axis(ax, shown, METRIC_LABELS[c.metric], "log10" if c.metric == "images_per_s" else "linear")
        ax.set_title(c.label, fontsize="small")
        legend(ax)


@drawing
def write_comparison_plot(output: Path, comparisons: Sequence[Comparison]) -> None:
    """COMPARISON_PLOT into `output` (the caller writes it only when there are comparisons)."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7, 1.5 + 3.5 * len(comparisons)))
    plot_comparisons(fig, comparisons)
    save(output, COMPARISON_PLOT, fig, COMPARISON_TITLE)
    plt.close(fig)
