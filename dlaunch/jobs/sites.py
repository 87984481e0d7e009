"""Site profiles: TOML files validated by pydantic, found by name, alias or path (schema: docs/sites.md)."""

import itertools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Dict, List, Literal, Mapping, Optional, Tuple, Type

from pydantic import Field, SerializeAsAny, StringConstraints, create_model, field_validator, model_validator

from dlaunch.boundary import ModelT, display_path, parse_toml, read_text, read_toml, read_toml_text
from dlaunch.errors import DlaunchError
from dlaunch.jobs.network import Network
from dlaunch.paths import SHIPPED_SITES_DIR, toml_files_by_name
from dlaunch.runtimes import NoContainer, Runtime
from dlaunch.runtimes import validate_config as runtime_config
from dlaunch.schedulers import scheduler_for
from dlaunch.schedulers import validate_config as scheduler_config
from dlaunch.specs.job import ShellWord
from dlaunch.specs.schema import (
    HOST_SUFFIX,
    PATH,
    AbsPath,
    EnvName,
    EnvValue,
    JobValue,
    ModuleName,
    Partition,
    ProfilePath,
    SafeName,
    SchedulerConfig,
    StrictModel,
    VarPath,
    Word,
)
from dlaunch.thresholds import DEFAULT_THRESHOLD
from dlaunch.train import fabric
from dlaunch.train.config import MIN_HANG_TIMEOUT_S
from dlaunch.train.framework_table import FRAMEWORKS

# Environment values with a documented range; a value outside it is refused with the source.
ENV_RANGES = {
    # NCCL env docs: "Values can be 1-31" (1-22 before NCCL 2.14); larger ones lose their high bits.
    "NCCL_IB_TIMEOUT": (1, 31, "NCCL's documentation (docs.nvidia.com/deeplearning/nccl, env.html)"),
    "NCCL_IB_RETRY_CNT": (0, 7, "NCCL's documentation (docs.nvidia.com/deeplearning/nccl, env.html)"),
}
DRIVER = r"^[0-9]+(\.[0-9]+)*$"


def check_env_ranges(env: Dict[str, str]) -> None:
    """Values with a documented range (ENV_RANGES) inside it."""
    for name, (low, high, source) in ENV_RANGES.items():
        if name in env and not (env[name].isdigit() and low <= int(env[name]) <= high):
            raise ValueError("%s = %r is outside %d-%d, the range %s gives" % (name, env[name], low, high, source))


class Storage(StrictModel):
    """The shared file system, for the performance model."""

    loader_images_per_s: float = Field(gt=0)  # what a loader reading each image as a file gets in all


class InputRate(StrictModel):
    """`[[predict.input]]`: what one GPU's loader decodes and augments on this site's nodes (ImageNet JPEGs, the
    training pipeline; `python -m dlaunch.train.loaderbench` measures it), with its source."""

    loader: Literal["native", "dali-cpu", "dali-gpu"]
    workers: int = Field(gt=0)  # its worker processes (native) or threads (DALI)
    images_per_s: float = Field(gt=0)
    source: str = Field(min_length=1)


class PredictFigures(StrictModel):
    """`[predict]`: the node's figures for the performance model, each with its source."""

    intra_node_gbps_per_gpu: Optional[float] = Field(default=None, gt=0)  # a GPU's link to its node's others, each way
    intra_node_source: str = ""
    input: List[InputRate] = []

    @model_validator(mode="after")
    def _sourced(self) -> "PredictFigures":
        if self.intra_node_gbps_per_gpu is not None and not self.intra_node_source:
            raise ValueError("intra_node_gbps_per_gpu needs intra_node_source")
        loaders = [row.loader for row in self.input]
        if len(set(loaders)) < len(loaders):
            raise ValueError("input: one row per loader")
        return self


class Reference(StrictModel):
    """A reference throughput measured on this site (`tolerance`: accepted relative deviation)."""

    model: str
    gpus: int = Field(gt=0)
    amp: Literal["none", "bf16", "fp16"] = "none"  # the trainer's --amp the figure was measured with (none: FP32/TF32)
    images_per_s: float = Field(gt=0)
    tolerance: float = Field(gt=0, lt=1)


class NcclNetPlugin(StrictModel):
    """A NCCL/RCCL network plugin (aws-ofi-nccl on Slingshot). `library_dir` (on the nodes) goes first
    on LD_LIBRARY_PATH, where NCCL looks for libnccl-net*.so, and into the container's binds; it may
    start with a variable a module of the profile sets (`$OLCF_OFI_NCCL_ROOT/lib`). Without it the
    plugin comes with the image or the site's container hooks (CSCS EDF annotations, podman-hpc --nccl)."""

    name: SafeName
    library_dir: Optional[VarPath] = None

    @property
    def directory(self) -> Optional[str]:
        """`library_dir` as the script carries it: a ShellWord when a variable names it."""
        if self.library_dir and self.library_dir.startswith("$"):
            return ShellWord(self.library_dir)
        return self.library_dir

    @property
    def variable(self) -> Optional[str]:
        """The variable `library_dir` starts with (None: a plain path)."""
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)(/.*)?", self.library_dir or "")
        return m.group(1) if m else None


# The launch modes a profile may choose per framework, by the framework table's launch style (the first:
# the default). dlaunch/jobs/launchers.py has one class per mode.
LAUNCH_MODES = {
    "torchrun-per-node": ("torchrun-per-node", "task-per-gpu"),
    "mpi-per-gpu": ("mpi-per-gpu", "mpirun"),
}
LaunchMode = Literal["torchrun-per-node", "task-per-gpu", "mpi-per-gpu", "mpirun"]


class FrameworkLaunch(StrictModel):
    """How one framework starts on this site (`[launch.<framework>]`)."""

    mode: Optional[LaunchMode] = None  # None: the framework table's style
    # Options of this framework's step only: srun options on Slurm, mpiexec/mpirun words otherwise.
    step_options: List[Word] = []
    # Variables set in each task once the scheduler started it, in front of the container (`env NAME=value
    # apptainer exec ...`): for what the scheduler's MPI plugin sets per task over the job script's value
    # (JSC's pspmix: PMIX_SECURITY_MODE=native, else the container's PMIx may pick munge and fail).
    task_env: Dict[EnvName, EnvValue] = {}
    # False: one hardware thread per core (Slurm's --hint=nomultithread); the tasks' CPUs are physical cores.
    smt: bool = True


class LaunchBase(StrictModel):
    """`[launch]`: the rendezvous address and GPU visibility, and per framework its mode (fields added below)."""

    # Run on the first node (the batch host); its first word is MASTER_ADDR, e.g. ["hostname", "-i"] (OLCF).
    rendezvous_command: List[Word] = []
    # The site shows each task only the GPU(s) bound to it (JSC's psslurm): every task gets the node's GPUs
    # made visible (CUDA_VISIBLE_DEVICES=0,1,..): a per-node launcher starts all of the node's workers, and a
    # task per GPU takes its local rank's (NCCL then reaches the other GPUs through CUDA IPC).
    binds_gpu_per_task: bool = False
    # Step options of every launch with one task per GPU, in jobs that hold their nodes' CPUs (on a `shared`
    # partition row only a job of all a node's GPUs does): task k on GPU k's cores (LUMI's per-GCD CPU masks).
    gpu_step_options: List[Word] = []

    def framework(self, name: str) -> FrameworkLaunch:
        return getattr(self, name.replace("-", "_"), None) or FrameworkLaunch()


# One optional `[launch.<name>]` per framework the profile may launch differently. A model built at import:
# pydantic's stub does not take its field definitions from a dict, and the checker cannot know its fields.
Launch = create_model(  # type: ignore[call-overload]
    "Launch",
    __base__=LaunchBase,
    **{
        name.replace("-", "_"): (Optional[FrameworkLaunch], Field(default=None, alias=name))
        for name, info in FRAMEWORKS.items()
        if info.launch in LAUNCH_MODES
    },
)


class EnvByNodes(StrictModel):
    """`[[env_by_nodes]]`: variables exported only for jobs of `min_nodes` to `max_nodes` nodes."""

    min_nodes: int = Field(default=1, gt=0)
    max_nodes: Optional[int] = Field(default=None, gt=0)
    env: Dict[EnvName, EnvValue] = Field(min_length=1)

    def applies(self, nodes: int) -> bool:
        return self.min_nodes <= nodes and (self.max_nodes is None or nodes <= self.max_nodes)


class Preflight(StrictModel):
    """`[preflight]`: the thresholds of `--preflight`'s node check (dlaunch/train/nodecheck.py)."""

    # The GEMM rate one GPU should reach (dense FP16 on its tensor cores, TFLOP/s), with where the figure comes from;
    # unset: the check compares each node with the allocation's median node instead.
    gemm_tflops_per_gpu: Optional[float] = Field(default=None, gt=0, allow_inf_nan=False)
    source: Optional[Annotated[str, StringConstraints(min_length=1, pattern=r"^[^\x00-\x1f]*$")]] = None
    # A node whose slowest device's rate is below this fraction of the expected (or median) rate fails.
    min_fraction: float = Field(default=0.5, gt=0, le=1)
    # Seconds the check step may take on every node; a node that wrote no result by then is named "no answer".
    timeout_s: int = Field(default=300, ge=60, le=3600)
    # A node whose every pair in the fabric check (dlaunch/train/fabric.py) is below this fraction of the nodes'
    # median best pair fails (a test cluster's healthy pairs differed 2.6x: benchmarks/README.md).
    fabric_min_fraction: float = Field(default=fabric.MIN_FRACTION, gt=0, le=1)
    # How often the job trains again after a hang (exit 69), from its checkpoint, on healthy nodes of its allocation
    # that the hang did not name (the spares first); 0: the job ends hung.
    hang_retries: int = Field(default=1, ge=0, le=10)

    @model_validator(mode="after")
    def _cited(self) -> "Preflight":
        if self.gemm_tflops_per_gpu is not None and not self.source:
            raise ValueError("gemm_tflops_per_gpu needs its source (the figure's page)")
        return self


def _from_v1(data: Any) -> Any:
    """A profile of the first schema (flat `scheduler = "slurm"`, `[container] runtime`) in the current one."""
    if not isinstance(data, dict) or not isinstance(data.get("scheduler"), str):
        return data
    data = dict(data)
    scheduler: Dict[str, Any] = {"kind": data.pop("scheduler")}
    by_qos = data.pop("partition_directive", "partition") == "qos"
    if "partitions" in data:
        scheduler["partitions"] = [
            dict(p, partition="", qos=p.get("name")) if by_qos and isinstance(p, dict) else p
            for p in data.pop("partitions")
        ]
    for old, new in (
        ("mpi_plugin", "mpi_plugin"),
        ("gres", "gres"),
        ("srun_args", "step_options"),
        ("sbatch_directives", "directives"),
    ):
        if old in data:
            scheduler[new] = data.pop(old)
    data["scheduler"] = scheduler
    container = data.get("container")
    if isinstance(container, dict) and "runtime" in container:
        container = dict(container)
        container["kind"] = container.pop("runtime")
        data["container"] = container
    return data


class Site(StrictModel):
    """A site profile; the schema reference for users is docs/sites.md."""

    name: SafeName
    description: str
    based_on: List[str] = Field(min_length=1)
    aliases: List[SafeName] = []
    arch: Literal["x86_64", "aarch64"] = "x86_64"  # of the compute nodes: picks the image
    if TYPE_CHECKING:  # any model with a `kind` at run time (a registered scheduler's Config is a StrictModel)
        scheduler: SchedulerConfig
    else:
        scheduler: SerializeAsAny[StrictModel]  # the backend's Config (dlaunch/schedulers/), by `kind`
    # Bounds far above any node (16 GPUs, a few hundred cores) that stop a typo's 2^63 GPUs reaching a script.
    gpus_per_node: int = Field(gt=0, le=64)
    cores_per_node: int = Field(gt=0, le=4096)
    # Hardware threads per core that the site's Slurm counts as CPUs (`--cpus-per-task` counts these):
    # 2 where SMT threads are CPUs (JSC), 1 where they are not or jobs default to --hint=nomultithread.
    threads_per_core: int = Field(default=1, gt=0, le=8)
    gpu_vendor: Literal["nvidia", "amd", "none"]
    gpu_model: Optional[SafeName] = None  # e.g. A100-40GB: lets `dlaunch predict` pick published compute times
    driver: Optional[Annotated[str, StringConstraints(pattern=DRIVER)]] = None  # GPU driver the site states
    account_env: Optional[EnvName] = None
    account_required: bool = False
    module_purge: bool = False  # `module purge` first
    module_use: List[AbsPath] = []  # `module use PATH` before `module load`
    modules: List[ModuleName] = []
    env: Dict[EnvName, EnvValue] = {}
    env_by_nodes: List[EnvByNodes] = []  # overrides `env` for jobs of some sizes
    env_prepend: Dict[EnvName, EnvValue] = {}  # NAME = "/x" -> NAME=/x:$NAME (or /x when NAME is unset)
    # Exported after `env`, their `$NAME`s expanded when the job runs (a per-user, per-job folder)
    env_expanded: Dict[EnvName, JobValue] = {}
    nccl_net_plugin: Optional[NcclNetPlugin] = None
    # Python per engine where the site runs without containers (e.g. tensorflow = "/opt/tf/bin/python"); one relative
    # to the profile's folder is made absolute when the profile is read (the shipped local one: ../.venv-tf/bin/python).
    interpreters: Dict[Literal["torch", "tensorflow", "mxnet"], ProfilePath] = {}
    # Where the site keeps its images and its runs, e.g. "$SCRATCH/dlaunch/runs" (a leading variable is expanded where
    # dlaunch runs: `folder`); unset: $DLAUNCH_IMAGES_DIR or the install tree's images/, and ./runs.
    images_dir: Optional[VarPath] = None
    runs_dir: Optional[VarPath] = None
    container: SerializeAsAny[Runtime] = NoContainer()  # the runtime's model (dlaunch/runtimes/), by `kind`
    rendezvous_host_suffix: Annotated[str, StringConstraints(pattern=HOST_SUFFIX)] = ""
    master_port: int = Field(default=29500, ge=1024, le=65535)
    launch: Launch = Launch()
    # Run a job again when its node fails (Slurm's own default, JobRequeue=1); the trainer resumes.
    requeue: bool = True
    network: Optional[Network] = None
    storage: Optional[Storage] = None
    predict: Optional[PredictFigures] = None
    reference: List[Reference] = []
    # A rank computing more than this fraction slower than the median rank is a straggler (dlaunch/analysis/stragglers.py).
    straggler_threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0, lt=1)
    # Seconds without a finished step before the trainer stops the job as hung (dlaunch/train/watchdog.py; exit 69);
    # None: the trainer's default from the measured steps, at least its FLOOR_S; 0: off. `--hang-timeout` overrides it.
    hang_timeout: Optional[float] = Field(default=None, ge=0, allow_inf_nan=False)
    preflight: Preflight = Preflight()  # `--preflight`'s thresholds

    _v1 = model_validator(mode="before")(_from_v1)
    _scheduler = field_validator("scheduler", mode="before")(scheduler_config)
    _container = field_validator("container", mode="before")(runtime_config)

    @field_validator("env")
    @classmethod
    def _documented_ranges(cls, env: Dict[str, str]) -> Dict[str, str]:
        check_env_ranges(env)
        return env

    @field_validator("hang_timeout")
    @classmethod
    def _hang_timeout(cls, seconds: Optional[float]) -> Optional[float]:
        if seconds and seconds < MIN_HANG_TIMEOUT_S:  # the trainer's own limit (dlaunch/train/config.py)
            raise ValueError("%s must be 0 (off) or at least %d seconds" % (seconds, MIN_HANG_TIMEOUT_S))
        return seconds

    @field_validator("env_by_nodes")
    @classmethod
    def _rows(cls, rows: List[EnvByNodes]) -> List[EnvByNodes]:
        for i, row in enumerate(rows):
            check_env_ranges(row.env)
            if row.max_nodes is not None and row.max_nodes < row.min_nodes:
                raise ValueError("row %d: max_nodes %d is below min_nodes %d" % (i, row.max_nodes, row.min_nodes))
            for other in rows[:i]:
                shared = set(row.env) & set(other.env)
                low = max(row.min_nodes, other.min_nodes)
                if shared and all(r.max_nodes is None or low <= r.max_nodes for r in (row, other)):
                    raise ValueError("two rows set %s for %d nodes" % (sorted(shared)[0], low))
        return rows

    @model_validator(mode="after")
    def _consistent(self) -> "Site":
        if scheduler_for(self.scheduler.kind).this_machine and self.container.containerized:
            raise ValueError("a site whose jobs run in the foreground on this machine has no container runtime")
        tables = {
            "env": set(self.env) | {n for row in self.env_by_nodes for n in row.env},
            "env_prepend": set(self.env_prepend),
            "env_expanded": set(self.env_expanded),
        }
        for (one, names), (other, more) in itertools.combinations(tables.items(), 2):
            if names & more:
                raise ValueError("%s and %s both set %s" % (one, other, sorted(names & more)[0]))
        self._check_launch()
        return self

    def _check_launch(self) -> None:
        asking = scheduler_for(self.scheduler.kind).gpu_request_field(self.scheduler)
        if asking and self.gpu_vendor == "none":
            raise ValueError('scheduler.%s: a site without GPUs (gpu_vendor = "none") asks for none' % asking)
        launch = self.launch
        form = scheduler_for(self.scheduler.kind).step_option_form  # () = words of the step command
        for option in launch.gpu_step_options if form else ():
            if not re.fullmatch(form[0], option):
                raise ValueError("launch.gpu_step_options: %r is not %s" % (option, form[1]))
        if launch.rendezvous_command and self.rendezvous_host_suffix:
            raise ValueError(
                "launch.rendezvous_command and rendezvous_host_suffix both name the rendezvous host: keep one"
            )
        for name, info in FRAMEWORKS.items():
            chosen = launch.framework(name)
            if info.launch not in LAUNCH_MODES or chosen == FrameworkLaunch():
                continue
            if scheduler_for(self.scheduler.kind).this_machine:
                raise ValueError(
                    "launch.%s: a site that runs its jobs in the foreground starts its processes itself "
                    "(torchrun --standalone, horovodrun)" % name
                )
            if chosen.mode and chosen.mode not in LAUNCH_MODES[info.launch]:
                raise ValueError(
                    "launch.%s.mode: %r is not one of %s" % (name, chosen.mode, ", ".join(LAUNCH_MODES[info.launch]))
                )
            if not chosen.smt and not scheduler_for(self.scheduler.kind).one_thread_per_core:
                raise ValueError(
                    "launch.%s.smt: a %s job cannot ask for one thread per core" % (name, self.scheduler.kind)
                )
            for option in chosen.step_options if form and chosen.mode != "mpirun" else ():  # mpirun: its own words
                if not re.fullmatch(form[0], option):
                    raise ValueError("launch.%s.step_options: %r is not %s" % (name, option, form[1]))

    def env_for(self, nodes: int) -> Dict[str, str]:
        """`env`, then the `env_by_nodes` rows that take a job of `nodes` nodes."""
        env = dict(self.env)
        for row in self.env_by_nodes:
            if row.applies(nodes):
                env.update(row.env)
        return env

    def launch_mode(self, framework: str) -> str:
        """How `framework` starts here: the profile's `[launch.<framework>] mode`, else the table's style."""
        return self.launch.framework(framework).mode or FRAMEWORKS[framework].launch

    def torch_python(self) -> str:
        """The Python that runs a torch tool of the trainer's beside its step (doctor's netcheck, pre-flight's
        nodecheck): the image's `python` in a container, else the profile's torch interpreter, else `python`."""
        return "python" if self.container.containerized else self.interpreters.get("torch", "python")

    def folder(self, field: str, environ: Mapping[str, str] = os.environ) -> Tuple[Optional[str], Optional[str]]:
        """`images_dir` or `runs_dir` with its leading variable expanded from `environ`: (path, None); (None, None)
        when the profile does not set it; where the variable is not set here, a path that says so
        (`/unset/SCRATCH/dlaunch/runs`, as a study's unset data) and why, for the caller to refuse or warn."""
        value = getattr(self, field)
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)(/.*)?", value or "")
        if not m:
            return value, None
        name, rest = m.group(1), m.group(2) or ""
        if not environ.get(name):
            return "/unset/%s%s" % (name, rest), "%s = %s (site %s): $%s is not set here" % (
                field,
                value,
                self.name,
                name,
            )
        path = os.path.normpath(environ[name] + rest)
        if not re.fullmatch(PATH, path):
            raise DlaunchError(
                "%s = %s (site %s): $%s is %r: give an absolute path of letters, digits and _./+@=-"
                % (field, value, self.name, name, environ[name])
            )
        return path, None

    @property
    def cpus_per_node(self) -> int:
        """What Slurm counts as a node's CPUs."""
        return self.cores_per_node * self.threads_per_core

    def cpus_for(self, framework: str) -> int:
        """The CPUs a node gives `framework`'s tasks: its physical cores where `[launch.<framework>] smt = false`."""
        return self.cpus_per_node if self.launch.framework(framework).smt else self.cores_per_node

    @property
    def partitions(self) -> List[Partition]:
        return list(getattr(self.scheduler, "partitions", []))

    def partition(self, name: Optional[str]) -> Partition:
        """The partition called `name` (None: the default one)."""
        for p in self.partitions:
            if (p.name == name) if name else p.default:
                return p
        known = ", ".join(p.name for p in self.partitions)
        raise DlaunchError("--partition: %r is not a partition of site %s (known: %s)" % (name, self.name, known))


def load_toml(path: Path, model: "Type[ModelT]") -> "ModelT":
    """Read a TOML file into `model` through the boundary (strict UTF-8, bounded); errors name the file and the field."""
    return read_toml(path, model)


def _located(site: Site, path: Path) -> Site:
    """The profile with its `interpreters` relative to its folder made absolute."""
    programs = dict(site.interpreters)
    for engine, program in programs.items():
        if not program.startswith("/"):
            programs[engine] = os.path.abspath(os.path.join(path.parent, program))
            if not re.fullmatch(PATH, programs[engine]):
                raise DlaunchError(
                    "%s: interpreters.%s: %s is %s here, which a job script cannot carry (give an absolute path)"
                    % (display_path(path), engine, program, programs[engine])
                )
    return site.model_copy(update={"interpreters": programs}) if programs != site.interpreters else site


def load_site(path: Path) -> Site:
    """Read and validate one profile."""
    return _located(load_toml(path, Site), path)


def load_profile(path: Path) -> Tuple[Site, str]:
    """One profile and its text as read (a run directory keeps the text: `site.toml`)."""
    site, text = read_toml_text(path, Site)
    return _located(site, path), text


def site_dirs() -> List[Path]:
    """Where profiles are looked up by name: user folders first, then the shipped ones."""
    user = os.environ.get("DLAUNCH_SITES_DIR")
    dirs = [Path(user)] if user else []
    dirs.append(Path.home() / ".config" / "dlaunch" / "sites")
    dirs.append(SHIPPED_SITES_DIR)
    return dirs


def available_sites() -> Dict[str, Path]:
    """Profile name -> file, earlier folders shadowing later ones."""
    return toml_files_by_name(site_dirs())


def _may_name(text: str, name: str, shown: str) -> bool:
    """Whether a profile's text, before validation, gives `name` as its name or an alias (a TOML string
    is quoted: a text without the quoted name does not)."""
    if '"%s"' % name not in text and "'%s'" % name not in text:
        return False
    data = parse_toml(text, shown)
    aliases = data.get("aliases")
    return data.get("name") == name or (isinstance(aliases, list) and name in aliases)


def resolve_site(name_or_path: str, given_by: str = "--site") -> Site:
    """A profile by file path (`x.toml`), file name, profile name or alias; `given_by`: the argument or
    flag that named it, for the message when none is found."""
    return resolve_profile(name_or_path, given_by)[0]


def resolve_profile(name_or_path: str, given_by: str = "--site") -> Tuple[Site, str]:
    """`resolve_site` and the profile's text as read."""
    return load_profile(profile_path(name_or_path, given_by))


def _answers(path: Path, stem: str, name: str) -> Optional[str]:
    """How the profile in `path` answers to `name`: by its file name, its name or an alias (None: it does not, or it
    cannot be read: one broken user profile must not hide the others)."""
    if stem == name:
        return "its file name"
    try:
        if not _may_name(read_text(path), name, display_path(path)):
            return None  # validated only where it may answer (start-up: each profile costs milliseconds)
        site = load_site(path)
    except DlaunchError:
        return None
    return "its name" if site.name == name else "an alias" if name in site.aliases else None


def profile_path(name_or_path: str, given_by: str = "--site") -> Path:
    """The profile file a path (`x.toml`, or a name with a folder) or a name names: the one profile (after a user
    folder's file has shadowed a shipped one of its file name) whose file name, name or alias it is. A name two
    profiles answer to is refused, naming both files: a profile picked by a rule the user did not see would render
    another machine's partitions, account and environment."""
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        return Path(name_or_path)
    files = available_sites()
    answering = [(path, how) for stem, path in files.items() for how in [_answers(path, stem, name_or_path)] if how]
    if len(answering) > 1:
        raise DlaunchError(
            "%s: %s names %d profiles: %s; give the one you mean by its path"
            % (
                given_by,
                name_or_path,
                len(answering),
                " and ".join("%s (%s)" % (display_path(path), how) for path, how in answering),
            )
        )
    if answering:
        return answering[0][0]
    unreadable = []
    for path in files.values():  # not found: the profiles that cannot be read may have named it
        try:
            load_profile(path)
        except DlaunchError as e:
            unreadable.append(str(e))
    hint = "; unreadable profile %s" % unreadable[0] if unreadable else ""
    raise DlaunchError("%s: unknown site %r (known: %s)%s" % (given_by, name_or_path, ", ".join(files), hint))
