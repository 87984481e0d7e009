"""Slurm's own energy figure of a job (`sacct -o ConsumedEnergyRaw`), beside the trainer's.

Slurm's figure comes from its `AcctGatherEnergyType` plugin (RAPL, IPMI, HPE Cray pm_counters,
NVML GPU...), per node over the whole allocation, so it counts what the trainer's counters do not
(idle GPUs, start-up, the container) and, on a shared node, other jobs too (sacct: "only in the case
of an exclusive job allocation does this value reflect the job's real energy consumption"). Where no
plugin is configured Slurm records 0, which is "unavailable", not zero joules.
"""
import subprocess
from typing import Callable, List, Optional, Union

Figure = Union[float, str]  # joules, or "unavailable: <reason>"
# sacct prints ConsumedEnergy with a unit prefix in steps of 1000 (`convert_num_unit2(..., 1000, ...)`).
PREFIXES = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
NO_VALUE = 2 ** 64 - 2  # Slurm's NO_VAL64, printed by some versions for "not recorded"


def sacct_command(job_id: str) -> List[str]:
    """The allocation's line only (-X), no header, `|`-separated: JobID|ConsumedEnergyRaw."""
    return ["sacct", "-j", job_id, "-X", "--noheader", "--parsable2", "-o", "JobID,ConsumedEnergyRaw"]


def parse_energy_value(text: str) -> Optional[float]:
    """Joules from a ConsumedEnergy(Raw) cell ("12345", "1.50M"); None for an empty or unknown cell."""
    text = text.strip()
    factor = 1.0
    if text[-1:].isalpha():
        if text[-1].upper() not in PREFIXES:
            return None
        text, factor = text[:-1], PREFIXES[text[-1].upper()]
    try:
        return float(text) * factor
    except ValueError:
        return None


def parse_consumed_energy(output: str, job_id: str) -> Figure:
    """The job's energy from `sacct ... -o JobID,ConsumedEnergy[Raw] --parsable2` output (the line
    whose JobID is `job_id`, or its first line), or "unavailable: <reason>"."""
    rows = [line.split("|") for line in output.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) >= 2]
    if not rows:
        return "unavailable: sacct knows no job %s" % job_id
    row = next((r for r in rows if r[0].strip() == job_id), rows[0])
    joules = parse_energy_value(row[1])
    if joules is None:
        return "unavailable: sacct gave ConsumedEnergy %r" % row[1].strip()
    if joules == 0 or joules >= NO_VALUE:
        return "unavailable: Slurm recorded no energy (no AcctGatherEnergyType plugin on the nodes?)"
    return joules


def slurm_job_energy(job_id: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                     timeout_s: float = 10.0) -> Figure:
    """Ask sacct for the job's energy; a missing or failing sacct is a reason, not an error."""
    try:
        result = run(sacct_command(job_id), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return "unavailable: no sacct on this machine"
    except (OSError, subprocess.TimeoutExpired) as e:
        return "unavailable: sacct: %s" % (e.strerror if isinstance(e, OSError) else "no answer within %g s" % timeout_s)
    if result.returncode != 0:
        message = (result.stderr or "").strip().splitlines()
        return "unavailable: sacct: %s" % (message[-1] if message else "exit %d" % result.returncode)
    return parse_consumed_energy(result.stdout, job_id)
