"""Where an epoch's time goes, per rank: the phases of its steps, its time outside the steps, one gather per epoch
(the metrics schema's version 4 fields `phases`, `nodes`, `overhead`: dlaunch/train/metrics_schema.py).

Per step, each rank marks eight moments (`MARKS`):
  requested       asking the loader for the batch
  batch           the batch in hand
  forward_begin   the model's own forward begins (a hook on the inner module: inside DDP's wrapper, after its
  forward_end     ... and ends                    buffer broadcast)
  backward_begin  backward is called
  last_gradient   the gradient of the model's first parameter is computed (a hook on it: the input layer's, the
                  last gradient backward computes)
  ready           gradients ready for the optimizer (`Framework.synchronize_gradients` returned: DDP and DeepSpeed
                  at backward's end, Horovod after optimizer.synchronize(), a parameter server's worker after its
                  push and pull)
  updated         the optimizer's update (and the loss scaler's) done
and derives its phases (`STEP_PHASES`, seconds per step, each the mean over the rank's timed steps):
  data_s = batch - requested;  forward_s = forward_end - forward_begin;
  compute_s = forward_s + (last_gradient - backward_begin);
  sync_s = ready - last_gradient;  optimizer_s = updated - ready;  step_s = updated - requested;
  other_s = step_s - data_s - compute_s - sync_s - optimizer_s (LR setting, zero_grad, the loss, DDP's buffer
  broadcast before forward, Python).
compute_s needs no extra step, no device sync and no change to training, and it holds no collective for DDP,
Horovod and DeepSpeed ZeRO 0-2; ZeRO-3 gathers parameters inside forward, so its compute_s includes those waits.
Under ZeRO 1-2 each rank updates its partition and the engine's step all-gathers the updated parameters: that
collective is in optimizer_s. The slowest rank is the one with the longest forward_s: unlike backward, forward
overlaps no communication (DDP's all-reduce of the buckets already done runs beside the rest of backward and
competes with it for the GPU's SMs or a CPU's cores, so a rank's backward also slows when its peers are slow).
On a GPU the marks are CUDA events recorded on the current stream (a small pool, read once done, or after the
device sync that closes the epoch's steps), so timing adds no device sync, and every phase is the device's view:
data_s is the part of the wait for a batch that the GPU saw (0 when queued work hid it). On a CPU they are
time.perf_counter readings.

The timers count the measured steps only, those images/s counts: warm-up steps are not timed, profiled steps
(`--profile-steps`: synchronised un-overlapped parts, the `profile` record, dlaunch/train/profiling.py) and
kernel-profiled steps (`--kernel-profile-steps`: the `kernel_profile` record) keep their own timers. What happens
between steps (the stop check every few steps, the loop's bookkeeping) is in no phase. A resumed epoch times the
steps after its resume.

Per epoch, outside the steps (`EpochOverhead`, each rank's wall clock; rank 0's are written, `OVERHEAD_PARTS`):
  loader_start_s  set_epoch + creating the iterator (DataLoader workers start, DALI pipeline reset)
  validation_s    the validation pass (0 when none this epoch)
  checkpoint_s    writing the checkpoint and the barrier after it
  barrier_s       the device syncs + barriers that open and close the measured window, and the stop check
                  between epochs
  metrics_s       the rank means, the energy reading, the phase gather, writing the previous epoch's record
Once per epoch every rank fills its row (`ROW`: phases, steps, local rank, outside-step times, GPU health) of a
[world_size x K] float64 table; one all_reduce_sum brings every row to every rank (`gather_rows`), and rank 0
summarises them (`phase_fields`, `overhead_fields`, pure: the median rank's phases (`PHASES_METHOD`), the rank with
the longest forward pass, and per node its ranks, median rank, slowest rank and GPU health). The gather's cost does
not depend on the model (benchmarks/bench_gather.py).
"""

import collections
import contextlib
import statistics
import time
from typing import Any, Callable, Deque, Dict, Iterator, List, Sequence

import torch

from dlaunch.train.gpuhealth import HEALTH_SLOTS, node_health
from dlaunch.train.metrics_schema import OVERHEAD_PARTS, PHASES_METHOD, STEP_PHASES

# PHASES_METHOD (metrics_schema.py): "median" is the median rank's phases, a real rank (`_median_rank`), so "the
# slowest rank is 53 % slower than the median rank" is its true excess over an actual rank, and the median rank's
# sync_s holds its own wait for the slowest (dlaunch/analysis/stragglers.py also reads the method before it).

MARKS = ("requested", "batch", "forward_begin", "forward_end", "backward_begin", "last_gradient", "ready", "updated")
GPU_SLOTS = tuple("gpu_" + slot for slot in HEALTH_SLOTS)
ROW = STEP_PHASES + ("steps", "local_rank") + OVERHEAD_PARTS + GPU_SLOTS  # one rank's row of the epoch's gather


class HostMarks:
    """One step's marks as time.perf_counter readings (CPU runs)."""

    def __init__(self) -> None:
        self.times: Dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.times[name] = time.perf_counter()

    def clear(self) -> None:
        self.times.clear()

    def recorded(self) -> bool:
        return len(self.times) == len(MARKS)

    def done(self) -> bool:
        return True

    def seconds(self, begin: str, end: str) -> float:
        return self.times[end] - self.times[begin]


class CudaMarks:
    """One step's marks as CUDA events on the current stream (reused; read once all are done)."""

    def __init__(self) -> None:
        self.events = {name: torch.cuda.Event(enable_timing=True) for name in MARKS}
        self.names: set = set()  # the marks recorded in this use (an event keeps an earlier use's time)

    def mark(self, name: str) -> None:
        self.events[name].record()
        self.names.add(name)

    def clear(self) -> None:
        self.names.clear()

    def recorded(self) -> bool:
        return len(self.names) == len(MARKS)

    def done(self) -> bool:
        """Every recorded mark reached (the last-gradient hook records from autograd's thread, on its stream)."""
        return all(self.events[name].query() for name in self.names)

    def seconds(self, begin: str, end: str) -> float:
        return self.events[begin].elapsed_time(self.events[end]) / 1000.0


def step_phases(seconds: Callable[[str, str], float]) -> List[float]:
    """A step's STEP_PHASES from `seconds(begin mark, end mark)`."""
    data = seconds("requested", "batch")
    forward = seconds("forward_begin", "forward_end")
    compute = forward + seconds("backward_begin", "last_gradient")
    sync = seconds("last_gradient", "ready")
    optimizer = seconds("ready", "updated")
    step = seconds("requested", "updated")
    return [data, forward, compute, sync, optimizer, max(0.0, step - data - compute - sync - optimizer), step]


class StepTimer:
    """This rank's step phases over an epoch: `begin` a timed step, `mark` its moments (the hooks `install` adds
    mark the forward and the last gradient), `end` it; `epoch_means` after the epoch's closing device sync.
    Marks outside a timed step (warm-up, profiled steps, validation) are ignored."""

    def __init__(self, device: torch.device, make_marks: Any = None):
        self.make_marks = make_marks or (CudaMarks if device.type == "cuda" else HostMarks)
        self.free: List[Any] = []
        self.pending: Deque[Any] = collections.deque()
        self.current: Any = None
        self.sums = [0.0] * len(STEP_PHASES)
        self.steps = 0

    def install(self, module: torch.nn.Module) -> None:
        """Hooks on `module` (the model itself, not a wrapper) and on its first parameter's gradient."""
        first = next(p for p in module.parameters() if p.requires_grad)
        module.register_forward_pre_hook(lambda _module, _inputs: self.mark("forward_begin"))
        module.register_forward_hook(lambda _module, _inputs, _output: self.mark("forward_end"))
        first.register_hook(lambda _grad: self.mark("last_gradient"))

    def begin(self, timed: bool) -> None:
        """A step starts: it is asking for its batch now (`timed`: a measured step)."""
        if not timed:
            return
        self.current = self.free.pop() if self.free else self.make_marks()
        self.current.clear()
        self.current.mark("requested")

    def mark(self, name: str) -> None:
        if self.current is not None:
            self.current.mark(name)

    def end(self) -> None:
        """The step's update is done (on the host: queued on the device); read the steps whose marks are done."""
        if self.current is None:
            return
        self.current.mark("updated")
        self.pending.append(self.current)
        self.current = None
        self._read_done()

    def _read_done(self) -> None:
        while self.pending and self.pending[0].done():
            marks = self.pending.popleft()
            if marks.recorded():
                self.steps += 1
                self.sums = [total + value for total, value in zip(self.sums, step_phases(marks.seconds))]
            self.free.append(marks)

    def epoch_means(self) -> List[float]:
        """[steps timed] + the mean of each STEP_PHASES over them (call after the device sync that closes the
        epoch's steps: every mark is done then); starts the next epoch's sums."""
        self._read_done()
        steps, sums = self.steps, self.sums
        self.pending.clear()
        self.steps, self.sums = 0, [0.0] * len(STEP_PHASES)
        return [float(steps)] + [total / steps if steps else 0.0 for total in sums]


class EpochOverhead:
    """Seconds of one epoch outside its steps, per part of OVERHEAD_PARTS."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(OVERHEAD_PARTS, 0.0)

    @contextlib.contextmanager
    def timed(self, part: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - began


def rank_row(
    step_means: Sequence[float], local_rank: int, overhead: Dict[str, float], health: Sequence[float]
) -> List[float]:
    """This rank's ROW: `step_means` from StepTimer.epoch_means, `health` from GpuHealth.end_epoch."""
    steps, means = step_means[0], list(step_means[1:])
    return means + [steps, float(local_rank)] + [overhead[part] for part in OVERHEAD_PARTS] + list(health)


def gather_rows(
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    row: Sequence[float],
    rank: int,
    world_size: int,
    device: torch.device,
) -> List[List[float]]:
    """Every rank's row, index = rank: one all_reduce_sum of a [world_size x len(ROW)] table (all ranks call it)."""
    table = torch.zeros((world_size, len(ROW)), dtype=torch.float64, device=device)
    table[rank] = torch.tensor(list(row), dtype=torch.float64, device=device)
    return all_reduce_sum(table).tolist()


def _slowest(ranks: List[Dict[str, float]], members: Sequence[int]) -> int:
    """The rank among `members` with the longest forward pass (the lowest such rank on a tie): the straggler
    measure, as forward overlaps no communication (backward does: DDP's all-reduce of the buckets already done
    competes with the rest of backward for the GPU's SMs, or for a CPU's cores)."""
    return max(members, key=lambda r: (ranks[r]["forward_s"], -r))


def _median_rank(ranks: List[Dict[str, float]], members: Sequence[int]) -> int:
    """The rank among `members` whose forward pass is their statistics.median_low (of 2 the faster; the lowest such
    rank on a tie)."""
    forward = statistics.median_low(ranks[r]["forward_s"] for r in members)
    return min(r for r in members if ranks[r]["forward_s"] == forward)


def overhead_fields(row: Sequence[float], more_metrics_s: float) -> Dict[str, float]:
    """The epoch record's `overhead` from rank 0's row, with `more_metrics_s` (the gather and its summary, which
    the row cannot hold) added to metrics_s."""
    overhead = {part: row[ROW.index(part)] for part in OVERHEAD_PARTS}
    overhead["metrics_s"] += more_metrics_s
    overhead["total_s"] = sum(overhead.values())
    return overhead


def phase_fields(rows: Sequence[Sequence[float]], hosts: Sequence[str]) -> Dict[str, Any]:
    """The epoch record's `phases` and `nodes` from every rank's row (`hosts`: index = rank), medians as
    PHASES_METHOD says; {} when some rank timed no step."""
    ranks = [dict(zip(ROW, row)) for row in rows]
    steps = int(min(r["steps"] for r in ranks))
    if steps == 0:
        return {}
    fields: Dict[str, Any] = {}
    slowest, median = _slowest(ranks, range(len(ranks))), _median_rank(ranks, range(len(ranks)))
    fields["phases"] = {
        "method": PHASES_METHOD,
        "steps": steps,
        "ranks": len(ranks),
        "median": {p: ranks[median][p] for p in STEP_PHASES},
        "slowest": dict(
            {"rank": slowest, "host": hosts[slowest], "local_rank": int(ranks[slowest]["local_rank"])},
            **{p: ranks[slowest][p] for p in STEP_PHASES},
        ),
    }
    by_host: Dict[str, List[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    fields["nodes"] = []
    for host, members in by_host.items():
        slow, middle = _slowest(ranks, members), _median_rank(ranks, members)
        gpus = [(int(ranks[r]["local_rank"]), [ranks[r][slot] for slot in GPU_SLOTS]) for r in members]
        fields["nodes"].append(
            {
                "host": host,
                "ranks": len(members),
                "median_forward_s": ranks[middle]["forward_s"],
                "median_compute_s": ranks[middle]["compute_s"],
                "slowest": {
                    "rank": slow,
                    "local_rank": int(ranks[slow]["local_rank"]),
                    "forward_s": ranks[slow]["forward_s"],
                    "compute_s": ranks[slow]["compute_s"],
                },
                "gpu": node_health(gpus),
            }
        )
    return fields
