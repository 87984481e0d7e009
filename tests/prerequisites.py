"""What a test needs from this machine: skip when it is missing, but fail in CI (CI=true or
DLAUNCH_REQUIRE_ALL=1), where everything is installed and a skip would hide a broken install."""
import importlib.util
import os

import pytest


def require(available: bool, reason: str) -> None:
    """Skip with `reason` when not `available`; fail instead in CI."""
    if available:
        return
    if os.environ.get("DLAUNCH_REQUIRE_ALL") == "1" or os.environ.get("CI") == "true":
        pytest.fail("%s, and CI/DLAUNCH_REQUIRE_ALL=1 requires it" % reason)
    pytest.skip(reason)


def require_library(module: str) -> None:
    """`require` an importable module (e.g. `horovod.torch`, `nvidia.dali`)."""
    try:
        available = importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package is missing
        available = False
    require(available, "%s is not installed" % module)
