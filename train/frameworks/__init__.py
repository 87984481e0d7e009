"""Framework registry: `--framework NAME` -> a Framework instance, imported only when chosen."""
import importlib

from train.config import ConfigError
from train.frameworks.base import Framework

# name -> (module, class, what to install when the import fails)
_REGISTRY = {
    "ddp": ("train.frameworks.ddp", "DDP", "torch with torch.distributed"),
    "horovod": ("train.frameworks.horovod", "Horovod", "Horovod built with PyTorch (HOROVOD_WITH_PYTORCH=1 pip install horovod)"),
    "deepspeed": ("train.frameworks.deepspeed", "DeepSpeed", "DeepSpeed (pip install deepspeed)"),
}


def get_framework(name: str) -> Framework:
    if name not in _REGISTRY:
        raise ConfigError("--framework %s: unknown (choose from %s)" % (name, ", ".join(_REGISTRY)))
    module_name, class_name, install = _REGISTRY[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError("--framework %s needs %s: %s" % (name, install, e)) from None
    return getattr(module, class_name)()
