"""What the task-per-worker engines (dlaunch/train/tf, dlaunch/train/mx, dlaunch/train/frameworks/torch_ps.py) share, torch-free.

- the task-per-worker modes (rows of dlaunch/train/framework_table.py) and the trainer's flags for an engine (`engine_config`: dlaunch/train/config.py's flags
  and validation, with `--framework` one of the engine's modes and the flags it cannot honour refused);
- each task's role from the job's neutral variables alone (`task_layout`, dlaunch/train/jobenv.py; no
  hand-written cluster spec);
- the image folder's files and labels (`folder_files`), in the order torchvision's ImageFolder uses.
(A step of such tasks on this machine: `dlaunch run --site local`, dlaunch/schedulers/local.py.)

Roles:

The task-per-worker launch (`srun python -m dlaunch.train.tf ...`, one task per process) starts the
coordinator (TensorFlow's chief, MXNet's scheduler), the parameter servers and the workers as tasks
of one step; each task derives its role from its task id:
  task ids 0..C-1 are the coordinators; on every node, the first `servers_per_node` remaining tasks
  are servers; all others are workers (worker index in task-id order).
Hosts: `DLAUNCH_NODELIST`; tasks per node: `DLAUNCH_TASKS_PER_NODE` (else spread evenly); this task:
`DLAUNCH_TASK_ID` of `DLAUNCH_NTASKS` (dlaunch/train/jobenv.py); tasks are numbered node by node (srun's
default block distribution). Each task's port is `DLAUNCH_ENGINE_PORT` (default `MASTER_PORT` + 1,
else 29600) + its index on its node.
Torch-free, stdlib-only.
"""

import math
import os
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from dlaunch.train import jobenv
from dlaunch.train.config import IMAGE_EXTENSIONS, ConfigError, TrainConfig, count_image_folder_classes, parse_config
from dlaunch.train.framework_table import FrameworkInfo, task_per_worker

COORDINATOR, SERVER, WORKER = "coordinator", "server", "worker"
DEFAULT_PORT = 29600
ENGINE_PORT = "DLAUNCH_ENGINE_PORT"  # the port base of the step's tasks (a launcher that starts them may set it)


@dataclass(frozen=True)
class TaskLayout:
    """Every task of the step: host, port and role (index = task id), and this task's id."""

    hosts: Tuple[str, ...]
    ports: Tuple[int, ...]
    roles: Tuple[str, ...]
    task: int

    @property
    def role(self) -> str:
        return self.roles[self.task]

    def ids(self, role: str) -> List[int]:
        return [t for t, r in enumerate(self.roles) if r == role]

    def addresses(self, role: str) -> List[str]:
        return ["%s:%d" % (self.hosts[t], self.ports[t]) for t in self.ids(role)]

    @property
    def worker_index(self) -> int:
        """This task's place among the workers (ValueError for a coordinator or server)."""
        return self.ids(WORKER).index(self.task)

    @property
    def num_workers(self) -> int:
        return len(self.ids(WORKER))

    def threads(self, requested: Optional[int], cpus: Optional[int] = None) -> int:
        """This task's CPU threads (`threads_per_rank`): --threads, else its CPUs (`cpus`: its affinity) shared by the
        most tasks any node of the step holds, the same on every node."""
        return threads_per_rank(requested, max(self.hosts.count(host) for host in self.hosts), cpus)

    @property
    def worker_hosts(self) -> List[str]:
        return [self.hosts[t] for t in self.ids(WORKER)]


def threads_per_rank(requested: Optional[int], ranks_per_node: int, cpus: Optional[int] = None) -> int:
    """The CPU threads of a rank (torch's, TensorFlow's and MXNet's intra-op threads), one rule for every trainer:
    --threads where given, else the CPUs this process may use (`cpus`, default its affinity) divided by
    `ranks_per_node`, the most ranks (tasks) any node of the job holds, so that every rank of one job gets the same
    count whatever its node holds (a parameter-server job's first node also holds the coordinator). The default
    still depends on the job's ranks per node (a 1-process run here gets 2 threads, each of 2 processes 1): the
    header records the count (`threads`), and runs that differ are never one scaling curve (dlaunch report)."""
    if requested:
        return requested
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(1, ranks_per_node))


def task_layout(environ: Mapping[str, str], coordinators: int = 0, servers_per_node: int = 0) -> TaskLayout:
    """The step's layout from the job's neutral variables; ConfigError (one line) when it does not add up."""
    this = jobenv.task(environ)
    ntasks = this.ntasks
    hosts = jobenv.node_hosts(environ)
    per_node = jobenv.tasks_per_node(environ, ntasks, len(hosts))
    if len(per_node) != len(hosts) or sum(per_node) != ntasks:
        raise ConfigError(
            "tasks per node %s do not match %d hosts and %s %d" % (per_node, len(hosts), jobenv.NTASKS, ntasks)
        )
    base = int(environ.get(ENGINE_PORT) or int(environ.get("MASTER_PORT") or DEFAULT_PORT - 1) + 1)
    task_hosts: List[str] = []
    ports: List[int] = []
    roles: List[str] = []
    for host, count in zip(hosts, per_node):
        servers_here = 0
        for local in range(count):
            task_hosts.append(host)
            ports.append(base + local)
            if len(roles) < coordinators:
                roles.append(COORDINATOR)
            elif servers_here < servers_per_node:
                roles.append(SERVER)
                servers_here += 1
            else:
                roles.append(WORKER)
    if WORKER not in roles:
        raise ConfigError(
            "%d tasks leave no worker after %d coordinator(s) and %d server(s) per node"
            % (ntasks, coordinators, servers_per_node)
        )
    return TaskLayout(tuple(task_hosts), tuple(ports), tuple(roles), this.task_id)


def mode_settings(mode: FrameworkInfo) -> Dict[str, Any]:
    """What the metrics header's framework_settings records about a task-per-worker mode."""
    return {
        "engine": mode.engine,
        "mode": mode.name,
        "architecture": mode.architecture,
        "asynchronous": not mode.synchronous,
        "coordinators": mode.coordinators,
        "servers_per_node": mode.servers_per_node,
    }


def engine_mode(name: str, engine: str) -> FrameworkInfo:
    """The mode `--framework name` of `engine`; ConfigError naming the flag when unknown or refused."""
    modes = task_per_worker()
    mode = modes.get(name)
    choices = ", ".join(n for n, m in modes.items() if m.engine == engine and not m.refused)
    if mode is None or mode.engine != engine:
        raise ConfigError("--framework %s: not a %s mode (choose from %s)" % (name, engine, choices))
    if mode.refused:
        raise ConfigError("--framework %s: refused: %s" % (name, mode.refused))
    return mode


def engine_config(
    argv: List[str], engine: str, environ: Mapping[str, str]
) -> Tuple[TrainConfig, FrameworkInfo, TaskLayout]:
    """dlaunch/train/config.py's parsing and validation for a TensorFlow or MXNet task, whose `--framework` is
    one of the engine's modes, and the task's place; flags those trainers do not implement are refused,
    naming the flag. Only the task that writes the metrics file refuses an existing one (the others may
    start after it has written its header)."""
    argv = list(argv)
    name = None
    for i, token in enumerate(argv):
        if token == "--framework" and i + 1 < len(argv):
            name = argv[i + 1]
            del argv[i : i + 2]
            break
        if token.startswith("--framework="):
            name = token.split("=", 1)[1]
            del argv[i]
            break
    if name is None:
        raise ConfigError(
            "--framework is required (choose from %s)"
            % ", ".join(n for n, m in task_per_worker().items() if m.engine == engine and not m.refused)
        )
    mode = engine_mode(name, engine)
    layout = task_layout(environ, mode.coordinators, mode.servers_per_node)
    writes = layout.task == layout.ids(mode.writer)[0]
    cfg = parse_config(argv, check_paths=writes, engine=engine)
    if not writes and not cfg.synthetic:
        cfg = replace(cfg, num_classes=count_image_folder_classes(cfg.data))
    cfg = replace(cfg, framework=name)
    return cfg, mode, layout


class NonfiniteStreak:
    """Consecutive non-finite losses; the run diverged once `--max-nonfinite-steps` of them came in a row."""

    def __init__(self) -> None:
        self.current = self.longest = 0

    def count(self, loss: float) -> None:
        self.current = 0 if math.isfinite(loss) else self.current + 1
        self.longest = max(self.longest, self.current)

    def diverged(self, cfg: TrainConfig) -> bool:
        return self.longest >= cfg.max_nonfinite_steps


def end_reason(status: str, cfg: TrainConfig, step: int, trainer: str) -> Optional[str]:
    """The end record's reason of a run that did not end `ok` (these trainers keep no checkpoints)."""
    if status == "diverged":
        return "the loss was not finite for %d consecutive steps (by step %d)" % (cfg.max_nonfinite_steps, step)
    if status in ("interrupted", "cancelled"):
        return "stopped by a signal at step %d; the %s trainer writes no checkpoint" % (step, trainer)
    return None


def folder_files(root: str, split: str) -> Tuple[List[str], List[int]]:
    """Image paths and class indices of `root/split` (classes and files in sorted order)."""
    split_dir = os.path.join(root, split)
    classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    paths: List[str] = []
    labels: List[int] = []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(split_dir, name))):
            if file.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(os.path.join(split_dir, name, file))
                labels.append(label)
    return paths, labels
