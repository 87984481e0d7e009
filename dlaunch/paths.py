"""Where the launcher's own files are (the repository, or installed tree, it runs from), the names of
the run directory's files that layers other than dlaunch/runs/ read, and how files are found by name."""

from pathlib import Path
from typing import Dict, Sequence

REPO = Path(__file__).resolve().parent.parent
SHIPPED_SITES_DIR = REPO / "sites"
PUBLISHED_DIR = REPO / "data" / "published"
SITE_PROFILE = "site.toml"  # the site profile's text a run directory keeps: what its job was made from
RESULTS_DB_ENV = "DLAUNCH_RESULTS_DB"  # the results database (dlaunch/resultsdb/store.py), and what lies beside it
DEFAULT_RESULTS_DB = Path("runs") / "results.sqlite"
JOB_ID_FILE = "job_id"  # the job's id, written once the scheduler took (or started) the job
STATE_FILE = "state"  # one line: where the run service left the run (a job that runs here: its course)


def toml_files_by_name(folders: Sequence[Path]) -> Dict[str, Path]:
    """Name (a .toml file's stem) -> the file, sorted by name, earlier folders shadowing later ones (site profiles,
    study files)."""
    found: Dict[str, Path] = {}
    for folder in reversed(folders):
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            found[path.stem] = path
    return dict(sorted(found.items()))
