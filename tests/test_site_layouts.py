"""Slurm's own judgement of every shipped Slurm profile: each framework's job at 1, 2 and 64 nodes and at the
smallest and largest size of each partition row goes to `sbatch --test-only` against a slurmctld without
compute daemons whose nodes and partitions copy the site's documented layout (tests/site-layouts/<site>.conf,
started by scripts/site-ctld.sh, one site after the other). The job step's own options (srun) are asked the
same way, inside the job's shape. A profile row that allows more nodes or time than the site, a CPU or GPU
count a node does not have, or a feature it lacks is refused by Slurm here, as it would be there.
"""
import re
import socket
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

import slurm
from dlaunch.errors import DlaunchError
from dlaunch.jobs.imagepaths import default_image_for_site, stack_groups
from dlaunch.jobs.request import FRAMEWORKS, LaunchRequest
from dlaunch.jobs.sites import SHIPPED_SITES_DIR, Site, load_site
from dlaunch.jobs.render import render_script
from test_launcher_fakes import plan_for
from dlaunch.train.framework_table import image_group

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
LAYOUTS = Path(__file__).parent / "site-layouts"
CTLD = REPO / "scripts" / "site-ctld.sh"
CTLD_DIR = Path("/tmp/dlaunch-site-ctld-pytest")
SLURM_SITES = sorted(p.stem for p in SHIPPED_SITES_DIR.glob("*.toml") if load_site(p).scheduler.kind == "slurm")
# Options of the batch script that do not shape the allocation (the step check leaves them out).
NOT_SHAPE = ("--job-name", "--output", "--open-mode", "--requeue", "--no-requeue", "--signal")
# Step options the test world's srun cannot judge: the site's MPI and container plugins (doctor checks them there).
SITE_PLUGINS = ("--mpi", "--container-", "--environment")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def requests(site: Site) -> Iterator[Tuple[str, LaunchRequest]]:
    """Every framework at 1, 2 and 64 nodes (row picked by size) and at each row's smallest and largest size."""
    sizes: List[Tuple[int, Optional[str], str]] = [(n, None, "01:00:00") for n in (1, 2, 64)]
    for row in site.partitions:
        sizes += [(row.min_nodes, row.name, row.max_time), (row.max_nodes, row.name, row.max_time)]
    for framework in FRAMEWORKS:
        # An engine the site's stack has no image of runs from an image the user names (the ddp one's place stands in).
        image = (default_image_for_site(site, "ddp") if site.container.containerized
                 and image_group(framework) not in stack_groups(site.container.stack) else None)
        for nodes, row, time in dict.fromkeys(sizes):
            label = "%s %d node(s)%s %s" % (framework, nodes, " row " + row if row else "", time)
            yield label, LaunchRequest(site=site.name, framework=framework, nodes=nodes, partition=row, time=time,
                                       account="proj42", experiment="exp", image=image)


def batch_options(script: str) -> List[str]:
    return [line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


def step_request(script: str, step: Tuple[str, ...]) -> List[str]:
    """The step's srun options inside the job's shape: the job's options, the step's own where it names the same."""
    own = [o for o in step[1:] if not o.startswith(SITE_PLUGINS)]
    named = {o.split("=")[0] for o in own}
    shape = [o for o in batch_options(script) if not o.startswith(NOT_SHAPE) and o.split("=")[0] not in named]
    if any(o.startswith("--ntasks=") for o in own):  # srun's --ntasks replaces the job's per-node count
        shape = [o for o in shape if not o.startswith("--ntasks-per-node")]
    return shape + own


@pytest.fixture(scope="module")
def site_ctld():
    missing = slurm.missing_prerequisite()
    if missing:
        pytest.skip(missing)
    port = free_port()
    started: Dict[str, str] = {}

    def start(site_name: str) -> Dict[str, str]:
        layout = LAYOUTS / ("%s.conf" % site_name)
        assert layout.is_file(), "no test-world layout for shipped Slurm profile %s: write %s" % (site_name, layout)
        ran = subprocess.run([str(CTLD), "start", "--layout", str(layout), "--dir", str(CTLD_DIR), "--port", str(port)],
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        started["conf"] = ran.stdout.strip()
        return {"SLURM_CONF": started["conf"], "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}

    yield start
    subprocess.run([str(CTLD), "stop", "--dir", str(CTLD_DIR)], capture_output=True, timeout=120)


def ask(argv: List[str], env: Dict[str, str]) -> Optional[str]:
    """Slurm's refusal (None: accepted)."""
    ran = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    said = " ".join((ran.stderr + ran.stdout).split())
    return None if ran.returncode == 0 and "to start at" in said else said


@pytest.mark.parametrize("site_name", SLURM_SITES)
def test_slurm_accepts_every_job_of_the_profile(site_ctld, tmp_path, site_name):
    site = load_site(SHIPPED_SITES_DIR / ("%s.toml" % site_name))
    env = site_ctld(site_name)
    refused, asked, rendered = [], {}, 0
    for label, request in requests(site):
        try:
            plan = plan_for(site, request)
        except DlaunchError:  # dlaunch refuses it itself (no row of that size): nothing for Slurm to judge
            continue
        rendered += 1
        script = render_script(plan, "site layout test")
        step = plan.command[0]
        for kind, argv in (("batch", tuple(batch_options(script))), ("step", tuple(step_request(script, step)))):
            if argv not in asked:
                if kind == "batch":
                    (tmp_path / "job.sh").write_text(script)
                    asked[argv] = ask(["sbatch", "--test-only", str(tmp_path / "job.sh")], env)
                else:
                    asked[argv] = ask(["srun", "--test-only", *argv, "true"], env)
            if asked[argv]:
                refused.append("%s: %s (%s): %s" % (site_name, label, kind, re.sub(r"^.*?error: ", "", asked[argv])))
    assert rendered >= len(FRAMEWORKS) * 3, "too few jobs rendered for %s" % site_name
    assert not refused, "Slurm refuses %d of %d jobs:\n" % (len(refused), rendered) + "\n".join(refused)
