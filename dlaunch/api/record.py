"""What every API object is: a frozen dataclass with `to_dict()` (plain JSON values) and `from_dict()`."""

import dataclasses
import functools
import typing
from typing import Any, Dict, List, Mapping, Type, TypeVar

from dlaunch.errors import DlaunchError

R = TypeVar("R", bound="Record")


# -- the objects ----------------------------------------------------------------------------------------


class Record:
    """What every API object has: `to_dict()` (plain JSON values) and `from_dict()` (the object again:
    `T.from_dict(json.loads(json.dumps(x.to_dict()))) == x`), read from the dataclass's field types."""

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: Type[R], data: Mapping[str, Any]) -> R:
        hints = field_types(cls)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise DlaunchError("%s: unknown field %s" % (cls.__name__, unknown[0]))
        return cls(**{name: _typed(hints[name], value, "%s.%s" % (cls.__name__, name)) for name, value in data.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


@functools.cache
def field_types(cls: type) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _typed(hint: Any, value: Any, where: str) -> Any:
    """`value` (parsed JSON) as the field type `hint` says: nested records made, lists and dicts followed."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        return _typed(next(a for a in args if a is not type(None)), value, where)
    if origin in (list, List):
        if not isinstance(value, list):
            raise DlaunchError("%s: expected a list, got %r" % (where, value))
        return [_typed(args[0], v, where) for v in value]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise DlaunchError("%s: expected an object, got %r" % (where, value))
        return {k: _typed(args[1], v, where) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, Record):
        if not isinstance(value, dict):
            raise DlaunchError("%s: expected an object, got %r" % (where, value))
        return hint.from_dict(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise DlaunchError("%s: expected %s, got %r" % (where, hint.__name__, value))
    return value
