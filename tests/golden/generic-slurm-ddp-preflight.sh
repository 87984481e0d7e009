#!/bin/bash
#SBATCH --job-name=exp-run
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --partition=gpu
#SBATCH --time=01:00:00
#SBATCH --account=proj42
#SBATCH --gres=gpu:4
#SBATCH --output=/scratch/runs/exp/run/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=USR1@120
# rendered by the tests
set -eo pipefail

export NCCL_DEBUG=WARN
export DLAUNCH_SITE=generic-slurm
export DLAUNCH_SCHEDULER=slurm
export DLAUNCH_IMAGE=/images/current-ddp-x86_64.sif
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
srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --cpu-bind=none --time=5 bash -c 'export DLAUNCH_NTASKS="$SLURM_NTASKS" DLAUNCH_TASK_ID="$SLURM_PROCID" DLAUNCH_LOCAL_TASK_ID="$SLURM_LOCALID" DLAUNCH_NODE_ID="$SLURM_NODEID" DLAUNCH_TASKS_PER_NODE="$SLURM_STEP_TASKS_PER_NODE"; exec "$@"' dlaunch-task apptainer exec --nv --bind /scratch/runs/exp/run /images/current-ddp-x86_64.sif python -m dlaunch.train.nodecheck check --dir /scratch/runs/exp/run/preflight --attempt "$DLAUNCH_JOB_ID.$DLAUNCH_RESTART_COUNT" || echo "dlaunch: pre-flight check step ended with exit $?" >&2
DLAUNCH_FABRIC_HOST="$(scontrol show hostnames "$DLAUNCH_NODELIST" | sed -n 1p)"
export DLAUNCH_FABRIC_HOST
srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --cpu-bind=none --time=5 bash -c 'export DLAUNCH_NTASKS="$SLURM_NTASKS" DLAUNCH_TASK_ID="$SLURM_PROCID" DLAUNCH_LOCAL_TASK_ID="$SLURM_LOCALID" DLAUNCH_NODE_ID="$SLURM_NODEID" DLAUNCH_TASKS_PER_NODE="$SLURM_STEP_TASKS_PER_NODE"; exec "$@"' dlaunch-task apptainer exec --nv --bind /scratch/runs/exp/run /images/current-ddp-x86_64.sif python -m dlaunch.train.nodecheck fabric --dir /scratch/runs/exp/run/preflight --attempt "$DLAUNCH_JOB_ID.$DLAUNCH_RESTART_COUNT" --master "$DLAUNCH_FABRIC_HOST" --port 29501 || echo "dlaunch: pre-flight check step ended with exit $?" >&2
export DLAUNCH_ALLOCATED="$DLAUNCH_NODELIST"
DLAUNCH_NODELIST="$(srun --nodes=1 --ntasks=1 apptainer exec --nv --bind /scratch/runs/exp/run /images/current-ddp-x86_64.sif python -m dlaunch.train.nodecheck select --dir /scratch/runs/exp/run/preflight --attempt "$DLAUNCH_JOB_ID.$DLAUNCH_RESTART_COUNT" --hosts "$DLAUNCH_NODELIST" --nodes 2 --min-fraction 0.5 --fabric-min-fraction 0.25 --record /scratch/runs/exp/run/preflight.json)"
DLAUNCH_NODELIST="${DLAUNCH_NODELIST%% *}"
export DLAUNCH_NODELIST
export DLAUNCH_NNODES=2
MASTER_ADDR="$(scontrol show hostnames "$DLAUNCH_NODELIST" | sed -n 1p)"
export MASTER_ADDR
export MASTER_PORT=29500

DLAUNCH_RETRY=0
while :; do
export DLAUNCH_RETRY
DLAUNCH_STEP_STARTED=$(date +%s)
export DLAUNCH_STEP_STARTED
DLAUNCH_EXIT=0
srun --ntasks-per-node=1 --cpu-bind=none --kill-on-bad-exit=1 --nodes=2 --ntasks=2 "--nodelist=$DLAUNCH_NODELIST" \
  bash -c 'export DLAUNCH_NTASKS="$SLURM_NTASKS" DLAUNCH_TASK_ID="$SLURM_PROCID" DLAUNCH_LOCAL_TASK_ID="$SLURM_LOCALID" DLAUNCH_NODE_ID="$SLURM_NODEID" DLAUNCH_TASKS_PER_NODE="$SLURM_STEP_TASKS_PER_NODE"; exec "$@"' dlaunch-task \
  apptainer exec --nv --bind /scratch/runs/exp/run /images/current-ddp-x86_64.sif \
  bash -c 'trap "" USR1; exec "$@"' ignore-usr1 torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d "--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT" "--rdzv_id=$SLURM_JOB_ID" -m dlaunch.train \
  --framework ddp \
  --model resnet50 \
  --batch-size 64 \
  --steps 200 \
  --warmup-steps 20 \
  --channels-last \
  --metrics /scratch/runs/exp/run/metrics.jsonl \
  --checkpoint-dir /scratch/runs/exp/run/checkpoints || DLAUNCH_EXIT=$?
if [ "$DLAUNCH_EXIT" = 0 ] || [ "$DLAUNCH_RETRY" -ge 1 ] || [ ! -e /scratch/runs/exp/run/hang.json ]; then exit "$DLAUNCH_EXIT"; fi
DLAUNCH_RETRY=$(( DLAUNCH_RETRY + 1 ))
if ! DLAUNCH_NODELIST="$(srun --nodes=1 --ntasks=1 apptainer exec --nv --bind /scratch/runs/exp/run /images/current-ddp-x86_64.sif python -m dlaunch.train.nodecheck select --dir /scratch/runs/exp/run/preflight --attempt "$DLAUNCH_JOB_ID.$DLAUNCH_RESTART_COUNT" --hosts "$DLAUNCH_ALLOCATED" --nodes 2 --min-fraction 0.5 --fabric-min-fraction 0.25 --record /scratch/runs/exp/run/preflight.json --after-hang /scratch/runs/exp/run/hang.json --since "$DLAUNCH_STEP_STARTED" --retry "$DLAUNCH_RETRY")"; then exit "$DLAUNCH_EXIT"; fi
DLAUNCH_NODELIST="${DLAUNCH_NODELIST%% *}"
export DLAUNCH_NODELIST
echo "dlaunch: training hung (/scratch/runs/exp/run/hang.json); retry $DLAUNCH_RETRY of 1 from the checkpoint on $DLAUNCH_NODELIST" >&2
export DLAUNCH_NNODES=2
MASTER_ADDR="$(scontrol show hostnames "$DLAUNCH_NODELIST" | sed -n 1p)"
export MASTER_ADDR
export MASTER_PORT=29500
done
