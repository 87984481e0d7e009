"""The job as the trainer sees it: the neutral variables the batch script sets (torch-free, Python 3.9).

Every scheduler backend (dlaunch/schedulers/) says how its own variables map to these names, and the
rendered script sets them; this module is the only part of train/ that reads them, and nothing in
train/ reads a scheduler's own variables (SLURM_*, PBS_*, PALS_*, PMI_*).

Job level (exported by the batch script, the same in every task):
  DLAUNCH_SCHEDULER       the scheduler's kind (slurm, pbs, local...; provenance)
  DLAUNCH_JOB_ID          the batch job's id (a requeued job keeps it)
  DLAUNCH_RESTART_COUNT   how often the scheduler started this job again (0 or unset: the first time)
  DLAUNCH_RETRY           how often the job script started training again after a hang, on other nodes of its
                          allocation (pre-flight's retry, dlaunch/train/nodecheck.py; 0 or unset: not yet)
  DLAUNCH_NODELIST        the job's hosts, comma-separated, one per node, the first hosts rendezvous
  DLAUNCH_NNODES          the job's node count
  DLAUNCH_TASKS_PER_NODE  tasks of the step on each node, comma-separated, `N(xM)` = M nodes with N
                          (Slurm's notation, e.g. `3,2(x2)`)
Task level (set inside each task of the step):
  DLAUNCH_NTASKS          tasks of the step
  DLAUNCH_TASK_ID         this task's index, 0..NTASKS-1, numbered node by node
  DLAUNCH_LOCAL_TASK_ID   its index on its node
  DLAUNCH_NODE_ID         its node's index in DLAUNCH_NODELIST
"""

import re
import socket
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from dlaunch.train.config import ConfigError

SCHEDULER = "DLAUNCH_SCHEDULER"
JOB_ID = "DLAUNCH_JOB_ID"
RESTART_COUNT = "DLAUNCH_RESTART_COUNT"
RETRY = "DLAUNCH_RETRY"
NODELIST = "DLAUNCH_NODELIST"
NNODES = "DLAUNCH_NNODES"
TASKS_PER_NODE = "DLAUNCH_TASKS_PER_NODE"
NTASKS = "DLAUNCH_NTASKS"
TASK_ID = "DLAUNCH_TASK_ID"
LOCAL_TASK_ID = "DLAUNCH_LOCAL_TASK_ID"
NODE_ID = "DLAUNCH_NODE_ID"


def scheduler(environ: Mapping[str, str]) -> Optional[str]:
    """The kind of scheduler that started the job, None outside a dlaunch job."""
    return environ.get(SCHEDULER) or None


def job_id(environ: Mapping[str, str]) -> Optional[str]:
    """The batch job's id, None outside a job."""
    return environ.get(JOB_ID) or None


def restart_count(environ: Mapping[str, str]) -> int:
    """How often the scheduler started the job again (a requeue after a node failure or a preemption)."""
    return _times(environ, RESTART_COUNT)


def retry_count(environ: Mapping[str, str]) -> int:
    """How often the job script started training again after a hang (on other nodes of the allocation)."""
    return _times(environ, RETRY)


def _times(environ: Mapping[str, str], name: str) -> int:
    """A count that may be unset (0)."""
    text = environ.get(name, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ConfigError("%s=%r: not a count" % (name, text))
    return int(text)


def node_hosts(environ: Mapping[str, str]) -> List[str]:
    """One host name per node of the job, in the scheduler's order."""
    hosts = [h.strip() for h in environ.get(NODELIST, "").split(",") if h.strip()]
    if not hosts:
        raise ConfigError("%s is not set: start the tasks with a dlaunch job script" % NODELIST)
    return hosts


def expand_tasks_per_node(text: str) -> List[int]:
    """`3,2(x2)` -> [3, 2, 2]."""
    counts: List[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ConfigError("%s=%r: not the 'N(xM),...' form" % (TASKS_PER_NODE, text))
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


@dataclass(frozen=True)
class Task:
    """One task of the step: its index in the step and on its node, its node, the step's size."""

    task_id: int
    ntasks: int
    local_id: int
    node_id: int


def _count(environ: Mapping[str, str], name: str) -> int:
    text = environ.get(name, "").strip()
    if not text.isdigit():
        raise ConfigError(
            "%s must be set to a number (one task per process of a dlaunch job step), got %r" % (name, text)
        )
    return int(text)


def task(environ: Mapping[str, str]) -> Task:
    """This task; ConfigError naming the variable when it is missing or outside the step."""
    this = Task(
        _count(environ, TASK_ID), _count(environ, NTASKS), _count(environ, LOCAL_TASK_ID), _count(environ, NODE_ID)
    )
    if not 0 <= this.task_id < this.ntasks:
        raise ConfigError("%s %d outside %s %d" % (TASK_ID, this.task_id, NTASKS, this.ntasks))
    return this


def this_node(environ: Mapping[str, str]) -> str:
    """This task's node as the job names it (DLAUNCH_NODELIST at its DLAUNCH_NODE_ID: the name the scheduler takes in
    `--exclude` and `--nodelist`, whatever the host calls itself: JSC's nodes answer `hostname` with a domain), else
    the host's name (outside a job's step)."""
    try:
        return node_hosts(environ)[task(environ).node_id]
    except (ConfigError, IndexError):
        return socket.gethostname()


def task_count(environ: Mapping[str, str]) -> Optional[int]:
    """The step's task count, None when not set."""
    text = environ.get(NTASKS, "").strip()
    return int(text) if text.isdigit() else None


def tasks_per_node(environ: Mapping[str, str], ntasks: int, nodes: int) -> List[int]:
    """Tasks on each node: DLAUNCH_TASKS_PER_NODE, else `ntasks` spread evenly over `nodes`."""
    text = environ.get(TASKS_PER_NODE, "").strip()
    if text:
        return expand_tasks_per_node(text)
    if ntasks % nodes:
        raise ConfigError("%s %d does not divide over %d hosts; set %s" % (NTASKS, ntasks, nodes, TASKS_PER_NODE))
    return [ntasks // nodes] * nodes


def step_environment(task_id: int, ntasks: int, local_id: int, node_id: int) -> Dict[str, str]:
    """The task-level variables of one task (for a launcher that starts the tasks itself)."""
    return {NTASKS: str(ntasks), TASK_ID: str(task_id), LOCAL_TASK_ID: str(local_id), NODE_ID: str(node_id)}
