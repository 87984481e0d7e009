#!/bin/bash
#SBATCH --job-name=exp-run
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=7
#SBATCH --partition=standard-g
#SBATCH --time=01:00:00
#SBATCH --account=proj42
#SBATCH --gpus-per-node=8
#SBATCH --output=/scratch/runs/exp/run/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=USR1@120
# rendered by the tests
set -eo pipefail

module load LUMI partition/G aws-ofi-rccl
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
export GLOO_SOCKET_IFNAME=hsn0
export NCCL_NET_GDR_LEVEL=3
export CXI_FORK_SAFE=1
export CXI_FORK_SAFE_HP=1
export FI_CXI_DISABLE_CQ_HUGETLB=1
export FI_PROVIDER=cxi
export NCCL_NET='AWS Libfabric'
export MIOPEN_USER_DB_PATH="/tmp/$USER-miopen-cache-$SLURM_JOB_ID"
export MIOPEN_CUSTOM_CACHE_DIR="/tmp/$USER-miopen-cache-$SLURM_JOB_ID"
export DLAUNCH_SITE=lumi-g
export DLAUNCH_SCHEDULER=slurm
export DLAUNCH_IMAGE=/images/rocm-deepspeed-x86_64.sif
export DLAUNCH_GIT_REVISION=0000000000000000000000000000000000000000
export DLAUNCH_EXPERIMENT=exp
export DLAUNCH_RUN_DIR=/scratch/runs/exp/run
cd -- /scratch/runs/exp/run
: "${EBROOTAWSMINOFIMINRCCL:?is not set: nccl_net_plugin.library_dir needs it (load the module that sets it)}"
export SINGULARITYENV_LD_LIBRARY_PATH=/opt/cray/libfabric/1.15.2.0/lib64:/usr/lib64"${SINGULARITYENV_LD_LIBRARY_PATH:+:$SINGULARITYENV_LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH="$EBROOTAWSMINOFIMINRCCL/lib""${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SINGULARITYENV_LD_LIBRARY_PATH="$EBROOTAWSMINOFIMINRCCL/lib""${SINGULARITYENV_LD_LIBRARY_PATH:+:$SINGULARITYENV_LD_LIBRARY_PATH}"
export DLAUNCH_JOB_ID="$SLURM_JOB_ID"
export DLAUNCH_RESTART_COUNT="$SLURM_RESTART_COUNT"
export DLAUNCH_NNODES="$SLURM_JOB_NUM_NODES"
DLAUNCH_NODELIST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)"
export DLAUNCH_NODELIST
echo "dlaunch: job $SLURM_JOB_ID attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )) on $SLURM_JOB_NODELIST at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"
export DLAUNCH_JOB_END_TIME=$(( $(date +%s) + 3600 ))
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
export MASTER_ADDR
export MASTER_PORT=29500

srun --ntasks-per-node=8 --kill-on-bad-exit=1 --cpu-bind=mask_cpu:0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000 \
  bash -c 'export DLAUNCH_NTASKS="$SLURM_NTASKS" DLAUNCH_TASK_ID="$SLURM_PROCID" DLAUNCH_LOCAL_TASK_ID="$SLURM_LOCALID" DLAUNCH_NODE_ID="$SLURM_NODEID" DLAUNCH_TASKS_PER_NODE="$SLURM_STEP_TASKS_PER_NODE"; exec "$@"' dlaunch-task \
  singularity exec --rocm --bind "/var/spool/slurmd,/opt/cray,/usr/lib64/libcxi.so.1,/scratch/runs/exp/run,$EBROOTAWSMINOFIMINRCCL/lib" /images/rocm-deepspeed-x86_64.sif \
  python -m dlaunch.train \
  --framework deepspeed \
  --model resnet50 \
  --batch-size 64 \
  --steps 200 \
  --warmup-steps 20 \
  --channels-last \
  --metrics /scratch/runs/exp/run/metrics.jsonl \
  --checkpoint-dir /scratch/runs/exp/run/checkpoints
