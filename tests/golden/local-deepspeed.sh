#!/bin/bash
# rendered by the tests
set -eo pipefail

export GLOO_SOCKET_IFNAME=lo
export DLAUNCH_SITE=local
export DLAUNCH_GIT_REVISION=0000000000000000000000000000000000000000
export DLAUNCH_EXPERIMENT=exp
export DLAUNCH_RUN_DIR=/scratch/runs/exp/run

exec torchrun --standalone --nnodes=1 --nproc_per_node=2 -m train \
  --framework deepspeed \
  --model resnet50 \
  --batch-size 64 \
  --steps 200 \
  --warmup-steps 20 \
  --channels-last \
  --metrics /scratch/runs/exp/run/metrics.jsonl \
  --checkpoint-dir /scratch/runs/exp/run/checkpoints
