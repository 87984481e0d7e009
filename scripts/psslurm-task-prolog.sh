#!/bin/bash
# The test cluster's TaskProlog (scripts/slurm-cluster.sh): on its partition `psslurm`, the GPU binding of
# ParaStation's psslurm, the slurmd of JSC's systems (github.com/ParaStation/psmgmt @c4fcc57,
# plugins/psslurm/src/psslurm/psslurmenv.c: setGResJobEnv, setGPUEnv; bin/daemon/psidpin.c: PSIDpin_checkAutoVar).
# Slurm runs it before every task, the batch script's included, and adds its `export NAME=value` and
# `unset NAME` lines to the task's environment (slurm.conf: TaskProlog).
#  - The batch script gets its node's GPUs, padded with blanks, in CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL,
#    and the same value in __AUTO_<NAME> (the padding tells psslurm's step code that the user left them alone),
#    unless the submitting environment set them; and SLURM_JOB_GPUS.
#  - Each task of a step: PSSLURM_BIND_GPUS is the GPU psslurm binds it to: the task's own (round robin by local
#    id; psslurm takes the least used of its closest, which with no topology here is the same) or, for the only
#    task of the step on its node, all of them. CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL become that value
#    where unset or still equal to __AUTO_<NAME>; a value the job script set is kept. __AUTO_<NAME> goes.
# The node's GPUs are pretend ones, as many as the file psslurm-gpus beside this script says, and all of them
# the job's (JSC hands out its GPU nodes whole). Not Slurm's GRES: its gres/gpu plugin drops the job script's
# CUDA_VISIBLE_DEVICES from a step's environment before this script could keep it.
[ "${SLURM_JOB_PARTITION:-}" = psslurm ] || exit 0
gpus=$(cat "$(dirname "$0")/psslurm-gpus" 2>/dev/null || echo 0)
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || exit 0
all=$(seq -s, 0 $((gpus - 1)))
readonly VARS="CUDA_VISIBLE_DEVICES GPU_DEVICE_ORDINAL"

if [ -z "${SLURM_STEP_ID+set}" ]; then   # the batch script (Slurm 22.05 gives its TaskProlog no step id)
  echo "export SLURM_JOB_GPUS=$all"
  for name in $VARS; do
    [ -z "${!name+set}" ] || continue   # set by the user before sbatch: psslurm leaves it
    echo "export $name=$all     "
    echo "export __AUTO_$name=$all     "
  done
  exit 0
fi

# The step's tasks on this node: SLURM_STEP_TASKS_PER_NODE lists them per node, `2(x3),1` for 2,2,2,1.
here=0 node=0
IFS=, read -ra counts <<< "${SLURM_STEP_TASKS_PER_NODE:-1}"
for entry in "${counts[@]}"; do
  count=${entry%%(*} times=1
  [ "$entry" = "$count" ] || { times=${entry#*(x}; times=${times%)}; }
  if [ "${SLURM_NODEID:-0}" -lt $((node + times)) ]; then here=$count; break; fi
  node=$((node + times))
done
if [ "$here" -eq 1 ]; then bind=$all; else bind=$(( ${SLURM_LOCALID:-0} % gpus )); fi
echo "export PSSLURM_BIND_GPUS=$bind"
for name in $VARS; do
  auto=__AUTO_$name
  if [ -z "${!name+set}" ] || { [ -n "${!auto+set}" ] && [ "${!name}" = "${!auto}" ]; }; then
    echo "export $name=$bind"
  fi
  echo "unset $auto"
done
