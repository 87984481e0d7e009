#!/usr/bin/env bash
# Every CUDA path of the trainer once, and its GPU throughput against a bare PyTorch loop, in one call on
# a machine with one NVIDIA GPU (the `device` tool's lent H100/H200), each check under its own timeout.
#
#   benchmarks/gpu_validate.sh [OUTDIR]        (default: $OUT, else ./gpu-validate-out)
#
# Environment:
#   GPU_VALIDATE_BUDGET_S   wall-clock budget of the whole script (default 550; the device allows 600 a command):
#                           checks that would run past it are cut short (timeout) or skipped, an option pair
#                           starts only while its estimate fits, the summary is always written
#   GPU_VALIDATE_ONLY       comma list of groups (default all): env,bench,loader,folder,paths,deepspeed,horovod;
#                           all of them do not fit one call: the workload figures are `env,bench`
#   GPU_VALIDATE_PAIRS      the bench group's option pairs, one a line (or ';' between them): "BATCH:AMP [OPTIONS]"
#                           (default: the list in the bench section); GPU_VALIDATE_ROUNDS rounds of them (default 1)
#   GPU_VALIDATE_STEPS      "STEPS WARMUP" of every pair (default 80 20 above batch 64, 230 30 up to 64)
#   GPU_VALIDATE_REVISION   the repository revision, for the record (the device copy has no .git)
#   GPU_VALIDATE_DEVICE, GPU_VALIDATE_MODEL, GPU_VALIDATE_IMAGE_SIZE   (cuda, resnet50, 224): a CPU rehearsal of the
#                           script takes cpu, resnet18, 32; GPU_VALIDATE_PYTHON (python3), GPU_VALIDATE_WORK
#                           (/tmp/gpu-validate: logs, the JPEG folder, the inductor cache)
# Carried files: .whl/*.whl are installed into /tmp/site and used by the DeepSpeed checks and the Horovod
# build only (deepspeed, hjson, pydantic, cffi...); .whl/src/horovod-*.tar.gz is built with NCCL operations;
# .whl/fixes/*.diff (proposed fixes of dlaunch/) are applied to a copy of the repository, which then runs
# every check (the summary names them).
#
# Groups:
#   env        GPU, driver, CUDA, cuDNN, NCCL, torch, nvcc (nvidia-smi and torch; read-only queries)
#   bench      ResNet-50, synthetic data, channels-last, per option pair (batch, AMP, workload options: --compile,
#              --cuda-graphs, --optimizer-impl, --host-syncs) two runs with the same options:
#              benchmarks/bare_loop_gpu.py, then the trainer (python -m dlaunch.train), each in a fresh process;
#              nvidia-smi samples power during the trainer runs (cross-check of NVML energy). The summary gives
#              trainer / bare per pair and the best configuration as a fraction of MLPERF_H100_PER_GPU
#   loader     a generated JPEG folder (dlaunch/train/data/make_folder.py): the native loader alone (images/s into
#              GPU memory)
#   folder     training on that folder: native loader, DALI CPU and GPU where DALI is importable
#   paths      NCCL process group (torchrun --standalone, one rank) with sync-BN and fp16 loss scaling,
#              --profile-steps with bf16, fp32 without AMP
#   deepspeed  DeepSpeed fp16/bf16 x ZeRO 1/2 (torchrun, one rank)
#   horovod    Horovod built from the carried sdist with HOROVOD_GPU_OPERATIONS=NCCL, then one trainer run
# A check passes when its command exits 0 and (trainer runs) the metrics file ends with status `ok`; exit 2 is
# `refused` (bad input: an option this trainer or bare loop does not take, shown with its one-line reason).
# Under OUTDIR: summary.md, results.json, logs.tar.gz (every log and metrics file), horovod-build.log.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT_DIR=${1:-${OUT:-$ROOT/gpu-validate-out}}
BUDGET=${GPU_VALIDATE_BUDGET_S:-550}
ONLY=${GPU_VALIDATE_ONLY:-all}
ROUNDS=${GPU_VALIDATE_ROUNDS:-1}
RESERVE=25  # seconds kept for the summary and the archive
START=$SECONDS
WORK=${GPU_VALIDATE_WORK:-/tmp/gpu-validate}
LOGS=$WORK/logs
TSV=$LOGS/checks.tsv
rm -rf "$LOGS"
mkdir -p "$OUT_DIR" "$LOGS"
: > "$TSV"
PY=${GPU_VALIDATE_PYTHON:-python3}
DEVICE=${GPU_VALIDATE_DEVICE:-cuda}
MODEL=${GPU_VALIDATE_MODEL:-resnet50}
IMAGE_SIZE=${GPU_VALIDATE_IMAGE_SIZE:-224}

# Proposed fixes: every check runs from a patched copy of train/ and benchmarks/.
RUN_ROOT=$ROOT
FIXES=$(ls "$ROOT"/.whl/fixes/*.diff 2>/dev/null)
if [ -n "$FIXES" ]; then
  RUN_ROOT=$WORK/src
  rm -rf "$RUN_ROOT" && mkdir -p "$RUN_ROOT" && cp -r "$ROOT/dlaunch" "$ROOT/benchmarks" "$RUN_ROOT/"
  for fix in $FIXES; do
    patch --forward --batch -p1 -d "$RUN_ROOT" < "$fix" > "$LOGS/fix-$(basename "$fix").log" 2>&1 || echo "fix $fix did not apply"
    basename "$fix" >> "$LOGS/fixes.txt"
  done
fi
cd "$RUN_ROOT"
export PYTHONPATH=$RUN_ROOT PYTHONUNBUFFERED=1

wanted() { [ "$ONLY" = all ] || [[ ",$ONLY," == *",$1,"* ]]; }
left() { echo $(( BUDGET - (SECONDS - START) - RESERVE )); }

# check NAME LIMIT_S COMMAND...: run COMMAND (output in $LOGS/NAME.log) under min(LIMIT_S, time left);
# one line in checks.tsv: name, exit code (124: timed out; "skipped"), seconds, command.
check() {
  local name=$1 limit=$2 t0 rc available command
  shift 2
  available=$(left)
  if (( available < 15 )); then
    printf '%s\tskipped\t0\t%s\n' "$name" "$*" >> "$TSV"
    echo "== $name: skipped (out of time)"
    return 0
  fi
  (( limit > available )) && limit=$available
  t0=$SECONDS
  echo "== $name (limit ${limit}s, t=$((SECONDS - START))s)"
  timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  command="$*"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "${command//$'\n'/ }" >> "$TSV"
  echo "   exit $rc after $((SECONDS - t0))s"
  return 0
}

TRAIN=($PY -m dlaunch.train --device "$DEVICE" --model "$MODEL" --image-size "$IMAGE_SIZE")
TORCHRUN=($PY -m torch.distributed.run --standalone --nproc_per_node=1 -m dlaunch.train --device "$DEVICE" --model "$MODEL"
          --image-size "$IMAGE_SIZE")

# trainer NAME LIMIT_S ARGS...: the trainer (one process) with its metrics in $LOGS/NAME.jsonl
trainer() { local name=$1 limit=$2; shift 2; check "$name" "$limit" "${TRAIN[@]}" --metrics "$LOGS/$name.jsonl" "$@"; }
torchrun_trainer() {
  local name=$1 limit=$2; shift 2
  check "$name" "$limit" "${TORCHRUN[@]}" --metrics "$LOGS/$name.jsonl" "$@"
}

# sampled NAME: run `trainer NAME ...` with nvidia-smi sampling power/utilisation/clocks every 200 ms
sampled() {
  local name=$1 smi
  nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,clocks.sm,temperature.gpu \
    --format=csv,noheader,nounits -lms 200 > "$LOGS/$name.smi.csv" 2>/dev/null &
  smi=$!
  trainer "$@"
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
}

# ---------------------------------------------------------------------------------------------------- env
if wanted env; then
  nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1
  nvidia-smi -q > "$LOGS/nvidia-smi-q.txt" 2>&1
  (command -v nvcc && nvcc --version) > "$LOGS/nvcc.txt" 2>&1
  $PY -m pip list > "$LOGS/pip-list.txt" 2>&1
  check env 60 $PY - "$LOGS/env.json" <<'EOF'
import datetime, json, platform, subprocess, sys
import torch, torchvision
p = torch.cuda.get_device_properties(0)
env = {"date_utc": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z", "host": platform.node(),
       "kernel": platform.release(), "python": platform.python_version(), "torch": torch.__version__,
       "torchvision": torchvision.__version__, "cuda_runtime": torch.version.cuda,
       "cudnn": torch.backends.cudnn.version(), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
       "gpu": p.name, "capability": "%d.%d" % (p.major, p.minor), "sms": p.multi_processor_count,
       "gpu_memory_gib": round(p.total_memory / 2 ** 30, 1)}
try:
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    env["driver"] = pynvml.nvmlSystemGetDriverVersion()
    env["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    env["nvml_cuda_driver"] = pynvml.nvmlSystemGetCudaDriverVersion()
except Exception as e:  # recorded, not fatal
    env["driver"] = "NVML: %s" % e
out = subprocess.run("nvcc --version | tail -n 2", shell=True, stdout=subprocess.PIPE, text=True).stdout
env["nvcc"] = " ".join(out.split())
try:
    import triton  # torch.compile's GPU code generator
    env["triton"] = triton.__version__
except ImportError:
    env["triton"] = "not importable"
env["cpus"] = len(__import__("os").sched_getaffinity(0))
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps(env))
EOF
fi

# Carried wheels (DeepSpeed, Horovod's build needs, what they need that the image lacks), on their own path.
SITE=/tmp/site
if ls "$ROOT"/.whl/*.whl > /dev/null 2>&1 && (wanted deepspeed || wanted horovod); then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$ROOT"/.whl/*.whl > "$LOGS/wheels.log" 2>&1 || echo "wheel install failed (see wheels.log)"
fi

# -------------------------------------------------------------------------------------------------- bench
# Option pairs, one a line: "BATCH:AMP [OPTIONS]". Both halves get the same options (the trainer's workload flags,
# which benchmarks/bare_loop_gpu.py takes too) on synthetic data, channels-last, each half a fresh process, the bare
# loop first. The list is in order of want: a pair starts only while the time left covers its estimate
# (pair_estimate), so the budget cuts from the end and the summary names what it skipped. The default list (its
# estimates add up to about 420 s of the default 550 s budget) follows the H100 calls of 2026-11-26
# (benchmarks/README.md, "Measured on one H100"):
#   256:bf16 --compile default     the best configuration measured: 5,539 img/s, 0.774 of 7,160
#   64:fp16 fused + CUDA graphs    the host-bound case with the host out of the step: 1.033 and 1.039 of bare
#   64:fp16 fused, then fused + minimal, twice, interleaved: the trainer's --host-syncs minimal was slower than its
#                                  fused default in both H100 calls (each time the first pair of its call); the cause
#                                  is open
#   256:bf16 fused + CUDA graphs   is a CUDA graph worth anything at batch 256?
# Left out of the default (add them with GPU_VALIDATE_PAIRS in another call): the eager baselines (256:fp16: 0.960
# and 0.966 of bare; 64:fp16: 0.896, 1.085, 1.061), --compile reduce-overhead (~150 s a pair),
# max-autotune-no-cudagraphs (its autotuning takes minutes for ResNet-50), bf16 at batch 64 (met the goal eagerly).
# The bare loop compiles first with an empty inductor cache ($WORK/inductor); the trainer finds its kernels there
# where its graphs are the same, so the trainer's compile time is a warm one.
DEFAULT_PAIRS="256:bf16 --compile default
64:fp16 --optimizer-impl fused --cuda-graphs
64:fp16 --optimizer-impl fused
64:fp16 --optimizer-impl fused --host-syncs minimal
64:fp16 --optimizer-impl fused
64:fp16 --optimizer-impl fused --host-syncs minimal
256:bf16 --optimizer-impl fused --cuda-graphs"
mapfile -t PAIRS < <(printf '%s\n' "${GPU_VALIDATE_PAIRS:-$DEFAULT_PAIRS}" | tr ';' '\n' | sed -e 's/^ *//' -e '/^$/d')
# steps and warm-up steps per batch size, the same for both halves (GPU_VALIDATE_STEPS="S W" for every pair)
steps_for() {
  if [ -n "${GPU_VALIDATE_STEPS:-}" ]; then echo "$GPU_VALIDATE_STEPS"
  elif [ "${1%%:*}" -le 64 ]; then echo "230 30"; else echo "80 20"; fi
}
# seconds a pair takes on an H100, both halves with their start-up: eager ~35-45, a cold compile ~150
pair_estimate() {
  case " $* " in
    *" --compile max-autotune"*) echo 420 ;;
    *" --compile off "*) echo 45 ;;
    *" --compile "*) echo 150 ;;
    *) echo 45 ;;
  esac
}
if wanted bench; then
  export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor
  rm -rf "$TORCHINDUCTOR_CACHE_DIR"
  for round in $(seq 1 "$ROUNDS"); do
    for i in "${!PAIRS[@]}"; do
      read -r config options <<< "${PAIRS[$i]}"
      read -r steps warmup <<< "$(steps_for "$config")"
      batch=${config%%:*} amp=${config##*:}
      estimate=$(pair_estimate $options)
      name="p$((i + 1))-r$round"
      shared=(--batch-size "$batch" --amp "$amp" --channels-last --steps "$steps" --warmup-steps "$warmup" $options)
      if (( $(left) < estimate )); then
        printf '%s\t%s\t%s\t%s\t%s\tskipped\n' "$name" "$config" "$options" "$estimate" "$round" >> "$LOGS/pairs.tsv"
        echo "== pair $name ($config $options): skipped, ${estimate}s estimated, $(left)s left"
        continue
      fi
      printf '%s\t%s\t%s\t%s\t%s\tran\n' "$name" "$config" "$options" "$estimate" "$round" >> "$LOGS/pairs.tsv"
      check "bare-$name" 300 $PY benchmarks/bare_loop_gpu.py --device "$DEVICE" --model "$MODEL" \
        --image-size "$IMAGE_SIZE" "${shared[@]}"
      sampled "trainer-$name" 300 "${shared[@]}" --steps-per-epoch "$steps"
    done
  done
fi

# ------------------------------------------------------------------------------------------------- loader
DATA=$WORK/jpeg
if wanted loader; then
  rm -rf "$DATA"
  check make-folder 90 $PY -m dlaunch.train.data.make_folder "$DATA" --classes 16 --images-per-class 128 \
    --val-per-class 16 --size 256
  check loader-native-alone 90 $PY - "$DATA" "$LOGS/loader-native-alone.json" <<'EOF'
"""The native loader alone: training batches (decode, crop, flip, normalise) delivered into GPU memory."""
import json, sys, time
import torch
from dlaunch.train.config import parse_config
from dlaunch.train.data import build_loaders
from dlaunch.train.frameworks.base import DistInfo
data, out = sys.argv[1], sys.argv[2]
results = []
for workers in (6, 12):
    cfg = parse_config(["--data", data, "--workers", str(workers), "--batch-size", "64", "--image-size", "224",
                        "--channels-last", "--metrics", "/tmp/unused.jsonl"])
    train = build_loaders(cfg, DistInfo(0, 1, 0, 1, torch.device("cuda", 0))).train
    rates = []
    for epoch in range(3):  # the first one warms up (worker start, page cache)
        train.set_epoch(epoch)
        started, images = time.perf_counter(), 0
        for batch, _ in train:
            images += batch.shape[0]
        torch.cuda.synchronize()
        rates.append(images / (time.perf_counter() - started))
    results.append({"loader": "native", "workers": workers, "batch": 64, "images_per_s": max(rates[1:]),
                    "epochs_images_per_s": rates})
    print(json.dumps(results[-1]))
json.dump(results, open(out, "w"), indent=1)
EOF
fi
if wanted folder; then
  [ -d "$DATA" ] || check make-folder 90 $PY -m dlaunch.train.data.make_folder "$DATA" --classes 16 --images-per-class 128 \
    --val-per-class 16 --size 256
  trainer train-native-folder 150 --data "$DATA" --workers 12 --batch-size 64 --amp bf16 --channels-last \
    --epochs 2 --warmup-steps 8
  if $PY -c "import nvidia.dali" > /dev/null 2>&1; then
    for device in cpu gpu; do
      trainer "train-dali-$device" 150 --data "$DATA" --loader dali --dali-device "$device" --workers 12 \
        --batch-size 64 --amp bf16 --channels-last --epochs 2 --warmup-steps 8
    done
  else
    echo "DALI is not importable here: DALI checks skipped" | tee "$LOGS/dali-missing.txt"
  fi
fi

# ---------------------------------------------------------------------------------- horovod (background)
# Started after the throughput and loader benchmarks (a compiler on 16 cores would disturb them), built
# while the path checks run, tested at the end.
build_horovod() {
  local src nvcc cuda nccl_pkg header library
  src=$(ls "$ROOT"/.whl/src/horovod-*.tar.gz 2>/dev/null | head -n1)
  [ -n "$src" ] || { echo "no .whl/src/horovod-*.tar.gz carried"; return 2; }
  nvcc=$(command -v nvcc) || { echo "no nvcc on PATH"; return 2; }
  cuda=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  nccl_pkg=$($PY -c "import nvidia.nccl as n; print(list(n.__path__)[0])") || return 2
  header=$(find "$nccl_pkg" /usr/include "$cuda/include" -name nccl.h 2>/dev/null | head -n1)
  library=$(find "$nccl_pkg" -name 'libnccl.so*' 2>/dev/null | head -n1)
  echo "cuda=$cuda nccl.h=$header libnccl=$library"
  [ -n "$header" ] && [ -n "$library" ] || { echo "NCCL header or library not found"; return 2; }
  rm -rf /tmp/hvd && mkdir -p /tmp/hvd/nccl/include /tmp/hvd/nccl/lib /tmp/hvd/dist
  ln -s "$header" /tmp/hvd/nccl/include/nccl.h
  ln -s "$library" /tmp/hvd/nccl/lib/libnccl.so
  # Horovod's CMake asks for C++14 (torch needs newer) and C++11 for its CUDA kernels (CUDA 13's headers
  # need C++17): raise both, as scripts/bootstrap.sh does for C++.
  printf 'set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++20")\nset(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++20")\n' \
    > /tmp/hvd/cxx.cmake
  printf 'set(CMAKE_CUDA11_STANDARD_COMPILE_OPTION "-std=c++17")\nset(CMAKE_CUDA11_EXTENSION_COMPILE_OPTION "-std=c++17")\n' \
    > /tmp/hvd/cuda.cmake
  printf 'set(CMAKE_USER_MAKE_RULES_OVERRIDE_CXX "/tmp/hvd/cxx.cmake")\nset(CMAKE_USER_MAKE_RULES_OVERRIDE_CUDA "/tmp/hvd/cuda.cmake")\n' \
    > /tmp/hvd/toolchain.cmake
  # GCC 13's libstdc++ no longer pulls in <string> through other headers; horovod/common/group_table.h
  # uses std::string without including it ("'string' in namespace 'std' does not name a type").
  CXXFLAGS="-include string" CMAKE_TOOLCHAIN_FILE=/tmp/hvd/toolchain.cmake CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    CUDA_HOME="$cuda" CUDAToolkit_ROOT="$cuda" HOROVOD_CUDA_HOME="$cuda" HOROVOD_BUILD_CUDA_CC_LIST=90 \
    HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=/tmp/hvd/nccl HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_MPI=1 MAKEFLAGS=-j"$(nproc)" PYTHONPATH="$SITE" \
    $PY -m pip wheel -v --no-build-isolation --no-deps -w /tmp/hvd/dist "$src" || return 1
  $PY -m pip install -q --no-deps --no-compile --target /tmp/hvd/site /tmp/hvd/dist/horovod-*.whl
}
if wanted horovod; then
  export -f build_horovod
  export PY ROOT SITE
  # leave a minute after the build for the Horovod checks
  check horovod-build $(( $(left) - 60 )) nice -n 5 bash -c build_horovod &
  HOROVOD_BUILD=$!
fi

# -------------------------------------------------------------------------------------------------- paths
if wanted paths; then
  torchrun_trainer nccl-syncbn-fp16 120 --batch-size 64 --amp fp16 --sync-bn --channels-last --steps 40 \
    --steps-per-epoch 40 --warmup-steps 10
  torchrun_trainer profile-bf16 120 --batch-size 64 --amp bf16 --channels-last --steps 50 --steps-per-epoch 50 \
    --warmup-steps 10 --profile-steps 10
  trainer fp32-contiguous 120 --batch-size 64 --steps 40 --steps-per-epoch 40 --warmup-steps 10
fi

# ---------------------------------------------------------------------------------------------- deepspeed
if wanted deepspeed; then
  for amp in fp16 bf16; do
    for zero in 1 2; do
      PYTHONPATH=$ROOT:$SITE torchrun_trainer "deepspeed-$amp-zero$zero" 150 --framework deepspeed \
        --zero-stage "$zero" --batch-size 64 --amp "$amp" --channels-last --steps 40 --steps-per-epoch 40 \
        --warmup-steps 10
    done
  done
fi

# ------------------------------------------------------------------------------------------ horovod test
if wanted horovod; then
  wait "$HOROVOD_BUILD"
  if [ -d /tmp/hvd/site/horovod ]; then
    HVD_PATH=$RUN_ROOT:/tmp/hvd/site
    PYTHONPATH=$HVD_PATH check horovod-built 60 $PY -c "import horovod, horovod.torch as hvd; hvd.init(); \
print('horovod', horovod.__version__, 'nccl_built', hvd.nccl_built(), 'gloo', hvd.gloo_built(), 'mpi', hvd.mpi_built(), \
'cuda', hvd.cuda_built(), 'size', hvd.size())"
    PYTHONPATH=$HVD_PATH check horovod-bf16-fp16allreduce 150 $PY -m horovod.runner.launch -np 1 -H localhost:1 \
      --gloo "${TRAIN[@]}" --metrics "$LOGS/horovod-bf16-fp16allreduce.jsonl" --framework horovod \
      --batch-size 64 --amp bf16 --fp16-allreduce --channels-last --steps 40 --steps-per-epoch 40 --warmup-steps 10
  fi
fi

# -------------------------------------------------------------------------------------------------- summary
$PY - "$LOGS" "$OUT_DIR" "${GPU_VALIDATE_REVISION:-unknown}" "$DEVICE" "$MODEL" "$IMAGE_SIZE" "$BUDGET" <<'EOF'
"""checks.tsv, pairs.tsv, metrics files and the bare loop's JSON lines -> results.json and summary.md."""
import json, os, statistics, sys
from dlaunch.train.metrics_schema import MetricsError, read_metrics

# The best published per-GPU ResNet-50 training throughput on an H100: MLPerf Training v4.0 (ResNet-50's last round),
# NVIDIA's 1x DGX H100 submission (8x H100-SXM5-80GB, MXNet NGC 24.04 with DALI, ImageNet, batch 400 per GPU). Its
# log (mlcommons/training_results_v4.0, NVIDIA/results/eos_ngc24.04_mxnet/resnet/result_0.txt) reports 57,122 to
# 57,405 img/s per epoch from epoch 2 on (`tracked_stats` throughput): about 57,280 / 8 GPUs.
MLPERF_H100_PER_GPU = 7160.0
MLPERF_NAME = "MLPerf Training v4.0 NVIDIA 1x DGX H100 ResNet-50, per GPU (MXNet + DALI, ImageNet, batch 400)"
WORKLOAD_FLAGS = ("--compile", "--cuda-graphs", "--optimizer-impl", "--host-syncs")  # --cuda-graphs takes no value

logs, out, revision, device, model, image_size, budget = sys.argv[1:8]
env = json.load(open(os.path.join(logs, "env.json"))) if os.path.exists(os.path.join(logs, "env.json")) else {}
env.update(revision=revision, workload="%s, %s px, synthetic data, channels-last, device %s" % (model, image_size, device),
           budget_s=int(budget))
fixes = os.path.join(logs, "fixes.txt")
env["fixes_applied"] = open(fixes).read().split() if os.path.exists(fixes) else []


def metrics_of(name):
    path = os.path.join(logs, name + ".jsonl")
    if not os.path.exists(path):
        return None
    try:
        return read_metrics(path)
    except MetricsError as e:
        return str(e)


def smi_power(name):
    """Mean power (W) and utilisation (%) of nvidia-smi's samples taken while the run trained (util > 50%)."""
    path = os.path.join(logs, name + ".smi.csv")
    if not os.path.exists(path):
        return None
    rows = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((float(parts[1]), float(parts[2]), float(parts[3])))
        except (IndexError, ValueError):
            continue
    busy = [r for r in rows if r[1] > 50]
    if not busy:
        return None
    return {"power_w": statistics.mean(r[0] for r in busy), "util_pct": statistics.mean(r[1] for r in busy),
            "sm_clock_mhz": statistics.median(r[2] for r in busy), "samples": len(busy)}


def log_lines(name):
    path = os.path.join(logs, name + ".log")
    return open(path, errors="replace").read().splitlines() if os.path.exists(path) else []


def bare_result(name):
    """The bare loop's JSON line in its log, else None."""
    for line in reversed(log_lines(name)):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def recorded_compile_s(m):
    """The trainer's own compile time where its records carry one (`compile_s`: last epoch, end, header)."""
    for record in (m.epochs[-1] if m.epochs else {}, m.end or {}, m.header):
        if isinstance(record.get("compile_s"), (int, float)):
            return record["compile_s"]
    return None


def header_mismatches(options, config):
    """The workload options of a pair that the trainer's header does not record as given."""
    tokens, found = options.split(), []
    for i, flag in enumerate(tokens):
        if flag not in WORKLOAD_FLAGS:
            continue
        key = flag[2:].replace("-", "_")
        wanted = True if flag == "--cuda-graphs" else tokens[i + 1]
        if key not in config:
            found.append("%s not in the trainer's header" % key)
        elif config[key] != wanted:
            found.append("the trainer's header has %s=%s" % (key, config[key]))
    return found


checks = []
for line in open(os.path.join(logs, "checks.tsv")):
    name, rc, seconds, command = line.rstrip("\n").split("\t", 3)
    check = {"name": name, "exit": rc, "seconds": int(seconds), "command": command}
    m = metrics_of(name)
    if isinstance(m, str):
        check["metrics_error"] = m
    elif m is not None:
        check["end_status"] = m.status
        check["config"] = m.header.get("config") or {}
        check["framework_settings"] = m.header.get("framework_settings")
        check["energy_sources"] = m.header.get("energy_sources")
        check["versions"] = m.header.get("versions")
        check["compile_s"] = recorded_compile_s(m)
        if m.epochs:
            last = m.epochs[-1]
            check["images_per_s"] = last["images_per_s"]
            check["epoch_time_s"] = last["epoch_time_s"]
            check["data_wait_s"] = last.get("data_wait_s")
            check["energy_j"] = last.get("energy_j")
            check["gpu_utilization_pct"] = last.get("gpu_utilization_pct")
            check["gpu_memory_peak_bytes"] = last.get("gpu_memory_peak_bytes")
            check["loss"] = last.get("loss")
            check["top1"] = last.get("top1")
        if m.profiles:
            check["profile"] = {k: v for k, v in m.profiles[-1].items() if k.endswith("_s") or k == "steps"}
        if m.end and m.end.get("reason"):
            check["end_reason"] = m.end["reason"]
    if name.startswith("bare-"):
        bare = bare_result(name)
        if bare:
            check["bare"] = bare
            check["images_per_s"] = bare["images_per_s"]
    smi = smi_power(name)
    if smi:
        check["nvidia_smi"] = smi
    ok = rc == "0" and check.get("end_status", "ok") == "ok"
    check["result"] = ("skipped" if rc == "skipped" else "ok" if ok else "refused" if rc == "2"
                       else "timeout" if rc in ("124", "137") else "FAILED")
    if check["result"] == "refused":
        check["reason"] = next((l.strip() for l in reversed(log_lines(name)) if l.strip()), "")
    elif check["result"] in ("FAILED", "timeout"):
        check["log_tail"] = "\n".join(log_lines(name)[-40:])
    checks.append(check)
by_name = {c["name"]: c for c in checks}

pairs = []
pairs_tsv = os.path.join(logs, "pairs.tsv")
for line in open(pairs_tsv) if os.path.exists(pairs_tsv) else ():
    name, config, options, estimate, round_, status = line.rstrip("\n").split("\t")
    bare, trainer = by_name.get("bare-" + name, {}), by_name.get("trainer-" + name, {})
    pair = {"pair": name, "config": config, "options": options, "round": int(round_), "estimate_s": int(estimate),
            "status": status, "bare": bare.get("result"), "trainer": trainer.get("result"),
            "bare_images_per_s": bare.get("images_per_s") if bare.get("result") == "ok" else None,
            "trainer_images_per_s": trainer.get("images_per_s") if trainer.get("result") == "ok" else None,
            "bare_first_step_s": bare.get("bare", {}).get("first_step_s"),
            "bare_warmup_s": bare.get("bare", {}).get("warmup_s"),
            "bare_graph_breaks": bare.get("bare", {}).get("graph_breaks"),
            "trainer_compile_s": trainer.get("compile_s"), "notes": []}
    if pair["bare_images_per_s"] and pair["trainer_images_per_s"]:
        pair["trainer_over_bare"] = pair["trainer_images_per_s"] / pair["bare_images_per_s"]
    for half, check in (("bare loop", bare), ("trainer", trainer)):
        if check.get("result") in ("refused", "FAILED", "timeout"):
            pair["notes"].append("%s %s%s" % (half, check["result"], ": " + check["reason"] if check.get("reason") else
                                                " (log below)"))
    if trainer.get("result") == "ok":
        pair["notes"] += header_mismatches(options, trainer.get("config", {}))
    if pair["bare_graph_breaks"]:
        pair["notes"].append("bare loop: %d graph breaks" % pair["bare_graph_breaks"])
    if status == "skipped":
        pair["notes"].append("skipped: its estimate (%d s) was more than the time left" % pair["estimate_s"])
    pairs.append(pair)


def best(field):
    """The pair whose `field` (images/s) is highest, else None."""
    measured = [p for p in pairs if p.get(field)]
    return max(measured, key=lambda p: p[field]) if measured else None


def label(p):
    return "%s %s" % (p["config"], p["options"] or "(eager, torch's optimizer, default host syncs)")


best_runs = {}
for who, field in (("trainer", "trainer_images_per_s"), ("bare loop", "bare_images_per_s")):
    p = best(field)
    if p:
        best_runs[who] = {"pair": p["pair"], "configuration": label(p), "images_per_s": p[field],
                          "fraction_of_mlperf": p[field] / MLPERF_H100_PER_GPU}

results = {"environment": env, "mlperf_reference": {"images_per_s_per_gpu": MLPERF_H100_PER_GPU, "what": MLPERF_NAME},
           "pairs": pairs, "best": best_runs, "checks": checks}
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)


def figure(value, form="%.0f"):
    return form % value if isinstance(value, (int, float)) else "-"


md = ["# GPU validation (benchmarks/gpu_validate.sh)", ""]
md += ["| what | value |", "|---|---|"] + ["| %s | %s |" % (k, v) for k, v in env.items()] + [""]
if pairs:
    gpu = env.get("gpu", "this device")
    md += ["## Best configuration on %s" % gpu, ""]
    for who, half in (("trainer", "trainer-"), ("bare loop", "bare-")):
        b = best_runs.get(who)
        md.append("- %s: %s" % (who, "no run of a pair finished" if not b else
                                "%s (%s): %s img/s = %.3f of %s img/s (%s); command:" % (
                                    b["configuration"], b["pair"], "{:,.0f}".format(b["images_per_s"]),
                                    b["fraction_of_mlperf"], "{:,.0f}".format(MLPERF_H100_PER_GPU), MLPERF_NAME)))
        if b:
            md += ["", "      " + by_name[half + b["pair"]]["command"], ""]
    md += ["", "## Option pairs: trainer vs bare loop, same options (%s)" % env["workload"], "",
           "images/s over the steps after the warm-up steps; compile times apart: the bare loop's first step "
           "(torch.compile's tracing and code generation plus one step) and warm-up (all warm-up steps), the "
           "trainer's `compile_s` where its records carry one. Each half's command: below the table.", "",
           "| pair | batch:AMP | options | bare img/s | trainer img/s | trainer / bare | bare first step s | "
           "bare warm-up s | trainer compile s | notes |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        md.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            p["pair"], p["config"], p["options"] or "-", figure(p["bare_images_per_s"]),
            figure(p["trainer_images_per_s"]), figure(p.get("trainer_over_bare"), "%.3f"),
            figure(p["bare_first_step_s"], "%.1f"), figure(p["bare_warmup_s"], "%.1f"),
            figure(p["trainer_compile_s"], "%.1f"), "; ".join(p["notes"]).replace("|", "/") or "-"))
    md += ["", "Commands (bare loop, then trainer, each pair that ran):", ""]
    md += ["    %s: %s" % (c["name"], c["command"]) for p in pairs for c in
           (by_name.get("bare-" + p["pair"]), by_name.get("trainer-" + p["pair"])) if c]
md += ["", "## Checks", "", "| check | result | exit | s | images/s | notes |", "|---|---|---|---|---|---|"]
for c in checks:
    notes = []
    if c.get("reason"):
        notes.append(c["reason"])
    if c.get("framework_settings"):
        notes.append(json.dumps({k: v for k, v in c["framework_settings"].items() if k != "config"}))
    if c.get("profile"):
        notes.append("profile " + ", ".join("%s=%.4f" % (k, v) for k, v in c["profile"].items() if k != "steps"))
    if c.get("energy_j"):
        gpu = c["energy_j"].get("gpu")
        if isinstance(gpu, (int, float)) and c.get("epoch_time_s"):
            notes.append("GPU %.0f J / %.1f s = %.0f W (NVML)" % (gpu, c["epoch_time_s"], gpu / c["epoch_time_s"]))
        else:
            notes.append("GPU energy: %s" % gpu)
    if c.get("nvidia_smi"):
        notes.append("nvidia-smi %.0f W, %.0f%% busy, SM %d MHz" % (c["nvidia_smi"]["power_w"], c["nvidia_smi"]["util_pct"],
                                                                  c["nvidia_smi"]["sm_clock_mhz"]))
    if c.get("gpu_utilization_pct") is not None:
        notes.append("util %s" % (("%.0f%%" % c["gpu_utilization_pct"]) if isinstance(c["gpu_utilization_pct"], float)
                                  else c["gpu_utilization_pct"]))
    if isinstance(c.get("gpu_memory_peak_bytes"), (int, float)):
        notes.append("peak %.1f GiB" % (c["gpu_memory_peak_bytes"] / 2 ** 30))
    if c.get("end_reason"):
        notes.append("reason: %s" % c["end_reason"])
    md.append("| %s | %s | %s | %d | %s | %s |" % (c["name"], c["result"], c["exit"], c["seconds"],
                                                   figure(c.get("images_per_s")), "; ".join(notes).replace("|", "/")))
failed = [c for c in checks if c.get("log_tail")]
if failed:
    md += ["", "## Failures (last 40 lines of each log)"]
    for c in failed:
        md += ["", "### %s (%s)" % (c["name"], c["result"]), "", "    " + c["command"], "", "```", c["log_tail"], "```"]
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(md) + "\n")
print("\n".join(md[:60]))
EOF

[ -f "$LOGS/horovod-build.log" ] && tail -n 400 "$LOGS/horovod-build.log" > "$OUT_DIR/horovod-build.log"
tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs
echo "gpu_validate: done after $((SECONDS - START))s; results in $OUT_DIR"
