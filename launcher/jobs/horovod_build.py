"""Horovod's build on this machine, from the image lock: `python -m launcher.jobs.horovod_build STACK DIR`.

scripts/bootstrap.sh and scripts/bootstrap-engines.sh build Horovod for the host's environments, which the
`cpu` stack's image then reuses from the wheel cache; its pin and build settings are that stack's in
containers/versions.toml, as the image definitions render them (launcher/jobs/images.py). Writes the
stack's CMake C++ standard files into DIR (where it needs one) and prints, for the script to `eval`:
HOROVOD_VERSION, HOROVOD_BUILD_ENV (the torch build's variables; with CMAKE_TOOLCHAIN_FILE where needed).
"""
import shlex
import sys
from pathlib import Path
from typing import List, Optional

from launcher.atomic import write_atomic
from launcher.errors import DlaunchError
from launcher.jobs.images import HOROVOD_BUILD_ENV, cxx_standard_files, load_lock


def settings(stack_name: str, folder: Path) -> List[str]:
    """The shell assignments for STACK, the CMake files written into `folder`."""
    stack = load_lock().stacks.get(stack_name)
    pins = {pins["horovod"] for pins in stack.pip.values() if "horovod" in pins} if stack else set()
    if not pins:
        raise DlaunchError("containers/versions.toml: stack %r pins no horovod" % stack_name)
    env = HOROVOD_BUILD_ENV
    if stack.horovod_cxx_std:
        files = cxx_standard_files(stack.horovod_cxx_std, str(folder))
        for path, text in files.items():
            write_atomic(Path(path), text)
        env = "CMAKE_TOOLCHAIN_FILE=%s %s" % (list(files)[-1], env)
    return ["HOROVOD_VERSION=%s" % shlex.quote(pins.pop()),  # one version per stack (the lock checks it)
            "HOROVOD_BUILD_ENV=%s" % shlex.quote(env)]


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m launcher.jobs.horovod_build STACK DIR", file=sys.stderr)
        return 2
    try:
        print("\n".join(settings(args[0], Path(args[1]))))
    except DlaunchError as e:
        print("horovod_build: error: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
