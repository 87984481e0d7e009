"""`prediction`: what `dlaunch predict` computes from its options (dlaunch/cli/predict.py prints it, dlaunch.api.predict
returns it): which model (the best the site has unless asked: `default_calibration`), the workload (measured, from a
profiled run, or a published row carried to the site's GPU: compute.py), the machine (the site's nominal [network] and
[predict] figures, fitted on Aach et al.'s Table 2a with `calibrated`, or on the user's runs with `from_runs`, which
must be of this site, its GPU and the model asked unless allowed), the loader's rate, the storage ceiling and the epoch
overhead, and the model's step, images/s, E_G, comm share, bound and run time per GPU count with the basis of each
(nominal, fitted, in range, predicted) and the paper's values where it has some."""

from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from dlaunch.analysis.perfmodel.compute import (
    PRECISION_NAMES,
    PRECISIONS,
    collective_library,
    published_compute,
    site_gpu,
)
from dlaunch.analysis.perfmodel.fit import (
    LeftOut,
    RunsOrigin,
    calibration_runs,
    fit_runs,
    leave_one_out,
    unknown_network,
    workload_of_run,
)
from dlaunch.analysis.perfmodel.model import (
    DEFAULT_BATCH,
    DEFAULT_EPOCHS,
    DEFAULT_GPU_COUNTS,
    IMAGENET_TRAIN_IMAGES,
    MODEL_PARAMS_M,
    EpochOverhead,
    Prediction,
    Workload,
    gradient_bytes,
    interconnect_of_site,
    intra_node_gbps,
    predict,
    site_max_gpus,
)
from dlaunch.analysis.perfmodel.nccl import Machine
from dlaunch.analysis.perfmodel.overhead import (
    OVERHEAD_SHARE_LIMIT,
    FixedOverhead,
    PaperOverhead,
    checkpoint_bytes,
    describe_epochs,
    measured_overhead,
    overhead_passes,
)
from dlaunch.analysis.perfmodel.paper import (
    AACH2023_REFERENCE_GPUS,
    AACH2023_TABLE2A,
    CALIBRATION_MAX_GPUS,
    STORAGE_FIT,
    PaperCheck,
    calibrated_workload,
    check_summary,
    fit_published,
    io_kernel_s,
    load_statements,
    paper_assumptions,
    paper_checks,
    paper_input,
    paper_machine,
    paper_precision,
    storage_points,
)
from dlaunch.analysis.scaling import Run, load_runs
from dlaunch.analysis.stragglers import forward_excess
from dlaunch.errors import DlaunchError
from dlaunch.jobs.sites import Site, resolve_site
from dlaunch.train.framework_table import gradient_exchanges


def check_gpu_counts(counts: Sequence[int], site: Site) -> List[int]:
    """`--gpus` (e.g. [4, 8, 16]) sorted and unique, each at least 1 and within what the site has."""
    given = ",".join(map(str, counts))
    if not counts:
        raise DlaunchError("--gpus: give GPU counts, e.g. 4,8,16")
    counts = sorted(set(counts))
    if counts[0] < 1:
        raise DlaunchError("--gpus: GPU counts must be >= 1 (got %r)" % given)
    if counts[-1] > site_max_gpus(site):
        raise DlaunchError(
            "--gpus: %d GPUs is more than site %s has (%d: nodes of its largest partition x %d GPUs per node)"
            % (counts[-1], site.name, site_max_gpus(site), site.gpus_per_node)
        )
    return counts


def workload_from_options(
    model: Optional[str],
    compute_ms: Optional[float],
    data_ms: Optional[float],
    batch: Optional[int],
    from_run: Optional[Path],
    site: Optional[Site] = None,
    precision: Optional[str] = None,
) -> Tuple[str, Workload, str]:
    """The model name, the workload and where its compute time comes from.

    `--from-run` fills what the flags leave out; without either, a published row carried to the site's GPU at
    `precision` (default: the GPU's without AMP; batch 64 unless given: `published_compute`)."""
    if model is not None and model not in MODEL_PARAMS_M:
        raise DlaunchError("--model: unknown model %r (known: %s)" % (model, ", ".join(sorted(MODEL_PARAMS_M))))
    if batch is not None and batch < 1:
        raise DlaunchError("--batch: must be >= 1 (got %d)" % batch)
    if compute_ms is not None and not compute_ms > 0:
        raise DlaunchError("--compute-ms: must be positive (got %r)" % compute_ms)
    if data_ms is not None and not data_ms >= 0:
        raise DlaunchError("--data-ms: must not be negative (got %r)" % data_ms)
    source, reads_files = "--compute-ms", False
    if from_run is not None:
        loaded = load_runs([str(from_run)])
        if loaded.rejected:
            raise DlaunchError("--from-run: %s" % loaded.rejected[0])
        if len(loaded.runs) != 1:
            raise DlaunchError("--from-run: %s holds %d runs, expected one" % (from_run, len(loaded.runs)))
        run = loaded.runs[0]
        if run.profile is None:
            raise DlaunchError(
                "--from-run: %s has no profile record (run the trainer with --profile-steps N)" % run.path
            )
        if model is not None and model != run.key.model and compute_ms is None:
            raise DlaunchError(
                "--from-run: %s trains %s, not --model %s: its compute time does not transfer "
                "(leave out --model, or give --compute-ms)" % (run.path, run.key.model, model)
            )
        model = model or run.key.model
        if model not in MODEL_PARAMS_M:
            raise DlaunchError("--from-run: %s trains %r, not a model the model knows" % (run.path, model))
        compute_ms = compute_ms if compute_ms is not None else 1e3 * run.profile.compute_s
        data_ms = data_ms if data_ms is not None else 1e3 * run.profile.data_s
        batch = batch or run.key.batch_per_worker
        reads_files = run.key.loader == "native"
        source = "measured in %s" % run.path
        if site is not None and run.key.site != site.name:
            source += (
                " on site %s: the compute and data times transfer to %s only if its GPUs (and CPUs) are the same"
                % (run.key.site, site.name)
            )
    measured = "give a measured compute time (--compute-ms with --batch, --from-run or --from-runs)"
    if compute_ms is None and model is not None and site is not None:
        gpu = site_gpu(site)
        if gpu is None:
            raise DlaunchError(
                "--compute-ms: site %s's GPU (%s) is not in data/published/gpus.csv, so no published compute time "
                "carries to it; %s" % (site.name, site.gpu_model or "gpu_model not stated", measured)
            )
        batch = batch or DEFAULT_BATCH
        try:
            compute = published_compute(gpu, model, batch, precision or gpu.default_precision)
        except LookupError as e:
            raise DlaunchError("--compute-ms: %s; %s" % (e, measured)) from None
        compute_ms, source = 1e3 * compute.seconds, compute.source
    if model is None:
        raise DlaunchError(
            "--model is needed unless --from-run names a profiled run (known: %s)" % ", ".join(sorted(MODEL_PARAMS_M))
        )
    if compute_ms is None:
        raise DlaunchError("--compute-ms: no site to carry a published compute time to; %s" % measured)
    if batch is None:
        raise DlaunchError("--batch: needed with --compute-ms (the batch per GPU it was measured with)")
    return (
        model,
        Workload(compute_ms / 1e3, batch, gradient_bytes(model), (data_ms or 0.0) / 1e3, reads_files=reads_files),
        source,
    )


def slowest_forward_excess(runs: Sequence[Run]) -> Dict[int, Optional[float]]:
    """Per GPU count of `runs`, the straggler measure of the flag (`stragglers.forward_excess`: the slowest rank's
    forward pass over the median rank's, a fraction; the mean over its runs that recorded phases; None: none did)."""
    by_gpus: Dict[int, Optional[float]] = {}
    for gpus in sorted({r.world_size for r in runs}):
        excesses = [forward_excess(r.phases) for r in runs if r.world_size == gpus and r.phases is not None]
        recorded = [e for e in excesses if e is not None]
        by_gpus[gpus] = fmean(recorded) if recorded else None
    return by_gpus


def runs_step(step_options: str, count: int) -> str:
    """What the calibration runs' step was, for the basis line: eager, or compiled (and other workload options)."""
    if not step_options:
        return "the %d runs' step: eager, torch's optimizer, default host syncs" % count
    compiled = "compiled, their compile time in the warm-up steps and left out" if "--compile" in step_options else ""
    return "the %d runs' step: %s%s" % (count, step_options, " (%s)" % compiled if compiled else "")


def _basis(fitted: Sequence[int], fitted_max: int) -> Callable[[int], str]:
    """'fitted' for a count the fit used, 'in range' between them, 'predicted' beyond the largest."""
    return lambda gpus: "fitted" if gpus in fitted else "in range" if gpus < fitted_max else "predicted"


LOADERS = ("native", "dali-cpu", "dali-gpu")  # `--loader`: the input pipelines the trainer has
OTHERS = "others: --calibrated dali|native|none (none: nominal, an upper bound), --from-runs RUN... (your runs)"


def default_calibration(site: Site, framework: str) -> Tuple[str, str]:
    """(calibration, why) of the best model `site` has: Table 2a's fit where the site is its machine (its DALI column,
    the native one for DeepSpeed), else the nominal model."""
    if not paper_machine(site):
        return "none", "no calibration exists for this site's machine (Table 2a's is JUWELS Booster's)"
    if framework == "deepspeed":
        return (
            "native",
            "the calibration of this site's machine, native loader: DeepSpeed cannot use DALI (Aach et al.)",
        )
    return "dali", (
        "the calibration of this site's machine, with the loader of the paper's main results (DALI: Figs. 3a, 4, 6, "
        "7), which keeps up with the GPUs"
    )


def model_line(calibration: str, why: str, asked: bool) -> str:
    """The first line: which model the rows are, why, and how to get the others."""
    if calibration == "runs":
        return "model: fitted on your runs (--from-runs); %s" % OTHERS
    kind = (
        "nominal (the site profile's figures; no timing noise, no loader wait unless --loader, no epoch costs): an "
        "upper bound"
        if calibration == "none"
        else "calibrated on Aach et al. 2023 Table 2a's %s column (JUWELS Booster, 4-%d GPUs)"
        % ("DALI" if calibration == "dali" else "native loader", CALIBRATION_MAX_GPUS)
    )
    return "model: %s; %s; %s" % (kind, "as asked (--calibrated %s)" % calibration if asked else why, OTHERS)


def check_precision(precision: Optional[str], site: Site) -> None:
    """`--precision` one of PRECISIONS that the site's GPU computes in."""
    if precision is None:
        return
    if precision not in PRECISIONS:
        raise DlaunchError("--precision: %r is not one of %s" % (precision, ", ".join(PRECISIONS)))
    gpu = site_gpu(site)
    if gpu is None:
        raise DlaunchError(
            "--precision: site %s's GPU (%s) is not in data/published/gpus.csv: no published compute time to choose"
            % (site.name, site.gpu_model or "gpu_model not stated")
        )
    if precision not in gpu.precisions:
        raise DlaunchError(
            "--precision: the %s has no %s (its precisions: %s)"
            % (gpu.name, PRECISION_NAMES[precision], ", ".join(gpu.precisions))
        )


def check_intra_node(site: Site, counts: Sequence[int], fitted_inside: bool = False) -> None:
    """Refuse a site without a [predict] figure for its GPUs' links inside a node where a count puts several GPUs on
    a node (unless `fitted_inside`: runs inside one node fit it)."""
    if site.gpus_per_node > 1 and max(counts) > 1 and intra_node_gbps(site) is None and not fitted_inside:
        raise DlaunchError(
            "--site: site %s has no [predict] intra_node_gbps_per_gpu (what links its %d GPUs inside a node, each way, "
            "with intra_node_source): add it from the node's documentation (docs/sites.md), or fit it with "
            "--from-runs on runs inside one node" % (site.name, site.gpus_per_node)
        )


def site_machine(site: Site, counts: Sequence[int]) -> Machine:
    """The site's nominal machine for `counts`: its [network] and inside a node its [predict] figure."""
    machine = interconnect_of_site(site)
    if machine is None:
        raise DlaunchError(
            "--site: site %s has no [network] section (latency_us, bandwidth_gbps_per_node); "
            "add one or calibrate with --from-runs" % site.name
        )
    check_intra_node(site, counts)
    return machine


def loader_input(site: Site, loader: Optional[str], calibration: str) -> Tuple[Optional[float], str]:
    """(images/s one GPU's loader makes, what that rests on): the site's [[predict.input]] row for `loader`, else the
    paper's setup where calibrated on it (`paper_input`), else unknown (the loader keeps up)."""
    if loader is None:
        return None, "input: no loader given (--loader native|dali-cpu|dali-gpu): taken to keep up"
    for row in site.predict.input if site.predict else []:
        if row.loader == loader:
            return (
                row.images_per_s,
                "input: %s, %.0f images/s per GPU with %d workers (site profile [[predict.input]]: %s)"
                % (
                    loader,
                    row.images_per_s,
                    row.workers,
                    row.source,
                ),
            )
    if calibration in ("dali", "native") and loader in ("native", "dali-cpu"):
        rate, why = paper_input("native" if loader == "native" else "dali")
        return rate, "input: %s, %.0f images/s per GPU: %s" % (loader, rate, why)
    return None, (
        "input: %s's rate on site %s is not known (no [[predict.input]] row; measure it on a node with "
        "`python -m dlaunch.train.loaderbench`): taken to keep up" % (loader, site.name)
    )


def site_computes_on(site: Site) -> str:
    """What a site's ranks compute on, as `RunsOrigin.computed_on` says it of a run."""
    if site.gpu_vendor == "none":
        return "CPU"
    return site.gpu_model or "a %s GPU (gpu_model not stated)" % site.gpu_vendor


def runs_mismatches(origins: Sequence[RunsOrigin], site: Site, model: Optional[str], runs_model: str) -> List[str]:
    """How `--from-runs`' runs differ from what is asked: another site, another GPU kind, another model."""
    out = []
    sites = sorted({o.site for o in origins} - {site.name})
    if sites:
        out.append("made on site %s, not %s" % (", ".join(sites), site.name))
    here = site_computes_on(site)

    def differs(origin: RunsOrigin) -> bool:
        if (origin.computed_on == "CPU") != (here == "CPU"):
            return True
        return origin.known and site.gpu_model is not None and origin.computed_on != here

    kinds = sorted({o.computed_on for o in origins if differs(o)})
    if kinds:
        out.append("computed on %s, not %s" % (", ".join(kinds), here))
    if model is not None and model != runs_model:
        out.append("train %s, not --model %s" % (runs_model, model))
    return out


@dataclass(frozen=True)
class PredictionResult:
    """What `dlaunch predict` shows: which model and why (`choice`), the workload and machine it assumed and where each
    came from, the model's row per GPU count (`predictions`) with its basis, the paper's values where its workload and
    machine are predicted (`checks`), the runs' slowest forward vs median and each run predicted from the others
    (`from_runs`), and the lines that say what the rows rest on (`notes`)."""

    site: str
    model: str
    framework: str
    workload: Workload
    machine: Machine
    compute_source: str  # where the compute time comes from
    machine_source: str  # the site's nominal network, or what it was fitted on
    storage: str  # the file system's ceiling and where it comes from, or "no ceiling"
    epochs: str  # the epochs and their overhead
    predictions: List[Prediction]
    basis: Dict[int, str]  # GPU count -> nominal, fitted, in range, predicted
    profiled: bool  # the comm share is what --profile-steps measures (from_runs), not NCCL's kernel share
    overhead: bool  # the rows hold an epoch overhead
    calibration: str  # dali, native (Table 2a's columns), none (nominal), runs (from_runs)
    choice: str  # the first line: the model, why, how to get the others
    library: str  # the collective library: NCCL, RCCL, Gloo
    input: str  # the loader's rate and its source
    run_epochs: int  # the epochs of the run time
    warning: str = ""  # from_runs of another site, GPU kind or model, allowed
    assumptions: List[str] = field(default_factory=list)  # about Aach et al.'s DeepSpeed runs
    checks: Optional[Dict[int, PaperCheck]] = None
    # per GPU count: the runs' slowest_forward_excess
    forward_excess_by_gpus: Optional[Dict[int, Optional[float]]] = None
    left_out: List[LeftOut] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def prediction(
    site: str,
    gpus: Optional[Sequence[int]] = None,
    model: Optional[str] = None,
    compute_ms: Optional[float] = None,
    data_ms: Optional[float] = None,
    batch: Optional[int] = None,
    framework: str = "ddp",
    zero_stage: Optional[int] = None,
    precision: Optional[str] = None,
    from_run: Optional[Path] = None,
    from_runs: Sequence[Path] = (),
    calibrated: Optional[str] = None,
    storage_images_per_s: Optional[float] = None,
    epoch_overhead: Optional[float] = None,
    epoch_images: int = IMAGENET_TRAIN_IMAGES,
    loader: Optional[str] = None,
    epochs: int = DEFAULT_EPOCHS,
    allow_other_runs: bool = False,
) -> PredictionResult:
    """The performance model for `site` as `dlaunch predict` runs it (each argument is its option; `calibrated` None:
    the site's best, `default_calibration`); DlaunchError naming the option for bad input."""
    if framework not in gradient_exchanges():
        raise DlaunchError(
            "--framework %s: the performance model knows how the gradients of %s travel, not of this one "
            "(its row in dlaunch/train/framework_table.py has no gradient_exchange)"
            % (framework, ", ".join(gradient_exchanges()))
        )
    profile = resolve_site(site)
    counts = (
        check_gpu_counts(gpus, profile)
        if gpus is not None
        else [g for g in DEFAULT_GPU_COUNTS if g <= site_max_gpus(profile)] or [1]
    )
    if storage_images_per_s is not None and not storage_images_per_s > 0:
        raise DlaunchError("--storage-images-per-s: must be positive (got %r)" % storage_images_per_s)
    if epoch_overhead is not None and not epoch_overhead >= 0:
        raise DlaunchError("--epoch-overhead: must not be negative (got %r)" % epoch_overhead)
    if epoch_images < 1:
        raise DlaunchError("--epoch-images: must be >= 1 (got %d)" % epoch_images)
    if epochs < 1:
        raise DlaunchError("--epochs: must be >= 1 (got %d)" % epochs)
    if calibrated is not None and calibrated not in ("dali", "native", "none"):
        raise DlaunchError(
            "--calibrated: %r is not a column of %s (dali, native) or none (nominal)"
            % (calibrated, AACH2023_TABLE2A.name)
        )
    if loader is not None and loader not in LOADERS:
        raise DlaunchError("--loader: %r is not one of %s" % (loader, ", ".join(LOADERS)))
    check_precision(precision, profile)
    measured_compute = compute_ms is not None or from_run is not None or bool(from_runs)
    if precision is not None and measured_compute:
        raise DlaunchError(
            "--precision: chooses the published compute time; a measured one (--compute-ms, --from-run, "
            "--from-runs) has its own precision"
        )
    if from_runs and (from_run is not None or calibrated not in (None, "none")):
        raise DlaunchError("--from-runs: not together with --from-run or --calibrated")
    asked = calibrated is not None
    calibration, why = (
        ("runs", "") if from_runs else (calibrated, "") if asked else default_calibration(profile, framework)
    )
    calibrated = calibration if calibration in ("dali", "native") else None
    if calibrated and loader is not None and (loader == "native") != (calibrated == "native"):
        raise DlaunchError(
            "--loader %s: --calibrated %s is Table 2a's %s column; use --calibrated %s"
            % (loader, calibrated, calibrated, "native" if loader == "native" else "dali")
        )
    loader = loader or {"dali": "dali-cpu", "native": "native"}.get(calibration)
    assumed = paper_assumptions(framework, calibrated, precision, zero_stage, measured_compute)
    precision = precision or (paper_precision(framework) if calibrated is not None else None)
    left_out: List[LeftOut] = []
    checks: Optional[Dict[int, PaperCheck]] = None
    overhead: Optional[EpochOverhead] = None
    forward_excess_by_gpus: Optional[Dict[int, Optional[float]]] = None
    storage_source = "--storage-images-per-s" if storage_images_per_s is not None else None
    warning = ""
    if from_runs:
        runs, step_options, origins = calibration_runs(from_runs)
        mismatches = runs_mismatches(origins, profile, model, runs[0].key.model)
        if mismatches and not allow_other_runs:
            raise DlaunchError(
                "--from-runs: the runs were %s: a fit on them is not a prediction of this (make calibration runs "
                "there, or pass --allow-other-runs to see it anyway, with a warning)" % "; ".join(mismatches)
            )
        if mismatches:
            warning = "WARNING: fitted on runs %s (--allow-other-runs): not a prediction of %s on %s's %s" % (
                "; ".join(mismatches),
                model or runs[0].key.model,
                profile.name,
                site_computes_on(profile),
            )
        check_intra_node(profile, counts, any(r.nodes == 1 and r.world_size > 1 for r in runs))
        base = interconnect_of_site(profile)
        left_out = leave_one_out(runs, base, profile.gpus_per_node)
        machine = replace(
            fit_runs(runs, base or unknown_network(profile.gpus_per_node)), gpus_per_node=profile.gpus_per_node
        )
        model_name, workload, source = runs[0].key.model, workload_of_run(runs[0]), "measured in %s" % runs[0].path
        fitted = sorted({r.world_size for r in runs})
        overhead, forward_excess_by_gpus = measured_overhead(runs), slowest_forward_excess(runs)
        machine_source = "fitted on your runs"
        basis = _basis(fitted, max(fitted))
        notes = [
            "basis: fitted = a GPU count of your runs (profiled comm %% as --profile-steps measures it); in range = "
            "between them; predicted = beyond %d GPUs; %s" % (max(fitted), runs_step(step_options, len(runs)))
        ]
    else:
        machine = site_machine(profile, counts)
        model_name, workload, source = workload_from_options(
            model, compute_ms, data_ms, batch, from_run, profile, precision
        )
        machine_source = "nominal (site profile), no timing noise"
        basis = lambda gpus: "nominal"
        notes = ["basis: nominal = the site profile's figures, nothing fitted (see --calibrated, --from-runs)"]
        if calibrated is not None:
            fit = fit_published()
            machine = replace(machine, noise_s=fit.machine.noise_s, beside_compute=fit.machine.beside_compute)
            machine_source = (
                "noise fitted on Aach et al. 2023 Table 2a, 4-%d GPUs (JUWELS Booster)" % CALIBRATION_MAX_GPUS
            )
            published = compute_ms is None and from_run is None
            io_s = 0.0
            if published:  # the paper's workload: its loader's I/O kernels run on the GPU too
                io_s = io_kernel_s(calibrated, workload.batch)
                workload = replace(workload, compute_s=workload.compute_s + io_s)
                source += "; plus Table 2a's %s I/O kernels" % calibrated
            overhead = PaperOverhead(calibrated, io_s, checkpoint_bytes(model_name))
            workload = calibrated_workload(workload, fit, calibrated, data_ms is not None or from_run is not None)
            basis = _basis([g for g in counts if g <= CALIBRATION_MAX_GPUS], CALIBRATION_MAX_GPUS)
            if calibrated == "native" and storage_images_per_s is None and profile.storage is None:
                storage_images_per_s = fit.machine.storage_images_per_s
                storage_source = STORAGE_FIT
                storage_counts = {gpus for _, gpus, _ in storage_points(load_statements())}
                basis = _basis(
                    [g for g in counts if g <= CALIBRATION_MAX_GPUS or g in storage_counts], CALIBRATION_MAX_GPUS
                )
            if (
                published
                and model_name == "resnet50"
                and workload.batch == DEFAULT_BATCH
                and data_ms is None
                and counts[0] == AACH2023_REFERENCE_GPUS
                and paper_machine(profile)
            ):
                checks = paper_checks(model_name, calibrated, framework, counts)
            notes = [
                "basis: fitted = inside the fit's range (Table 2a rows of 4-%d GPUs%s); predicted = beyond it"
                % (
                    CALIBRATION_MAX_GPUS,
                    "; the storage ceiling: E_G values of the paper" if storage_source == STORAGE_FIT else "",
                )
            ]
    input_rate, input_source = loader_input(profile, loader, calibration)
    workload = replace(
        workload,
        framework=framework,
        zero_stage=(zero_stage or 0) if gradient_exchanges()[framework] == "deepspeed-zero" else 0,
        input_images_per_s=input_rate,
    )
    if storage_images_per_s is None and profile.storage is not None:  # the site's [storage] fact
        storage_images_per_s, storage_source = profile.storage.loader_images_per_s, "site profile [storage]"
    machine = replace(machine, storage_images_per_s=storage_images_per_s)
    storage = (
        "no ceiling"
        if not (workload.reads_files and machine.storage_images_per_s)
        else "%.0f images/s for a loader reading files (%s)" % (machine.storage_images_per_s, storage_source)
    )
    if epoch_overhead is not None:
        overhead = FixedOverhead(epoch_overhead, "--epoch-overhead")
    if overhead is not None:
        epochs_line = describe_epochs(overhead, workload, epoch_images)
    elif from_runs:
        epochs_line = "epoch overhead: not recorded by your runs (metrics before version 4); give --epoch-overhead S"
    else:
        epochs_line = "epoch overhead: none (give --epoch-overhead S, or --from-runs with version 4 runs)"
    epochs_line += "; run time: %d epochs (--epochs), start-up and the first epoch's warm-up left out" % epochs
    predictions = predict(workload, machine, counts, overhead, epoch_images)
    if overhead is not None:
        limit = max(site_max_gpus(profile), counts[-1])
        passes = overhead_passes(workload, machine, overhead, counts[0], limit, epoch_images)
        notes.append(
            "overhead: seconds per epoch outside the steps and their share of the run's time; "
            + (
                "more than %.0f %% of it from %d GPUs on" % (100 * OVERHEAD_SHARE_LIMIT, passes)
                if passes
                else "under %.0f %% of it up to %d GPUs" % (100 * OVERHEAD_SHARE_LIMIT, limit)
            )
        )
    notes.append(
        "bound: what sets the step: compute (the GPUs' work and communication), input (the loader's rate), "
        "storage (the file system's ceiling)"
    )
    library = collective_library(profile)
    if library != "NCCL":
        notes.append(
            "collectives: %s's are costed with NCCL's tuning model (nccl.py, NCCL 2.8-2.10 constants), not checked "
            "against %s's own" % (library, library)
        )
    if forward_excess_by_gpus is not None:
        notes.append(
            "slowest forward vs median: how much longer your runs' slowest rank's forward pass took than the "
            "median rank's, the measure of the straggler flag (metrics version 4), at their GPU counts"
        )
    notes += check_summary(predictions, checks) if checks else []
    return PredictionResult(
        profile.name,
        model_name,
        framework,
        workload,
        machine,
        source,
        machine_source,
        storage,
        epochs_line,
        predictions,
        {p.gpus: basis(p.gpus) for p in predictions},
        bool(from_runs),
        overhead is not None,
        calibration,
        model_line(calibration, why, asked),
        library,
        input_source,
        epochs,
        warning,
        assumed,
        checks,
        forward_excess_by_gpus,
        left_out,
        notes,
    )
