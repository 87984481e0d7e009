#!/bin/bash
#PBS -N exp-run
#PBS -l select=2:system=polaris
#PBS -l walltime=1:00:00
#PBS -q debug
#PBS -A proj42
#PBS -o /scratch/runs/exp/run/pbs.out
#PBS -j oe
#PBS -k doe
#PBS -r y
#PBS -l filesystems=home:eagle
#PBS -l place=scatter
# rendered by the tests
set -eo pipefail

module use /soft/modulefiles
module load spack-pe-base apptainer
export NCCL_NET='AWS Libfabric'
export NCCL_NET_GDR_LEVEL=PHB
export NCCL_CROSS_NIC=1
export NCCL_COLLNET_ENABLE=1
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_MR_CACHE_MONITOR=userfaultfd
export FI_CXI_DEFAULT_CQ_SIZE=131072
export DLAUNCH_SITE=polaris
export DLAUNCH_SCHEDULER=pbs
export DLAUNCH_IMAGE=/images/current-horovod-x86_64.sif
export DLAUNCH_GIT_REVISION=0000000000000000000000000000000000000000
export DLAUNCH_EXPERIMENT=exp
export DLAUNCH_RUN_DIR=/scratch/runs/exp/run
cd -- /scratch/runs/exp/run
export LD_LIBRARY_PATH=/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export APPTAINERENV_LD_LIBRARY_PATH=/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib"${APPTAINERENV_LD_LIBRARY_PATH:+:$APPTAINERENV_LD_LIBRARY_PATH}"
export DLAUNCH_JOB_ID="$PBS_JOBID"
DLAUNCH_RESTART_COUNT="$(grep -cxF "$PBS_JOBID" /scratch/runs/exp/run/pbs-attempts 2>/dev/null || true)"
echo "$PBS_JOBID" >> /scratch/runs/exp/run/pbs-attempts
export DLAUNCH_RESTART_COUNT
export DLAUNCH_NNODES=2
DLAUNCH_NODELIST="$(cat "$PBS_NODEFILE" | paste -sd, -)"
export DLAUNCH_NODELIST
export DLAUNCH_NTASKS=8
export DLAUNCH_TASKS_PER_NODE='4(x2)'
echo "dlaunch: job $DLAUNCH_JOB_ID attempt $(( ${DLAUNCH_RESTART_COUNT:-0} + 1 )) on $DLAUNCH_NODELIST at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
export DLAUNCH_JOB_END_TIME=$(( $(date +%s) + 3600 ))

mpiexec -n 8 --ppn 4 --depth=16 --cpu-bind depth \
  bash -c 'export DLAUNCH_TASK_ID="$PALS_RANKID" DLAUNCH_LOCAL_TASK_ID="$PALS_LOCAL_RANKID" DLAUNCH_NODE_ID="$PALS_NODEID"; exec "$@"' dlaunch-task \
  apptainer exec --nv --bind /opt,/var/run/palsd,/soft/libraries/hwloc/lib,/scratch/runs/exp/run,/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib /images/current-horovod-x86_64.sif \
  python -m dlaunch.train \
  --framework horovod \
  --model resnet50 \
  --batch-size 64 \
  --steps 200 \
  --warmup-steps 20 \
  --channels-last \
  --metrics /scratch/runs/exp/run/metrics.jsonl \
  --checkpoint-dir /scratch/runs/exp/run/checkpoints
