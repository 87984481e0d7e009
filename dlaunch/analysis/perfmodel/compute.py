"""A step's compute time when nothing was measured: a row of the published training throughput
(data/published/training_throughput.csv: GPU, model, precision, batch, images/s, source, date), carried to the
site's GPU, batch and model by stated rules; and what the site's GPU is (data/published/gpus.csv: its chip, the
precisions it computes in, the one PyTorch uses without AMP) and which collective library it runs.

The rules, each named in the compute line where it was applied (`ComputeTime.source`); a row that needs none is
labelled "published", any other "scaled":

    GPU     another GPU of the same chip (A100-40GB from an A100-80GB row): the same images/s (same SMs and
            clocks; the memory size and bandwidth differ, which the rule leaves out).
    batch   another batch per GPU: the row's time per image (images/s taken as independent of the batch).
    model   another ResNet: the row's images/s x its forward GFLOPs / the model's (MODEL_GFLOPS).
"""

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple

from dlaunch.analysis.perfmodel.model import MODEL_GFLOPS
from dlaunch.paths import PUBLISHED_DIR

if TYPE_CHECKING:  # the site profiles' pydantic models stay out of the model's import
    from dlaunch.jobs.sites import Site

THROUGHPUT_TABLE = PUBLISHED_DIR / "training_throughput.csv"
GPU_TABLE = PUBLISHED_DIR / "gpus.csv"
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")  # the names `--precision` takes (fp16: float16 mixed precision)
PRECISION_NAMES = {"fp32": "FP32", "tf32": "TF32", "fp16": "mixed precision (fp16)", "bf16": "mixed precision (bf16)"}
COLLECTIVE_LIBRARIES = {"nvidia": "NCCL", "amd": "RCCL", "none": "Gloo"}


def _rows(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


class ThroughputRow(NamedTuple):
    """One published figure: images/s of one GPU training `model` at `precision` and `batch` per GPU."""

    row: int  # its row in THROUGHPUT_TABLE (1: the first after the header)
    gpu: str
    model: str
    precision: str
    batch: int
    images_per_s: float
    source: str
    date: str

    @property
    def text(self) -> str:
        """The row as the compute line names it."""
        return "%s, %s, %s, batch %d: %.0f images/s (%s, %s; %s row %d)" % (
            self.gpu,
            self.model,
            PRECISION_NAMES[self.precision],
            self.batch,
            self.images_per_s,
            self.source,
            self.date,
            THROUGHPUT_TABLE.name,
            self.row,
        )


def load_throughput(path: Path = THROUGHPUT_TABLE) -> List[ThroughputRow]:
    return [
        ThroughputRow(
            i,
            r["gpu"],
            r["model"],
            r["precision"],
            int(r["batch_per_gpu"]),
            float(r["images_per_s"]),
            r["source"],
            r["date"],
        )
        for i, r in enumerate(_rows(path), 1)
    ]


@dataclass(frozen=True)
class Gpu:
    """A GPU model of data/published/gpus.csv."""

    name: str
    vendor: str
    chip: str
    precisions: Tuple[str, ...]
    default_precision: str  # what PyTorch computes in without AMP
    source: str


def load_gpus(path: Path = GPU_TABLE) -> Dict[str, Gpu]:
    return {
        r["gpu"]: Gpu(
            r["gpu"], r["vendor"], r["chip"], tuple(r["precisions"].split()), r["default_precision"], r["source"]
        )
        for r in _rows(path)
    }


def site_gpu(site: "Site") -> Optional[Gpu]:
    """The site's GPU model as gpus.csv has it (None: no GPU model, or one the table lacks)."""
    return load_gpus().get(site.gpu_model or "")


def collective_library(site: "Site") -> str:
    """NCCL, RCCL or Gloo: what the site's GPUs (or CPUs) all-reduce with."""
    return COLLECTIVE_LIBRARIES[site.gpu_vendor]


@dataclass(frozen=True)
class ComputeTime:
    """A step's compute time from a published row and the rules that carried it to the asked GPU, batch, model."""

    seconds: float
    row: ThroughputRow
    rules: Tuple[str, ...]  # empty: the row as published

    @property
    def source(self) -> str:
        if not self.rules:
            return "published: %s" % self.row.text
        return "scaled from the published row %s; rules: %s" % (self.row.text, "; ".join(self.rules))


def published_compute(
    gpu: Gpu, model: str, batch: int, precision: str, table: Optional[List[ThroughputRow]] = None
) -> ComputeTime:
    """The compute time per step of `model` at `batch` per GPU and `precision` on `gpu`, from the row of its own GPU
    if the table has one (else of its chip), of the model (else ResNet-50's, by FLOPs), of the nearest batch.
    LookupError saying what the table lacks."""
    if precision not in gpu.precisions:
        raise LookupError(
            "%s has no %s (its precisions: %s; %s)" % (gpu.name, precision, ", ".join(gpu.precisions), gpu.source)
        )
    chips = {g.name: g.chip for g in load_gpus().values()}
    rows = [
        r
        for r in (table if table is not None else load_throughput())
        if r.precision == precision and chips.get(r.gpu) == gpu.chip and (r.model == model or r.model in MODEL_GFLOPS)
    ]
    if not rows or model not in MODEL_GFLOPS:
        raise LookupError(
            "%s has no published %s training throughput of a %s (%s) in %s"
            % (THROUGHPUT_TABLE.name, PRECISION_NAMES[precision], gpu.name, gpu.chip, THROUGHPUT_TABLE)
        )
    row = min(rows, key=lambda r: (r.gpu != gpu.name, r.model != model, abs(r.batch - batch)))
    rules = []
    if row.gpu != gpu.name:
        rules.append(
            "GPU: %s taken as the %s (the same %s; memory size and bandwidth differ)" % (gpu.name, row.gpu, gpu.chip)
        )
    if row.batch != batch:
        rules.append(
            "batch: %d per GPU at batch %d's time per image (images/s taken as independent of the batch)"
            % (batch, row.batch)
        )
    images_per_s = row.images_per_s
    if row.model != model:
        images_per_s *= MODEL_GFLOPS[row.model] / MODEL_GFLOPS[model]
        rules.append(
            "model: %s from %s by forward GFLOPs (%.2f / %.2f)"
            % (model, row.model, MODEL_GFLOPS[row.model], MODEL_GFLOPS[model])
        )
    return ComputeTime(batch / images_per_s, row, tuple(rules))
