#!/bin/bash
#SBATCH --job-name=exp-run
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=7
#SBATCH --partition=batch
#SBATCH --time=01:00:00
#SBATCH --account=proj42
#SBATCH --gpus-per-node=8
#SBATCH --output=/scratch/runs/exp/run/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=USR1@120
#SBATCH --network=disable_rdzv_get
# rendered by the tests
set -eo pipefail

module load rocm/6.4.2 rccl-net-plugin olcf-container-tools apptainer-enable-mpi
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
export GLOO_SOCKET_IFNAME=hsn0
export NCCL_NET_GDR_LEVEL=PHB
export NCCL_CROSS_NIC=1
export HSA_FORCE_FINE_GRAIN_PCIE=1
export FI_MR_CACHE_MONITOR=kdreg2
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_CXI_DEFAULT_CQ_SIZE=131072
export FI_CXI_RDZV_PROTO=alt_read
export FI_CXI_RDZV_EAGER_SIZE=0
export FI_CXI_RDZV_THRESHOLD=0
export FI_CXI_RDZV_GET_MIN=0
export FI_CXI_DEFAULT_TX_SIZE=2048
export FI_CXI_RX_MATCH_MODE=hybrid
export MIOPEN_USER_DB_PATH=/tmp/miopen-cache
export MIOPEN_CUSTOM_CACHE_DIR=/tmp/miopen-cache
export NCCL_NET=OFI
export DLAUNCH_SITE=frontier
export DLAUNCH_SCHEDULER=slurm
export DLAUNCH_IMAGE=/images/rocm-horovod-x86_64.sif
export DLAUNCH_GIT_REVISION=0000000000000000000000000000000000000000
export DLAUNCH_EXPERIMENT=exp
export DLAUNCH_RUN_DIR=/scratch/runs/exp/run
cd -- /scratch/runs/exp/run
: "${OLCF_OFI_NCCL_ROOT:?is not set: nccl_net_plugin.library_dir needs it (load the module that sets it)}"
export LD_LIBRARY_PATH="$OLCF_OFI_NCCL_ROOT/lib""${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export APPTAINERENV_LD_LIBRARY_PATH="$OLCF_OFI_NCCL_ROOT/lib""${APPTAINERENV_LD_LIBRARY_PATH:+:$APPTAINERENV_LD_LIBRARY_PATH}"
export DLAUNCH_JOB_ID="$SLURM_JOB_ID"
export DLAUNCH_RESTART_COUNT="$SLURM_RESTART_COUNT"
export DLAUNCH_NNODES="$SLURM_JOB_NUM_NODES"
DLAUNCH_NODELIST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)"
export DLAUNCH_NODELIST
echo "dlaunch: job $SLURM_JOB_ID attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )) on $SLURM_JOB_NODELIST at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"
export DLAUNCH_JOB_END_TIME=$(( $(date +%s) + 3600 ))

srun --ntasks-per-node=8 --mpi=pmix --kill-on-bad-exit=1 --gpus-per-task=1 --gpu-bind=closest \
  bash -c 'export DLAUNCH_NTASKS="$SLURM_NTASKS" DLAUNCH_TASK_ID="$SLURM_PROCID" DLAUNCH_LOCAL_TASK_ID="$SLURM_LOCALID" DLAUNCH_NODE_ID="$SLURM_NODEID" DLAUNCH_TASKS_PER_NODE="$SLURM_STEP_TASKS_PER_NODE"; exec "$@"' dlaunch-task \
  apptainer exec --rocm --bind "/scratch/runs/exp/run,$OLCF_OFI_NCCL_ROOT/lib" /images/rocm-horovod-x86_64.sif \
  python -m dlaunch.train \
  --framework horovod \
  --model resnet50 \
  --batch-size 64 \
  --steps 200 \
  --warmup-steps 20 \
  --channels-last \
  --metrics /scratch/runs/exp/run/metrics.jsonl \
  --checkpoint-dir /scratch/runs/exp/run/checkpoints
