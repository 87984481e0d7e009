#!/usr/bin/env bash
# The TensorFlow and MXNet trainers' environments (dlaunch/train/tf, dlaunch/train/mx), idempotently:
#   .venv-tf  tensorflow-cpu + tf-keras (Keras 2: MultiWorkerMirroredStrategy's model.fit fails with Keras 3)
#   .venv-mx  mxnet 1.9.1 + numpy 1.23.5 (mxnet uses np.bool, removed in numpy 1.24: its own environment)
#             + Horovod built against it (gloo, CPU; about 4 minutes once, then from the wheel cache), the
#               version of the cpu image stack (containers/versions.toml, read through dlaunch/jobs/horovod_build.py)
# Horovod 0.28.1 does not build against TensorFlow 2.21 (its xla_mpi_ops.cc includes TF's xla/printer.h,
# which needs highwayhash/arch_specific.h, a header the tensorflow wheel does not ship).
# Each gets a .pth file that puts this repository on sys.path, so `python -m dlaunch.train.tf` / `python -m dlaunch.train.mx`
# import the torch-free shared modules (dlaunch/train/config.py, schedule.py, metrics_core.py, signals.py) from
# any working directory, without installing dlaunch's torch dependencies.
#   bootstrap-engines.sh [tf|mx|all]   (default all)
# The environments live in $DLAUNCH_VENV_TF / $DLAUNCH_VENV_MX (default .venv-tf / .venv-mx in the repository).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHICH=${1:-all}
TF_VENV=${DLAUNCH_VENV_TF:-$ROOT/.venv-tf}
MX_VENV=${DLAUNCH_VENV_MX:-$ROOT/.venv-mx}
TF_PINS=(tensorflow-cpu==2.21.0 tf-keras==2.21.0)
MX_PINS=(mxnet==1.9.1 numpy==1.23.5)
HOROVOD_DEPS=(cloudpickle==3.1.2 psutil==7.2.2 pyyaml==6.0.3 packaging==26.3 wheel==0.48.0)
# Beside, not in, bootstrap.sh's cache: that wheel (same file name) is built against torch.
MX_WHEELS=${DLAUNCH_WHEEL_CACHE:-$HOME/.cache/dlaunch/wheels}/mxnet-1.9.1

case "$WHICH" in tf|mx|all) ;; *) echo "bootstrap-engines.sh: unknown engine '$WHICH' (tf|mx|all)" >&2; exit 2 ;; esac

# make_env VENV CHECK PINS...: create VENV, install PINS unless CHECK already runs there, link the repository.
make_env() {
  local venv=$1 check=$2; shift 2
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  if ! "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
    echo "bootstrap-engines.sh: installing ${*} into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
  fi
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$ROOT" > "$site/dlaunch-repo.pth"
}

if [ "$WHICH" = tf ] || [ "$WHICH" = all ]; then
  make_env "$TF_VENV" "import tensorflow, tf_keras; assert tensorflow.__version__ == '2.21.0'" "${TF_PINS[@]}"
fi
if [ "$WHICH" = mx ] || [ "$WHICH" = all ]; then
  make_env "$MX_VENV" "import mxnet, numpy; assert mxnet.__version__ == '1.9.1' and numpy.__version__ == '1.23.5'" "${MX_PINS[@]}"
  if ! "$MX_VENV/bin/python" -c "import horovod.mxnet" 2>/dev/null; then
    scratch=$(mktemp -d)  # HOROVOD_VERSION, HOROVOD_BUILD_ENV: the cpu image stack's, built for mxnet
    eval "$("${DLAUNCH_VENV:-$ROOT/.venv}/bin/python" -m dlaunch.jobs.horovod_build cpu "$scratch" mxnet)"
    rm -rf "$scratch"
    "$MX_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${HOROVOD_DEPS[@]}"
    wheel=$(ls "$MX_WHEELS"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
    if [ -z "$wheel" ]; then
      echo "bootstrap-engines.sh: building Horovod $HOROVOD_VERSION against MXNet (about 4 minutes, once)" >&2
      mkdir -p "$MX_WHEELS"
      # shellcheck disable=SC2086  # HOROVOD_BUILD_ENV: NAME=value words
      env $HOROVOD_BUILD_ENV HOROVOD_GPU_OPERATIONS= MAKEFLAGS=-j"$(nproc)" \
        "$MX_VENV/bin/python" -m pip wheel --quiet --no-binary horovod --no-cache-dir --no-deps \
        --no-build-isolation -w "$MX_WHEELS" "horovod==$HOROVOD_VERSION"
      wheel=$(ls "$MX_WHEELS"/horovod-"$HOROVOD_VERSION"-*.whl)
    fi
    "$MX_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$wheel"
  fi
fi
