"""The trainer's command line -> `TrainConfig`, and input validation (`ConfigError`, exit code 2).

Everything that can be checked without starting a process group is checked here: flag values,
flag combinations, and the image folder (layout, non-empty classes, `--num-classes`). Torch-free.

Exit codes of `python -m train` (the launcher and Slurm scripts rely on them):
  0 finished, 2 bad input, 75 interrupted by SIGUSR1 (Slurm's time-limit warning; a checkpoint was
  written, rerun with `--resume`), 143 cancelled by SIGTERM (scancel; a checkpoint was written too),
  65 diverged (the loss stayed non-finite for `--max-nonfinite-steps` steps; no checkpoint of the
  non-finite weights is written), anything else: failed.
"""
import argparse
import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: resumable, requeue
EXIT_CANCELLED = 143  # 128 + SIGTERM
EXIT_DIVERGED = 65  # EX_DATAERR: the run's settings or data make the loss non-finite

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet44")
SCHEDULES = ("step", "cosine", "exponential")
FRAMEWORKS = ("ddp", "horovod", "deepspeed")
# The extensions torchvision's ImageFolder accepts.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ConfigError(ValueError):
    """Bad input: printed as one line `train: error: ...`, exit code 2."""


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
        return self.metrics or os.path.join(self.checkpoint_dir or os.getcwd(), "metrics.jsonl")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
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


def build_parser() -> argparse.ArgumentParser:
    """Every float flag is `finite_float`: NaN and infinity are refused, naming the flag."""
    d = TrainConfig()
    p = OneLineParser(prog="python -m train", description="Data-parallel ResNet training and benchmarking.")
    add = p.add_argument
    add("--framework", choices=FRAMEWORKS, default=d.framework)
    add("--loader", choices=("native", "dali"), default=d.loader)
    add("--dali-device", choices=("cpu", "gpu"), default=d.dali_device)
    add("--model", choices=MODELS, default=d.model)
    add("--num-classes", type=int, default=None, help="default: the folder's class count, 1000 for synthetic")
    add("--image-size", type=int, default=d.image_size)
    add("--data", default=d.data, help="'synthetic' or an ImageNet-layout folder (train/<class>/*, val/<class>/*)")
    add("--workers", type=int, default=d.workers, help="DataLoader worker processes per rank")
    add("--batch-size", type=int, default=d.batch_size, help="images per worker (rank) and step")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, default=None, help="default 90")
    length.add_argument("--steps", type=int, default=None, help="total optimizer steps (a short benchmark)")
    add("--steps-per-epoch", type=int, default=d.steps_per_epoch, help="synthetic epoch length in batches")
    add("--warmup-steps", type=int, default=d.warmup_steps, help="first steps excluded from throughput")
    add("--lr", type=finite_float, default=d.lr, help="learning rate for --reference-batch images, scaled linearly")
    add("--reference-batch", type=int, default=d.reference_batch)
    add("--momentum", type=finite_float, default=d.momentum)
    add("--weight-decay", type=finite_float, default=d.weight_decay, help="not applied to BatchNorm weights and biases")
    add("--warmup-epochs", type=finite_float, default=d.warmup_epochs)
    add("--schedule", choices=SCHEDULES, default=d.schedule)
    add("--lr-min", type=finite_float, default=d.lr_min, help="cosine floor")
    add("--gamma", type=finite_float, default=d.gamma, help="exponential decay per epoch")
    add("--label-smoothing", type=finite_float, default=d.label_smoothing)
    add("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    add("--amp", choices=("none", "bf16", "fp16"), default=d.amp)
    add("--channels-last", action="store_true")
    add("--sync-bn", action="store_true")
    add("--threads", type=int, default=None, help="torch CPU threads per rank (default: cores / local ranks)")
    add("--seed", type=int, default=d.seed)
    add("--metrics", default=None, help="JSON-lines file (default <checkpoint-dir or cwd>/metrics.jsonl)")
    add("--checkpoint-dir", default=None)
    add("--resume", action="store_true", help="continue from <checkpoint-dir>/last.pt if it exists")
    add("--target-accuracy", type=finite_float, default=None, help="top-1 fraction for time-to-accuracy, e.g. 0.75")
    add("--val-every", type=int, default=d.val_every, help="validate every N epochs (and after the last)")
    add("--max-nonfinite-steps", type=int, default=d.max_nonfinite_steps,
        help="stop with status 'diverged' (exit %d) after N consecutive steps with a NaN/inf loss" % EXIT_DIVERGED)
    add("--experiment", default=None)
    add("--site", default=None)
    add("--image", default=None, help="container image (provenance; default $DLAUNCH_IMAGE)")
    add("--profile-steps", type=int, default=d.profile_steps, help="time N steps after the warm-up steps")
    add("--fp16-allreduce", action="store_true")
    add("--fusion-threshold-mb", type=finite_float, default=d.fusion_threshold_mb)
    add("--backward-passes-per-step", type=int, default=d.backward_passes_per_step)
    add("--zero-stage", type=int, choices=(0, 1, 2, 3), default=d.zero_stage)
    add("--grad-clip", type=finite_float, default=None)
    return p


def parse_config(argv: List[str], check_paths: bool = True) -> TrainConfig:
    """Parse and validate `argv`; raise ConfigError naming the flag (or folder) at fault.

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
            raise ConfigError("--num-classes %d does not match %d classes in %s"
                              % (args["num_classes"], found, os.path.join(args["data"], "train")))
    args["image"] = args["image"] or os.environ.get("DLAUNCH_IMAGE") or None
    args["site"] = args["site"] or os.environ.get("DLAUNCH_SITE") or None
    args["experiment"] = args["experiment"] or os.environ.get("DLAUNCH_EXPERIMENT") or None
    cfg = TrainConfig(**args)
    _validate(cfg, check_paths)
    return cfg


def _validate(cfg: TrainConfig, check_paths: bool) -> None:
    positive = {"--batch-size": cfg.batch_size, "--image-size": cfg.image_size, "--num-classes": cfg.num_classes,
                "--steps-per-epoch": cfg.steps_per_epoch, "--reference-batch": cfg.reference_batch,
                "--val-every": cfg.val_every, "--backward-passes-per-step": cfg.backward_passes_per_step,
                "--max-nonfinite-steps": cfg.max_nonfinite_steps}
    if cfg.epochs is not None:
        positive["--epochs"] = cfg.epochs
    if cfg.steps is not None:
        positive["--steps"] = cfg.steps
    if cfg.threads is not None:
        positive["--threads"] = cfg.threads
    for flag, value in positive.items():
        if value < 1:
            raise ConfigError("%s %d must be at least 1" % (flag, value))
    non_negative = {"--workers": cfg.workers, "--warmup-steps": cfg.warmup_steps,
                    "--profile-steps": cfg.profile_steps, "--lr": cfg.lr, "--lr-min": cfg.lr_min,
                    "--warmup-epochs": cfg.warmup_epochs, "--momentum": cfg.momentum,
                    "--weight-decay": cfg.weight_decay}
    for flag, value in non_negative.items():
        if value < 0:
            raise ConfigError("%s %s must not be negative" % (flag, value))
    if cfg.image_size < 32:
        raise ConfigError("--image-size %d is too small (ResNets need at least 32)" % cfg.image_size)
    if not 0.0 <= cfg.label_smoothing < 1.0:
        raise ConfigError("--label-smoothing %s must be in [0, 1)" % cfg.label_smoothing)
    if not 0.0 < cfg.gamma <= 1.0:
        raise ConfigError("--gamma %s must be in (0, 1]" % cfg.gamma)
    if cfg.target_accuracy is not None and not 0.0 < cfg.target_accuracy <= 1.0:
        raise ConfigError("--target-accuracy %s must be a top-1 fraction in (0, 1], e.g. 0.75"
                          % cfg.target_accuracy)
    if cfg.steps is not None and cfg.warmup_steps + cfg.profile_steps >= cfg.steps:
        raise ConfigError("--warmup-steps %d + --profile-steps %d leave none of --steps %d to measure"
                          % (cfg.warmup_steps, cfg.profile_steps, cfg.steps))
    if cfg.resume and not cfg.checkpoint_dir:
        raise ConfigError("--resume needs --checkpoint-dir")
    if cfg.amp == "fp16" and cfg.device == "cpu":
        raise ConfigError("--amp fp16 needs --device cuda (use --amp bf16 on CPU)")
    if cfg.sync_bn and cfg.device == "cpu":
        raise ConfigError("--sync-bn needs --device cuda (torch's SyncBatchNorm is GPU-only)")
    if cfg.loader == "dali" and cfg.synthetic:
        raise ConfigError("--loader dali needs --data PATH (synthetic data has no loader)")
    if check_paths and os.path.exists(cfg.metrics_path) and os.path.getsize(cfg.metrics_path) > 0 and not cfg.resume:
        raise ConfigError("metrics file %s exists; pass --resume to append or choose another --metrics"
                          % cfg.metrics_path)


def count_image_folder_classes(root: str) -> int:
    """Check an ImageNet-layout folder (train/ and val/ with the same non-empty class folders)."""
    if not os.path.isdir(root):
        raise ConfigError("--data %s: no such directory" % root)
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
    return len(classes)
