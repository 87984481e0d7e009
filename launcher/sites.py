"""Site profiles: TOML files validated by pydantic, found by name, alias or path."""
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Dict, List, Literal, Optional, Type, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from launcher.errors import DlaunchError
from launcher.rundir import display_path

SHIPPED_SITES_DIR = Path(__file__).resolve().parents[1] / "sites"

# Patterns for every profile value that reaches a batch script unquoted or inside an #SBATCH line.
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # Open MPI's OMPI_MCA_btl etc. are lowercase
OPTION = r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/@+=-]+)?$"
MODULE = r"^[A-Za-z0-9][A-Za-z0-9_.+/-]*$"
BIND_PATH = r"^/[A-Za-z0-9_./+@=-]*$"
GRES = r"^[A-Za-z0-9_:,.-]+$"
HOST_SUFFIX = r"^[A-Za-z0-9.-]*$"

SafeName = Annotated[str, StringConstraints(pattern=SAFE_NAME)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME)]
Option = Annotated[str, StringConstraints(pattern=OPTION)]
ModuleName = Annotated[str, StringConstraints(pattern=MODULE)]
BindPath = Annotated[str, StringConstraints(pattern=BIND_PATH)]

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time(text: str) -> int:
    """Seconds of a Slurm time limit (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`)."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError("%r is not a Slurm time (HH:MM:SS or D-HH:MM:SS)" % text)
    days, a, b, c = m.groups()
    a, b, c = int(a), int(b or 0), int(c or 0)
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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Partition(_Model):
    name: SafeName
    max_nodes: int = Field(gt=0)
    max_time: str
    default: bool = False

    @field_validator("max_time")
    @classmethod
    def _time(cls, value: str) -> str:
        return format_time(parse_time(value))

    @property
    def max_seconds(self) -> int:
        return parse_time(self.max_time)


class Container(_Model):
    runtime: Literal["apptainer", "singularity", "none"] = "none"
    flags: List[Option] = []
    binds: List[BindPath] = []
    stack: SafeName = "current"  # the default image stack (containers/versions.toml): current or paper


class Network(_Model):
    """Interconnect figures for the performance model (per node)."""

    latency_us: float = Field(gt=0)
    bandwidth_gbps_per_node: float = Field(gt=0)


class Reference(_Model):
    """A reference throughput measured on this site (`tolerance`: accepted relative deviation)."""

    model: str
    gpus: int = Field(gt=0)
    images_per_s: float = Field(gt=0)
    tolerance: float = Field(gt=0, lt=1)


# Environment values with a documented range; a value outside it is refused with the source.
ENV_RANGES = {
    # NCCL env docs: "Values can be 1-31" (1-22 before NCCL 2.14); larger ones lose their high bits.
    "NCCL_IB_TIMEOUT": (1, 31, "NCCL's documentation (docs.nvidia.com/deeplearning/nccl, env.html)"),
    "NCCL_IB_RETRY_CNT": (0, 7, "NCCL's documentation (docs.nvidia.com/deeplearning/nccl, env.html)"),
}


class Site(_Model):
    name: SafeName
    description: str
    based_on: List[str] = Field(min_length=1)
    aliases: List[SafeName] = []
    scheduler: Literal["slurm", "local"]
    # Perlmutter selects node pools by QOS (`--qos`), most sites by partition.
    partition_directive: Literal["partition", "qos"] = "partition"
    partitions: List[Partition] = []
    gres: Optional[Annotated[str, StringConstraints(pattern=GRES)]] = None
    gpus_per_node: int = Field(gt=0)
    cores_per_node: int = Field(gt=0)
    # Hardware threads per core that the site's Slurm counts as CPUs (`--cpus-per-task` counts these):
    # 2 where SMT threads are CPUs (JSC), 1 where they are not or jobs default to --hint=nomultithread.
    threads_per_core: int = Field(default=1, gt=0)
    gpu_vendor: Literal["nvidia", "amd", "none"]
    gpu_model: Optional[SafeName] = None  # e.g. A100-40GB: lets `dlaunch predict` pick published compute times
    account_env: Optional[EnvName] = None
    account_required: bool = False
    modules: List[ModuleName] = []
    env: Dict[EnvName, str] = {}
    container: Container = Container()
    mpi_plugin: Optional[SafeName] = None
    rendezvous_host_suffix: Annotated[str, StringConstraints(pattern=HOST_SUFFIX)] = ""
    master_port: int = Field(default=29500, ge=1024, le=65535)
    srun_args: List[Option] = []
    sbatch_directives: List[Option] = []
    # Run a job again when its node fails (Slurm's own default, JobRequeue=1); the trainer resumes.
    requeue: bool = True
    network: Optional[Network] = None
    reference: List[Reference] = []

    @field_validator("env")
    @classmethod
    def _documented_ranges(cls, env: Dict[str, str]) -> Dict[str, str]:
        for name, (low, high, source) in ENV_RANGES.items():
            if name in env and not (env[name].isdigit() and low <= int(env[name]) <= high):
                raise ValueError("%s = %r is outside %d-%d, the range %s gives" % (name, env[name], low, high, source))
        return env

    @model_validator(mode="after")
    def _consistent(self) -> "Site":
        if self.scheduler == "slurm":
            if not self.partitions:
                raise ValueError("a slurm site needs at least one partition")
            if sum(p.default for p in self.partitions) != 1:
                raise ValueError("exactly one partition must have default = true")
        elif self.partitions or self.container.runtime != "none":
            raise ValueError("a local site has no partitions and no container runtime")
        return self

    @property
    def cpus_per_node(self) -> int:
        """What Slurm counts as a node's CPUs."""
        return self.cores_per_node * self.threads_per_core

    def partition(self, name: Optional[str]) -> Partition:
        """The partition called `name` (None: the default one)."""
        for p in self.partitions:
            if (p.name == name) if name else p.default:
                return p
        known = ", ".join(p.name for p in self.partitions)
        raise DlaunchError("--partition: %r is not a partition of site %s (known: %s)" % (name, self.name, known))


ModelT = TypeVar("ModelT", bound=BaseModel)


def load_toml(path: Path, model: Type[ModelT]) -> ModelT:
    """Read a TOML file into `model`; errors name the file and the field."""
    shown = display_path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DlaunchError("%s: %s" % (shown, e.strerror or e)) from None
    except tomllib.TOMLDecodeError as e:
        raise DlaunchError("%s: invalid TOML: %s" % (shown, e)) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = first["msg"].replace("Value error, ", "")
        raise DlaunchError("%s: %s%s" % (shown, where + ": " if where else "", message)) from None


def load_site(path: Path) -> Site:
    """Read and validate one profile."""
    return load_toml(path, Site)


def site_dirs() -> List[Path]:
    """Where profiles are looked up by name: user folders first, then the shipped ones."""
    user = os.environ.get("DLAUNCH_SITES_DIR")
    dirs = [Path(user)] if user else []
    dirs.append(Path.home() / ".config" / "dlaunch" / "sites")
    dirs.append(SHIPPED_SITES_DIR)
    return dirs


def available_sites() -> Dict[str, Path]:
    """Profile name -> file, earlier folders shadowing later ones."""
    found: Dict[str, Path] = {}
    for folder in reversed(site_dirs()):
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            found[path.stem] = path
    return dict(sorted(found.items()))


def resolve_site(name_or_path: str) -> Site:
    """A profile by file path (`x.toml`), file name, profile name or alias."""
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        return load_site(Path(name_or_path))
    files = available_sites()
    if name_or_path in files:
        return load_site(files[name_or_path])
    unreadable = []
    for path in files.values():  # aliases: one broken user profile must not hide the others
        try:
            site = load_site(path)
        except DlaunchError as e:
            unreadable.append(str(e))
            continue
        if name_or_path == site.name or name_or_path in site.aliases:
            return site
    hint = "; unreadable profile %s" % unreadable[0] if unreadable else ""
    raise DlaunchError("--site: unknown site %r (known: %s)%s" % (name_or_path, ", ".join(files), hint))
