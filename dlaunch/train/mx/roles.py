"""A task's role as ps-lite's DMLC_* variables (torch- and mxnet-free, set before `import mxnet`)."""

import socket
from typing import Dict

from dlaunch.train.engines import COORDINATOR, SERVER, WORKER, TaskLayout

DMLC_ROLES = {COORDINATOR: "scheduler", SERVER: "server", WORKER: "worker"}


def dmlc_environment(layout: TaskLayout) -> Dict[str, str]:
    """ps-lite's variables: the scheduler's address (task 0), the counts, this task's role and address."""
    scheduler = layout.ids(COORDINATOR)[0]
    return {
        "DMLC_ROLE": DMLC_ROLES[layout.role],
        "DMLC_PS_ROOT_URI": socket.gethostbyname(layout.hosts[scheduler]),
        "DMLC_PS_ROOT_PORT": str(layout.ports[scheduler]),
        "DMLC_NUM_SERVER": str(len(layout.ids(SERVER))),
        "DMLC_NUM_WORKER": str(layout.num_workers),
        "DMLC_NODE_HOST": socket.gethostbyname(layout.hosts[layout.task]),
    }


def horovod_environment(layout: TaskLayout) -> Dict[str, str]:
    """Horovod's gloo variables for a worker (what horovodrun --gloo would set): the rendezvous at task 0's
    port, this task's rank among the workers, its node's and its cross-node place."""
    workers = layout.ids(WORKER)
    hosts = [layout.hosts[t] for t in workers]
    nodes = list(dict.fromkeys(hosts))
    host = layout.hosts[layout.task]
    local = [t for t in workers if layout.hosts[t] == host]
    local_rank = local.index(layout.task)
    cross = [n for n in nodes if sum(1 for h in hosts if h == n) > local_rank]
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": socket.gethostbyname(layout.hosts[workers[0]]),
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(layout.ports[workers[0]]),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_HOSTNAME": host,
        "HOROVOD_RANK": str(layout.worker_index),
        "HOROVOD_SIZE": str(len(workers)),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(len(local)),
        "HOROVOD_CROSS_RANK": str(cross.index(host)),
        "HOROVOD_CROSS_SIZE": str(len(cross)),
    }


def host_interface(host: str) -> str:
    """The network interface that carries `host`'s address (Horovod's gloo binds to one by name);
    GLOO_SOCKET_IFNAME (set by site profiles) wins."""
    import os

    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    import psutil  # a Horovod dependency

    address = socket.gethostbyname(host)
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return "lo" if address.startswith("127.") else "eth0"
