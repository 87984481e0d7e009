"""Profile + request -> `LaunchPlan`: every decision about a job, before any text is rendered."""
import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from launcher.errors import DlaunchError
from launcher.launchers import launch_mode
from launcher.request import SAFE_NAME, LaunchRequest, trainer_arguments
from launcher.runtimes import runtime_for
from launcher.sites import BIND_PATH, Site, format_time, parse_time
from train.config import ConfigError, parse_config

SIGNAL_LEAD_S = 120  # seconds before the time limit at which the job is told to checkpoint
# The first line of every attempt in the job's log (a requeued job appends to the same file).
ATTEMPT_BANNER = ('echo "dlaunch: job $SLURM_JOB_ID attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )) on '
                  '$SLURM_JOB_NODELIST at $(date -u +%Y-%m-%dT%H:%M:%SZ)"')
BINDABLE = re.compile(BIND_PATH)


@dataclass(frozen=True)
class LaunchPlan:
    site: str
    scheduler: str
    framework: str
    nodes: int
    nproc_per_node: int
    run_dir: str
    image: Optional[str]
    sbatch: Tuple[str, ...]  # directives, without `#SBATCH `
    modules: Tuple[str, ...]
    env: Tuple[Tuple[str, str], ...]
    prelude: Tuple[str, ...]
    srun_args: Tuple[str, ...]
    container_prefix: Tuple[str, ...]
    launch_prefix: Tuple[str, ...]
    trainer_argv: Tuple[str, ...]
    warnings: Tuple[str, ...] = ()  # for the user, before submission; nothing in the script

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_account(site: Site, account: Optional[str], environ: Mapping[str, str], required: bool = True) -> Optional[str]:
    """`--account`, else the site's account variable (e.g. $BUDGET); never hard-coded."""
    if account is None and site.account_env:
        account = environ.get(site.account_env) or None
    if site.scheduler != "slurm":
        return None
    if account is None and site.account_required and required:
        hint = " or set $%s" % site.account_env if site.account_env else ""
        raise DlaunchError("--account: site %s needs an account: pass --account%s" % (site.name, hint))
    if account is not None and not SAFE_NAME.match(account):
        raise DlaunchError("--account: %r may only contain letters, digits and _.+-" % account)
    return account


def _bindable(flag: str, path: str) -> str:
    if not BINDABLE.match(path):
        raise DlaunchError("%s: %r has characters a Slurm/container path cannot carry (use letters, digits, _./+@=-)" % (flag, path))
    return path


def _shape(site: Site, request: LaunchRequest) -> Tuple[int, int]:
    """(nodes, processes per node) from --nodes or --gpus."""
    if site.scheduler == "local":
        if request.nodes not in (None, 1):
            raise DlaunchError("--nodes: site %s runs on this machine only (1 node), got %d" % (site.name, request.nodes))
        return 1, request.gpus or site.gpus_per_node
    if request.nodes is not None and request.gpus is not None:  # e.g. 2 GPUs on each of 2 nodes
        per_node, rest = divmod(request.gpus, request.nodes)
        if rest or not 1 <= per_node <= site.gpus_per_node:
            raise DlaunchError("--gpus: %d GPUs do not spread evenly over --nodes %d with 1 to %d per node (site %s)"
                               % (request.gpus, request.nodes, site.gpus_per_node, site.name))
        return request.nodes, per_node
    if request.gpus is not None and request.nodes is None:
        if request.gpus < site.gpus_per_node:
            return 1, request.gpus
        if request.gpus % site.gpus_per_node:
            raise DlaunchError("--gpus: %d is not a multiple of the %d GPUs per node of site %s" % (request.gpus, site.gpus_per_node, site.name))
        return request.gpus // site.gpus_per_node, site.gpus_per_node
    return request.nodes or 1, site.gpus_per_node


def build_plan(site: Site, request: LaunchRequest, *, run_dir: str, git_revision: Optional[str],
               image: Optional[str], environ: Mapping[str, str], require_account: bool = True) -> LaunchPlan:
    """Validate the request against the site and decide everything the script will contain.

    `require_account=False` (dry runs) renders a script without `--account` where none is known.
    """
    nodes, nproc = _shape(site, request)
    spec = launch_mode(site.scheduler, request.framework).spec(site, nproc)
    runtime = runtime_for(site.container)
    experiment = request.experiment or "default"
    data = request.option("data")
    sbatch: Tuple[str, ...] = ()
    binds: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()
    if site.scheduler == "slurm":
        _bindable("--output", run_dir)
        partition = site.partition(request.partition)
        if nodes > partition.max_nodes:
            raise DlaunchError("--nodes: %d exceeds the %d nodes of partition %s (site %s)" % (nodes, partition.max_nodes, partition.name, site.name))
        try:
            seconds = parse_time(request.time)
        except ValueError as e:
            raise DlaunchError("--time: %s" % e) from None
        if seconds > partition.max_seconds:
            raise DlaunchError("--time: %s exceeds the limit %s of partition %s (site %s)" % (format_time(seconds), partition.max_time, partition.name, site.name))
        account = resolve_account(site, request.account, environ, required=require_account)
        if seconds < 2 * SIGNAL_LEAD_S:
            warnings += ("--time %s leaves less than twice the %d s warning before the limit: the job may get no "
                         "checkpoint warning (Slurm sends it up to a minute early or late)" % (format_time(seconds), SIGNAL_LEAD_S),)
        requeue = site.requeue if request.requeue is None else request.requeue
        sbatch = (
            "--job-name=%s" % experiment,
            "--nodes=%d" % nodes,
            "--ntasks-per-node=%d" % spec.tasks_per_node,
            "--cpus-per-task=%d" % spec.cpus_per_task,
            "--%s=%s" % (site.partition_directive, partition.name),
            "--time=%s" % format_time(seconds),
            *(("--account=%s" % account,) if account else ()),
            *(("--gres=%s" % site.gres,) if site.gres else ()),
            "--output=%s/slurm-%%j.out" % run_dir,
            "--open-mode=append",  # a requeued attempt adds to the log instead of replacing it
            "--requeue" if requeue else "--no-requeue",
            # To every process of the steps (no `B:`); see launchers.py for torchrun.
            "--signal=USR1@%d" % SIGNAL_LEAD_S,
            *site.sbatch_directives,
        )
        binds = (run_dir,) + ((_bindable("--data", data),) if data not in (None, "synthetic") else ())
    container_prefix = ()
    if site.container.runtime != "none":
        if not image:
            raise DlaunchError("--image: site %s runs in a container; give --image PATH" % site.name)
        container_prefix = runtime.prefix(_bindable("--image", image), binds)
    provenance = tuple((name, value) for name, value in (
        ("DLAUNCH_SITE", site.name),
        ("DLAUNCH_IMAGE", image if site.container.runtime != "none" else None),
        ("DLAUNCH_GIT_REVISION", git_revision),
        ("DLAUNCH_EXPERIMENT", experiment),
        ("DLAUNCH_RUN_DIR", run_dir),
        ("DLAUNCH_PARENT_RUN", environ.get("DLAUNCH_PARENT_RUN")),  # set by `dlaunch rerun`
    ) if value)
    slurm_lines: Tuple[str, ...] = ()
    if site.scheduler == "slurm":
        slurm_lines = (
            ATTEMPT_BANNER,
            # Slurm >= 22.05 no longer hands sbatch's --cpus-per-task to srun; this variable does.
            'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"',
            # The trainer tells the time limit's SIGTERM from a cancel by it (train/signals.py).
            "export DLAUNCH_JOB_END_TIME=$(( $(date +%%s) + %d ))" % seconds,
        )
    trainer_argv = ("--framework", request.framework) + trainer_arguments(request) + (
        "--metrics", os.path.join(run_dir, "metrics.jsonl"),
        "--checkpoint-dir", os.path.join(run_dir, "checkpoints"),
    ) + (("--resume",) if request.resume else ())
    # The trainer's own checks (torch-free), so that no job is submitted only to exit 2; the data folder
    # too where this machine sees it (a node-local path is checked on the nodes only).
    data_here = data not in (None, "synthetic") and os.path.exists(data)
    if data not in (None, "synthetic") and not data_here:
        if site.scheduler == "local":
            raise DlaunchError("--data: %s does not exist" % data)
        warnings += ("--data %s is not visible here; it is checked on the nodes only" % data,)
    try:
        parse_config(list(trainer_argv), check_paths=data_here)
    except ConfigError as e:
        raise DlaunchError("trainer options: %s" % e) from None
    return LaunchPlan(
        site=site.name,
        scheduler=site.scheduler,
        framework=request.framework,
        nodes=nodes,
        nproc_per_node=nproc,
        run_dir=run_dir,
        image=image if site.container.runtime != "none" else None,
        sbatch=sbatch,
        modules=tuple(site.modules),
        env=tuple(site.env.items()) + provenance,
        prelude=slurm_lines + spec.prelude,
        srun_args=spec.srun_args + tuple(site.srun_args),
        container_prefix=container_prefix,
        launch_prefix=spec.launch_prefix,
        trainer_argv=trainer_argv,
        warnings=warnings,
    )
