"""Where the launcher's own files are (the repository, or installed tree, it runs from), and the names of
the run directory's files that layers other than dlaunch/runs/ read."""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED_SITES_DIR = REPO / "sites"
PUBLISHED_DIR = REPO / "data" / "published"
SITE_PROFILE = "site.toml"  # the site profile's text a run directory keeps: what its job was made from
