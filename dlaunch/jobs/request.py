"""What the user asks for: a `LaunchRequest`, and the trainer flags it passes through."""

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from dlaunch.boundary import check_name
from dlaunch.errors import DlaunchError
from dlaunch.train.config import FLAGS, Flag  # the trainer's own definitions (torch-free module)
from dlaunch.train.framework_table import FRAMEWORKS

# The trainer's flags that users set through dlaunch (the rest come from the run directory and the
# environment); defined once, in dlaunch/train/config.py.
TRAINER_FLAGS: Tuple[Flag, ...] = tuple(flag for flag in FLAGS if flag.launcher)
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
    output: Optional[str] = None  # None: the site's runs_dir, else ./runs (dlaunch/runs/service.py: runs_folder)
    experiment: Optional[str] = None
    run_name: Optional[str] = None
    trainer: Tuple[Tuple[str, Any], ...] = ()  # (flag name, value), only flags the user set
    resume: bool = False
    requeue: Optional[bool] = None  # run again after a node failure (None: the site's default)
    allow_large: bool = False  # --allow-large: beyond the limits that catch typos (dlaunch/boundary.py LIMITS)
    include_suspect_nodes: bool = False  # --include-suspect-nodes: run on the site's suspect nodes too
    preflight: bool = False  # --preflight: every node checked before training, failing ones left out
    spare_nodes: int = 0  # --spare-nodes K: K nodes more than the job trains on (pre-flight picks the healthy)

    def __post_init__(self) -> None:
        check_framework(self.framework)
        for name, value in self.trainer:
            check_trainer_value(name, value)
        for flag, value in (("--nodes", self.nodes), ("--gpus", self.gpus)):
            if value is not None and value < 1:
                raise DlaunchError("%s: must be at least 1, got %d" % (flag, value))
        if self.spare_nodes < 0:
            raise DlaunchError("--spare-nodes: must not be negative, got %d" % self.spare_nodes)
        if self.spare_nodes and not self.preflight:
            raise DlaunchError("--spare-nodes: needs --preflight (spares are picked by the nodes' checks)")
        for flag, value in (("--experiment", self.experiment), ("--run-name", self.run_name)):
            if value is not None:
                check_name(flag, value)

    def option(self, name: str, default: Any = None) -> Any:
        """The value of trainer flag `name` if the user set it."""
        return dict(self.trainer).get(name, default)

    def normalized(self) -> "LaunchRequest":
        """Paths made absolute (site file, image, output, data), so the run can be resumed from anywhere."""

        def absolute(path: str) -> str:
            return os.path.abspath(path) if path else path

        site = absolute(self.site) if self.site.endswith(".toml") or os.sep in self.site else self.site
        data = self.option("data")
        trainer = tuple((k, absolute(v) if k == "data" and v != "synthetic" else v) for k, v in self.trainer)
        # An image given as a path (not a registry or store name: pyxis, podman-hpc) is made absolute.
        image = (
            absolute(self.image)
            if self.image and (self.image.startswith((".", "/")) or os.path.exists(self.image))
            else self.image
        )
        return dataclasses.replace(
            self,
            site=site,
            image=image,
            output=absolute(self.output) if self.output else self.output,
            trainer=trainer if data else self.trainer,
        )

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["trainer"] = dict(self.trainer)
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "LaunchRequest":
        fields = dict(data)
        fields["trainer"] = tuple((k, _stored_value(k, v)) for k, v in fields.get("trainer", {}).items())
        return cls(**fields)


def check_framework(name: str) -> None:
    """Refuse a framework the table (dlaunch/train/framework_table.py) does not have, or marks refused."""
    if name not in FRAMEWORKS:
        raise DlaunchError("--framework: %r is not one of %s" % (name, ", ".join(FRAMEWORKS)))
    if FRAMEWORKS[name].refused:
        raise DlaunchError("--framework %s: %s" % (name, FRAMEWORKS[name].refused))


def _stored_value(name: str, value: Any) -> Any:
    """A value as plan.json stored it; older launchers stored `--zero-stage` as a string."""
    flag = FLAGS_BY_NAME.get(name)
    if flag is not None and flag.kind is int and isinstance(value, str) and value.isdigit():
        return int(value)
    return value


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
    if flag.values and value not in flag.values:
        raise DlaunchError("--%s: %r is not one of %s" % (name, value, ", ".join(map(str, flag.values))))
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
