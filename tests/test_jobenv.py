"""The job's neutral environment (dlaunch/train/jobenv.py): the rendered script sets it from the scheduler's own
variables, and dlaunch/train reads no scheduler's variable anywhere else."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from dlaunch.jobs.request import LaunchRequest
from dlaunch.jobs.sites import SHIPPED_SITES_DIR, Site, load_site
from test_launcher_fakes import fake_env, install_fakes, script_for

REPO = Path(__file__).resolve().parent.parent
SCHEDULER_VARIABLE = re.compile(r"^(SLURM|PBS|PALS|PMI)_[A-Z_]+$")

# Fake srun (Slurm cannot run here): starts "$@" once per task of `--ntasks-per-node` x
# $SLURM_JOB_NUM_NODES tasks with the variables srun gives each task (node by node), and fails when one does.
FAKE_SRUN = """per=1
while [[ $1 == -* ]]; do case $1 in --ntasks-per-node=*) per=${1#*=};; esac; shift; done
nodes=$SLURM_JOB_NUM_NODES; n=$((per * nodes)); pids=()
for ((t = 0; t < n; t++)); do
  SLURM_PROCID=$t SLURM_NTASKS=$n SLURM_LOCALID=$((t % per)) SLURM_NODEID=$((t / per)) \\
    SLURM_STEP_TASKS_PER_NODE="$per(x$nodes)" "$@" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
"""
# Stands in for the engine's interpreter: what the trainer's adapter makes of this task's environment.
LAYOUT = ("import json, os; from dlaunch.train.engines import task_layout; l = task_layout(os.environ); "
          "open(os.path.join(os.environ['FAKE_LOG'], 'task-%d.json' % l.task), 'w').write(json.dumps("
          "{'role': l.role, 'host': l.hosts[l.task], 'port': l.ports[l.task], 'job': os.environ['DLAUNCH_JOB_ID']}))")


def string_constants(tree: ast.AST):
    """Every string literal of a module but its docstrings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_train_reads_no_scheduler_variable_outside_its_adapter():
    found = []
    for path in sorted((REPO / "dlaunch" / "train").rglob("*.py")):
        if path.name == "jobenv.py" and path.parent.name == "train":
            continue
        for node in string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            if SCHEDULER_VARIABLE.match(node.value) or re.search(r"\$\{?(SLURM|PBS|PALS|PMI)_", node.value):
                found.append("%s:%d: %s" % (path.relative_to(REPO), node.lineno, node.value))
    assert not found, "read the job through dlaunch/train/jobenv.py:\n" + "\n".join(found)


def test_each_task_of_a_slurm_step_gets_its_neutral_ids(tmp_path):
    """The rendered script under a fake srun: 2 nodes x 2 workers of tf-allreduce, each task's layout as
    the trainer computes it from the variables the script set."""
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/bash\nexec %s -c "%s"\n' % (sys.executable, LAYOUT.replace('"', '\\"')))
    fake_python.chmod(0o755)
    data = load_site(SHIPPED_SITES_DIR / "generic-slurm.toml").model_dump()
    data.update(container={"kind": "none"}, gpus_per_node=2, interpreters={"tensorflow": str(fake_python)})
    script = script_for(Site.model_validate(data), LaunchRequest(site="generic-slurm", framework="tf-allreduce", nodes=2,
                                                                 account="p", experiment="exp"), str(tmp_path))
    (tmp_path / "job.sh").write_text(script)
    fakes = install_fakes(tmp_path / "bin", {"srun": FAKE_SRUN, "scontrol": 'printf "node1\\nnode2\\n"\n'})
    env = dict(fake_env(fakes, tmp_path), PYTHONPATH=str(REPO))
    subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, check=True, timeout=120)
    tasks = [json.loads((tmp_path / ("task-%d.json" % t)).read_text()) for t in range(4)]
    assert [(t["role"], t["host"], t["port"]) for t in tasks] == [
        ("worker", "node1", 29501), ("worker", "node1", 29502), ("worker", "node2", 29501), ("worker", "node2", 29502)]
    assert {t["job"] for t in tasks} == {"42"}


def test_a_task_names_its_node_as_the_job_does_not_as_the_host_calls_itself():
    """JSC's nodes answer `hostname` with a domain (jwb0001.juwels) that Slurm's --exclude and --nodelist do not take:
    the watchdog's and pre-flight's node names come from the job's host list (Slurm's own names)."""
    import socket

    from dlaunch.train import jobenv

    environ = {jobenv.NODELIST: "jwb0001,jwb0002", jobenv.NODE_ID: "1", jobenv.TASK_ID: "5", jobenv.NTASKS: "8",
               jobenv.LOCAL_TASK_ID: "1"}
    assert jobenv.this_node(environ) == "jwb0002"
    assert jobenv.this_node({}) == socket.gethostname()  # outside a job's step
