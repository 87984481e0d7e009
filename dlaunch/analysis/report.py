"""`dlaunch report`: run directories -> console tables, report.md, report.html and PNG plots (deterministic).

The same inputs give byte-identical outputs: rows are sorted, the report carries no time stamps
but the data's, plots are written with a fixed DPI and without PNG software/date metadata.
Each run is judged by the site profile it was made from: the text its run directory kept
(`site.toml`), else the profile of its site's name found here, or every run by `--site`.
"""
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Dict, List, Optional, Sequence, Tuple

import typer
from rich.console import Console

from dlaunch.version import __version__
from dlaunch.analysis.budget import LOST_PARTS, OTHER, BudgetRow, budget
from dlaunch.analysis.stragglers import DEFAULT_THRESHOLD, Flag, check_threshold, run_flags
from dlaunch.analysis.scaling import Comparison, GroupKey, Loaded, Run, ScalingPoint, Spread, group_runs, load_runs, reference_for, scaling, verdict
from dlaunch.analysis.convergence import RCP_SOURCE, RCPVerdict, rcp_verdicts
from dlaunch.analysis.html import PAGE, write_page
from dlaunch.analysis.plots import COMPARISON_PLOT, COMPARISON_TITLE, left_out, plot_titles, write_comparison_plot, write_plots
from dlaunch.atomic import write_atomic
from dlaunch.boundary import MAX_FILE_BYTES, decode, escape, finite_number, output_folder, parse_toml, read_bytes, validate
from dlaunch.errors import DlaunchError
from dlaunch.analysis.perfmodel import MODEL_PARAMS_M, Prediction, Workload, gradient_bytes, interconnect_of_site, predict
from dlaunch.jobs.network import network_problems
from dlaunch.jobs.sites import Site, resolve_site
from dlaunch.paths import SITE_PROFILE
from dlaunch.tables import counted, fit_table, markdown

KERNEL_HEADERS = ("GPUs", "comm %", "compute %", "I/O %", "other %")
DEFINITIONS = """\
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
- Efficiency budget (runs with per-rank phases, metrics version 4; dlaunch/analysis/budget.py): per GPU
  count G, per step t(G) = global batch / X; exposed communication = median sync_s - wait; waiting for
  stragglers = slowest rank's compute_s - median rank's; data = median data_s; epoch overhead =
  overhead.total_s / steps; each the median over the point's runs. Lost to x = (x(G) - x(G_ref)) / t(G);
  `other` = 1 - E_G - those (compute and optimizer changes, host gaps, and parts not recorded), so ideal
  (1.000) - everything lost = measured E_G exactly. Negative: a gain against G_ref.
- Stragglers and throttled GPUs (dlaunch/analysis/stragglers.py): a rank that computed more than the
  threshold (the site profile's `straggler_threshold`, default 10 %, or `--straggler-threshold`) slower
  than the median rank over the measured epochs, or a GPU whose SM clock fell below (1 - threshold) of
  its maximum with a throttle reason (or any thermal, hardware-slowdown or power-brake reason). Such runs
  are listed apart and enter no table or plot above it (their E_G is understated), unless the report
  was made with `--include-stragglers`.
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
    budget: List[BudgetRow] = field(default_factory=list)

    @property
    def explained(self) -> bool:
        """Whether its budget names a cause somewhere: some GPU count's runs and the reference's recorded phases."""
        return any(v is not None for row in self.budget[1:] for part, v in row.lost.items() if part != OTHER)


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


def missing_references(runs: Sequence[Run], profiles: "Profiles") -> List[str]:
    """One note per site, model, GPU count and precision whose runs have no reference to be judged by."""
    missing: Dict[Tuple[str, str, int, str], int] = {}
    for run in runs:
        site = profiles.of(run)
        if site is not None and run.throughput is not None and reference_for(run, site.reference) is None:
            key = (site.name, run.key.model, run.world_size, run.amp)
            missing[key] = missing.get(key, 0) + 1
    return ["site %s has no [[reference]] for %s on %s%s: no verdict for %s"
            % (name, model, counted(gpus, "GPU"), "" if amp == "none" else " with --amp %s" % amp, counted(n, "run"))
            for (name, model, gpus, amp), n in sorted(missing.items())]


def run_rows(g: GroupResult, profiles: "Profiles", columns: Columns, history: Optional[Dict[str, str]] = None) -> List[List[str]]:
    """`history`: metrics file -> history verdict (dlaunch/resultsdb/compare.py)."""
    rows = []
    for run in g.runs:
        check = verdict_cell(run, profiles.of(run))
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


def off_network(runs: Sequence[Run], profiles: "Profiles") -> Dict[str, List[str]]:
    """Metrics file -> how the run is off its site's `[network]`, for the runs that are."""
    found = {}
    for run in runs:
        site = profiles.of(run)
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


FLAGGED_HEADERS = ["run", "GPUs", "flags", "metrics file"]


def threshold_for(run: Run, profiles: "Profiles", override: Optional[float]) -> float:
    """The straggler threshold a run is judged by: --straggler-threshold, else its profile's, else the default."""
    if override is not None:
        return override
    site = profiles.of(run)
    return site.straggler_threshold if site is not None else DEFAULT_THRESHOLD


def flagged(runs: Sequence[Run], profiles: "Profiles", override: Optional[float]) -> Dict[str, List[Flag]]:
    """Metrics file -> its stragglers and throttled GPUs, for the runs (not diverged) that have some."""
    found = {}
    for run in runs:
        flags = [] if run.diverged else run_flags(run, threshold_for(run, profiles, override))
        if flags:
            found[run.path] = flags
    return found


def flagged_rows(runs: Sequence[Run], flags: Dict[str, List[Flag]]) -> List[List[str]]:
    return [[Path(r.path).parent.name, str(r.world_size), "; ".join(f.message for f in flags[r.path]), r.path] for r in runs]


def flagged_note(runs: Sequence[Run], included: bool, override: Optional[float]) -> str:
    """What the report did with the runs that have a straggler or a throttled GPU, and by which threshold."""
    threshold = ("--straggler-threshold %g" % override if override is not None
                 else "each site profile's straggler_threshold (%g without one)" % DEFAULT_THRESHOLD)
    if included:
        return ("%d run(s) with a straggler or a throttled GPU (threshold: %s) are kept in the tables and plots "
                "(--include-stragglers): their E_G is understated" % (len(runs), threshold))
    return ("%d run(s) with a straggler or a throttled GPU (threshold: %s) are left out of the tables and plots "
            "(--include-stragglers keeps them)" % (len(runs), threshold))


@dataclass(frozen=True)
class SetApart:
    """The runs the report lists apart from its tables and plots: off their site's network (`problems`: metrics
    file -> how), with a straggler or a throttled GPU (`flags`); each kept in them only when `*_included`."""

    off: Sequence[Run] = ()
    problems: Dict[str, List[str]] = field(default_factory=dict)
    off_included: bool = False
    flagged: Sequence[Run] = ()
    flags: Dict[str, List[Flag]] = field(default_factory=dict)
    flagged_included: bool = False
    threshold: Optional[float] = None  # --straggler-threshold

    def excluded(self) -> List[Run]:
        """The runs that are in no table or plot."""
        left_out = ([] if self.off_included else list(self.off)) + ([] if self.flagged_included else list(self.flagged))
        return list({r.path: r for r in left_out}.values())

    def notes(self) -> List[str]:
        return (([off_network_note(self.off, self.off_included)] if self.off else [])
                + ([flagged_note(self.flagged, self.flagged_included, self.threshold)] if self.flagged else []))


STEPS_ONLY_SHOWN = 10  # runs named in the note on runs without epoch overhead


def steps_only_note(runs: Sequence[Run]) -> List[str]:
    """A note naming the runs whose images/s lacks epoch overhead (metrics versions 1-3)."""
    lacking = [r for r in runs if r.throughput is not None and not r.overhead_included]
    if not lacking:
        return []
    names = ", ".join(Path(r.path).parent.name for r in lacking[:STEPS_ONLY_SHOWN])
    return ["%s recorded no epoch overhead (metrics version 1-3), so images/s is the steps-only rate: %s%s"
            % (counted(len(lacking), "run"), names, ", ..." if len(lacking) > STEPS_ONLY_SHOWN else "")]


BUDGET_HEADERS = ["GPUs", "E_G", "step ms", *LOST_PARTS]  # the parts: the share of the ideal lost to each


def budget_rows(g: GroupResult) -> List[List[str]]:
    """Per GPU count: E_G, the step time behind it and the share of the ideal lost per cause."""
    return [[str(row.gpus), "%.3f" % row.measured_e_g, "%.1f" % (1000 * row.step_s)]
            + ["not recorded" if row.lost[part] is None else _share(row.lost[part]) for part in LOST_PARTS]  # type: ignore[arg-type]
            for row in g.budget]


def _share(value: float) -> str:
    """A share of the ideal with three decimals; a rounding residue (-0.0001) is "0.000", not "-0.000"."""
    text = "%.3f" % value
    return "0.000" if text == "-0.000" else text


def markdown_table(headers: Sequence[str], groups: Sequence[Tuple[str, List[List[str]]]]) -> str:
    """One table, the group label as first column."""
    return markdown(["group", *headers], [[label, *row] for label, group_rows in groups for row in group_rows])


RCP_HEADERS = ["global batch", "runs", "reached 75.9%", "epochs to 75.9%", "RCP mean", "min epochs", "RCP", "verdict"]


def rcp_rows(verdicts: Sequence[RCPVerdict]) -> List[List[str]]:
    return [[str(v.global_batch), str(v.runs), str(v.reached), _number(v.epochs, "%.2f"),
             _number(v.rcp.mean if v.rcp else None, "%.2f"), _number(v.rcp.min_epochs if v.rcp else None, "%.2f"),
             v.rcp.name if v.rcp else "-", v.verdict] for v in verdicts]




@dataclass(frozen=True)
class Profiles:
    """The site profile each run is judged by (metrics file -> Site), where they came from, and the
    notes on runs that have none here."""

    of_run: Dict[str, Site]
    sources: List[str]  # one line per site name: where its runs' profiles came from (provenance)
    notes: List[str]

    def of(self, run: Run) -> Optional[Site]:
        return self.of_run.get(run.path)

    def of_group(self, runs: Sequence[Run]) -> Optional[Site]:
        """The profile of the first of `runs` that has one (the group's predictions)."""
        return next((self.of_run[r.path] for r in runs if r.path in self.of_run), None)


KEPT = "the profile their run directories kept (%s)" % SITE_PROFILE
BY_NAME = "the profile of that name found here"


def kept_profile(run: Run, validated: Dict[bytes, Site]) -> Optional[Site]:
    """The profile text `run`'s directory kept (None: it kept none); `validated` caches profiles by text
    (a sweep's runs keep the same one). DlaunchError naming the file when it is no valid profile."""
    path = Path(run.path).parent / SITE_PROFILE
    if path.is_symlink() or not path.is_file():
        return None
    data = read_bytes(path, MAX_FILE_BYTES, follow_links=False)
    if data not in validated:
        shown = str(path)
        validated[data] = validate(Site, parse_toml(decode(data, shown), shown), shown)
    return validated[data]


def load_profiles(runs: Sequence[Run], override: Optional[str]) -> Profiles:
    """Each run's profile: `override` (--site) for all; else the one its directory kept; else its site's name here."""
    if override:
        site = resolve_site(override)  # a bad --site is bad input
        return Profiles({r.path: site for r in runs}, ["every run: --site %s (%s)" % (override, site.name)], [])
    validated: Dict[bytes, Site] = {}
    named: Dict[str, Optional[Site]] = {}
    unknown: Dict[str, str] = {}  # site name -> why it has no profile here
    of_run: Dict[str, Site] = {}
    counts: Dict[Tuple[str, str], int] = {}
    notes = []
    for run in runs:
        source = KEPT
        try:
            site = kept_profile(run, validated)
        except DlaunchError as e:
            notes.append("the kept profile of run %s is not valid here, so its site's name is looked up (%s)" % (run.path, e))
            site = None
        if site is None and run.key.site != "-":
            source = BY_NAME
            if run.key.site not in named:
                try:
                    named[run.key.site] = resolve_site(run.key.site)
                except DlaunchError as e:
                    named[run.key.site], unknown[run.key.site] = None, str(e)
            site = named[run.key.site]
        if site is not None:
            of_run[run.path] = site
            counts[run.key.site, source] = counts.get((run.key.site, source), 0) + 1
    notes += ["site %r of the runs: no profile, so no reference verdicts or predictions (%s)" % (name, why)
              for name, why in sorted(unknown.items())]
    sources = ["%s: %s by %s" % (name, counted(n, "run"), source) for (name, source), n in sorted(counts.items())]
    return Profiles(of_run, sources, notes)


def markdown_report(results: Sequence[GroupResult], profiles: Profiles, rejected: Sequence[str],
                    notes: Sequence[str], diverged: Sequence[Run] = (), recorded: Optional["Recorded"] = None,
                    rcp: Sequence[RCPVerdict] = (), apart: SetApart = SetApart(),
                    plots: Optional[Dict[str, str]] = None, inputs: Sequence[str] = ()) -> str:
    """`recorded`: the results database's history verdicts and rows; `rcp`: the convergence verdicts per
    global batch; `apart`: the runs listed apart; `plots`: the figures written (file -> title); `inputs`:
    the paths reported on."""
    recorded = recorded or Recorded()
    n_runs = sum(len(g.runs) for g in results)
    columns = Columns.of([r for g in results for r in g.runs], history=bool(recorded.history))
    excluded = apart.excluded()
    parts = [
        "# dlaunch report",
        "%s in %s; %s apart; %s rejected." % (counted(n_runs, "run"), counted(len(results), "group"),
                                               counted(len(diverged), "diverged run"), counted(len(rejected), "file"))
        + ("" if apart.off_included or not apart.off else " %d run(s) off their network apart." % len(apart.off))
        + ("" if apart.flagged_included or not apart.flagged
           else " %d run(s) with a straggler or a throttled GPU apart." % len(apart.flagged)),
        "## Scaling",
        markdown_table(columns.scaling_headers(), [(g.key.label, scaling_rows(g, columns)) for g in results]),
        "## Runs",
        markdown_table(columns.run_headers(), [(g.key.label, run_rows(g, profiles, columns, recorded.history)) for g in results]),
    ]
    explained = [g for g in results if g.explained]
    if explained:
        parts += ["## Efficiency budget",
                  "Per GPU count, from ideal (1.000) to the measured E_G: the share of the ideal lost to each cause "
                  "(communication, stragglers, data, epoch overhead, other) against the group's reference G_ref "
                  "(definitions below); the parts and E_G add up to 1.",
                  markdown_table(BUDGET_HEADERS, [(g.key.label, budget_rows(g)) for g in explained])]
    if rcp:
        parts += ["## Convergence against MLPerf's reference convergence points",
                  markdown_table(RCP_HEADERS, [(v.label, [row]) for v, row in zip(rcp, rcp_rows(rcp))]),
                  "ResNet-50 on ImageNet, epochs to MLPerf's target of 75.9%% top-1 per global batch, against "
                  "the RCPs of %s (method: dlaunch/analysis/convergence.py)." % RCP_SOURCE]
    plots = plot_titles(results) if plots is None else plots
    parts += ["## Plots", "\n\n".join([*(["_%s_" % note] if (note := left_out(results)) else []),
                                       *("![%s](%s)" % (title, name) for name, title in plots.items())])
              or "No figure: no run has data to draw."]
    kernel_rows = [(g.key.label, [[str(r.world_size)] + ["%.1f" % (100 * v) for v in (
        r.kernel_shares.comm, r.kernel_shares.compute, r.kernel_shares.io,
        1 - r.kernel_shares.comm - r.kernel_shares.compute - r.kernel_shares.io)]
        for r in sorted(g.runs, key=lambda r: r.world_size) if r.kernel_shares]) for g in results]
    if any(rows for _, rows in kernel_rows):
        parts += ["## Kernel time shares (percent of CUDA kernel time)",
                  markdown_table(KERNEL_HEADERS, [(label, rows) for label, rows in kernel_rows if rows])]
    if apart.flagged:
        parts += ["## Stragglers and throttled GPUs", flagged_note(apart.flagged, apart.flagged_included, apart.threshold) + ".",
                  markdown_table(FLAGGED_HEADERS, [(r.key.label, flagged_rows([r], apart.flags)) for r in apart.flagged])]
    if diverged:
        parts += ["## Diverged runs", "Left out of every table and plot above.",
                  markdown_table(DIVERGED_HEADERS, [(r.key.label, diverged_rows([r])) for r in diverged])]
    if apart.off:
        parts += ["## Runs off their network", off_network_note(apart.off, apart.off_included) + ".",
                  markdown_table(OFF_NETWORK_HEADERS, [(r.key.label, off_network_rows([r], apart.problems)) for r in apart.off])]
    if rejected:
        parts += ["## Rejected files", "\n".join("- `%s`" % msg for msg in rejected)]
    if notes:
        parts += ["## Notes", "\n".join("- %s" % note for note in notes)]
    parts += ["## Definitions", DEFINITIONS.rstrip()]
    everything = [r for g in results for r in g.runs] + list(diverged) + excluded
    parts += ["## Provenance", provenance_text(everything, profiles, recorded, inputs)]
    return "\n\n".join(parts) + "\n"


PROVENANCE_HEADERS = ["run", "started", "image", "git revision", "versions", "job id", "metrics file"]


def provenance_text(runs: Sequence[Run], profiles: Profiles, recorded: "Recorded", inputs: Sequence[str]) -> str:
    """Who made the report from what, and per run what it ran (from the results database's rows)."""
    lines = ["- Made by dlaunch %s (`dlaunch report`) from %s under %s." % (
        __version__, counted(len(runs), "metrics file"), ", ".join("`%s`" % p for p in inputs) or "-")]
    lines += ["- Site profiles: %s." % ("; ".join(profiles.sources) or "none")]
    rows = []
    for run in sorted(runs, key=lambda r: (r.key, r.world_size, r.path)):
        row = recorded.rows.get(run.path)
        if row is None:
            rows.append((run.key.label, [[Path(run.path).parent.name, "-", "-", "-", "-", "-", run.path]]))
            continue
        versions = ", ".join("%s %s" % item for item in sorted(row["pins"].items())) or "-"
        rows.append((run.key.label, [[Path(run.path).parent.name, row["started"], row["image"] or "-",
                                      row["provenance"].get("git_revision") or "-", versions,
                                      row["provenance"].get("job_id") or "-", run.path]]))
    missing = sum(1 for r in runs if r.path not in recorded.rows)
    why = [] if not missing else ["%s without a row in the results database (running, or the database was not "
                                  "written): '-'." % counted(missing, "run")]
    return "\n".join(lines) + "\n\n" + "\n\n".join(why + [markdown_table(PROVENANCE_HEADERS, rows)])


def build_results(runs: Sequence[Run], profiles: Profiles) -> List[GroupResult]:
    """Groups of the runs that did not diverge, with their scaling points, predictions and efficiency budget
    (the caller has left out the runs the report sets apart: stragglers, off their network)."""
    results = []
    for key, group in group_runs((r for r in runs if not r.diverged), include_stragglers=True).items():
        points = scaling(group, include_stragglers=True)
        results.append(GroupResult(key, group, points, _group_predictions(group, points, profiles.of_group(group)),
                                   budget(group, include_stragglers=True)))
    return results


@dataclass(frozen=True)
class Recorded:
    """What the results database says of the report's runs (metrics file -> ...)."""

    history: Dict[str, str] = field(default_factory=dict)  # the history verdict, where a run has enough history
    rows: Dict[str, Dict] = field(default_factory=dict)  # its row (ended runs)


def record_runs(metrics_files: Sequence[str]) -> Recorded:
    """Record the ended runs among `metrics_files` in the results database; their rows and history verdicts."""
    from dlaunch.resultsdb.compare import with_history
    from dlaunch.resultsdb.store import ResultsDB, db_path, record

    recorded = record([Path(f) for f in metrics_files])
    if recorded.warning:
        Console(stderr=True, soft_wrap=True).print("dlaunch: warning: %s" % recorded.warning, markup=False, highlight=False)
        return Recorded()
    with ResultsDB(db_path()) as store:
        everything = store.rows()
    wanted = {os.path.abspath(f): f for f in metrics_files}
    mine = [r for r in everything if r["provenance"]["metrics_file"] in wanted]
    history = {wanted[r["provenance"]["metrics_file"]]: r["history"] for r in with_history(mine, everything) if r["history"]}
    return Recorded(history, {wanted[r["provenance"]["metrics_file"]]: r for r in mine})


def write_report(output: Path, results: Sequence[GroupResult], profiles: Profiles, rejected: Sequence[str],
                 notes: Sequence[str], diverged: Sequence[Run] = (), recorded: Optional[Recorded] = None,
                 rcp: Sequence[RCPVerdict] = (), apart: SetApart = SetApart(), inputs: Sequence[str] = ()) -> None:
    """report.md, report.html and the plots into `output` (created), each file written atomically."""
    output.mkdir(parents=True, exist_ok=True)
    plots = write_plots(output, results)
    write_atomic(output / "report.md", markdown_report(results, profiles, rejected, notes, diverged, recorded, rcp, apart,
                                                       plots, inputs))
    write_page(output)


SCALING_LEAVE_OUT = ["images/s range", "E_G range", "J/img range", "spread", "nodes", "runs", "data %", "compute %",
                     "comm %", "time to target s", "epochs to target", "TTA S_G", "J/img", "pred. E_G"]
RUN_LEAVE_OUT = ["schedule", "global batch", "energy to acc. kJ", "kJ/epoch", "energy kJ", "time to acc. s",
                 "epochs to target", "J/img", "best top-1", "history", "status"]
BUDGET_LEAVE_OUT = ["step ms"]
CONSOLE_GROUPS = 10  # groups printed as tables of their own; more: a line per group, the tables in the files


def print_table(console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                leave_out: Sequence[str] = ()) -> None:
    """A table that fits the console without cutting a name (tables.fit_table), leaving out first what a
    reader came for least; report.md and report.html keep every column. Printed with wrapping on, so that its
    caption (what it left out) wraps at spaces too."""
    table = fit_table(title, headers, rows, console.width, leave_out=[h for h in leave_out if h in headers])
    console.print(table, soft_wrap=False)


SUMMARY_HEADERS = ["group", "runs", "GPUs", "images/s", "E_G"]


def summary_rows(results: Sequence[GroupResult]) -> List[List[str]]:
    """Per group: its runs, its GPU counts and images/s and E_G at the largest."""
    rows = []
    for g in results:
        last = g.points[-1] if g.points else None
        counts = "%d-%d" % (g.points[0].gpus, last.gpus) if last else "-"
        rows.append([g.key.label, str(len(g.runs)), counts, _number(last.images_per_s if last else None),
                     _number(last.efficiency if last else None, "%.3f")])
    return rows


def print_results(console: Console, results: Sequence[GroupResult], profiles: Profiles, recorded: Recorded) -> None:
    """Per group its scaling, runs and budget tables; beyond CONSOLE_GROUPS groups one line per group (images/s
    and E_G at its largest GPU count), every table in report.md and report.html."""
    if len(results) > CONSOLE_GROUPS:
        print_table(console, "%d groups: images/s and E_G at each group's largest GPU count (every table: report.md, "
                             "report.html)" % len(results), SUMMARY_HEADERS, summary_rows(results))
        return
    columns = Columns.of([r for g in results for r in g.runs], history=bool(recorded.history))
    for g in results:
        print_table(console, g.key.label, columns.scaling_headers(), scaling_rows(g, columns), SCALING_LEAVE_OUT)
        rows = [row[:-1] for row in run_rows(g, profiles, columns, recorded.history)]  # metrics file paths: report.md
        print_table(console, g.key.label + ": runs", columns.run_headers()[:-1], rows, RUN_LEAVE_OUT)
        if g.explained:
            print_table(console, g.key.label + ": efficiency budget", BUDGET_HEADERS, budget_rows(g), BUDGET_LEAVE_OUT)


def fraction(text: str) -> float:
    """A typer `parser` for --straggler-threshold: a number strictly between 0 and 1."""
    value = finite_number()(text)
    try:
        check_threshold(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return value


@dataclass(frozen=True)
class ReportData:
    """What a report shows, before it is printed or written: its groups (scaling points, predictions,
    efficiency budget), the runs it sets apart and why, the notes (those on the runs set apart: `apart.notes()`)."""

    loaded: Loaded
    profiles: Profiles
    results: List[GroupResult]
    apart: SetApart
    diverged: List[Run]
    notes: List[str]
    recorded: Recorded
    rcp: List[RCPVerdict]


def report_data(loaded: Loaded, paths: Sequence[Path], site: Optional[str] = None, include_network_mismatches: bool = False,
                include_stragglers: bool = False, straggler_threshold: Optional[float] = None) -> ReportData:
    """The report of `loaded` (read from `paths`) without printing or writing it (the ended runs are recorded in
    the results database); DlaunchError when no metrics file was valid."""
    if not loaded.runs:
        raise DlaunchError("no valid metrics files in %s" % ", ".join(str(p) for p in paths))
    profiles = load_profiles(loaded.runs, site)
    problems = off_network(loaded.runs, profiles)
    flags = flagged(loaded.runs, profiles, straggler_threshold)
    apart = SetApart([r for r in loaded.runs if r.path in problems], problems, include_network_mismatches,
                     [r for r in loaded.runs if r.path in flags], flags, include_stragglers, straggler_threshold)
    excluded = {r.path for r in apart.excluded()}
    results = build_results([r for r in loaded.runs if r.path not in excluded], profiles)
    reported = [r for g in results for r in g.runs]
    notes = profiles.notes + missing_references(reported, profiles) + steps_only_note(reported)
    recorded = record_runs([r.path for r in loaded.runs])
    rcp = rcp_verdicts({g.key.label: g.runs for g in results})
    return ReportData(loaded, profiles, results, apart, [r for r in loaded.runs if r.diverged], notes, recorded, rcp)


def report_command(
    paths: Annotated[List[Path], typer.Argument(help="Run directories (searched recursively for metrics.jsonl) or metrics files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for report.md, report.html and the PNG plots.")] = Path("report"),
    site: Annotated[Optional[str], typer.Option(help="Site profile (name or TOML path) for every run; default: the one each run's directory kept (site.toml), else its site's name.")] = None,
    include_network_mismatches: Annotated[bool, typer.Option(
        "--include-network-mismatches", help="keep runs whose network is not the site's [network] in the tables and plots")] = False,
    include_stragglers: Annotated[bool, typer.Option(
        "--include-stragglers", help="keep runs with a straggler or a throttled GPU in the tables and plots (their E_G is understated)")] = False,
    straggler_threshold: Annotated[Optional[float], typer.Option(
        parser=fraction, help="a rank computing this fraction slower than the median rank is a straggler (default: each run's site profile's straggler_threshold, else 0.1)")] = None,
) -> None:
    """Turn run directories into the study's tables, report.md, report.html (one page to share) and plots.

    Exit code 0; 1 when some metrics files were rejected (each named on stderr, the rest reported);
    2 on bad input (nothing written).
    """
    output_folder("--output", output)  # before anything is read or written
    loaded = load_runs(str(p) for p in paths)
    console, errors = Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)
    for message in loaded.rejected:
        errors.print("rejected: %s" % escape(message), markup=False, highlight=False)
    data = report_data(loaded, paths, site, include_network_mismatches, include_stragglers, straggler_threshold)
    rcp, apart, diverged = data.rcp, data.apart, data.diverged
    print_results(console, data.results, data.profiles, data.recorded)
    if rcp:
        print_table(console, "convergence against MLPerf's RCPs (%s)" % RCP_SOURCE, ["group"] + RCP_HEADERS,
                    [[v.label] + row for v, row in zip(rcp, rcp_rows(rcp))], ["min epochs", "RCP mean", "runs", "RCP"])
    if apart.flagged:
        rows = [[r.key.label] + row[:-1] for r in apart.flagged for row in flagged_rows([r], apart.flags)]
        print_table(console, "runs with a straggler or a throttled GPU", ["group"] + FLAGGED_HEADERS[:-1], rows)
    if diverged:
        rows = [[r.key.label] + row[:-1] for r in diverged for row in diverged_rows([r])]
        print_table(console, "diverged runs (left out of every table above)", ["group"] + DIVERGED_HEADERS[:-1], rows, ["epochs"])
    if apart.off:
        rows = [[r.key.label] + row[:-1] for r in apart.off for row in off_network_rows([r], apart.problems)]
        print_table(console, "runs off their network", ["group"] + OFF_NETWORK_HEADERS[:-1], rows)
    notes = data.notes + apart.notes()
    for note in notes:
        errors.print("note: %s" % note, markup=False, highlight=False)
    write_report(output, data.results, data.profiles, loaded.rejected, notes, diverged, data.recorded, rcp, apart, [str(p) for p in paths])
    console.print("wrote %s and %s" % (output / "report.md", output / PAGE), markup=False, highlight=False)
    if loaded.rejected:
        raise typer.Exit(1)


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
                rows.append([c.label, str(gpus), _number(published.get(gpus), "%.3g"), label,
                             *([_number(v, "%.3g") for v in (s.median, s.low, s.high)] + [str(s.n), s.kind] if s else ["-"] * 5)])
    return rows


def write_comparison(output: Path, comparisons: Sequence[Comparison], sources: Sequence[str],
                     design: Sequence[str] = (), assumptions: Sequence[str] = ()) -> Optional[Path]:
    """The published-vs-this-run plot into `output` (when the study compares with published data; returned),
    and its table appended to `output`/report.md (report.html made again from it), after the study's design
    lines (protocol, stack) and its assumptions (what the sources leave unstated)."""
    plot = output / COMPARISON_PLOT
    if comparisons:
        write_comparison_plot(output, comparisons)
    elif plot.is_file() and not plot.is_symlink():
        plot.unlink()  # an earlier report's
    section = "\n\n".join([
        "## Published vs this run",
        "Sources:\n" + "\n".join("- %s" % s for s in sources),
        *(["\n".join(design)] if design else []),
        *(["Assumptions (values the sources leave unstated, fixed by this study):\n" + "\n".join("- %s" % a for a in assumptions)]
          if assumptions else []),
        markdown_table(COMPARISON_HEADERS[1:], [(row[0], [row[1:]]) for row in comparison_rows(comparisons)]).replace(
            "| group |", "| comparison |", 1),
        "![%s](%s)" % (COMPARISON_TITLE, COMPARISON_PLOT) if comparisons else "The study compares with no published data.",
    ])
    report = output / "report.md"
    previous = report.read_text(encoding="utf-8") if report.is_file() else ""
    write_atomic(report, previous + "\n" + section + "\n")
    write_page(output)
    return plot if comparisons else None
