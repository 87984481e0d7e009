"""The machine fitted to what was measured: NCCL kernel-time shares (`fit_machine`, `fit_loader_stall`: the paper's
Table 2a, dlaunch/analysis/perfmodel/paper.py) or the user's own profiled runs (`calibration_runs`, `fit_runs`), each
run predicted from a fit on the others (`leave_one_out`). A few parameters each, solved in pure Python."""

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import Callable, List, Optional, Sequence, Tuple

from dlaunch.analysis.perfmodel.model import (
    MODEL_PARAMS_M,
    Prediction,
    Workload,
    gradient_bytes,
    loader_spread,
    messages,
    predict,
    step_times,
)
from dlaunch.analysis.perfmodel.nccl import DEFAULT_INTRA_NODE_GBPS, RING_PLATEAU, Machine, straggler_factor
from dlaunch.analysis.scaling import Run, find_metrics_files, run_from_metrics
from dlaunch.analysis.stragglers import kept_profile
from dlaunch.errors import DlaunchError
from dlaunch.train.config import workload_flags
from dlaunch.train.metrics_schema import Metrics, MetricsError, read_metrics

CALIBRATION_HOWTO = (
    "make calibration runs with the trainer's profiler, e.g. `dlaunch sweep --site SITE --nodes 1,2,4 "
    "--model resnet50 --steps 60 --warmup-steps 10 --profile-steps 20`, then pass their run "
    "directories (or the sweep's folder)"
)


def _solve(a: List[List[float]], b: List[float]) -> Optional[List[float]]:
    """x with a x = b (Gaussian elimination, partial pivoting); None when singular."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _nonnegative_lstsq(
    rows: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float]
) -> List[float]:
    """Weighted least squares with coefficients >= 0 (the best non-negative solution over the column subsets)."""
    width = len(rows[0])
    wa = [[w * v for v in row] for row, w in zip(rows, weights)]
    wy = [w * y for y, w in zip(targets, weights)]
    best, best_cost = [0.0] * width, math.fsum(v * v for v in wy)
    for k in range(1, width + 1):
        for cols in itertools.combinations(range(width), k):
            normal = [[math.fsum(r[i] * r[j] for r in wa) for j in cols] for i in cols]
            coef = _solve(normal, [math.fsum(r[i] * y for r, y in zip(wa, wy)) for i in cols])
            if coef is None or any(c < 0 for c in coef):
                continue
            cost = math.fsum((math.fsum(r[c] * v for c, v in zip(cols, coef)) - y) ** 2 for r, y in zip(wa, wy))
            if cost < best_cost:
                best, best_cost = [0.0] * width, cost
                for c, v in zip(cols, coef):
                    best[c] = v
    return best


def golden_min(cost: Callable[[float], float], low: float, high: float, rounds: int = 100) -> float:
    """The minimum of a unimodal `cost` on [low, high] (golden-section search)."""
    ratio = (5**0.5 - 1) / 2
    for _ in range(rounds):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if cost(a) <= cost(b):
            high = b
        else:
            low = a
    return (low + high) / 2


def _check_shares(points: Sequence[Tuple[int, float]]) -> None:
    for gpus, share in points:
        if gpus < 2 or not 0.0 < share < 1.0:
            raise ValueError("calibration point (%r GPUs, share %r) needs >= 2 GPUs and 0 < share < 1" % (gpus, share))


def fit_machine(points: Sequence[Tuple[int, float]], workload: Workload, machine: Machine) -> Machine:
    """`machine` with the noise and beside_compute that best reproduce NCCL kernel-time shares [(gpus, share)].

    kernel = share/(1-share) * compute; the residuals are weighted by (1-share)^2 / compute so that
    they count as errors in share. beside_compute enters linearly (solved for each noise); the
    spread sqrt(noise) is searched (the waits are capped by the bucket spacing, so not linear)."""
    _check_shares(points)
    overlapped = [workload.backward_s * (1.0 - messages(workload)[0].ready)] * len(points)
    targets = [share / (1.0 - share) * workload.compute_s for _, share in points]
    weights = [(1.0 - share) ** 2 / workload.compute_s for _, share in points]

    def best_beside(spread: float) -> Tuple[float, float]:
        trial = replace(machine, noise_s=spread**2, beside_compute=0.0)
        rest = [t - step_times(workload, trial, gpus).kernel for (gpus, _), t in zip(points, targets)]
        beside = max(
            0.0,
            math.fsum(w * w * a * r for w, a, r in zip(weights, overlapped, rest))
            / math.fsum(w * w * a * a for w, a in zip(weights, overlapped)),
        )
        return beside, math.fsum((w * (r - beside * a)) ** 2 for w, a, r in zip(weights, overlapped, rest))

    # beyond this spread the last wait alone exceeds every target
    high = max(t / (straggler_factor(g) * math.sqrt(workload.busy_s)) for (g, _), t in zip(points, targets))
    spread = golden_min(lambda s: best_beside(s)[1], 0.0, high)
    return replace(machine, noise_s=spread**2, beside_compute=best_beside(spread)[0])


def fit_loader_stall(points: Sequence[Tuple[int, float]], workload: Workload, machine: Machine) -> float:
    """The data wait per step (s) of a loader that cannot keep up which best reproduces the comm shares."""
    _check_shares(points)

    def cost(data_s: float) -> float:
        loaded = replace(workload, data_s=data_s)
        return sum(
            (1 - share) ** 2 * (p.comm_share - share) ** 2
            for p, (_, share) in zip(predict(loaded, machine, [g for g, _ in points]), points)
        )

    return golden_min(cost, 0.0, 10.0 * workload.compute_s, rounds=80)


def workload_of_run(run: Run) -> Workload:
    """The workload measured by a profiled run (its other time: step minus compute, comm and data)."""
    p = run.profile
    assert p is not None
    return Workload(
        p.compute_s,
        run.key.batch_per_worker,
        gradient_bytes(run.key.model),
        p.data_s,
        max(0.0, p.step_s - p.compute_s - p.comm_s - p.data_s),
        run.key.framework,
        reads_files=run.key.loader == "native",
    )


def wall_step_s(run: Run) -> float:
    """A run's wall-clock step time, from its steps-only throughput (no epoch overhead)."""
    return run.world_size * run.key.batch_per_worker / run.steps_images_per_s


def _layout(machine: Machine, run: Run) -> Machine:
    """`machine` with the run's GPUs per node."""
    return replace(machine, gpus_per_node=max(1, run.world_size // run.nodes))


def _network_given_noise(multi: Sequence[Tuple[Run, Workload]], machine: Machine, spread: float) -> Machine:
    """`machine` with noise spread^2 and the network that best explains the runs' profiled all-reduces
    (one ring all-reduce + the slowest rank's lag: linear in latency and inverse bandwidth)."""
    fitted = replace(machine, noise_s=spread**2)
    for inside in (True, False):
        side = [(r, w) for r, w in multi if (r.nodes == 1) == inside]
        if not side:
            continue
        fit_latency = not inside and len({r.nodes for r, _ in side}) > 1
        rows, targets = [], []
        for r, w in side:
            bare = replace(_layout(fitted, r), latency_us=0.0 if fit_latency else fitted.latency_us)
            lag = fitted.lateness_s(w.busy_s, r.world_size) + w.data_s * loader_spread(r.world_size, w.batch)
            rows.append(
                ([2 * (r.nodes - 1) * RING_PLATEAU * 1e-6] if fit_latency else [])
                + [2 * (r.world_size - 1) / r.world_size * w.gradient_bytes]
            )
            targets.append(r.profile.comm_s - bare.ring_allreduce_s(r.world_size, 0.0) - lag)
        coef = _nonnegative_lstsq(rows, targets, [1.0] * len(rows))
        if coef[-1] <= 0:
            continue  # faster than the latency alone explains: keep the nominal bandwidth
        if inside:
            fitted = replace(fitted, intra_node_gbps=8e-9 / coef[-1])
        else:
            fitted = replace(
                fitted,
                bandwidth_gbps_per_node=8e-9 / coef[-1],
                latency_us=coef[0] if fit_latency else fitted.latency_us,
            )
    return fitted


def fit_runs(runs: Sequence[Run], base: Machine) -> Machine:
    """`base` with the noise and the network fitted to the runs: each multi-GPU run's profiled
    all-reduce (one ring all-reduce + the slowest rank's lag) and wall-clock step (busy + transfers
    left over + that lag), in relative terms. For each spread sqrt(noise) the network follows from
    the all-reduces (`_network_given_noise`); the spread is searched. A side (inside a node, across
    nodes) with no run keeps `base`'s figures, as does one the runs cannot tell from an infinite
    bandwidth; the inter-node latency is fitted only from two or more node counts."""
    multi = [(r, workload_of_run(r)) for r in runs if r.world_size > 1]
    if not multi:
        return base

    def cost(spread: float) -> float:
        machine = _network_given_noise(multi, base, spread)
        total = 0.0
        for r, w in multi:
            t = step_times(w, _layout(machine, r), r.world_size)
            total += ((t.step - wall_step_s(r)) / wall_step_s(r)) ** 2 + (
                (t.profiled_comm - r.profile.comm_s) / r.profile.comm_s
            ) ** 2
        return total

    # at most all of a step beyond its work is the slowest rank's lag
    high = max((wall_step_s(r) - w.busy_s) / (math.sqrt(w.busy_s) * straggler_factor(r.world_size)) for r, w in multi)
    return _network_given_noise(multi, base, golden_min(cost, 0.0, max(high, 0.0)))


@dataclass(frozen=True)
class LeftOut:
    run: Run
    predicted: Optional[Prediction]  # None when the other runs cannot predict it
    why: str = ""

    @property
    def step_error(self) -> Optional[float]:
        """Predicted / measured wall-clock step time - 1."""
        return None if self.predicted is None else self.predicted.step_s / wall_step_s(self.run) - 1.0

    @property
    def measured_share(self) -> float:
        shares = self.run.shares
        return shares.comm if shares else 0.0

    @property
    def share_error(self) -> Optional[float]:
        """Predicted - measured profiled comm share (a fraction)."""
        return None if self.predicted is None else self.predicted.profiled_comm_share - self.measured_share


def predict_run(reference: Run, machine: Machine, gpus: int) -> Prediction:
    """The step at `gpus` from a reference run's workload and a fitted machine."""
    return predict(workload_of_run(reference), machine, [gpus])[0]


def leave_one_out(runs: Sequence[Run], base: Optional[Machine], gpus_per_node: int) -> List[LeftOut]:
    """Each run predicted from a fit on the others (their smallest run is the reference workload)."""
    out = []
    for i, run in enumerate(runs):
        rest = [r for j, r in enumerate(runs) if j != i]
        across = run.nodes > 1
        if base is None and run.world_size > 1 and not any(r.world_size > 1 and (r.nodes > 1) == across for r in rest):
            out.append(
                LeftOut(
                    run,
                    None,
                    "the others hold no %s run and the site no [network]"
                    % ("multi-node" if across else "multi-GPU single-node"),
                )
            )
            continue
        machine = _layout(fit_runs(rest, base or unknown_network(gpus_per_node)), run)
        out.append(LeftOut(run, predict_run(min(rest, key=lambda r: r.world_size), machine, run.world_size)))
    return out


def unknown_network(gpus_per_node: int) -> Machine:
    """A placeholder network for a site without [network]: replaced by the fit wherever a run measures it."""
    return Machine(gpus_per_node, 0.0, DEFAULT_INTRA_NODE_GBPS, DEFAULT_INTRA_NODE_GBPS)


def loo_summary(left_out: Sequence[LeftOut]) -> str:
    predicted = [lo for lo in left_out if lo.predicted is not None]
    if not predicted:
        return "leave-one-out error: none of the %d runs can be predicted from the others" % len(left_out)
    steps = [100 * abs(lo.step_error) for lo in predicted]
    shares = [100 * abs(lo.share_error) for lo in predicted]
    return (
        "leave-one-out error (%d of %d runs predicted from the others): step time mean %.1f %%, max %.1f %%; "
        "profiled comm share mean %.1f pp, max %.1f pp"
        % (len(predicted), len(left_out), fmean(steps), max(steps), fmean(shares), max(shares))
    )


@dataclass(frozen=True)
class RunsOrigin:
    """Where a run was made: its site and what its ranks computed on (CPU, or the GPU model of the profile its
    directory kept; `known`: the model is recorded)."""

    site: str
    computed_on: str
    known: bool


def run_origin(metrics: Metrics) -> RunsOrigin:
    """The run's site (its header) and its GPU: CPU for a CPU run, else the kept profile's gpu_model."""
    site = metrics.header.get("site") or "-"
    if metrics.header.get("device") == "cpu":
        return RunsOrigin(site, "CPU", True)
    try:
        kept = kept_profile(Path(metrics.path).parent)
    except DlaunchError:
        kept = None
    if kept is None or not kept.gpu_model:
        return RunsOrigin(site, "a GPU (its model not recorded)", False)
    return RunsOrigin(site, kept.gpu_model, True)


def calibration_runs(paths: Sequence[Path]) -> Tuple[List[Run], str, List[RunsOrigin]]:
    """Profiled runs of one workload with measured throughput, smallest first, the workload options they were
    made with (`workload_flags`: --compile ..., "" for none; errors name --from-runs) and where each was made. A
    compiled run's step times leave its compile time out (the warm-up steps held it); a run that compiled after its
    warm-up steps is refused."""
    if not paths:
        raise DlaunchError("--from-runs: no runs given")
    runs, options, origins = [], {}, []
    for path in find_metrics_files([str(p) for p in paths]):
        try:
            metrics = read_metrics(path)
        except MetricsError as e:
            raise DlaunchError("--from-runs: %s" % e) from None
        run = run_from_metrics(metrics)
        recompiled = sum(e.get("graphs_compiled_after_warmup") or 0 for e in metrics.epochs)
        if recompiled:
            raise DlaunchError(
                "--from-runs: %s compiled %d graph(s) after its warm-up steps, so its step times hold "
                "compile time; rerun it with more --warmup-steps" % (run.path, recompiled)
            )
        runs.append(run)
        options[run.path] = workload_flags(metrics.header["config"])
        origins.append(run_origin(metrics))
    if len(runs) < 2:
        raise DlaunchError(
            "--from-runs: %d run(s) found, at least 2 GPU counts are needed; %s" % (len(runs), CALIBRATION_HOWTO)
        )
    for run in runs:
        if run.profile is None:
            raise DlaunchError("--from-runs: %s has no profile record; %s" % (run.path, CALIBRATION_HOWTO))
        if run.throughput is None:
            raise DlaunchError(
                "--from-runs: %s has no measured epoch (more --steps than --warmup-steps + "
                "--profile-steps are needed); %s" % (run.path, CALIBRATION_HOWTO)
            )
        if run.key.model not in MODEL_PARAMS_M:
            raise DlaunchError("--from-runs: %s trains %r, not a model the model knows" % (run.path, run.key.model))
    keys = {(r.key.model, r.key.framework, r.key.loader, r.key.batch_per_worker) for r in runs}  # step options: below
    if len(keys) > 1:
        raise DlaunchError(
            "--from-runs: the runs mix workloads (model/framework/loader/batch): %s"
            % ", ".join(sorted("%s/%s/%s/b%d" % k for k in keys))
        )
    if len(set(options.values())) > 1:
        raise DlaunchError(
            "--from-runs: the runs mix step options: %s"
            % "; ".join("%s: %s" % (path, flags or "none") for path, flags in sorted(options.items()))
        )
    if len({r.world_size for r in runs}) < 2:
        raise DlaunchError(
            "--from-runs: all runs use %d GPUs; at least 2 GPU counts are needed; %s"
            % (runs[0].world_size, CALIBRATION_HOWTO)
        )
    return sorted(runs, key=lambda r: (r.world_size, r.path)), options[runs[0].path], origins
