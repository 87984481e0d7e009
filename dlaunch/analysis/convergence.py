"""Convergence-aware scaling: does a run at a large global batch need more epochs than a healthy one?

MLPerf's Reference Convergence Points (RCPs) for ResNet-50 on ImageNet give, per global batch, the
epochs that reference runs needed to reach 75.9 % top-1. The values are mlperf-logging 4.1.68's
`mlperf_logging/rcp_checker/training_4.0.0/rcps_resnet.json` (the last training ruleset with ResNet),
copied unchanged into `data/published/mlperf_rcps_resnet.json` (Apache 2.0). The verdict follows
that package's RCP checker (`rcp_checker.py`), written out here because the launcher does not depend
on mlperf-logging or scipy (tests/test_convergence.py compares both on every RCP and between them):

- an RCP's mean is the olympic mean of its runs' epochs (the lowest and highest left out), its spread
  their population standard deviation s;
- the fewest epochs MLPerf accepts at that batch ("min epochs") is the mean that a one-sided
  two-sample t-test (equal variances, alpha 0.05) can just not tell apart from the RCP's mean:
  mean - t(0.95, n_ref + n_subm - 2) * s * sqrt(1/n_ref + 1/n_subm), with n_ref its runs less two and
  n_subm = 3 (MLPerf's 5 ResNet submission runs less two); the checker finds it by bisection;
- RCPs are pruned as the checker does by default: those below the batch of the fastest-converging
  RCP, then every RCP slower than the interpolation of its neighbours;
- at a global batch between two RCPs their mean and s are interpolated linearly in the batch (n_ref
  = 10); below the smallest RCP batch the smallest RCP applies; above the largest there is none;
- the runs' epochs to 75.9 % (a run that never reached it counts as infinitely many) are averaged
  olympic-style from 3 runs on (MLPerf's own submissions have 5), plainly below that; PASS when that
  mean is at least the min epochs, else FAIL (faster than MLPerf's references allow).

The ratio to the RCP mean says what the verdict does not: a run that needs 1.3x the RCP's epochs
converges slower than a healthy one, and its throughput speed-up overstates its time to accuracy.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, pstdev
from typing import Dict, List, Optional, Sequence

from dlaunch.analysis.scaling import Run, epochs_to
from dlaunch.paths import PUBLISHED_DIR

RCP_FILE = PUBLISHED_DIR / "mlperf_rcps_resnet.json"
RCP_SOURCE = "mlperf-logging 4.1.68, mlperf_logging/rcp_checker/training_4.0.0/rcps_resnet.json"
MLPERF_TARGET_TOP1 = 0.759  # training_4.0.0/closed_resnet.yaml: eval_accuracy >= 0.7590
SUBMISSION_RUNS = 5  # rcp_checker.submission_runs["training"]["resnet"]
ALPHA = 0.05
IMAGENET_CLASSES = 1000


@dataclass(frozen=True)
class RCP:
    """One reference convergence point (or one interpolated between two)."""

    batch: int
    mean: float
    stdev: float
    min_epochs: float
    name: str  # the record's name, or "interpolated between B1 and B2"


def t_cdf(t: float, df: int) -> float:
    """Student's t distribution function for an integer `df` (Abramowitz and Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term = total = math.cos(theta) if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = 2 / math.pi * (theta + math.sin(theta) * total)
    else:
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = math.sin(theta) * total
    return 0.5 + a / 2


def t_quantile(p: float, df: int) -> float:
    """The t with t_cdf(t, df) = p (p > 0.5), by bisection."""
    low, high = 0.0, 1000.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def min_epochs(rcp_mean: float, stdev: float, n_ref: int, n_subm: int = SUBMISSION_RUNS - 2) -> float:
    """The fewest mean epochs a one-sided t-test (alpha 0.05) cannot tell from `rcp_mean`."""
    if stdev == 0:
        return rcp_mean
    return rcp_mean - t_quantile(1 - ALPHA, n_ref + n_subm - 2) * stdev * math.sqrt(1 / n_ref + 1 / n_subm)


def olympic_mean(values: Sequence[float]) -> float:
    """The mean without the lowest and the highest value (from 3 values on; plain mean below)."""
    ordered = sorted(values)
    return mean(ordered[1:-1] if len(ordered) >= 3 else ordered)


def _interpolated(batch: int, low: RCP, high: RCP) -> RCP:
    share = (batch - low.batch) / (high.batch - low.batch)
    rcp_mean = low.mean + share * (high.mean - low.mean)
    stdev = low.stdev + share * (high.stdev - low.stdev)
    return RCP(
        batch,
        rcp_mean,
        stdev,
        min_epochs(rcp_mean, stdev, 2 * SUBMISSION_RUNS),
        "interpolated between %d and %d" % (low.batch, high.batch),
    )


def load_rcps(path: Path = RCP_FILE) -> List[RCP]:
    """The pruned RCPs of `path`, by global batch."""
    rcps = []
    for name, record in json.loads(path.read_text(encoding="utf-8")).items():
        epochs = sorted(record["Epochs to converge"])
        rcp_mean, stdev = olympic_mean(epochs), pstdev(epochs)
        rcps.append(RCP(record["BS"], rcp_mean, stdev, min_epochs(rcp_mean, stdev, len(epochs) - 2), name))
    rcps.sort(key=lambda r: r.batch)
    fastest = min(rcps, key=lambda r: r.mean)
    pruned = [r for r in rcps if r.batch >= fastest.batch]
    i = 1
    while i < len(pruned) - 1:
        if pruned[i].mean > _interpolated(pruned[i].batch, pruned[i - 1], pruned[i + 1]).mean:
            del pruned[i]
            i -= 1
        i += 1
    return pruned


def rcp_at(batch: int, rcps: Sequence[RCP]) -> Optional[RCP]:
    """The RCP for a global batch: its own, interpolated, the smallest (below it), None (above the largest)."""
    for rcp in rcps:
        if rcp.batch == batch:
            return rcp
    below = [r for r in rcps if r.batch < batch]
    above = [r for r in rcps if r.batch > batch]
    if below and above:
        return _interpolated(batch, below[-1], above[0])
    return rcps[0] if above else None


def rcp_applies(run: Run) -> bool:
    """ResNet-50 on ImageNet (1000 classes from a data folder, not synthetic data)."""
    return run.key.model == "resnet50" and run.num_classes == IMAGENET_CLASSES and run.data != "synthetic"


@dataclass(frozen=True)
class RCPVerdict:
    label: str  # the group
    global_batch: int
    runs: int
    reached: int  # runs that reached 75.9 %
    epochs: Optional[float]  # their (olympic) mean epochs to 75.9 %; None when too few reached
    rcp: Optional[RCP]

    @property
    def verdict(self) -> str:
        if self.rcp is None:
            return "no RCP (above the largest RCP batch)"
        if self.epochs is None:
            return "not reached (%d of %d runs reached %.1f%%)" % (self.reached, self.runs, 100 * MLPERF_TARGET_TOP1)
        if self.epochs >= self.rcp.min_epochs:
            return "PASS (%.2fx the RCP mean)" % (self.epochs / self.rcp.mean)
        return "FAIL (faster than MLPerf accepts)"


def run_rcp_verdict(global_batch: int, epochs: Optional[int], rcps: Sequence[RCP]) -> str:
    """The RCP verdict of one run that reached 75.9% after `epochs` epochs (None: it did not)."""
    return RCPVerdict("", global_batch, 1, int(epochs is not None), epochs, rcp_at(global_batch, rcps)).verdict


def rcp_verdicts(groups: Dict[str, Sequence[Run]], rcps: Optional[Sequence[RCP]] = None) -> List[RCPVerdict]:
    """Per group label and global batch, the RCP verdict of the runs the RCPs apply to."""
    rcps = load_rcps() if rcps is None else rcps
    verdicts = []
    for label, runs in groups.items():
        by_batch: Dict[int, List[Run]] = {}
        for run in runs:
            if rcp_applies(run):
                by_batch.setdefault(run.global_batch, []).append(run)
        for batch, batch_runs in sorted(by_batch.items()):
            epochs = [epochs_to(r.epochs, MLPERF_TARGET_TOP1) for r in batch_runs]
            counted = olympic_mean([math.inf if e is None else e for e in epochs])
            verdicts.append(
                RCPVerdict(
                    label,
                    batch,
                    len(batch_runs),
                    sum(e is not None for e in epochs),
                    None if math.isinf(counted) else counted,
                    rcp_at(batch, rcps),
                )
            )
    return verdicts
