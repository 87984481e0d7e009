"""A backend's row in its registry (schedulers.SCHEDULERS, runtimes.RUNTIMES: a site's `kind` -> the row): where
its class is, imported when a profile names it (a command loads only the backends it uses; a test registers its
own by adding a row). Cf. ReFrame's `register_scheduler` and TorchX's scheduler factories."""

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from dlaunch.errors import DlaunchError


@dataclass(frozen=True)
class Registration:
    target: str  # "module:Class"

    def load(self) -> Any:
        """The backend's class."""
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)


def registered(registry: Mapping[str, Registration], kind: str, what: str) -> Any:
    """The class registered as `kind`; DlaunchError naming `what` it is and the kinds there are."""
    if kind not in registry:
        raise DlaunchError("%s %r is not one of %s" % (what, kind, ", ".join(registry)))
    return registry[kind].load()


def validate_section(registry: Mapping[str, Registration], data: Any, model: Callable[[str], Any]) -> Any:
    """A profile's `[scheduler]` or `[container]` section as its backend's model (`model(kind)`: told apart by
    `kind`, looked up when a profile is read, so that a backend registered later is known too)."""
    if not isinstance(data, dict):
        return data
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in registry:
        raise ValueError("kind: %r is not one of %s" % (kind, ", ".join(registry)))
    return model(kind).model_validate(data)
