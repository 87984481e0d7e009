#!/usr/bin/env bash
# Install what dlaunch needs on a fresh Debian machine, idempotently.
#   bootstrap.sh run   the trainer and the launcher (torch, torchvision, typer, rich, ...)
#   bootstrap.sh full  plus Slurm, munge, Open MPI, Horovod (cached wheel), DeepSpeed, DALI, test tools
# The virtual environment is $DLAUNCH_VENV (default: .venv in the repository).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DLAUNCH_VENV:-$ROOT/.venv}
MODE=${1:-run}
WHEELS=${DLAUNCH_WHEEL_CACHE:-$HOME/.cache/dlaunch/wheels}

case "$MODE" in run|full) ;; *) echo "bootstrap.sh: unknown mode '$MODE' (run|full)" >&2; exit 2 ;; esac

apt_packages=()
if [ "$MODE" = full ]; then
  apt_packages=(slurmctld slurmd slurm-client munge libpmix-dev openmpi-bin libopenmpi-dev iproute2 util-linux procps psmisc tmux chromium)
fi
source "$ROOT/scripts/apt-install.sh"
apt_install bootstrap.sh "${apt_packages[@]}"
if [ "$APT_INSTALLED" = 1 ]; then
  # Debian starts the daemons on install; tests run their own throw-away cluster.
  for s in slurmctld slurmd munge; do systemctl stop "$s" 2>/dev/null || service "$s" stop 2>/dev/null || true; done
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
if [ "$MODE" = run ]; then
  "${PIP[@]}" -e "$ROOT[train]"
  exit 0
fi
"${PIP[@]}" -e "$ROOT[train,deepspeed,dali,test]"

# Horovod: built once from its sdist against the installed torch, then reused from the wheel cache. Its pin
# and build settings (HOROVOD_VERSION, HOROVOD_BUILD_ENV: the C++ standard this torch needs, written into
# $tmp) are the cpu image stack's in containers/versions.toml: that image reuses this wheel.
tmp=$(mktemp -d)
eval "$("$VENV/bin/python" -m dlaunch.jobs.horovod_build cpu "$tmp")"
if ! "$VENV/bin/python" -c "import horovod.torch" 2>/dev/null; then
  wheel=$(ls "$WHEELS"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "bootstrap.sh: building Horovod $HOROVOD_VERSION (about 6 minutes, once)" >&2
    # A CUDA build of torch makes Horovod's CMake look for the CUDA toolkit (headers only; no GPU ops here).
    cuda=${CUDA_HOME:-/usr/local/cuda}
    # shellcheck disable=SC2086  # HOROVOD_BUILD_ENV: NAME=value words
    env $HOROVOD_BUILD_ENV CUDA_HOME="$cuda" CUDAToolkit_ROOT="$cuda" PATH="$cuda/bin:$PATH" \
      HOROVOD_GPU_OPERATIONS= MAKEFLAGS=-j"$(nproc)" \
      "$VENV/bin/python" -m pip wheel --quiet --no-build-isolation --no-deps \
      -w "$tmp/dist" "horovod==$HOROVOD_VERSION"
    mkdir -p "$tmp/unpacked" "$WHEELS"
    built=$(ls "$tmp"/dist/horovod-*.whl)
    "$VENV/bin/python" -m wheel unpack -d "$tmp/unpacked" "$built"
    find "$tmp/unpacked" -name '*.so' -exec strip --strip-debug {} +
    "$VENV/bin/python" -m wheel pack -d "$WHEELS" "$tmp"/unpacked/horovod-*
    wheel=$(ls "$WHEELS"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)
  fi
  "${PIP[@]}" --no-deps "$wheel"
  "${PIP[@]}" cloudpickle psutil pyyaml packaging
fi
rm -rf "$tmp"

if [ "$MODE" = full ]; then
  # After the Horovod wheel: the cpu image installs it from the wheel cache instead of compiling Horovod.
  "$ROOT/scripts/bootstrap-containers.sh"   # mmdebstrap, charliecloud-runtime, spython
  "$ROOT/scripts/bootstrap-engines.sh"      # .venv-tf (TensorFlow, tf-keras), .venv-mx (MXNet)
fi
