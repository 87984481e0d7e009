"""PBS Professional: the script rendered after PBS's and ALCF's documentation, and the run's whole life
(submit, state, logs, why it failed, a rerun after a node failure, an engine job's task ids) against
fake qsub/qstat/qdel/mpiexec commands that run the real rendered script on this machine (PBS and Cray
PALS cannot run here)."""
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

import dlaunch.cli
from dlaunch.cli import main
from dlaunch.jobs.request import LaunchRequest
from dlaunch.jobs.sites import SHIPPED_SITES_DIR, Site, load_site
from dlaunch.schedulers import JobState
from dlaunch.schedulers.local import free_port_base
from dlaunch.schedulers.pbs import Pbs, classify
from test_launcher_fakes import install_fakes, script_for
from dlaunch.train.metrics_schema import read_metrics

REPO = Path(__file__).resolve().parent.parent
REQUEST = dict(nodes=2, account="proj42", experiment="exp", trainer=(("steps", 20),))
TINY = ["--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--threads", "1", "--device", "cpu",
        "--steps", "4", "--steps-per-epoch", "2", "--warmup-steps", "1", "--workers", "0"]

# Fake PBS Professional (no PBS here), state in $FAKE_PBS. qsub gives the job an id and runs the script in
# the background as PBS would on one node (PBS_JOBID, PBS_NODEFILE; stdout and stderr appended to its
# `#PBS -o` file: `-k doe`), then records qstat's `F` state with the script's exit status. An attempt
# that lost its node (the fake mpiexec's marker) is run again under the same id when the script says
# `#PBS -r y`, as PBS reruns a rerunnable job.
FAKE_QSUB = r"""script=$1
n=$(( $(cat "$FAKE_PBS/counter" 2>/dev/null || echo 4710) + 1 )); echo "$n" > "$FAKE_PBS/counter"
id="$n.fake-pbs"
out=$(sed -n 's/^#PBS -o //p' "$script"); rerun=$(sed -n 's/^#PBS -r //p' "$script")
echo localhost > "$FAKE_PBS/$id.nodes"
echo '{"job_state": "R", "comment": "Job run at today on (localhost:ncpus=2)"}' > "$FAKE_PBS/$id.json"
attempt() { PBS_JOBID=$id PBS_NODEFILE="$FAKE_PBS/$id.nodes" bash "$script" >> "$out" 2>&1; }
(
  attempt; code=$?
  if [ "$code" != 0 ] && [ "$rerun" = y ] && [ -e "$FAKE_PBS/node-failed" ] && [ ! -e "$FAKE_PBS/rerun" ]; then
    touch "$FAKE_PBS/rerun"; attempt; code=$?
  fi
  printf '{"job_state": "F", "Exit_status": %d, "comment": "Job run at today on (localhost:ncpus=2) and finished"}\n' \
    "$code" > "$FAKE_PBS/$id.json.tmp" && mv "$FAKE_PBS/$id.json.tmp" "$FAKE_PBS/$id.json"  # qstat never reads half of it
) </dev/null >/dev/null 2>&1 &
echo "$id"
"""
FAKE_QSTAT = r"""printf '{"Jobs": {'; sep=""
for id in "$@"; do
  case $id in -*|json) continue;; esac
  if [ -e "$FAKE_PBS/$id.json" ]; then printf '%s"%s": %s' "$sep" "$id" "$(cat "$FAKE_PBS/$id.json")"; sep=", "; fi
done
printf '}}\n'
"""
# Fake Cray PALS mpiexec: starts the command -n times, --ppn per node, with PALS' rank variables; with
# $FAKE_PBS_NODE_FAILURE set, the first step loses its node (PALS' report, exit 137).
FAKE_MPIEXEC = r"""n=1; ppn=1
while [ $# -gt 0 ]; do
  case $1 in -n|--ppn|--cpu-bind) [ "$1" = -n ] && n=$2; [ "$1" = --ppn ] && ppn=$2; shift 2;; -*) shift;; *) break;; esac
done
if [ -n "${FAKE_PBS_NODE_FAILURE:-}" ] && [ ! -e "$FAKE_PBS/node-failed" ]; then
  touch "$FAKE_PBS/node-failed"; echo "x1001c0s0b0n0.fake: rank 0 died from signal 9"; exit 137
fi
pids=()
for ((r = 0; r < n; r++)); do
  PALS_RANKID=$r PALS_LOCAL_RANKID=$((r % ppn)) PALS_NODEID=$((r / ppn)) "$@" & pids+=($!)
done
code=0; for pid in "${pids[@]}"; do wait "$pid" || code=$?; done; exit "$code"
"""


def shipped(name: str):
    return load_site(SHIPPED_SITES_DIR / ("%s.toml" % name))


def lines(script: str):
    return [line.strip().rstrip("\\").strip() for line in script.splitlines()]


# -- the script ----------------------------------------------------------------------------------------

def test_pbs_script_follows_the_pbs_and_polaris_documentation():
    """qsub directives (-N, -l select/walltime, -q, -A, -o, -j oe, -k doe, -r) and Polaris' mpiexec line."""
    site = shipped("polaris")
    ddp = lines(script_for(site, LaunchRequest(site="polaris", framework="ddp", **REQUEST)))
    assert "#PBS -N exp-run" in ddp and "#PBS -q %s" % site.partition(None).name in ddp
    assert any(line.startswith("#PBS -l select=2") for line in ddp)
    assert "#PBS -l walltime=1:00:00" in ddp and "#PBS -A proj42" in ddp and "#PBS -j oe" in ddp
    assert "#PBS -k doe" in ddp and "#PBS -r y" in ddp  # rerunnable (ALCF), the log appended by the rerun
    assert not any(line.startswith("#SBATCH") or "srun" in line or "SLURM" in line for line in ddp)
    assert 'MASTER_ADDR="$(cat "$PBS_NODEFILE" | sed -n 1p)"' in ddp
    per_rank = site.cpus_per_node // site.gpus_per_node
    # ALCF's DDP: one rank per GPU through mpiexec (the profile's [launch.ddp]), no torchrun
    assert "mpiexec -n 8 --ppn 4 --depth=%d --cpu-bind depth" % per_rank in " ".join(ddp) and "torchrun" not in " ".join(ddp)
    per_node = Site.model_validate(dict(site.model_dump(by_alias=True), launch={}))  # the table's torchrun per node
    torchrun = " ".join(lines(script_for(per_node, LaunchRequest(site="polaris", framework="ddp", **REQUEST))))
    assert "mpiexec -n 2 --ppn 1 --cpu-bind none" in torchrun
    assert '"--rdzv_id=$PBS_JOBID"' in torchrun and "--nnodes=2" in torchrun
    horovod = " ".join(lines(script_for(site, LaunchRequest(site="polaris", framework="horovod", **REQUEST))))
    assert "mpiexec -n 8 --ppn 4 --depth=%d --cpu-bind depth" % per_rank in horovod
    once = lines(script_for(site, LaunchRequest(site="polaris", framework="ddp", requeue=False, **REQUEST)))
    assert "#PBS -r n" in once


def test_a_pbs_queue_row_takes_no_qos_and_only_pbs_directives():
    """What is PBS's own (its directive form, no QOS) is checked in dlaunch/schedulers/pbs.py."""
    data = shipped("polaris").model_dump(by_alias=True)
    row = data["scheduler"]["partitions"][0]
    for change, refusal in (({"qos": "debug"}, "qos: PBS has no QOS"),
                            ({"directives": ["--qos=debug"]}, "directive '--qos=debug' is not of the form '-X value'")):
        rows = [dict(row, **change)] + data["scheduler"]["partitions"][1:]
        with pytest.raises(ValueError, match=refusal):
            Site.model_validate(dict(data, scheduler=dict(data["scheduler"], partitions=rows)))


# -- the batch system: qsub/qstat/qdel -------------------------------------------------------------------

def fake_pbs_answers(bin_dir: Path, qstat_json: dict) -> Path:
    """Fake qsub/qstat/qdel (PBS cannot run here): qsub prints a Polaris-style id, qstat the given JSON."""
    bin_dir.mkdir(exist_ok=True)
    log = bin_dir / "calls"
    scripts = {
        "qsub": 'echo "qsub $*" >> %s; echo 4711.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov' % log,
        "qstat": "echo \"qstat $*\" >> %s; cat <<'EOF'\n%s\nEOF" % (log, json.dumps(qstat_json)),
        "qdel": 'echo "qdel $*" >> %s' % log,
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n%s\n" % body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return log


def test_pbs_submit_state_and_cancel_through_the_protocol(tmp_path):
    job = "4711.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
    log = fake_pbs_answers(tmp_path / "bin", {"Jobs": {
        job: {"job_state": "F", "Exit_status": 271},
        "12.pbs": {"job_state": "Q", "comment": "Not Running: Insufficient amount of resource: ncpus",
                   "estimated": {"start_time": "Tue Nov 24 10:42:00 2026"}}}})
    pbs = Pbs(environ=dict(os.environ, PATH="%s:%s" % (tmp_path / "bin", os.environ["PATH"])))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n")
    assert pbs.submit(script, tmp_path).job_id == job
    ended, gone, queued = pbs.jobs([(job, tmp_path), ("99.gone", tmp_path), ("12.pbs", tmp_path)])
    assert ended.kind is JobState.CANCELLED and gone.kind is JobState.GONE
    assert queued.queue == "Not Running: Insufficient amount of resource: ncpus, start about Tue Nov 24 10:42:00 2026"
    assert pbs.end_reason("99.gone") is None
    pbs.cancel(job, tmp_path)
    assert log.read_text().splitlines()[:2] == ["qsub %s" % script, "qstat -x -f -F json %s 99.gone 12.pbs" % job]
    assert log.read_text().splitlines()[-1] == "qdel %s" % job


@pytest.mark.parametrize("letter, exit_status, meaning", [
    ("Q", None, JobState.PENDING), ("R", None, JobState.RUNNING), ("E", None, JobState.COMPLETING),
    ("F", 0, JobState.COMPLETED), ("F", 1, JobState.FAILED), ("F", 271, JobState.CANCELLED)])
def test_pbs_states_mean_what_the_reference_guide_says(letter, exit_status, meaning):
    assert classify(letter, exit_status) is meaning


# -- a run's life against fakes that run the real script -----------------------------------------------

@pytest.fixture
def fake_pbs(tmp_path, monkeypatch):
    """A PBS site on this machine (2 workers, no container, the engines' interpreters) and the fakes on PATH."""
    state = tmp_path / "pbs"
    state.mkdir()
    fakes = install_fakes(tmp_path / "bin", {"qsub": FAKE_QSUB, "qstat": FAKE_QSTAT, "qdel": 'echo "qdel $*" >> "$FAKE_PBS/qdel"\n',
                                             "mpiexec": FAKE_MPIEXEC})
    site = tmp_path / "fake-pbs.toml"
    site.write_text("\n".join([
        'name = "fake-pbs"', 'description = "PBS on this machine (fake qsub/qstat/mpiexec: tests/test_pbs.py)"',
        'based_on = ["tests/test_pbs.py"]', "gpus_per_node = 2", "cores_per_node = 2", 'gpu_vendor = "none"',
        "master_port = %d" % free_port_base(3),
        "interpreters = { tensorflow = %s }" % json.dumps(str(REPO / ".venv-tf" / "bin" / "python")),
        "[env]", 'GLOO_SOCKET_IFNAME = "lo"',
        "[scheduler]", 'kind = "pbs"', "[[scheduler.partitions]]", 'name = "debug"', "max_nodes = 2",
        'max_time = "01:00:00"', "default = true", ""]))
    monkeypatch.setenv("PATH", "%s:%s:/usr/bin:/bin" % (fakes, os.path.dirname(sys.executable)))
    monkeypatch.setenv("FAKE_PBS", str(state))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 300)
    return site


def run_to_its_end(run: Path, timeout_s: float = 600) -> dict:
    """The fake qstat's record of the run's job once it has ended."""
    job = (run / "job_id").read_text().strip()
    record = Path(os.environ["FAKE_PBS"]) / ("%s.json" % job)
    deadline = time.monotonic() + timeout_s
    while json.loads(record.read_text())["job_state"] != "F":
        assert time.monotonic() < deadline, "the fake PBS job %s did not end" % job
        time.sleep(0.5)
    return json.loads(record.read_text())


def test_pbs_failed_run_shows_its_cause_in_status_logs_and_watch(fake_pbs, capsys, monkeypatch):
    """A node lost without a rerun (`--no-requeue`): status names PALS' report from pbs.out, logs print
    pbs.out, watch exits 1."""
    monkeypatch.setenv("FAKE_PBS_NODE_FAILURE", "1")
    assert main(["run", "--site", str(fake_pbs), "--gpus", "2", "--no-requeue", "--experiment", "e", "--run-name", "lost"] + TINY) == 0
    run = Path("runs/e/lost")
    assert run_to_its_end(run)["Exit_status"] == 137
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    shown = capsys.readouterr().out
    assert "4711.fake-pbs" in shown and " F " in shown and "died" in shown
    assert "runs/e/lost: pbs.out:2: x1001c0s0b0n0.fake: rank 0 died from signal 9" in shown
    assert main(["logs", str(run)]) == 0
    logged = capsys.readouterr()
    assert "pbs.out" in logged.err and "dlaunch: job 4711.fake-pbs attempt 1 on localhost" in logged.out
    assert main(["watch", "--once", str(run)]) == 1


@pytest.mark.slow
def test_pbs_rerun_after_a_node_failure_resumes_and_keeps_both_attempts(fake_pbs, capsys, monkeypatch):
    """PBS reruns the job (`-r y`) under the same id; its second attempt counts itself, the trainer resumes,
    and pbs.out keeps both attempts."""
    monkeypatch.setenv("FAKE_PBS_NODE_FAILURE", "1")
    assert main(["run", "--site", str(fake_pbs), "--gpus", "2", "--experiment", "e", "--run-name", "rerun"] + TINY) == 0
    run = Path("runs/e/rerun")
    assert run_to_its_end(run)["Exit_status"] == 0, (run / "pbs.out").read_text()[-3000:]
    log = (run / "pbs.out").read_text()
    assert "dlaunch: job 4711.fake-pbs attempt 1 on localhost" in log and "dlaunch: job 4711.fake-pbs attempt 2 on localhost" in log
    metrics = read_metrics(str(run / "metrics.jsonl"))
    assert metrics.status == "ok" and metrics.header["scheduler"] == "pbs" and metrics.header["slurm_job_id"] == "4711.fake-pbs"
    assert "--resume" in metrics.header["argv"]  # DLAUNCH_RESTART_COUNT=1 made it a resume
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    assert "F " in capsys.readouterr().out


@pytest.mark.slow
def test_pbs_engine_job_takes_its_task_ids_from_pals(fake_pbs):
    """tf-allreduce on 2 workers: each mpiexec rank's PALS variables become the trainer's task ids."""
    if not (REPO / ".venv-tf" / "bin" / "python").exists():
        pytest.skip("%s is missing: run scripts/bootstrap-engines.sh" % (REPO / ".venv-tf"))
    args = ["--model", "resnet44", "--image-size", "32", "--num-classes", "10", "--batch-size", "4", "--threads", "1",
            "--device", "cpu", "--workers", "1", "--warmup-steps", "1", "--steps-per-epoch", "2", "--steps", "4"]
    assert main(["run", "--site", str(fake_pbs), "--gpus", "2", "--framework", "tf-allreduce", "--experiment", "e",
                 "--run-name", "tf"] + args) == 0
    run = Path("runs/e/tf")
    assert run_to_its_end(run)["Exit_status"] == 0, (run / "pbs.out").read_text()[-3000:]
    metrics = read_metrics(str(run / "metrics.jsonl"))
    assert metrics.status == "ok" and metrics.header["world_size"] == 2 and metrics.header["framework"] == "tf-allreduce"
