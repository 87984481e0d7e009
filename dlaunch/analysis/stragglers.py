"""The straggler judgement: stragglers and throttled GPUs from the per-rank phases of metrics schema version 4
(dlaunch/analysis/phases.py: the records; dlaunch/train/phases.py: the writer side), the threshold a run is judged
at, and which runs the figures leave out. Every command that judges a run (status, watch, report, study report, the
results database) and the analysis that leaves flagged runs out (scaling, budget, published comparisons) take it
from here.

- The straggler measure (`forward_excess`, one definition for the flag and predict's column): how much
  longer a rank's forward pass (forward_s, the part of compute_s that overlaps no communication) took than the median
  rank's, as a fraction. The median rank is a real rank, all its phases (the median_low of the forward passes: method
  "rank-timers-median-rank", the writer's PHASES_METHOD): with 2 ranks the faster one, so "53 % slower" means the
  two ranks differ 1.53x. Records of method `MEDIAN_OF_RANKS_METHOD` (written before) hold statistics.median, for an
  even rank count the mean of the two middle ranks (with 2 ranks "21 % slower" there meant 1.53x apart): they are
  read as recorded and their flags say "than the median of the ranks".
- Straggler: a node whose slowest rank's forward excess is over the threshold. A finished run is judged on its
  measured epochs (those that give images/s: `Run.measured_epochs`), each node by the mean over them of its slowest
  rank's forward_s against the mean of the median rank's (`run_flags`); a live run on its last epoch (`live_flags`).
- Throttled GPU: a node whose GPU health shows an SM clock below (1 - threshold) x its maximum together with a
  throttle reason, or any of `HARD_THROTTLES`.
- The threshold (`threshold_of`): --straggler-threshold where given, else the `straggler_threshold` of the site
  profile the run is judged by, else `DEFAULT_THRESHOLD` (dlaunch/thresholds.py); a fraction in (0, 1)
  (`check_threshold`; `threshold_option` says so as the option's error). Which profile: the caller's (`status`: the
  one its run directory kept, else its request's site; `report`: kept, else its site's name here, or --site; the
  results database: kept only, so that a row depends on its run directory alone), read by `kept_profile`.

One flag per node at most of each kind, naming host, rank and local rank (`Flag`: `line` is how status shows and
keeps it, `stored` what a results database row keeps); a run is flagged when it has any: `flagged` judges many runs,
`unflagged` is the one rule that leaves them out of scaling figures and the budget (unless included: the caller's
choice). A version 1-3 file has no phases: no flags, never "no straggler".
"""

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence

from dlaunch.analysis.phases import EpochPhases, GpuHealth, NodeFigures
from dlaunch.analysis.scaling import Run
from dlaunch.boundary import MAX_FILE_BYTES, decode, parse_toml, read_bytes, validate
from dlaunch.errors import DlaunchError
from dlaunch.paths import SITE_PROFILE
from dlaunch.thresholds import DEFAULT_THRESHOLD

if TYPE_CHECKING:  # the site models (pydantic) are imported only for a run that kept a profile
    from dlaunch.jobs.sites import Site

# Reasons that slow a GPU whatever its clock shows (NVML clock event reasons, as the trainer names them).
HARD_THROTTLES = ("thermal", "hardware slowdown", "power brake")
STRAGGLER, THROTTLED = "straggler", "throttled"
OPTION = "--straggler-threshold"


def forward_excess(phases: EpochPhases, forward_s: Optional[float] = None) -> Optional[float]:
    """The straggler measure: how much longer `forward_s` (default: the slowest rank's forward pass) took than the
    median rank's, a fraction (0.53: 53 % longer); None when the median rank's is not positive."""
    if phases.median.forward_s <= 0:
        return None
    return (phases.slowest.forward_s if forward_s is None else forward_s) / phases.median.forward_s - 1.0


@dataclass(frozen=True)
class Flag:
    """A straggler or a throttled GPU of a run: the one record of a flag, wherever it is shown or kept."""

    kind: str  # STRAGGLER or THROTTLED
    host: str
    rank: Optional[int]  # stragglers: the slow rank; throttled GPUs: the GPU's rank where the record holds it
    local_rank: Optional[int]
    message: str

    @property
    def line(self) -> str:
        """The flag as `status` and `watch` show it (and the status cache keeps it): 'straggler: n2 rank 1 ...'."""
        return "%s: %s" % (self.kind, self.message)

    def stored(self) -> Dict[str, str]:
        """The flag as a results database row keeps it (its `flags` column)."""
        return {"kind": self.kind, "message": self.message}


def flag_kinds(kinds: Iterable[str]) -> str:
    """'straggler', 'throttled' or 'straggler and throttled': the kinds of a run's flags, each once, in order."""
    return " and ".join(sorted(set(kinds)))


def straggler_flags(
    phases: Optional[EpochPhases], nodes: Optional[Sequence[NodeFigures]], threshold: float
) -> List[Flag]:
    """A flag per node whose slowest rank's `forward_excess` is over `threshold` (without `nodes`: the run's
    slowest rank alone)."""
    if phases is None:
        return []
    candidates = (
        [(n.slowest, n.slowest_forward_s) for n in nodes]
        if nodes
        else [(phases.slowest_rank, phases.slowest.forward_s)]
    )
    flags = []
    for who, forward_s in candidates:
        excess = forward_excess(phases, forward_s)
        if excess is not None and excess > threshold:
            flags.append(
                Flag(
                    STRAGGLER,
                    who.host,
                    who.rank,
                    who.local_rank,
                    (
                        "%s rank %d (local rank %s) computed %.0f %% slower than %s: a straggler; "
                        "this run's E_G is understated"
                        % (who.host, who.rank, _or_dash(who.local_rank), 100 * excess, phases.median_of)
                    ),
                )
            )
    return flags


def _or_dash(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


def throttled(gpu: GpuHealth, threshold: float) -> bool:
    """An SM clock below (1 - threshold) x its maximum with a throttle reason, or a hard throttle reason."""
    if any(r in HARD_THROTTLES for r in gpu.throttle):
        return True
    slow = (
        gpu.sm_clock_mhz is not None
        and gpu.sm_clock_max_mhz
        and gpu.sm_clock_mhz < (1.0 - threshold) * gpu.sm_clock_max_mhz
    )
    return bool(slow and gpu.throttle)


def throttle_flags(nodes: Optional[Sequence[NodeFigures]], threshold: float) -> List[Flag]:
    """A flag per node whose GPU health says throttled (`throttled`), naming the GPU's local rank and its rank where
    the record holds it (the node's slowest rank's GPU: a throttled GPU usually makes its rank the slowest; the
    health record itself has the local rank only). Records of MEDIAN_OF_RANKS_METHOD hold the reasons of all the
    node's GPUs beside the figures of the one with the lowest clock; later ones the figures and reasons of one GPU."""
    flags = []
    for node in nodes or ():
        gpu = node.gpu
        if gpu.unavailable is not None or not throttled(gpu, threshold):
            continue
        if gpu.sm_clock_mhz is not None and gpu.sm_clock_max_mhz:
            clock = "SM clock %.0f of %.0f MHz (%.0f %%)" % (
                gpu.sm_clock_mhz,
                gpu.sm_clock_max_mhz,
                100 * gpu.sm_clock_mhz / gpu.sm_clock_max_mhz,
            )
        else:
            clock = "SM clock not recorded"
        rank = node.slowest.rank if gpu.local_rank is not None and gpu.local_rank == node.slowest.local_rank else None
        whose = (
            "local rank %s" % _or_dash(gpu.local_rank)
            if rank is None
            else "rank %d (local rank %d)" % (rank, gpu.local_rank)
        )
        flags.append(
            Flag(
                THROTTLED,
                node.host,
                rank,
                gpu.local_rank,
                "%s GPU of %s: %s, %s: throttled" % (node.host, whose, clock, ", ".join(gpu.throttle)),
            )
        )
    return flags


def flags_of(phases: Optional[EpochPhases], nodes: Optional[Sequence[NodeFigures]], threshold: float) -> List[Flag]:
    """Straggler flags, then throttled GPUs."""
    return straggler_flags(phases, nodes, threshold) + throttle_flags(nodes, threshold)


def check_threshold(threshold: float) -> float:
    """`threshold`, a fraction in (0, 1); ValueError naming it otherwise (a profile's is checked by its model)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError("straggler threshold %r: must be a fraction in (0, 1)" % (threshold,))
    return threshold


def threshold_option(value: Optional[float]) -> Optional[float]:
    """--straggler-threshold as given (None: each run's profile's), checked where the command line parses it and where
    an API function takes it: DlaunchError "Invalid value for '--straggler-threshold': ..." when no fraction in
    (0, 1)."""
    if value is not None:
        try:
            check_threshold(value)
        except ValueError as e:
            raise DlaunchError("Invalid value for '%s': %s" % (OPTION, e)) from None
    return value


def threshold_of(option: Optional[float], profile: "Optional[Site]") -> float:
    """The straggler threshold a run is judged at: `option` (--straggler-threshold) where given, else its site
    profile's, else the default."""
    if option is not None:
        return option
    return profile.straggler_threshold if profile is not None else DEFAULT_THRESHOLD


def _profile(data: bytes, shown: str) -> "Site":
    from dlaunch.jobs.sites import Site

    return validate(Site, parse_toml(decode(data, shown), shown), shown)


@functools.lru_cache(maxsize=16)
def _valid_profile(data: bytes) -> "Optional[Site]":
    """A kept profile's bytes as a Site, None when not valid (the runs of one sweep keep one text: validated once)."""
    try:
        return _profile(data, SITE_PROFILE)
    except DlaunchError:
        return None


def kept_profile(run_dir: Path) -> "Optional[Site]":
    """The site profile a run directory kept (`site.toml`: the text its job was made from), by which the run is
    judged; None when it kept none (or a link). DlaunchError naming the file when it is no valid profile."""
    path = Path(run_dir) / SITE_PROFILE
    if path.is_symlink() or not path.is_file():
        return None
    data = read_bytes(path, MAX_FILE_BYTES, follow_links=False)
    site = _valid_profile(data)
    return site if site is not None else _profile(data, str(path))  # not valid: raises, naming the file


def kept_threshold(run_dir: Path) -> float:
    """The straggler threshold of the profile a run directory kept; the default when it kept none or one that is
    not valid here (the results database's rule: a row depends on its run directory alone)."""
    try:
        site = kept_profile(run_dir)
    except DlaunchError:
        site = None
    return threshold_of(None, site)


def run_flags(run: Run, threshold: float = DEFAULT_THRESHOLD) -> List[Flag]:
    """A finished run's flags, judged on the mean over its measured epochs (scaling.run_from_metrics makes the Run)."""
    return flags_of(run.phases, run.node_figures, check_threshold(threshold))


def live_flags(run: Run, threshold: float = DEFAULT_THRESHOLD) -> List[Flag]:
    """A live run's flags, judged on its last epoch record."""
    check_threshold(threshold)
    epochs = run.epochs
    return flags_of(epochs[-1].phases, epochs[-1].nodes, threshold) if epochs else []


def flagged(
    runs: Iterable[Run],
    option: Optional[float] = None,
    profile_of: "Callable[[Run], Optional[Site]]" = lambda run: None,
) -> Dict[str, List[Flag]]:
    """Metrics file -> its flags, for the runs that have some (diverged runs are set apart as such, not judged), each
    judged at `threshold_of(option, profile_of(run))`."""
    found = {}
    for run in runs:
        flags = [] if run.diverged else run_flags(run, threshold_of(option, profile_of(run)))
        if flags:
            found[run.path] = flags
    return found


def unflagged(runs: Iterable[Run], flags: Dict[str, List[Flag]]) -> List[Run]:
    """`runs` without the flagged ones (`flags`, as `flagged` judged them): the runs scaling figures, the budget and
    published comparisons take unless the caller includes stragglers."""
    return [run for run in runs if run.path not in flags]
