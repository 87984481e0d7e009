#!/usr/bin/env bash
# Issue 44's GPU paths, once, on a machine with one NVIDIA GPU (the `device` tool's lent H100/H200), in one call:
#   nodecheck  pre-flight's node check on the GPU (dlaunch/train/nodecheck.py check, then select against the
#              expected figure given in PREFLIGHT_EXPECTED_TFLOPS): FP16 GEMM rate, Freivalds error, NVML reasons
#   bench      pre-flight's GEMM timing against the device's back-to-back rate (benchmarks/bench_nodecheck.py)
#   frdump     a real NCCL flight recorder dump with an all-reduce pending (benchmarks/fr_pending_dump.py)
#   hang       the trainer on the GPU under torchrun (NCCL, one rank) whose GPU stops finishing work before step
#              HANG_AT_STEP + 1 (tests/failpoints: a kernel that spins on the compute stream, as a hung GPU does):
#              time from the hang to the hang record and to the job's end, its exit code, the hang record, the
#              main thread's stack, and NCCL's real flight recorder dump as the trainer reads it and as torch's
#              own fr_trace reads it
#
#   benchmarks/gpu_trust.sh [OUTDIR]     (default: $OUT, else ./gpu-trust-out)
# Environment: TRUST_DEVICE (cuda; cpu rehearses the script here), TRUST_PYTHON (python3), TRUST_HANG_TIMEOUT (10),
# PREFLIGHT_EXPECTED_TFLOPS (989: the H100/H200 SXM datasheets' dense FP16 tensor figure; 0: judge by the median).
# Under OUTDIR: summary.txt, trust.tar.gz (node check files, the run's metrics, hang record, stacks, dumps, logs).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT_DIR=${1:-${OUT:-$ROOT/gpu-trust-out}}
PY=${TRUST_PYTHON:-python3}
DEVICE=${TRUST_DEVICE:-cuda}
HANG_TIMEOUT=${TRUST_HANG_TIMEOUT:-10}
EXPECTED=${PREFLIGHT_EXPECTED_TFLOPS:-989}
HANG_AT_STEP=12
WORK=/tmp/gpu-trust
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT_DIR"
SUMMARY=$OUT_DIR/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1

say "== env $(date -u +%FT%TZ)"
(nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader 2>&1 || true) | tee -a "$SUMMARY"
timeout 60 "$PY" -c 'import torch, platform; print("python", platform.python_version(), "torch", torch.__version__,
"cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)' 2>&1 | tee -a "$SUMMARY"
timeout 30 "$PY" -c 'import pynvml; print("pynvml", pynvml.__file__)' 2>&1 | tail -1 | tee -a "$SUMMARY"

say "== nodecheck"
PF=$WORK/preflight
HOST=$(hostname)
start=$SECONDS
timeout 120 "$PY" -m dlaunch.train.nodecheck check --dir "$PF" --attempt trust1 > "$WORK/nodecheck-check.log" 2>&1
say "check exit $? in $((SECONDS - start)) s"
EXPECT_ARGS=()
[ "$EXPECTED" != 0 ] && EXPECT_ARGS=(--expected-tflops "$EXPECTED" --expected-source "datasheet dense FP16 (benchmarks/gpu_trust.sh)")
timeout 60 "$PY" -m dlaunch.train.nodecheck select --dir "$PF" --attempt trust1 --hosts "$HOST" --nodes 1 \
  "${EXPECT_ARGS[@]}" --record "$WORK/preflight.json" > "$WORK/nodecheck-select.log" 2>&1
say "select exit $? chose: $(cat "$WORK/nodecheck-select.log" | tail -3)"
"$PY" - "$PF" "$WORK/preflight.json" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/*")):
    record = json.load(open(path))
    print("node file", path.rsplit("/", 1)[1], "problem:", record.get("problem"))
    for d in record.get("devices", []):
        print("  ", {k: v for k, v in d.items() if k not in ("samples",)})
try:
    verdict = json.load(open(sys.argv[2]))
    print("preflight.json:", json.dumps(verdict)[:1500])
except OSError as e:
    print("no preflight.json:", e)
EOF

say "== GEMM timing (benchmarks/bench_nodecheck.py)"
OUT=$WORK timeout 120 "$PY" benchmarks/bench_nodecheck.py --rounds 3 --device "$DEVICE" 2>&1 | tee -a "$SUMMARY"

if [ "$DEVICE" = cuda ]; then
  say "== a real NCCL dump with a pending all-reduce (benchmarks/fr_pending_dump.py)"
  timeout 90 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/fr_pending_dump.py \
    "$WORK/fr-pending.rank0" > "$WORK/fr-pending.log" 2>&1
  say "exit $?"; grep -v Warning "$WORK/fr-pending.log" | tail -5 | tee -a "$SUMMARY"
fi

say "== hang (GPU stops at step $HANG_AT_STEP, --hang-timeout $HANG_TIMEOUT)"
RUN=$WORK/run
mkdir -p "$RUN"
rm -f /tmp/dlaunch-test.gpu-hung.rank0
start=$(date +%s.%N)
PYTHONPATH=$ROOT/tests/failpoints:$ROOT DLAUNCH_TEST_GPU_HANG_AT_STEP=$HANG_AT_STEP DLAUNCH_TEST_GPU_HANG_S=150 \
  timeout 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m dlaunch.train \
  --device "$DEVICE" --model resnet18 --image-size 64 --batch-size 64 --steps 60 --steps-per-epoch 20 \
  --warmup-steps 2 --hang-timeout "$HANG_TIMEOUT" --metrics "$RUN/metrics.jsonl" --checkpoint-dir "$RUN/checkpoints" \
  > "$WORK/hang-run.log" 2>&1
rc=$?
ended=$(date +%s.%N)
say "torchrun exit $rc ($(grep -o "exitcode *: *[0-9-]*" "$WORK/hang-run.log" | head -1)) after $(awk "BEGIN{printf \"%.1f\", $ended - $start}") s (69: hung; 124: killed by this script's timeout)"
"$PY" - "$RUN" "$ended" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, os, sys
from dlaunch.train import heartbeat as hb
from dlaunch.train import flight_recorder as fr
run, ended = sys.argv[1], float(sys.argv[2])
marker = "/tmp/dlaunch-test.gpu-hung.rank0"
hung_at = os.path.getmtime(marker) if os.path.exists(marker) else None
record = hb.read_hang_record(run)
print("GPU stopped at", hung_at)
if record is None:
    print("no hang record")
else:
    if hung_at:
        print("hang record %.1f s after the GPU stopped; job ended %.1f s after" % (record["time"] - hung_at, ended - hung_at))
    print("summary:", record.get("summary"))
    print("silent:", json.dumps(record.get("silent")))
    print("flight_recorder:", json.dumps(record.get("flight_recorder")))
    print("stacks:", record.get("stacks"), "dumps:", record.get("flight_recorder_dumps"))
for name in sorted(os.listdir(os.path.join(run, "hang"))) if os.path.isdir(os.path.join(run, "hang")) else []:
    path = os.path.join(run, "hang", name)
    if name.startswith(fr.DUMP_PREFIX):
        content = fr.load(open(path, "rb").read())
        print(name, "version", content.get("version"), "keys", sorted(content), "entries", len(content["entries"]))
        print("  last entry:", {k: v for k, v in content["entries"][-1].items() if k != "frames"} if content["entries"] else None)
        print("  pg_status:", content.get("pg_status"), "pg_config:", content.get("pg_config"))
        print("  summary:", json.dumps(fr.summary(content, 0))[:1500])
    elif name.startswith("stacks."):
        text = open(path).read()
        print(name, "(main thread, last lines):")
        main = text.split("Current thread")[-1] if "Current thread" in text else text
        print("\n".join(text.splitlines()[:40]))
lines = open(os.path.join(run, "metrics.jsonl")).read().splitlines() if os.path.exists(os.path.join(run, "metrics.jsonl")) else []
print("metrics end:", lines[-1][:600] if lines else None)
EOF
if [ -d "$RUN/hang" ]; then
  timeout 90 "$PY" -m torch.distributed.flight_recorder.fr_trace "$RUN/hang" --prefix flight_recorder.rank \
    > "$WORK/fr_trace.log" 2>&1
  say "torch fr_trace exit $?:"; tail -30 "$WORK/fr_trace.log" | tee -a "$SUMMARY"
fi
tail -40 "$WORK/hang-run.log" > "$WORK/hang-run.tail"
tar czf "$OUT_DIR/trust.tar.gz" -C "$WORK" . 2>/dev/null
say "== done $(date -u +%FT%TZ)"
