"""The checks of `dlaunch doctor --site S` (dlaunch/api/machines.py: `doctor`): a preflight on the login node or inside an
allocation.

Each check answers pass, fail or skip, with what it found and, for a failure, the fix (for a skip,
why). On the login node the checks that need a compute node (architecture, rendezvous name, network
interfaces, driver, the all-reduce) are skipped; run `srun -N2 dlaunch doctor --site S` inside an
allocation for them. There the doctor of each node also starts `python -m dlaunch.train.netcheck` in the
job's environment and image: one all-reduce across the nodes, whose transport is checked against the
profile's `[network]` and whose bus bandwidth stands beside the nominal one.
Standard library only (sockets, ioctl, ELF and SIF headers): the login node has no torch.
"""

import fcntl
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pydantic import BaseModel

from dlaunch.boundary import parse_json, validate
from dlaunch.errors import DlaunchError, SchedulerError
from dlaunch.jobs.imagepaths import version_tuple
from dlaunch.jobs.launchers import VISIBLE_DEVICES
from dlaunch.jobs.request import LaunchRequest, check_framework
from dlaunch.jobs.sites import Site, resolve_site
from dlaunch.runs import service
from dlaunch.runtimes import Runtime
from dlaunch.schedulers import scheduler_for
from dlaunch.train.framework_table import FRAMEWORKS, image_group
from dlaunch.train.network import interface_addresses

PASS, FAIL, SKIP = "pass", "fail", "skip"
COMMAND_TIMEOUT_S = 30
ALLREDUCE = "network all-reduce"
NODE_CHECK = "node check (pre-flight)"
NETCHECK_TIMEOUT_S = 180  # dlaunch/train/netcheck.py waits up to 90 s for the other nodes, then measures seconds
# Go/OCI architecture names (podman, apptainer) as `uname -m` prints them.
ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
# Oldest driver that runs a CUDA major release (minor version compatibility; NVIDIA's CUDA compatibility
# guide, docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html, and the CUDA
# Toolkit release notes' driver table).
CUDA_MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
VISIBLE_VARIABLES = tuple(VISIBLE_DEVICES.values()) + ("HIP_VISIBLE_DEVICES",)


@dataclass(frozen=True)
class Check:
    name: str
    result: str  # PASS, FAIL or SKIP
    found: str
    fix: str = ""  # FAIL: what to do; SKIP: why and how to check it


@dataclass(frozen=True)
class Node:
    """Where doctor runs: the allocation's hosts (empty outside one) and whether this is one of them."""

    hosts: Sequence[str]
    on_node: bool
    first: bool  # this host is the allocation's first (it hosts the rendezvous)


def short(host: str) -> str:
    return host.split(".")[0]


def expand(word: str, environ: Mapping[str, str]) -> str:
    """A scheduler's word (`$SLURM_JOB_ID`) with its variables from `environ` ("" for unset ones)."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: environ.get(m.group(1), ""), word)


def allocation_hosts(site: Site, environ: Mapping[str, str]) -> List[str]:
    """The hosts of the allocation this process runs in, in order ([] outside one), listed by the
    scheduler's own hosts command (`scontrol show hostnames $SLURM_JOB_NODELIST`, `cat $PBS_NODEFILE`)."""
    scheduler = scheduler_for(site.scheduler.kind)
    argv = [expand(word, environ) for word in scheduler.hosts_command()]
    if not expand(scheduler.job_id_word(), environ) or not all(argv):
        return []
    try:
        listed = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, env=dict(environ), check=False
        )
    except OSError:  # e.g. no scontrol on this host
        return []
    return list(dict.fromkeys(listed.stdout.split())) if listed.returncode == 0 else []


def where(site: Site, environ: Mapping[str, str]) -> Node:
    """A foreground site's node is this machine; a batch site's only inside the allocation, on one of its
    hosts (an `salloc` shell on the login node is not)."""
    if scheduler_for(site.scheduler.kind).this_machine:
        return Node((), on_node=True, first=True)
    hosts = allocation_hosts(site, environ)
    here = short(socket.gethostname())
    return Node(hosts, on_node=here in map(short, hosts), first=bool(hosts) and short(hosts[0]) == here)


def matching_interfaces(spec: str, interfaces: Sequence[str], variable: str) -> List[str]:
    """The interfaces `variable`'s value selects. NCCL: comma-separated prefixes, `^` first excludes them,
    `=` after it makes them exact names (NCCL's environment documentation); Gloo: exact names."""
    if variable != "NCCL_SOCKET_IFNAME":
        return [name for name in spec.split(",") if name in interfaces]
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    items = [item for item in (spec[1:] if exact else spec).split(",") if item]

    def listed(name: str) -> bool:
        return any(name == item if exact else name.startswith(item) for item in items)

    return [name for name in interfaces if listed(name) != exclude]


def check_interfaces(site: Site, node: Node) -> List[Check]:
    """Each NCCL/Gloo interface variable of the profile selects interfaces with an address on this node."""
    checks = []
    addresses = interface_addresses() if node.on_node else {}
    with_address = [name for name, found in addresses.items() if found]
    for variable in INTERFACE_VARIABLES:
        name = "interface %s" % variable
        spec = site.env.get(variable)
        if spec is None:
            checks.append(Check(name, SKIP, "not set in the profile", "the library picks an interface itself"))
            continue
        if not node.on_node:
            checks.append(
                Check(
                    name,
                    SKIP,
                    "%s=%s" % (variable, spec),
                    "run inside an allocation (srun dlaunch doctor ...) to see the node's interfaces",
                )
            )
            continue
        selected = matching_interfaces(spec, with_address, variable)
        missing = [n for n in spec.split(",") if n not in with_address] if variable == "GLOO_SOCKET_IFNAME" else []
        shown = "%s=%s" % (variable, spec)
        if selected and not missing:
            checks.append(Check(name, PASS, "%s: %s" % (shown, ", ".join(selected))))
        else:
            checks.append(
                Check(
                    name,
                    FAIL,
                    "%s selects %s" % (shown, ", ".join(selected) or "no interface"),
                    "set %s in the profile's [env] to interfaces this node has: %s"
                    % (variable, ", ".join(sorted(with_address))),
                )
            )
    return checks


def check_scheduler_commands(site: Site) -> Check:
    kind = site.scheduler.kind
    needed = scheduler_for(kind).commands
    if not needed:
        return Check("scheduler commands", PASS, "%s site: none needed" % kind)
    missing = [command for command in needed if shutil.which(command) is None]
    if missing:
        return Check(
            "scheduler commands",
            FAIL,
            "%s: missing %s" % (kind, ", ".join(missing)),
            "load the %s client (e.g. `module load %s`) or run doctor on the site's login node" % (kind, kind),
        )
    return Check("scheduler commands", PASS, "%s: %s" % (kind, ", ".join(needed)))


def check_controller(site: Site) -> Check:
    """The batch system's server answers (`scontrol ping`): an unreachable controller is not a wrong account."""
    name = "scheduler controller"
    scheduler = scheduler_for(site.scheduler.kind)
    command = scheduler.ping_command
    if not command:
        return Check(name, PASS, "%s site: none" % site.scheduler.kind)
    if shutil.which(command[0]) is None:
        return Check(name, SKIP, "no %s here" % command[0], "run doctor where the scheduler's commands are")
    try:
        pinged = subprocess.run(list(command), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        said = " ".join((pinged.stdout + pinged.stderr).split("*")[0].split())
    except subprocess.TimeoutExpired:
        pinged, said = None, "no answer within %d s" % COMMAND_TIMEOUT_S
    if pinged is None or pinged.returncode != 0:
        variable = scheduler.server_variable
        where = "%s (%s) or " % (variable, os.environ.get(variable, "not set")) if variable else ""
        return Check(
            name,
            FAIL,
            "%s: %s" % (" ".join(command), said or "failed"),
            "the controller does not answer (account and partition are not the problem): check %sthe "
            "site's status page, then run doctor again" % where,
        )
    return Check(name, PASS, said)


def check_submission(
    site: Site,
    site_arg: str,
    partition: Optional[str],
    account: Optional[str],
    image: Optional[str],
    controller_up: bool = True,
) -> Check:
    """The batch system's test-only submission of the job script `dlaunch run` would submit for one node
    (Slurm: `sbatch --test-only`): it validates the account, partition, QOS and options, submits nothing."""
    name = "account and partition"
    kind = site.scheduler.kind
    scheduler = scheduler_for(kind)
    if scheduler.no_test_submission:
        return Check(name, SKIP, "%s site" % kind, scheduler.no_test_submission)
    if not controller_up:
        return Check(name, SKIP, "the controller does not answer", "checked once `scheduler controller` passes")
    with tempfile.TemporaryDirectory(prefix="dlaunch-doctor-") as scratch:
        request = LaunchRequest(
            site=site_arg,
            nodes=1,
            partition=partition,
            account=account,
            image=image,
            time="00:10:00",
            experiment="doctor",
            run_name="doctor",
        )
        try:
            script = service.prepare(request, run_dir=Path(scratch) / "run", require_image=False).script
        except DlaunchError as e:
            return Check(name, FAIL, str(e), "give the flag or set the variable it names")
        path = Path(scratch) / "job.sh"
        path.write_text(script, encoding="utf-8")
        try:
            checked = scheduler.check_script(path)
        except SchedulerError as e:
            return Check(name, SKIP, str(e), "run doctor where the %s commands are" % scheduler.label)
    return Check(name, PASS if checked.accepted else FAIL, checked.found, checked.fix)


def check_mpi_plugin(site: Site, controller_up: bool = True) -> Check:
    """The profile's `mpi_plugin` is one the scheduler offers (Slurm: `srun --mpi=list`, no allocation
    needed). No plugin offered while the controller does not answer is the controller's failure: the
    client without a configuration (Slurm's configless set-up asks the controller) lists none."""
    name = "MPI plugin"
    plugin = getattr(site.scheduler, "mpi_plugin", None)
    scheduler = scheduler_for(site.scheduler.kind)
    if not plugin:
        return Check(name, SKIP, "no mpi_plugin in the profile", "the profile leaves the MPI wiring to the scheduler")
    try:
        offered = scheduler.mpi_plugins()
    except SchedulerError as e:
        if not controller_up:  # the client failed for the controller's reason (`scheduler controller` says it)
            return Check(name, SKIP, str(e), "checked once `scheduler controller` passes")
        return Check(name, SKIP, str(e), "run doctor where the %s commands are" % scheduler.label)
    if not offered and not controller_up:
        return Check(
            name,
            SKIP,
            "%s lists no MPI plugin while the controller does not answer" % scheduler.label,
            "checked once `scheduler controller` passes",
        )
    if plugin in offered:
        return Check(name, PASS, "%s (offered: %s)" % (plugin, ", ".join(offered)))
    return Check(
        name,
        FAIL,
        "%s offers %s, not %s" % (scheduler.label, ", ".join(offered) or "nothing", plugin),
        "set [scheduler] mpi_plugin to one of them (containers: the one the image's MPI speaks)",
    )


def check_modules(site: Site) -> Check:
    """Each module the profile loads is available (`module is-avail`, after its `module use` folders)."""
    name = "modules"
    if not site.modules:
        return Check(name, SKIP, "the profile loads none", "nothing to check")
    shell = 'n=$1; shift; for d in "$@"; do module use "$d" >/dev/null 2>&1; done; module is-avail "$n"'
    if (
        subprocess.run(
            ["bash", "-c", "type module"], capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False
        ).returncode
        != 0
    ):
        return Check(name, SKIP, "no `module` command here", "run doctor on the site's login or compute node")
    missing = [
        m
        for m in site.modules
        if subprocess.run(
            ["bash", "-c", shell, "doctor", m, *site.module_use],
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        ).returncode
        != 0
    ]
    if missing:
        return Check(
            name,
            FAIL,
            "not available: %s" % ", ".join(missing),
            "fix the profile's modules (`module spider NAME` shows the versions there are)",
        )
    return Check(name, PASS, "available: %s" % ", ".join(site.modules))


def check_bind_sources(site: Site, node: Node, environ: Mapping[str, str]) -> Check:
    """The host paths the container binds (and the plugin's folder) exist on this node."""
    name = "bind sources"
    sources = [bind.split(":")[0] for bind in getattr(site.container, "binds", [])] + list(site.module_use)
    plugin = site.nccl_net_plugin
    if plugin and plugin.library_dir:
        sources.append(re.sub(r"^\$(\w+)", lambda m: environ.get(m.group(1), "$" + m.group(1)), plugin.library_dir))
    if not sources:
        return Check(name, SKIP, "the profile binds nothing", "nothing to check")
    if not node.on_node:
        return Check(name, SKIP, ", ".join(sources), "run inside an allocation: binds are the compute nodes' paths")
    missing = [path for path in sources if not os.path.exists(path)]
    if missing:
        return Check(
            name,
            FAIL,
            "missing on this node: %s" % ", ".join(missing),
            "fix the profile's [container] binds, module_use or nccl_net_plugin.library_dir (or load its module)",
        )
    return Check(name, PASS, "exist: %s" % ", ".join(sources))


def visible_gpu_count(site: Site, environ: Mapping[str, str]) -> Tuple[Optional[int], str]:
    """The GPUs this process sees and how that was found: the vendor's *_VISIBLE_DEVICES list, else the
    devices the driver lists (nvidia-smi -L; AMD: the DRI render nodes)."""
    for variable in VISIBLE_VARIABLES:
        if variable in environ:
            shown = [d for d in environ[variable].split(",") if d.strip()]
            return len(shown), "%s=%s" % (variable, environ[variable])
    if site.gpu_vendor == "nvidia" and shutil.which("nvidia-smi"):
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
        return sum(line.startswith("GPU ") for line in listed.stdout.splitlines()), "nvidia-smi -L"
    if site.gpu_vendor == "amd":
        return len(list(Path("/dev/dri").glob("renderD*"))), "/dev/dri/renderD*"
    return None, "no nvidia-smi"


def check_gpus(site: Site, node: Node, framework: str, environ: Mapping[str, str]) -> Check:
    """The GPUs this task sees, against what the framework's launch mode starts from one task."""
    name = "GPUs this task sees"
    if site.gpu_vendor == "none":
        return Check(name, SKIP, "CPU site", "no GPUs")
    if not node.on_node:
        return Check(
            name,
            SKIP,
            "profile: %d per node" % site.gpus_per_node,
            "run inside an allocation, as the job's tasks run (srun -N2 --ntasks-per-node=1 dlaunch doctor ...)",
        )
    count, how = visible_gpu_count(site, environ)
    if count is None:
        return Check(name, SKIP, how, "no way to count the GPUs here")
    found = "%d (%s)" % (count, how)
    mode = site.launch_mode(framework)
    if mode != "torchrun-per-node" or count >= site.gpus_per_node:
        return Check(
            name,
            PASS,
            found
            + "; %s starts %s"
            % (
                framework,
                "one worker per GPU-task"
                if mode != "torchrun-per-node"
                else "%d workers from this task" % site.gpus_per_node,
            ),
        )
    if site.launch.binds_gpu_per_task:
        return Check(
            name,
            PASS,
            found + "; the job script makes GPUs 0-%d visible (binds_gpu_per_task)" % (site.gpus_per_node - 1),
        )
    return Check(
        name,
        FAIL,
        found + "; %s starts %d workers from this task" % (framework, site.gpus_per_node),
        "the site binds GPUs per task: set binds_gpu_per_task = true in the profile's [launch], or "
        '[launch.%s] mode = "task-per-gpu"' % framework,
    )


def check_runtime(site: Site) -> Check:
    runtime = site.container
    kind = runtime.kind
    if not runtime.containerized:
        return Check("container runtime", SKIP, "no container", "the site runs without one")
    binary = runtime.binary
    path = shutil.which(binary)
    if path is None:
        return Check(
            "container runtime",
            FAIL,
            "%s: no %s on PATH" % (kind, binary),
            "load the module that provides %s (the profile loads: %s)" % (binary, " ".join(site.modules) or "none"),
        )
    option = runtime.required_option
    if option:
        helped = subprocess.run(
            [binary, "--help"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
        if option not in helped.stdout:
            return Check(
                "container runtime",
                FAIL,
                "%s has no %s option" % (binary, option),
                "the plugin %s needs is not loaded on this host" % kind,
            )
    return Check("container runtime", PASS, "%s: %s" % (kind, path))


def image_arch(runtime: Runtime, image: str) -> Optional[str]:
    """The image's CPU architecture: asked of the runtime's command, else read from its file by the
    runtime (`Runtime.read_arch`); None where it cannot be read here (a squashfs or EDF file)."""
    command = runtime.arch_command(image)
    if command:
        shown = subprocess.run(list(command), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        if shown.returncode != 0:
            raise FileNotFoundError(" ".join(shown.stderr.split()) or "%s does not know the image" % runtime.binary)
        return ARCH_ALIASES.get(shown.stdout.strip(), shown.stdout.strip())
    return runtime.read_arch(image)


def check_image(site: Site, image: Optional[str], framework: str) -> List[Check]:
    """The image exists and is built for the site's architecture (`image`: checked by the runtime already)."""
    runtime = site.container
    if not runtime.containerized:
        return [Check("image", SKIP, "no container", "the site runs without one")]
    if image is None:
        from dlaunch.jobs.imagepaths import default_image_for_site

        try:
            image = default_image_for_site(site, framework)
        except DlaunchError as e:
            return [Check("image", FAIL, str(e), "give --image")]
    if runtime.arch_command(image):
        if shutil.which(runtime.binary) is None:
            return [Check("image", SKIP, image, "no %s here to ask for the image" % runtime.binary)]
    elif not image.startswith("/"):
        return [Check("image", SKIP, image, "not a file: %s resolves it when the job starts" % runtime.kind)]
    elif runtime.missing(image):
        return [
            Check("image", FAIL, "%s does not exist" % image, "build it (`dlaunch images` lists them) or give --image")
        ]
    try:
        arch = image_arch(runtime, image)
    except (OSError, ValueError) as e:
        return [Check("image", FAIL, "%s: %s" % (image, e), "give --image of a %s image" % runtime.kind)]
    checks = [Check("image", PASS, "%s exists" % image)]
    if arch is None:
        checks.append(
            Check(
                "image architecture",
                SKIP,
                image,
                "the architecture of a %s image is not read here" % runtime.image_kind,
            )
        )
    elif arch != site.arch:
        checks.append(
            Check(
                "image architecture",
                FAIL,
                "%s image on %s nodes (site arch)" % (arch, site.arch),
                "use an image built for %s (default image names end in -%s)" % (site.arch, site.arch),
            )
        )
    else:
        checks.append(Check("image architecture", PASS, "%s, as the site's nodes" % arch))
    return checks


def check_engine(site: Site, framework: str, environ: Mapping[str, str]) -> Check:
    """The Python the framework's job runs with, where it runs without a container, has the module its trainer imports
    (dlaunch/runs/engines.py; a job's image has its own)."""
    from dlaunch.runs.engines import engine

    found = engine(site, framework, environ, look=True)
    name = "engine environment"
    if site.container.containerized:
        return Check(name, SKIP, "the image's", "its %%test imports %s when it is built" % found.module)
    if found.problem:
        return Check(
            name, FAIL, found.problem.split(": it needs ")[0], "install %s" % FRAMEWORKS[framework].install_hint
        )
    if not found.looked:
        return Check(name, SKIP, "%s (%s)" % (found.python, found.source), "the nodes' python: checked in the job")
    return Check(name, PASS, "%s (%s) has %s" % (found.found, found.source, found.module))


def _writable(folder: Path) -> bool:
    """Whether `folder` can be written, or made where it does not exist yet (its nearest existing parent)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def check_folders(site: Site, environ: Mapping[str, str]) -> List[Check]:
    """The profile's runs and images folders: their variables set here, the runs folder writable, the images folder
    there (a containerized site's)."""
    from dlaunch.jobs.imagepaths import images_dir

    checks = []
    runs, problem = site.folder("runs_dir", environ)
    if problem:
        checks.append(Check("runs folder", FAIL, problem, "set it here (and on the nodes), or change runs_dir"))
    elif runs is None:
        checks.append(Check("runs folder", PASS, "./runs (the profile sets no runs_dir; --output chooses another)"))
    elif _writable(Path(runs)):
        checks.append(Check("runs folder", PASS, "%s (runs_dir), writable" % runs))
    else:
        checks.append(Check("runs folder", FAIL, "%s (runs_dir) cannot be written here" % runs, "change runs_dir"))
    if not site.container.containerized:
        return checks + [Check("images folder", SKIP, "no container", "the site runs without one")]
    images, problem = site.folder("images_dir", environ)
    if problem and not environ.get("DLAUNCH_IMAGES_DIR"):
        return checks + [Check("images folder", FAIL, problem, "set it here, or change images_dir")]
    folder = images_dir(site, environ)
    source = "$DLAUNCH_IMAGES_DIR" if environ.get("DLAUNCH_IMAGES_DIR") else "images_dir" if images else "the default"
    if folder.is_dir():
        return checks + [Check("images folder", PASS, "%s (%s)" % (folder, source))]
    return checks + [
        Check(
            "images folder",
            FAIL,
            "%s (%s) does not exist" % (folder, source),
            "build the images into it, or set images_dir",
        )
    ]


def check_node_arch(site: Site, node: Node) -> Check:
    if not node.on_node:
        return Check(
            "node architecture", SKIP, "profile: %s" % site.arch, "run inside an allocation to compare with the node's"
        )
    here = platform.machine()
    if here != site.arch:
        return Check(
            "node architecture",
            FAIL,
            "uname -m %s, profile arch %s" % (here, site.arch),
            "set arch = %r in the profile" % here,
        )
    return Check("node architecture", PASS, "uname -m %s = profile arch" % here)


def check_rendezvous(site: Site, node: Node) -> Check:
    """The first host's name with the site's suffix resolves; on the first host, to one of its own addresses."""
    name = "rendezvous host"
    if scheduler_for(site.scheduler.kind).this_machine:
        return Check(
            name, SKIP, "%s site" % site.scheduler.kind, "one machine: torchrun --standalone needs no host name"
        )
    if not node.hosts:
        return Check(
            name, SKIP, "suffix %r" % site.rendezvous_host_suffix, "run inside an allocation (srun dlaunch doctor ...)"
        )
    host = short(node.hosts[0]) + site.rendezvous_host_suffix
    fix = (
        "set rendezvous_host_suffix (now %r) so that <first node><suffix> names the node on the network "
        "NCCL/Gloo use; `getent hosts %s` shows the node's names" % (site.rendezvous_host_suffix, short(node.hosts[0]))
    )
    try:
        resolved = sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    except socket.gaierror as e:
        return Check(name, FAIL, "%s does not resolve (%s)" % (host, e.strerror), fix)
    if not node.first:
        return Check(name, PASS, "%s -> %s (the first node checks that it is its own)" % (host, ", ".join(resolved)))
    own = {address: interface for interface, addresses in interface_addresses().items() for address in addresses}
    mine = [address for address in resolved if address in own]
    if not mine:
        return Check(name, FAIL, "%s -> %s: no address of this node (the first)" % (host, ", ".join(resolved)), fix)
    return Check(name, PASS, "%s -> %s (%s, this node)" % (host, ", ".join(mine), ", ".join(own[a] for a in mine)))


def image_cuda(site: Site, image: Optional[str], framework: str) -> Optional[str]:
    """The image's CUDA version: its label (org.dlaunch.pin.cuda, asked of apptainer), else the version lock's
    for the site's default image."""
    from dlaunch.jobs import images

    binary = images.container_binary()
    if image and image.endswith(".sif") and os.path.isfile(image) and binary:
        try:
            return images.image_labels(Path(image), binary).get(images.PIN_LABEL_PREFIX + "cuda")
        except (subprocess.CalledProcessError, ValueError, KeyError):
            return None
    if image is None and site.container.containerized:
        stack = images.load_lock().stacks.get(site.container.stack)
        group = image_group(framework)
        return stack.pins(group).get("cuda") if stack and group in stack.image_groups() else None
    return None


def check_driver(site: Site, image: Optional[str], framework: str) -> Check:
    """The GPU driver is at least the oldest one the image's CUDA major release runs on."""
    name = "driver vs image CUDA"
    if site.gpu_vendor == "none":
        return Check(name, SKIP, "no GPUs (a CPU site)", "no GPU driver to check")
    if site.gpu_vendor != "nvidia":
        return Check(name, SKIP, "%s GPUs" % site.gpu_vendor, "only NVIDIA drivers are checked")
    cuda = image_cuda(site, image, framework)
    if cuda is None:
        return Check(
            name,
            SKIP,
            "image CUDA unknown",
            "no org.dlaunch.pin.cuda label to read (apptainer missing or another image)",
        )
    minimum = CUDA_MIN_DRIVER.get(version_tuple(cuda)[0])
    if minimum is None:
        return Check(name, SKIP, "CUDA %s" % cuda, "no minimum driver known for this CUDA release")
    if shutil.which("nvidia-smi"):
        queried = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        driver, source = (queried.stdout.split() or ["?"])[0], "nvidia-smi"
    elif site.driver:
        driver, source = site.driver, "the profile's driver"
    else:
        return Check(
            name, SKIP, "CUDA %s" % cuda, "no nvidia-smi here and no driver in the profile: run inside an allocation"
        )
    have = version_tuple(driver)
    if not have or have < version_tuple(minimum)[: len(have)]:  # the profile may give major.minor only
        return Check(
            name,
            FAIL,
            "driver %s (%s) < %s, the minimum for CUDA %s" % (driver, source, minimum, cuda),
            "use an image with an older CUDA (e.g. [container] stack) or the cuda-compat package (data-center GPUs)",
        )
    return Check(name, PASS, "driver %s (%s) >= %s for CUDA %s" % (driver, source, minimum, cuda))


def lock_node(site: Site, environ: Mapping[str, str]) -> Optional[int]:
    """This node's lock for the allocation's all-reduce (one doctor task per node runs it): the locked
    file's descriptor, or None when another task of the allocation holds it."""
    job = expand(scheduler_for(site.scheduler.kind).job_id_word(), environ) or "none"
    name = re.sub(
        r"[^\w.-]", "_", "dlaunch-doctor-%s-%s.lock" % (job, short(socket.gethostname()))
    )  # /tmp may be shared
    descriptor = os.open(os.path.join(tempfile.gettempdir(), name), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor


def in_job_script(
    site: Site,
    site_arg: str,
    node: Node,
    image: Optional[str],
    framework: str,
    partition: Optional[str],
    scratch: Path,
    command: Tuple[str, ...],
) -> str:
    """`python COMMAND` (a module of the trainer) for this node, in the job's environment and image (as a job of all
    the allocation's nodes would run, without its step)."""
    from dlaunch.jobs.plan import build_plan
    from dlaunch.jobs.render import render_in_job_environment

    runtime = site.container
    if runtime.containerized and image is None:
        from dlaunch.jobs.imagepaths import default_image_for_site

        image = default_image_for_site(site, framework)
    request = LaunchRequest(
        site=site_arg,
        framework=framework,
        nodes=len(node.hosts),
        partition=partition,
        image=image,
        time="00:10:00",
        experiment="doctor",
        run_name="doctor",
    )
    plan = build_plan(
        site, request, run_dir=str(scratch), git_revision=None, image=image, environ=os.environ, require_account=False
    )
    prefix = tuple(runtime.prefix(plan.image, ())) if runtime.containerized else ()  # type: ignore[arg-type]  # a containerized site's plan has its image
    return render_in_job_environment(plan, prefix + (site.torch_python(),) + command)


def netcheck_script(
    site: Site, site_arg: str, node: Node, image: Optional[str], framework: str, partition: Optional[str], scratch: Path
) -> str:
    """`python -m dlaunch.train.netcheck` for this node (`in_job_script`)."""
    here = [short(h) for h in node.hosts].index(short(socket.gethostname()))
    procs = site.gpus_per_node if site.gpu_vendor != "none" else 1
    command = ("-m", "dlaunch.train.netcheck", "--node-rank", str(here), "--nodes", str(len(node.hosts)))
    return in_job_script(
        site, site_arg, node, image, framework, partition, scratch, command + ("--procs-per-node", str(procs))
    )


def _image_by_step(site: Site, name: str, module: str, after: str = "") -> Optional[Check]:
    """Check `name` skipped where the site's image enters through the step's options (doctor runs no step), with
    the command to run instead; None elsewhere."""
    if not site.container.enters_by_step:
        return None
    return Check(
        name,
        SKIP,
        "%s: the image enters through the step's options" % site.container.kind,
        "run `srun --container-image=IMAGE python -m %s`%s" % (module, after),
    )


def check_node(
    site: Site, site_arg: str, node: Node, image: Optional[str], framework: str, partition: Optional[str]
) -> Check:
    """Pre-flight's check of this node (dlaunch/train/nodecheck.py: a GEMM on each GPU, its product verified, NVML's
    reasons), in the job's environment and image, judged against the profile's `[preflight]` as a job's is."""
    from dlaunch.train import nodecheck

    if scheduler_for(site.scheduler.kind).this_machine:
        return Check(NODE_CHECK, SKIP, "%s site" % site.scheduler.kind, "pre-flight checks a batch job's nodes")
    if not node.on_node:
        return Check(NODE_CHECK, SKIP, "not on a compute node", "run inside an allocation: srun -N1 dlaunch doctor ...")
    by_step = _image_by_step(site, NODE_CHECK, "dlaunch.train.nodecheck check --dir DIR --attempt doctor")
    if by_step is not None:
        return by_step
    cfg = site.preflight
    try:
        with tempfile.TemporaryDirectory(prefix="dlaunch-doctor-") as scratch:
            folder = Path(scratch) / nodecheck.NODE_DIR
            command = ("-m", "dlaunch.train.nodecheck", "check", "--dir", str(folder), "--attempt", "doctor")
            script = in_job_script(site, site_arg, node, image, framework, partition, Path(scratch), command)
            ran = subprocess.run(
                ["bash", "-c", script], capture_output=True, text=True, timeout=cfg.timeout_s, check=False
            )
            records = [parse_json(p.read_text(), str(p)) for p in folder.glob("*.json")] if folder.is_dir() else []
    except DlaunchError as e:
        return Check(NODE_CHECK, FAIL, str(e), "give the flag or fix the profile field it names")
    except subprocess.TimeoutExpired:
        return Check(NODE_CHECK, FAIL, "no result after %d s ([preflight] timeout_s)" % cfg.timeout_s, "")
    if not records:
        said = (ran.stderr.strip().splitlines() or ["no output"])[-1]
        return Check(NODE_CHECK, FAIL, "the check wrote no result (exit %d): %s" % (ran.returncode, said), "")
    record = records[0]
    expected, threshold = cfg.gemm_tflops_per_gpu, None
    basis = "no expected rate in [preflight] (a job compares its nodes' median)"
    if expected is not None:
        threshold = cfg.min_fraction * expected
        basis = "against %.3g TFLOP/s (%g x %g, %s)" % (threshold, cfg.min_fraction, expected, cfg.source)
    found = "; ".join(
        "%s %s GEMM %.3g TFLOP/s, relative error %.2g%s"
        % (
            d["device"],
            d["dtype"],
            d["tflops"],
            d["relative_error"],
            ", NVML %s" % d["throttle"] if "throttle" in d else "",
        )
        for d in record.get("devices") or []
    ) or str(record.get("problem"))
    reasons = nodecheck.node_reasons(record, threshold, cfg.source or "")
    if reasons:
        return Check(NODE_CHECK, FAIL, "%s; %s" % (found, basis), "; ".join(reasons))
    return Check(NODE_CHECK, PASS, "%s; %s" % (found, basis))


class NetcheckResult(BaseModel):
    """The line `python -m dlaunch.train.netcheck` prints: the bus bandwidth and what each library selected."""

    busbw_gbps: float
    nodes: int
    ranks: int
    bytes: int
    network: List[Dict[str, Any]]


def check_allreduce(
    site: Site, site_arg: str, node: Node, image: Optional[str], framework: str, partition: Optional[str]
) -> Check:
    """A short all-reduce across the allocation's nodes (dlaunch/train/netcheck.py, one doctor task per node):
    the transport each library selected, checked against the profile's `[network]`, and the bus
    bandwidth beside the profile's nominal bandwidth per node."""
    from dlaunch.jobs.network import describe, network_problems

    name = ALLREDUCE
    nominal = site.network.bandwidth_gbps_per_node if site.network else None
    if scheduler_for(site.scheduler.kind).this_machine:
        return Check(name, SKIP, "%s site" % site.scheduler.kind, "this machine only: no network between nodes")
    if not node.on_node or len(node.hosts) < 2:
        return Check(
            name,
            SKIP,
            "nominal %s" % ("%g Gbit/s per node" % nominal if nominal else "unknown (no [network])"),
            "run inside an allocation of 2 nodes or more: srun -N2 --ntasks-per-node=1 dlaunch doctor ...",
        )
    by_step = _image_by_step(site, name, "dlaunch.train.netcheck --node-rank ...", " (see its --help)")
    if by_step is not None:
        return by_step
    lock = lock_node(site, os.environ)
    if lock is None:
        return Check(name, SKIP, "another doctor task on this node runs it", "one task per node takes part")
    environ = dict(
        os.environ, MASTER_ADDR=short(node.hosts[0]) + site.rendezvous_host_suffix, MASTER_PORT=str(site.master_port)
    )
    fix = (
        "run doctor once on every node of the allocation at the same time (srun -N%d --ntasks-per-node=1 dlaunch doctor ...); "
        "the image needs the trainer's dlaunch/train/netcheck.py" % len(node.hosts)
    )
    try:
        with tempfile.TemporaryDirectory(prefix="dlaunch-doctor-") as scratch:
            script = netcheck_script(site, site_arg, node, image, framework, partition, Path(scratch))
            ran = subprocess.run(
                ["bash", "-c", script],
                capture_output=True,
                text=True,
                env=environ,
                timeout=NETCHECK_TIMEOUT_S,
                check=False,
            )
    except DlaunchError as e:
        return Check(name, FAIL, str(e), "give the flag or fix the profile field it names")
    except subprocess.TimeoutExpired:
        return Check(name, FAIL, "no result after %d s" % NETCHECK_TIMEOUT_S, fix)
    finally:
        os.close(lock)
    lines = [line for line in ran.stdout.splitlines() if line.startswith("{")]
    if ran.returncode != 0 or not lines:
        said = (ran.stderr.strip().splitlines() or ["no output"])[-1]
        return Check(name, FAIL, "the all-reduce failed (exit %d): %s" % (ran.returncode, said), fix)
    try:
        result = validate(
            NetcheckResult, parse_json(lines[-1], "dlaunch.train.netcheck's result"), "dlaunch.train.netcheck's result"
        )
    except DlaunchError as e:
        return Check(name, FAIL, str(e), fix)
    measured = "bus bandwidth %.3g Gbit/s (%d nodes, %d ranks, %.0f MiB)" % (
        result.busbw_gbps,
        result.nodes,
        result.ranks,
        result.bytes / 2**20,
    )
    beside = (
        "nominal %g Gbit/s per node: %.0f%%" % (nominal, 100 * result.busbw_gbps / nominal)
        if nominal
        else "no nominal bandwidth ([network] bandwidth_gbps_per_node)"
    )
    found = "%s; %s, %s" % (describe(result.network), measured, beside)
    problems = network_problems(result.network, site.network)
    if problems:
        return Check(name, FAIL, found, "; ".join(problems) + " (set the library's variables in the profile's [env])")
    return Check(name, PASS, found)


def run_checks(
    site: Site,
    site_arg: str,
    partition: Optional[str],
    account: Optional[str],
    image: Optional[str],
    framework: str,
    node: Node,
) -> List[Check]:
    controller = check_controller(site)
    rendezvous = check_rendezvous(site, node)
    allreduce = (
        check_allreduce(site, site_arg, node, image, framework, partition)
        if rendezvous.result != FAIL
        else Check(ALLREDUCE, SKIP, "the rendezvous host fails", "fix it first: the all-reduce's processes meet there")
    )
    return [
        check_scheduler_commands(site),
        controller,
        check_submission(site, site_arg, partition, account, image, controller_up=controller.result != FAIL),
        check_mpi_plugin(site, controller_up=controller.result != FAIL),
        check_modules(site),
        check_runtime(site),
        check_engine(site, framework, os.environ),
        *check_folders(site, os.environ),
        check_bind_sources(site, node, os.environ),
        *check_image(site, image, framework),
        check_node_arch(site, node),
        rendezvous,
        *check_interfaces(site, node),
        check_gpus(site, node, framework, os.environ),
        check_driver(site, image, framework),
        check_node(site, site_arg, node, image, framework, partition),
        allreduce,
    ]


def examine(
    site_arg: str, partition: Optional[str], account: Optional[str], image: Optional[str], framework: str
) -> Tuple[Site, Node, List[Check]]:
    """The site, where this is, and the checks run here; bad input (a framework, a site, a partition, an image
    reference its runtime cannot take) is a DlaunchError before any check runs."""
    check_framework(framework)
    site = resolve_site(site_arg)
    if partition is not None:
        site.partition(partition)
    if image is not None:
        site.container.check_image(image)
    node = where(site, os.environ)
    return site, node, run_checks(site, site_arg, partition, account, image, framework, node)
