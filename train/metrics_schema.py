"""The metrics file schema (`dlaunch.metrics`, versioned), shared by the trainer and the launcher.

Plain Python 3.9, no third-party imports: the launcher reads metrics files on login nodes without
torch, and the trainer writes them inside images that carry nothing but the trainer.

A metrics file is JSON lines. Every record has `schema`, `version`, `type` and `time` (Unix
seconds). Types and their fields are in `RECORD_FIELDS`; `validate_record` checks one record,
`read_metrics` reads and checks a whole file.

Versions: 3 is written; 1, 2 and 3 are read (a file resumed by a newer trainer mixes them). Version 3
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
`network` (version 3, header and `resume` records): per node and collective library what the library
really selected at run time (train/network.py: transport, NCCL's network and plugin, interfaces and
addresses, GPUDirect), each a record checked by `NETWORK_FIELDS`; a resumed run's last `network` is its
latest session's (`Metrics.network`).

Measured figures are a number or the text "unavailable: <reason>", never a zero standing in for
"not measured". Energy is per domain (`ENERGY_DOMAINS`), in joules, summed over the job's ranks.
"""
import json
from typing import Any, Dict, Iterator, List, Optional, Tuple

SCHEMA = "dlaunch.metrics"
VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
METRICS_FILE = "metrics.jsonl"  # a run directory's metrics file

# Closing statuses: `interrupted` is a run stopped by a signal after checkpointing (resumable);
# `diverged` a run stopped because its loss stayed non-finite (`--max-nonfinite-steps`).
END_STATUSES = ("ok", "failed", "cancelled", "interrupted", "diverged")

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
# One record of `network` (train/network.py): a text or a list of texts per field; True: required.
NETWORK_FIELDS = {"host": True, "library": True, "transport": True, "network": False, "version": False,
                  "plugin": False, "provider": False, "devices": False, "interfaces": False, "addresses": False,
                  "bootstrap": False, "gpudirect": False, "components": False, "source": False}

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
    },
    "profile": {
        "steps": ((int,), True),
        "step_s": (_NUM, True),  # mean wall time per profiled step
        "compute_s": (_NUM, True),  # mean forward+backward time not overlapped with communication
        "comm_s": (_NUM, True),  # mean time in gradient all-reduce
        "data_s": (_NUM, True),  # mean time waiting for the next batch
        "method": ((str,), True),
    },
    "kernel_profile": {  # version 3: CUDA kernel time per class, summed over every rank (train/profiling.py)
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
    return {"framework": header["framework"], "world_size": header["world_size"],
            "options": requested_options(header["argv"], header["config"])}


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


_EXPECTED = {FIGURE: "a number or 'unavailable: <reason>'",
             ENERGY: "{domain: number or 'unavailable: <reason>'} with domains %s" % ", ".join(ENERGY_DOMAINS),
             NETWORK: "a list of records with the texts %s (other fields: texts or lists of texts)"
                      % ", ".join(k for k, need in NETWORK_FIELDS.items() if need)}


def _check_network(value: Any) -> bool:
    def text_or_texts(v: Any) -> bool:
        return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))

    return isinstance(value, list) and all(
        isinstance(r, dict) and all(isinstance(r.get(k), str) for k, need in NETWORK_FIELDS.items() if need)
        and all(text_or_texts(v) for v in r.values()) for r in value)


def _check_value(types: Any, value: Any) -> bool:
    if types == FIGURE:
        return _check_figure(value)
    if types == ENERGY:
        return isinstance(value, dict) and all(k in ENERGY_DOMAINS and _check_figure(v) for k, v in value.items())
    if types == NETWORK:
        return _check_network(value)
    return not isinstance(value, bool) and isinstance(value, types)


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
        raise MetricsError("unsupported schema version %r (this reader knows %s)"
                           % (record.get("version"), ", ".join(map(str, READABLE_VERSIONS))))
    rtype = record.get("type")
    if rtype not in RECORD_FIELDS:
        raise MetricsError("unknown record type %r" % (rtype,))
    if not isinstance(record.get("time"), _NUM) or isinstance(record.get("time"), bool):
        raise MetricsError("%s record: field 'time' missing or not a number" % rtype)
    for name, (types, required) in RECORD_FIELDS[rtype].items():
        if name not in record:
            if required:
                raise MetricsError("%s record: missing field %r" % (rtype, name))
            continue
        value = record[name]
        if not _check_value(types, value):
            if types in _EXPECTED:
                raise MetricsError("%s record: field %r is %r, expected %s" % (rtype, name, value, _EXPECTED[types]))
            raise MetricsError("%s record: field %r has type %s" % (rtype, name, type(value).__name__))
    if rtype == "end" and record["status"] not in END_STATUSES:
        raise MetricsError("end record: status %r not in %s" % (record["status"], END_STATUSES))


def iter_records(path: str) -> Iterator[Dict[str, Any]]:
    """Yield validated records; raise MetricsError naming the file and line of the first bad one."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                validate_record(record)
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


def read_metrics(path: str) -> Metrics:
    """Read and validate a whole metrics file (MetricsError names the file on any problem)."""
    try:
        records = list(iter_records(path))
    except OSError as e:
        raise MetricsError("%s: %s" % (path, e.strerror or e)) from None
    return Metrics(path, records)
