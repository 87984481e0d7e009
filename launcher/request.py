"""What the user asks for: a `LaunchRequest`, and the trainer flags it passes through."""
import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from launcher.errors import DlaunchError
from train.config import FRAMEWORKS, MODELS, SCHEDULES  # the trainer's own names (torch-free module)

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class TrainerFlag:
    """One flag of the trainer's command line (docs/ARCHITECTURE.md) that users set through dlaunch."""

    name: str
    kind: type  # int, float, str, or bool for a switch
    help: str
    choices: Tuple[str, ...] = ()

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")


# The contract's flags except those the launcher sets itself (--framework is a launcher option too;
# --metrics, --checkpoint-dir, --resume come from the run directory; provenance goes by environment).
TRAINER_FLAGS: Tuple[TrainerFlag, ...] = (
    TrainerFlag("model", str, "network", MODELS),
    TrainerFlag("loader", str, "input pipeline", ("native", "dali")),
    TrainerFlag("dali-device", str, "where DALI decodes", ("cpu", "gpu")),
    TrainerFlag("data", str, "`synthetic` or an ImageFolder dataset directory"),
    TrainerFlag("num-classes", int, "classes of the classifier"),
    TrainerFlag("image-size", int, "image side in pixels"),
    TrainerFlag("workers", int, "loader workers per process"),
    TrainerFlag("batch-size", int, "batch per GPU (worker)"),
    TrainerFlag("epochs", int, "epochs to train"),
    TrainerFlag("steps", int, "optimizer steps to train (instead of epochs)"),
    TrainerFlag("steps-per-epoch", int, "synthetic epoch length"),
    TrainerFlag("warmup-steps", int, "steps excluded from throughput"),
    TrainerFlag("lr", float, "learning rate per reference batch"),
    TrainerFlag("reference-batch", int, "batch the learning rate refers to"),
    TrainerFlag("momentum", float, "SGD momentum"),
    TrainerFlag("weight-decay", float, "weight decay"),
    TrainerFlag("warmup-epochs", float, "learning-rate warm-up epochs"),
    TrainerFlag("schedule", str, "learning-rate schedule", SCHEDULES),
    TrainerFlag("lr-min", float, "final learning rate (cosine)"),
    TrainerFlag("gamma", float, "decay factor per epoch (exponential)"),
    TrainerFlag("label-smoothing", float, "label smoothing"),
    TrainerFlag("device", str, "compute device", ("auto", "cpu", "cuda")),
    TrainerFlag("amp", str, "mixed precision", ("none", "bf16", "fp16")),
    TrainerFlag("channels-last", bool, "channels-last memory format"),
    TrainerFlag("sync-bn", bool, "synchronized batch norm"),
    TrainerFlag("threads", int, "torch CPU threads per process"),
    TrainerFlag("seed", int, "random seed"),
    TrainerFlag("target-accuracy", float, "top-1 fraction for time-to-accuracy (training goes on)"),
    TrainerFlag("val-every", int, "validate every N epochs"),
    TrainerFlag("max-nonfinite-steps", int, "stop as 'diverged' after N consecutive NaN/inf losses"),
    TrainerFlag("profile-steps", int, "steps of the compute/communication profile"),
    TrainerFlag("fp16-allreduce", bool, "horovod: compress gradients to fp16"),
    TrainerFlag("fusion-threshold-mb", float, "horovod: tensor fusion buffer (MB)"),
    TrainerFlag("backward-passes-per-step", int, "horovod: gradient accumulation"),
    TrainerFlag("zero-stage", str, "deepspeed: ZeRO stage", ("0", "1", "2", "3")),
    TrainerFlag("grad-clip", float, "deepspeed: gradient clipping"),
)
FLAGS_BY_NAME = {flag.name: flag for flag in TRAINER_FLAGS}


@dataclass(frozen=True)
class LaunchRequest:
    """One job as the user asked for it (defaults resolved by `plan.build_plan`)."""

    site: str
    framework: str = "ddp"
    nodes: Optional[int] = None
    gpus: Optional[int] = None
    partition: Optional[str] = None
    time: str = "01:00:00"
    account: Optional[str] = None
    image: Optional[str] = None
    output: str = "runs"
    experiment: Optional[str] = None
    run_name: Optional[str] = None
    trainer: Tuple[Tuple[str, Any], ...] = ()  # (flag name, value), only flags the user set
    resume: bool = False
    requeue: Optional[bool] = None  # run again after a node failure (None: the site's default)

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise DlaunchError("--framework: %r is not one of %s" % (self.framework, ", ".join(FRAMEWORKS)))
        for name, value in self.trainer:
            check_trainer_value(name, value)
        for flag, value in (("--nodes", self.nodes), ("--gpus", self.gpus)):
            if value is not None and value < 1:
                raise DlaunchError("%s: must be at least 1, got %d" % (flag, value))
        for flag, value in (("--experiment", self.experiment), ("--run-name", self.run_name)):
            if value is not None and not SAFE_NAME.match(value):
                raise DlaunchError("%s: %r may only contain letters, digits and _.+- (not first)" % (flag, value))

    def option(self, name: str, default: Any = None) -> Any:
        """The value of trainer flag `name` if the user set it."""
        return dict(self.trainer).get(name, default)

    def normalized(self) -> "LaunchRequest":
        """Paths made absolute (site file, image, output, data), so the run can be resumed from anywhere."""
        def absolute(path: Optional[str]) -> Optional[str]:
            return os.path.abspath(path) if path else path
        site = absolute(self.site) if self.site.endswith(".toml") or os.sep in self.site else self.site
        data = self.option("data")
        trainer = tuple((k, absolute(v) if k == "data" and v != "synthetic" else v) for k, v in self.trainer)
        return dataclasses.replace(self, site=site, image=absolute(self.image), output=absolute(self.output),
                                   trainer=trainer if data else self.trainer)

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["trainer"] = dict(self.trainer)
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "LaunchRequest":
        fields = dict(data)
        fields["trainer"] = tuple(fields.get("trainer", {}).items())
        return cls(**fields)


def check_trainer_value(name: str, value: Any) -> None:
    """Refuse unknown flags, wrong types and values outside a flag's choices."""
    flag = FLAGS_BY_NAME.get(name)
    if flag is None:
        raise DlaunchError("--%s: not a trainer option" % name)
    ok_type = isinstance(value, flag.kind) and not (flag.kind is not bool and isinstance(value, bool))
    if flag.kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok_type = True
    if not ok_type:
        raise DlaunchError("--%s: expected %s, got %r" % (name, flag.kind.__name__, value))
    if flag.choices and value not in flag.choices:
        raise DlaunchError("--%s: %r is not one of %s" % (name, value, ", ".join(flag.choices)))
    if flag.kind is int and value < 0:
        raise DlaunchError("--%s: must not be negative, got %d" % (name, value))


def trainer_arguments(request: LaunchRequest) -> Tuple[str, ...]:
    """The user's trainer flags as argv, in contract order (switches only when on)."""
    argv = []
    for flag in TRAINER_FLAGS:
        value = request.option(flag.name)
        if value is None or value is False:
            continue
        argv.append("--" + flag.name)
        if flag.kind is not bool:
            argv.append(str(value))
    return tuple(argv)
