"""The TensorFlow/Keras trainer (`python -m dlaunch.train.tf`, own environment: scripts/bootstrap-engines.sh).

Keras 2 (`tf-keras`, TF_USE_LEGACY_KERAS=1): with Keras 3, a 2-worker MultiWorkerMirroredStrategy
`model.fit` fails here ("unsupported type ... PerReplica"). Modes (dlaunch/train/engines.py): `tf-allreduce`
(MultiWorkerMirroredStrategy: synchronous collective all-reduce, every task a worker) and
`tf-ps-async` (ParameterServerStrategy: task 0 the chief/coordinator, one parameter server per node,
the other tasks workers; asynchronous: each scheduled step reads the current variables from the
servers and applies its gradients without waiting for the other workers, staleness unbounded).
`tf-ps-sync` (TF2 has no SyncReplicasOptimizer): the chief waits for one gradient per worker, computed on the
same variables, and applies their mean (staleness 0).
No Horovod mode: Horovod 0.28.1 does not build against TensorFlow 2.21 (horovod/tensorflow/xla_mpi_ops.cc
includes TF's xla/printer.h, which includes highwayhash/arch_specific.h, a header the tensorflow-cpu
wheel does not ship: "fatal error: highwayhash/arch_specific.h: No such file or directory").
"""
