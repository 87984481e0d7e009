"""`dlaunch report`: run directories -> rich tables, report.md and PNG plots (deterministic).

The same inputs give byte-identical outputs: rows are sorted, the report carries no time stamps
but the data's, plots are written with a fixed DPI and without PNG software/date metadata.
"""
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Sequence, Tuple

import typer
from rich.console import Console

from dlaunch.analysis.scaling import (Comparison, GroupKey, Run, ScalingPoint, Spread, group_runs, load_runs, reference_for,
                               rich_table, scaling, verdict)
from dlaunch.analysis.convergence import RCP_SOURCE, RCPVerdict, rcp_verdicts
from dlaunch.atomic import atomic_file, write_atomic
from dlaunch.boundary import escape, output_folder
from dlaunch.errors import DlaunchError
from dlaunch.analysis.perfmodel import MODEL_PARAMS_M, Prediction, Workload, gradient_bytes, interconnect_of_site, predict
from dlaunch.jobs.sites import Site, resolve_site
from dlaunch.runs.network import network_problems
from dlaunch.tables import markdown

DPI = 100
PLOTS = {
    "throughput.png": "Throughput (images/s) against GPUs, per framework and loader",
    "speedup.png": "Speed-up S_G against GPUs (dotted: ideal, G / G_ref)",
    "efficiency.png": "Parallel efficiency E_G against GPUs (dotted: ideal)",
    "time_shares.png": "Share of time in communication, computation and data loading per GPU count",
    "accuracy_vs_batch.png": "Best validation top-1 against global batch, per LR schedule",
    "accuracy_vs_epoch.png": "Validation top-1 against epoch",
}
# Written beside efficiency.png whenever some run measured energy.
ENERGY_PLOT = "energy_per_image.png"
ENERGY_PLOT_TITLE = "Energy per image (J) against GPUs, per framework and loader"
KERNEL_HEADERS = ("GPUs", "comm %", "compute %", "I/O %", "other %")
DEFINITIONS = """\
- Throughput X: mean of the epochs' images/s (whole job), leaving out the first epoch when a run
  has two or more (warm-up).
- Repeats (several runs at one GPU count): images/s, S_G, E_G and J/img are the median over the
  runs; `spread` says what the ranges are: `min-max` (fewer than 6 runs), or `95% CI`, the
  distribution-free 95% confidence interval of the median (order statistics) from 6 runs on; a
  single run has none (`-`). Plots draw the median with the range as error bars. Time shares are
  the runs' mean.
- Groups: experiment, site, model, framework, loader and batch per GPU (`bN`); different batch
  sizes per GPU are separate curves.
- Reference G_ref: the smallest GPU count of a group. Speed-up S_G = X_G / X_ref; parallel
  efficiency E_G = S_G / (G / G_ref), which equals (T_ref / T_G) / (G / G_ref) for a fixed amount
  of work.
- Time shares: comm, compute and data time per step from the trainer's `profile` record
  (`--profile-steps`, wall-clock timers on un-overlapped steps), each divided by their sum.
- Kernel shares (Table 2 of Aach et al. 2023 measures these, with NSys): CUDA kernel time of all
  ranks in NCCL (comm), cuDNN/cuBLAS (compute) and I/O kernels (host-to-device copies, DALI,
  nvJPEG), each over all kernel time, from the `kernel_profile` record (`--kernel-profile-steps`);
  `other` is the rest. A separate measure from the time shares.
- Reference verdict (per run): PASS when X is at least (1 - tolerance) x the site's reference
  images/s for the model, GPU count and precision (`--amp`), else REGRESSION, with X's
  deviation from the reference in percent; `no reference` where the site's profile has none for
  them (listed under Notes), `no profile` where the run's site has no profile here.
- Predicted E_G: the performance model (`dlaunch predict`: NCCL ring/tree per bucket, nominal
  `[network]`, no jitter), fed with the group's reference
  run's profile and the site's `[network]` section.
- Energy (shown when some run measured it): per run the trainer's counters summed over all ranks;
  what they count is in brackets (`node`: whole-node counters, else `gpu`, `cpu`, `dram` as far as
  measured). J/img: the energy of the epochs that give X divided by the images trained in them
  (validation included); kJ/epoch: their mean; energy kJ: the whole run.
- Time and energy to accuracy: the run's time and energy at the first validation that reached
  `--target-accuracy` (energy-to-accuracy as defined by Zeus); epochs to target: the epochs trained
  by then. TTA S_G = T_ref / T_G of the median times to target, against the smallest GPU count whose
  runs reached it: the speed-up in time to accuracy, which falls behind S_G when a larger global
  batch needs more epochs.
- Convergence against MLPerf's Reference Convergence Points (ResNet-50 on ImageNet only): per global
  batch the epochs to 75.9% top-1, against the RCP's epochs for that batch (interpolated between
  RCPs as MLPerf's RCP checker does); PASS when no faster than MLPerf accepts, with the ratio to the
  RCP mean (above 1: slower convergence than MLPerf's reference runs). Source and method:
  dlaunch/analysis/convergence.py.
- History (shown when the results database has 3 or more earlier runs of a run's site, model, GPU
  count, precision, framework, loader and batch per GPU): X against the median of the last 10 of
  them; REGRESSION when slower by more than the site's reference tolerance (5% without one).
- Diverged runs (the loss stayed NaN/inf, end status `diverged`) are listed apart and enter no
  table or plot above it.
- Network: a run whose collective libraries recorded another transport, net plugin, provider or
  interface than its site's `[network]` expects (metrics `network`; `dlaunch status` flags it too)
  did not measure the fabric's throughput: such runs are listed apart and enter no table or plot
  above it, unless the report was made with `--include-network-mismatches`.
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


SCALING_HEADERS = ["GPUs", "nodes", "runs", "spread", "images/s", "images/s range", "S_G", "E_G", "E_G range", "pred. E_G",
                   "comm %", "compute %", "data %"]
RUN_HEADERS = ["run", "GPUs", "global batch", "schedule", "status", "images/s", "best top-1", "reference", "metrics file"]
ENERGY_SCALING_HEADERS = ["J/img", "J/img range"]
ACCURACY_SCALING_HEADERS = ["epochs to target", "time to target s", "TTA S_G"]
ACCURACY_RUN_HEADERS = ["epochs to target", "time to acc. s"]
ENERGY_RUN_HEADERS = ["J/img", "kJ/epoch", "energy kJ"]
ENERGY_ACCURACY_RUN_HEADERS = ["energy to acc. kJ"]
DIVERGED_HEADERS = ["run", "GPUs", "epochs", "reason", "metrics file"]
OFF_NETWORK_HEADERS = ["run", "GPUs", "network", "metrics file"]


@dataclass(frozen=True)
class Columns:
    """The optional columns: energy when some run measured it, time (and energy) to accuracy when
    some run had a --target-accuracy."""

    energy: bool
    accuracy: bool
    history: bool = False  # some run has a history verdict

    @classmethod
    def of(cls, runs: Sequence[Run], history: bool = False) -> "Columns":
        return cls(energy=any(r.joules_per_image is not None or r.energy_j is not None for r in runs),
                   accuracy=any(r.time_to_accuracy_s is not None for r in runs), history=history)

    def scaling_headers(self) -> List[str]:
        return (SCALING_HEADERS + (ACCURACY_SCALING_HEADERS if self.accuracy else [])
                + (ENERGY_SCALING_HEADERS if self.energy else []))

    def run_headers(self) -> List[str]:
        extra = (ACCURACY_RUN_HEADERS if self.accuracy else []) + (ENERGY_RUN_HEADERS if self.energy else [])
        extra += ENERGY_ACCURACY_RUN_HEADERS if self.energy and self.accuracy else []
        extra += ["history"] if self.history else []
        return RUN_HEADERS[:-1] + extra + RUN_HEADERS[-1:]


def _kilo(value: Optional[float]) -> str:
    return _number(None if value is None else value / 1000, "%.2f")


def _range(spread: Optional[Spread], fmt: str) -> str:
    """`low-high` of repeated runs; '-' for one run (no spread)."""
    if spread is None or spread.n < 2:
        return "-"
    return "%s-%s" % (fmt % spread.low, fmt % spread.high)


def scaling_rows(g: GroupResult, columns: Columns) -> List[List[str]]:
    rows = []
    reached = [p for p in g.points if p.time_to_target is not None]
    t_ref = reached[0].time_to_target.median if reached else None  # type: ignore[union-attr]
    for pt in g.points:
        pred = g.predictions.get(pt.gpus)
        s = pt.shares
        row = [
            str(pt.gpus), str(pt.nodes), str(pt.runs), pt.throughput.kind if pt.runs > 1 else "-",
            "%.1f" % pt.images_per_s, _range(pt.throughput, "%.1f"), "%.2f" % pt.speedup, "%.3f" % pt.efficiency,
            _range(pt.efficiencies, "%.3f"), _number(pred.efficiency if pred else None, "%.3f"),
            _percent(s.comm if s else None), _percent(s.compute if s else None), _percent(s.data if s else None),
        ]
        if columns.accuracy:
            tta = pt.time_to_target
            row += [_number(pt.epochs_to_target.median if pt.epochs_to_target else None, "%g"),
                    _number(tta.median if tta else None), _number(t_ref / tta.median if tta and t_ref else None, "%.2f")]
        if columns.energy:
            row += [_number(pt.joules_per_image, "%.3g"), _range(pt.energy, "%.3g")]
        rows.append(row)
    return rows


def verdict_cell(run: Run, site: Optional[Site]) -> str:
    """PASS or REGRESSION and the deviation; else why there is no verdict."""
    if run.throughput is None:
        return "-"
    if site is None:
        return "no profile"
    v = verdict(run, site.reference)
    if v is None:
        return "no reference"
    return "%s %+.1f%%" % ("PASS" if v.passed else "REGRESSION", 100 * v.deviation)


def missing_references(results: Sequence[GroupResult], sites: Dict[str, Site]) -> List[str]:
    """One note per site, model, GPU count and precision whose runs have no reference to be judged by."""
    missing: Dict[Tuple[str, str, int, str], int] = {}
    for g in results:
        site = sites.get(g.key.site)
        for run in g.runs:
            if site is not None and run.throughput is not None and reference_for(run, site.reference) is None:
                key = (site.name, run.key.model, run.world_size, run.amp)
                missing[key] = missing.get(key, 0) + 1
    return ["site %s has no [[reference]] for %s on %d GPUs%s: no verdict for %d run(s)"
            % (name, model, gpus, "" if amp == "none" else " with --amp %s" % amp, n)
            for (name, model, gpus, amp), n in sorted(missing.items())]


def run_rows(g: GroupResult, site: Optional[Site], columns: Columns, history: Optional[Dict[str, str]] = None) -> List[List[str]]:
    """`history`: metrics file -> history verdict (dlaunch/results/compare.py)."""
    rows = []
    for run in g.runs:
        check = verdict_cell(run, site)
        row = [Path(run.path).parent.name, str(run.world_size), str(run.global_batch), run.schedule, run.status,
               _number(run.throughput), _number(run.best_top1, "%.4f"), check]
        if columns.accuracy:
            row += [_number(run.epochs_to_target, "%d"), _number(run.time_to_accuracy_s)]
        if columns.energy:
            total = _kilo(run.energy_j)
            row += [_number(run.joules_per_image, "%.3g"), _kilo(run.energy_per_epoch),
                    total if run.energy_domains is None else "%s (%s)" % (total, run.energy_domains)]
            if columns.accuracy:
                row.append(_kilo(run.energy_to_accuracy_j))
        if columns.history:
            row.append((history or {}).get(run.path) or "-")
        rows.append(row + [run.path])
    return rows


def diverged_rows(runs: Sequence[Run]) -> List[List[str]]:
    return [[Path(r.path).parent.name, str(r.world_size), str(len(r.epochs)), r.reason or "-", r.path] for r in runs]


def off_network(runs: Sequence[Run], sites: Dict[str, Site]) -> Dict[str, List[str]]:
    """Metrics file -> how the run is off its site's `[network]`, for the runs that are."""
    found = {}
    for run in runs:
        site = sites.get(run.key.site)
        problems = network_problems(run.network, site.network if site else None)
        if problems:
            found[run.path] = problems
    return found


def off_network_rows(runs: Sequence[Run], problems: Dict[str, List[str]]) -> List[List[str]]:
    return [[Path(r.path).parent.name, str(r.world_size), "; ".join(problems[r.path]), r.path] for r in runs]


def off_network_note(runs: Sequence[Run], included: bool) -> str:
    """What the report did with the runs that are off their network."""
    if included:
        return ("%d run(s) off their site's [network] are kept in the tables and plots (--include-network-mismatches): "
                "their throughput is not the fabric's" % len(runs))
    return ("%d run(s) off their site's [network] are left out of the tables and plots "
            "(--include-network-mismatches keeps them)" % len(runs))


def markdown_table(headers: Sequence[str], groups: Sequence[Tuple[str, List[List[str]]]]) -> str:
    """One table, the group label as first column."""
    return markdown(["group", *headers], [[label, *row] for label, group_rows in groups for row in group_rows])


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _log2_axis(ax, label: str) -> None:
    """A base-2 log x axis with plain numbers (4, 8, 16, ...)."""
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel(label)
    ax.grid(True, which="both", alpha=0.3)


def _error_bars(ax, gpus: Sequence[int], spreads: Sequence[Spread], color: str, label: str) -> None:
    """Medians joined by a line, each with its spread as an error bar (none for a single run)."""
    err = [[s.median - s.low for s in spreads], [s.high - s.median for s in spreads]]
    ax.errorbar(gpus, [s.median for s in spreads], yerr=err, fmt="o-", color=color, capsize=3, label=label)


def _spread_label(points: Sequence[ScalingPoint]) -> str:
    kinds = sorted({p.throughput.kind for p in points if p.runs > 1})
    return " (median, bars: %s)" % " or ".join(kinds) if kinds else ""


def plot_scaling(ax_x, ax_s, ax_e, results: Sequence[GroupResult]) -> None:
    """Fig. 3 (throughput), the speed-up S_G and Fig. 4-7 (E_G), medians with error bars over
    repeats, with dashed predictions where available."""
    from matplotlib.ticker import ScalarFormatter

    for i, g in enumerate(r for r in results if r.points):
        color = "C%d" % (i % 10)
        gpus = [p.gpus for p in g.points]
        label = g.key.label + _spread_label(g.points)
        _error_bars(ax_x, gpus, [p.throughput for p in g.points], color, label)
        _error_bars(ax_s, gpus, [p.speedups for p in g.points], color, label)
        ax_s.plot(gpus, [n / gpus[0] for n in gpus], ":", color=color, label=None if i else "ideal (dotted)")
        _error_bars(ax_e, gpus, [p.efficiencies for p in g.points], color, label)
        if g.predictions:
            pred = [g.predictions[n] for n in gpus]
            ax_x.plot(gpus, [p.images_per_s for p in pred], "--", color=color, label=g.key.label + " (model)")
            ax_e.plot(gpus, [p.efficiency for p in pred], "--", color=color, label=g.key.label + " (model)")
    ax_e.axhline(1.0, color="black", linestyle=":", label="ideal")
    ax_x.set_yscale("log")
    ax_x.set_ylabel("images/s")
    ax_s.set_yscale("log", base=2)
    ax_s.yaxis.set_major_formatter(ScalarFormatter())
    ax_s.set_ylabel("S_G")
    ax_e.set_ylabel("E_G")
    ax_e.set_ylim(bottom=0)
    for ax in (ax_x, ax_s, ax_e):
        _log2_axis(ax, "GPUs")
        ax.legend(fontsize="x-small")


def plot_energy_per_image(ax, results: Sequence[GroupResult]) -> None:
    """J/img against GPUs, one line per group (the points of runs that measured energy)."""
    for i, g in enumerate(r for r in results if r.points):
        points = [p for p in g.points if p.energy is not None]
        if points:
            _error_bars(ax, [p.gpus for p in points], [p.energy for p in points], "C%d" % (i % 10),  # type: ignore[misc]
                        g.key.label + _spread_label(points))
    _log2_axis(ax, "GPUs")
    ax.set_ylabel("J per image")
    ax.set_ylim(bottom=0)
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


def plot_titles(results: Sequence[GroupResult]) -> Dict[str, str]:
    """The plots of this report: PLOTS, and the energy plot beside E_G when some point has J/img."""
    titles = {}
    for name, title in PLOTS.items():
        titles[name] = title
        if name == "efficiency.png" and any(p.joules_per_image is not None for g in results for p in g.points):
            titles[ENERGY_PLOT] = ENERGY_PLOT_TITLE
    return titles


def write_plots(output: Path, results: Sequence[GroupResult]) -> None:
    """Write every plot of `plot_titles` into `output`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for g in results for r in g.runs]
    titles = plot_titles(results)
    figures = {name: plt.figure(figsize=(7, 4.5)) for name in titles}
    figures["time_shares.png"].set_size_inches(7, 2.5 + 2.5 * max(1, sum(1 for g in results if any(p.shares for p in g.points))))
    axes = [figures[name].add_subplot() for name in ("throughput.png", "speedup.png", "efficiency.png")]
    if any(g.points for g in results):
        plot_scaling(*axes, results)
    else:
        for ax in axes:
            _note(ax, "no epoch records")
    plot_shares(figures["time_shares.png"], results)
    plot_accuracy_vs_batch(figures["accuracy_vs_batch.png"].add_subplot(), runs)
    plot_accuracy_vs_epoch(figures["accuracy_vs_epoch.png"].add_subplot(), runs)
    if ENERGY_PLOT in figures:
        plot_energy_per_image(figures[ENERGY_PLOT].add_subplot(), results)
    for name, fig in figures.items():
        fig.suptitle(titles[name], fontsize="medium")
        fig.tight_layout()
        atomic_file(output / name, lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None}))
        plt.close(fig)


RCP_HEADERS = ["global batch", "runs", "reached 75.9%", "epochs to 75.9%", "RCP mean", "min epochs", "RCP", "verdict"]


def rcp_rows(verdicts: Sequence[RCPVerdict]) -> List[List[str]]:
    return [[str(v.global_batch), str(v.runs), str(v.reached), _number(v.epochs, "%.2f"),
             _number(v.rcp.mean if v.rcp else None, "%.2f"), _number(v.rcp.min_epochs if v.rcp else None, "%.2f"),
             v.rcp.name if v.rcp else "-", v.verdict] for v in verdicts]


def markdown_report(results: Sequence[GroupResult], sites: Dict[str, Site], rejected: Sequence[str],
                    notes: Sequence[str], diverged: Sequence[Run] = (), history: Optional[Dict[str, str]] = None,
                    rcp: Sequence[RCPVerdict] = (), off: Sequence[Run] = (),
                    problems: Optional[Dict[str, List[str]]] = None, off_included: bool = False) -> str:
    """`history`: metrics file -> history verdict; `rcp`: the convergence verdicts per global batch; `off`: the
    runs off their network (`problems`: metrics file -> how), left out of the tables unless `off_included`."""
    n_runs = sum(len(g.runs) for g in results)
    columns = Columns.of([r for g in results for r in g.runs], history=bool(history))
    parts = [
        "# dlaunch report",
        "%d runs in %d groups; %d diverged runs apart; %d files rejected." % (n_runs, len(results), len(diverged), len(rejected))
        + ("" if off_included or not off else " %d run(s) off their network apart." % len(off)),
        "## Definitions",
        DEFINITIONS.rstrip(),
        "## Scaling",
        markdown_table(columns.scaling_headers(), [(g.key.label, scaling_rows(g, columns)) for g in results]),
        "## Runs",
        markdown_table(columns.run_headers(),
                       [(g.key.label, run_rows(g, sites.get(g.key.site), columns, history)) for g in results]),
    ]
    if rcp:
        parts += ["## Convergence against MLPerf's reference convergence points",
                  markdown_table(RCP_HEADERS, [(v.label, [row]) for v, row in zip(rcp, rcp_rows(rcp))]),
                  "ResNet-50 on ImageNet, epochs to MLPerf's target of 75.9%% top-1 per global batch, against "
                  "the RCPs of %s (method: dlaunch/analysis/convergence.py)." % RCP_SOURCE]
    parts += [
        "## Plots",
        "\n\n".join("![%s](%s)" % (title, name) for name, title in plot_titles(results).items()),
    ]
    kernel_rows = [(g.key.label, [[str(r.world_size)] + ["%.1f" % (100 * v) for v in (
        r.kernel_shares.comm, r.kernel_shares.compute, r.kernel_shares.io,
        1 - r.kernel_shares.comm - r.kernel_shares.compute - r.kernel_shares.io)]
        for r in sorted(g.runs, key=lambda r: r.world_size) if r.kernel_shares]) for g in results]
    if any(rows for _, rows in kernel_rows):
        parts += ["## Kernel time shares (percent of CUDA kernel time)",
                  markdown_table(KERNEL_HEADERS, [(label, rows) for label, rows in kernel_rows if rows])]
    if diverged:
        parts += ["## Diverged runs", "Left out of every table and plot above.",
                  markdown_table(DIVERGED_HEADERS, [(r.key.label, diverged_rows([r])) for r in diverged])]
    if off:
        parts += ["## Runs off their network", off_network_note(off, off_included) + ".",
                  markdown_table(OFF_NETWORK_HEADERS, [(r.key.label, off_network_rows([r], problems or {})) for r in off])]
    if rejected:
        parts += ["## Rejected files", "\n".join("- `%s`" % msg for msg in rejected)]
    if notes:
        parts += ["## Notes", "\n".join("- %s" % note for note in notes)]
    return "\n\n".join(parts) + "\n"


def build_results(runs: Sequence[Run], sites: Dict[str, Site]) -> List[GroupResult]:
    """Groups of the runs that did not diverge, with their scaling points and predictions."""
    results = []
    for key, group in group_runs(r for r in runs if not r.diverged).items():
        points = scaling(group)
        results.append(GroupResult(key, group, points, _group_predictions(group, points, sites.get(key.site))))
    return results


def run_history(metrics_files: Sequence[str]) -> Dict[str, str]:
    """Record the ended runs among `metrics_files` in the results database, and their history
    verdicts (metrics file -> verdict, where a run has enough history)."""
    from dlaunch.results.compare import with_history
    from dlaunch.results.store import ResultsDB, db_path, record

    recorded = record([Path(f) for f in metrics_files])
    if recorded.warning:
        Console(stderr=True, soft_wrap=True).print("dlaunch: warning: %s" % recorded.warning, markup=False, highlight=False)
        return {}
    with ResultsDB(db_path()) as store:
        everything = store.rows()
    wanted = {os.path.abspath(f): f for f in metrics_files}
    mine = [r for r in everything if r["provenance"]["metrics_file"] in wanted]
    return {wanted[r["provenance"]["metrics_file"]]: r["history"] for r in with_history(mine, everything) if r["history"]}


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


def write_report(output: Path, results: Sequence[GroupResult], sites: Dict[str, Site], rejected: Sequence[str],
                 notes: Sequence[str], diverged: Sequence[Run] = (), history: Optional[Dict[str, str]] = None,
                 rcp: Sequence[RCPVerdict] = (), off: Sequence[Run] = (),
                 problems: Optional[Dict[str, List[str]]] = None, off_included: bool = False) -> None:
    """report.md and the plots into `output` (created), each file written atomically."""
    output.mkdir(parents=True, exist_ok=True)
    write_plots(output, results)
    text = markdown_report(results, sites, rejected, notes, diverged, history, rcp, off, problems, off_included)
    write_atomic(output / "report.md", text)


def report_command(
    paths: Annotated[List[Path], typer.Argument(help="Run directories (searched recursively for metrics.jsonl) or metrics files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for report.md and the PNG plots.")] = Path("report"),
    site: Annotated[Optional[str], typer.Option(help="Site profile (name or TOML path) for every run; default: each run's own site.")] = None,
    include_network_mismatches: Annotated[bool, typer.Option(
        "--include-network-mismatches", help="keep runs whose network is not the site's \\[network] in the tables and plots")] = False,
) -> None:
    """Turn run directories into the study's tables, report.md and plots.

    Exit code 0; 1 when some metrics files were rejected (each named on stderr, the rest reported);
    2 on bad input (nothing written).
    """
    output_folder("--output", output)  # before anything is read or written
    loaded = load_runs(str(p) for p in paths)
    console, errors = Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)
    for message in loaded.rejected:
        errors.print("rejected: %s" % escape(message), markup=False, highlight=False)
    if not loaded.runs:
        raise DlaunchError("no valid metrics files in %s" % ", ".join(str(p) for p in paths))
    names = {r.key.site for r in loaded.runs}
    sites, notes = load_sites(sorted(names if site else names - {"-"}), site)  # --site covers site-less runs too
    problems = off_network(loaded.runs, sites)
    off = [r for r in loaded.runs if r.path in problems]
    results = build_results([r for r in loaded.runs if include_network_mismatches or r.path not in problems], sites)
    notes += missing_references(results, sites)
    diverged = [r for r in loaded.runs if r.diverged]
    history = run_history([r.path for r in loaded.runs])
    rcp = rcp_verdicts({g.key.label: g.runs for g in results})
    columns = Columns.of([r for g in results for r in g.runs], history=bool(history))
    for g in results:
        console.print(rich_table(g.key.label, columns.scaling_headers(), scaling_rows(g, columns)))
        rows = [row[:-1] for row in run_rows(g, sites.get(g.key.site), columns, history)]  # metrics file paths: report.md
        console.print(rich_table(g.key.label + ": runs", columns.run_headers()[:-1], rows))
    if rcp:
        console.print(rich_table("convergence against MLPerf's RCPs (%s)" % RCP_SOURCE, ["group"] + RCP_HEADERS,
                                 [[v.label] + row for v, row in zip(rcp, rcp_rows(rcp))]))
    if diverged:
        rows = [[r.key.label] + row[:-1] for r in diverged for row in diverged_rows([r])]
        console.print(rich_table("diverged runs (left out of every table above)", ["group"] + DIVERGED_HEADERS[:-1], rows))
    if off:
        rows = [[r.key.label] + row[:-1] for r in off for row in off_network_rows([r], problems)]
        console.print(rich_table("runs off their network", ["group"] + OFF_NETWORK_HEADERS[:-1], rows))
        notes.append(off_network_note(off, include_network_mismatches))
    for note in notes:
        errors.print("note: %s" % note, markup=False, highlight=False)
    write_report(output, results, sites, loaded.rejected, notes, diverged, history, rcp, off, problems,
                 include_network_mismatches)
    console.print("wrote %s" % (output / "report.md"), markup=False, highlight=False)
    if loaded.rejected:
        raise typer.Exit(1)


COMPARISON_PLOT = "published_vs_this_run.png"
COMPARISON_HEADERS = ["comparison", "GPUs", "published", "this run: group", "median", "low", "high", "runs", "spread"]
METRIC_LABELS = {"images_per_s": "images/s", "speedup": "speed-up S_G", "efficiency": "E_G",
                 "comm_share": "comm share of comm + compute + data",
                 "kernel_comm_share": "NCCL share of kernel time", "kernel_compute_share": "cuDNN share of kernel time",
                 "kernel_io_share": "I/O share of kernel time", "throughput_ratio": "images/s ratio"}


def comparison_rows(comparisons: Sequence[Comparison]) -> List[List[str]]:
    """One row per GPU count with a published or a measured value, per matching group."""
    rows = []
    for c in comparisons:
        published = dict(c.published)
        groups = c.measured or {"-": []}
        for label, points in groups.items():
            measured = dict(points)
            for gpus in sorted(set(published) | set(measured)):
                s = measured.get(gpus)
                rows.append([c.label, str(gpus), _number(published.get(gpus), "%.3g"), label,
                             *([_number(v, "%.3g") for v in (s.median, s.low, s.high)] + [str(s.n), s.kind] if s else ["-"] * 5)])
    return rows


def plot_comparisons(fig, comparisons: Sequence[Comparison]) -> None:
    """One panel per comparison: published values as markers, this run's medians as lines with their spread as bars."""
    if not comparisons:
        _note(fig.add_subplot(), "the study compares with no published data")
        return
    axes = fig.subplots(len(comparisons), 1, squeeze=False)[:, 0]
    for ax, c in zip(axes, comparisons):
        if c.published:
            ax.plot([g for g, _ in c.published], [v for _, v in c.published], "s", color="black", markersize=7,
                    linestyle="none", label="published (%s)" % c.source)
        for i, (label, points) in enumerate(sorted(c.measured.items())):
            kinds = " or ".join(sorted({s.kind for _, s in points}))
            _error_bars(ax, [g for g, _ in points], [s for _, s in points], "C%d" % (i % 10),
                        "this run: %s (median, bars: %s)" % (label, kinds))
        if not c.measured:
            _note(ax, "no run of this study matches")
        _log2_axis(ax, "GPUs")
        counts = sorted({g for g, _ in c.published} | {g for points in c.measured.values() for g, _ in points})
        if counts:  # every count of the panel named on its axis (the paper's 12 GPUs is no power of 2)
            ax.set_xticks(counts, [str(g) for g in counts])
            ax.minorticks_off()
        ax.set_ylabel(METRIC_LABELS[c.metric])
        ax.set_title(c.label, fontsize="small")
        ax.legend(fontsize="x-small")


def write_comparison(output: Path, comparisons: Sequence[Comparison], sources: Sequence[str],
                     design: Sequence[str] = (), assumptions: Sequence[str] = ()) -> None:
    """The published-vs-this-run plot into `output`, and its table appended to `output`/report.md, after
    the study's design lines (protocol, stack) and its assumptions (what the sources leave unstated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7, 1.5 + 3.5 * max(1, len(comparisons))))
    plot_comparisons(fig, comparisons)
    fig.suptitle("Published values (markers) and this run (lines)", fontsize="medium")
    fig.tight_layout()
    atomic_file(output / COMPARISON_PLOT, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None}))
    plt.close(fig)
    section = "\n\n".join([
        "## Published vs this run",
        "Sources:\n" + "\n".join("- %s" % s for s in sources),
        *(["\n".join(design)] if design else []),
        *(["Assumptions (values the sources leave unstated, fixed by this study):\n" + "\n".join("- %s" % a for a in assumptions)]
          if assumptions else []),
        markdown_table(COMPARISON_HEADERS[1:], [(row[0], [row[1:]]) for row in comparison_rows(comparisons)]).replace(
            "| group |", "| comparison |", 1),
        "![Published values (markers) and this run (lines)](%s)" % COMPARISON_PLOT,
    ])
    report = output / "report.md"
    previous = report.read_text(encoding="utf-8") if report.is_file() else ""
    write_atomic(report, previous + "\n" + section + "\n")
