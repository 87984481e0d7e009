"""`LaunchPlan` -> batch script text. Every value is quoted here; nothing else writes shell."""

import re
import shlex
from functools import singledispatch
from typing import List, Sequence, Union

from dlaunch.jobs.plan import LaunchPlan
from dlaunch.schedulers import scheduler_for
from dlaunch.specs.job import (
    AttemptCount,
    Banner,
    CommandOutput,
    EndTime,
    Export,
    FirstHost,
    HangRetry,
    HostList,
    NodeCheck,
    Prepend,
    RequireVariable,
    ShellWord,
    TaskEnv,
    WorkDir,
)
from dlaunch.specs.schema import ENV_NAME, HOST_SUFFIX

_SHELL_WORD = re.compile(r"^[A-Za-z0-9_=:.,/@+$-]*$")
_NAME = re.compile(ENV_NAME)
_SUFFIX = re.compile(HOST_SUFFIX)


def quote(arg: str) -> str:
    """Single-quote a value; launcher-made ShellWords keep their $VARIABLES inside double quotes."""
    if isinstance(arg, ShellWord):
        if not _SHELL_WORD.fullmatch(arg):
            raise ValueError("not a plain shell word: %r" % arg)
        return '"%s"' % arg
    return shlex.quote(arg)


def _name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError("not a variable name: %r" % name)
    return name


@singledispatch
def render_item(item: object) -> str:
    """One typed prelude item as shell lines."""
    raise TypeError("no shell for %r" % (item,))


@render_item.register
def _(item: WorkDir) -> str:
    return "cd -- %s\n" % quote(item.path)


@render_item.register
def _(item: Export) -> str:
    return "export %s=%s\n" % (_name(item.name), quote(item.value))


@render_item.register
def _(item: RequireVariable) -> str:
    if not re.fullmatch(r"[a-z_.]+", item.needed_by):
        raise ValueError("not a profile field: %r" % item.needed_by)
    return ': "${%s:?is not set: %s needs it (load the module that sets it)}"\n' % (_name(item.name), item.needed_by)


@render_item.register
def _(item: Prepend) -> str:
    name = _name(item.name)
    return 'export %s=%s"${%s:+:$%s}"\n' % (name, quote(item.value), name, name)


@render_item.register
def _(item: FirstHost) -> str:
    if not _SUFFIX.fullmatch(item.suffix):
        raise ValueError("not a host-name suffix: %r" % item.suffix)
    command = " ".join(quote(a) for a in item.hosts_command)
    return '%s="$(%s | sed -n 1p)%s"\nexport %s\n' % (_name(item.name), command, item.suffix, item.name)


@render_item.register
def _(item: CommandOutput) -> str:
    name, command = _name(item.name), " ".join(quote(a) for a in item.command)
    return '%s="$(%s)"\n%s="${%s%%%% *}"\nexport %s\n' % (name, command, name, name, name)


@render_item.register
def _(item: HostList) -> str:
    command = " ".join(quote(a) for a in item.hosts_command)
    return '%s="$(%s | paste -sd, -)"\nexport %s\n' % (_name(item.name), command, item.name)


@render_item.register
def _(item: Banner) -> str:
    job, count, hosts = _name(item.job_id), _name(item.restart_count), _name(item.hosts)
    return 'echo "dlaunch: job $%s attempt $(( ${%s:-0} + 1 )) on $%s at $(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ)"\n' % (
        job,
        count,
        hosts,
    )


@render_item.register
def _(item: EndTime) -> str:
    return "export %s=$(( $(date +%%s) + %d ))\n" % (_name(item.name), int(item.seconds))


@render_item.register
def _(item: AttemptCount) -> str:
    name, job, file = _name(item.name), _name(item.job_id), quote(item.file)
    return '%s="$(grep -cxF "$%s" %s 2>/dev/null || true)"\necho "$%s" >> %s\nexport %s\n' % (
        name,
        job,
        file,
        job,
        file,
        name,
    )


@render_item.register
def _(item: NodeCheck) -> str:
    command = " ".join(_word(a) for a in item.command)
    return '%s || echo "dlaunch: pre-flight check step ended with exit $?" >&2\n' % command


def task_env_words(item: TaskEnv) -> str:
    """The words that set the neutral task variables inside each task, then run the rest of the line."""
    exports = " ".join('%s="$%s"' % (_name(name), _name(variable)) for name, variable in item.variables)
    return "bash -c %s dlaunch-task" % shlex.quote('export %s; exec "$@"' % exports)


def _word(arg: Union[str, TaskEnv]) -> str:
    return task_env_words(arg) if isinstance(arg, TaskEnv) else quote(arg)


def _command(segments: Sequence[Sequence[Union[str, TaskEnv]]]) -> str:
    lines = [" ".join(_word(a) for a in seg) for seg in segments if seg]
    return " \\\n  ".join(lines) + "\n"


def _flag_groups(argv: Sequence[str]) -> List[List[str]]:
    """Split argv into one `--flag value...` group per line."""
    groups: List[List[str]] = []
    for arg in argv:
        if arg.startswith("--") or not groups:
            groups.append([])
        groups[-1].append(arg)
    return groups


def _modules_and_env(plan: LaunchPlan) -> List[str]:
    """The job's modules and the site's and provenance variables."""
    out: List[str] = []
    if plan.module_purge:
        out.append("module purge\n")
    if plan.module_use:
        out.append("module use %s\n" % " ".join(quote(m) for m in plan.module_use))
    if plan.modules:
        out.append("module load %s\n" % " ".join(quote(m) for m in plan.modules))
    return out + [render_item(Export(name, value)) for name, value in plan.env]


def render_script(plan: LaunchPlan, header: str) -> str:
    """The job script; `header` is a comment line saying where it came from."""
    prefix = scheduler_for(plan.scheduler).directive_prefix
    out: List[str] = ["#!/bin/bash\n"]
    out += ["%s %s\n" % (prefix, directive) for directive in plan.directives]
    out.append("# %s\n" % header.replace("\n", " "))
    out.append("set -eo pipefail\n\n")
    out += _modules_and_env(plan)
    out += [render_item(item) for item in plan.prelude]
    out.append("\n")
    command = _command([*plan.command, *_flag_groups(plan.trainer_argv)])
    out.append(_retried(plan.retry, command) if plan.retry else command)
    return "".join(out)


def _retried(retry: HangRetry, command: str) -> str:
    """`command` in HangRetry's loop: again after a hang, at most `retry.times` times, saying why."""
    n, started, hang = _name(retry.counter), _name(retry.started), quote(retry.hang_file)
    name, select = _name(retry.select.name), " ".join(quote(a) for a in retry.select.command)
    return "".join(
        [
            "%s=0\nwhile :; do\nexport %s\n" % (n, n),
            "%s=$(date +%%s)\nexport %s\nDLAUNCH_EXIT=0\n" % (started, started),
            command[:-1] + " || DLAUNCH_EXIT=$?\n",
            'if [ "$DLAUNCH_EXIT" = 0 ] || [ "$%s" -ge %d ] || [ ! -e %s ]; then exit "$DLAUNCH_EXIT"; fi\n'
            % (n, retry.times, hang),
            "%s=$(( %s + 1 ))\n" % (n, n),
            'if ! %s="$(%s)"; then exit "$DLAUNCH_EXIT"; fi\n%s="${%s%%%% *}"\nexport %s\n'
            % (name, select, name, name, name),
            'echo "dlaunch: training hung (%s); retry $%s of %d from the checkpoint on $%s" >&2\n'
            % (retry.hang_file, n, retry.times, name),
        ]
        + [render_item(item) for item in retry.reselect]
        + ["done\n"]
    )


def render_in_job_environment(plan: LaunchPlan, command: Sequence[str]) -> str:
    """A script that runs `command` with the job's modules, variables and path prepends, without the
    job's step or rendezvous (the caller sets MASTER_ADDR): `dlaunch doctor`'s all-reduce on each node."""
    out = ["set -eo pipefail\n"] + _modules_and_env(plan)
    out += [render_item(item) for item in plan.prelude if isinstance(item, (Export, Prepend))]
    out.append(_command([command]))
    return "".join(out)
