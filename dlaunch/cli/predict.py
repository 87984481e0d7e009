"""`dlaunch predict`: the performance model's prediction (dlaunch.api.predict, dlaunch/analysis/perfmodel/prediction.py)
printed: which model and how to get the others, the runs it was calibrated on, what it assumed, a row per GPU count
(with what bounds the step and the run time) and what the rows rest on; or --json."""

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Literal, Optional, Sequence

import typer
from rich.console import Console

from dlaunch.analysis.perfmodel.compute import PRECISIONS
from dlaunch.analysis.perfmodel.model import DEFAULT_EPOCHS, IMAGENET_TRAIN_IMAGES
from dlaunch.analysis.perfmodel.paper import PAPER_DEEPSPEED_SOURCE
from dlaunch.cli.terminal import Json, finite_number, print_json
from dlaunch.errors import DlaunchError
from dlaunch.tables import fit_table

if TYPE_CHECKING:
    from dlaunch.api import LeftOutRun, Prediction


def _signed(value: float, digits: int) -> str:
    """`+0.12` / `-0.12`, and `0.00` when it rounds to zero."""
    text = "%+.*f" % (digits, value)
    return text[1:] if float(text) == 0 else text


def prediction_headers(prediction: "Prediction") -> List[str]:
    """The columns: the paper's values and the model's errors where it has some, the epoch overhead, the runs'
    slowest forward vs median % (--from-runs: the straggler flag's measure), the basis of each row."""
    rows = prediction.rows
    paper_eg = any(r.paper_efficiency is not None for r in rows)
    paper_share = any(r.paper_comm_share is not None for r in rows)
    return (
        ["GPUs", "nodes", "step ms", "exposed ms", "images/s", "E_G"]
        + (["paper E_G", "E_G error"] if paper_eg else [])
        + [share_header(prediction)]
        + (["paper %", "error pp"] if paper_share else [])
        + (["overhead s", "overhead %"] if any(r.epoch_overhead for r in rows) else [])
        + (["slowest forward vs median %"] if prediction.runs_gpus else [])
        + ["bound", "run h", "node-h", "basis"]
    )


def share_header(prediction: "Prediction") -> str:
    """The comm share's column: the profiled one (--from-runs), else the collective library's kernel share."""
    if prediction.profiled:
        return "profiled comm %"
    return "comm %" if prediction.collective_library == "Gloo" else "%s kernel %%" % prediction.collective_library


def prediction_rows(prediction: "Prediction") -> List[List[str]]:
    """Per GPU count: step, exposed time, images/s, E_G and the comm share, with the paper's values and the model's
    errors, the epoch overhead (seconds per epoch, share of the run's time), the runs' slowest forward vs median %
    (at their GPU counts) and the basis, as `prediction_headers` has them."""
    headers = prediction_headers(prediction)
    out = []
    for p in prediction.rows:
        share = p.profiled_comm_share if prediction.profiled else p.comm_share
        row = [
            str(p.gpus),
            str(p.nodes),
            "%.2f" % (1e3 * p.step_s),
            "%.2f" % (1e3 * p.exposed_comm_s),
            "%.1f" % p.images_per_s,
            "%.3f" % p.efficiency,
        ]
        if "paper E_G" in headers:
            row += (
                ["-", "-"]
                if p.paper_efficiency is None
                else [
                    p.paper_efficiency,
                    "holds" if p.paper_efficiency_error is None else _signed(p.paper_efficiency_error, 2),
                ]
            )
        row.append("%.1f" % (100 * share))
        if "paper %" in headers:
            paper = p.paper_comm_share
            row += ["-", "-"] if paper is None else ["%.1f" % (100 * paper), _signed(100 * (share - paper), 1)]
        if "overhead s" in headers:
            row += ["%.2f" % math.fsum(p.epoch_overhead.values()), "%.1f" % (100 * p.overhead_share)]
        if prediction.runs_gpus:
            row.append(
                "-"
                if p.gpus not in prediction.runs_gpus
                else "not recorded"
                if p.slowest_forward_excess is None
                else "%.0f" % (100 * p.slowest_forward_excess)
            )
        out.append(row + [p.bound, "%.3g" % (p.run_s / 3600.0), "%.0f" % p.node_hours, p.basis])
    return out


LOO_HEADERS = ["left out", "GPUs", "step ms", "predicted ms", "error %", "comm %", "predicted %", "error pp"]


def loo_rows(left_out: Sequence["LeftOutRun"]) -> List[List[str]]:
    rows = []
    for lo in left_out:
        measured = [lo.run, str(lo.gpus), "%.2f" % lo.step_ms]
        if lo.predicted_step_ms is None:
            rows.append(measured + ["-", lo.why, "%.1f" % (100 * lo.comm_share), "-", "-"])
            continue
        rows.append(
            measured
            + [
                "%.2f" % lo.predicted_step_ms,
                _signed(100 * lo.step_error, 1),
                "%.1f" % (100 * lo.comm_share),
                "%.1f" % (100 * lo.predicted_comm_share),
                _signed(100 * lo.share_error, 1),
            ]
        )
    return rows


def print_prediction(console: Console, prediction: "Prediction") -> None:
    """The runs it was calibrated on and their leave-one-out errors, the workload and machine, the epochs, the
    table, and what its rows rest on."""

    def say(text: str) -> None:
        console.print(text, highlight=False)

    say(prediction.choice)
    if prediction.left_out:
        say(
            "calibrated on %d runs (%s GPUs); each run predicted from the others:"
            % (len(prediction.left_out), ",".join(str(lo.gpus) for lo in prediction.left_out))
        )
        console.print(
            fit_table("", LOO_HEADERS, loo_rows(prediction.left_out), console.width, leave_out=["comm %", "step ms"])
        )
        say(prediction.left_out_summary)
    w, m = prediction.workload, prediction.machine_figures
    say(
        "%s on %s, %s: %.1f MB fp32 gradients, compute %.2f ms + data %.2f ms + other %.2f ms per step, batch %d per GPU\n"
        "machine (%s): %.2f us fabric latency, %.0f Gbit/s per node of %d GPUs, %.0f Gbit/s per GPU in a node, "
        "timing noise %.2g s, %s kernels beside back-propagation %.2f, storage %s\ncompute time: %s\n%s"
        % (
            prediction.model,
            prediction.site,
            prediction.framework,
            w["gradient_bytes"] / 1e6,
            1e3 * w["compute_s"],
            1e3 * w["data_s"],
            1e3 * w["other_s"],
            w["batch"],
            prediction.machine,
            m["latency_us"],
            m["bandwidth_gbps_per_node"],
            m["gpus_per_node"],
            m["intra_node_gbps"],
            m["noise_s"],
            prediction.collective_library,
            m["beside_compute"],
            prediction.storage,
            prediction.compute_source,
            prediction.input,
        )
    )
    if prediction.assumptions:
        say(
            "assumption about Aach et al.'s DeepSpeed runs (%s): %s"
            % (PAPER_DEEPSPEED_SOURCE, ", ".join(prediction.assumptions))
        )
    say(prediction.epochs)
    title = prediction.warning or (
        "nominal: an upper bound (no timing noise, no epoch costs unless given)"
        if prediction.calibration == "none"
        else ""
    )
    console.print(
        fit_table(
            title,
            prediction_headers(prediction),
            prediction_rows(prediction),
            console.width,
            leave_out=["nodes", "exposed ms", "images/s", "overhead s", "node-h", "step ms"],
        )
    )
    say(
        "exposed: what a step waits for beyond its own work (transfers left over after back-propagation, the "
        "slowest rank, the file system); the kernels' earlier waits for their peers are %s kernel time, hidden "
        "behind back-propagation" % prediction.collective_library
    )
    for note in prediction.notes:
        say(note)


def _gpu_counts(text: Optional[str]) -> Optional[List[int]]:
    """`4,8,16` as counts (the model checks them against the site), None when --gpus was not given."""
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise DlaunchError("--gpus: %r is not a comma-separated list of integers" % text) from None


Framework = Annotated[
    str,
    typer.Option(
        help="Framework: how gradients travel (its row's gradient_exchange: DDP buckets, Horovod fusion, DeepSpeed ZeRO)."
    ),
]
Precision = Annotated[
    Optional[Literal[PRECISIONS]],
    typer.Option(
        help="Precision of the published compute time, one the site's GPU has (data/published/gpus.csv): fp32, tf32, fp16 or bf16 (mixed precision). Default: the GPU's without AMP (TF32 on an A100); calibrated DeepSpeed assumes fp16 as the paper's runs (printed). Not with a measured compute time."
    ),
]


def predict_command(
    site: Annotated[
        str,
        typer.Option(help="Site profile (name or TOML path); its \\[network] section gives the nominal interconnect."),
    ],
    gpus: Annotated[
        Optional[str],
        typer.Option(
            help="Comma-separated GPU counts; E_G is relative to the smallest. Default: 4, 8, ... 1024, up to what the site has."
        ),
    ] = None,
    model: Annotated[Optional[str], typer.Option(help="Model (gradient size from its parameter count).")] = None,
    compute_ms: Annotated[
        Optional[float], typer.Option(parser=finite_number(), help="Measured forward+backward time per step (ms).")
    ] = None,
    data_ms: Annotated[
        Optional[float],
        typer.Option(
            parser=finite_number(),
            help="Measured time waiting for data per step (ms); default 0 (the loader keeps up).",
        ),
    ] = None,
    batch: Annotated[Optional[int], typer.Option(help="Batch per GPU the compute time was measured with.")] = None,
    framework: Framework = "ddp",
    zero_stage: Annotated[
        Optional[int],
        typer.Option(
            min=0, max=2, help="DeepSpeed ZeRO stage (0: all-reduce; 1, 2: reduce-scatter + all-gather). Default 0."
        ),
    ] = None,
    precision: Precision = None,
    from_run: Annotated[
        Optional[Path], typer.Option(help="Run directory or metrics file with a profile record (the workload only).")
    ] = None,
    from_runs: Annotated[
        Optional[List[Path]],
        typer.Option(
            help="Calibrate machine and workload on your own small sweep: run directories or a sweep folder (repeat the flag), >= 2 GPU counts, each run made with --profile-steps N (e.g. `dlaunch sweep --nodes 1,2,4 --steps 60 --warmup-steps 10 --profile-steps 20`). Prints each run's leave-one-out error of step time and profiled comm share."
        ),
    ] = None,
    calibrated: Annotated[
        Optional[str],
        typer.Option(
            help="Which model. Default: the best the site has (the first line says which and why): on JUWELS Booster Table 2a's fit, else nominal. 'dali' or 'native': the machine fitted to Aach et al. 2023 Table 2a (JUWELS Booster, ResNet-50 DDP) on its 4-64 GPUs, with that loader ('native' adds the native loader's fitted data wait unless --data-ms is given, and the file system's images/s fitted on the paper's E_G statements unless --storage-images-per-s or the site's [storage] gives one); on JUWELS Booster, ResNet-50, batch 64, the paper's values beside the model's. 'none': nominal, the site profile's figures (an upper bound)."
        ),
    ] = None,
    loader: Annotated[
        Optional[str],
        typer.Option(
            help="The input pipeline (native, dali-cpu, dali-gpu): the step is at least a batch over its images/s per GPU (the site's [[predict.input]] row; with --calibrated, the paper's 8 threads at the rate measured by `python -m dlaunch.train.loaderbench`). Default: the calibration's loader; none for the nominal model."
        ),
    ] = None,
    epochs: Annotated[int, typer.Option(help="Epochs of the run time column (run h, node-h).")] = DEFAULT_EPOCHS,
    allow_other_runs: Annotated[
        bool,
        typer.Option(
            "--allow-other-runs",
            help="With --from-runs: use runs made on another site, GPU kind or model than asked (refused otherwise); the table's title warns.",
        ),
    ] = False,
    storage_images_per_s: Annotated[
        Optional[float],
        typer.Option(
            parser=finite_number(),
            help="Images/s the site's shared file system sustains for a loader that reads every sample as a file (native): p GPUs cannot step faster than p * batch / this. Default: the site's [storage] loader_images_per_s, else no ceiling (unknown).",
        ),
    ] = None,
    epoch_overhead: Annotated[
        Optional[float],
        typer.Option(
            parser=finite_number(),
            help="Seconds per epoch outside the steps (loader start, validation, checkpoint, barriers, logging) at every GPU count. Default: the runs' mean measured overhead with --from-runs (metrics version 4), Aach et al.'s setup with --calibrated (assumptions printed), else none.",
        ),
    ] = None,
    epoch_images: Annotated[
        int,
        typer.Option(
            help="Training images per epoch (steps per epoch = ceil(images / global batch)). Default: ImageNet-1k's."
        ),
    ] = IMAGENET_TRAIN_IMAGES,
    as_json: Json = False,
) -> None:
    """Predict step time, throughput, E_G, kernel share, what bounds the step and the run time over GPU counts (NCCL ring/tree cost model, buckets, stragglers, the loader's rate)."""
    from dlaunch import api

    predicted = api.predict(
        site,
        gpus=_gpu_counts(gpus),
        model=model,
        compute_ms=compute_ms,
        data_ms=data_ms,
        batch=batch,
        framework=framework,
        zero_stage=zero_stage,
        precision=precision,
        from_run=from_run,
        from_runs=from_runs or (),
        calibrated=calibrated,
        storage_images_per_s=storage_images_per_s,
        epoch_overhead=epoch_overhead,
        epoch_images=epoch_images,
        loader=loader,
        epochs=epochs,
        allow_other_runs=allow_other_runs,
    )
    if as_json:
        print_json(predicted)
    else:
        print_prediction(Console(soft_wrap=True, markup=False), predicted)
