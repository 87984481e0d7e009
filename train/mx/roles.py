"""A task's role as ps-lite's DMLC_* variables (torch- and mxnet-free, set before `import mxnet`)."""
import socket
from typing import Dict

from train.engines import COORDINATOR, SERVER, WORKER, TaskLayout

DMLC_ROLES = {COORDINATOR: "scheduler", SERVER: "server", WORKER: "worker"}


def dmlc_environment(layout: TaskLayout) -> Dict[str, str]:
    """ps-lite's variables: the scheduler's address (task 0), the counts, this task's role and address."""
    scheduler = layout.ids(COORDINATOR)[0]
    return {"DMLC_ROLE": DMLC_ROLES[layout.role],
            "DMLC_PS_ROOT_URI": socket.gethostbyname(layout.hosts[scheduler]),
            "DMLC_PS_ROOT_PORT": str(layout.ports[scheduler]),
            "DMLC_NUM_SERVER": str(len(layout.ids(SERVER))), "DMLC_NUM_WORKER": str(layout.num_workers),
            "DMLC_NODE_HOST": socket.gethostbyname(layout.hosts[layout.task])}
