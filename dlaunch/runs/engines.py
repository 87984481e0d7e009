"""The environment a job needs where it runs without a container: its engine's Python (the profile's `interpreters`,
else `python` on PATH) and the module its framework's trainer imports (the framework table's `import_check`), checked
before the job is submitted (run, sweep, study: dlaunch/runs/service.py's `prepare`) and by `dlaunch doctor`, with the
fix the framework table names (`scripts/bootstrap-engines.sh tf` for TensorFlow's). A containerized job's image
carries its environment (its `%test` imports the module when it is built)."""

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import List, Mapping, Optional

from dlaunch.jobs.sites import Site
from dlaunch.schedulers import scheduler_for
from dlaunch.train.framework_table import FRAMEWORKS

CHECK_TIMEOUT_S = 30


@dataclass(frozen=True)
class Engine:
    """The Python a framework's job runs with and what stops it: `problem` ('' when none was found); `looked`: whether
    the module was looked for in it (only where the job runs on this machine, or for `doctor`)."""

    python: str  # as the script names it (`python`: the first on the job's PATH)
    source: str  # "interpreters.tensorflow" or "python on PATH"
    found: Optional[str]  # the file it is here (None: not here)
    module: str  # the module the trainer imports (its top-level package)
    problem: str = ""
    looked: bool = False


@functools.lru_cache(maxsize=16)
def _has_module(python: str, module: str) -> bool:
    """Whether `python` finds `module` (its top-level package: nothing is imported, so it takes milliseconds)."""
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec(%r) is None)" % module.split(".")[0]
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, timeout=CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def engine(site: Site, framework: str, environ: Mapping[str, str] = os.environ, look: bool = False) -> Engine:
    """The Python `framework`'s job runs with on `site` and what stops it: where the job runs here (or with `look`),
    a missing Python or one without the module the trainer imports; on a cluster, a profile's interpreter that is not
    there (its nodes' `python` on PATH is theirs). A containerized site's image holds it: nothing to check here."""
    info = FRAMEWORKS[framework]
    module = info.import_check.split(".")[0]
    here = scheduler_for(site.scheduler.kind).this_machine
    if site.container.containerized:
        return Engine("python", "the image", None, module)
    named = site.interpreters.get(info.engine)  # type: ignore[call-overload]  # FRAMEWORKS' engine is one of its keys
    if named:
        python, source = named, "interpreters.%s" % info.engine
        found = named if os.access(named, os.X_OK) else None
    elif here or look:
        python, source = "python", "python on PATH"
        found = shutil.which("python", path=environ.get("PATH"))
    else:
        return Engine("python", "python on the nodes' PATH", None, module)
    if found is None:
        missing = "%s = %s is not there" % (source, named) if named else "there is no python on PATH"
        return Engine(
            python, source, None, module, "%s (site %s): it needs %s" % (missing, site.name, info.install_hint)
        )
    if not (here or look):
        return Engine(python, source, found, module)
    if not _has_module(found, module):
        problem = "%s (%s, site %s) has no %s: it needs %s" % (found, source, site.name, module, info.install_hint)
        return Engine(python, source, found, module, problem, True)
    return Engine(python, source, found, module, "", True)


def interpreter_warnings(site: Site) -> List[str]:
    """The profile's interpreters that are not there on this machine (`sites check`: a typo in a path)."""
    return [
        "interpreters.%s = %s is not there on this machine%s"
        % (name, path, "" if scheduler_for(site.scheduler.kind).this_machine else " (the nodes must have it)")
        for name, path in site.interpreters.items()
        if not os.access(path, os.X_OK)
    ]
