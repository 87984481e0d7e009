"""Validated building blocks of site profiles (pydantic), shared by `sites.py` and the backends.

Every pattern here is a promise to `render.py`: a value that matches it may appear in a batch
script (quoted or inside a directive line) without changing the script's meaning. Pydantic matches
them as whole strings; Python code must use `re.fullmatch` (`re.match` with `$` passes `value\n`).
"""

import re
from typing import Annotated, List, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from dlaunch.boundary import NAME

SAFE_NAME = "^%s$" % NAME
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # Open MPI's OMPI_MCA_btl etc. are lowercase
OPTION = r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/@+=-]+)?$"
MODULE = r"^[A-Za-z0-9][A-Za-z0-9_.+/-]*$"
PATH = r"^/[A-Za-z0-9_./+@=-]*$"
BIND_PATH = PATH  # kept for existing callers: a path a container bind or Slurm option can carry
# An absolute path, or one under a directory a module names in a variable (`$OLCF_OFI_NCCL_ROOT/lib`),
# expanded when the job runs.
VAR_PATH = r"^(/|\$[A-Za-z_][A-Za-z0-9_]*(/|$))[A-Za-z0-9_./+@=-]*$"
BIND = r"^/[A-Za-z0-9_./+@=-]*(:/[A-Za-z0-9_./+@=-]*)?(:ro)?$"  # src[:dst][:ro]
HOST_SUFFIX = r"^[A-Za-z0-9.-]*$"
# A directive line of any scheduler: one option and its value after `=` or a space (`--qos=debug`,
# `-l filesystems=home:eagle`); each scheduler's Config checks its own form (`check_partitions`).
DIRECTIVE = r"^--?[A-Za-z][A-Za-z0-9-]*([= ][A-Za-z0-9_.,:/@+=-]+)?$"
WORD = r"^-{0,2}[A-Za-z0-9][A-Za-z0-9_.,:/@+=-]*$"  # one option word of a command (`--cpu-bind`, `depth`)
# A value exported by the script (quoted there): no NUL or other control character (dlaunch/boundary.py).
ENV_VALUE = r"^[^\x00-\x1f\x7f]*$"
# A value that names variables of the job (`/tmp/$USER-miopen-$SLURM_JOB_ID`), expanded when it runs: plain
# characters and `$NAME` (upper case, ended by one of `=:.,/@+-` or the value's end: `$USERx` would be another
# variable), nothing else the shell would act on.
JOB_VALUE = r"^([A-Za-z0-9_=:.,/@+-]|\$[A-Z][A-Z0-9_]*([=:.,/@+-]|$))*$"

SafeName = Annotated[str, StringConstraints(pattern=SAFE_NAME)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME)]
Option = Annotated[str, StringConstraints(pattern=OPTION)]
ModuleName = Annotated[str, StringConstraints(pattern=MODULE)]
AbsPath = Annotated[str, StringConstraints(pattern=PATH)]
Bind = Annotated[str, StringConstraints(pattern=BIND)]
Word = Annotated[str, StringConstraints(pattern=WORD)]
VarPath = Annotated[str, StringConstraints(pattern=VAR_PATH)]
EnvValue = Annotated[str, StringConstraints(pattern=ENV_VALUE)]
JobValue = Annotated[str, StringConstraints(pattern=JOB_VALUE)]

_TIME = re.compile(r"(?:([0-9]{1,4})-)?([0-9]{1,6})(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?")  # ASCII digits only


def parse_time(text: str) -> int:
    """Seconds of a Slurm time limit (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`);
    minutes and seconds below 60, hours below 24 after days (`25:99:00` is a typo, not 26:39:00)."""
    m = _TIME.fullmatch(text.strip())
    if not m:
        raise ValueError("%r is not a Slurm time (HH:MM:SS or D-HH:MM:SS)" % text)
    days, a, b, c = m.groups()
    a, b, c = int(a), int(b or 0), int(c or 0)
    if any(int(v) >= 60 for v in m.groups()[2:] if v is not None) or (days is not None and a >= 24):
        raise ValueError("%r is not a Slurm time: minutes and seconds go to 59, hours after days to 23" % text)
    if days is not None:
        seconds = int(days) * 86400 + a * 3600 + b * 60 + c
    elif m.group(4) is not None:
        seconds = a * 3600 + b * 60 + c
    elif m.group(3) is not None:
        seconds = a * 60 + b
    else:
        seconds = a * 60
    if seconds <= 0:
        raise ValueError("time limit %r is not positive" % text)
    return seconds


def format_time(seconds: int) -> str:
    """`D-HH:MM:SS` or `HH:MM:SS`, the way Slurm prints limits."""
    days, rest = divmod(seconds, 86400)
    hms = "%02d:%02d:%02d" % (rest // 3600, rest % 3600 // 60, rest % 60)
    return "%d-%s" % (days, hms) if days else hms


class StrictModel(BaseModel):
    """Unknown keys are errors (a typo in a profile must not pass silently); values are frozen and of
    their type (`gpus_per_node = "4"` is an error, not 4); numbers are finite (TOML has `inf` and `nan`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Partition(StrictModel):
    """A row of a site's queues: `--partition NAME` selects it, or the job's size does (`auto`). Its
    scheduler renders it (dlaunch/schedulers/: the queue `partition` names, default `name`; Slurm's QOS) and
    checks what it cannot take. `directives` are this row's own extra scheduler options."""

    name: SafeName
    partition: Optional[Annotated[str, StringConstraints(pattern=r"^([A-Za-z0-9][A-Za-z0-9_.+-]*)?$")]] = None
    qos: Optional[SafeName] = None  # a QOS (Slurm); a scheduler without one refuses it
    min_nodes: int = Field(default=1, gt=0, le=1_000_000)
    max_nodes: int = Field(gt=0, le=1_000_000)
    max_time: str
    default: bool = False
    auto: bool = True  # False: used only when named (--partition), never picked by the job's size
    directives: List[Annotated[str, StringConstraints(pattern=DIRECTIVE)]] = []
    # Nodes shared among jobs (allocated by resources): a job that uses part of a node's GPUs asks for that
    # share of its CPUs and is not bound by `[launch] gpu_step_options` (the cores they name are not its own).
    shared: bool = False
    # This row's options of a job that uses every GPU of its nodes (LUMI's small-g: --exclusive, so that the
    # CPU binding applies).
    whole_node_directives: List[Annotated[str, StringConstraints(pattern=DIRECTIVE)]] = []

    @field_validator("max_time")
    @classmethod
    def _time(cls, value: str) -> str:
        return format_time(parse_time(value))

    @model_validator(mode="after")
    def _nodes(self) -> "Partition":
        if self.min_nodes > self.max_nodes:
            raise ValueError("min_nodes %d exceeds max_nodes %d" % (self.min_nodes, self.max_nodes))
        return self

    @property
    def max_seconds(self) -> int:
        return parse_time(self.max_time)

    def fits(self, nodes: int, seconds: int) -> bool:
        return self.min_nodes <= nodes <= self.max_nodes and seconds <= self.max_seconds

    def limits(self) -> str:
        """`batch-92 (92-183 nodes, up to 06:00:00)`, for people."""
        return "%s (%d-%d nodes, up to %s)" % (self.name, self.min_nodes, self.max_nodes, self.max_time)


def check_partitions(partitions: List[Partition], directive: str, form: str) -> List[Partition]:
    """Partition names are unique, exactly one is the default, and the rows' directives are the
    scheduler's (`directive`: the pattern, `form`: how it looks, for the error)."""
    names = [p.name for p in partitions]
    if len(set(names)) != len(names):
        raise ValueError("a partition name appears twice")
    if partitions and sum(p.default for p in partitions) != 1:
        raise ValueError("exactly one partition must have default = true")
    for p in partitions:
        for line in p.directives + p.whole_node_directives:
            if not re.fullmatch(directive, line):
                raise ValueError("partition %s: directive %r is not of the form %s" % (p.name, line, form))
    return partitions
