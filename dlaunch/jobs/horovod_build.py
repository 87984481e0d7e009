"""Horovod's build on this machine, from the image lock: `python -m dlaunch.jobs.horovod_build STACK DIR [ENGINE]`.

scripts/bootstrap.sh and scripts/bootstrap-engines.sh build Horovod for the host's environments, which the
`cpu` stack's image then reuses from the wheel cache; its pin and build settings are that stack's in
containers/versions.toml, as the image definitions render them (dlaunch/jobs/images.py). Writes the
stack's CMake C++ standard files into DIR (where it needs one) and prints, for the script to `eval`:
HOROVOD_VERSION, HOROVOD_BUILD_ENV (the build variables of ENGINE, `torch` by default or `mxnet`, as its image
builds it; torch's with CMAKE_TOOLCHAIN_FILE where needed).
"""

import shlex
import sys
from pathlib import Path
from typing import List, Optional

from dlaunch.atomic import write_atomic
from dlaunch.errors import DlaunchError
from dlaunch.jobs.images import cxx_standard_files, horovod_cxx_std, horovod_engine_env, load_lock
from dlaunch.train.framework_table import EVERY_STACK_ENGINE


def settings(stack_name: str, folder: Path, engine: str = EVERY_STACK_ENGINE) -> List[str]:
    """The shell assignments for STACK and `engine`, the CMake files written into `folder`."""
    stack = load_lock().stacks.get(stack_name)
    pins = {pins["horovod"] for pins in stack.pip.values() if "horovod" in pins} if stack else set()
    if stack is None or not pins:
        raise DlaunchError("containers/versions.toml: stack %r pins no horovod" % stack_name)
    try:
        env = horovod_engine_env(engine)
    except KeyError:
        raise DlaunchError("unknown engine %r for Horovod (torch, mxnet)" % engine) from None
    cxx_std = horovod_cxx_std(stack, engine)
    if cxx_std:
        files = cxx_standard_files(cxx_std, str(folder))
        for path, text in files.items():
            write_atomic(Path(path), text)
        env = "CMAKE_TOOLCHAIN_FILE=%s %s" % (list(files)[-1], env)
    return [
        "HOROVOD_VERSION=%s" % shlex.quote(pins.pop()),  # one version per stack (the lock checks it)
        "HOROVOD_BUILD_ENV=%s" % shlex.quote(env),
    ]


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m dlaunch.jobs.horovod_build STACK DIR [ENGINE]", file=sys.stderr)
        return 2
    try:
        print("\n".join(settings(args[0], Path(args[1]), *args[2:])))
    except DlaunchError as e:
        print("horovod_build: error: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
