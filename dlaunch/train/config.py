"""The trainer's command line -> `TrainConfig`, and input validation (`ConfigError`, exit code 2).

Everything that can be checked without starting a process group is checked here: flag values,
flag combinations, and the image folder (layout, non-empty classes, `--num-classes`). Torch-free.

Exit codes of `python -m dlaunch.train` (the launcher and Slurm scripts rely on them):
  0 finished, 2 bad input, 75 interrupted by SIGUSR1 (Slurm's time-limit warning; a checkpoint was
  written, rerun with `--resume`), 143 cancelled by SIGTERM (scancel; a checkpoint was written too),
  65 diverged (the loss stayed non-finite for `--max-nonfinite-steps` steps; no checkpoint of the
  non-finite weights is written), anything else: failed.
"""

import argparse
import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from dlaunch.train.errors import EXIT_BAD_INPUT, EXIT_CANCELLED, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK, ConfigError  # noqa: F401
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.train.metrics_schema import METRICS_FILE

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet44")
SCHEDULES = ("step", "cosine", "exponential")
# The workload options of the step (dlaunch/train/workload.py; benchmarks/bare_loop_gpu.py takes the same ones).
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
HOST_SYNCS = ("default", "minimal")
GRAPH_EAGER_STEPS = 3  # eager steps on a side stream before a CUDA graph capture (torch.cuda.graph's warm-up)
WORKLOAD_FLAGS = ("compile", "cuda-graphs", "optimizer-impl", "host-syncs")
# The extensions torchvision's ImageFolder accepts.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# Limits of values the libraries refuse only once the job runs: numpy seeds take 0..2^32-1 (the MXNet
# trainer seeds numpy with --seed); one image's ResNet-50 training activations grow with its pixels
# (about 0.1 GB at 224 px, about 120 GB at 8192 px: the memory of the largest GPUs). The launcher
# parses the trainer's flags with this module, so a job beyond them is refused before it queues.
MAX_SEED = 2**32 - 1
MAX_IMAGE_SIZE = 8192


@dataclass(frozen=True)
class TrainConfig:
    """All trainer settings (one field per command-line flag)."""

    framework: str = "ddp"
    loader: str = "native"
    dali_device: str = "cpu"
    model: str = "resnet50"
    num_classes: int = 1000
    image_size: int = 224
    data: str = "synthetic"
    workers: int = 4
    batch_size: int = 64
    epochs: Optional[int] = None
    steps: Optional[int] = None
    steps_per_epoch: int = 100
    warmup_steps: int = 0
    lr: float = 0.025
    reference_batch: int = 64
    momentum: float = 0.9
    weight_decay: float = 1e-4
    warmup_epochs: float = 5.0
    schedule: str = "step"
    lr_min: float = 0.0
    gamma: float = 0.95
    label_smoothing: float = 0.1
    device: str = "auto"
    amp: str = "none"
    channels_last: bool = False
    sync_bn: bool = False
    threads: Optional[int] = None
    seed: int = 0
    metrics: Optional[str] = None
    checkpoint_dir: Optional[str] = None
    resume: bool = False
    target_accuracy: Optional[float] = None
    val_every: int = 1
    max_nonfinite_steps: int = 5
    experiment: Optional[str] = None
    site: Optional[str] = None
    image: Optional[str] = None
    profile_steps: int = 0
    kernel_profile_steps: int = 0
    compile: str = "off"
    cuda_graphs: bool = False
    optimizer_impl: str = "default"
    host_syncs: str = "default"
    # horovod
    fp16_allreduce: bool = False
    fusion_threshold_mb: float = 64.0
    backward_passes_per_step: int = 1
    # deepspeed
    zero_stage: int = 0
    grad_clip: Optional[float] = None

    @property
    def synthetic(self) -> bool:
        return self.data == "synthetic"

    @property
    def metrics_path(self) -> str:
        """`--metrics`, else `<--checkpoint-dir or cwd>/metrics.jsonl`."""
        return self.metrics or os.path.join(self.checkpoint_dir or os.getcwd(), METRICS_FILE)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]  # raises, as argparse's error does
        raise ConfigError(message)


def finite_float(text: str) -> float:
    """argparse type: a float that is neither NaN nor infinite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("%r is not a finite number" % text)
    return value


@dataclass(frozen=True)
class Flag:
    """One flag of the trainer's command line, defined once: the trainer's parser and the launcher's
    options (`dlaunch/jobs/request.py`) are both built from `FLAGS`; the default is `TrainConfig`'s field."""

    name: str
    kind: type  # int, float (finite), str, or bool for a switch
    help: str = ""
    choices: Union[Tuple[Any, ...], Callable[[], Tuple[Any, ...]]] = ()  # a callable: asked when the parser is built
    launcher: bool = True  # users set it through dlaunch (False: the launcher sets it itself)
    default_none: bool = False  # the parser's default is None (decided later), not TrainConfig's

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    @property
    def values(self) -> Tuple[Any, ...]:
        """The choices (asked now where they are a callable)."""
        return self.choices() if callable(self.choices) else self.choices


FLAGS: Tuple[Flag, ...] = (
    Flag("framework", str, "training framework", lambda: tuple(FRAMEWORKS), launcher=False),  # the table's rows
    Flag("model", str, "network", MODELS),
    Flag("loader", str, "input pipeline", ("native", "dali")),
    Flag("dali-device", str, "where DALI decodes", ("cpu", "gpu")),
    Flag("data", str, "'synthetic' or an ImageNet-layout folder (train/<class>/*, val/<class>/*)"),
    Flag(
        "num-classes",
        int,
        "classes of the classifier (default: the folder's class count, 1000 for synthetic)",
        default_none=True,
    ),
    Flag("image-size", int, "image side in pixels"),
    Flag("workers", int, "DataLoader worker processes per rank"),
    Flag("batch-size", int, "images per worker (rank) and step"),
    Flag("epochs", int, "epochs to train (default 90)"),
    Flag("steps", int, "total optimizer steps, instead of epochs (a short benchmark)"),
    Flag("steps-per-epoch", int, "synthetic epoch length in batches"),
    Flag("warmup-steps", int, "first steps excluded from throughput"),
    Flag("lr", float, "learning rate for --reference-batch images, scaled linearly"),
    Flag("reference-batch", int, "batch the learning rate refers to"),
    Flag("momentum", float, "SGD momentum"),
    Flag("weight-decay", float, "weight decay (not applied to BatchNorm weights and biases)"),
    Flag("warmup-epochs", float, "learning-rate warm-up epochs"),
    Flag("schedule", str, "learning-rate schedule", SCHEDULES),
    Flag("lr-min", float, "final learning rate (cosine floor)"),
    Flag("gamma", float, "decay factor per epoch (exponential)"),
    Flag("label-smoothing", float, "label smoothing"),
    Flag("device", str, "compute device", ("auto", "cpu", "cuda")),
    Flag("amp", str, "mixed precision", ("none", "bf16", "fp16")),
    Flag("channels-last", bool, "channels-last memory format"),
    Flag("sync-bn", bool, "synchronized batch norm"),
    Flag("threads", int, "torch CPU threads per rank (default: cores / local ranks)"),
    Flag("seed", int, "random seed"),
    Flag("metrics", str, "JSON-lines file (default <checkpoint-dir or cwd>/metrics.jsonl)", launcher=False),
    Flag("checkpoint-dir", str, "checkpoint folder", launcher=False),
    Flag("resume", bool, "continue from <checkpoint-dir>/last.pt if it exists", launcher=False),
    Flag("target-accuracy", float, "top-1 fraction for time-to-accuracy, e.g. 0.75 (training goes on)"),
    Flag("val-every", int, "validate every N epochs (and after the last)"),
    Flag("max-nonfinite-steps", int, "stop as 'diverged' (exit %d) after N consecutive NaN/inf losses" % EXIT_DIVERGED),
    Flag("experiment", str, "experiment name (provenance; default $DLAUNCH_EXPERIMENT)", launcher=False),
    Flag("site", str, "site name (provenance; default $DLAUNCH_SITE)", launcher=False),
    Flag("image", str, "container image (provenance; default $DLAUNCH_IMAGE)", launcher=False),
    Flag("profile-steps", int, "time N steps after the warm-up steps (compute/communication profile)"),
    Flag(
        "kernel-profile-steps",
        int,
        "CUDA kernel time per class (NCCL, cuDNN, I/O) over N steps after those "
        "(torch.profiler; GPU runs; N past the run's end: to the end)",
    ),
    Flag(
        "compile",
        str,
        "torch.compile the model in this mode; it compiles in the first step, a warm-up step, whose "
        "wall time the first epoch record keeps as compile_s (measured on an H100: default; the other modes not yet)",
        COMPILE_MODES,
    ),
    Flag(
        "cuda-graphs",
        bool,
        "capture the whole step in one CUDA graph at the last warm-up step and replay it "
        "(DDP on a GPU, static shapes, --optimizer-impl fused)",
    ),
    Flag("optimizer-impl", str, "SGD implementation: torch's choice, foreach (multi-tensor) or fused", OPTIMIZER_IMPLS),
    Flag(
        "host-syncs",
        str,
        "minimal: no per-step host synchronisation (the loss is read at the stop checks only; "
        "fp16 needs --optimizer-impl fused; on an H100 it measured slower than fused alone, cause open: "
        "benchmarks/README.md)",
        HOST_SYNCS,
    ),
    Flag("fp16-allreduce", bool, "horovod: compress gradients to fp16"),
    Flag("fusion-threshold-mb", float, "horovod: tensor fusion buffer (MB)"),
    Flag("backward-passes-per-step", int, "horovod: gradient accumulation"),
    Flag("zero-stage", int, "deepspeed: ZeRO stage", (0, 1, 2, 3)),
    Flag("grad-clip", float, "deepspeed: gradient clipping"),
)
FLAGS_BY_NAME: Dict[str, Flag] = {flag.name: flag for flag in FLAGS}


def workload_flags(config: Dict[str, Any]) -> str:
    """The workload options a metrics header's `config` records away from their defaults, as flags
    ("--compile default --cuda-graphs"); "" for none, as for a header older than these options."""
    defaults = TrainConfig()
    words = []
    for name in WORKLOAD_FLAGS:
        attr = name.replace("-", "_")
        value = config.get(attr, getattr(defaults, attr))
        if value != getattr(defaults, attr):
            words.append("--" + name if value is True else "--%s %s" % (name, value))
    return " ".join(words)


def build_parser() -> argparse.ArgumentParser:
    """The parser of `FLAGS`; every float flag is `finite_float` (NaN and infinity are refused, naming the flag)."""
    defaults = TrainConfig()
    p = OneLineParser(prog="python -m dlaunch.train", description="Data-parallel ResNet training and benchmarking.")
    length = p.add_mutually_exclusive_group()
    for flag in FLAGS:
        add = length.add_argument if flag.name in ("epochs", "steps") else p.add_argument
        if flag.kind is bool:
            add("--" + flag.name, action="store_true", help=flag.help)
            continue
        default = None if flag.default_none else getattr(defaults, flag.attr)
        kind = finite_float if flag.kind is float else flag.kind
        add("--" + flag.name, type=kind, choices=flag.values or None, default=default, help=flag.help)
    return p


def parse_config(argv: List[str], check_paths: bool = True, engine: str = "torch") -> TrainConfig:
    """Parse and validate `argv` for `engine`'s trainer (torch, tensorflow, mxnet); raise ConfigError naming
    the flag (or folder) at fault.

    `check_paths=False` checks the flags alone (the launcher, before a job's data folder and run
    directory are reachable): the folder's class count and an existing metrics file are not checked.
    """
    args = vars(build_parser().parse_args(argv))
    if args["epochs"] is None and args["steps"] is None:
        args["epochs"] = 90
    if args["data"] == "synthetic":
        if args["num_classes"] is None:
            args["num_classes"] = 1000
    elif not check_paths:
        args["num_classes"] = args["num_classes"] or 1  # the folder decides at run time
    else:
        found = count_image_folder_classes(args["data"])
        if args["num_classes"] is None:
            args["num_classes"] = found
        elif args["num_classes"] != found:
            raise ConfigError(
                "--num-classes %d does not match %d classes in %s"
                % (args["num_classes"], found, os.path.join(args["data"], "train"))
            )
    args["image"] = args["image"] or os.environ.get("DLAUNCH_IMAGE") or None
    args["site"] = args["site"] or os.environ.get("DLAUNCH_SITE") or None
    args["experiment"] = args["experiment"] or os.environ.get("DLAUNCH_EXPERIMENT") or None
    cfg = TrainConfig(**args)
    check_engine_flags(cfg, engine)
    _validate(cfg, check_paths)
    return cfg


def check_engine_flags(cfg: TrainConfig, engine: str) -> None:
    """Refuse the flags the TensorFlow and MXNet trainers do not implement, naming the flag (before the other
    checks, which may ask for more of an option the trainer refuses anyway)."""
    if engine == "torch":
        return
    unsupported = {
        "--loader dali": cfg.loader == "dali",
        "--device cuda": cfg.device == "cuda",
        "--amp %s" % cfg.amp: cfg.amp != "none",
        "--channels-last": cfg.channels_last,
        "--sync-bn": cfg.sync_bn,
        "--checkpoint-dir": bool(cfg.checkpoint_dir),
        "--resume": cfg.resume,
        "--profile-steps": cfg.profile_steps > 0,
        "--kernel-profile-steps": cfg.kernel_profile_steps > 0,
        "--fp16-allreduce": cfg.fp16_allreduce,
        "--compile %s" % cfg.compile: cfg.compile != "off",
        "--cuda-graphs": cfg.cuda_graphs,
        "--optimizer-impl %s" % cfg.optimizer_impl: cfg.optimizer_impl != "default",
        "--host-syncs minimal": cfg.host_syncs == "minimal",
    }
    for flag, given in unsupported.items():
        if given:
            raise ConfigError("%s: not supported by the %s trainer (CPU, no checkpoints, no profiler)" % (flag, engine))
    if cfg.model not in ("resnet44", "resnet50"):
        raise ConfigError("--model %s: the %s trainer has resnet44 and resnet50" % (cfg.model, engine))


def _validate(cfg: TrainConfig, check_paths: bool) -> None:
    positive = {
        "--batch-size": cfg.batch_size,
        "--image-size": cfg.image_size,
        "--num-classes": cfg.num_classes,
        "--steps-per-epoch": cfg.steps_per_epoch,
        "--reference-batch": cfg.reference_batch,
        "--val-every": cfg.val_every,
        "--backward-passes-per-step": cfg.backward_passes_per_step,
        "--max-nonfinite-steps": cfg.max_nonfinite_steps,
    }
    if cfg.epochs is not None:
        positive["--epochs"] = cfg.epochs
    if cfg.steps is not None:
        positive["--steps"] = cfg.steps
    if cfg.threads is not None:
        positive["--threads"] = cfg.threads
    for flag, value in positive.items():
        if value < 1:
            raise ConfigError("%s %d must be at least 1" % (flag, value))
    non_negative = {
        "--workers": cfg.workers,
        "--warmup-steps": cfg.warmup_steps,
        "--profile-steps": cfg.profile_steps,
        "--kernel-profile-steps": cfg.kernel_profile_steps,
        "--lr": cfg.lr,
        "--lr-min": cfg.lr_min,
        "--warmup-epochs": cfg.warmup_epochs,
        "--momentum": cfg.momentum,
        "--weight-decay": cfg.weight_decay,
    }
    for flag, value in non_negative.items():  # type: ignore[assignment]  # value also names the loop above's int counts; these are numbers
        if value < 0:
            raise ConfigError("%s %s must not be negative" % (flag, value))
    if cfg.image_size < 32:
        raise ConfigError("--image-size %d is too small (ResNets need at least 32)" % cfg.image_size)
    if cfg.image_size > MAX_IMAGE_SIZE:
        raise ConfigError(
            "--image-size %d is too large: one image's activations would not fit a GPU (at most %d)"
            % (cfg.image_size, MAX_IMAGE_SIZE)
        )
    if not 0 <= cfg.seed <= MAX_SEED:
        raise ConfigError("--seed %d is outside 0..%d (numpy's seed range)" % (cfg.seed, MAX_SEED))
    if not 0.0 <= cfg.label_smoothing < 1.0:
        raise ConfigError("--label-smoothing %s must be in [0, 1)" % cfg.label_smoothing)
    if not 0.0 < cfg.gamma <= 1.0:
        raise ConfigError("--gamma %s must be in (0, 1]" % cfg.gamma)
    if cfg.target_accuracy is not None and not 0.0 < cfg.target_accuracy <= 1.0:
        raise ConfigError("--target-accuracy %s must be a top-1 fraction in (0, 1], e.g. 0.75" % cfg.target_accuracy)
    if cfg.steps is not None and cfg.warmup_steps + cfg.profile_steps >= cfg.steps:
        raise ConfigError(
            "--warmup-steps %d + --profile-steps %d leave none of --steps %d to measure"
            % (cfg.warmup_steps, cfg.profile_steps, cfg.steps)
        )
    _validate_workload(cfg)
    if cfg.resume and not cfg.checkpoint_dir:
        raise ConfigError("--resume needs --checkpoint-dir")
    if cfg.amp == "fp16" and cfg.device == "cpu":
        raise ConfigError("--amp fp16 needs --device cuda (use --amp bf16 on CPU)")
    if cfg.sync_bn and cfg.device == "cpu":
        raise ConfigError("--sync-bn needs --device cuda (torch's SyncBatchNorm is GPU-only)")
    if cfg.loader == "dali" and cfg.synthetic:
        raise ConfigError("--loader dali needs --data PATH (synthetic data has no loader)")
    if check_paths and cfg.loader != "dali" and not cfg.synthetic and _is_tfrecord_dir(cfg.data):
        raise ConfigError(
            "--data %s holds TFRecords, which only --loader dali reads (the native loader reads an "
            "image folder)" % cfg.data
        )
    if check_paths and os.path.exists(cfg.metrics_path) and os.path.getsize(cfg.metrics_path) > 0 and not cfg.resume:
        raise ConfigError(
            "metrics file %s exists; pass --resume to append or choose another --metrics" % cfg.metrics_path
        )


def _validate_workload(cfg: TrainConfig) -> None:
    """The combinations of the workload options that cannot run (benchmarks/bare_loop_gpu.py refuses the same ones;
    what needs the torch of the image or the framework is checked when the run starts: dlaunch/train/workload.py)."""
    fp16_unfused = cfg.amp == "fp16" and cfg.optimizer_impl != "fused"
    if cfg.compile != "off" and cfg.warmup_steps < 1:
        raise ConfigError(
            "--compile %s needs --warmup-steps >= 1 (the first step compiles; it must not be measured)" % cfg.compile
        )
    if cfg.host_syncs == "minimal" and fp16_unfused:
        raise ConfigError(
            "--host-syncs minimal with --amp fp16 needs --optimizer-impl fused (otherwise GradScaler's "
            "step reads its overflow flag on the host every step)"
        )
    if not cfg.cuda_graphs:
        return
    if cfg.optimizer_impl != "fused":
        raise ConfigError(
            "--cuda-graphs needs --optimizer-impl fused (the captured step reads the LR of the schedule "
            "from a device tensor, which only the fused SGD reads without a host sync)"
        )
    if cfg.compile == "reduce-overhead":
        raise ConfigError("--cuda-graphs with --compile reduce-overhead: that mode captures CUDA graphs itself")
    if cfg.warmup_steps <= GRAPH_EAGER_STEPS:
        raise ConfigError(
            "--cuda-graphs needs --warmup-steps > %d (eager steps before the capture)" % GRAPH_EAGER_STEPS
        )
    if cfg.device == "cpu":
        raise ConfigError("--cuda-graphs needs --device cuda")
    if cfg.profile_steps > 0:
        raise ConfigError(
            "--cuda-graphs with --profile-steps: a profiled step runs in synchronised parts, which a "
            "captured step cannot"
        )


def _is_tfrecord_dir(root: str) -> bool:
    from dlaunch.train.data.tfrecords import is_tfrecord_dir  # here: dlaunch.train.data imports this module

    return is_tfrecord_dir(root)


def count_image_folder_classes(root: str) -> int:
    """Check an ImageNet-layout folder (train/ and val/ with the same non-empty class folders), or the
    TFRecord form of one (its manifest and files: dlaunch/train/data/tfrecords.py)."""
    if not os.path.isdir(root):
        raise ConfigError("--data %s: no such directory" % root)
    if _is_tfrecord_dir(root):
        from dlaunch.train.data.tfrecords import read_manifest

        return len(read_manifest(root)["classes"])
    classes = None
    for split in ("train", "val"):
        split_dir = os.path.join(root, split)
        if not os.path.isdir(split_dir):
            raise ConfigError("--data %s: missing %s/ folder" % (root, split))
        names = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
        if not names:
            raise ConfigError("--data %s: no class folders in %s" % (root, split_dir))
        for name in names:
            class_dir = os.path.join(split_dir, name)
            if not any(f.lower().endswith(IMAGE_EXTENSIONS) for f in os.listdir(class_dir)):
                raise ConfigError("--data %s: no images in %s" % (root, class_dir))
        if classes is not None and names != classes:
            raise ConfigError("--data %s: train/ and val/ have different class folders" % root)
        classes = names
    return len(classes)  # type: ignore[arg-type]  # set by the loop over train and val
