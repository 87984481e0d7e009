"""Energy, GPU utilisation and peak GPU memory of a run, measured on every rank from cumulative counters.

Sources, one small class each (a source that cannot be used says why: `Unavailable`):
- `NvmlGpu`: NVIDIA's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ since the
  driver loaded, Volta and newer) and utilisation samples, through `nvidia-ml-py` (module `pynvml`).
- `AmdSmiGpu`: AMD's energy accumulator (`amdsmi_get_energy_count`) and `gfx_activity`; where the
  amdsmi Python package is absent, `RocmSmiGpu` asks the `rocm-smi` command.
- `RaplCounter`: CPU package and DRAM counters in `/sys/class/powercap` (intel-rapl zones; AMD CPUs
  use the same names), where readable (often root only since CVE-2020-8694), wrap-around handled.
- `CrayNodeCounter`: the whole node's counter in `/sys/cray/pm_counters/energy` (HPE Cray EX).

Counters, not power samples: a once-a-second power reading misses most of what an A100/H100 draws
(arXiv 2312.02741), the cumulative counters miss nothing. Each rank reads its own GPU; node-level
counters (RAPL, Cray) are read by local rank 0 only, so that a node is counted once. `EnergyMeter`
packs every figure into one vector that the trainer sums over ranks with one collective per
reading (`Framework.all_reduce_sum`); no extra process or thread per GPU.

nvidia-ml-py rather than Zeus: Zeus's `ZeusMonitor` reads the same NVML counter but comes with a
framework's dependencies (pydantic, numpy, rich, ... pinned for current Python) into images that must
stay Python 3.9 / torch 1.11, measures windows per process rather than handing out the counter, and
knows no HPE Cray counters; nvidia-ml-py is NVIDIA's own, dependency-free binding of the one call
needed. Missing libraries are not errors: the figure reads "unavailable: <reason>".
"""

import glob
import json
import os
import subprocess
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from dlaunch.train.metrics_schema import ENERGY_DOMAINS, unavailable

Figure = Union[float, str]  # a measured number, or "unavailable: <reason>"


class Unavailable(Exception):
    """A source that cannot be used here; the message is the reason."""


class Counter:
    """A cumulative energy counter: `update` reads it and returns joules since construction (a
    counter that went back, reset by a driver reload, counts from zero again)."""

    domain = ""
    description = ""
    cheap = True  # read at every stop check; an expensive one only when the ranks sum their figures

    def __init__(self) -> None:
        self._last = self.read_joules()
        self._total = 0.0

    def read_joules(self) -> float:
        """The raw counter in joules (raises Unavailable when it cannot be read)."""
        raise NotImplementedError

    def update(self) -> float:
        raw = self.read_joules()
        step = raw - self._last
        if step < 0:
            step = raw
        self._total += step
        self._last = raw
        return self._total


class NvmlGpu(Counter):
    """One NVIDIA GPU through NVML (nvidia-ml-py)."""

    domain = "gpu"

    def __init__(self, device_index: int, nvml: Any = None):
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]  # the parameter (a fake NVML in tests) or the real module
            except ImportError:
                raise Unavailable("nvidia-ml-py not installed") from None
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            self.handle = nvml_handle(nvml, device_index)
            name = nvml.nvmlDeviceGetName(self.handle)
            super().__init__()
        except nvml.NVMLError as e:
            raise Unavailable("NVML: %s" % e) from None
        self.description = "NVML total-energy counter of %s" % (name.decode() if isinstance(name, bytes) else name)

    def read_joules(self) -> float:
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
        except self.nvml.NVMLError as e:
            raise Unavailable("NVML: %s" % e) from None

    def utilization_pct(self) -> float:
        try:
            return float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except self.nvml.NVMLError as e:
            raise Unavailable("NVML: %s" % e) from None


def _visible_index(device_index: int, variables: Tuple[str, ...]) -> Union[int, str]:
    """The physical index (or UUID) of torch's device `device_index` from a *_VISIBLE_DEVICES list."""
    for name in variables:
        listed = [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]
        if device_index < len(listed):
            entry = listed[device_index]
            return int(entry) if entry.isdigit() else entry
    return device_index


def nvml_handle(nvml: Any, device_index: int) -> Any:
    """NVML's handle of torch's CUDA device: by UUID (torch >= 2.0 knows it), else through
    CUDA_VISIBLE_DEVICES (NVML counts all GPUs of the node, CUDA only the visible ones)."""
    uuid = getattr(torch.cuda.get_device_properties(device_index), "uuid", None) if torch.cuda.is_available() else None
    if uuid is not None:
        return nvml.nvmlDeviceGetHandleByUUID("GPU-%s" % uuid)
    physical = _visible_index(device_index, ("CUDA_VISIBLE_DEVICES",))
    if isinstance(physical, str):
        return nvml.nvmlDeviceGetHandleByUUID(physical)
    return nvml.nvmlDeviceGetHandleByIndex(physical)


_AMD_VISIBLE = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


class AmdSmiGpu(Counter):
    """One AMD GPU through the amdsmi Python package (ROCm >= 6)."""

    domain = "gpu"

    def __init__(self, device_index: int, amdsmi: Any = None):
        if amdsmi is None:
            try:
                import amdsmi  # type: ignore[no-redef]  # the parameter (a fake in tests) or the real module
            except ImportError:
                raise Unavailable("amdsmi not installed") from None
        self.amdsmi = amdsmi
        self.error = getattr(amdsmi, "AmdSmiException", Exception)
        physical = _visible_index(device_index, _AMD_VISIBLE)
        try:
            amdsmi.amdsmi_init()
            handles = amdsmi.amdsmi_get_processor_handles()
            if not isinstance(physical, int) or physical >= len(handles):
                raise Unavailable("amdsmi: no GPU %s among %d" % (physical, len(handles)))
            self.handle = handles[physical]
            super().__init__()
        except self.error as e:
            raise Unavailable("amdsmi: %s" % e) from None
        self.description = "amdsmi energy accumulator of GPU %d" % physical

    def read_joules(self) -> float:
        try:
            count = self.amdsmi.amdsmi_get_energy_count(self.handle)
        except self.error as e:
            raise Unavailable("amdsmi: %s" % e) from None
        # `energy_accumulator` since amdsmi 6.2.1, `power` before; times the resolution in µJ.
        accumulated = count["energy_accumulator"] if "energy_accumulator" in count else count["power"]
        return accumulated * count["counter_resolution"] / 1e6

    def utilization_pct(self) -> float:
        try:
            return float(self.amdsmi.amdsmi_get_gpu_activity(self.handle)["gfx_activity"])
        except self.error as e:
            raise Unavailable("amdsmi: %s" % e) from None


class RocmSmiGpu(Counter):
    """One AMD GPU through the `rocm-smi` command (older ROCm without the amdsmi package); a command
    per reading, so it is read only when the ranks sum their figures (64-bit counter: no wrap)."""

    domain = "gpu"
    cheap = False

    def __init__(self, device_index: int, command: str = "rocm-smi"):
        self.command = command
        self.device = _visible_index(device_index, _AMD_VISIBLE)
        super().__init__()
        self.description = "rocm-smi energy counter of GPU %s" % self.device

    def _query(self, option: str) -> Dict[str, Any]:
        try:
            out = subprocess.run(
                [self.command, "-d", str(self.device), option, "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            cards = json.loads(out)
            return next(iter(v for k, v in cards.items() if k.startswith("card")))
        except FileNotFoundError:
            raise Unavailable("rocm-smi not found") from None
        except (OSError, subprocess.SubprocessError, ValueError, StopIteration) as e:
            raise Unavailable("rocm-smi %s: %s" % (option, e or type(e).__name__)) from None

    def read_joules(self) -> float:
        card = self._query("--showenergycounter")
        try:
            return float(card["Accumulated Energy (uJ)"]) / 1e6
        except (KeyError, ValueError):
            raise Unavailable("rocm-smi --showenergycounter: no 'Accumulated Energy (uJ)'") from None

    def utilization_pct(self) -> float:
        try:
            return float(self._query("--showuse")["GPU use (%)"])
        except (KeyError, ValueError):
            raise Unavailable("rocm-smi --showuse: no 'GPU use (%)'") from None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError as e:
        raise Unavailable("%s: %s" % (path, e.strerror or e)) from None


class RaplCounter(Counter):
    """The sum of RAPL zones of one kind in a powercap tree: `cpu` = the packages (`package-N`),
    `dram` = their DRAM sub-zones. Each zone's `energy_uj` wraps at its `max_energy_range_uj`."""

    def __init__(self, domain: str, root: str = "/sys/class/powercap"):
        self.domain = domain
        packages = sorted(glob.glob(os.path.join(root, "intel-rapl:[0-9]*")))
        packages = [z for z in packages if os.path.basename(z).count(":") == 1]
        if not packages:
            raise Unavailable("no RAPL zones in %s" % root)
        if domain == "cpu":
            self.zones = packages
        else:
            subzones = [z for p in packages for z in sorted(glob.glob(p + ":[0-9]*"))]
            self.zones = [z for z in subzones if _read_text(os.path.join(z, "name")) == "dram"]
            if not self.zones:
                raise Unavailable("no RAPL dram zone in %s" % root)
        self.ranges = [int(_read_text(os.path.join(z, "max_energy_range_uj"))) / 1e6 for z in self.zones]
        self._zone_last = self._raw()
        self._zone_total = [0.0] * len(self.zones)
        self.description = "RAPL %s (%s)" % (domain, ", ".join(os.path.basename(z) for z in self.zones))

    def _raw(self) -> List[float]:
        return [int(_read_text(os.path.join(z, "energy_uj"))) / 1e6 for z in self.zones]

    def update(self) -> float:
        """Zone by zone, since each wraps on its own."""
        raw = self._raw()
        for i, (now, last, wrap) in enumerate(zip(raw, self._zone_last, self.ranges)):
            self._zone_total[i] += now - last if now >= last else now + wrap - last
        self._zone_last = raw
        return sum(self._zone_total)


class CrayNodeCounter(Counter):
    """The node's energy in joules from HPE Cray's `pm_counters/energy` (a line `<joules> J`)."""

    domain = "node"

    def __init__(self, root: str = "/sys/cray/pm_counters"):
        self.path = os.path.join(root, "energy")
        if not os.path.exists(self.path):
            raise Unavailable("no %s (not an HPE Cray node)" % self.path)
        super().__init__()
        self.description = "HPE Cray node counter %s" % self.path

    def read_joules(self) -> float:
        text = _read_text(self.path)
        try:
            value, unit = text.split()
        except ValueError:
            raise Unavailable("%s: cannot parse %r" % (self.path, text)) from None
        if unit != "J":
            raise Unavailable("%s: unit %r, expected J" % (self.path, unit))
        return float(value)


NOT_LEADER = unavailable("measured by the node's local rank 0")


def _first_available(*makers: Callable[[], Counter]) -> Union[Counter, str]:
    """The first source that works, else the reasons of all, joined."""
    reasons = []
    for make in makers:
        try:
            return make()
        except Unavailable as e:
            reasons.append(str(e))
    return unavailable("; ".join(reasons))


def probe_sources(device: torch.device, node_leader: bool) -> Dict[str, Union[Counter, str]]:
    """This rank's source per domain (or "unavailable: <reason>"). Node-level domains are measured
    by the node's leader (local rank 0) only; the others say so."""
    sources: Dict[str, Union[Counter, str]] = {}
    if device.type != "cuda":
        sources["gpu"] = unavailable("this run uses no GPU (device %s)" % device.type)
    elif getattr(torch.version, "hip", None):
        index = device.index or 0
        sources["gpu"] = _first_available(lambda: AmdSmiGpu(index), lambda: RocmSmiGpu(index))
    else:
        index = device.index or 0
        sources["gpu"] = _first_available(lambda: NvmlGpu(index))
    for domain in ("cpu", "dram"):
        sources[domain] = _first_available(lambda d=domain: RaplCounter(d)) if node_leader else NOT_LEADER  # type: ignore[misc]  # mypy cannot type a lambda that binds its values as defaults
    sources["node"] = _first_available(CrayNodeCounter) if node_leader else NOT_LEADER
    return sources


class Reading:
    """One all-rank reading: energy since the meter started (per domain), and the epoch's mean GPU
    utilisation and largest peak GPU memory."""

    def __init__(self, energy_j: Dict[str, Figure], utilization_pct: Figure, memory_peak_bytes: Figure):
        self.energy_j = energy_j
        self.utilization_pct = utilization_pct
        self.memory_peak_bytes = memory_peak_bytes


class EnergyMeter:
    """This rank's sources, read at `poll` (often enough to follow counter wrap-around) and summed
    over ranks by `reduce`. Utilisation samples and the peak-memory mark restart at `start_epoch`."""

    def __init__(
        self,
        sources: Dict[str, Union[Counter, str]],
        device: torch.device,
        rank: int,
        world_size: int,
        node_leader: bool,
    ):
        self.sources = sources
        self.device = device
        self.rank, self.world_size = rank, world_size
        self.node_leader = node_leader
        self.joules: Dict[str, float] = {d: 0.0 for d, s in sources.items() if isinstance(s, Counter)}
        self.utilization: List[float] = []
        self.utilization_reason = self._gpu_reason()
        self.start_epoch()

    @classmethod
    def for_rank(cls, device: torch.device, rank: int, world_size: int, local_rank: int) -> "EnergyMeter":
        node_leader = local_rank == 0
        return cls(probe_sources(device, node_leader), device, rank, world_size, node_leader)

    def _gpu_reason(self) -> Optional[str]:
        gpu = self.sources.get("gpu")
        return gpu if isinstance(gpu, str) else None

    def describe(self) -> Dict[str, str]:
        """domain -> the source used on this rank, or why none (for the metrics header)."""
        return {d: s.description if isinstance(s, Counter) else s for d, s in self.sources.items()}

    def start_epoch(self) -> None:
        self.utilization = []
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def poll(self, everything: bool = False) -> None:
        """Read the counters (all, or the cheap ones; a source that fails from now on becomes
        unavailable) and sample utilisation."""
        for domain in list(self.joules):
            if not (everything or self.sources[domain].cheap):  # type: ignore[union-attr]  # a domain in joules has a Counter source
                continue
            try:
                self.joules[domain] = self.sources[domain].update()  # type: ignore[union-attr]  # a domain in joules has a Counter source
            except Unavailable as e:
                self.sources[domain] = unavailable(str(e))
                del self.joules[domain]
        gpu = self.sources.get("gpu")
        if isinstance(gpu, Counter) and (everything or gpu.cheap) and self.utilization_reason is None:
            try:
                self.utilization.append(gpu.utilization_pct())  # type: ignore[attr-defined]  # the gpu source is a GPU counter (NVML, amdsmi or rocm-smi)
            except Unavailable as e:
                self.utilization_reason = unavailable(str(e))

    def local_vector(self) -> List[float]:
        """Per domain (joules, measured here, expected here); utilisation (sum, ranks); one peak-memory
        slot per rank and the number of ranks that filled theirs. Summed over ranks by `reduce`."""
        vector: List[float] = []
        for domain in ENERGY_DOMAINS:
            expected = domain == "gpu" and self.device.type == "cuda" or domain != "gpu" and self.node_leader
            measured = domain in self.joules
            vector += [self.joules.get(domain, 0.0), float(measured), float(expected)]
        utilization = self.utilization and self.utilization_reason is None
        vector += [sum(self.utilization) / len(self.utilization) if utilization else 0.0, float(bool(utilization))]
        memory = [0.0] * self.world_size
        if self.device.type == "cuda":
            memory[self.rank] = float(torch.cuda.max_memory_allocated(self.device))
        return vector + memory + [float(self.device.type == "cuda")]

    def reduce(self, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> Reading:
        """Read everything, then sum every rank's figures with one collective (all ranks call it)."""
        self.poll(everything=True)
        local = torch.tensor(self.local_vector(), dtype=torch.float64, device=self.device)
        return self.interpret(all_reduce_sum(local).tolist())

    def interpret(self, summed: List[float]) -> Reading:
        """Figures from the summed vector; where a domain is not measured on every rank that should
        measure it, this rank's reason (or how many measured it)."""
        energy: Dict[str, Figure] = {}
        for i, domain in enumerate(ENERGY_DOMAINS):
            joules, measured, expected = summed[3 * i : 3 * i + 3]
            own = self.sources.get(domain)
            if expected > 0 and round(measured) == round(expected):
                energy[domain] = joules
            elif isinstance(own, str) and own != NOT_LEADER:
                energy[domain] = own
            elif expected > 0:
                energy[domain] = unavailable("measured on %d of %d ranks only" % (round(measured), round(expected)))
            else:
                energy[domain] = own if isinstance(own, str) else unavailable("no rank measures it")
        rest = summed[3 * len(ENERGY_DOMAINS) :]
        utilization_sum, utilization_ranks = rest[0], round(rest[1])
        memory, memory_ranks = rest[2 : 2 + self.world_size], round(rest[-1])
        gpu_ranks = round(summed[3 * ENERGY_DOMAINS.index("gpu") + 2])
        if gpu_ranks and utilization_ranks == gpu_ranks:
            utilization: Figure = utilization_sum / utilization_ranks
        elif utilization_ranks:
            utilization = unavailable("sampled on %d of %d ranks only" % (utilization_ranks, gpu_ranks))
        else:
            utilization = self.utilization_reason or unavailable("no utilisation sample in this epoch")
        peak: Figure = (
            max(memory)
            if memory_ranks == self.world_size
            else unavailable(
                "this run uses no GPU (device %s)" % self.device.type
                if not memory_ranks
                else "measured on %d of %d ranks only" % (memory_ranks, self.world_size)
            )
        )
        return Reading(energy, utilization, peak)
