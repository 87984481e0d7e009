"""GPU health of this rank's GPU: SM clock against its maximum, clock event (throttle) reasons, temperature.

Read through NVML (nvidia-ml-py, `import pynvml`, NVIDIA's own binding, on the GPU's own handle as
dlaunch/train/energy.py finds it), sampled when the energy meter polls (every stop check) and once at the end of
each epoch's steps (`end_epoch`). An epoch's figures on this rank, a fixed-size vector (`HEALTH_SLOTS`) that
dlaunch/train/phases.py gathers with the epoch's phases:
- reason: 0 when measured, else a code of `REASONS` (no GPU, no nvidia-ml-py, not an NVIDIA GPU, an NVML error:
  the rank prints that error once on its standard error);
- sm_clock_mhz: the mean SM clock over the samples, leaving out those in which NVML names the GPU idle while
  others exist (an idle GPU lowers its clock without being held back);
- sm_clock_max_mhz: the GPU's maximum SM clock (NVML's max clock);
- throttle_bits: NVML's clock event reasons seen in any sample (nvmlClocksEventReason*, named
  nvmlClocksThrottleReason* before NVML 12.2), named by `THROTTLE_BITS`; idle, application-clock and display
  settings are not reasons;
- temperature_c: the highest GPU temperature.
`node_health` turns the vectors of a node's ranks into the metrics record's GPU_HEALTH.
"""

import sys
from typing import Any, Dict, List, Sequence, Tuple, Union

import torch

from dlaunch.train.energy import nvml_handle
from dlaunch.train.metrics_schema import THROTTLE_REASONS, unavailable

HEALTH_SLOTS = ("reason", "sm_clock_mhz", "sm_clock_max_mhz", "throttle_bits", "temperature_c")
MEASURED, NO_GPU, NO_NVML, NOT_NVIDIA, NVML_ERROR = range(5)
REASONS = {
    NO_GPU: "this run uses no GPU",
    NO_NVML: "nvidia-ml-py not installed",
    NOT_NVIDIA: "not an NVIDIA GPU (NVML reads NVIDIA GPUs only)",
    NVML_ERROR: "NVML error (the rank's standard error names it)",
}
# nvml.h: NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, and the clock event reason bits.
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, NVML_FEATURE_ENABLED = 1, 0, 1
GPU_IDLE_BIT = 0x1
THROTTLE_BITS = (
    (0x4, "power cap"),  # SW power cap
    (0x8, "hardware slowdown"),  # HW slowdown
    (0x10, "sync boost"),
    (0x20, "thermal"),  # SW thermal slowdown
    (0x40, "thermal"),  # HW thermal slowdown
    (0x80, "power brake"),
)  # HW power brake slowdown

Health = Union[Dict[str, Any], str]  # a GPU_HEALTH of the metrics schema


def throttle_names(bits: int) -> List[str]:
    """The reasons among NVML's clock event `bits`, in the order of THROTTLE_REASONS."""
    seen = {name for bit, name in THROTTLE_BITS if bits & bit}
    return [name for name in THROTTLE_REASONS if name in seen]


def _event_reasons(nvml: Any) -> Any:
    """NVML's call for the current clock event reasons (renamed in nvidia-ml-py 12.535)."""
    renamed = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    return renamed or nvml.nvmlDeviceGetCurrentClocksThrottleReasons


class GpuHealth:
    """This rank's GPU read through NVML (`nvml`, `handle`), or a `reason` code why it is not."""

    def __init__(self, nvml: Any = None, handle: Any = None, reason: int = MEASURED, error: str = ""):
        self.nvml, self.handle, self.reason = nvml, handle, reason
        self.max_clock = 0.0
        if reason == MEASURED:
            try:
                self.max_clock = float(nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM))
            except nvml.NVMLError as e:
                error = str(e)
                self.reason = NVML_ERROR
        if error:
            print("train: GPU health unavailable: NVML: %s" % error, file=sys.stderr)
        self._reset()

    @classmethod
    def for_device(cls, device: torch.device, nvml: Any = None) -> "GpuHealth":
        if device.type != "cuda":
            return cls(reason=NO_GPU)
        if getattr(torch.version, "hip", None):
            return cls(reason=NOT_NVIDIA)
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]  # the parameter (a fake NVML in tests) or the real module
            except ImportError:
                return cls(reason=NO_NVML)
        try:
            nvml.nvmlInit()
            return cls(nvml, nvml_handle(nvml, device.index or 0))
        except nvml.NVMLError as e:
            return cls(reason=NVML_ERROR, error=str(e))

    def _reset(self) -> None:
        self.clocks: List[float] = []  # all samples' SM clocks
        self.busy_clocks: List[float] = []  # those of samples in which the GPU was not idle
        self.bits = 0
        self.temperature = 0.0

    def sample(self) -> None:
        """Read clock, clock event reasons and temperature once (an NVML error ends the measuring)."""
        if self.reason != MEASURED:
            return
        nvml = self.nvml
        try:
            clock = float(nvml.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM))
            bits = int(_event_reasons(nvml)(self.handle))
            temperature = float(nvml.nvmlDeviceGetTemperature(self.handle, NVML_TEMPERATURE_GPU))
        except nvml.NVMLError as e:
            print("train: GPU health unavailable from now on: NVML: %s" % e, file=sys.stderr)
            self.reason = NVML_ERROR
            return
        self.clocks.append(clock)
        if not bits & GPU_IDLE_BIT:
            self.busy_clocks.append(clock)
        self.bits |= bits
        self.temperature = max(self.temperature, temperature)

    def memory_faults(self) -> Union[List[str], str]:
        """The memory faults NVML reports that leave the GPU unfit until it is reset or repaired: row remapping pending
        or failed (A100 on), retired pages pending (earlier GPUs), uncorrectable ECC errors since the driver loaded
        (DCGM's diagnostics check the same). [] when none; 'unavailable: ...' when NVML answers none of these."""
        if self.reason != MEASURED:
            return unavailable(REASONS.get(self.reason, "reason %d" % self.reason))
        nvml, faults, answered = self.nvml, [], 0
        try:
            _, uncorrectable, pending, failed = nvml.nvmlDeviceGetRemappedRows(self.handle)
            answered += 1
            if pending:
                faults.append("row remapping pending (%d uncorrectable rows): the GPU needs a reset" % uncorrectable)
            if failed:
                faults.append("row remapping failed: the GPU needs repair")
        except nvml.NVMLError:  # not an A100 or later: its retired pages instead
            try:
                if nvml.nvmlDeviceGetRetiredPagesPendingStatus(self.handle) == NVML_FEATURE_ENABLED:
                    faults.append("retired pages pending: the GPU needs a reset")
                answered += 1
            except nvml.NVMLError:
                pass
        try:
            errors = int(
                nvml.nvmlDeviceGetTotalEccErrors(self.handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
            )
            answered += 1
            if errors:
                faults.append("%d uncorrectable ECC error(s) since the driver loaded" % errors)
        except nvml.NVMLError:  # ECC off or not supported
            pass
        if not answered:
            return unavailable("NVML reports neither row remapping, retired pages nor ECC errors for this GPU")
        return faults

    def end_epoch(self) -> List[float]:
        """Sample once more, return the epoch's vector (HEALTH_SLOTS) and start the next epoch's samples."""
        self.sample()
        if self.reason != MEASURED:
            vector = [float(self.reason), 0.0, 0.0, 0.0, 0.0]
        else:
            clocks = self.busy_clocks or self.clocks
            vector = [float(MEASURED), sum(clocks) / len(clocks), self.max_clock, float(self.bits), self.temperature]
        self._reset()
        return vector


def node_health(gpus: Sequence[Tuple[int, Sequence[float]]]) -> Health:
    """GPU_HEALTH of a node from (local rank, HEALTH_SLOTS vector) of each of its ranks: the figures of one GPU, named
    by its local rank, with its own throttle reasons and temperature: among the GPUs with a throttle reason (else
    all), the one with the lowest mean SM clock against its maximum. "unavailable: ..." when some GPU of the node was
    not measured. (Records before phases method "rank-timers-median-rank" held the reasons of all the node's GPUs.)"""
    measured = [(local_rank, v) for local_rank, v in gpus if int(v[0]) == MEASURED]
    if len(measured) < len(gpus):
        reasons = "; ".join(
            REASONS.get(code, "reason %d" % code)
            for code in sorted({int(v[0]) for _, v in gpus if int(v[0]) != MEASURED})
        )
        if not measured:
            return unavailable(reasons)
        return unavailable("measured on %d of %d GPUs only (%s)" % (len(measured), len(gpus), reasons))
    throttled = [(local_rank, v) for local_rank, v in measured if throttle_names(int(v[3]))]

    def held_back(entry: Tuple[int, Sequence[float]]) -> Tuple[bool, float, int]:
        """The SM clock against its maximum (GPUs whose maximum was not read after those whose was, by clock), then
        the local rank."""
        local_rank, v = entry
        return (not v[2], v[1] / v[2] if v[2] else v[1], local_rank)

    local_rank, gpu = min(throttled or measured, key=held_back)
    return {
        "sm_clock_mhz": gpu[1],
        "sm_clock_max_mhz": gpu[2],
        "local_rank": local_rank,
        "throttle": throttle_names(int(gpu[3])),
        "temperature_c": gpu[4],
    }
