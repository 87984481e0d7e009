#!/usr/bin/env bash
# What building and running the cpu image without Apptainer needs, idempotently (root, Debian):
#   mmdebstrap            bootstraps the Debian root file system of `Bootstrap: debootstrap` recipes
#   charliecloud-runtime  ch-run, the container runtime the tests run that root file system with
#   spython               parses the definition files (pinned in pyproject.toml's test extra)
# Called by scripts/bootstrap.sh full. Then: make rootfs-ddp STACK=cpu (scripts/build-rootfs.py).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DLAUNCH_VENV:-$ROOT/.venv}
source "$ROOT/scripts/apt-install.sh"
apt_install bootstrap-containers.sh mmdebstrap charliecloud-runtime
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c "import spython" 2>/dev/null; then
  pin=$(grep -o '"spython==[^"]*"' "$ROOT/pyproject.toml" | tr -d '"')
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$pin"
fi
