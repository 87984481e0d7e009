"""Suspect nodes (issue 44): a hung run's silent nodes recorded per site when dlaunch sees the run end, listed and
cleared by `dlaunch nodes`, and left out of the site's next jobs (Slurm's --exclude) unless --include-suspect-nodes.
Hang records and run directories are written here (forced state); Slurm jobs are dry runs (no Slurm needed)."""

import json

import pytest
from test_hangs import hung_run
from test_watch import epoch, header

from dlaunch import api
from dlaunch.cli import main
from dlaunch.runs import suspects


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(suspects.FOLDER_ENV, raising=False)
    monkeypatch.setenv("DLAUNCH_RESULTS_DB", str(tmp_path / "runs" / "results.sqlite"))
    return tmp_path


def test_a_hung_runs_silent_node_is_recorded_once_listed_and_cleared(here, capsys):
    run = hung_run(here / "runs", "r", [header(), epoch(0, time_s=200.0)], 300.0)
    assert suspects.read("local") == []
    assert api.status(["runs"])[0].status == "hung"
    [entry] = suspects.read("local")
    assert (entry.node, entry.run) == ("dl-node2", str(run.resolve()))
    assert entry.reason == "hung: rank 1 (local rank 0) silent at step 4, phase backward (no heartbeat for 62 s)"
    assert (here / "runs" / "suspect-nodes" / "local.json").is_file()  # beside the results database
    api.status(["runs"])  # seen again (the status cache, or read again): nothing added
    assert len(suspects.read("local")) == 1
    assert main(["nodes", "list", "--site", "localhost", "--json"]) == 0  # an alias names the site
    assert [e["node"] for e in json.loads(capsys.readouterr().out)] == ["dl-node2"]
    assert main(["nodes", "list", "--site", "local"]) == 0
    assert "dl-node2" in capsys.readouterr().out
    assert main(["nodes", "clear", "--site", "local", "dl-node9"]) == 2
    assert capsys.readouterr().err.strip() == (
        "dlaunch: error: NODE: dl-node9 is not a suspect node of site local (`dlaunch nodes list --site local`)")
    assert main(["nodes", "clear", "--site", "local", "bad;name"]) == 2
    assert "NODE: 'bad;name' is not a node name" in capsys.readouterr().err
    assert main(["nodes", "clear", "--site", "local", "dl-node2"]) == 0
    assert capsys.readouterr().out.strip() == "cleared dl-node2 of local"
    assert suspects.read("local") == []


def suspect(node="dl-node2", run="/r/e/1"):
    return suspects.Suspect(node, "hung: rank 1 (local rank 1) silent at step 4", run, "2026-11-27T23:00:00Z")


def test_slurm_jobs_leave_the_suspect_nodes_out_unless_told_and_the_dry_run_says_so(here, capsys):
    suspects.add("generic-slurm", [suspect(), suspect("dl-node1", "/r/e/2"), suspect(run="/r/e/3")])
    assert main(["run", "--site", "generic-slurm", "--nodes", "2", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "#SBATCH --exclude=dl-node1,dl-node2\n" in captured.out
    assert ("dlaunch: note: leaves out suspect nodes: dl-node1 (hung in /r/e/2, 2026-11-27), dl-node2 (hung in /r/e/3, "
            "2026-11-27); --include-suspect-nodes runs on them, `dlaunch nodes clear --site generic-slurm` clears them"
            in captured.err)
    assert main(["sweep", "--site", "generic-slurm", "--nodes", "1,2", "--dry-run"]) == 0
    assert capsys.readouterr().out.count("#SBATCH --exclude=dl-node1,dl-node2\n") == 2
    assert main(["study", "run", "smoke", "--site", "generic-slurm", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("#SBATCH --exclude=dl-node1,dl-node2\n") == 4  # every job of the study
    assert "dlaunch: note: leaves out suspect nodes: dl-node1 (hung in /r/e/2, 2026-11-27)" in captured.err
    for command in (["run"], ["study", "run", "smoke"]):
        assert main([*command, "--site", "generic-slurm", "--dry-run", "--include-suspect-nodes"]) == 0
        captured = capsys.readouterr()
        assert "--exclude" not in captured.out and "suspect" not in captured.err
    assert main(["nodes", "clear", "--site", "generic-slurm"]) == 0
    assert capsys.readouterr().out.strip() == "cleared dl-node1, dl-node2 of generic-slurm"
    assert main(["run", "--site", "generic-slurm", "--dry-run"]) == 0
    assert "--exclude" not in capsys.readouterr().out


def test_a_scheduler_that_cannot_leave_nodes_out_says_so(here, capsys):
    suspects.add("local", [suspect("this-host")])
    assert main(["run", "--site", "local", "--dry-run"]) == 0
    assert "the local scheduler cannot leave nodes out: the job may run on this-host" in capsys.readouterr().err


def test_a_damaged_record_is_refused_in_one_line_naming_it_and_nothing_is_submitted(here, capsys):
    path = suspects.record_path("generic-slurm")
    path.parent.mkdir(parents=True)
    record = {"schema": suspects.SCHEMA, "version": 1, "site": "generic-slurm",
              "nodes": [dict(suspect().to_dict(), node="n1 --uid=0")]}
    path.write_text(json.dumps(record))
    assert main(["run", "--site", "generic-slurm", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.strip().splitlines()
    assert "runs/suspect-nodes/generic-slurm.json: node: 'n1 --uid=0' is not a node name" in line
    path.write_text("{")
    assert main(["nodes", "list", "--site", "generic-slurm"]) == 2
    assert "generic-slurm.json" in capsys.readouterr().err
