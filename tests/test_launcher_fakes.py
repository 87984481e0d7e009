"""Helpers of the launcher tests (no tests here): a fixed plan, fake cluster commands on PATH."""
import os
import stat
from pathlib import Path
from typing import Dict, Optional
from unittest import mock

from dlaunch.jobs.imagepaths import default_image_for_site
from dlaunch.jobs.plan import LaunchPlan, build_plan
from dlaunch.jobs.render import render_script
from dlaunch.jobs.request import LaunchRequest
from dlaunch.jobs.sites import Site

RUN_DIR = "/scratch/runs/exp/run"
REVISION = "0" * 40

# Fake Slurm/container commands: each records its argv (one argument per line, NUL-terminated) in
# $FAKE_LOG/<name>.args and does nothing else; scontrol prints two host names.
FAKES: Dict[str, str] = {
    "srun": 'printf "%s\\0" "$@" > "$FAKE_LOG/srun.args"\n',
    "torchrun": 'printf "%s\\0" "$@" > "$FAKE_LOG/torchrun.args"\n',
    "horovodrun": 'printf "%s\\0" "$@" > "$FAKE_LOG/horovodrun.args"\n',
    "apptainer": 'printf "%s\\0" "$@" > "$FAKE_LOG/apptainer.args"\n',
    "singularity": 'printf "%s\\0" "$@" > "$FAKE_LOG/singularity.args"\n',
    "module": 'printf "%s\\0" "$@" > "$FAKE_LOG/module.args"\n',
    "scontrol": 'printf "node1\\nnode2\\n"\n',
}


def install_fakes(folder: Path, scripts: Dict[str, str] = FAKES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = folder / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def fake_env(fake_bin: Path, log: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(PATH="%s:/usr/bin:/bin" % fake_bin, FAKE_LOG=str(log), SLURM_JOB_NODELIST="node[1-2]",
               SLURM_JOB_ID="42", SLURM_JOB_NUM_NODES="2", SLURM_CPUS_PER_TASK="4")
    return env


def read_args(path: Path):
    return path.read_bytes().decode().split("\0")[:-1]


def default_image(site: Site, framework: str) -> Optional[str]:
    """The image `dlaunch` picks for the site, in an images folder /images."""
    if site.container.kind == "none":
        return None
    with mock.patch.dict(os.environ, {"DLAUNCH_IMAGES_DIR": "/images"}):
        return default_image_for_site(site, framework)


def plan_for(site: Site, request: LaunchRequest, run_dir: str = RUN_DIR) -> LaunchPlan:
    image = request.image or default_image(site, request.framework)
    return build_plan(site, request, run_dir=run_dir, git_revision=REVISION, image=image, environ={})


def script_for(site: Site, request: LaunchRequest, run_dir: str = RUN_DIR) -> str:
    return render_script(plan_for(site, request, run_dir), "rendered by the tests")
