"""One battery for every registered scheduler and container runtime (cf. ReFrame's unittests/test_schedulers.py),
parametrised from the registries themselves: a backend registered in `SCHEDULERS` or `RUNTIMES` gets these tests,
and the test-only FakeBatch scheduler and Fakebox runtime (tests/fake_scheduler.py, fake_runtime.py), registered
from here, pass the same ones.

A scheduler's contract: the abstract class's members all given, its `[scheduler]` section told apart by its kind,
a script for every framework that bash reads, and, run through the run service: every task of a job gets the job's
neutral variables (dlaunch/train/jobenv.py), a job ends COMPLETED, one task's failure ends the others at once (the
last task fails first, the others would wait for ever), and a cancel ends a running job's tasks. The jobs run
`fake-tasks` (tests/fake_tasks.py: no trainer) in a world of the scheduler's: this machine (local), the test
cluster (Slurm, real: marked `slurm`, run under the shared lock), fake qsub/qstat/qdel/mpiexec (PBS: a fake, PBS and
Cray PALS cannot run here), FakeBatch's own step. A scheduler without a world fails here, naming WORLDS.
"""

import inspect
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import fake_scheduler
import fake_tasks
import pytest
from test_launcher_fakes import REVISION, RUN_DIR, default_image, install_fakes

from dlaunch.jobs.plan import build_plan
from dlaunch.jobs.render import render_script
from dlaunch.jobs.request import LaunchRequest
from dlaunch.jobs.sites import SHIPPED_SITES_DIR, load_site
from dlaunch.runs import service
from dlaunch.runs.rundir import RunDir
from dlaunch.runtimes import RUNTIMES, Runtime, runtime_class
from dlaunch.schedulers import SCHEDULERS, JobState, JobStatus, Scheduler, scheduler_class, scheduler_for
from dlaunch.specs.registration import Registration
from dlaunch.train.framework_table import FRAMEWORKS

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
HANG_GUARD_S = 300  # nothing is timed: without the behaviour under test these waits never end
TEST_ONLY_SCHEDULER = "fakebatch"
TEST_ONLY_RUNTIME = "fakebox"
SCHEDULER_KINDS = [
    pytest.param(kind, marks=pytest.mark.slurm) if kind == "slurm" else kind for kind in sorted(SCHEDULERS)
] + [TEST_ONLY_SCHEDULER]
RUNTIME_KINDS = sorted(RUNTIMES) + [TEST_ONLY_RUNTIME]

# Fake PBS Professional and Cray PALS (neither can run here; tests/test_pbs.py has the same fakes for a run's whole
# life): qsub starts the script at once in a session of its own, as PBS_JOBID on one node, appending to its `#PBS -o`
# file, and records qstat's `F` with the exit status (271 after a qdel, as PBS does: 256 + SIGTERM); qdel sends
# SIGTERM to the job's processes; mpiexec starts its ranks with PALS' variables.
PBS_FAKES = {
    "qsub": r"""script=$1
n=$(( $(cat "$FAKE_PBS/counter" 2>/dev/null || echo 4710) + 1 )); echo "$n" > "$FAKE_PBS/counter"
id="$n.fake-pbs"; out=$(sed -n 's/^#PBS -o //p' "$script")
echo localhost > "$FAKE_PBS/$id.nodes"; echo '{"job_state": "R"}' > "$FAKE_PBS/$id.json"
setsid bash -c 'trap : TERM; PBS_JOBID=$1 PBS_NODEFILE="$FAKE_PBS/$1.nodes" bash "$2" >> "$3" 2>&1; code=$?
  [ -e "$FAKE_PBS/$1.deleted" ] && code=271
  printf "{\"job_state\": \"F\", \"Exit_status\": %d}\n" "$code" > "$FAKE_PBS/$1.json.tmp"
  mv "$FAKE_PBS/$1.json.tmp" "$FAKE_PBS/$1.json"' fake-qsub "$id" "$script" "$out" </dev/null >/dev/null 2>&1 &
echo $! > "$FAKE_PBS/$id.session"
echo "$id"
""",
    "qstat": r"""printf '{"Jobs": {'; sep=""
for id in "$@"; do
  case $id in -*|json) continue;; esac
  if [ -e "$FAKE_PBS/$id.json" ]; then printf '%s"%s": %s' "$sep" "$id" "$(cat "$FAKE_PBS/$id.json")"; sep=", "; fi
done
printf '}}\n'
""",
    "qdel": r"""touch "$FAKE_PBS/$1.deleted"; kill -TERM -- "-$(cat "$FAKE_PBS/$1.session")"
""",
    "mpiexec": r"""n=1; ppn=1
while [ $# -gt 0 ]; do
  case $1 in -n|--ppn|--cpu-bind) [ "$1" = -n ] && n=$2; [ "$1" = --ppn ] && ppn=$2; shift 2;; -*) shift;; *) break;; esac
done
pids=()
for ((r = 0; r < n; r++)); do PALS_RANKID=$r PALS_LOCAL_RANKID=$((r % ppn)) PALS_NODEID=$((r / ppn)) "$@" & pids+=($!); done
code=0; for pid in "${pids[@]}"; do wait "$pid" || code=$?; done; exit "$code"
""",
}


@dataclass
class World:
    """Where a scheduler's jobs run in these tests: `profile(mode)` writes a site profile of it whose jobs run
    fake-tasks in that mode; `never_had` is a job id it never gave; `unverified` says why a check is not claimed."""

    profile: Callable[[str], Path]
    never_had: str
    unverified: Dict[str, str]


def profile_text(lines: List[str], mode: str) -> str:
    """A profile's lines with the [env] fake-tasks reads (its mode, the tests' modules) and no container."""
    env = [
        "[env]",
        'FAKE_TASKS_MODE = "%s"' % mode,
        'PYTHONPATH = "%s:%s"' % (REPO, TESTS),
        'GLOO_SOCKET_IFNAME = "lo"',
    ]
    return "\n".join(lines + env + ["[container]", 'kind = "none"', ""])


def writer(tmp_path: Path, head: List[str]) -> Callable[[str], Path]:
    def profile(mode: str) -> Path:
        path = tmp_path / ("battery-%s.toml" % mode)
        path.write_text(profile_text(head, mode))
        return path

    return profile


BASICS = [
    'description = "a battery world (tests/test_backend_battery.py)"',
    'based_on = ["tests"]',
    "gpus_per_node = 2",
    "cores_per_node = 2",
    'gpu_vendor = "none"',
]
QUEUE = ["[[scheduler.partitions]]", 'name = "q"', "max_nodes = 2", 'max_time = "01:00:00"', "default = true"]


def local_world(request, tmp_path: Path, monkeypatch) -> World:
    return World(
        writer(tmp_path, ['name = "battery"'] + BASICS + ["[scheduler]", 'kind = "local"']), "local-999999999", {}
    )


def slurm_world(request, tmp_path: Path, monkeypatch) -> World:
    cluster = request.getfixturevalue("slurm_cluster")
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))

    def profile(mode: str) -> Path:
        path = cluster.site_profile(tmp_path / ("battery-%s.toml" % mode))
        text = path.read_text().replace(
            "[env]\n", '[env]\nFAKE_TASKS_MODE = "%s"\nPYTHONPATH = "%s:%s"\n' % (mode, REPO, TESTS)
        )
        path.write_text(text)
        return path

    return World(profile, "999999", {})


def pbs_world(request, tmp_path: Path, monkeypatch) -> World:
    spool = tmp_path / "pbs"
    spool.mkdir()
    fakes = install_fakes(tmp_path / "bin", PBS_FAKES)
    monkeypatch.setenv("PATH", "%s:%s:/usr/bin:/bin" % (fakes, os.path.dirname(sys.executable)))
    monkeypatch.setenv("FAKE_PBS", str(spool))
    head = ['name = "battery"'] + BASICS + ["[scheduler]", 'kind = "pbs"'] + QUEUE
    return World(
        writer(tmp_path, head),
        "99.fake-pbs",
        {
            "fail-last": "Cray PALS' mpiexec (PBS's step here) cannot run here: whether it ends the other "
            "ranks when one fails is not verified (the mpiexec here is a fake)"
        },
    )


def fakebatch_world(request, tmp_path: Path, monkeypatch) -> World:
    monkeypatch.setitem(SCHEDULERS, TEST_ONLY_SCHEDULER, Registration("fake_scheduler:FakeBatch"))
    spool = tmp_path / "spool"
    spool.mkdir()
    fakes = install_fakes(tmp_path / "bin", {"fakebatch-step": fake_scheduler.STEP})
    monkeypatch.setenv("PATH", "%s:%s:/usr/bin:/bin" % (fakes, os.path.dirname(sys.executable)))
    monkeypatch.setenv("FAKEBATCH_SPOOL", str(spool))
    head = ['name = "battery"'] + BASICS + ["[scheduler]", 'kind = "fakebatch"'] + QUEUE
    return World(writer(tmp_path, head), "999", {})


WORLDS = {"local": local_world, "slurm": slurm_world, "pbs": pbs_world, TEST_ONLY_SCHEDULER: fakebatch_world}


@pytest.fixture
def world(request, tmp_path, monkeypatch) -> World:
    kind = request.param
    if kind not in WORLDS:
        pytest.fail("scheduler %r has no world to run jobs in: add one to WORLDS in %s" % (kind, __file__))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", "")
    monkeypatch.setitem(FRAMEWORKS, fake_tasks.ROW.name, fake_tasks.ROW)
    return WORLDS[kind](request, tmp_path, monkeypatch)


def registered_scheduler(kind: str, monkeypatch) -> Scheduler:
    if kind == TEST_ONLY_SCHEDULER:
        monkeypatch.setitem(SCHEDULERS, kind, Registration("fake_scheduler:FakeBatch"))
    return scheduler_for(kind)


# -- what every scheduler declares ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in sorted(SCHEDULERS)] + [TEST_ONLY_SCHEDULER])
def test_a_registered_scheduler_gives_every_member_of_the_contract(kind, monkeypatch):
    scheduler = registered_scheduler(kind, monkeypatch)
    assert isinstance(scheduler, Scheduler) and not inspect.isabstract(type(scheduler))
    assert scheduler.kind == kind and scheduler.label
    assert isinstance(scheduler.queued, bool) and isinstance(scheduler.this_machine, bool)
    assert scheduler.Config.model_fields["kind"].annotation.__args__ == (kind,)  # Literal["<kind>"]
    with pytest.raises(ValueError, match="kind"):
        scheduler_class(kind).Config.model_validate({"kind": kind + "-not"})


@pytest.mark.parametrize("world", SCHEDULER_KINDS, indirect=True)
def test_every_framework_renders_a_script_bash_reads_or_is_refused_in_one_line(world, tmp_path):
    from dlaunch.errors import DlaunchError

    site = load_site(world.profile("ok"))
    scheduler = scheduler_for(site.scheduler.kind)
    rendered = 0
    for name in sorted(FRAMEWORKS):
        request = LaunchRequest(site="battery", framework=name, gpus=2, experiment="exp")
        try:
            plan = build_plan(site, request, run_dir=RUN_DIR, git_revision=REVISION, image=None, environ={})
        except DlaunchError as e:
            assert "\n" not in str(e) and str(e).startswith("--"), (name, str(e))
            continue
        script = render_script(plan, "rendered by the battery")
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        prefix = scheduler.directive_prefix
        shown = [line for line in script.splitlines() if prefix and line.startswith(prefix + " ")]
        assert shown == ["%s %s" % (prefix, line) for line in plan.directives] and (prefix or not plan.directives)
        assert "export DLAUNCH_JOB_ID=" in script and "export DLAUNCH_NNODES=" in script
        assert "DLAUNCH_NODELIST=" in script
        rendered += 1
    assert rendered >= 3


# -- its jobs, run through the run service ----------------------------------------------------------------


def submit(world: World, mode: str) -> RunDir:
    """A job of fake-tasks on 2 workers in `mode`, submitted as `dlaunch run` does (a job that runs here is followed
    in a thread of its own); its run directory once the job has an id."""
    job = service.prepare(
        LaunchRequest(
            site=str(world.profile(mode)), framework=fake_tasks.ROW.name, gpus=2, experiment="battery", run_name=mode
        )
    )
    threading.Thread(target=service.submit_all, args=([job], lambda line: None), daemon=True).start()
    wait_until(lambda: (job.run_dir / "job_id").is_file(), "no job id was recorded")
    return RunDir(job.run_dir)


def wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def job_of(run: RunDir) -> JobStatus:
    (job,) = run.scheduler.jobs([(run.job_id, run.path)])
    return job


def ended(run: RunDir) -> JobStatus:
    wait_until(lambda: not job_of(run).kind.active, "job %s did not end" % run.job_id)
    return job_of(run)


def tasks_seen(run: RunDir) -> List[dict]:
    plan = run.plan()["plan"]
    count = plan["nodes"] * plan["nproc_per_node"]
    return [json.loads((run.path / ("task-%d.json" % task)).read_text()) for task in range(count)]


def all_tasks_started(run: RunDir) -> bool:
    plan = run.plan()["plan"]
    return all((run.path / ("task-%d.json" % t)).is_file() for t in range(plan["nodes"] * plan["nproc_per_node"]))


def running(pid: int) -> bool:
    try:
        return Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("world", SCHEDULER_KINDS, indirect=True)
def test_a_job_gives_every_task_the_neutral_variables_and_ends_completed(world):
    run = submit(world, "ok")
    job = ended(run)
    assert job.kind is JobState.COMPLETED, (job, [p.read_text()[-2000:] for p in run.log_files()])
    plan = run.plan()["plan"]
    seen = tasks_seen(run)
    ntasks = len(seen)
    assert [task["DLAUNCH_TASK_ID"] for task in seen] == [str(t) for t in range(ntasks)]
    assert {task["DLAUNCH_NTASKS"] for task in seen} == {str(ntasks)}
    assert {task["DLAUNCH_JOB_ID"] for task in seen} == {run.job_id}
    assert {task["DLAUNCH_NNODES"] for task in seen} == {str(plan["nodes"])}
    assert sorted({task["DLAUNCH_NODE_ID"] for task in seen}) == [str(n) for n in range(plan["nodes"])]
    assert all(len(task["DLAUNCH_NODELIST"].split(",")) == plan["nodes"] for task in seen)
    per_node = ntasks // plan["nodes"]
    assert [task["DLAUNCH_LOCAL_TASK_ID"] for task in seen] == [str(t % per_node) for t in range(ntasks)]
    assert run.log_files() and all(path.parent == run.path for path in run.log_files())


@pytest.mark.parametrize("world", SCHEDULER_KINDS, indirect=True)
def test_the_last_task_failing_first_ends_the_others_at_once(world):
    if "fail-last" in world.unverified:
        pytest.skip(world.unverified["fail-last"])
    run = submit(world, "fail-last")
    job = ended(run)
    assert job.kind.failed, job
    wait_until(lambda: not any(running(task["pid"]) for task in tasks_seen(run)), "a task ran on after the failure")


@pytest.mark.parametrize("world", SCHEDULER_KINDS, indirect=True)
def test_cancel_ends_a_running_jobs_tasks(world):
    run = submit(world, "forever")
    wait_until(lambda: all_tasks_started(run), "the tasks did not start")
    assert service.cancel(run) == "cancelled job %s" % run.job_id
    job = ended(run)
    assert job.kind.failed, job
    wait_until(lambda: not any(running(task["pid"]) for task in tasks_seen(run)), "a task ran on after the cancel")


@pytest.mark.parametrize("world", SCHEDULER_KINDS, indirect=True)
def test_a_job_it_never_had_is_not_active(world, tmp_path):
    site = load_site(world.profile("ok"))
    (job,) = scheduler_for(site.scheduler.kind).jobs([(world.never_had, tmp_path)])
    assert not job.kind.active and job.state


# -- every container runtime ---------------------------------------------------------------------------------


def registered_runtime(kind: str, monkeypatch) -> type:
    if kind == TEST_ONLY_RUNTIME:
        monkeypatch.setitem(RUNTIMES, kind, Registration("fake_runtime:Fakebox"))
    return runtime_class(kind)


@pytest.mark.parametrize("kind", RUNTIME_KINDS)
def test_a_registered_runtime_is_its_sections_model_and_renders_a_job_bash_reads(kind, monkeypatch):
    cls = registered_runtime(kind, monkeypatch)
    assert issubclass(cls, Runtime)
    runtime = cls.model_validate({"kind": kind})
    assert runtime.kind == kind and isinstance(runtime.containerized, bool)
    with pytest.raises(ValueError):
        cls.model_validate({"kind": kind, "no_such_field": 1})
    data = load_site(SHIPPED_SITES_DIR / "generic-slurm.toml").model_dump(by_alias=True)
    from dlaunch.jobs.sites import Site

    site = Site.model_validate(dict(data, container={"kind": kind, "binds": ["/p/data:/data"]}))
    image: Optional[str] = default_image(site, "ddp") if runtime.containerized else None
    if image is not None:
        assert runtime.check_image(image) == image
        for word in runtime.prefix(image, (RUN_DIR,)) + runtime.step_options(image, (RUN_DIR,)):
            assert isinstance(word, str)
    plan = build_plan(
        site,
        LaunchRequest(site="generic-slurm", framework="ddp", nodes=2, account="p"),
        run_dir=RUN_DIR,
        git_revision=REVISION,
        image=image,
        environ={},
    )
    assert plan.runtime == kind and plan.image == image
    subprocess.run(["bash", "-n"], input=render_script(plan, "rendered by the battery"), text=True, check=True)
