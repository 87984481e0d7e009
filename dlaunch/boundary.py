"""The boundary: where files, names and counts from users and runs enter dlaunch, and where text
leaves it for a terminal. One place, so that every reader keeps the same promises:

- Files (site profiles, studies, `plan.json`, `state`, `job_id`, manifests, archive members, logs; the
  metrics files through `dlaunch.train.metrics_schema`, whose opener this module shares) are opened without
  blocking and must be regular files within a size limit (a FIFO, a device or a 300 MB "profile" is
  refused before it is read); a run's files are not followed through symbolic links (`follow_links`):
  dlaunch reads a run's files inside its run directory only.
- Text is UTF-8, strictly; JSON and TOML are parsed, then validated with their pydantic model. Every
  failure is a DlaunchError naming the file and the field as the file spells it (exit 2); a listing
  over many runs turns it into a `rejected:` line for that file and reports the rest.
- Names and paths that reach a script match their pattern as whole strings (`whole`: Python's `$`
  also matches before a final newline, so a `re.match` with `...$` lets `name\\n` through) and fit
  the file system's name limit (`fits_file_system`).
- Counts where a typo costs hours (a study's jobs, `--repeat`, processes on this machine) have limits
  (`LIMITS`) that `--allow-large` lifts (`check_limit`).
- Everything printed passes `escape`: control characters (terminal escape sequences, NUL, line
  breaks in names) are shown as `\\x1b`, `\\n`..., never sent to the terminal.
- Logs are read from their end, bounded (`log_tail`), or streamed in chunks (`copy_log`).
- A `state` file's process is alive only if it started before the state was written (`alive_since`):
  a reused process id, or pid 1, is not the run; a process group only while one of its processes that
  started before its record was written runs in the run directory (`group_alive_since`).

Imports nothing heavy: pydantic is imported by the functions that validate.
"""

import codecs
import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar

from dlaunch.errors import DlaunchError
from dlaunch.train.metrics_schema import FileRefused, open_regular

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound="BaseModel")

MAX_FILE_BYTES = 4 * 1024 * 1024  # a profile, study, plan.json, state, job id, manifest: a few KB each
LOG_TAIL_BYTES = 4 * 1024 * 1024  # what `status` and `watch` read of a log, from its end
LOG_CHUNK_BYTES = 1024 * 1024  # `dlaunch logs` copies a log in chunks of this size
NAME = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"  # experiment, run, site, study and matrix names; accounts
JOB_ID = r"[A-Za-z0-9][A-Za-z0-9_.\[\]-]*"  # Slurm `4711`, `4711_3`; PBS `4711.server`; local `local-123`
NODE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}"  # a node's host name, as a scheduler's node list names it (RFC 1123 + _)
ALLOW_LARGE = "--allow-large"
# What a typo can cost: each limit is far above real use, and `--allow-large` lifts it.
LIMITS = {
    "study jobs": 1000,  # the largest shipped study (aach2023) has a few hundred
    "repeats": 100,  # the median's 95% confidence interval needs 6; 100 is plenty
    "local processes": max(64, os.cpu_count() or 1),  # `--site local --gpus N` starts N worker processes here
}
# C0 and C1 controls, DEL, and the Unicode line separators and direction overrides a terminal acts on.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def escape(text: str, keep: str = "") -> str:
    """`text` with every control character (but those in `keep`) written as an escape (`\\x1b`, `\\n`)."""

    def shown(m: "re.Match[str]") -> str:
        c = m.group()
        if c in keep:
            return c
        return _SHORT.get(c) or ("\\x%02x" % ord(c) if ord(c) < 0x100 else "\\u%04x" % ord(c))

    return _CONTROL.sub(shown, text)


_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")  # terminal escape sequences: colours, cursor moves


def printable(text: str) -> str:
    """A line a program printed (a log line), for showing: escape sequences (colours) dropped, other
    control characters escaped."""
    return escape(_SEQUENCE.sub("", text))


def has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def display_path(path: Path) -> str:
    """`path` for people: relative to the working directory when it lies below it, control characters escaped."""
    rel = os.path.relpath(path)
    return escape(Path(path).as_posix() if rel.startswith("..") else rel)


def whole(pattern: str, text: Any) -> bool:
    """`text` is a string that `pattern` matches as a whole (not merely a prefix, nor up to a final newline)."""
    return isinstance(text, str) and re.fullmatch(pattern, text) is not None


# -- reading files -----------------------------------------------------------------------------------


def read_bytes(path: Path, limit: int = MAX_FILE_BYTES, follow_links: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see `open_regular`); DlaunchError naming it otherwise."""
    try:
        with open_regular(str(path), limit, follow_links) as f:
            return f.read(limit + 1)
    except FileRefused as e:
        raise DlaunchError("%s: %s" % (display_path(path), e)) from None
    except OSError as e:
        raise DlaunchError("%s: %s" % (display_path(path), e.strerror or e)) from None


def decode(data: bytes, shown: str) -> str:
    """`data` as UTF-8 text; DlaunchError naming `shown` and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DlaunchError("%s: not UTF-8 text (byte 0x%02x on line %d)" % (shown, data[e.start], line)) from None


def read_text(path: Path, limit: int = MAX_FILE_BYTES, follow_links: bool = True) -> str:
    return decode(read_bytes(path, limit, follow_links), display_path(path))


def _no_constant(name: str) -> None:
    raise ValueError("%s is not a JSON number" % name)


def parse_json(text: str, shown: str) -> Any:
    """JSON text (no NaN or Infinity) or a DlaunchError naming `shown`."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise DlaunchError("%s: invalid JSON: nested too deeply" % shown) from None
    except ValueError as e:
        raise DlaunchError("%s: invalid JSON: %s" % (shown, e)) from None


def parse_toml(text: str, shown: str) -> Any:
    import tomllib

    try:
        return tomllib.loads(text)
    except RecursionError:
        raise DlaunchError("%s: invalid TOML: nested too deeply" % shown) from None
    except tomllib.TOMLDecodeError as e:
        raise DlaunchError("%s: invalid TOML: %s" % (shown, e)) from None


def validate(model: "Type[ModelT]", data: Any, shown: str) -> "ModelT":
    """`data` as `model`, or a DlaunchError naming `shown` and the field (as the file spells it)."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise DlaunchError(field_error(shown, data, e)) from None
    except RecursionError:
        raise DlaunchError("%s: nested too deeply" % shown) from None


def field_error(shown: str, data: Any, error: "ValidationError") -> str:
    """`FILE: field.path: what is wrong` for the first error of a validation."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in _in_file(data, first["loc"]))
    message = first["msg"].replace("Value error, ", "")
    return "%s: %s%s" % (shown, where + ": " if where else "", message)


def _in_file(data: Any, loc: Tuple[Any, ...]) -> List[Any]:
    """An error location as the file spells it: without the tags pydantic adds for a union's member
    (`scheduler.slurm.partitions.0` is `scheduler.partitions.0` in the file)."""
    shown = []
    for part in loc:
        if (isinstance(data, dict) and data.get("kind") == part) or (
            isinstance(part, str) and data == part
        ):  # the member's tag
            continue
        shown.append(part)
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            data = None
    return shown


def read_json(
    path: Path, model: "Optional[Type[ModelT]]" = None, limit: int = MAX_FILE_BYTES, follow_links: bool = True
) -> Any:
    """A JSON file, validated with `model` when given (the model, else the parsed data)."""
    shown = display_path(path)
    data = parse_json(decode(read_bytes(path, limit, follow_links), shown), shown)
    return validate(model, data, shown) if model is not None else data


def read_toml(path: Path, model: "Type[ModelT]", limit: int = MAX_FILE_BYTES, follow_links: bool = True) -> "ModelT":
    """A TOML file validated with `model`; errors name the file and the field."""
    return read_toml_text(path, model, limit, follow_links)[0]


def read_toml_text(
    path: Path, model: "Type[ModelT]", limit: int = MAX_FILE_BYTES, follow_links: bool = True
) -> "Tuple[ModelT, str]":
    """`read_toml` and the text it validated (for a copy of exactly what was read)."""
    shown = display_path(path)
    text = decode(read_bytes(path, limit, follow_links), shown)
    return validate(model, parse_toml(text, shown), shown), text


# -- logs --------------------------------------------------------------------------------------------


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> Tuple[str, bool]:
    """(text, whether it is the whole log) of a log's last `limit` bytes, starting at a whole line;
    bytes that are not UTF-8 become U+FFFD (a log is what programs printed, not a file to refuse). A
    log that is missing, a link or no regular file (a FIFO) reads as empty."""
    try:
        with open_regular(str(path), limit=2**62, follow_links=False) as f:
            size = os.fstat(f.fileno()).st_size
            if size <= limit:
                return f.read(limit).decode("utf-8", errors="replace"), True
            f.seek(size - limit - 1)
            data = f.read(limit + 1)
    except (OSError, FileRefused):
        return "", True
    start = data.find(b"\n") + 1  # the byte before the tail tells whether it starts a line
    return data[start:].decode("utf-8", errors="replace"), False


def check_regular(path: Path) -> Path:
    """`path` is a regular file, not a link, FIFO or device (checked before anything about it is printed)."""
    try:
        info = os.lstat(path)
    except OSError as e:
        raise DlaunchError("%s: %s" % (display_path(path), e.strerror or e)) from None
    if not stat.S_ISREG(info.st_mode):
        raise DlaunchError(
            "%s: %s" % (display_path(path), "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file")
        )
    return path


def copy_log(path: Path, write: Callable[[str], None]) -> None:
    """Copy a log through `write` in chunks (bounded memory for any size), control characters but
    line breaks and tabs escaped; DlaunchError for a log that is no regular file."""
    try:
        with open_regular(str(path), limit=2**62, follow_links=False) as f:
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            while True:
                chunk = f.read(LOG_CHUNK_BYTES)
                write(escape(decoder.decode(chunk, final=not chunk), keep="\n\t"))
                if not chunk:
                    return
    except FileRefused as e:
        raise DlaunchError("%s: %s" % (display_path(path), e)) from None
    except OSError as e:
        raise DlaunchError("%s: %s" % (display_path(path), e.strerror or e)) from None


# -- names, values, counts, outputs ------------------------------------------------------------------


def check_name(flag: str, value: str) -> str:
    """A name (`NAME`) matched whole, or a DlaunchError naming `flag`."""
    if not whole(NAME, value):
        raise DlaunchError("%s: %s may only contain letters, digits and _.+- (not first)" % (flag, quoted(value)))
    return value


def check_node_name(where: str, value: str) -> str:
    """A node's name (`NODE`: a host name, no list or range) matched whole, or a DlaunchError naming `where`."""
    if not whole(NODE, value):
        raise DlaunchError("%s: %s is not a node name (letters, digits and _.- , not first)" % (where, quoted(value)))
    return value


def quoted(value: Any) -> str:
    """`value` as Python writes it (quotes, escapes), for messages."""
    return escape(repr(value))


def existing_folder(path: Path) -> Path:
    """`path`, or its nearest parent that is an existing folder."""
    folder = Path(os.path.abspath(path))
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def name_limit(folder: Path) -> int:
    """The longest file name (bytes) the file system at `folder` (or its nearest existing parent) takes."""
    try:
        return int(os.pathconf(existing_folder(folder), "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


PATH_LIMIT = 4096  # Linux's PATH_MAX; the trainer's checkpoint files go one level below the run directory


def fits_file_system(run_dir: Path, names: Dict[str, str]) -> None:
    """Refuse a run directory whose `names` (flag -> the name it gave) exceed the file system's name
    limit, or whose path exceeds PATH_LIMIT: the dry run would pass and the submission fail."""
    limit = name_limit(run_dir)
    for flag, name in names.items():
        if len(name.encode("utf-8", "surrogateescape")) > limit:
            raise DlaunchError(
                "%s: %d characters, more than the %d the file system at %s takes in a name"
                % (flag, len(name), limit, display_path(existing_folder(run_dir)))
            )
    if len(os.fsencode(str(run_dir))) + len("/checkpoints/last.pt.tmp") > PATH_LIMIT:
        raise DlaunchError(
            "--output: the run directory %s is longer than the %d bytes a path may have"
            % (escape(str(run_dir))[:80] + "...", PATH_LIMIT)
        )


def check_value(where: str, value: str) -> str:
    """A value that goes into a script or a file as text (an environment value, an account): no NUL
    or other control characters (a NUL ends a C string; a line break splits a directive)."""
    if has_control(value):
        raise DlaunchError("%s: %s holds a control character" % (where, quoted(value)))
    return value


def check_limit(flag: str, count: int, what: str, allow_large: bool) -> None:
    """Refuse `count` above `LIMITS[what]` unless `--allow-large` was given."""
    limit = LIMITS[what]
    if count > limit and not allow_large:
        raise DlaunchError(
            "%s: %d %s is more than the %d that dlaunch takes without %s (a typo?); "
            "pass %s if you mean it" % (flag, count, what, limit, ALLOW_LARGE, ALLOW_LARGE)
        )


def output_folder(flag: str, path: Path) -> Path:
    """A folder to write into: refuse one that exists as a file (or whose parent is a file)."""
    for folder in [path, *path.parents]:
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                raise DlaunchError("%s: %s is a file, not a folder" % (flag, display_path(folder)))
            break
    return path


def output_file(flag: str, path: Path) -> Path:
    """A file to write (atomically): refuse a folder, or a parent that is a file."""
    if path.is_dir():
        raise DlaunchError("%s: %s is a folder; give the file to write" % (flag, display_path(path)))
    output_folder(flag, path.parent)
    return path


# -- processes ---------------------------------------------------------------------------------------


def process_start(pid: int) -> Optional[float]:
    """When process `pid` started (Unix seconds, to the clock tick and the boot time's second), from
    /proc; None when that cannot be told (no /proc, or no such process)."""
    try:
        stat = Path("/proc/%d/stat" % pid).read_text(encoding="utf-8", errors="replace")
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime, counted after `(comm)`
        return int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def alive_since(pid: int, written: float) -> bool:
    """Process `pid` is one of ours and started before `written` (when the state naming it was
    written, with a second's slack for /proc's boot time): a reused process id, a process of another
    user, pid 0 or 1 are not the run."""
    if pid <= 1:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OverflowError):
        return False
    started = process_start(pid)
    return started is None or started <= written + 1.0


def group_alive_since(group: int, written: float, folder: Path) -> bool:
    """A process of process group `group` runs in `folder` and started before `written` (when the record naming
    the group was written, with alive_since's slack): a group whose id was reused, pid 0 or 1 are not the run's.
    Where /proc cannot tell, a group that may be signalled counts."""
    if group <= 1:
        return False
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError, OverflowError):
        return False
    try:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return True
    here = os.path.realpath(folder)
    for pid in pids:
        try:
            if os.getpgid(pid) != group or os.readlink("/proc/%d/cwd" % pid) != here:
                continue
        except OSError:
            continue
        started = process_start(pid)
        if started is not None and started <= written + 1.0:
            return True
    return False
