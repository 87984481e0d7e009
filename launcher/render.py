"""`LaunchPlan` -> batch script text. Every value is quoted here; nothing else writes shell."""
import re
import shlex
from typing import List, Sequence

from launcher.launchers import ShellWord
from launcher.plan import SIGNAL_LEAD_S, LaunchPlan

_SHELL_WORD = re.compile(r"^[A-Za-z0-9_=:.,/@+$-]*$")

# The time-limit warning (sbatch --signal=B:USR1) reaches this shell only. torchrun forwards SIGTERM to
# its workers but dies on SIGUSR1 (torch < 2.9 does not handle it), so the shell turns the warning into
# SIGTERM for every step; the trainer checkpoints on SIGTERM and ends with status `interrupted`.
# srun runs in the background because bash runs traps only between foreground commands.
_SLURM_TRAP = """\
trap 'echo "dlaunch: time limit in {lead} s: SIGTERM to the job steps" >&2; scancel --signal=TERM "$SLURM_JOB_ID"' USR1
"""
_SLURM_WAIT = """\
srun_pid=$!
while :; do
  wait "$srun_pid" && status=0 || status=$?
  [ "$status" -gt 128 ] && kill -0 "$srun_pid" 2>/dev/null || break
done
exit "$status"
"""


def quote(arg: str) -> str:
    """Single-quote a value; launcher-made ShellWords keep their $VARIABLES inside double quotes."""
    if isinstance(arg, ShellWord):
        if not _SHELL_WORD.match(arg):
            raise ValueError("not a plain shell word: %r" % arg)
        return '"%s"' % arg
    return shlex.quote(arg)


def _command(segments: Sequence[Sequence[str]], background: bool) -> str:
    lines = [" ".join(quote(a) for a in seg) for seg in segments if seg]
    return " \\\n  ".join(lines) + (" &" if background else "") + "\n"


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
        out.append(_SLURM_TRAP.format(lead=SIGNAL_LEAD_S))
        out.append(_command(segments, background=True))
        out.append(_SLURM_WAIT)
    else:
        segments = [("exec",) + plan.container_prefix + plan.launch_prefix] + trainer
        out.append(_command(segments, background=False))
    return "".join(out)
