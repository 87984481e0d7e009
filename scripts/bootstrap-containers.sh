#!/usr/bin/env bash
# What building and running the cpu image without Apptainer needs, idempotently (root, Debian):
#   mmdebstrap            bootstraps the Debian root file system of `Bootstrap: debootstrap` recipes
#   charliecloud-runtime  ch-run, the container runtime the tests run that root file system with
#   spython               parses the definition files (pinned in pyproject.toml's test extra)
# Called by scripts/bootstrap.sh full. Then: make rootfs-ddp STACK=cpu (scripts/build-rootfs.py).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DLAUNCH_VENV:-$ROOT/.venv}
packages=(mmdebstrap charliecloud-runtime)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then echo "bootstrap-containers.sh: need root to apt-get install ${missing[*]}" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c "import spython" 2>/dev/null; then
  pin=$(grep -o '"spython==[^"]*"' "$ROOT/pyproject.toml" | tr -d '"')
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$pin"
fi
