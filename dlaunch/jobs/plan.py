"""Profile + request -> `LaunchPlan`: every decision about a job, before any text is rendered.

The site's scheduler, container runtime and the framework's launch style each contribute their part
(dlaunch/schedulers/, dlaunch/runtimes/, dlaunch/jobs/launchers.py); `render.py` writes the text.
"""

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from dlaunch.boundary import check_limit, check_node_name, check_value
from dlaunch.errors import DlaunchError, SchedulerError
from dlaunch.jobs.launchers import LaunchSpec, launch_mode
from dlaunch.jobs.request import LaunchRequest, trainer_arguments
from dlaunch.jobs.sites import Site
from dlaunch.schedulers import Scheduler, scheduler_for
from dlaunch.specs.job import (
    CommandOutput,
    Export,
    FirstHost,
    HangRetry,
    JobSpec,
    NodeCheck,
    PreludeItem,
    Prepend,
    RequireVariable,
    ShellWord,
    TaskEnv,
    WorkDir,
    joined,
)
from dlaunch.specs.schema import BIND_PATH, SAFE_NAME, Partition, format_time, parse_time
from dlaunch.train import jobenv
from dlaunch.train.config import ConfigError, parse_config
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.train.heartbeat import HANG_FILE
from dlaunch.train.metrics_schema import METRICS_FILE
from dlaunch.train.nodecheck import NODE_DIR, PREFLIGHT_FILE

BINDABLE = re.compile(BIND_PATH)
ALLOCATED = "DLAUNCH_ALLOCATED"  # a pre-flight job's hosts before its choice (a retry chooses among them again)
FABRIC_HOST = "DLAUNCH_FABRIC_HOST"  # where pre-flight's fabric check meets: the allocation's first host
STEP_STARTED = "DLAUNCH_STEP_STARTED"  # when a retried job's training step started (a newer hang record is its)


def keeps_checkpoints(framework: str) -> bool:
    """The framework's trainer checkpoints, and so resumes: the torch engine's (the TensorFlow and MXNet trainers
    keep none: dlaunch/train/engines.py)."""
    return FRAMEWORKS[framework].engine == "torch"


@dataclass(frozen=True)
class LaunchPlan:
    site: str
    scheduler: str  # the scheduler's kind (dlaunch/schedulers/)
    runtime: str  # the container runtime's kind (dlaunch/runtimes/)
    framework: str
    nodes: int
    nproc_per_node: int
    run_dir: str
    image: Optional[str]
    directives: Tuple[str, ...]  # without the scheduler's prefix (`#SBATCH `)
    module_purge: bool
    module_use: Tuple[str, ...]
    modules: Tuple[str, ...]
    env: Tuple[Tuple[str, str], ...]
    prelude: Tuple[PreludeItem, ...]
    command: Tuple[
        Tuple[Any, ...], ...
    ]  # lines in front of the trainer's flags: step, task variables, container, launch
    trainer_argv: Tuple[str, ...]
    warnings: Tuple[str, ...] = ()  # for the user, before submission; nothing in the script
    partition: Optional[str] = None  # the profile's partition row the job goes to (None: local)
    notes: Tuple[str, ...] = ()  # decisions the user did not ask for by name (a row picked by size)
    profile: str = ""  # the site profile's text as read: the run directory keeps it (`site.toml`), not its path
    retry: Optional[HangRetry] = None  # the training step again after a hang (pre-flight's jobs; dlaunch/specs/job.py)

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["prelude"] = [dict(type=type(item).__name__, **dataclasses.asdict(item)) for item in self.prelude]
        if self.retry is not None:
            data["retry"]["select"] = dict(type="CommandOutput", **dataclasses.asdict(self.retry.select))
            data["retry"]["reselect"] = [
                dict(type=type(item).__name__, **dataclasses.asdict(item)) for item in self.retry.reselect
            ]
        del data["profile"]  # a file of its own
        return data


def resolve_account(
    site: Site, account: Optional[str], environ: Mapping[str, str], required: bool = True
) -> Optional[str]:
    """`--account`, else the site's account variable (e.g. $BUDGET); never hard-coded."""
    if account is None and site.account_env:
        account = environ.get(site.account_env) or None
    if not scheduler_for(site.scheduler.kind).queued:
        return None
    if account is None and site.account_required and required:
        hint = " or set $%s" % site.account_env if site.account_env else ""
        raise DlaunchError("--account: site %s needs an account: pass --account%s" % (site.name, hint))
    if account is not None and not re.fullmatch(SAFE_NAME, account):
        raise DlaunchError("--account: %r may only contain letters, digits and _.+-" % account)
    return account


def _bindable(flag: str, path: str) -> str:
    if not BINDABLE.fullmatch(path):
        raise DlaunchError(
            "%s: %r has characters a Slurm/container path cannot carry (use letters, digits, _./+@=-)" % (flag, path)
        )
    return path


def _shape(site: Site, scheduler: Scheduler, request: LaunchRequest) -> Tuple[int, int]:
    """(nodes, processes per node) from --nodes or --gpus."""
    if scheduler.this_machine:
        if request.nodes not in (None, 1):
            raise DlaunchError(
                "--nodes: site %s runs on this machine only (1 node), got %d" % (site.name, request.nodes)
            )
        check_limit("--gpus", request.gpus or site.gpus_per_node, "local processes", request.allow_large)
        return 1, request.gpus or site.gpus_per_node
    if request.nodes is not None and request.gpus is not None:  # e.g. 2 GPUs on each of 2 nodes
        per_node, rest = divmod(request.gpus, request.nodes)
        if rest or not 1 <= per_node <= site.gpus_per_node:
            raise DlaunchError(
                "--gpus: %d GPUs do not spread evenly over --nodes %d with 1 to %d per node (site %s)"
                % (request.gpus, request.nodes, site.gpus_per_node, site.name)
            )
        return request.nodes, per_node
    if request.gpus is not None and request.nodes is None:
        if request.gpus < site.gpus_per_node:
            return 1, request.gpus
        if request.gpus % site.gpus_per_node:
            raise DlaunchError(
                "--gpus: %d is not a multiple of the %d GPUs per node of site %s"
                % (request.gpus, site.gpus_per_node, site.name)
            )
        return request.gpus // site.gpus_per_node, site.gpus_per_node
    return request.nodes or 1, site.gpus_per_node


def _queue_and_time(site: Site, request: LaunchRequest, nodes: int) -> Tuple[Partition, int, Tuple[str, ...]]:
    """The partition row the job goes to, its time limit in seconds, and a note when the row was picked
    by the job's size. A row the user named is checked against its limits; without one, the default
    row takes the job if it fits, else the first row (in the profile's order, `auto` rows only) that does."""
    try:
        seconds = parse_time(request.time)
    except ValueError as e:
        raise DlaunchError("--time: %s" % e) from None
    if request.partition is not None:
        partition = site.partition(request.partition)
        if nodes > partition.max_nodes:
            raise DlaunchError(
                "--nodes: %d exceeds the %d nodes of partition %s (site %s)"
                % (nodes, partition.max_nodes, partition.name, site.name)
            )
        if nodes < partition.min_nodes:
            raise DlaunchError(
                "--nodes: partition %s of site %s takes jobs of %d nodes or more, not %d"
                % (partition.name, site.name, partition.min_nodes, nodes)
            )
        if seconds > partition.max_seconds:
            raise DlaunchError(
                "--time: %s exceeds the limit %s of partition %s (site %s)"
                % (format_time(seconds), partition.max_time, partition.name, site.name)
            )
        return partition, seconds, ()
    default = site.partition(None)
    if default.fits(nodes, seconds):
        return default, seconds, ()
    fitting = [p for p in site.partitions if p.auto and p.fits(nodes, seconds)]
    if not fitting:
        by_size = any(p.min_nodes <= nodes <= p.max_nodes for p in site.partitions)
        raise DlaunchError(
            "%s: no partition of site %s takes %d node(s) for %s; its partitions: %s"
            % (
                "--time" if by_size else "--nodes",
                site.name,
                nodes,
                format_time(seconds),
                ", ".join(p.limits() for p in site.partitions),
            )
        )
    chosen = fitting[0]
    return (
        chosen,
        seconds,
        (
            "partition %s chosen for %d node(s) and %s: the default, %s, does not take the job"
            % (chosen.limits(), nodes, format_time(seconds), default.limits()),
        ),
    )


def _environment(site: Site) -> Tuple[PreludeItem, ...]:
    """Path lists the site extends (`env_prepend`, the NCCL network plugin's folder first)."""
    prepend: Dict[str, str] = dict(site.env_prepend)
    plugin = site.nccl_net_plugin
    if plugin and plugin.library_dir:
        rest = prepend.get("LD_LIBRARY_PATH")
        prepend["LD_LIBRARY_PATH"] = joined(":", (plugin.directory,) + ((rest,) if rest else ()))  # type: ignore[arg-type]  # library_dir is set, so directory is
    required = (RequireVariable(plugin.variable, "nccl_net_plugin.library_dir"),) if plugin and plugin.variable else ()
    return required + tuple(Prepend(name, value) for name, value in prepend.items())


def site_hang_timeout(site: Site, request: LaunchRequest) -> Tuple[str, ...]:
    """The profile's `hang_timeout` as the trainer's flag, unless the request gives `--hang-timeout` itself."""
    if site.hang_timeout is None or request.option("hang-timeout") is not None:
        return ()
    return ("--hang-timeout", str(site.hang_timeout))


def _on_shared_nodes(
    site: Site, framework: str, queue: Optional[Partition], spec: LaunchSpec, nproc: int
) -> LaunchSpec:
    """On a row whose nodes jobs share (`shared`), a job that uses part of a node's GPUs asks for that share
    of its CPUs (what the site bills it for; LUMI: 7 cores per GCD), not the whole node's."""
    if queue is None or not queue.shared or nproc >= site.gpus_per_node:
        return spec
    share = site.cpus_for(framework) * nproc // site.gpus_per_node // spec.tasks_per_node
    return dataclasses.replace(spec, cpus_per_task=max(1, min(spec.cpus_per_task, share)))


def _refuse_preflight(site: Site, scheduler: Scheduler, request: LaunchRequest) -> None:
    """`--preflight` where the job cannot check its nodes and train on the chosen ones: one line, naming why."""
    if scheduler.node_check_step(site.scheduler, 1, site.preflight.timeout_s, ()) is None or scheduler.this_machine:
        raise DlaunchError("--preflight: the %s scheduler (site %s) cannot run it" % (site.scheduler.kind, site.name))
    if site.launch.rendezvous_command:
        raise DlaunchError(
            "--preflight: site %s finds the rendezvous address with rendezvous_command on the batch host, which "
            "pre-flight may leave out" % site.name
        )
    if site.launch_mode(request.framework) == "mpirun":
        raise DlaunchError(
            "--preflight: --framework %s starts with mpirun on site %s, which cannot be kept to the chosen nodes"
            % (request.framework, site.name)
        )


def _preflight_prelude(
    site: Site,
    scheduler: Scheduler,
    run_dir: str,
    nodes: int,
    allocated: int,
    options: Tuple[str, ...],
    prefix: Tuple[str, ...],
    retries: bool,
    rendezvous: Tuple[PreludeItem, ...],
) -> Tuple[Tuple[PreludeItem, ...], Optional[HangRetry]]:
    """Pre-flight (dlaunch/train/nodecheck.py): the check on each of the `allocated` nodes, then the choice of `nodes`
    healthy ones as DLAUNCH_NODELIST and their count as DLAUNCH_NNODES (the job ends with the selection's exit code when
    too few); and, where the job `retries` after a hang, its HangRetry: the choice again without the nodes the hang
    named, from the allocation's hosts (kept as ALLOCATED), then the `rendezvous` items."""
    cfg = site.preflight
    module = (site.torch_python(), "-m", "dlaunch.train.nodecheck")
    common = (
        "--dir",
        os.path.join(run_dir, NODE_DIR),
        "--attempt",
        ShellWord("$%s.$%s" % (jobenv.JOB_ID, jobenv.RESTART_COUNT)),
    )
    expected: Tuple[str, ...] = ()
    if cfg.gemm_tflops_per_gpu is not None:
        expected = ("--expected-tflops", repr(cfg.gemm_tflops_per_gpu), "--expected-source", cfg.source or "")
    step = scheduler.node_check_step(site.scheduler, allocated, cfg.timeout_s, options)
    assert step is not None  # _refuse_preflight: this scheduler has it
    check = step + (TaskEnv(scheduler.task_variables),) + prefix + module + ("check",) + common

    def select(hosts: str, *more: str) -> CommandOutput:
        return CommandOutput(
            jobenv.NODELIST,
            scheduler.node_select_step(site.scheduler, options)
            + prefix
            + module
            + ("select",)
            + common
            + ("--hosts", ShellWord("$" + hosts), "--nodes", str(nodes), "--min-fraction", repr(cfg.min_fraction))
            + (("--fabric-min-fraction", repr(cfg.fabric_min_fraction)) if allocated >= 2 else ())
            + expected
            + ("--record", os.path.join(run_dir, PREFLIGHT_FILE))
            + more,
        )

    count = Export(jobenv.NNODES, str(nodes))
    checks: Tuple[PreludeItem, ...] = (NodeCheck(check),)
    if allocated >= 2:  # the links between the nodes (dlaunch/train/fabric.py), at a host of the allocation
        meet = ("--master", ShellWord("$" + FABRIC_HOST), "--port", str(site.master_port + 1))
        checks += (
            FirstHost(FABRIC_HOST, scheduler.chosen_hosts_command(), site.rendezvous_host_suffix),
            NodeCheck(step + (TaskEnv(scheduler.task_variables),) + prefix + module + ("fabric",) + common + meet),
        )
    if not retries:
        return checks + (select(jobenv.NODELIST), count), None
    hang = os.path.join(run_dir, HANG_FILE)
    again = select(
        ALLOCATED,
        "--after-hang",
        hang,
        "--since",
        ShellWord("$" + STEP_STARTED),
        "--retry",
        ShellWord("$" + jobenv.RETRY),
    )
    retry = HangRetry(cfg.hang_retries, jobenv.RETRY, STEP_STARTED, hang, again, (count,) + rendezvous)
    keep = Export(ALLOCATED, ShellWord("$" + jobenv.NODELIST))
    return checks + (keep, select(jobenv.NODELIST), count), retry


def build_plan(
    site: Site,
    request: LaunchRequest,
    *,
    run_dir: str,
    git_revision: Optional[str],
    image: Optional[str],
    environ: Mapping[str, str],
    require_account: bool = True,
    require_data: bool = True,
    exclude: Tuple[str, ...] = (),
) -> LaunchPlan:
    """Validate the request against the site and decide everything the script will contain.

    `require_account=False` (dry runs) renders a script without `--account` where none is known; `require_data=False`
    (dry runs) one that reads a data folder this machine, where the job would run, does not have; `exclude`: nodes
    the job must not run on (the site's suspect nodes, dlaunch/runs/suspects.py), each checked as a node name.
    """
    scheduler = scheduler_for(site.scheduler.kind)
    if request.preflight:
        _refuse_preflight(site, scheduler, request)
    nodes, nproc = _shape(site, scheduler, request)
    allocated = nodes + request.spare_nodes  # the training nodes and the spares
    spec = launch_mode(site, request.framework, request.preflight).spec(site, scheduler, nodes, nproc)
    launch = site.launch.framework(request.framework)
    runtime = site.container
    experiment = request.experiment or "default"
    data = request.option("data")
    warnings: Tuple[str, ...] = ()
    queue, seconds, account = None, 0, None
    binds: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    if scheduler.queued:
        _bindable("--output", run_dir)
        try:
            queue, seconds, notes = _queue_and_time(site, request, allocated)
        except DlaunchError as e:
            if not request.spare_nodes:
                raise
            raise DlaunchError("%s (%d nodes + --spare-nodes %d)" % (e, nodes, request.spare_nodes)) from None
        spec = _on_shared_nodes(site, request.framework, queue, spec, nproc)
        if nproc == site.gpus_per_node and queue.whole_node_directives:  # the job holds its nodes whole
            queue = queue.model_copy(update={"directives": queue.directives + queue.whole_node_directives})
        account = resolve_account(site, request.account, environ, required=require_account)
        lead = scheduler.signal_lead_s
        if lead and seconds < 2 * lead:
            warnings += (
                "--time %s leaves less than twice the %d s warning before the limit: the job may get no "
                "checkpoint warning (%s sends it up to a minute early or late)"
                % (format_time(seconds), lead, scheduler.label),
            )
        plugin_dir = site.nccl_net_plugin.directory if site.nccl_net_plugin else None
        binds = (
            (run_dir,)
            + ((_bindable("--data", data),) if data not in (None, "synthetic") else ())
            + ((plugin_dir,) if plugin_dir else ())
        )
    requeue = site.requeue if request.requeue is None else request.requeue
    job = JobSpec(
        name="%s-%s" % (experiment, os.path.basename(run_dir)),
        nodes=allocated,
        tasks_per_node=spec.tasks_per_node,
        cpus_per_task=spec.cpus_per_task,
        gpus_per_node=nproc,
        seconds=seconds,
        queue=queue,
        account=account,
        run_dir=run_dir,
        requeue=requeue,
        extra_tasks=spec.extra_tasks,
        overcommit=spec.overcommit,
        smt=launch.smt,
        exclude=tuple(check_node_name("suspect node", node) for node in exclude),
    )
    if exclude and not scheduler.excludes_nodes:
        warnings += (
            "the %s scheduler cannot leave nodes out: the job may run on %s"
            % (site.scheduler.kind, ", ".join(exclude)),
        )
    container_options: Tuple[str, ...] = ()
    container_prefix: Tuple[str, ...] = ()
    checks: Tuple[PreludeItem, ...] = ()
    retry: Optional[HangRetry] = None
    if runtime.containerized:
        if not image:
            raise DlaunchError("--image: site %s runs in a container; give --image" % site.name)
        image = runtime.check_image(image)
        container_options = runtime.step_options(image, binds)
        container_prefix = runtime.prefix(image, binds)
        warnings += runtime.warnings(binds)
    else:
        image = None
    if spec.own_step:
        if container_options:
            raise DlaunchError(
                "--framework %s: site %s starts it with %s, which cannot pass the %s runtime's step options"
                % (request.framework, site.name, spec.own_step[0], runtime.kind)
            )
        step = spec.own_step
    else:
        # One task per GPU, on CPUs the job holds (a shared node's job of part of it has others): each on its GPU's.
        per_gpu = spec.tasks_per_node == nproc and not spec.whole_node and not spec.extra_tasks
        holds_cpus = queue is None or not queue.shared or nproc == site.gpus_per_node
        gpu_options = tuple(site.launch.gpu_step_options) if per_gpu and holds_cpus else ()
        step_options = tuple(launch.step_options) + gpu_options + container_options
        trained = dataclasses.replace(job, nodes=nodes)  # the training step's: without the spares
        if request.preflight:  # the training step on the chosen nodes only
            step_options += scheduler.chosen_nodes_options(nodes, trained.tasks)
            retries = bool(site.preflight.hang_retries) and keeps_checkpoints(request.framework)
            checks, retry = _preflight_prelude(
                site, scheduler, run_dir, nodes, allocated, container_options, container_prefix, retries, spec.prelude
            )
        try:
            step = scheduler.step(site.scheduler, trained, spec.mpi, spec.whole_node, step_options)
        except SchedulerError as e:
            raise DlaunchError("--framework %s: site %s: %s" % (request.framework, site.name, e)) from None
    environment = _environment(site)
    # Each task's own variables, set after the scheduler started it (its MPI plugin's would win over the script's).
    if launch.task_env:
        container_prefix = ("env",) + tuple("%s=%s" % item for item in launch.task_env.items()) + container_prefix
    # The scheduler's task variables as the neutral ones, in each task its step starts (mpirun's ranks are
    # not the scheduler's tasks: Horovod asks MPI).
    task_env = (TaskEnv(scheduler.task_variables),) if scheduler.task_variables and not spec.own_step else ()
    provenance = tuple(
        (name, value)
        for name, value in (
            ("DLAUNCH_SITE", site.name),
            (jobenv.SCHEDULER, site.scheduler.kind),
            ("DLAUNCH_IMAGE", image),
            ("DLAUNCH_GIT_REVISION", git_revision),
            ("DLAUNCH_EXPERIMENT", experiment),
            ("DLAUNCH_RUN_DIR", run_dir),
            ("DLAUNCH_PARENT_RUN", environ.get("DLAUNCH_PARENT_RUN")),  # set by `dlaunch rerun`
        )
        if value
    )
    given_as = {"DLAUNCH_IMAGE": "--image", "DLAUNCH_RUN_DIR": "--output", "DLAUNCH_EXPERIMENT": "--experiment"}
    for name, value in provenance:  # no NUL or line break in an export (the site's `env` is checked by its schema)
        check_value(given_as.get(name, "$" + name), value)
    engine = FRAMEWORKS[request.framework].engine
    checkpoints = keeps_checkpoints(request.framework)
    trainer_argv = (
        ("--framework", request.framework)
        + trainer_arguments(request)
        + site_hang_timeout(site, request)
        + (
            "--metrics",
            os.path.join(run_dir, METRICS_FILE),
        )
        + (("--checkpoint-dir", os.path.join(run_dir, "checkpoints")) if checkpoints else ())
        + (("--resume",) if request.resume and checkpoints else ())
    )
    # The trainer's own checks (torch-free), so that no job is submitted only to exit 2; the data folder
    # too where this machine sees it (a node-local path is checked on the nodes only).
    data_here = data not in (None, "synthetic") and os.path.exists(data)
    if data not in (None, "synthetic") and not data_here:
        if scheduler.this_machine and require_data:
            raise DlaunchError("--data: %s does not exist" % data)
        warnings += (
            "--data %s is not visible here; it is checked on the nodes only" % data
            if not scheduler.this_machine
            else "--data %s does not exist here (a dry run renders the script with it)" % data,
        )
    try:
        parse_config(list(trainer_argv), check_paths=data_here, engine=engine)
    except ConfigError as e:
        raise DlaunchError("trainer options: %s" % e) from None
    return LaunchPlan(
        site=site.name,
        scheduler=site.scheduler.kind,
        runtime=runtime.kind,
        framework=request.framework,
        nodes=nodes,
        nproc_per_node=nproc,
        run_dir=run_dir,
        image=image,
        directives=scheduler.directives(site.scheduler, job),
        module_purge=site.module_purge,
        module_use=tuple(site.module_use),
        modules=tuple(site.modules),
        env=tuple(site.env_for(nodes).items())
        + tuple((name, ShellWord(value)) for name, value in site.env_expanded.items())
        + provenance,
        prelude=(WorkDir(run_dir),)
        + (
            environment
            + runtime.exports([p for p in environment if isinstance(p, Prepend)])
            + scheduler.job_environment(site.scheduler, job)
            + scheduler.prelude(site.scheduler, job)
            + checks
            + spec.prelude
        ),
        command=scheduler.command(step, task_env, container_prefix, spec.launch_prefix),
        trainer_argv=trainer_argv,
        warnings=warnings,
        partition=queue.name if queue else None,
        notes=notes,
        retry=retry,
    )
