"""`--framework NAME` -> a Framework instance, imported only when chosen (rows: dlaunch/train/framework_table.py)."""

import importlib

from dlaunch.train.config import ConfigError
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.train.frameworks.base import Framework


def get_framework(name: str) -> Framework:
    info = FRAMEWORKS.get(name)
    if info is None:
        raise ConfigError("--framework %s: unknown (choose from %s)" % (name, ", ".join(FRAMEWORKS)))
    module_name, class_name = info.implementation.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError("--framework %s needs %s: %s" % (name, info.install_hint, e)) from None
    return getattr(module, class_name)()
