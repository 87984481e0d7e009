"""The measurement-quality verdict: per scaling group and GPU (or worker) count, whether its figures can be trusted,
and where they cannot, what the records say is the likely cause. One judgement for `dlaunch report` (its tables, plots
and budget set doubtful points apart unless --include-doubtful), `study report` and the results database (`results`:
the `quality` of each run's point).

Per count G of a group whose reference is G_ref (the smallest count; S_G = X_G / X_ref, E_G = S_G / (G / G_ref)):
- spread s(G): the width of the range the report shows for the point's images/s over their median (`Spread`: the
  min-max range below 6 runs, the distribution-free 95 % confidence interval of the median from 6 on), with the number
  of runs; a point of one run has no measured spread.
- noisy: s(G) > the noise threshold t (`threshold_of`: `--noise-threshold`, else HERE_NOISE for a group of runs a
  scheduler that runs jobs on this machine made (`--site local`: one shared machine), else DEFAULT_NOISE).
- unstable reference (every count but G_ref): s(G_ref) > t; S_G and E_G of the whole group divide by its median.
- implausible (every count but G_ref): E_G > 1 + the noise of the point and of its reference, n(G) + n(G_ref), where
  n is the measured spread, or t for a point of one run (its noise is not measured, and t is the most a point may
  have). With the same batch per GPU, G GPUs do at most G / G_ref times the reference's work per second: E_G above 1
  by more than the noise says the runs did not get the same per rank (threads, cores, a node, a quiet machine).

Why these statistics: repeats are few (a study's 3, `--repeat 5`), too few for a standard deviation to mean much, and
a throughput's noise is one-sided (a loaded machine or a slow node make runs slower, never faster), so the verdict
reads the range the report already prints beside the median (checkable in its table) and, from 6 runs, the interval
S_G and E_G are medians of. Relative to the median, so that one threshold serves any model and machine. The two
noises add because the relative error of a quotient X_G / X_ref is at most the sum of its parts' (first order).

Likely causes (`Facts` of each run, read from its metrics or its results-database row): unequal threads per rank
(recorded, or, where none were recorded for CPU ranks, different ranks per node: the trainer's default divides a
node's CPUs by them), different nodes (the reference's hosts are not the point's), a loaded machine (equal runs'
median-rank compute per step spread beyond t, or the reference's ranks computing slower per step than the point's,
which communication cannot explain), a straggler or throttled GPU (flagged runs kept by --include-stragglers), too few
steps (a run's images/s rests on fewer than MIN_STEPS measured steps).
"""

import math
from dataclasses import dataclass
from statistics import median
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from dlaunch.analysis.scaling import GroupKey, Run, Spread, group_runs, measured_runs
from dlaunch.analysis.stragglers import Flag, flag_kinds
from dlaunch.errors import DlaunchError

# The noise thresholds (README, "How to read the quality verdict"): a point whose runs spread more than this is not
# a measurement to publish; runs a scheduler made on this machine share it with whatever else runs on it
# (equal runs of the demo on a shared 2-core machine: 15-28 % in three batches of 5, as its profile's straggler
# threshold is 0.30 for the same reason).
DEFAULT_NOISE = 0.10
HERE_NOISE = 0.30
MIN_STEPS = 20  # measured steps below which a run's images/s is named as resting on too few
OPTION = "--noise-threshold"
INCLUDE_OPTION = "--include-doubtful"
OK, NOISY, UNSTABLE_REFERENCE, IMPLAUSIBLE = "ok", "noisy", "unstable reference", "implausible"


def check_noise(threshold: float) -> float:
    """`threshold`, a fraction in (0, 1); ValueError naming it otherwise."""
    if not 0.0 < threshold < 1.0:
        raise ValueError("noise threshold %r: must be a fraction in (0, 1)" % (threshold,))
    return threshold


def noise_option(value: Optional[float]) -> Optional[float]:
    """--noise-threshold as given (None: each group's, `threshold_of`), checked where the command line parses it and
    where an API function takes it: DlaunchError "Invalid value for '--noise-threshold': ..." when no fraction in
    (0, 1)."""
    if value is not None:
        try:
            check_noise(value)
        except ValueError as e:
            raise DlaunchError("Invalid value for '%s': %s" % (OPTION, e)) from None
    return value


def threshold_of(option: Optional[float], schedulers: Iterable[Optional[str]]) -> float:
    """The noise threshold a group is judged at: `option` (--noise-threshold) where given, else HERE_NOISE when a
    scheduler that runs its jobs on this machine (`Scheduler.this_machine`) made every run of it (`schedulers`: the
    headers' `scheduler`), else DEFAULT_NOISE."""
    from dlaunch.schedulers import SCHEDULERS, scheduler_for

    if option is not None:
        return option
    kinds = set(schedulers)
    here = bool(kinds) and all(k in SCHEDULERS and scheduler_for(k).this_machine for k in kinds)
    return HERE_NOISE if here else DEFAULT_NOISE


def threshold_text(option: Optional[float]) -> str:
    """The threshold the report judged by, for its notes."""
    if option is not None:
        return "%s %g" % (OPTION, option)
    return "%g, %g for runs made on this machine (--site local)" % (DEFAULT_NOISE, HERE_NOISE)


@dataclass(frozen=True)
class Facts:
    """What the verdict reads of one run (`facts_of` a Run; the results database builds them from its rows)."""

    name: str
    gpus: int  # its world size: GPUs, or worker processes of a CPU run
    images_per_s: float
    cpu: bool  # its ranks computed on CPUs
    threads: Optional[int]  # CPU threads per rank (None: not recorded)
    ranks_per_node: Optional[int]
    hosts: FrozenSet[str]
    measured_steps: Optional[int]
    compute_s: Optional[float]  # the median rank's compute per step (metrics version 4), None: not recorded
    flags: str = ""  # its straggler or throttled-GPU flags' kinds ("": none, or not judged)
    scheduler: Optional[str] = None  # the kind of scheduler that ran it (the header's; None: not recorded)


def facts_of(run: Run, flags: str = "") -> Facts:
    """A run's facts (it has a throughput: scaling.measured_runs)."""
    return Facts(
        run.path,
        run.world_size,
        run.throughput,  # type: ignore[arg-type]  # a measured run has a throughput (scaling.measured_runs)
        not run.on_gpus,
        run.threads,
        run.ranks_per_node,
        frozenset(run.hosts),
        run.measured_steps,
        run.phases.median.compute_s if run.phases else None,
        flags,
        run.scheduler,
    )


@dataclass(frozen=True)
class Problem:
    kind: str  # NOISY, UNSTABLE_REFERENCE or IMPLAUSIBLE
    detail: str  # the figures that make it one


@dataclass(frozen=True)
class PointQuality:
    """The verdict on one count of a group: its spread, its reference's, E_G against what noise allows, the problems
    and their likely causes."""

    gpus: int
    runs: int
    spread: Optional[float]  # relative (high - low) / median; None: one run
    spread_kind: str  # the range it is: 'min-max', '95% CI', '-' for one run
    reference_gpus: int
    reference_runs: int
    reference_spread: Optional[float]
    efficiency: float  # E_G (the median over its runs)
    allowance: float  # the noise E_G may show above 1 here (0 at the reference)
    threshold: float  # the noise threshold it was judged at (`threshold_of`)
    problems: Tuple[Problem, ...]
    causes: Tuple[str, ...]

    @property
    def doubtful(self) -> bool:
        """Whether the point is set apart from the tables and plots (unless included)."""
        return bool(self.problems)

    @property
    def verdict(self) -> str:
        """'ok', or the problems' kinds: 'noisy', 'unstable reference', 'implausible' (joined by ' and ')."""
        return " and ".join(p.kind for p in self.problems) or OK

    @property
    def why(self) -> str:
        """The problems' figures, then the likely causes ('' when ok)."""
        text = "; ".join(p.detail for p in self.problems)
        return text + ("; likely: %s" % "; ".join(self.causes) if self.causes else "")

    @property
    def line(self) -> str:
        """The verdict with its figures and causes, as one line."""
        return "%s: %s" % (self.verdict, self.why) if self.problems else OK


def relative_spread(values: Sequence[float]) -> Tuple[Optional[float], str]:
    """(the width of the shown range over the median, the range's kind); (None, '-') for one value."""
    if len(values) < 2:
        return None, "-"
    s = Spread.of(values)
    return ((s.high - s.low) / s.median if s.median > 0 else None), s.kind


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else "%.0f %%" % (100 * value)


def _spread_text(values: Sequence[float], spread: Optional[float], kind: str) -> str:
    return "images/s of %d runs %.1f-%.1f (%s: %s of the median %.1f)" % (
        len(values),
        min(values),
        max(values),
        kind,
        _percent(spread),
        median(values),
    )


def _ratio(a: float, b: float) -> str:
    return "%.2gx" % (a / b) if b > 0 else "-"


def causes(point: Sequence[Facts], reference: Sequence[Facts], threshold: float) -> List[str]:
    """The likely causes the records show, comparing the point's runs with the reference's (the same runs for the
    reference itself) and the runs of each among themselves."""
    found = []
    same = list(point) == list(reference)
    threads_here = {f.threads for f in point}
    threads_ref = {f.threads for f in reference}
    if not same and None not in threads_here | threads_ref and threads_here != threads_ref:
        found.append(
            "unequal threads per rank: %s at the reference, %s here (give every run the same --threads)"
            % ("/".join(map(str, sorted(threads_ref))), "/".join(map(str, sorted(threads_here))))  # type: ignore[type-var]  # None is not among them (tested above)
        )
    elif not same and any(f.cpu and f.threads is None for f in list(point) + list(reference)):
        ranks_here = {f.ranks_per_node for f in point}
        ranks_ref = {f.ranks_per_node for f in reference}
        if None not in ranks_here | ranks_ref and ranks_here != ranks_ref:
            found.append(
                "unequal threads per rank likely: none recorded, and the reference ran %s rank(s) per node, these %s: "
                "the trainer's default divides a node's CPUs by its ranks (give every run the same --threads)"
                % ("/".join(map(str, sorted(ranks_ref))), "/".join(map(str, sorted(ranks_here))))  # type: ignore[type-var]  # None is not among them (tested above)
            )
    hosts_ref = frozenset().union(*(f.hosts for f in reference))
    hosts_here = frozenset().union(*(f.hosts for f in point))
    if not same and hosts_ref and hosts_here and not hosts_ref <= hosts_here:
        found.append(
            "different nodes: the reference ran on %s, these runs on %s"
            % (", ".join(sorted(hosts_ref)), ", ".join(sorted(hosts_here)))
        )
    elif len({f.hosts for f in point}) > 1:
        found.append(
            "different nodes: its runs ran on %s" % "; ".join(sorted(", ".join(sorted(f.hosts)) for f in point))
        )
    for who, runs in (("its runs", point), ("the reference's runs", reference))[: 1 if same else 2]:
        computed = [f.compute_s for f in runs if f.compute_s is not None]
        spread, _ = relative_spread(computed)
        if spread is not None and spread > threshold:
            found.append(
                "a loaded machine: %s' median rank computed %.3g-%.3g s per step (%s apart), equal work"
                % (who, min(computed), max(computed), _percent(spread))
            )
    compute_here = [f.compute_s for f in point if f.compute_s is not None]
    compute_ref = [f.compute_s for f in reference if f.compute_s is not None]
    if not same and compute_here and compute_ref and median(compute_ref) > (1 + threshold) * median(compute_here):
        found.append(
            "a slower reference: its median rank computed %s as long per step as these ranks (a loaded machine or "
            "fewer threads while it ran; sharing cores with communication makes a rank slower, never faster)"
            % _ratio(median(compute_ref), median(compute_here))
        )
    flagged = sorted({f.flags for f in list(point) + ([] if same else list(reference)) if f.flags})
    if flagged:
        found.append("flagged runs among them (%s; kept by --include-stragglers)" % ", ".join(flagged))
    steps = [f.measured_steps for f in list(point) + ([] if same else list(reference)) if f.measured_steps is not None]
    if steps and min(steps) < MIN_STEPS:
        found.append(
            "too few steps: images/s over %d measured step(s) in a run (fewer than %d)" % (min(steps), MIN_STEPS)
        )
    return found


def judge(points: Mapping[int, Sequence[Facts]], option: Optional[float] = None) -> Dict[int, PointQuality]:
    """The verdict per count of one group: `points` holds each count's runs (those its figures are made of), judged at
    `threshold_of(option, their schedulers)`."""
    if not points:
        return {}
    threshold = check_noise(threshold_of(option, (f.scheduler for runs in points.values() for f in runs)))
    g_ref = min(points)
    reference = points[g_ref]
    x_ref = [f.images_per_s for f in reference]
    ref_spread, ref_kind = relative_spread(x_ref)
    ref_noise = threshold if ref_spread is None else ref_spread
    judged = {}
    for gpus in sorted(points):
        here = points[gpus]
        x = [f.images_per_s for f in here]
        spread, kind = relative_spread(x)
        efficiency = median(x) / median(x_ref) / (gpus / g_ref) if median(x_ref) > 0 else math.inf
        allowance = 0.0 if gpus == g_ref else (threshold if spread is None else spread) + ref_noise
        problems = []
        if spread is not None and spread > threshold:
            problems.append(Problem(NOISY, "%s, above %s" % (_spread_text(x, spread, kind), _percent(threshold))))
        if gpus != g_ref and ref_spread is not None and ref_spread > threshold:
            problems.append(
                Problem(
                    UNSTABLE_REFERENCE,
                    "the reference (%d) %s, above %s: S_G and E_G divide by its median"
                    % (g_ref, _spread_text(x_ref, ref_spread, ref_kind), _percent(threshold)),
                )
            )
        if gpus != g_ref and efficiency > 1 + allowance:
            problems.append(
                Problem(
                    IMPLAUSIBLE,
                    "E_G %.3f above 1 + the noise %.3f (%s here, %s at the reference; %s where one run): more than "
                    "ideal, so the runs did not get the same per rank"
                    % (efficiency, allowance, _percent(spread), _percent(ref_spread), _percent(threshold)),
                )
            )
        judged[gpus] = PointQuality(
            gpus,
            len(here),
            spread,
            kind,
            g_ref,
            len(reference),
            ref_spread,
            efficiency,
            allowance,
            threshold,
            tuple(problems),
            tuple(causes(here, reference, threshold)) if problems else (),
        )
    return judged


def judge_runs(
    runs: Sequence[Run], option: Optional[float] = None, flags: Optional[Dict[str, List[Flag]]] = None
) -> Dict[int, PointQuality]:
    """The verdict per count of one scaling group's runs (as the caller judged them: scaling.scaling takes the same)
    at `threshold_of(option, ...)`; `flags`: the flags of the runs kept with them (--include-stragglers), named as a
    cause."""
    points: Dict[int, List[Facts]] = {}
    for run in measured_runs(runs):
        kinds = flag_kinds(f.kind for f in (flags or {}).get(run.path, []))
        points.setdefault(run.world_size, []).append(facts_of(run, kinds))
    return judge(points, option)


def doubtful_points(runs: Sequence[Run], option: Optional[float] = None) -> Dict[str, PointQuality]:
    """Metrics path -> its point's verdict, for each of `runs` (as the caller judged them: flagged ones left out)
    whose point the verdict doubts, judged within its scaling group (diverged runs left out, as `report` does)."""
    doubtful: Dict[str, PointQuality] = {}
    for group in group_runs(r for r in runs if not r.diverged).values():
        verdicts = judge_runs(group, option)
        doubtful.update((r.path, verdicts[r.world_size]) for r in group if verdicts[r.world_size].doubtful)
    return doubtful


def unequal_threads(keys: Sequence[GroupKey]) -> List[str]:
    """One note per set of CPU groups of one site, model, loader, batch and step options whose threads per rank
    differ: each is a curve of its own, and comparing them (their frameworks, architectures or counts) compares
    unequal compute."""
    found: Dict[Tuple[str, ...], Dict[str, List[str]]] = {}
    for key in keys:
        if key.threads != "-":
            alike = (key.site, key.model, key.loader, "b%d" % key.batch_per_worker, key.step_options)
            found.setdefault(alike, {}).setdefault(key.threads, []).append(key.label)
    return [
        "CPU runs of %s on %s ran with unequal threads per rank (%s): each is a group of its own, and comparing them "
        "compares unequal compute; give every run the same --threads"
        % (
            " ".join(part for part in (alike[1], alike[2], alike[3], alike[4]) if part != "-"),
            alike[0],
            "; ".join(
                "%s: %s" % (threads, ", ".join(labels))
                for threads, labels in sorted(by.items(), key=lambda kv: int(kv[0]))
            ),
        )
        for alike, by in sorted(found.items())
        if len(by) > 1
    ]
