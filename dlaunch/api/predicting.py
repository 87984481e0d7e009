"""`predict`: the performance model's prediction for a site as API objects."""

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from dlaunch.api.calls import api_function
from dlaunch.api.records import LeftOutRun, Prediction, PredictionRow

if TYPE_CHECKING:
    from dlaunch.analysis.perfmodel.fit import LeftOut


def _left_out(lo: "LeftOut") -> LeftOutRun:
    from dlaunch.analysis.perfmodel.fit import wall_step_s

    measured = dict(
        run=lo.run.path, gpus=lo.run.world_size, step_ms=1e3 * wall_step_s(lo.run), comm_share=lo.measured_share
    )
    if lo.predicted is None:
        return LeftOutRun(**measured, why=lo.why)
    return LeftOutRun(
        **measured,
        predicted_step_ms=1e3 * lo.predicted.step_s,
        step_error=lo.step_error,
        predicted_comm_share=lo.predicted.profiled_comm_share,
        share_error=lo.share_error,
    )


@api_function
def predict(
    site: str,
    *,
    gpus: Optional[Sequence[int]] = None,
    model: Optional[str] = None,
    compute_ms: Optional[float] = None,
    data_ms: Optional[float] = None,
    batch: Optional[int] = None,
    framework: str = "ddp",
    zero_stage: Optional[int] = None,
    precision: Optional[str] = None,
    from_run: Optional[Any] = None,
    from_runs: Sequence[Any] = (),
    calibrated: Optional[str] = None,
    storage_images_per_s: Optional[float] = None,
    epoch_overhead: Optional[float] = None,
    epoch_images: Optional[int] = None,
    loader: Optional[str] = None,
    epochs: Optional[int] = None,
    allow_other_runs: bool = False,
) -> Prediction:
    """The performance model for a site, as `dlaunch predict`: step time, images/s, S_G, E_G, kernel share, what bounds
    the step and the run time per GPU count, from the best model the site has (`calibrated=None`; `"dali"`,
    `"native"`: Aach et al.'s Table 2a fit; `"none"`: nominal, an upper bound) or your own profiled runs
    (`from_runs`), each option the command's."""
    from dlaunch.analysis.perfmodel.fit import loo_summary
    from dlaunch.analysis.perfmodel.model import DEFAULT_EPOCHS, IMAGENET_TRAIN_IMAGES
    from dlaunch.analysis.perfmodel.prediction import prediction

    result = prediction(
        site,
        gpus,
        model,
        compute_ms,
        data_ms,
        batch,
        framework,
        zero_stage,
        precision,
        None if from_run is None else Path(from_run),
        [Path(p) for p in from_runs],
        calibrated,
        storage_images_per_s,
        epoch_overhead,
        IMAGENET_TRAIN_IMAGES if epoch_images is None else epoch_images,
        loader,
        DEFAULT_EPOCHS if epochs is None else epochs,
        allow_other_runs,
    )
    checks, excess = result.checks or {}, result.forward_excess_by_gpus or {}
    rows = []
    for p in result.predictions:
        statement = checks[p.gpus].statement if p.gpus in checks else None
        holds = statement is not None and statement.relation != "=" and statement.holds(p.efficiency)
        rows.append(
            PredictionRow(
                **dataclasses.asdict(p),
                overhead_share=p.overhead_share,
                basis=result.basis[p.gpus],
                paper_efficiency=statement.text if statement else None,
                paper_efficiency_error=None if statement is None or holds else statement.error(p.efficiency),
                paper_comm_share=checks[p.gpus].comm_share if p.gpus in checks else None,
                slowest_forward_excess=excess.get(p.gpus),
                run_s=p.run_s(result.run_epochs),
                node_hours=p.run_s(result.run_epochs) * p.nodes / 3600.0,
            )
        )
    return Prediction(
        result.site,
        result.model,
        result.framework,
        result.workload.batch,
        result.compute_source,
        result.machine_source,
        rows,
        workload=dataclasses.asdict(result.workload),
        machine_figures=dataclasses.asdict(result.machine),
        storage=result.storage,
        epochs=result.epochs,
        profiled=result.profiled,
        runs_gpus=sorted(excess),
        assumptions=result.assumptions,
        left_out=[_left_out(lo) for lo in result.left_out],
        left_out_summary=loo_summary(result.left_out) if result.left_out else "",
        notes=result.notes,
        calibration=result.calibration,
        choice=result.choice,
        collective_library=result.library,
        input=result.input,
        epochs_run=result.run_epochs,
        warning=result.warning,
    )


@api_function
def predicted_run_seconds(site: str, model: str, framework: str, gpus: int, epochs: int, **options: Any) -> float:
    """Seconds a training of `epochs` epochs of `model` with `framework` on `gpus` GPUs of `site` takes by the
    performance model (`predict`'s `run_s`: each epoch's steps and its overhead; start-up left out): the best model
    the site has unless `options` (any other keyword of `predict`: calibrated, batch, loader, ...) say otherwise."""
    return predict(site, gpus=[gpus], model=model, framework=framework, epochs=epochs, **options).rows[0].run_s
