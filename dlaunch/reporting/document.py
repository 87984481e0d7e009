"""The report rendered: report.md (its tables, notes, definitions and provenance), report.html from it and the PNG
plots (`write_report`), and a study's published-vs-this-run section (`write_comparison`); the table rows the command
line prints too. Deterministic: the same inputs give byte-identical outputs (rows sorted, no time stamps but the
data's, plots with a fixed DPI and without PNG software/date metadata).
"""

import dataclasses
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from dlaunch.analysis.budget import OTHER, PARTS
from dlaunch.analysis.convergence import RCP_SOURCE, RCPVerdict
from dlaunch.analysis.published import Comparison
from dlaunch.analysis.scaling import Run, Spread, count_name, count_unit, verdict
from dlaunch.analysis.stragglers import Flag
from dlaunch.atomic import write_atomic
from dlaunch.jobs.sites import Site
from dlaunch.reporting.html import write_page
from dlaunch.reporting.plots import (
    COMPARISON_PLOT,
    COMPARISON_TITLE,
    left_out,
    plot_titles,
    write_comparison_plot,
    write_plots,
)
from dlaunch.reporting.report import GroupResult, Profiles, Recorded, SetApart, flagged_note, off_network_note
from dlaunch.resultsdb.compare import differing, fact_name, fact_text
from dlaunch.tables import cell, counted, markdown
from dlaunch.version import __version__

KERNEL_HEADERS = ("GPUs", "comm %", "compute %", "I/O %", "other %")
DEFINITIONS_WIDTH = 110  # the Definitions' lines at most, their indent included
# The definitions before the efficiency budget's (`definitions` adds it from the budget's parts), and after it.
DEFINITIONS_BEFORE_BUDGET = """\
- Throughput X ("images/s", dlaunch/analysis/scaling.py): the mean over the run's measured epochs (those
  with counted images, the first left out when there are two or more: warm-up) of images / (images /
  images_per_s + overhead.total_s x measured_steps / steps), i.e. epoch overhead (loader start,
  validation, checkpoint, barriers, metrics) included; files without `overhead` (metrics versions 1-3)
  give the steps-only rate (named under Notes).
- Repeats (several runs at one GPU count): images/s, S_G, E_G and J/img are the median over the
  runs; `spread` says what the ranges are: `min-max` (fewer than 6 runs), or `95% CI`, the
  distribution-free 95% confidence interval of the median (order statistics) from 6 runs on; a
  single run has none (`-`). Plots draw the median with the range as error bars. Time shares are
  the runs' mean.
- Groups: experiment, site, model, framework, loader, batch per GPU (`bN`), CPU threads per rank (`tN`,
  runs on CPUs only) and step options; different batch sizes per GPU are separate curves, and so are runs
  on CPUs with other threads per rank (their threads are their compute: the trainer's `--threads`, else
  its default, a node's CPUs over its ranks) and runs made with other step options: the trainer's
  `--compile`, `--cuda-graphs`, `--optimizer-impl` and `--host-syncs` where they differ from the defaults,
  named at the end of the group's label (none named: the defaults; so are metrics files older than
  the options). Where no run uses a GPU, counts are of worker processes (`workers`; a parameter-server
  engine's servers and coordinators not counted).
- Compile time (`compile s`, shown when some run used `--compile`): the wall time of the first step of
  each session of the run (a warm-up step, torch.compile's tracing and code generation), summed; it is
  never part of images/s.
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
  count, precision, framework, loader, batch per GPU and step options): X against the median of the
  last 10 of them; REGRESSION when slower by more than the site's reference tolerance (5% without one).
"""
DEFINITIONS_AFTER_BUDGET = """\
- Measurement quality (dlaunch/analysis/quality.py), per count G of a group: `spread`, the width of the
  range of its runs' images/s (min-max below 6 runs, the 95% CI of the median from 6) over their median
  (`-`: one run, not measured); `ref. spread`, the same of the reference G_ref. Noisy: spread above the
  noise threshold (`--noise-threshold`, default 0.10); unstable reference: the reference's spread above
  it (S_G and E_G of every count divide by its median); implausible: E_G above 1 + the spread here + the
  reference's (the threshold for a point of one run), `E_G noise allows`: with the same batch per GPU,
  G GPUs do at most G / G_ref times the reference's work. `why` names the likely causes the records show:
  unequal threads per rank (or, none recorded, other ranks per node), different nodes, a loaded machine
  (equal runs' median-rank compute per step spread beyond the threshold), a slower reference, flagged
  runs kept, too few measured steps. Such points are set apart from the tables, plots and budget unless
  the report was made with `--include-doubtful`.
- Architectures, updates and frameworks compared (where the groups differ in them): per count the groups
  side by side, with the median rank's step split from the per-rank phases (`sync %`: exposed
  communication and waiting for peers, `compute %`, `data %`, each over their sum), which the PyTorch
  trainer records for DDP, Horovod, DeepSpeed and its parameter server; the TensorFlow and MXNet
  trainers record none (`-`).
- Stragglers and throttled GPUs (dlaunch/analysis/stragglers.py): a rank whose forward pass (which overlaps
  no communication) took more than the threshold (the site profile's `straggler_threshold`, default 10 %, or
  `--straggler-threshold`) longer than the median rank's over the measured epochs, or a GPU whose SM clock
  fell below (1 - threshold) of its maximum with a throttle reason (or any thermal, hardware-slowdown or
  power-brake reason). Such runs are listed apart and enter no table or plot above it (their E_G is
  understated), unless the report was made with `--include-stragglers`.
- Diverged runs (the loss stayed NaN/inf, end status `diverged`) are listed apart and enter no
  table or plot above it.
- Network: a run whose collective libraries recorded another transport, net plugin, provider or
  interface than its site's `[network]` expects (metrics `network`; `dlaunch status` flags it too)
  did not measure the fabric's throughput: such runs are listed apart and enter no table or plot
  above it, unless the report was made with `--include-network-mismatches`.
"""


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else "%.1f" % (100 * value)


SCALING_HEADERS = [
    "GPUs",
    "nodes",
    "runs",
    "spread",
    "images/s",
    "images/s range",
    "S_G",
    "E_G",
    "E_G range",
    "pred. E_G",
    "comm %",
    "compute %",
    "data %",
]
RUN_HEADERS = [
    "run",
    "GPUs",
    "global batch",
    "schedule",
    "status",
    "images/s",
    "best top-1",
    "reference",
    "metrics file",
]
ENERGY_SCALING_HEADERS = ["J/img", "J/img range"]
ACCURACY_SCALING_HEADERS = ["epochs to target", "time to target s", "TTA S_G"]
ACCURACY_RUN_HEADERS = ["epochs to target", "time to acc. s"]
COMPILE_HEADER = "compile s"
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
    compiled: bool = False  # some run recorded a compile time (--compile)
    unit: str = "GPUs"  # what a run's count counts: `count_unit`

    @classmethod
    def of(cls, runs: Sequence[Run], history: bool = False) -> "Columns":
        return cls(
            energy=any(r.joules_per_image is not None or r.energy_j is not None for r in runs),
            accuracy=any(r.time_to_accuracy_s is not None for r in runs),
            history=history,
            compiled=any(r.compile_s is not None for r in runs),
            unit=count_unit(runs),
        )

    def scaling_headers(self) -> List[str]:
        return self.counted(
            SCALING_HEADERS
            + (ACCURACY_SCALING_HEADERS if self.accuracy else [])
            + (ENERGY_SCALING_HEADERS if self.energy else [])
        )

    def run_headers(self) -> List[str]:
        extra = ([COMPILE_HEADER] if self.compiled else []) + (ACCURACY_RUN_HEADERS if self.accuracy else [])
        extra += ENERGY_RUN_HEADERS if self.energy else []
        extra += ENERGY_ACCURACY_RUN_HEADERS if self.energy and self.accuracy else []
        extra += ["history"] if self.history else []
        return self.counted(RUN_HEADERS[:-1] + extra + RUN_HEADERS[-1:])

    @property
    def count_name(self) -> str:
        return count_name(self.unit)

    def counted(self, headers: Sequence[str]) -> List[str]:
        """`headers` with their "GPUs" named by what the runs' counts count (`unit`)."""
        return [self.unit if h == COUNT_HEADER else h for h in headers]


COUNT_HEADER = "GPUs"  # the headers' name for a run's world size, `count_unit` where the runs have no GPU


def _kilo(value: Optional[float]) -> str:
    return cell(None if value is None else value / 1000, "%.2f")


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
            str(pt.gpus),
            str(pt.nodes),
            str(pt.runs),
            pt.throughput.kind if pt.runs > 1 else "-",
            "%.1f" % pt.images_per_s,
            _range(pt.throughput, "%.1f"),
            "%.2f" % pt.speedup,
            "%.3f" % pt.efficiency,
            _range(pt.efficiencies, "%.3f"),
            cell(pred.efficiency if pred else None, "%.3f"),
            _percent(s.comm if s else None),
            _percent(s.compute if s else None),
            _percent(s.data if s else None),
        ]
        if columns.accuracy:
            tta = pt.time_to_target
            row += [
                cell(pt.epochs_to_target.median if pt.epochs_to_target else None, "%g"),
                cell(tta.median if tta else None),
                cell(t_ref / tta.median if tta and t_ref else None, "%.2f"),
            ]
        if columns.energy:
            row += [cell(pt.joules_per_image, "%.3g"), _range(pt.energy, "%.3g")]
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


def run_rows(
    g: GroupResult, profiles: Profiles, columns: Columns, history: Optional[Dict[str, str]] = None
) -> List[List[str]]:
    """`history`: metrics file -> history verdict (dlaunch/resultsdb/compare.py)."""
    rows = []
    for run in g.runs:
        check = verdict_cell(run, profiles.of(run))
        row = [
            Path(run.path).parent.name,
            str(run.world_size),
            str(run.global_batch),
            run.schedule,
            run.status,
            cell(run.throughput),
            cell(run.best_top1, "%.4f"),
            check,
        ]
        if columns.compiled:
            row.append(cell(run.compile_s))
        if columns.accuracy:
            row += [cell(run.epochs_to_target, "%d"), cell(run.time_to_accuracy_s)]
        if columns.energy:
            total = _kilo(run.energy_j)
            row += [
                cell(run.joules_per_image, "%.3g"),
                _kilo(run.energy_per_epoch),
                total if run.energy_domains is None else "%s (%s)" % (total, run.energy_domains),
            ]
            if columns.accuracy:
                row.append(_kilo(run.energy_to_accuracy_j))
        if columns.history:
            row.append((history or {}).get(run.path) or "-")
        rows.append(row + [run.path])
    return rows


def diverged_rows(runs: Sequence[Run]) -> List[List[str]]:
    return [[Path(r.path).parent.name, str(r.world_size), str(len(r.epochs)), r.reason or "-", r.path] for r in runs]


def off_network_rows(runs: Sequence[Run], problems: Dict[str, List[str]]) -> List[List[str]]:
    return [[Path(r.path).parent.name, str(r.world_size), "; ".join(problems[r.path]), r.path] for r in runs]


FLAGGED_HEADERS = ["run", "GPUs", "flags", "metrics file"]


def flagged_rows(runs: Sequence[Run], flags: Dict[str, List[Flag]]) -> List[List[str]]:
    return [
        [Path(r.path).parent.name, str(r.world_size), "; ".join(f.message for f in flags[r.path]), r.path] for r in runs
    ]


def budget_headers() -> List[str]:
    """The budget table's headers: the parts (the budget's table, PARTS) after E_G and the step time behind it."""
    return [COUNT_HEADER, "E_G", "batch/X ms", *PARTS]


QUALITY_HEADERS = ["GPUs", "runs", "spread", "reference", "ref. spread", "E_G", "E_G noise allows", "verdict", "why"]


def _relative(spread: Optional[float], kind: str = "") -> str:
    """A relative spread in per cent, with the range's kind; '-' (one run: not measured)."""
    return "-" if spread is None else ("%.1f %%%s" % (100 * spread, " " + kind if kind else ""))


def quality_rows(g: GroupResult, included: bool = False) -> List[List[str]]:
    """Per count of the group: the measurement-quality verdict (dlaunch/analysis/quality.py) and why; `included`:
    doubtful points are kept in the tables (--include-doubtful)."""
    rows = []
    for gpus, q in sorted(g.quality.items()):
        verdict = q.verdict + (" (kept)" if included and q.doubtful else " (set apart)" if q.doubtful else "")
        rows.append(
            [
                str(gpus),
                str(q.runs),
                _relative(q.spread, q.spread_kind),
                "%d (%s)" % (q.reference_gpus, counted(q.reference_runs, "run")),
                _relative(q.reference_spread),
                "%.3f" % q.efficiency,
                "-" if gpus == q.reference_gpus else "<= %.3f" % (1 + q.allowance),
                verdict,
                q.why or "-",
            ]
        )
    return rows


COMPARED_HEADERS = [
    "GPUs",
    "architecture",
    "updates",
    "engine",
    "framework",
    "loader",
    "threads",
    "images/s",
    "E_G",
    "sync %",
    "compute %",
    "data %",
    "verdict",
]


def compares_axes(results: Sequence[GroupResult]) -> bool:
    """Whether the groups differ in a study's axes: architecture, updates (sync, async) or engine."""
    return len({r.axes for g in results for r in g.runs}) > 1


def compared_rows(results: Sequence[GroupResult]) -> List[Tuple[str, List[str]]]:
    """Per count, the groups side by side by architecture, updates, engine, framework and loader: the study's question
    (all-reduce or parameter server, synchronous or asynchronous, which framework) at every count, with the step split
    from the per-rank phases where the engine records them."""
    found = []
    for g in results:
        axes = g.runs[0].axes
        threads = sorted({r.threads for r in g.runs if r.threads is not None})
        for pt in g.points:
            s = pt.step_shares
            found.append(
                (
                    (
                        pt.gpus,
                        axes.architecture,
                        axes.updates != "sync",
                        axes.engine,
                        g.key.framework,
                        g.key.loader,
                        g.key.label,
                    ),
                    [
                        str(pt.gpus),
                        axes.architecture,
                        axes.updates,
                        axes.engine,
                        g.key.framework,
                        g.key.loader,
                        "/".join(map(str, threads)) or "-",
                        "%.1f" % pt.images_per_s,
                        "%.3f" % pt.efficiency,
                        _percent(s.comm if s else None),
                        _percent(s.compute if s else None),
                        _percent(s.data if s else None),
                        g.quality[pt.gpus].verdict if pt.gpus in g.quality else "-",
                    ],
                )
            )
    return [(order[-1], row) for order, row in sorted(found, key=lambda item: item[0])]


def budget_rows(g: GroupResult) -> List[List[str]]:
    """Per GPU count: E_G, the step time behind it and the share of the ideal lost per cause."""
    return [
        [str(row.gpus), "%.3f" % row.measured_e_g, "%.1f" % (1000 * row.step_s)]
        + ["not recorded" if row.lost[part] is None else _share(row.lost[part]) for part in PARTS]  # type: ignore[arg-type]
        for row in g.budget
    ]


def budget_definition() -> str:
    """The Definitions' item on the efficiency budget, each part's measure from the budget's table (PARTS)."""
    measured = [part for part in PARTS.values() if part.per_step is not None]
    text = (
        "- Efficiency budget (runs with per-rank phases, metrics version 4; dlaunch/analysis/budget.py): per GPU count "
        "G, per step t(G) = global batch / X and each part's measure x, the median over the point's runs: %s. Lost to "
        "x = (x(G) - x(G_ref)) / t(G); `%s` = %s. Negative: a gain against G_ref."
        % ("; ".join("`%s` = %s" % (part.name, part.definition) for part in measured), OTHER, PARTS[OTHER].definition)
    )
    return textwrap.fill(
        text, width=DEFINITIONS_WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )


def definitions() -> str:
    """The report's Definitions."""
    return DEFINITIONS_BEFORE_BUDGET + budget_definition() + "\n" + DEFINITIONS_AFTER_BUDGET


def _share(value: float) -> str:
    """A share of the ideal with three decimals; a rounding residue (-0.0001) is "0.000", not "-0.000"."""
    text = "%.3f" % value
    return "0.000" if text == "-0.000" else text


def markdown_table(headers: Sequence[str], groups: Sequence[Tuple[str, List[List[str]]]]) -> str:
    """One table, the group label as first column."""
    return markdown(["group", *headers], [[label, *row] for label, group_rows in groups for row in group_rows])


RCP_HEADERS = ["global batch", "runs", "reached 75.9%", "epochs to 75.9%", "RCP mean", "min epochs", "RCP", "verdict"]


def rcp_rows(verdicts: Sequence[RCPVerdict]) -> List[List[str]]:
    return [
        [
            str(v.global_batch),
            str(v.runs),
            str(v.reached),
            cell(v.epochs, "%.2f"),
            cell(v.rcp.mean if v.rcp else None, "%.2f"),
            cell(v.rcp.min_epochs if v.rcp else None, "%.2f"),
            v.rcp.name if v.rcp else "-",
            v.verdict,
        ]
        for v in verdicts
    ]


def markdown_report(
    results: Sequence[GroupResult],
    profiles: Profiles,
    rejected: Sequence[str],
    notes: Sequence[str],
    diverged: Sequence[Run] = (),
    recorded: Optional[Recorded] = None,
    rcp: Sequence[RCPVerdict] = (),
    apart: SetApart = SetApart(),
    plots: Optional[Dict[str, str]] = None,
    inputs: Sequence[str] = (),
) -> str:
    """`recorded`: the results database's history verdicts and rows; `rcp`: the convergence verdicts per
    global batch; `apart`: the runs listed apart; `plots`: the figures written (file -> title); `inputs`:
    the paths reported on."""
    recorded = recorded or Recorded()
    n_runs = sum(len(g.runs) for g in results)
    excluded = apart.excluded()
    columns = Columns.of([r for g in results for r in g.runs], history=bool(recorded.history))
    columns = dataclasses.replace(
        columns, unit=count_unit([r for g in results for r in g.runs] + [*diverged, *excluded])
    )
    doubtful = sum(len(g.doubtful) for g in results)
    parts = [
        "# dlaunch report",
        "%s in %s; %s apart; %s rejected."
        % (
            counted(n_runs, "run"),
            counted(len(results), "group"),
            counted(len(diverged), "diverged run"),
            counted(len(rejected), "file"),
        )
        + ("" if apart.off_included or not apart.off else " %d run(s) off their network apart." % len(apart.off))
        + (
            ""
            if apart.flagged_included or not apart.flagged
            else " %d run(s) with a straggler or a throttled GPU apart." % len(apart.flagged)
        )
        + (
            ""
            if apart.doubtful_included or not doubtful
            else " %s apart by the quality verdict." % counted(doubtful, "scaling point")
        ),
        "## Scaling",
        markdown_table(columns.scaling_headers(), [(g.key.label, scaling_rows(g, columns)) for g in results]),
        *groups_differ(results, recorded),
        "## Measurement quality",
        markdown_table(
            columns.counted(QUALITY_HEADERS),
            [(g.key.label, quality_rows(g, apart.doubtful_included)) for g in results if g.quality],
        ),
        "Per %s: the spread of its runs' images/s and of its reference's, and E_G against what that noise "
        "allows (definitions below); a point that is noisy, has an unstable reference or an E_G beyond noise is %s."
        % (
            columns.count_name,
            "kept in the tables and plots (--include-doubtful)"
            if apart.doubtful_included
            else "set apart from the tables, plots and budget (--include-doubtful keeps it)",
        ),
        "## Runs",
        markdown_table(
            columns.run_headers(), [(g.key.label, run_rows(g, profiles, columns, recorded.history)) for g in results]
        ),
    ]
    if compares_axes(results):
        parts += [
            "## Architectures, updates and frameworks compared",
            markdown_table(
                columns.counted(COMPARED_HEADERS), [(label, [row]) for label, row in compared_rows(results)]
            ),
            "Per %s, the groups side by side: architecture (all-reduce or parameter server), updates "
            "(synchronous or asynchronous), engine, framework and loader, with the median rank's step split from the "
            "per-rank phases (`-`: the engine records none)." % columns.count_name,
        ]
    explained = [g for g in results if g.explained]
    if explained:
        parts += [
            "## Efficiency budget",
            "Per %s, from ideal (1.000) to the measured E_G: the share of the ideal lost to each cause "
            "(%s) against the group's reference G_ref (definitions below); the parts and E_G add up to 1."
            % (columns.count_name, ", ".join(PARTS)),
            markdown_table(columns.counted(budget_headers()), [(g.key.label, budget_rows(g)) for g in explained]),
        ]
    if rcp:
        parts += [
            "## Convergence against MLPerf's reference convergence points",
            markdown_table(RCP_HEADERS, [(v.label, [row]) for v, row in zip(rcp, rcp_rows(rcp))]),
            "ResNet-50 on ImageNet, epochs to MLPerf's target of 75.9%% top-1 per global batch, against "
            "the RCPs of %s (method: dlaunch/analysis/convergence.py)." % RCP_SOURCE,
        ]
    plots = plot_titles(results) if plots is None else plots
    parts += [
        "## Plots",
        "\n\n".join(
            [
                *(["_%s_" % note] if (note := left_out(results)) else []),
                *("![%s](%s)" % (title, name) for name, title in plots.items()),
            ]
        )
        or "No figure: no run has data to draw.",
    ]
    kernel_rows = [
        (
            g.key.label,
            [
                [str(r.world_size)]
                + [
                    "%.1f" % (100 * v)
                    for v in (
                        r.kernel_shares.comm,
                        r.kernel_shares.compute,
                        r.kernel_shares.io,
                        1 - r.kernel_shares.comm - r.kernel_shares.compute - r.kernel_shares.io,
                    )
                ]
                for r in sorted(g.runs, key=lambda r: r.world_size)
                if r.kernel_shares
            ],
        )
        for g in results
    ]
    if any(rows for _, rows in kernel_rows):
        parts += [
            "## Kernel time shares (percent of CUDA kernel time)",
            markdown_table(KERNEL_HEADERS, [(label, rows) for label, rows in kernel_rows if rows]),
        ]
    if apart.flagged:
        parts += [
            "## Stragglers and throttled GPUs",
            flagged_note(apart.flagged, apart.flagged_included, apart.threshold) + ".",
            markdown_table(
                columns.counted(FLAGGED_HEADERS), [(r.key.label, flagged_rows([r], apart.flags)) for r in apart.flagged]
            ),
        ]
    if diverged:
        parts += [
            "## Diverged runs",
            "Left out of every table and plot above.",
            markdown_table(columns.counted(DIVERGED_HEADERS), [(r.key.label, diverged_rows([r])) for r in diverged]),
        ]
    if apart.off:
        parts += [
            "## Runs off their network",
            off_network_note(apart.off, apart.off_included) + ".",
            markdown_table(
                columns.counted(OFF_NETWORK_HEADERS),
                [(r.key.label, off_network_rows([r], apart.problems)) for r in apart.off],
            ),
        ]
    if rejected:
        parts += ["## Rejected files", "\n".join("- `%s`" % msg for msg in rejected)]
    if notes:
        parts += ["## Notes", "\n".join("- %s" % note for note in notes)]
    parts += ["## Definitions", definitions().rstrip()]
    everything = [r for g in results for r in g.runs] + list(diverged) + excluded
    parts += ["## Provenance", provenance_text(everything, profiles, recorded, inputs)]
    return "\n\n".join(parts) + "\n"


def groups_differ(results: Sequence[GroupResult], recorded: Recorded) -> List[str]:
    """What else tells the groups apart beyond their labels, from their runs' rows (the results database's): each
    trainer option given otherwise (`--threads`), image, node count, data, dlaunch's revision, library versions
    (resultsdb/compare.py's facts), per group; nothing for a single group or groups alike in all of them."""
    sides = [[recorded.rows[r.path] for r in g.runs if r.path in recorded.rows] for g in results]
    if len(results) < 2 or not all(sides):
        return []
    found = {n: v for n, v in differing(sides).items() if n not in ("experiment", "site")}  # in the labels already
    if not found:
        return []
    lines = [
        "- %s: %s" % (g.key.label, "; ".join("%s %s" % (fact_name(n), fact_text(n, v[i])) for n, v in found.items()))
        for i, g in enumerate(results)
    ]
    return ["The groups differ beyond their labels in what their runs were given or ran with:\n\n" + "\n".join(lines)]


PROVENANCE_HEADERS = ["run", "started", "image", "git revision", "versions", "job id", "metrics file"]


def provenance_text(runs: Sequence[Run], profiles: Profiles, recorded: Recorded, inputs: Sequence[str]) -> str:
    """Who made the report from what, and per run what it ran (from the results database's rows): the library versions
    it recorded as used (a library a file of an older trainer recorded as absent, `None`, is left out)."""
    lines = [
        "- Made by dlaunch %s (`dlaunch report`) from %s under %s."
        % (__version__, counted(len(runs), "metrics file"), ", ".join("`%s`" % p for p in inputs) or "-")
    ]
    lines += ["- Site profiles: %s." % ("; ".join(profiles.sources) or "none")]
    rows = []
    for run in sorted(runs, key=lambda r: (r.key, r.world_size, r.path)):
        row = recorded.rows.get(run.path)
        if row is None:
            rows.append((run.key.label, [[Path(run.path).parent.name, "-", "-", "-", "-", "-", run.path]]))
            continue
        versions = ", ".join("%s %s" % item for item in sorted(row["pins"].items()) if item[1] is not None) or "-"
        rows.append(
            (
                run.key.label,
                [
                    [
                        Path(run.path).parent.name,
                        row["started"],
                        row["image"] or "-",
                        row["provenance"].get("git_revision") or "-",
                        versions,
                        row["provenance"].get("job_id") or "-",
                        run.path,
                    ]
                ],
            )
        )
    missing = sum(1 for r in runs if r.path not in recorded.rows)
    why = (
        []
        if not missing
        else [
            "%s without a row in the results database (running, or the database was not "
            "written): '-'." % counted(missing, "run")
        ]
    )
    return "\n".join(lines) + "\n\n" + "\n\n".join(why + [markdown_table(PROVENANCE_HEADERS, rows)])


def write_report(
    output: Path,
    results: Sequence[GroupResult],
    profiles: Profiles,
    rejected: Sequence[str],
    notes: Sequence[str],
    diverged: Sequence[Run] = (),
    recorded: Optional[Recorded] = None,
    rcp: Sequence[RCPVerdict] = (),
    apart: SetApart = SetApart(),
    inputs: Sequence[str] = (),
) -> None:
    """report.md, report.html and the plots into `output` (created), each file written atomically."""
    output.mkdir(parents=True, exist_ok=True)
    plots = write_plots(output, results)
    write_atomic(
        output / "report.md",
        markdown_report(results, profiles, rejected, notes, diverged, recorded, rcp, apart, plots, inputs),
    )
    write_page(output)


COMPARISON_HEADERS = ["comparison", "GPUs", "published", "this run: group", "median", "low", "high", "runs", "spread"]


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
                rows.append(
                    [
                        c.label,
                        str(gpus),
                        cell(published.get(gpus), "%.3g"),
                        label,
                        *(
                            [cell(v, "%.3g") for v in (s.median, s.low, s.high)] + [str(s.n), s.kind]
                            if s
                            else ["-"] * 5
                        ),
                    ]
                )
    return rows


def write_comparison(
    output: Path,
    comparisons: Sequence[Comparison],
    sources: Sequence[str],
    design: Sequence[str] = (),
    assumptions: Sequence[str] = (),
) -> Optional[Path]:
    """The published-vs-this-run plot into `output` (when the study compares with published data; returned),
    and its table appended to `output`/report.md (report.html made again from it), after the study's design
    lines (protocol, stack) and its assumptions (what the sources leave unstated)."""
    plot = output / COMPARISON_PLOT
    if comparisons:
        write_comparison_plot(output, comparisons)
    elif plot.is_file() and not plot.is_symlink():
        plot.unlink()  # an earlier report's
    section = "\n\n".join(
        [
            "## Published vs this run",
            "Sources:\n" + "\n".join("- %s" % s for s in sources),
            *(["\n".join(design)] if design else []),
            *(
                [
                    "Assumptions (values the sources leave unstated, fixed by this study):\n"
                    + "\n".join("- %s" % a for a in assumptions)
                ]
                if assumptions
                else []
            ),
            markdown_table(
                COMPARISON_HEADERS[1:], [(row[0], [row[1:]]) for row in comparison_rows(comparisons)]
            ).replace("| group |", "| comparison |", 1),
            "![%s](%s)" % (COMPARISON_TITLE, COMPARISON_PLOT)
            if comparisons
            else "The study compares with no published data.",
        ]
    )
    report = output / "report.md"
    previous = report.read_text(encoding="utf-8") if report.is_file() else ""
    write_atomic(report, previous + "\n" + section + "\n")
    write_page(output)
    return plot if comparisons else None
