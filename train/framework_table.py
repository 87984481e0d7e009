"""The frameworks dlaunch can launch, one row each (torch-free, standard library only, Python 3.9).

Read by the trainer (`train/frameworks/__init__.py`: which class), its flags (`train/config.py`:
`--framework` choices), the launcher (`launcher/launchers.py`: how processes start; `request.py`),
the image renderer (`launcher/images.py`: pip group, import check) and `containers/images.mk`
(`python3 -c 'import train.framework_table as t; print(*t.image_frameworks())'`).
Adding a framework: its implementation file plus one row here.
"""
from dataclasses import dataclass
from typing import Dict, Tuple

# How processes start (launcher/launchers.py has one class per style):
#   torchrun-per-node  one torchrun per node, c10d rendezvous at the first host (DDP, DeepSpeed)
#   mpi-per-gpu        one MPI rank per GPU through the scheduler's MPI wiring (Horovod)
LAUNCH_STYLES = ("torchrun-per-node", "mpi-per-gpu")


@dataclass(frozen=True)
class FrameworkInfo:
    name: str
    engine: str  # torch | tensorflow | mxnet: which trainer and image stack
    implementation: str  # "module:Class" of the trainer's framework seam
    launch: str  # one of LAUNCH_STYLES
    pip_group: str  # containers/versions.toml `pip.<group>` installed into this framework's image
    import_check: str  # module the image's %test imports
    install_hint: str  # what to install when the import fails
    description: str
    entry: str = "train"  # `python -m <entry>`


_ROWS = (
    FrameworkInfo("ddp", "torch", "train.frameworks.ddp:DDP", "torchrun-per-node", "ddp", "torch.distributed",
                  "torch with torch.distributed", "PyTorch DistributedDataParallel"),
    FrameworkInfo("horovod", "torch", "train.frameworks.horovod:Horovod", "mpi-per-gpu", "horovod", "horovod.torch",
                  "Horovod built with PyTorch (HOROVOD_WITH_PYTORCH=1 pip install horovod)", "Horovod (PyTorch), ring all-reduce"),
    FrameworkInfo("deepspeed", "torch", "train.frameworks.deepspeed:DeepSpeed", "torchrun-per-node", "deepspeed", "deepspeed",
                  "DeepSpeed (pip install deepspeed)", "DeepSpeed engine, ZeRO stages 0-3"),
)
FRAMEWORKS: Dict[str, FrameworkInfo] = {row.name: row for row in _ROWS}
NAMES: Tuple[str, ...] = tuple(FRAMEWORKS)


def image_frameworks(engine: str = "torch") -> Tuple[str, ...]:
    """Frameworks that get an image of their own (`make image-<name>`)."""
    return tuple(row.name for row in _ROWS if row.engine == engine)
