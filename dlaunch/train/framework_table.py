"""The frameworks dlaunch can launch, one row each (torch-free, standard library only, Python 3.9).

The one table of them (`FRAMEWORKS`), read where it is used, so that a row added later counts too:
- the trainer: which seam class (`dlaunch/train/frameworks/__init__.py`), `--framework`'s choices
  (`dlaunch/train/config.py`), the task-per-worker engines' roles (`dlaunch/train/engines.py`);
- the launcher: `--framework`'s choices (`dlaunch/jobs/request.py`), how processes start and which
  module they run (`dlaunch/jobs/launchers.py`: `launch`, `entry`), the default image (`imagepaths.py`);
- the images: one image per pip group (`image_groups`; every stack builds the torch groups, the
  other engines' groups only the stacks that pin them: `stack_image_groups`): the lock's `pip.<group>`
  pins (`containers/versions.toml`), the definition files and their %test imports
  (`dlaunch/jobs/images.py`: `import_check`), `make image-<group>` (`containers/images.mk`:
  `python3 -c 'import dlaunch.train.framework_table as t; print(*t.image_groups())'`);
- the performance model: how gradients travel (`gradient_exchange`, `dlaunch/analysis/perfmodel/model.py`).
Adding a framework: its implementation file (the seam class) plus one row here.
"""

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Tuple

# How processes start (dlaunch/jobs/launchers.py has one class per style):
#   torchrun-per-node  one torchrun per node, c10d rendezvous at the first host (DDP, DeepSpeed)
#   mpi-per-gpu        one MPI rank per GPU through the scheduler's MPI wiring (Horovod)
#   task-per-worker    one scheduler task per process (`srun --ntasks=N python -m <entry>`); each task
#                      takes its role from its task id (dlaunch/train/engines.py): tasks 0..coordinators-1 the
#                      coordinators, then servers_per_node servers on every node, the rest workers.
#                      Tasks in all: nodes x (workers per node + servers_per_node) + coordinators.
LAUNCH_STYLES = ("torchrun-per-node", "mpi-per-gpu", "task-per-worker")
# The engine every image stack (containers/versions.toml) builds images for; TensorFlow's and MXNet's
# images exist in the stacks whose lock pins their group (the cpu stack's pip.tensorflow, pip.mxnet).
EVERY_STACK_ENGINE = "torch"


@dataclass(frozen=True)
class FrameworkInfo:
    name: str
    engine: str  # torch | tensorflow | mxnet: which trainer and image stack
    implementation: str  # "module:Class" of the trainer's framework seam
    launch: str  # one of LAUNCH_STYLES
    pip_group: str  # its image and the lock's `pip.<group>` pins installed into it (one engine per group)
    import_check: str  # module its image's %test imports (and that must import for the trainer to start)
    install_hint: str  # what to install when the import fails
    description: str
    entry: str = "dlaunch.train"  # `python -m <entry>`, the module the launch style starts
    gradient_exchange: str = (
        ""  # for the performance model: ddp-buckets | horovod-fusion | deepspeed-zero ("": not modelled)
    )
    architecture: str = "allreduce"  # allreduce | parameter-server
    synchronous: bool = True  # False: workers update without waiting for each other
    coordinators: int = 0  # task-per-worker: extra tasks (TensorFlow's chief, MXNet's scheduler, torch's server)
    servers_per_node: int = 0  # task-per-worker: parameter-server tasks on every node
    writer: str = "worker"  # task-per-worker: the role whose first task writes the metrics file
    refused: str = ""  # non-empty: the combination cannot run here, and why (one line)


_ROWS = (
    FrameworkInfo(
        "ddp",
        "torch",
        "dlaunch.train.frameworks.ddp:DDP",
        "torchrun-per-node",
        "ddp",
        "torch.distributed",
        "torch with torch.distributed",
        "PyTorch DistributedDataParallel",
        gradient_exchange="ddp-buckets",
    ),
    FrameworkInfo(
        "horovod",
        "torch",
        "dlaunch.train.frameworks.horovod:Horovod",
        "mpi-per-gpu",
        "horovod",
        "horovod.torch",
        "Horovod built with PyTorch (HOROVOD_WITH_PYTORCH=1 pip install horovod)",
        "Horovod (PyTorch), ring all-reduce",
        gradient_exchange="horovod-fusion",
    ),
    FrameworkInfo(
        "deepspeed",
        "torch",
        "dlaunch.train.frameworks.deepspeed:DeepSpeed",
        "torchrun-per-node",
        "deepspeed",
        "deepspeed",
        "DeepSpeed (pip install deepspeed)",
        "DeepSpeed engine, ZeRO stages 0-3",
        gradient_exchange="deepspeed-zero",
    ),
)

_TF_HINT = "the TensorFlow environment: scripts/bootstrap-engines.sh tf"
_MX_HINT = "the MXNet environment: scripts/bootstrap-engines.sh mx"
_PS: Dict[str, Any] = dict(architecture="parameter-server", coordinators=1, servers_per_node=1)
# The task-per-worker engines (dlaunch/train/tf, dlaunch/train/mx, dlaunch/train/frameworks/torch_ps.py).
_TASK_ROWS = (
    FrameworkInfo(
        "tf-allreduce",
        "tensorflow",
        "dlaunch.train.tf.trainer:AllReduceTrainer",
        "task-per-worker",
        "tensorflow",
        "tensorflow",
        _TF_HINT,
        "TensorFlow MultiWorkerMirroredStrategy, synchronous collective all-reduce",
        entry="dlaunch.train.tf",
    ),
    FrameworkInfo(
        "tf-ps-async",
        "tensorflow",
        "dlaunch.train.tf.trainer:ParameterServerTrainer",
        "task-per-worker",
        "tensorflow",
        "tensorflow",
        _TF_HINT,
        "TensorFlow ParameterServerStrategy: chief, one server per node, asynchronous workers",
        entry="dlaunch.train.tf",
        synchronous=False,
        writer="coordinator",
        **_PS,
    ),
    FrameworkInfo(
        "tf-ps-sync",
        "tensorflow",
        "dlaunch.train.tf.trainer:ParameterServerTrainer",
        "task-per-worker",
        "tensorflow",
        "tensorflow",
        _TF_HINT,
        "TensorFlow ParameterServerStrategy, synchronous: the chief averages one gradient per worker "
        "and applies it to the servers' variables (TF2 has no SyncReplicasOptimizer)",
        entry="dlaunch.train.tf",
        writer="coordinator",
        **_PS,
    ),
    FrameworkInfo(
        "mx-ps-sync",
        "mxnet",
        "dlaunch.train.mx.trainer:Worker",
        "task-per-worker",
        "mxnet",
        "mxnet",
        _MX_HINT,
        "MXNet key-value store dist_sync: scheduler, one server per node, synchronous workers",
        entry="dlaunch.train.mx",
        **_PS,
    ),
    FrameworkInfo(
        "mx-ps-async",
        "mxnet",
        "dlaunch.train.mx.trainer:Worker",
        "task-per-worker",
        "mxnet",
        "mxnet",
        _MX_HINT,
        "MXNet key-value store dist_async: scheduler, one server per node, asynchronous workers",
        entry="dlaunch.train.mx",
        synchronous=False,
        **_PS,
    ),
    FrameworkInfo(
        "mx-allreduce",
        "mxnet",
        "dlaunch.train.mx.trainer:Worker",
        "task-per-worker",
        "mxnet",
        "horovod.mxnet",
        _MX_HINT + " with Horovod 0.28.1 built against it",
        "Horovod (MXNet) over gloo, synchronous ring all-reduce; rendezvous at the first worker",
        entry="dlaunch.train.mx",
    ),
    FrameworkInfo(
        "torch-ps-sync",
        "torch",
        "dlaunch.train.frameworks.torch_ps:TorchParameterServer",
        "task-per-worker",
        "ddp",
        "torch.distributed.rpc",
        "torch with torch.distributed.rpc",
        "PyTorch parameter server (torch.distributed.rpc): task 0 the server, synchronous workers",
        entry="dlaunch.train.frameworks.torch_ps",
        architecture="parameter-server",
        coordinators=1,
    ),
    FrameworkInfo(
        "torch-ps-async",
        "torch",
        "dlaunch.train.frameworks.torch_ps:TorchParameterServerAsync",
        "task-per-worker",
        "ddp",
        "torch.distributed.rpc",
        "torch with torch.distributed.rpc",
        "PyTorch parameter server (torch.distributed.rpc): task 0 the server, asynchronous workers",
        entry="dlaunch.train.frameworks.torch_ps",
        architecture="parameter-server",
        coordinators=1,
        synchronous=False,
    ),
)
FRAMEWORKS: Dict[str, FrameworkInfo] = {row.name: row for row in _ROWS + _TASK_ROWS}


def task_per_worker() -> Dict[str, FrameworkInfo]:
    """The rows whose processes start as one scheduler task each (dlaunch/train/engines.py's modes)."""
    return {name: row for name, row in FRAMEWORKS.items() if row.launch == "task-per-worker"}


def image_group(name: str) -> str:
    """The image a framework runs in (its pip group)."""
    return FRAMEWORKS[name].pip_group


def image_groups() -> Tuple[str, ...]:
    """Every stack's possible images (`make image-<group>`), in table order."""
    return tuple(dict.fromkeys(map(image_group, FRAMEWORKS)))


def _group_rows(group: str) -> Tuple[FrameworkInfo, ...]:
    return tuple(row for row in FRAMEWORKS.values() if row.pip_group == group)


def group_engine(group: str) -> str:
    """The engine whose trainer an image group's image runs."""
    return _group_rows(group)[0].engine


def group_entry(group: str) -> str:
    """The module an image's runscript starts (`python -m <entry>`): its first row's."""
    return _group_rows(group)[0].entry


def stack_image_groups(pinned: Iterable[str]) -> Tuple[str, ...]:
    """The images of a stack whose lock has `pip.<group>` tables for `pinned`: every torch group, and
    the other engines' groups it pins."""
    pinned = set(pinned)
    return tuple(g for g in image_groups() if group_engine(g) == EVERY_STACK_ENGINE or g in pinned)


def import_checks(group: str) -> Tuple[str, ...]:
    """What an image's %test imports: every module its frameworks need."""
    return tuple(dict.fromkeys(row.import_check for row in _group_rows(group)))


def trainer_modules(group: str) -> Tuple[str, ...]:
    """The modules of an image's framework seams (`implementation`), which its %test imports."""
    return tuple(dict.fromkeys(row.implementation.split(":")[0] for row in _group_rows(group)))


def gradient_exchanges() -> Dict[str, str]:
    """Framework -> how its gradients travel, for the frameworks the performance model knows."""
    return {name: row.gradient_exchange for name, row in FRAMEWORKS.items() if row.gradient_exchange}
