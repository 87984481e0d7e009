"""The report's data (`report_data`): run directories' metrics -> groups (scaling points, the model's predictions,
the efficiency budget, each point's measurement-quality verdict: doubtful points set apart unless included), the site
profile each run is judged by, the runs set apart (diverged, with a straggler or a throttled GPU, off their network),
the notes, the results database's rows and history verdicts, and the convergence
verdicts. Rendering it: dlaunch/reporting/document.py (report.md, report.html, plots); printing it: dlaunch/cli/report.py.

Each run is judged by the site profile it was made from: the text its run directory kept (`site.toml`), else the
profile of its site's name found here, or every run by `--site`.
"""

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from dlaunch.analysis.budget import OTHER, BudgetRow, budget
from dlaunch.analysis.convergence import RCPVerdict, rcp_verdicts
from dlaunch.analysis.perfmodel.model import (
    MODEL_PARAMS_M,
    Prediction,
    Workload,
    gradient_bytes,
    interconnect_of_site,
    predict,
)
from dlaunch.analysis.quality import INCLUDE_OPTION, PointQuality, judge_runs, threshold_text, unequal_threads
from dlaunch.analysis.scaling import GroupKey, Loaded, Run, ScalingPoint, group_runs, reference_for, scaling
from dlaunch.analysis.stragglers import Flag, flagged, kept_profile
from dlaunch.errors import DlaunchError, DlaunchWarning
from dlaunch.jobs.network import network_problems
from dlaunch.jobs.sites import Site, resolve_site
from dlaunch.paths import SITE_PROFILE
from dlaunch.tables import counted
from dlaunch.thresholds import DEFAULT_THRESHOLD


@dataclass
class GroupResult:
    key: GroupKey
    runs: List[Run]
    points: List[ScalingPoint]  # those its tables and plots show (doubtful ones only with --include-doubtful)
    predictions: Dict[int, Prediction] = field(default_factory=dict)
    budget: List[BudgetRow] = field(default_factory=list)  # the rows of `points`
    quality: Dict[int, PointQuality] = field(default_factory=dict)  # every count's verdict
    doubtful: List[ScalingPoint] = field(default_factory=list)  # those `quality` doubts (in `points` if included)

    @property
    def explained(self) -> bool:
        """Whether its budget names a cause somewhere: some GPU count's runs and the reference's recorded phases."""
        return any(v is not None for row in self.budget[1:] for part, v in row.lost.items() if part != OTHER)


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


def load_profiles(runs: Sequence[Run], override: Optional[str]) -> Profiles:
    """Each run's profile: `override` (--site) for all; else the one its directory kept; else its site's name here."""
    if override:
        site = resolve_site(override)  # a bad --site is bad input
        return Profiles({r.path: site for r in runs}, ["every run: --site %s (%s)" % (override, site.name)], [])
    named: Dict[str, Optional[Site]] = {}
    unknown: Dict[str, str] = {}  # site name -> why it has no profile here
    of_run: Dict[str, Site] = {}
    counts: Dict[Tuple[str, str], int] = {}
    notes = []
    for run in runs:
        source = KEPT
        try:
            site = kept_profile(Path(run.path).parent)
        except DlaunchError as e:
            notes.append(
                "the kept profile of run %s is not valid here, so its site's name is looked up (%s)" % (run.path, e)
            )
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
    notes += [
        "site %r of the runs: no profile, so no reference verdicts or predictions (%s)" % (name, why)
        for name, why in sorted(unknown.items())
    ]
    sources = ["%s: %s by %s" % (name, counted(n, "run"), source) for (name, source), n in sorted(counts.items())]
    return Profiles(of_run, sources, notes)


def _group_predictions(
    runs: Sequence[Run], points: Sequence[ScalingPoint], site: Optional[Site]
) -> Dict[int, Prediction]:
    """The model's curve over the group's GPU counts, from the reference point's profile."""
    network = interconnect_of_site(site) if site else None
    if network is None or not points or runs[0].key.model not in MODEL_PARAMS_M:
        return {}
    g_ref = points[0].gpus
    profiled = [r for r in runs if r.world_size == g_ref and r.profile is not None]
    if not profiled:
        return {}
    profile = profiled[0].profile
    workload = Workload(
        profile.compute_s, runs[0].key.batch_per_worker, gradient_bytes(runs[0].key.model), profile.data_s
    )
    return {p.gpus: p for p in predict(workload, network, [pt.gpus for pt in points])}


def build_results(
    runs: Sequence[Run],
    profiles: Profiles,
    noise_threshold: Optional[float] = None,
    include_doubtful: bool = False,
    flags: Optional[Dict[str, List[Flag]]] = None,
) -> List[GroupResult]:
    """Groups of the runs that did not diverge, with their scaling points, predictions, efficiency budget and quality
    verdict (the caller has left out the runs the report sets apart: stragglers, off their network; `flags`: those of
    the runs it kept). Points the verdict doubts leave the points and the budget unless `include_doubtful`."""
    results = []
    for key, group in group_runs(r for r in runs if not r.diverged).items():
        points = scaling(group)
        quality = judge_runs(group, noise_threshold, flags)
        shown = [p for p in points if include_doubtful or not quality[p.gpus].doubtful]
        counts = {p.gpus for p in shown}
        results.append(
            GroupResult(
                key,
                group,
                shown,
                _group_predictions(group, points, profiles.of_group(group)),
                [row for row in budget(group) if row.gpus in counts],
                quality,
                [p for p in points if quality[p.gpus].doubtful],
            )
        )
    return results


def missing_references(runs: Sequence[Run], profiles: Profiles) -> List[str]:
    """One note per site, model, GPU count and precision whose runs have no reference to be judged by."""
    missing: Dict[Tuple[str, str, int, str, str], int] = {}
    for run in runs:
        site = profiles.of(run)
        if site is not None and run.throughput is not None and reference_for(run, site.reference) is None:
            key = (site.name, run.key.model, run.world_size, "GPU" if run.on_gpus else "worker", run.amp)
            missing[key] = missing.get(key, 0) + 1
    return [
        "site %s has no [[reference]] for %s on %s%s: no verdict for %s"
        % (name, model, counted(gpus, unit), "" if amp == "none" else " with --amp %s" % amp, counted(n, "run"))
        for (name, model, gpus, unit, amp), n in sorted(missing.items())
    ]


def off_network(runs: Sequence[Run], profiles: Profiles) -> Dict[str, List[str]]:
    """Metrics file -> how the run is off its site's `[network]`, for the runs that are."""
    found = {}
    for run in runs:
        site = profiles.of(run)
        problems = network_problems(run.network, site.network if site else None)
        if problems:
            found[run.path] = problems
    return found


def off_network_note(runs: Sequence[Run], included: bool) -> str:
    """What the report did with the runs that are off their network."""
    if included:
        return (
            "%d run(s) off their site's [network] are kept in the tables and plots (--include-network-mismatches): "
            "their throughput is not the fabric's" % len(runs)
        )
    return (
        "%d run(s) off their site's [network] are left out of the tables and plots "
        "(--include-network-mismatches keeps them)" % len(runs)
    )


def flagged_note(runs: Sequence[Run], included: bool, override: Optional[float]) -> str:
    """What the report did with the runs that have a straggler or a throttled GPU, and by which threshold."""
    threshold = (
        "--straggler-threshold %g" % override
        if override is not None
        else "each site profile's straggler_threshold (%g without one)" % DEFAULT_THRESHOLD
    )
    if included:
        return (
            "%d run(s) with a straggler or a throttled GPU (threshold: %s) are kept in the tables and plots "
            "(--include-stragglers): their E_G is understated" % (len(runs), threshold)
        )
    return (
        "%d run(s) with a straggler or a throttled GPU (threshold: %s) are left out of the tables and plots "
        "(--include-stragglers keeps them)" % (len(runs), threshold)
    )


def doubtful_note(results: Sequence[GroupResult], included: bool, threshold: Optional[float]) -> List[str]:
    """What the report did with the scaling points its quality verdict doubts, and by which threshold."""
    count = sum(len(g.doubtful) for g in results)
    if not count:
        return []
    what = (
        "%s doubted by the measurement-quality verdict (noisy, an unstable reference or E_G beyond noise; noise "
        "threshold %s) %s" % (counted(count, "scaling point"), threshold_text(threshold), "is" if count == 1 else "are")
    )
    if included:
        return ["%s kept in the tables and plots (%s): read with its verdict" % (what, INCLUDE_OPTION)]
    return [
        "%s left out of the tables, plots and budget (%s keeps them); Measurement quality says why"
        % (what, INCLUDE_OPTION)
    ]


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
    doubtful_included: bool = False  # --include-doubtful
    noise_threshold: Optional[float] = None  # --noise-threshold (None: each group's default)

    def excluded(self) -> List[Run]:
        """The runs that are in no table or plot."""
        left_out = ([] if self.off_included else list(self.off)) + ([] if self.flagged_included else list(self.flagged))
        return list({r.path: r for r in left_out}.values())

    def notes(self, results: Sequence[GroupResult] = ()) -> List[str]:
        """The notes on what was set apart: runs off their network, flagged runs, and `results`' doubtful points."""
        return (
            ([off_network_note(self.off, self.off_included)] if self.off else [])
            + ([flagged_note(self.flagged, self.flagged_included, self.threshold)] if self.flagged else [])
            + doubtful_note(results, self.doubtful_included, self.noise_threshold)
        )


STEPS_ONLY_SHOWN = 10  # runs named in the note on runs without epoch overhead


def steps_only_note(runs: Sequence[Run]) -> List[str]:
    """A note per kind of file whose images/s lacks epoch overhead, naming its runs: files of metrics versions 1-3
    (written before it was recorded), and version 4 files whose epochs hold none, by trainer (the TensorFlow and
    MXNet trainers record none)."""
    lacking: Dict[str, List[Run]] = {}
    for run in runs:
        if run.throughput is not None and not run.overhead_included:
            why = (
                "metrics version %d files, written before epoch overhead was recorded" % run.version
                if run.version < 4
                else "metrics version %d files of the %s trainer, whose epoch records hold no overhead"
                % (run.version, run.axes.engine if run.axes.engine != "-" else run.key.framework)
            )
            lacking.setdefault(why, []).append(run)
    return [
        "%s (%s) recorded no epoch overhead, so images/s is the steps-only rate: %s%s"
        % (
            counted(len(found), "run"),
            why,
            ", ".join(Path(r.path).parent.name for r in found[:STEPS_ONLY_SHOWN]),
            ", ..." if len(found) > STEPS_ONLY_SHOWN else "",
        )
        for why, found in sorted(lacking.items())
    ]


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
        warnings.warn(recorded.warning, DlaunchWarning, stacklevel=2)
        return Recorded()
    with ResultsDB(db_path()) as store:
        everything = store.rows()
    wanted = {os.path.abspath(f): f for f in metrics_files}
    mine = [r for r in everything if r["provenance"]["metrics_file"] in wanted]
    history = {
        wanted[r["provenance"]["metrics_file"]]: r["history"] for r in with_history(mine, everything) if r["history"]
    }
    return Recorded(history, {wanted[r["provenance"]["metrics_file"]]: r for r in mine})


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


def report_data(
    loaded: Loaded,
    paths: Sequence[Path],
    site: Optional[str] = None,
    include_network_mismatches: bool = False,
    include_stragglers: bool = False,
    straggler_threshold: Optional[float] = None,
    include_doubtful: bool = False,
    noise_threshold: Optional[float] = None,
) -> ReportData:
    """The report of `loaded` (read from `paths`) without printing or writing it (the ended runs are recorded in
    the results database); DlaunchError when no metrics file was valid."""
    if not loaded.runs:
        raise DlaunchError("no valid metrics files in %s" % ", ".join(str(p) for p in paths))
    profiles = load_profiles(loaded.runs, site)
    problems = off_network(loaded.runs, profiles)
    flags = flagged(loaded.runs, straggler_threshold, profiles.of)
    apart = SetApart(
        [r for r in loaded.runs if r.path in problems],
        problems,
        include_network_mismatches,
        [r for r in loaded.runs if r.path in flags],
        flags,
        include_stragglers,
        straggler_threshold,
        include_doubtful,
        noise_threshold,
    )
    excluded = {r.path for r in apart.excluded()}
    results = build_results(
        [r for r in loaded.runs if r.path not in excluded], profiles, noise_threshold, include_doubtful, flags
    )
    reported = [r for g in results for r in g.runs]
    notes = (
        profiles.notes
        + missing_references(reported, profiles)
        + steps_only_note(reported)
        + unequal_threads([g.key for g in results])
    )
    recorded = record_runs([r.path for r in loaded.runs])
    rcp = rcp_verdicts({g.key.label: g.runs for g in results})
    return ReportData(loaded, profiles, results, apart, [r for r in loaded.runs if r.diverged], notes, recorded, rcp)
