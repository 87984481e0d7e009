"""The metrics file schema (`dlaunch.metrics`, versioned), shared by the trainer and the launcher.

Plain Python 3.9, no third-party imports: the launcher reads metrics files on login nodes without
torch, and the trainer writes them inside images that carry nothing but the trainer.

A metrics file is JSON lines. Every record has `schema`, `version`, `type` and `time` (Unix
seconds). Types and their fields are in `RECORD_FIELDS`; `validate_record` checks one record,
`read_metrics` reads and checks a whole file.

Versions: 5 is written; 1 to 5 are read (a file resumed by a newer trainer mixes them). Version 5 adds the end status
`hung` (no step finished within the hang timeout, dlaunch/train/watchdog.py; exit code 69) and the end record's
optional `hang`: {file: "hang.json", timeout_s, silent: the silent processes, flight_recorder: the first collective not
every rank entered, or null, or "unavailable: <reason>"}, a copy of the hang record's fields of those names
(dlaunch/train/heartbeat.py documents them), its `summary` as the end record's `reason`. The `end` record is written by
rank 0: where rank 0 is the silent process there is none, and the hang record `hang.json` in the run directory, written
by the lowest live process, is the only record (a run without an end record whose run directory holds `hang.json`
hung). Version 4
adds optional epoch-record fields that explain where an epoch's time went (dlaunch/train/phases.py,
dlaunch/train/gpuhealth.py; a reader treats a missing one as "not recorded", never as 0):
- `phases`: per-rank timers of a step (`STEP_PHASES`, seconds per step, each the mean over that rank's timed
  steps: data_s waiting for the batch; compute_s forward + backward up to the first parameter's gradient, free
  of waiting for peers; sync_s from there to gradients ready: exposed communication + waiting for peers;
  optimizer_s the update; step_s the whole step; other_s the rest), summarised over ranks: `median` (the median
  rank: the rank whose forward_s is the median_low over ranks, all its phases; "rank-timers" files: statistics.median
  per field) and `slowest` (the rank with the longest forward_s, with its host and local rank), `method`
  (PHASES_METHOD), `steps` timed per rank, `ranks`;
- `nodes`: per node, in order of first rank: its ranks, its median rank's forward_s and compute_s, its slowest
  rank, and GPU health (`GPU_HEALTH`: one GPU's mean SM clock, its maximum, its own clock event reasons and
  highest temperature, named by local rank: among the GPUs with a reason, else all, the lowest clock against its
  maximum; "rank-timers" files: every GPU's reasons and the node's highest temperature; or "unavailable: <reason>");
- `overhead`: rank 0's seconds outside the steps (`OVERHEAD_FIELDS`: loader start, validation, checkpoint,
  barriers, metrics, and their total);
- `measured_steps`: the steps counted for images/s (images / global batch).
All numbers in them are finite and >= 0 (`check_bounds`). Version 3
adds the record type `kernel_profile` (CUDA kernel time per class, `--kernel-profile-steps`) and the
optional `network` of header and `resume` records (below). Version 2
adds energy and utilisation (header `energy_sources`; epoch `energy_j`, `gpu_utilization_pct`,
`gpu_memory_peak_bytes`; end `energy_j`, `energy_to_accuracy_j`) and the end status `diverged`.
Its fields are optional, so every version 1 record is a valid version 2 record too. Later optional
header fields (version 2, never required): `request` (the abstract request: framework, world size and
the trainer options given on the command line, apart from the resolved launch: site, image, versions,
hosts), `parent_run` (the run this one reruns), `script_sha256` (the batch script's hash) and `scheduler`
(its kind: slurm, pbs, local...; `slurm_job_id`, named when Slurm was the only one, holds the job id of
any scheduler); for files without `request`, `abstract_request` derives it from `argv` and `config`.
`threads` (optional in version 4, written since the scaling groups compare it; absent in older files: not recorded)
is the number of CPU threads per rank the trainer set (dlaunch/train/engines.py's threads_per_rank: `--threads`, else
the process's CPUs over the most ranks a node of the job holds).
`network` (version 3, header and `resume` records): per node and collective library what the library
really selected at run time (dlaunch/train/network.py: transport, NCCL's network and plugin, interfaces and
addresses, GPUDirect; later records also the transports between a node's GPUs and the GPUs its ranks saw,
absent from older ones), each a record checked by `NETWORK_FIELDS`; a resumed run's last `network` is its
latest session's (`Metrics.network`).

Measured figures are a number or the text "unavailable: <reason>", never a zero standing in for
"not measured". Energy is per domain (`ENERGY_DOMAINS`), in joules, summed over the job's ranks.
"""

import errno
import json
import os
import stat
from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Optional, Tuple

SCHEMA = "dlaunch.metrics"
VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
METRICS_FILE = "metrics.jsonl"  # a run directory's metrics file

# Closing statuses: `interrupted` is a run stopped by a signal after checkpointing (resumable);
# `diverged` a run stopped because its loss stayed non-finite (`--max-nonfinite-steps`); `hung` (version 5) a run
# stopped because no step finished within the hang timeout (`--hang-timeout`).
END_STATUSES = ("ok", "failed", "cancelled", "interrupted", "diverged", "hung")
# Version 5: the end record's `hang` (the hang record's fields of these names, and the file it is in).
HANG_SHAPE_KEYS = ("file", "timeout_s", "silent", "flight_recorder")

# gpu: the GPUs' own counters; cpu and dram: RAPL package and DRAM; node: whole-node counters (HPE
# Cray pm_counters), which include the GPUs, CPUs and memory of the node.
ENERGY_DOMAINS = ("gpu", "cpu", "dram", "node")
UNAVAILABLE = "unavailable: "

_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_STR = (str, type(None))
FIGURE = "figure"  # a number or "unavailable: <reason>"
ENERGY = "energy"  # {domain: figure} over ENERGY_DOMAINS
NETWORK = "network"  # a list of NETWORK_FIELDS records
# One record of `network` (dlaunch/train/network.py): a text or a list of texts per field; True: required.
NETWORK_FIELDS = {
    "host": True,
    "library": True,
    "transport": True,
    "network": False,
    "version": False,
    "plugin": False,
    "provider": False,
    "devices": False,
    "interfaces": False,
    "addresses": False,
    "bootstrap": False,
    "gpudirect": False,
    "intra_node": False,  # since issue 46: NCCL's transports between a node's GPUs (P2P/IPC, SHM, NET)
    "visible_devices": False,  # since issue 46: what the ranks saw (CUDA_VISIBLE_DEVICES=0,1,2,3)
    "components": False,
    "source": False,
}

# Version 4 (dlaunch/train/phases.py): the per-rank step phases, seconds per step (the module docstring defines them).
STEP_PHASES = (
    "data_s",
    "forward_s",
    "compute_s",
    "sync_s",
    "optimizer_s",
    "other_s",
    "step_s",
)  # forward_s: part of compute_s
# `phases.method`: what its "median" is. Written: the median rank, a real rank (the median_low of the forward passes,
# all its phases; of 2 ranks the faster). Read too: MEDIAN_OF_RANKS_METHOD, statistics.median per field (of an even
# rank count the mean of the two middle ranks).
PHASES_METHOD, MEDIAN_OF_RANKS_METHOD = "rank-timers-median-rank", "rank-timers"
# The epoch's seconds outside its steps (rank 0's wall clock); `total_s` is their sum.
OVERHEAD_PARTS = ("loader_start_s", "validation_s", "checkpoint_s", "barrier_s", "metrics_s")
OVERHEAD_FIELDS = OVERHEAD_PARTS + ("total_s",)
# Clock event (throttle) reasons a GPU_HEALTH names (dlaunch/train/gpuhealth.py maps NVML's bits to them).
THROTTLE_REASONS = ("power cap", "hardware slowdown", "thermal", "power brake", "sync boost")
GPU_HEALTH = "gpu_health"  # GPU_HEALTH_SHAPE or "unavailable: <reason>"
THROTTLE = "throttle"  # one of THROTTLE_REASONS
# Shapes of the version 4 fields: a tuple of types, FIGURE, GPU_HEALTH, THROTTLE, {key: shape} (exactly these
# keys) or [shape] (a list of any length).
OVERHEAD_SHAPE = {name: _NUM for name in OVERHEAD_FIELDS}
PHASES_SHAPE = {
    "method": (str,),
    "steps": (int,),
    "ranks": (int,),
    "median": {p: _NUM for p in STEP_PHASES},
    "slowest": dict({"rank": (int,), "host": (str,), "local_rank": (int,)}, **{p: _NUM for p in STEP_PHASES}),
}
GPU_HEALTH_SHAPE = {
    "sm_clock_mhz": FIGURE,
    "sm_clock_max_mhz": FIGURE,
    "local_rank": (int, type(None)),
    "throttle": [THROTTLE],
    "temperature_c": FIGURE,
}
NODES_SHAPE = [
    {
        "host": (str,),
        "ranks": (int,),
        "median_forward_s": _NUM,
        "median_compute_s": _NUM,
        "slowest": {"rank": (int,), "local_rank": (int,), "forward_s": _NUM, "compute_s": _NUM},
        "gpu": GPU_HEALTH,
    }
]

# type -> {field: (accepted python types, or FIGURE or ENERGY; required)}
RECORD_FIELDS: Dict[str, Dict[str, Tuple[Any, bool]]] = {
    "header": {
        "run_id": ((str,), True),
        "argv": ((list,), True),
        "config": ((dict,), True),
        "framework": ((str,), True),
        "loader": ((str,), True),
        "model": ((str,), True),
        "device": ((str,), True),
        "world_size": ((int,), True),
        "nodes": ((int,), True),
        "hosts": ((list,), True),  # host name of every rank, index = rank
        "batch_per_worker": ((int,), True),
        "global_batch": ((int,), True),
        "lr_scaled": (_NUM, True),
        "versions": ((dict,), True),  # python, torch, torchvision, cuda, nccl, cudnn, + frameworks
        "framework_settings": ((dict,), False),
        "loader_settings": ((dict,), False),
        "slurm_job_id": (_OPT_STR, True),
        "site": (_OPT_STR, True),
        "experiment": (_OPT_STR, True),
        "image": (_OPT_STR, True),
        "git_revision": (_OPT_STR, True),
        "energy_sources": ((dict,), False),  # domain -> source on rank 0, or "unavailable: <reason>"
        "request": ((dict,), False),  # abstract_request(): framework, world_size, options
        "parent_run": (_OPT_STR, False),  # the run this one reruns (`dlaunch rerun`)
        "script_sha256": (_OPT_STR, False),  # sha256 of the run directory's job.sh
        "scheduler": (_OPT_STR, False),  # the kind of scheduler that ran the job (`slurm_job_id`: its job id, any kind)
        "network": (NETWORK, False),  # version 3: what the collective libraries selected, per node
        "threads": ((int,), False),  # CPU threads per rank (intra-op) the trainer set; absent: not recorded
    },
    "epoch": {
        "epoch": ((int,), True),  # 0-based
        "steps": ((int,), True),  # optimizer steps in this epoch (this rank)
        "images": ((int,), True),  # images of the whole job counted for throughput
        "images_per_s": (_NUM, True),  # whole job, measured on rank 0 after a barrier
        "epoch_time_s": (_NUM, True),
        "data_wait_s": (_NUM, True),
        "loss": (_NUM, True),
        "lr": (_NUM, True),
        "top1": (_OPT_NUM, False),
        "top5": (_OPT_NUM, False),
        "val_loss": (_OPT_NUM, False),
        "energy_j": (ENERGY, False),  # this epoch (with its validation), all ranks
        "gpu_utilization_pct": (FIGURE, False),  # mean over ranks of NVML/AMD SMI samples in the epoch
        "gpu_memory_peak_bytes": (FIGURE, False),  # largest torch.cuda.max_memory_allocated of any rank
        "measured_steps": ((int,), False),  # version 4: steps counted for images/s (images / global batch)
        "overhead": (OVERHEAD_SHAPE, False),  # version 4: rank 0's seconds outside the steps
        "phases": (PHASES_SHAPE, False),  # version 4: per-rank step phases, median and slowest rank
        "nodes": (NODES_SHAPE, False),  # version 4: per node, in order of first rank
        # The workload options (dlaunch/train/workload.py): the first step's wall time with --compile (a warm-up step,
        # never in images/s), graphs compiled after the warm-up (rank 0), host syncs seen in a step (--host-syncs minimal).
        "compile_s": (_NUM, False),
        "graphs_compiled_after_warmup": ((int,), False),
        "step_host_syncs": ((list,), False),
    },
    "profile": {
        "steps": ((int,), True),
        "step_s": (_NUM, True),  # mean wall time per profiled step
        "compute_s": (_NUM, True),  # mean forward+backward time not overlapped with communication
        "comm_s": (_NUM, True),  # mean time in gradient all-reduce
        "data_s": (_NUM, True),  # mean time waiting for the next batch
        "method": ((str,), True),
    },
    "kernel_profile": {  # version 3: CUDA kernel time per class, summed over every rank (dlaunch/train/profiling.py)
        "steps": ((int,), True),  # profiled steps per rank
        "ranks": ((int,), True),
        "method": ((str,), True),
        "kernel_s": (FIGURE, True),  # all GPU activity: kernels, copies, sets
        "comm_s": (FIGURE, True),  # NCCL kernels
        "compute_s": (FIGURE, True),  # cuDNN and cuBLAS kernels
        "io_s": (FIGURE, True),  # host-to-device copies, DALI and nvJPEG kernels
        "other_s": (FIGURE, True),
        "top_kernels": ((dict,), False),  # rank 0's longest kernels per class: {class: [[name, s], ...]}
    },
    "resume": {
        "epoch": ((int,), True),  # first epoch run after resuming
        "step": ((int,), True),  # global step restored from the checkpoint
        "checkpoint": ((str,), True),
        "network": (NETWORK, False),  # version 3: this session's, as in the header
    },
    "end": {
        "status": ((str,), True),
        "total_time_s": (_NUM, True),
        "epochs_completed": ((int,), True),
        "best_top1": (_OPT_NUM, False),
        "target_accuracy": (_OPT_NUM, False),
        "time_to_accuracy_s": (_OPT_NUM, False),
        "reason": (_OPT_STR, False),
        "param_digests": ((list,), False),  # sha256 of every rank's parameters, index = rank
        "energy_j": (ENERGY, False),  # the whole run (all sessions of a resumed run), all ranks
        "energy_to_accuracy_j": (_OPT_NUM, False),  # energy_total at the first validation >= target
        "hang": ((dict,), False),  # version 5, status `hung`: HANG_SHAPE_KEYS
    },
}


# Trainer flags the launcher sets from the run directory and its provenance: not part of a request.
LAUNCHER_SET_FLAGS = ("framework", "metrics", "checkpoint-dir", "resume", "experiment", "site", "image")


def requested_options(argv: List[str], config: Dict[str, Any]) -> Dict[str, Any]:
    """The trainer options given on the command line `argv`, with their parsed values from `config`."""
    options = {}
    for token in argv:
        name = token[2:].split("=", 1)[0] if token.startswith("--") else None
        if name and name not in LAUNCHER_SET_FLAGS and name.replace("-", "_") in config:
            options[name] = config[name.replace("-", "_")]
    return options


def abstract_request(header: Dict[str, Any]) -> Dict[str, Any]:
    """What a run asked for (framework, world size, trainer options), from its header's `request`, or
    derived from `argv` and `config` (files written before `request` existed)."""
    if isinstance(header.get("request"), dict):
        return header["request"]
    return {
        "framework": header["framework"],
        "world_size": header["world_size"],
        "options": requested_options(header["argv"], header["config"]),
    }


class MetricsError(ValueError):
    """A metrics record or file that does not follow the schema."""


def unavailable(reason: str) -> str:
    """The figure that stands for a quantity that could not be measured."""
    return UNAVAILABLE + reason


def is_number(value: Any) -> bool:
    return isinstance(value, _NUM) and not isinstance(value, bool)


def energy_total(energy: Optional[Dict[str, Any]]) -> Optional[Tuple[float, str]]:
    """(joules, domains counted) from a record's `energy_j`: the node counter where it was measured
    (it includes everything else), else the sum of the measured gpu, cpu and dram figures; None when
    nothing was measured."""
    if not energy:
        return None
    if is_number(energy.get("node")):
        return float(energy["node"]), "node"
    measured = [d for d in ("gpu", "cpu", "dram") if is_number(energy.get(d))]
    if not measured:
        return None
    return float(sum(energy[d] for d in measured)), "+".join(measured)


def _check_figure(value: Any) -> bool:
    return is_number(value) or (isinstance(value, str) and value.startswith(UNAVAILABLE))


_EXPECTED = {
    FIGURE: "a number or 'unavailable: <reason>'",
    ENERGY: "{domain: number or 'unavailable: <reason>'} with domains %s" % ", ".join(ENERGY_DOMAINS),
    NETWORK: "a list of records with the texts %s (other fields: texts or lists of texts)"
    % ", ".join(k for k, need in NETWORK_FIELDS.items() if need),
}


def _check_network(value: Any) -> bool:
    def text_or_texts(v: Any) -> bool:
        return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))

    return isinstance(value, list) and all(
        isinstance(r, dict)
        and all(isinstance(r.get(k), str) for k, need in NETWORK_FIELDS.items() if need)
        and all(text_or_texts(v) for v in r.values())
        for r in value
    )


def _check_value(types: Any, value: Any) -> bool:
    if types == FIGURE:
        return _check_figure(value)
    if types == ENERGY:
        return isinstance(value, dict) and all(k in ENERGY_DOMAINS and _check_figure(v) for k, v in value.items())
    if types == NETWORK:
        return _check_network(value)
    return not isinstance(value, bool) and isinstance(value, types)


def shape_problem(shape: Any, value: Any, where: str) -> Optional[str]:
    """Why `value` (at `where`, e.g. "phases.median") does not have `shape` (a version 4 shape above); None
    when it has."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return "%s is %s, expected an object with %s" % (where, type(value).__name__, ", ".join(shape))
        if set(value) != set(shape):
            return "%s has the keys %s, expected %s" % (where, ", ".join(sorted(value)) or "none", ", ".join(shape))
        for key, inner in shape.items():
            problem = shape_problem(inner, value[key], "%s.%s" % (where, key))
            if problem:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return "%s is %s, expected a list" % (where, type(value).__name__)
        for i, item in enumerate(value):
            problem = shape_problem(shape[0], item, "%s[%d]" % (where, i))
            if problem:
                return problem
        return None
    if shape == GPU_HEALTH:
        if isinstance(value, str) and value.startswith(UNAVAILABLE):
            return None
        return shape_problem(GPU_HEALTH_SHAPE, value, where)
    if shape == THROTTLE:
        return (
            None
            if value in THROTTLE_REASONS
            else "%s is %r, expected one of %s" % (where, value, ", ".join(THROTTLE_REASONS))
        )
    if not _check_value(shape, value):
        expected = _EXPECTED.get(shape) or " or ".join("null" if t is type(None) else t.__name__ for t in shape)
        return "%s is %r, expected %s" % (where, value, expected)
    return None


def numbers_in(value: Any, where: str) -> Iterator[Tuple[str, Any]]:
    """(where, number) of every number nested in `value` (dicts and lists)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from numbers_in(inner, "%s.%s" % (where, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from numbers_in(inner, "%s[%d]" % (where, i))
    elif is_number(value):
        yield where, value


def make_record(record_type: str, time: float, **fields: Any) -> Dict[str, Any]:
    """Build one record of `record_type`, validated."""
    record = {"schema": SCHEMA, "version": VERSION, "type": record_type, "time": time}
    record.update(fields)
    validate_record(record)
    return record


def validate_record(record: Any) -> None:
    """Raise MetricsError naming the first field that breaks the schema."""
    if not isinstance(record, dict):
        raise MetricsError("record is not a JSON object")
    if record.get("schema") != SCHEMA:
        raise MetricsError("not a %s record (schema=%r)" % (SCHEMA, record.get("schema")))
    if record.get("version") not in READABLE_VERSIONS:
        raise MetricsError(
            "unsupported schema version %r (this reader knows %s)"
            % (record.get("version"), ", ".join(map(str, READABLE_VERSIONS)))
        )
    rtype = record.get("type")
    if not isinstance(rtype, str) or rtype not in RECORD_FIELDS:
        raise MetricsError("unknown record type %r" % (rtype,))
    if not isinstance(record.get("time"), _NUM) or isinstance(record.get("time"), bool):
        raise MetricsError("%s record: field 'time' missing or not a number" % rtype)
    for name, (types, required) in RECORD_FIELDS[rtype].items():
        if name not in record:
            if required:
                raise MetricsError("%s record: missing field %r" % (rtype, name))
            continue
        value = record[name]
        if isinstance(types, (dict, list)):
            problem = shape_problem(types, value, name)
            if problem:
                raise MetricsError("%s record: field %s" % (rtype, problem))
            continue
        if not _check_value(types, value):
            if types in _EXPECTED:
                raise MetricsError("%s record: field %r is %r, expected %s" % (rtype, name, value, _EXPECTED[types]))
            raise MetricsError("%s record: field %r has type %s" % (rtype, name, type(value).__name__))
    if rtype == "end" and record["status"] not in END_STATUSES:
        raise MetricsError("end record: status %r not in %s" % (record["status"], END_STATUSES))
    if rtype == "end" and "hang" in record and set(record["hang"]) != set(HANG_SHAPE_KEYS):
        raise MetricsError(
            "end record: field 'hang' has the keys %s, expected %s"
            % (", ".join(sorted(record["hang"])), ", ".join(HANG_SHAPE_KEYS))
        )


# Bounds of the figures a reader computes with (None: open). The reader refuses NaN, infinity and a
# value outside its bounds as it refuses a wrong type: the file is rejected, never reported as a figure.
# The losses are exempt: a diverging run records the non-finite loss it saw (`--max-nonfinite-steps`).
# The writer does not check bounds: a run is never stopped for a figure it measured.
BOUNDS: Dict[str, Dict[str, Tuple[Optional[float], Optional[float]]]] = {
    "header": {
        "world_size": (1, None),
        "nodes": (1, None),
        "batch_per_worker": (1, None),
        "global_batch": (1, None),
        "lr_scaled": (0, None),
        "threads": (1, None),
    },
    "epoch": {
        "epoch": (0, None),
        "steps": (0, None),
        "images": (0, None),
        "images_per_s": (0, None),
        "epoch_time_s": (0, None),
        "data_wait_s": (0, None),
        "lr": (0, None),
        "top1": (0, 1),
        "top5": (0, 1),
        "gpu_utilization_pct": (0, None),
        "gpu_memory_peak_bytes": (0, None),
        "measured_steps": (0, None),
        "compile_s": (0, None),
        "graphs_compiled_after_warmup": (0, None),
    },
    "profile": {
        "steps": (0, None),
        "step_s": (0, None),
        "compute_s": (0, None),
        "comm_s": (0, None),
        "data_s": (0, None),
    },
    "resume": {"epoch": (0, None), "step": (0, None)},
    "end": {
        "total_time_s": (0, None),
        "epochs_completed": (0, None),
        "best_top1": (0, 1),
        "target_accuracy": (0, 1),
        "time_to_accuracy_s": (0, None),
        "energy_to_accuracy_j": (0, None),
    },
}
NON_FINITE_ALLOWED = ("loss", "val_loss")
# No figure a run measures comes near this (1e18 s is 3e10 years; no machine reaches 1e18 images/s, joules or
# bytes): a larger number (1e308, an integer of 400 digits) is no measurement, and a reader's arithmetic on it (a
# mean's sum, a product) would overflow. The losses, exempt from every bound, are only ever shown.
MAX_FIGURE = 1e18
NESTED_NON_NEGATIVE = ("overhead", "phases", "nodes")  # version 4: every number inside is finite and >= 0
# Header fields inside `config`, `loader_settings` and `request` that readers use: their types.
NESTED = {
    "config": {"epochs": (int, type(None)), "schedule": _OPT_STR, "amp": _OPT_STR},
    "loader_settings": {"total_steps": (int, type(None)), "steps_per_epoch": (int, type(None))},
    "request": {"framework": (str,), "world_size": (int,), "options": (dict,)},
}
MAX_METRICS_BYTES = 64 * 1024 * 1024  # a trainer writes a few KB per epoch; anything near this is not its file


def _finite(value: Any) -> bool:
    """A number within +-MAX_FIGURE (NaN and infinity are not; an integer too large for a float is compared exactly)."""
    return -MAX_FIGURE <= value <= MAX_FIGURE


def _shown(value: Any) -> str:
    """A number as an error names it: an integer of more than 20 digits by its size alone."""
    digits = len(str(abs(value))) if isinstance(value, int) else 0
    return "an integer of %d digits" % digits if digits > 20 else repr(value)


def check_bounds(record: Dict[str, Any]) -> None:
    """Raise MetricsError for a figure of a validated record that is not finite, beyond +-MAX_FIGURE or outside
    `BOUNDS`, and for a header whose nested fields (`NESTED`, `hosts`, `argv`) readers cannot use."""
    rtype = record["type"]
    if not _finite(record["time"]):
        raise MetricsError("%s record: field 'time' is %s" % (rtype, _shown(record["time"])))
    bounds = BOUNDS.get(rtype, {})
    for name, value in record.items():
        values = list(value.values()) if name == "energy_j" and isinstance(value, dict) else [value]
        for v in values:
            if not is_number(v) or name in NON_FINITE_ALLOWED:
                continue
            low, high = bounds.get(name, (0, None) if name == "energy_j" else (None, None))
            if not _finite(v) or (low is not None and v < low) or (high is not None and v > high):
                where = "%s..%s" % (-MAX_FIGURE if low is None else low, MAX_FIGURE if high is None else high)
                raise MetricsError("%s record: field %r is %s, outside %s" % (rtype, name, _shown(v), where))
    for name in NESTED_NON_NEGATIVE if rtype == "epoch" else ():
        for where, v in numbers_in(record.get(name), name):
            if not _finite(v) or v < 0:
                raise MetricsError("%s record: field %r is %s, outside 0..%g" % (rtype, where, _shown(v), MAX_FIGURE))
    if rtype == "header":
        for name, fields in NESTED.items():
            for key, types in fields.items() if isinstance(record.get(name), dict) else ():
                value = record[name].get(key)
                if (key in record[name] or name == "request") and not _check_value(types, value):
                    raise MetricsError("header record: field '%s.%s' has type %s" % (name, key, type(value).__name__))
        request = record.get("request")
        if isinstance(request, dict) and request["world_size"] < 1:
            raise MetricsError("header record: field 'request.world_size' is %r, outside 1.." % request["world_size"])
        for name in ("hosts", "argv"):
            if not all(isinstance(item, str) for item in record[name]):
                raise MetricsError("header record: field %r holds an item that is not a text" % name)


class FileRefused(ValueError):
    """A file a reader will not open: not a regular file, too large, or a link it must not follow."""


def open_regular(path: str, limit: int, follow_links: bool = True) -> BinaryIO:
    """`path` opened for reading in binary, after checking that it is a regular file of at most `limit`
    bytes: opened without blocking, so a FIFO or device is refused before a byte is read; with
    `follow_links=False` a symbolic link is refused too. FileRefused or OSError otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow_links and e.errno == errno.ELOOP:
            raise FileRefused("a symbolic link (dlaunch does not follow links out of a run directory)") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused("not a regular file")
        if info.st_size > limit:
            raise FileRefused("%d bytes, more than the %d this file may have" % (info.st_size, limit))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def iter_records(path: str, follow_links: bool = True) -> Iterator[Dict[str, Any]]:
    """Yield validated records (UTF-8, the schema, `check_bounds`); raise MetricsError naming the file
    and line of the first bad one, or the file when it is no metrics file at all (`open_regular`)."""
    try:
        f = open_regular(path, MAX_METRICS_BYTES, follow_links)
    except FileRefused as e:
        raise MetricsError("%s: %s" % (path, e)) from None
    with f:
        yield from parse_records(f, path)


def parse_records(lines: Iterable[bytes], path: str) -> Iterator[Dict[str, Any]]:
    """The validated records of a metrics file's lines (bytes); MetricsError names `path` and the line."""
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            record = json.loads(line)
            validate_record(record)
            check_bounds(record)
        except UnicodeDecodeError as e:
            raise MetricsError(
                "%s:%d: not UTF-8 text (byte 0x%02x at column %d)" % (path, lineno, raw[e.start], e.start + 1)
            ) from None
        except RecursionError:
            raise MetricsError("%s:%d: nested too deeply" % (path, lineno)) from None
        except (ValueError, MetricsError) as e:
            raise MetricsError("%s:%d: %s" % (path, lineno, e)) from None
        yield record


class Metrics:
    """A parsed metrics file: the header, epochs (last record per epoch wins), profiles, the end."""

    def __init__(self, path: str, records: List[Dict[str, Any]]):
        self.path = path
        self.records = records
        headers = [r for r in records if r["type"] == "header"]
        if not headers:
            raise MetricsError("%s: no header record" % path)
        self.header: Dict[str, Any] = headers[0]
        by_epoch: Dict[int, Dict[str, Any]] = {}
        for r in records:
            if r["type"] == "epoch":
                by_epoch[r["epoch"]] = r
        self.epochs: List[Dict[str, Any]] = [by_epoch[k] for k in sorted(by_epoch)]
        self.profiles = [r for r in records if r["type"] == "profile"]
        self.kernel_profiles = [r for r in records if r["type"] == "kernel_profile"]
        ends = [r for r in records if r["type"] == "end"]
        self.end: Optional[Dict[str, Any]] = ends[-1] if ends else None

    @property
    def network(self) -> Optional[List[Dict[str, Any]]]:
        """What the collective libraries selected in the latest session (None: not recorded, version <= 2)."""
        recorded = [r["network"] for r in self.records if r["type"] in ("header", "resume") and "network" in r]
        return recorded[-1] if recorded else None

    @property
    def status(self) -> str:
        """`running` while no end record exists, else the last end record's status."""
        return self.end["status"] if self.end else "running"


def parse_metrics(data: bytes, path: str) -> Metrics:
    """A metrics file's content (e.g. an archive's member) read as `read_metrics` reads the file `path`."""
    return Metrics(path, list(parse_records(data.splitlines(keepends=True), path)))


def read_metrics(path: str, follow_links: bool = True) -> Metrics:
    """Read and validate a whole metrics file (MetricsError names the file on any problem); with
    `follow_links=False` (a run directory's file) a symbolic link is refused."""
    try:
        records = list(iter_records(path, follow_links))
    except OSError as e:
        raise MetricsError("%s: %s" % (path, e.strerror or e)) from None
    return Metrics(path, records)
