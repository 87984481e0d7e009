#!/bin/bash
# rendered by the tests
set -eo pipefail

export GLOO_SOCKET_IFNAME=lo
export DLAUNCH_SITE=local
export DLAUNCH_SCHEDULER=local
export DLAUNCH_GIT_REVISION=0000000000000000000000000000000000000000
export DLAUNCH_EXPERIMENT=exp
export DLAUNCH_RUN_DIR=/scratch/runs/exp/run
cd -- /scratch/runs/exp/run
export DLAUNCH_JOB_ID="local-$BASHPID"
export DLAUNCH_NNODES=1
export DLAUNCH_NODELIST=localhost
export DLAUNCH_NTASKS=1
export DLAUNCH_TASK_ID=0
export DLAUNCH_LOCAL_TASK_ID=0
export DLAUNCH_NODE_ID=0

exec horovodrun --gloo -np 2 python -m dlaunch.train \
  --framework horovod \
  --model resnet50 \
  --batch-size 64 \
  --steps 200 \
  --warmup-steps 20 \
  --channels-last \
  --metrics /scratch/runs/exp/run/metrics.jsonl \
  --checkpoint-dir /scratch/runs/exp/run/checkpoints
