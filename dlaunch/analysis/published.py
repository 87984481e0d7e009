"""The published values a study is compared with (its `[[compare]]` entries, data/published/) beside the measured ones:
a metric per GPU count of the groups a comparison matches (median and spread over repeats), or the ratio of two
frameworks' throughput. The measured values are those of the runs as the caller judged them (a study's report leaves
out flagged runs as `report` does, stragglers.unflagged, and --include-stragglers keeps them). The study file's schema
is dlaunch/runs/studyfile.py; a study's report draws these (dlaunch/reporting/)."""

import csv
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Dict, List, Literal, Sequence, Tuple

from pydantic import field_validator, model_validator

from dlaunch.analysis.scaling import Run, Spread, group_runs, run_values
from dlaunch.boundary import escape, whole
from dlaunch.errors import DlaunchError
from dlaunch.paths import PUBLISHED_DIR
from dlaunch.specs.schema import StrictModel
from dlaunch.train.framework_table import FRAMEWORKS

METRICS = (
    "images_per_s",
    "speedup",
    "efficiency",
    "comm_share",
    "kernel_comm_share",
    "kernel_compute_share",
    "kernel_io_share",
    "throughput_ratio",
)
FILE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"  # a file directly in data/published/: no folder, no `..`


def known_frameworks(names: List[str]) -> List[str]:
    """Rows of the framework table (dlaunch/train/framework_table.py), asked when a study file is read."""
    unknown = [name for name in names if name not in FRAMEWORKS]
    if unknown:
        raise ValueError("%r is not one of %s" % (unknown[0], ", ".join(FRAMEWORKS)))
    return names


class Compare(StrictModel):
    """Published values to draw beside the measured ones: rows of `file` (data/published/) matching
    `match`, the value in `column` (divided by the sum of `share_of` when given; by 100 when `percent`).
    `throughput_ratio`: the images/s of framework `ratio_of[0]` over `ratio_of[1]` per count, beside the
    one published ratio in `column` of the row matching `row` (a value without a count: drawn at each)."""

    label: str
    file: str
    metric: Literal[METRICS]
    column: str
    share_of: List[str] = []
    percent: bool = False
    match: Dict[Literal["framework", "loader", "model"], str] = {}
    ratio_of: List[str] = []  # rows of dlaunch/train/framework_table.py
    row: Dict[str, str] = {}

    _frameworks = field_validator("ratio_of")(known_frameworks)

    @model_validator(mode="after")
    def _ratio(self) -> "Compare":
        if (self.metric == "throughput_ratio") != bool(self.ratio_of):
            raise ValueError("ratio_of: give two frameworks for metric throughput_ratio, and only for it")
        if self.ratio_of and (len(self.ratio_of) != 2 or not self.row):
            raise ValueError("ratio_of: two frameworks (faster, slower), with `row` naming the published row")
        return self

    @field_validator("file")
    @classmethod
    def _exists(cls, name: str) -> str:
        if not whole(FILE_NAME, name) or not (PUBLISHED_DIR / name).is_file() or (PUBLISHED_DIR / name).is_symlink():
            raise ValueError("%s is not a file in data/published/" % escape(name))
        return name


@dataclass(frozen=True)
class Comparison:
    """Published values of one metric and this run's, for the groups the comparison matches."""

    label: str
    metric: str
    source: str  # the published file
    published: List[Tuple[int, float]]  # (GPUs, value)
    measured: Dict[str, List[Tuple[int, Spread]]]  # group label -> (GPUs, spread over repeats)


def read_published(
    path: Path, column: str, share_of: Sequence[str], match: Dict[str, str], percent: bool = False
) -> List[Tuple[int, float]]:
    """(GPUs, value) from a published CSV (a `gpus` column): rows whose columns named in `match` agree,
    empty cells left out; with `share_of` the value is divided by the sum of those columns, with
    `percent` by 100."""
    points = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(row for row in f if not row.startswith("#")):
            if missing := [c for c in ["gpus", column, *share_of] if c not in row]:
                raise DlaunchError("%s: no column %s" % (path, missing[0]))
            if any(k in row and row[k] != v for k, v in match.items()):
                continue
            cells = [row[column]] + [row[c] for c in share_of]
            if not all(cell.strip() for cell in cells):
                continue
            try:
                value = float(row[column])
                if share_of:
                    value /= sum(float(row[c]) for c in share_of)
                elif percent:
                    value /= 100.0
                points.append((int(row["gpus"]), value))
            except (ValueError, ZeroDivisionError):
                raise DlaunchError(
                    "%s: row with gpus %s: %s is not a number"
                    % (path, escape(str(row["gpus"])), ", ".join([column, *share_of]))
                ) from None
    return sorted(points)


def read_published_row(path: Path, column: str, row: Dict[str, str]) -> float:
    """The value in `column` of the one published row whose cells agree with `row` (no count column)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [
            r
            for r in csv.DictReader(line for line in f if not line.startswith("#"))
            if all(r.get(k) == v for k, v in row.items())
        ]
    if len(rows) != 1 or column not in rows[0]:
        raise DlaunchError("%s: %d rows match %s, or no column %s (need one row)" % (path, len(rows), row, column))
    return float(rows[0][column])


def throughput_ratios(runs: Sequence[Run], faster: str, slower: str, match: Dict[str, str]) -> List[Tuple[int, Spread]]:
    """Per count, the median images/s of framework `faster` over that of `slower` (groups matching
    `match`); the spread runs from the lowest to the highest ratio of any two of their runs."""
    per_framework: Dict[str, Dict[int, List[float]]] = {faster: {}, slower: {}}
    for key, group in group_runs(runs).items():
        if key.framework in per_framework and all(getattr(key, k) == v for k, v in match.items()):
            for gpus, values in run_values(group, "images_per_s").items():
                per_framework[key.framework].setdefault(gpus, []).extend(values)
    ratios = []
    for gpus in sorted(set(per_framework[faster]) & set(per_framework[slower])):
        f, s = per_framework[faster][gpus], per_framework[slower][gpus]
        ratios.append(
            (gpus, Spread(median(f) / median(s), min(f) / max(s), max(f) / min(s), len(f) + len(s), "min-max"))
        )
    return ratios


def compare_published(compare: Compare, path: Path, runs: Sequence[Run]) -> Comparison:
    """The published values of a study's `[[compare]]` entry beside the matching groups of `runs` (as the caller
    judged them)."""
    if compare.metric == "throughput_ratio":
        faster, slower = compare.ratio_of
        ratios = throughput_ratios(runs, faster, slower, dict(compare.match))
        value = read_published_row(path, compare.column, dict(compare.row))
        published = [(gpus, value) for gpus, _ in ratios] or [(1, value)]
        return Comparison(
            compare.label,
            compare.metric,
            path.name,
            published,
            {"%s / %s" % (faster, slower): ratios} if ratios else {},
        )
    measured = {}
    for key, group in group_runs(runs).items():
        if all(getattr(key, k) == v for k, v in compare.match.items()):
            values = run_values(group, compare.metric)
            if values:
                measured[key.label] = [(gpus, Spread.of(v)) for gpus, v in values.items()]
    return Comparison(
        compare.label,
        compare.metric,
        path.name,
        read_published(path, compare.column, compare.share_of, dict(compare.match), compare.percent),
        measured,
    )
