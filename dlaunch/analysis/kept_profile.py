"""The site profile a run directory kept (`site.toml`, dlaunch/paths.py: the text its job was made from), by which
the run is judged: `dlaunch report` (its reference verdicts, network and straggler threshold) and the results
database (the threshold of the flags a row keeps)."""

from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional

from dlaunch.boundary import MAX_FILE_BYTES, decode, parse_toml, read_bytes, validate
from dlaunch.errors import DlaunchError
from dlaunch.paths import SITE_PROFILE
from dlaunch.thresholds import DEFAULT_THRESHOLD

if TYPE_CHECKING:  # the site models (pydantic) are imported only for a run that kept a profile
    from dlaunch.jobs.sites import Site


def kept_profile(metrics_file: str, validated: Dict[bytes, "Site"]) -> Optional["Site"]:
    """The profile text the directory of `metrics_file` kept (None: it kept none, or a link); `validated` caches
    profiles by text (a sweep's runs keep the same one). DlaunchError naming the file when it is no valid profile."""
    path = Path(metrics_file).parent / SITE_PROFILE
    if path.is_symlink() or not path.is_file():
        return None
    data = read_bytes(path, MAX_FILE_BYTES, follow_links=False)
    if data not in validated:
        from dlaunch.jobs.sites import Site

        shown = str(path)
        validated[data] = validate(Site, parse_toml(decode(data, shown), shown), shown)
    return validated[data]


def kept_threshold(metrics_file: str, validated: Dict[bytes, "Site"]) -> float:
    """The straggler threshold of the profile the run's directory kept; DEFAULT_THRESHOLD when it kept none or
    one that is not valid here."""
    try:
        site = kept_profile(metrics_file, validated)
    except DlaunchError:
        site = None
    return site.straggler_threshold if site is not None else DEFAULT_THRESHOLD
