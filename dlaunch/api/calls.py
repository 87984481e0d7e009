"""What every API function shares: paths given as str or os.PathLike, errors as the command line prints them."""

import functools
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from dlaunch.boundary import display_path, escape
from dlaunch.errors import DlaunchError


def os_error(e: OSError) -> DlaunchError:
    """An OSError about a path the user gave or one dlaunch writes (a name too long for the file system, no
    permission, a full disk) as the one line naming it (exit code 2)."""
    where = "%s: " % display_path(Path(os.fsdecode(e.filename))) if e.filename is not None else ""
    return DlaunchError("%s%s" % (where, e.strerror or escape(str(e))))


F = TypeVar("F", bound=Callable[..., Any])


def api_function(function: F) -> F:
    """An API function: a path may be given as str or os.PathLike (handed on as str, as the command line has it); its
    DlaunchError's message as the command line prints it (control characters escaped), an OSError as `os_error`."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args = tuple(os.fspath(a) if isinstance(a, os.PathLike) else a for a in args)
        kwargs = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in kwargs.items()}
        try:
            return function(*args, **kwargs)
        except DlaunchError as e:
            e.args = (escape(str(e)),)
            raise
        except OSError as e:
            raise os_error(e) from e

    return wrapper  # type: ignore[return-value]
