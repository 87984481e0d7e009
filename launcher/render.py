"""`LaunchPlan` -> batch script text. Every value is quoted here; nothing else writes shell."""
import re
import shlex
from typing import List, Sequence

from launcher.launchers import ShellWord
from launcher.plan import LaunchPlan

_SHELL_WORD = re.compile(r"^[A-Za-z0-9_=:.,/@+$-]*$")


def quote(arg: str) -> str:
    """Single-quote a value; launcher-made ShellWords keep their $VARIABLES inside double quotes."""
    if isinstance(arg, ShellWord):
        if not _SHELL_WORD.match(arg):
            raise ValueError("not a plain shell word: %r" % arg)
        return '"%s"' % arg
    return shlex.quote(arg)


def _command(segments: Sequence[Sequence[str]]) -> str:
    lines = [" ".join(quote(a) for a in seg) for seg in segments if seg]
    return " \\\n  ".join(lines) + "\n"


def _flag_groups(argv: Sequence[str]) -> List[List[str]]:
    """Split argv into one `--flag value...` group per line."""
    groups: List[List[str]] = []
    for arg in argv:
        if arg.startswith("--") or not groups:
            groups.append([])
        groups[-1].append(arg)
    return groups


def render_script(plan: LaunchPlan, header: str) -> str:
    """The job script; `header` is a comment line saying where it came from."""
    out: List[str] = ["#!/bin/bash\n"]
    out += ["#SBATCH %s\n" % directive for directive in plan.sbatch]
    out.append("# %s\n" % header.replace("\n", " "))
    out.append("set -eo pipefail\n\n")
    if plan.modules:
        out.append("module load %s\n" % " ".join(quote(m) for m in plan.modules))
    out += ["export %s=%s\n" % (name, quote(value)) for name, value in plan.env]
    out += ["%s\n" % line for line in plan.prelude]
    out.append("\n")
    trainer = _flag_groups(plan.trainer_argv)
    if plan.scheduler == "slurm":
        segments = [("srun",) + plan.srun_args, plan.container_prefix, plan.launch_prefix] + trainer
        out.append(_command(segments))
    else:
        segments = [("exec",) + plan.container_prefix + plan.launch_prefix] + trainer
        out.append(_command(segments))
    return "".join(out)
