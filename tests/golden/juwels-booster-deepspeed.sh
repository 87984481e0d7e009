#!/bin/bash
#SBATCH --job-name=exp-run
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=48
#SBATCH --hint=nomultithread
#SBATCH --partition=booster
#SBATCH --time=01:00:00
#SBATCH --account=proj42
#SBATCH --gres=gpu:4
#SBATCH --output=/scratch/runs/exp/run/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=USR1@120
# rendered by the tests
set -eo pipefail

export NCCL_SOCKET_IFNAME=ib0
export GLOO_SOCKET_IFNAME=ib0
export NCCL_IB_TIMEOUT=22
export NCCL_IB_RETRY_CNT=7
export UCX_RC_TIMEOUT=4s
export DLAUNCH_SITE=juwels-booster
export DLAUNCH_SCHEDULER=slurm
export DLAUNCH_IMAGE=/images/current-deepspeed-x86_64.sif
export DLAUNCH_GIT_REVISION=0000000000000000000000000000000000000000
export DLAUNCH_EXPERIMENT=exp
export DLAUNCH_RUN_DIR=/scratch/runs/exp/run
cd -- /scratch/runs/exp/run
export DLAUNCH_JOB_ID="$SLURM_JOB_ID"
export DLAUNCH_RESTART_COUNT="$SLURM_RESTART_COUNT"
export DLAUNCH_NNODES="$SLURM_JOB_NUM_NODES"
DLAUNCH_NODELIST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)"
export DLAUNCH_NODELIST
echo "dlaunch: job $SLURM_JOB_ID attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )) on $SLURM_JOB_NODELIST at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"
export DLAUNCH_JOB_END_TIME=$(( $(date +%s) + 3600 ))
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)i"
export MASTER_ADDR
export MASTER_PORT=29500
export CUDA_VISIBLE_DEVICES=0,1,2,3

srun --ntasks-per-node=1 --cpu-bind=none --kill-on-bad-exit=1 \
  bash -c 'export DLAUNCH_NTASKS="$SLURM_NTASKS" DLAUNCH_TASK_ID="$SLURM_PROCID" DLAUNCH_LOCAL_TASK_ID="$SLURM_LOCALID" DLAUNCH_NODE_ID="$SLURM_NODEID" DLAUNCH_TASKS_PER_NODE="$SLURM_STEP_TASKS_PER_NODE"; exec "$@"' dlaunch-task \
  apptainer exec --nv --bind /scratch/runs/exp/run /images/current-deepspeed-x86_64.sif \
  bash -c 'trap "" USR1; exec "$@"' ignore-usr1 python -m torchrun_jsc "--nnodes=$SLURM_JOB_NUM_NODES" --nproc_per_node=4 --rdzv_backend=c10d "--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT" "--rdzv_id=$SLURM_JOB_ID" -m dlaunch.train \
  --framework deepspeed \
  --model resnet50 \
  --batch-size 64 \
  --steps 200 \
  --warmup-steps 20 \
  --channels-last \
  --metrics /scratch/runs/exp/run/metrics.jsonl \
  --checkpoint-dir /scratch/runs/exp/run/checkpoints
