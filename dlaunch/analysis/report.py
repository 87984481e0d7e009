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

from dlaunch import __version__
from dlaunch.analysis.scaling import Comparison, GroupKey, Run, ScalingPoint, Spread, group_runs, load_runs, reference_for, scaling, verdict
from dlaunch.analysis.convergence import RCP_SOURCE, RCPVerdict, rcp_verdicts
from dlaunch.analysis.html import PAGE, write_page
from dlaunch.analysis.plots import COMPARISON_PLOT, COMPARISON_TITLE, plot_titles, write_comparison_plot, write_plots
from dlaunch.atomic import write_atomic
from dlaunch.boundary import MAX_FILE_BYTES, decode, escape, output_folder, parse_toml, read_bytes, validate
from dlaunch.errors import DlaunchError
from dlaunch.analysis.perfmodel import MODEL_PARAMS_M, Prediction, Workload, gradient_bytes, interconnect_of_site, predict
from dlaunch.jobs.sites import Site, resolve_site
from dlaunch.runs.network import network_problems
from dlaunch.tables import fit_table, markdown

KEPT_PROFILE = "site.toml"  # the profile text a run directory keeps (dlaunch/runs/rundir.py's SITE_PROFILE)
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


def missing_references(runs: Sequence[Run], profiles: "Profiles") -> List[str]:
    """One note per site, model, GPU count and precision whose runs have no reference to be judged by."""
    missing: Dict[Tuple[str, str, int, str], int] = {}
    for run in runs:
        site = profiles.of(run)
        if site is not None and run.throughput is not None and reference_for(run, site.reference) is None:
            key = (site.name, run.key.model, run.world_size, run.amp)
            missing[key] = missing.get(key, 0) + 1
    return ["site %s has no [[reference]] for %s on %d GPUs%s: no verdict for %d run(s)"
            % (name, model, gpus, "" if amp == "none" else " with --amp %s" % amp, n)
            for (name, model, gpus, amp), n in sorted(missing.items())]


def run_rows(g: GroupResult, profiles: "Profiles", columns: Columns, history: Optional[Dict[str, str]] = None) -> List[List[str]]:
    """`history`: metrics file -> history verdict (dlaunch/results/compare.py)."""
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


KEPT = "the profile their run directories kept (%s)" % KEPT_PROFILE
BY_NAME = "the profile of that name found here"


def kept_profile(run: Run, validated: Dict[bytes, Site]) -> Optional[Site]:
    """The profile text `run`'s directory kept (None: it kept none); `validated` caches profiles by text
    (a sweep's runs keep the same one). DlaunchError naming the file when it is no valid profile."""
    path = Path(run.path).parent / KEPT_PROFILE
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
    sources = ["%s: %d run(s) by %s" % (name, n, source) for (name, source), n in sorted(counts.items())]
    return Profiles(of_run, sources, notes)


def markdown_report(results: Sequence[GroupResult], profiles: Profiles, rejected: Sequence[str],
                    notes: Sequence[str], diverged: Sequence[Run] = (), recorded: Optional["Recorded"] = None,
                    rcp: Sequence[RCPVerdict] = (), off: Sequence[Run] = (),
                    problems: Optional[Dict[str, List[str]]] = None, off_included: bool = False,
                    plots: Optional[Dict[str, str]] = None, inputs: Sequence[str] = ()) -> str:
    """`recorded`: the results database's history verdicts and rows; `rcp`: the convergence verdicts per
    global batch; `off`: the runs off their network (`problems`: metrics file -> how), left out of the
    tables unless `off_included`; `plots`: the figures written (file -> title); `inputs`: the paths reported on."""
    recorded = recorded or Recorded()
    n_runs = sum(len(g.runs) for g in results)
    columns = Columns.of([r for g in results for r in g.runs], history=bool(recorded.history))
    parts = [
        "# dlaunch report",
        "%d run(s) in %d group(s); %d diverged run(s) apart; %d file(s) rejected." % (n_runs, len(results), len(diverged), len(rejected))
        + ("" if off_included or not off else " %d run(s) off their network apart." % len(off)),
        "## Scaling",
        markdown_table(columns.scaling_headers(), [(g.key.label, scaling_rows(g, columns)) for g in results]),
        "## Runs",
        markdown_table(columns.run_headers(), [(g.key.label, run_rows(g, profiles, columns, recorded.history)) for g in results]),
    ]
    if rcp:
        parts += ["## Convergence against MLPerf's reference convergence points",
                  markdown_table(RCP_HEADERS, [(v.label, [row]) for v, row in zip(rcp, rcp_rows(rcp))]),
                  "ResNet-50 on ImageNet, epochs to MLPerf's target of 75.9%% top-1 per global batch, against "
                  "the RCPs of %s (method: dlaunch/analysis/convergence.py)." % RCP_SOURCE]
    plots = plot_titles(results) if plots is None else plots
    parts += ["## Plots", "\n\n".join("![%s](%s)" % (title, name) for name, title in plots.items())
              or "No figure: no run has data to draw."]
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
    parts += ["## Definitions", DEFINITIONS.rstrip()]
    everything = [r for g in results for r in g.runs] + list(diverged) + [r for r in off if not off_included]
    parts += ["## Provenance", provenance_text(everything, profiles, recorded, inputs)]
    return "\n\n".join(parts) + "\n"


PROVENANCE_HEADERS = ["run", "started", "image", "git revision", "versions", "job id", "metrics file"]


def provenance_text(runs: Sequence[Run], profiles: Profiles, recorded: "Recorded", inputs: Sequence[str]) -> str:
    """Who made the report from what, and per run what it ran (from the results database's rows)."""
    lines = ["- Made by dlaunch %s (`dlaunch report`) from %d metrics file(s) under %s." % (
        __version__, len(runs), ", ".join("`%s`" % p for p in inputs) or "-")]
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
    why = [] if not missing else ["%d run(s) without a row in the results database (running, or the database "
                                  "was not written) show '-'." % missing]
    return "\n".join(lines) + "\n\n" + "\n\n".join(why + [markdown_table(PROVENANCE_HEADERS, rows)])


def build_results(runs: Sequence[Run], profiles: Profiles) -> List[GroupResult]:
    """Groups of the runs that did not diverge, with their scaling points and predictions."""
    results = []
    for key, group in group_runs(r for r in runs if not r.diverged).items():
        points = scaling(group)
        results.append(GroupResult(key, group, points, _group_predictions(group, points, profiles.of_group(group))))
    return results


@dataclass(frozen=True)
class Recorded:
    """What the results database says of the report's runs (metrics file -> ...)."""

    history: Dict[str, str] = field(default_factory=dict)  # the history verdict, where a run has enough history
    rows: Dict[str, Dict] = field(default_factory=dict)  # its row (ended runs)


def record_runs(metrics_files: Sequence[str]) -> Recorded:
    """Record the ended runs among `metrics_files` in the results database; their rows and history verdicts."""
    from dlaunch.results.compare import with_history
    from dlaunch.results.store import ResultsDB, db_path, record

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
                 rcp: Sequence[RCPVerdict] = (), off: Sequence[Run] = (),
                 problems: Optional[Dict[str, List[str]]] = None, off_included: bool = False,
                 inputs: Sequence[str] = ()) -> None:
    """report.md, report.html and the plots into `output` (created), each file written atomically."""
    output.mkdir(parents=True, exist_ok=True)
    plots = write_plots(output, results)
    text = markdown_report(results, profiles, rejected, notes, diverged, recorded, rcp, off, problems, off_included,
                           plots, inputs)
    write_atomic(output / "report.md", text)
    write_page(output)


SCALING_LEAVE_OUT = ["images/s range", "E_G range", "J/img range", "spread", "nodes", "runs", "data %", "compute %",
                     "comm %", "time to target s", "epochs to target", "TTA S_G", "J/img", "pred. E_G"]
RUN_LEAVE_OUT = ["schedule", "global batch", "energy to acc. kJ", "kJ/epoch", "energy kJ", "time to acc. s",
                 "epochs to target", "J/img", "best top-1", "history", "status"]


def print_table(console: Console, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                leave_out: Sequence[str] = ()) -> None:
    """A table that fits the console without cutting a name (tables.fit_table), leaving out first what a
    reader came for least; report.md and report.html keep every column. Printed with wrapping on, so that its
    caption (what it left out) wraps at spaces too."""
    table = fit_table(title, headers, rows, console.width, leave_out=[h for h in leave_out if h in headers])
    console.print(table, soft_wrap=False)


def report_command(
    paths: Annotated[List[Path], typer.Argument(help="Run directories (searched recursively for metrics.jsonl) or metrics files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for report.md, report.html and the PNG plots.")] = Path("report"),
    site: Annotated[Optional[str], typer.Option(help="Site profile (name or TOML path) for every run; default: the one each run's directory kept (site.toml), else its site's name.")] = None,
    include_network_mismatches: Annotated[bool, typer.Option(
        "--include-network-mismatches", help="keep runs whose network is not the site's \\[network] in the tables and plots")] = False,
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
    if not loaded.runs:
        raise DlaunchError("no valid metrics files in %s" % ", ".join(str(p) for p in paths))
    profiles = load_profiles(loaded.runs, site)
    notes = list(profiles.notes)
    problems = off_network(loaded.runs, profiles)
    off = [r for r in loaded.runs if r.path in problems]
    results = build_results([r for r in loaded.runs if include_network_mismatches or r.path not in problems], profiles)
    notes += missing_references([r for g in results for r in g.runs], profiles)
    diverged = [r for r in loaded.runs if r.diverged]
    recorded = record_runs([r.path for r in loaded.runs])
    rcp = rcp_verdicts({g.key.label: g.runs for g in results})
    columns = Columns.of([r for g in results for r in g.runs], history=bool(recorded.history))
    for g in results:
        print_table(console, g.key.label, columns.scaling_headers(), scaling_rows(g, columns), SCALING_LEAVE_OUT)
        rows = [row[:-1] for row in run_rows(g, profiles, columns, recorded.history)]  # metrics file paths: report.md
        print_table(console, g.key.label + ": runs", columns.run_headers()[:-1], rows, RUN_LEAVE_OUT)
    if rcp:
        print_table(console, "convergence against MLPerf's RCPs (%s)" % RCP_SOURCE, ["group"] + RCP_HEADERS,
                    [[v.label] + row for v, row in zip(rcp, rcp_rows(rcp))], ["min epochs", "RCP mean", "runs", "RCP"])
    if diverged:
        rows = [[r.key.label] + row[:-1] for r in diverged for row in diverged_rows([r])]
        print_table(console, "diverged runs (left out of every table above)", ["group"] + DIVERGED_HEADERS[:-1], rows, ["epochs"])
    if off:
        rows = [[r.key.label] + row[:-1] for r in off for row in off_network_rows([r], problems)]
        print_table(console, "runs off their network", ["group"] + OFF_NETWORK_HEADERS[:-1], rows)
        notes.append(off_network_note(off, include_network_mismatches))
    for note in notes:
        errors.print("note: %s" % note, markup=False, highlight=False)
    write_report(output, results, profiles, loaded.rejected, notes, diverged, recorded, rcp, off, problems,
                 include_network_mismatches, [str(p) for p in paths])
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
