"""Selecting, comparing and judging rows of the results database.

Selectors: `key=value` conditions, comma-separated within one selector (all must hold); a bare word
is an experiment. Keys: SELECTOR_KEYS, `pins.NAME` (a library version of the header: `pins.torch=2.14.1`)
and `date` (the day a run ended, UTC: a prefix `2026-10`, or a range `2026-10-01..2026-10-15`, either
end open). A site is named as `--site` names it (`site=juwels`: its profile's name and aliases). A
value no run can have (`gpus=abc`, `date=2026-13`, a range that ends before it starts) is bad input;
a condition no run in the database satisfies is named with the values the database has (`unmatched`).

`compare A B`: the runs of each side (status ok, with the figure) matched per MATCH_KEY less the
attributes that tell the sides apart (each side has one value and they differ: comparing two
frameworks matches per model and GPU count): per match, each side's median and spread (as `dlaunch
report`: min-max below 6 runs, the median's 95% confidence interval from 6 on), the change of the
medians, and whether the repeats make it significant. Beside the matched attributes, everything else a row
records of what its run asked for and ran on (`facts`: its trainer options as given, `--threads`,
`--profile-steps`, ..., its experiment, site, image, node count, data, dlaunch's revision, library versions) is
compared too: what differs between the sides as a whole (one value each) is the comparison's `changed` (versions:
`pins`), what differs only within a match (nodes at one GPU count, a side whose runs differ among themselves) that
match's `changed`; so a change of the median is never shown without everything that changed with it.

Significance: the two-sided Mann-Whitney U test (Wilcoxon rank-sum) with its exact p-value, at 5%.
Rank-based because a few repeats of a throughput are not normal (a slow node, a noisy neighbour, give
outliers a t-test is swayed by); exact because repeats are few (3-5) and the normal approximation is
wrong there. The exact distribution is the rank sum's over all splits of the pooled runs, counted
(ties get mid-ranks, so it is the exact permutation test of U), as scipy's `mannwhitneyu(method="exact")`
and `permutation_test` give (tests/test_results.py checks both); written out because the launcher does
not depend on scipy. With 3 runs a side the smallest two-sided p is 0.1: no change is significant;
from 4 a side (p >= 0.029) it can be.

History verdict of a run: its images/s against the median of the site's recent runs of the same
model, GPU count, precision, framework, loader, batch per GPU and step options (the last HISTORY_RUNS that ended
before it started, at least MIN_HISTORY): REGRESSION when slower by more than the tolerance of the
site's `[[reference]]` for the model, GPU count and precision (DEFAULT_TOLERANCE without one).
"""

import json
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache, cached_property
from statistics import median
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from dlaunch.analysis.quality import Facts, judge
from dlaunch.analysis.scaling import Spread, matching_reference, reference_point, threads_key
from dlaunch.analysis.stragglers import flag_kinds
from dlaunch.errors import DlaunchError
from dlaunch.train.config import WORKLOAD_FLAGS

SELECTOR_KEYS = (
    "experiment",
    "site",
    "stack",
    "framework",
    "loader",
    "model",
    "gpus",
    "nodes",
    "batch_per_gpu",
    "global_batch",
    "amp",
    "schedule",
    "status",
    "image",
    "run",
    "step_options",
    "device",
    "threads",
    "engine",
    "architecture",
    "updates",
)
MATCH_KEY = ("model", "framework", "loader", "gpus", "batch_per_gpu", "amp", "step_options")
GROUP_KEY = (
    "experiment",
    "site",
    "model",
    "framework",
    "loader",
    "batch_per_gpu",
    "step_options",
)  # a curve, as report's, with the CPU threads per rank (`curve_of`)
METRICS = (
    "images_per_s",
    "epoch_time_s",
    "speedup",
    "efficiency",
    "joules_per_image",
    "energy_j",
    "time_to_target_s",
    "epochs_to_target",
    "energy_to_target_j",
    "best_top1",
)
SIGNIFICANCE = 0.05
HISTORY_RUNS = 10
MIN_HISTORY = 3
DEFAULT_TOLERANCE = 0.05


# -- selectors ----------------------------------------------------------------------------------------
COUNT_KEYS = ("gpus", "nodes", "batch_per_gpu", "global_batch", "threads")  # whole numbers
DATE_FORMATS = {4: "%Y", 7: "%Y-%m", 10: "%Y-%m-%d"}  # a day, month or year, by its length


@dataclass(frozen=True)
class Condition:
    """One `key=value` of a selector: `text` as given, the row attribute it reads, and its test."""

    text: str
    key: str
    holds: Callable[[Dict[str, Any]], bool]


def _date(selector: str, value: str) -> str:
    """A date prefix as the `ended` column writes it (YYYY, YYYY-MM or YYYY-MM-DD, UTC), checked."""
    try:
        datetime.strptime(value, DATE_FORMATS[len(value)])
    except (KeyError, ValueError):
        raise DlaunchError(
            "selector %r: date %r is not a day, month or year (YYYY-MM-DD, YYYY-MM, YYYY)" % (selector, value)
        ) from None
    return value


def _date_condition(selector: str, value: str) -> Callable[[Dict[str, Any]], bool]:
    if ".." not in value:
        day = _date(selector, value)
        return lambda row: row["ended"].startswith(day)
    low, high = (_date(selector, end) if end else "" for end in value.split("..", 1))
    if low and high and low[: len(high)] > high[: len(low)]:
        raise DlaunchError("selector %r: the range ends (%s) before it starts (%s)" % (selector, high, low))
    return lambda row: (not low or row["ended"][: len(low)] >= low) and (not high or row["ended"][: len(high)] <= high)


@cache
def _site_names(value: str) -> Tuple[str, ...]:
    """The site names `value` stands for: itself, and the profile it names or is an alias of (`juwels`:
    juwels-booster), where one is found."""
    from dlaunch.jobs.sites import resolve_site  # pydantic: only when a selector names a site

    try:
        return (value, resolve_site(value).name)
    except (DlaunchError, OSError):
        return (value,)


def parse_conditions(text: str) -> List[Condition]:
    """The conditions of one selector; DlaunchError (exit 2) naming the selector for an unknown key or a
    value no run can have (`gpus=abc`, `date=2026-13`, a reversed date range)."""
    conditions = []
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        key, value = (key.strip(), value.strip()) if sep else ("experiment", part)
        if not part or (sep and not value):
            raise DlaunchError(
                "selector %r: give key=value (keys: %s, pins.NAME, date)" % (text, ", ".join(SELECTOR_KEYS))
            )
        if key == "date":
            holds = _date_condition(text, value)
        elif key.startswith("pins.") and len(key) > 5:
            holds = lambda row, k=key[5:], v=value: str(row["pins"].get(k)) == v
        elif key in COUNT_KEYS:
            if not (value.isascii() and value.isdigit()) or int(value) < 1:
                raise DlaunchError(
                    "selector %r: %s takes a count (a whole number from 1), e.g. %s=8" % (text, key, key)
                )
            holds = lambda row, k=key, n=int(value): row[k] == n
        elif key == "site":
            holds = lambda row, names=_site_names(value): row["site"] in names
        elif key in SELECTOR_KEYS:
            holds = lambda row, k=key, v=value: str(row[k]) == v
        else:
            raise DlaunchError(
                "selector %r: unknown key %r (keys: %s, pins.NAME, date)" % (text, key, ", ".join(SELECTOR_KEYS))
            )
        conditions.append(Condition(part if sep else "experiment=%s" % part, key, holds))
    return conditions


def parse_selector(text: str) -> Callable[[Dict[str, Any]], bool]:
    """A predicate over rows: every condition of the selector holds (see parse_conditions)."""
    conditions = parse_conditions(text)
    return lambda row: all(c.holds(row) for c in conditions)


def select(rows: Sequence[Dict[str, Any]], selectors: Sequence[str]) -> List[Dict[str, Any]]:
    predicates = [parse_selector(s) for s in selectors]
    return [row for row in rows if all(p(row) for p in predicates)]


def _values(rows: Sequence[Dict[str, Any]], key: str) -> str:
    """The values of `key` in `rows`, as a note lists them (at most 10)."""
    if key == "date":
        ended = sorted(row["ended"][:10] for row in rows)
        return "its runs ended from %s to %s" % (ended[0], ended[-1])
    get = (lambda row: row["pins"].get(key[5:])) if key.startswith("pins.") else (lambda row: row[key])
    values = sorted({str(get(row)) for row in rows})
    return "its values of %s: %s" % (key, ", ".join(values[:10]) + (", ..." if len(values) > 10 else ""))


def unmatched(rows: Sequence[Dict[str, Any]], selectors: Sequence[str]) -> List[str]:
    """A note for each condition that no row satisfies (a typo, a site never run on), naming the values
    the rows have; none for an empty database."""
    if not rows:
        return []
    return [
        "%s matches no run in the database (%s)" % (c.text, _values(rows, c.key))
        for selector in selectors
        for c in parse_conditions(selector)
        if not any(c.holds(row) for row in rows)
    ]


# -- figures that depend on other runs ------------------------------------------------------------------
def left_out_of_scaling(row: Mapping[str, Any]) -> Optional[str]:
    """Why a row has no S_G or E_G (None: it has them): its status is not ok, it has no images/s, or it is
    flagged: "straggler", "throttled" or both, the kinds of its recorded `flags` (judged at `flags_threshold`),
    which the report leaves out of its scaling figures by default."""
    if row["status"] != "ok":
        return "status %s" % row["status"]
    if row["images_per_s"] is None:
        return "no images/s"
    if row["flags"]:
        return flag_kinds(flag["kind"] for flag in row["flags"])
    return None


def curve_of(row: Mapping[str, Any]) -> Tuple[Any, ...]:
    """A row's scaling curve, as `dlaunch report` groups runs: GROUP_KEY and a CPU run's threads per rank
    (scaling.threads_key)."""
    return tuple(row[k] for k in GROUP_KEY) + (threads_key(row["device"] or "", row["threads"]),)


def facts_of_row(row: Mapping[str, Any]) -> Facts:
    """What the quality verdict reads of a row (an ok row with images/s, unflagged: `left_out_of_scaling`)."""
    hosts = row["provenance"].get("hosts") or []
    return Facts(
        row["run"],
        row["gpus"],
        row["images_per_s"],
        row["device"] == "cpu",
        row["threads"],
        max(hosts.count(h) for h in hosts) if hosts else None,
        frozenset(str(h) for h in hosts),
        row["measured_steps"],
        row["step_compute_s"],
        scheduler=row["scheduler"],
    )


def with_scaling(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows with `speedup` and `efficiency` within their scaling curve (`curve_of`), as `dlaunch
    report` computes them: against the median images/s at the curve's smallest GPU count, and the `quality`
    verdict of their point with its `quality_why` (dlaunch/analysis/quality.py, at its default thresholds); the
    rows `left_out_of_scaling` names a reason for get None."""
    curves: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
    for row in rows:
        if left_out_of_scaling(row) is None:
            curves.setdefault(curve_of(row), []).append(row)
    derived: Dict[str, Tuple[float, float, str, str]] = {}
    for curve in curves.values():
        g_ref, x_ref = reference_point([(r["gpus"], r["images_per_s"]) for r in curve])
        points: Dict[int, List[Facts]] = {}
        for r in curve:
            points.setdefault(r["gpus"], []).append(facts_of_row(r))
        verdicts = judge(points)
        for r in curve:
            speedup = r["images_per_s"] / x_ref
            verdict = verdicts[r["gpus"]]
            derived[r["uid"]] = (speedup, speedup / (r["gpus"] / g_ref), verdict.verdict, verdict.why)
    return [
        dict(
            row, **dict(zip(("speedup", "efficiency", "quality", "quality_why"), derived.get(row["uid"], (None,) * 4)))
        )
        for row in rows
    ]


# -- significance -------------------------------------------------------------------------------------
def mann_whitney(a: Sequence[float], b: Sequence[float]) -> Tuple[float, float]:
    """(U of `a`, exact two-sided p): twice the smaller tail of `a`'s rank sum over all C(n+m, n)
    splits of the pooled values (mid-ranks for ties), at most 1."""
    pooled = sorted(list(a) + list(b))
    doubled_rank: Dict[float, int] = {}  # twice the mid-rank: an integer
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1] == pooled[i]:
            j += 1
        doubled_rank[pooled[i]] = i + j + 2
        i = j + 1
    n = len(a)
    observed = sum(doubled_rank[x] for x in a)
    counts: List[Dict[int, int]] = [{0: 1}] + [{} for _ in range(n)]  # subsets of size k -> sum -> count
    for seen, value in enumerate(pooled, 1):
        rank = doubled_rank[value]
        for k in range(min(seen, n), 0, -1):
            for total, c in counts[k - 1].items():
                counts[k][total + rank] = counts[k].get(total + rank, 0) + c
    splits = math.comb(len(pooled), n)
    lower = sum(c for total, c in counts[n].items() if total <= observed) / splits
    upper = sum(c for total, c in counts[n].items() if total >= observed) / splits
    return observed / 2 - n * (n + 1) / 2, min(1.0, 2 * min(lower, upper))


def smallest_p(n: int, m: int) -> float:
    """The smallest two-sided exact p of n against m runs (no ties): 2 / C(n+m, n)."""
    return min(1.0, 2 / math.comb(n + m, n))


# -- comparison ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    label: str
    rows: List[Dict[str, Any]]


@dataclass(frozen=True)
class Match:
    key: Dict[str, Any]  # the matched attributes
    a: List[float]
    b: List[float]
    changed: Dict[str, Tuple[Any, Any]] = field(default_factory=dict)  # facts that differ within this match only

    def spread(self, values: Sequence[float]) -> Optional[Spread]:
        return Spread.of(values) if values else None

    @property
    def change(self) -> Optional[float]:
        """B's median over A's, less 1."""
        if not self.a or not self.b or median(self.a) == 0:
            return None
        return median(self.b) / median(self.a) - 1

    @cached_property
    def p_value(self) -> Optional[float]:
        return mann_whitney(self.a, self.b)[1] if self.a and self.b else None

    @property
    def significance(self) -> str:
        p = self.p_value
        if p is None:
            return "only in %s" % ("A" if self.a else "B")
        if p < SIGNIFICANCE:
            return "yes"
        floor = smallest_p(len(self.a), len(self.b))
        return "no (too few runs: p >= %.3g)" % floor if floor >= SIGNIFICANCE else "no"


@dataclass(frozen=True)
class Comparison:
    a: Side
    b: Side
    metric: str
    changed: Dict[str, Tuple[Any, Any]]  # attributes and facts that tell the sides apart: (A's, B's)
    pins: Dict[str, Tuple[Any, Any]]  # library versions that differ between the sides
    matches: List[Match]


# Trainer options that the matched attributes, the facts or the step options already name.
COVERED_OPTIONS = ("model", "batch-size", "amp", "loader", "data", "num-classes") + WORKLOAD_FLAGS
# What a row records of where its run ran, beyond the matched attributes (store.py's columns, provenance's fields).
FACTS = ("experiment", "site", "stack", "image", "nodes", "data", "num_classes", "git_revision")
PIN = "pins."  # a library version's fact: `pins.torch`


def facts(row: Mapping[str, Any]) -> Dict[str, Any]:
    """What a row records of its run beyond MATCH_KEY, by name: FACTS, each trainer option it was given (`--threads`;
    one not given is None: the trainer's default) and each library version of its header (`pins.torch`)."""
    provenance = row["provenance"] or {}
    found = {name: row[name] if name in row else provenance.get(name) for name in FACTS}
    options = (row["request"] or {}).get("options") or {}
    found.update(("--" + name, value) for name, value in options.items() if name not in COVERED_OPTIONS)
    found.update((PIN + name, version) for name, version in (row["pins"] or {}).items())
    return found


def fact_name(name: str) -> str:
    """A fact's name as people read it: `version torch` for `pins.torch`."""
    return "version " + name[len(PIN) :] if name.startswith(PIN) else name


def fact_text(name: str, value: Any) -> str:
    """A side's value of a fact as people read it: a trainer option not given is `default`, a fact not recorded `-`,
    several values `1 or 2`."""
    if isinstance(value, list):
        return " or ".join(fact_text(name, v) for v in value)
    if value is None:
        return "default" if name.startswith("--") else "-"
    return str(value)


def _value(values: Set[str], shown: Dict[str, Any]) -> Any:
    """One side's value of a fact: the value, or the sorted list of several."""
    if len(values) == 1:
        return shown[next(iter(values))]
    return [shown[v] for v in sorted(values)]


def differing(sides: Sequence[Sequence[Dict[str, Any]]]) -> Dict[str, List[Any]]:
    """The facts (see `facts`) whose values differ between the sides (each some rows): name -> each side's value
    (None where not recorded or not given) or the list of the values its rows have; FACTS first, then the options,
    then the library versions."""
    of_sides = [[facts(r) for r in side] for side in sides]
    names = {n for side in of_sides for f in side for n in f}
    found = {}
    for name in [n for n in FACTS if n in names] + sorted(names.difference(FACTS)):
        shown: Dict[str, Any] = {}
        values: List[Set[str]] = []
        for side in of_sides:
            texts = {json.dumps(f.get(name), sort_keys=True) for f in side}  # lists, dicts and None alike
            shown.update((json.dumps(f.get(name), sort_keys=True), f.get(name)) for f in side)
            values.append(texts)
        if any(v != values[0] for v in values[1:]):
            found[name] = [_value(v, shown) for v in values]
    return found


def differences(a: Sequence[Dict[str, Any]], b: Sequence[Dict[str, Any]]) -> Dict[str, Tuple[Any, Any]]:
    """`differing` of rows `a` and rows `b`: name -> (A's, B's)."""
    return {name: (va, vb) for name, (va, vb) in differing([a, b]).items()}


def compare(rows: Sequence[Dict[str, Any]], selector_a: str, selector_b: str, metric: str) -> Comparison:
    """Compare the rows selected by A and B on `metric` (see the module's docstring)."""
    if metric not in METRICS:
        raise DlaunchError("--metric: %r is not one of %s" % (metric, ", ".join(METRICS)))
    rows = with_scaling(rows)
    sides = []
    for label, selector in (("A", selector_a), ("B", selector_b)):
        chosen = [r for r in select(rows, [selector]) if r["status"] == "ok" and r[metric] is not None]
        if not chosen:
            raise DlaunchError(
                "; ".join(
                    ["%s (%s): no ok run with %s in the results database" % (label, selector, metric)]
                    + unmatched(rows, [selector])
                )
            )
        sides.append(Side(selector, chosen))
    a, b = sides
    whole = differences(a.rows, b.rows)
    sided = {n: v for n, v in whole.items() if not any(isinstance(x, list) for x in v)}  # one value each
    changed = {n: sided[n] for n in ("experiment", "site", "stack") if n in sided}  # what a selector names first
    for key in MATCH_KEY:
        va, vb = ({r[key] for r in side.rows} for side in (a, b))
        if len(va) == len(vb) == 1 and va != vb:
            changed[key] = (va.pop(), vb.pop())
    changed.update((n, v) for n, v in sided.items() if not n.startswith(PIN) and n not in changed)
    key = [k for k in MATCH_KEY if k not in changed]
    matched: Dict[Tuple[Any, ...], Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]] = {}
    for side, rows_ in ((0, a.rows), (1, b.rows)):
        for r in rows_:
            matched.setdefault(tuple(r[k] for k in key), ([], []))[side].append(r)
    matches = []
    for k, (ra, rb) in sorted(matched.items(), key=lambda kv: [str(x) for x in kv[0]]):
        within = differences(ra, rb) if ra and rb else {}
        matches.append(
            Match(
                dict(zip(key, k)),
                [float(r[metric]) for r in ra],
                [float(r[metric]) for r in rb],
                {n: v for n, v in within.items() if n not in sided},
            )
        )
    pins = {n[len(PIN) :]: v for n, v in sided.items() if n.startswith(PIN)}
    return Comparison(a, b, metric, changed, pins, matches)


# -- history ------------------------------------------------------------------------------------------
HISTORY_KEY = ("site", "model", "gpus", "amp", "framework", "loader", "batch_per_gpu", "step_options")


def history_verdict(row: Dict[str, Any], rows: Sequence[Dict[str, Any]], tolerance: Optional[float]) -> Optional[str]:
    """PASS/REGRESSION against the recent median (see the module's docstring); None without enough history, and for
    a run that did not end ok (an interrupted or cancelled run's images/s is no result to judge)."""
    if row["status"] != "ok" or row["images_per_s"] is None:
        return None
    earlier = sorted(
        (
            r
            for r in rows
            if r["uid"] != row["uid"]
            and r["status"] == "ok"
            and r["images_per_s"] is not None
            and r["ended"] < row["started"]
            and all(r[k] == row[k] for k in HISTORY_KEY)
        ),
        key=lambda r: r["ended"],
    )[-HISTORY_RUNS:]
    if len(earlier) < MIN_HISTORY:
        return None
    recent = median(r["images_per_s"] for r in earlier)
    tol = DEFAULT_TOLERANCE if tolerance is None else tolerance
    deviation = row["images_per_s"] / recent - 1
    return "%s %+.1f%% vs last %d (tol. %.0f%%%s)" % (
        "PASS" if deviation >= -tol else "REGRESSION",
        100 * deviation,
        len(earlier),
        100 * tol,
        "" if tolerance is not None else ", default",
    )


def _tolerances(rows: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, str, int, str], Optional[float]]:
    """The tolerance of each row's site reference for its model, GPU count and precision (None: none)."""
    from dlaunch.jobs.sites import resolve_site  # pydantic: only when rows are judged

    sites: Dict[str, Any] = {}
    found = {}
    for row in rows:
        if row["site"] not in sites:
            try:
                sites[row["site"]] = resolve_site(row["site"]) if row["site"] != "-" else None
            except DlaunchError:
                sites[row["site"]] = None
        site = sites[row["site"]]
        ref = matching_reference(row["model"], row["gpus"], row["amp"], site.reference) if site else None
        found[row["site"], row["model"], row["gpus"], row["amp"]] = ref.tolerance if ref else None
    return found


def with_history(rows: Sequence[Dict[str, Any]], history: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows with their history verdict against `history` (every row of the database). The rows that
    can count (ok, with images/s) are indexed by HISTORY_KEY in order of `ended`, so each row's verdict
    sees only the last HISTORY_RUNS + 1 that ended before it started (one more: the row itself may be
    among them, and history_verdict leaves it out)."""
    tolerances = _tolerances(rows)
    by_key: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
    for r in sorted(
        (r for r in history if r["status"] == "ok" and r["images_per_s"] is not None), key=lambda r: r["ended"]
    ):
        by_key.setdefault(tuple(r[k] for k in HISTORY_KEY), []).append(r)
    ends = {key: [r["ended"] for r in found] for key, found in by_key.items()}
    judged = []
    for row in rows:
        key = tuple(row[k] for k in HISTORY_KEY)
        before = bisect_left(ends.get(key, []), row["started"])
        earlier = by_key.get(key, [])[max(0, before - HISTORY_RUNS - 1) : before]
        tolerance = tolerances[row["site"], row["model"], row["gpus"], row["amp"]]
        judged.append(dict(row, history=history_verdict(row, earlier, tolerance)))
    return judged
