"""What `dlaunch sites check/show/migrate` say about a profile beyond its validity: how old its sources
are, what contradicts itself or another profile, and the first schema rewritten in the current one.

Profiles state facts about machines others run, and the facts change: each source in `based_on` says
when it was read (`read YYYY-MM-DD`), and a profile whose newest source is older than six months is
flagged. `migrate` rewrites a first-schema file with tomlkit (the library that keeps a TOML file's
comments and order: a profile's comments are its citations) and proves the result means the same.
"""

import datetime
import re
import tomllib
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from dlaunch.boundary import display_path
from dlaunch.errors import DlaunchError
from dlaunch.jobs.sites import Site, available_sites, load_profile, load_site

READ_DATE = re.compile(r"\bread (\d{4}-\d{2}-\d{2})\b")
STALE_AFTER_DAYS = 183  # six months
# GPU models that exist on one CPU architecture only (Grace superchips are Arm; MI300A is an x86 APU).
ARCH_OF_GPU = (("GH200", "aarch64"), ("GB200", "aarch64"), ("GB300", "aarch64"), ("MI300A", "x86_64"))
# First-schema keys and where the current schema keeps them (besides `[[partitions]]` and `runtime`).
V1_SCHEDULER_KEYS = {
    "mpi_plugin": "mpi_plugin",
    "gres": "gres",
    "srun_args": "step_options",
    "sbatch_directives": "directives",
}


def source_dates(site: Site) -> List[Optional[datetime.date]]:
    """The date each source of `based_on` was read (None where it does not say)."""
    dates = []
    for source in site.based_on:
        m = READ_DATE.search(source)
        try:
            dates.append(datetime.date.fromisoformat(m.group(1)) if m else None)
        except ValueError:
            dates.append(None)
    return dates


def age_warnings(site: Site, today: datetime.date) -> List[str]:
    """Sources without a date, and a newest source older than six months."""
    dates = source_dates(site)
    undated = [source.split()[0] for source, date in zip(site.based_on, dates) if date is None]
    warnings = []
    if undated:
        warnings.append(
            "%d of %d sources do not say when they were read (`read YYYY-MM-DD`): %s"
            % (len(undated), len(dates), ", ".join(undated))
        )
    known = [d for d in dates if d is not None]
    if known and (today - max(known)).days > STALE_AFTER_DAYS:
        warnings.append(
            "the newest source was read %s, more than six months ago: check the profile against the "
            "operator's pages before a benchmark campaign" % max(known).isoformat()
        )
    return warnings


def is_first_schema(data: Dict[str, Any]) -> bool:
    return isinstance(data.get("scheduler"), str)


def check_warnings(path: Path, today: datetime.date) -> List[str]:
    """Everything `sites check` warns about in a valid profile (load_site has refused invalid ones)."""
    site, text = load_profile(path)
    data = tomllib.loads(text)  # valid UTF-8 and TOML: load_profile read it
    warnings = []
    if is_first_schema(data):
        warnings.append(
            "written in the first schema (scheduler = %r at the top): `dlaunch sites migrate %s` "
            "writes the current one" % (data["scheduler"], display_path(path))
        )
    model = (site.gpu_model or "").upper()
    for prefix, arch in ARCH_OF_GPU:
        if model.startswith(prefix) and site.arch != arch:
            warnings.append(
                "arch = %r contradicts gpu_model = %r (%s nodes are %s): the default image would be "
                "built for the wrong CPU" % (site.arch, site.gpu_model, prefix, arch)
            )
    warnings += shadow_warnings(site, path)
    warnings += age_warnings(site, today)
    return warnings


def shadow_warnings(site: Site, path: Path) -> List[str]:
    """Names and aliases that another profile also answers to (`--site` refuses them, naming both files)."""
    mine = [site.name, *site.aliases]
    warnings = []
    for stem, other_path in available_sites().items():
        if other_path.resolve() == path.resolve():
            continue
        try:
            other = load_site(other_path)
        except DlaunchError:
            continue
        shared = [word for word in mine if word in {stem, other.name, *other.aliases}]
        if shared:
            warnings.append(
                "%s also name%s profile %s (%s): --site refuses a name two profiles answer to"
                % (
                    ", ".join(repr(w) for w in shared),
                    "s" if len(shared) == 1 else "",
                    other.name,
                    display_path(other_path),
                )
            )
    return warnings


def migrate(path: Path) -> Tuple[str, bool]:
    """The profile's text in the current schema, and whether it changed; comments and order are kept.
    The result is read back and must give the same Site as the original."""
    import tomlkit

    original, text = load_profile(path)  # the boundary's checks first (UTF-8, size, schema)
    doc = tomlkit.parse(text)
    if not is_first_schema(doc.unwrap()):
        return text, False
    scheduler = tomlkit.table()
    scheduler.add("kind", doc["scheduler"])
    by_qos = str(doc.get("partition_directive", "partition")) == "qos"
    for old, new in V1_SCHEDULER_KEYS.items():
        if old in doc:
            scheduler.add(new, doc.item(old))
    if "partitions" in doc:
        rows = tomlkit.aot()
        old_rows = list(doc["partitions"])
        for row in old_rows:
            while (
                row is not old_rows[-1]
                and row.value.body
                and isinstance(row.value.body[-1][1], tomlkit.items.Whitespace)
            ):
                row.value.body.pop()  # the new array of tables puts its own blank line between rows
            if by_qos:
                row.add("partition", "")
                row.add("qos", str(row["name"]))
            rows.append(row)
        scheduler.add("partitions", rows)
    dropped = {"scheduler", "partition_directive", "partitions", *V1_SCHEDULER_KEYS}
    out = tomlkit.document()
    placed = False
    for key, item in doc.body:
        name = key.key if key is not None else None
        if name in dropped:
            continue
        if not placed and isinstance(item, (tomlkit.items.Table, tomlkit.items.AoT)):
            out.add("scheduler", scheduler)
            placed = True
        if name == "container" and "runtime" in item:  # type: ignore[operator]  # the [container] item is a table
            item = _renamed(item, "runtime", "kind")
        if key is None:
            out.body.append((None, item))
        else:
            out.add(key, item)
    if not placed:
        out.add("scheduler", scheduler)
    migrated = tomlkit.dumps(out)
    again = Site.model_validate(tomllib.loads(migrated))
    if again != original:
        raise DlaunchError(
            "%s: the migrated profile does not mean the same as the original (please report)" % display_path(path)
        )
    return migrated, True


def _renamed(table: Any, old: str, new: str) -> Any:
    """A copy of a tomlkit table with key `old` called `new`, first (a runtime's `kind` leads its section)."""
    import tomlkit

    renamed = tomlkit.table()
    renamed.add(new, table.item(old))
    for key, item in table.value.body:
        if key is None:
            renamed.value.body.append((None, item))
        elif key.key != old:
            renamed.add(key, item)
    return renamed
