"""Where the launcher's own files are: the repository (or installed tree) it runs from."""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED_SITES_DIR = REPO / "sites"
PUBLISHED_DIR = REPO / "data" / "published"
