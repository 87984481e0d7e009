"""Issue 47 item 2: equal CPU threads per rank where runs are compared. The trainer's one rule
(dlaunch/train/engines.py: threads_per_rank) gives every rank of a job the same count, the header records it, and the
shipped CPU study gives every worker of every arm the same compute on its site. A rendered job's tasks are worked out
from the launcher's own spec (cpus per task, tasks per node) and the trainer's own layout; no cluster needed."""
import os
from pathlib import Path

import pytest
from helpers_train import TINY, assert_ok, run_trainer
from test_report import table_rows
from typer.testing import CliRunner

from dlaunch.cli import app
from dlaunch.jobs.launchers import TaskPerWorker, launch_mode
from dlaunch.jobs.sites import resolve_site
from dlaunch.runs.study import expand
from dlaunch.runs.studyfile import load_study
from dlaunch.schedulers import scheduler_for
from dlaunch.train import jobenv
from dlaunch.train.engines import WORKER, task_layout, threads_per_rank
from dlaunch.train.framework_table import FRAMEWORKS
from dlaunch.train.metrics_schema import read_metrics

REPO = Path(__file__).resolve().parents[1]


def job_layouts(tasks_per_node, coordinators, servers_per_node):
    """Every task's TaskLayout in a step of `tasks_per_node` (the first node's count first)."""
    hosts = ["n%d" % i for i, _ in enumerate(tasks_per_node)]
    node_of = [n for n, count in enumerate(tasks_per_node) for _ in range(count)]
    layouts = []
    for task, node in enumerate(node_of):
        env = {jobenv.NODELIST: ",".join(hosts), jobenv.TASKS_PER_NODE: ",".join(map(str, tasks_per_node)),
               jobenv.NTASKS: str(len(node_of)), jobenv.TASK_ID: str(task), jobenv.NODE_ID: str(node),
               jobenv.LOCAL_TASK_ID: str(node_of[:task].count(node))}
        layouts.append(task_layout(env, coordinators, servers_per_node))
    return layouts


def worker_threads(framework, nodes, spec, site, requested):
    """The CPU threads of each worker of a job: the trainer's rule on the CPUs the job's tasks get (Slurm binds each task
    to its --cpus-per-task; a per-node launcher's task owns its node's)."""
    info = FRAMEWORKS[framework]
    if isinstance(launch_mode(site, framework), TaskPerWorker):
        per_node = [spec.tasks_per_node + info.coordinators] + [spec.tasks_per_node] * (nodes - 1)
        return [layout.threads(requested, cpus=spec.cpus_per_task)
                for layout in job_layouts(per_node, info.coordinators, info.servers_per_node) if layout.role == WORKER]
    return [threads_per_rank(requested, site.gpus_per_node, cpus=spec.cpus_per_task)] * nodes * site.gpus_per_node


def test_every_worker_of_a_parameter_server_job_gets_the_same_threads():
    """2 nodes of a TensorFlow PS job: 3 tasks on the first (chief, server, worker), 2 on the second, each bound to 32
    CPUs. Before, the threads were the CPUs over the tasks on the task's own node: 10 and 16, a built-in straggler."""
    layouts = job_layouts([3, 2], coordinators=1, servers_per_node=1)
    assert [layout.role for layout in layouts] == ["coordinator", "server", "worker", "server", "worker"]
    assert {layout.threads(None, cpus=32) for layout in layouts} == {10}
    assert {layout.threads(16, cpus=32) for layout in layouts} == {16}  # --threads wins


def test_the_cpu_study_gives_every_worker_of_every_arm_the_same_compute():
    """studies/cpu-ps.toml on juwels-cluster: all-reduce tasks get 96 CPUs, parameter-server tasks 32 (48 beside
    PyTorch's server). Every worker of every job computes with the same threads, and no arm's task has fewer cores than
    its threads. Before: 96 threads for all-reduce workers, 48 for PyTorch's, 10 or 16 for the others' (one job's two
    workers apart)."""
    site = resolve_site("juwels-cluster")
    scheduler = scheduler_for(site.scheduler.kind)
    for protocol, expected in (("paper", 16), ("short", 1)):  # the short one (the default): 1 thread, every worker
        threads = _threads_per_worker(site, scheduler, protocol)
        assert list(threads) == [(expected,)], {k: v[:2] for k, v in threads.items()}


def _threads_per_worker(site, scheduler, protocol: str) -> dict:
    """The threads of each worker of each cpu-ps job under `protocol` -> the jobs' names."""
    threads: dict = {}
    study = load_study(REPO / "studies" / "cpu-ps.toml")
    for job in expand(study, "juwels-cluster", Path("/x"), {"native": "/d"}, protocol=protocol):
        request = job.request
        spec = launch_mode(site, request.framework).spec(site, scheduler, request.nodes, site.gpus_per_node)
        requested = dict(request.trainer).get("threads")
        found = worker_threads(request.framework, request.nodes, spec, site, requested)
        assert len(found) == request.nodes * site.gpus_per_node
        threads.setdefault(tuple(sorted(set(found))), []).append(job.name)
        cores = spec.cpus_per_task // site.threads_per_core
        assert max(found) <= cores, "%s: %d threads on a task of %d cores" % (job.name, max(found), cores)
    return threads


@pytest.mark.slow
def test_a_real_run_records_its_threads_and_runs_that_differ_are_not_one_curve(tmp_path):
    """The new user's runs, made here: 1 and 2 processes without --threads. The trainer's default divides this
    machine's CPUs by the ranks (the numbers of the runs decide nothing here: only the threads are asserted)."""
    runs = tmp_path / "runs" / "tiny"
    args = [a for a in TINY if a not in ("--threads", "1")] + ["--steps", "3", "--warmup-steps", "1", "--data", "synthetic",
                                                               "--site", "local", "--experiment", "tiny"]
    for nproc in (1, 2):
        metrics = runs / ("np%d" % nproc) / "metrics.jsonl"
        assert_ok(run_trainer(args + ["--metrics", str(metrics)], nproc=nproc, timeout=300))
    cpus = len(os.sched_getaffinity(0))
    threads = {n: read_metrics(str(runs / ("np%d" % n) / "metrics.jsonl")).header["threads"] for n in (1, 2)}
    assert threads == {1: cpus, 2: max(1, cpus // 2)}
    out = tmp_path / "report"
    shown = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["report", str(runs), "-o", str(out), "--include-doubtful",
                                                           "--include-stragglers"])
    assert shown.exit_code == 0, shown.output
    labels = [row[0] for row in table_rows((out / "report.md").read_text(), "## Scaling")]
    if threads[1] != threads[2]:  # a machine of one CPU gives both 1 thread: then they are one curve
        assert sorted(labels) == ["tiny/local/resnet18/ddp/native b4 t%d" % threads[n] for n in (2, 1)]
        assert "ran with unequal threads per rank" in shown.stderr and "give every run the same --threads" in shown.stderr
