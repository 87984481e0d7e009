"""The MXNet (Gluon) trainer (`python -m dlaunch.train.mx`, own environment: scripts/bootstrap-engines.sh; mxnet
1.9.1 needs numpy < 1.24).

Modes (dlaunch/train/engines.py): `mx-ps-sync` and `mx-ps-async`, MXNet's key-value store `dist_sync` /
`dist_async`: task 0 is the scheduler, one server per node, the other tasks workers (DMLC_* variables
set by dlaunch/train/mx/__main__.py from the task's role). The optimizer runs on the servers
(update_on_kvstore): synchronous, a server applies the sum of all workers' gradients once per step;
asynchronous, each worker's gradients as they arrive (staleness unbounded). `mx-allreduce`: Horovod
0.28.1 (built against MXNet 1.9.1 by scripts/bootstrap-engines.sh) over gloo, workers only, the
rendezvous served by the first worker; MXNet's oneDNN kernels are off in that mode (Horovod cannot
reduce oneDNN arrays), so its images/s are not comparable with the key-value store modes'.
"""
