#!/usr/bin/env bash
# Run the Slurm tests N times in a row (flake hunting); --hog K keeps K busy CPU loops beside them.
#   soak-slurm-tests.sh N [--hog K] [pytest args...]    prints one line per round and "P passed, F failed"
# Each round's output is kept in $SOAK_DIR (default /tmp/dlaunch-soak)/round-<i>.log.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${1:?usage: soak-slurm-tests.sh N [--hog K] [pytest args...]}; shift
HOG=0
if [ "${1:-}" = "--hog" ]; then HOG=${2:?--hog needs a count}; shift 2; fi
DIR=${SOAK_DIR:-/tmp/dlaunch-soak}
mkdir -p "$DIR"
hogs=()
for _ in $(seq 1 "$HOG"); do (while :; do :; done) & hogs+=($!); done
trap '[ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null' EXIT
passed=0 failed=0
for i in $(seq 1 "$N"); do
  start=$SECONDS
  if "$ROOT/.venv/bin/python" -m pytest -m slurm -q -p no:cacheprovider "$@" > "$DIR/round-$i.log" 2>&1; then
    passed=$((passed + 1)) verdict=passed
  else
    failed=$((failed + 1)) verdict="FAILED: $(grep -E '^(FAILED|ERROR) ' "$DIR/round-$i.log" | paste -sd' ' -)"
  fi
  echo "round $i ($((SECONDS - start)) s, $HOG hog(s)): $(tail -n 1 "$DIR/round-$i.log") $verdict"
done
echo "soak: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
