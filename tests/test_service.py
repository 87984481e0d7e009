"""The run service's one submission rule (dlaunch/runs/service.py), the same for run, sweep, --repeat and
study run: new run directories are checked free first; a refusal stops the rest; a foreground run that
ends badly does not."""
import os

import pytest

import dlaunch.cli
from dlaunch.cli import main
from dlaunch.schedulers import Running, Submission
from dlaunch.schedulers.local import Local
from test_launcher_fakes import install_fakes

# Fake sbatch (no Slurm here): refuses the second job it is given, accepts the others.
REFUSE_SECOND = '''n=$(( $(cat "$FAKE_LOG/sbatch.count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$FAKE_LOG/sbatch.count"
if [ "$n" = 2 ]; then echo "sbatch: error: Batch job submission failed: Invalid account or account/partition combination" >&2; exit 1; fi
echo "470$n;cluster"
'''


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 300)
    (tmp_path / "img.sif").write_text("")
    return tmp_path


def test_a_refusal_stops_the_runs_after_it(here, monkeypatch, capsys):
    fakes = install_fakes(here / "bin", {"sbatch": REFUSE_SECOND})
    monkeypatch.setenv("PATH", "%s:%s" % (fakes, os.environ["PATH"]))
    monkeypatch.setenv("FAKE_LOG", str(here))
    assert main(["sweep", "--site", "juwels", "--nodes", "1,2,4", "--account", "p", "--image", "img.sif",
                 "--experiment", "s"]) == 1
    err = capsys.readouterr().err
    assert "submitted job 4701" in err and "1 run(s) after it not submitted" in err
    assert err.strip().splitlines()[-1] == ("dlaunch: error: sbatch refused the job: sbatch: error: Batch job submission "
                                            "failed: Invalid account or account/partition combination")
    assert (here / "runs/s/n0001/job_id").read_text() == "4701\n"
    assert (here / "runs/s/n0002/state").read_text().startswith("submission failed: sbatch refused the job")
    assert not (here / "runs/s/n0004").exists()


class EndedJob(Running):
    """A fake of a local job (no trainer started): it has already ended with `code`."""

    def __init__(self, code: int):
        self.code = code

    def wait(self, timeout=None):
        return self.code

    def interrupt(self):
        pass


def test_a_failed_foreground_run_does_not_stop_the_others(here, monkeypatch, capsys):
    """Local.submit replaced by a fake whose jobs end with exit 3, then 0: both runs exist, the exit code is 3."""
    codes = iter([3, 0])
    monkeypatch.setattr(Local, "submit", lambda self, script, run_dir: Submission("local-1", EndedJob(next(codes))))
    assert main(["run", "--site", "local", "--gpus", "1", "--repeat", "2", "--experiment", "e", "--run-name", "x",
                 "--steps", "2"]) == 3
    assert (here / "runs/e/x-r1/state").read_text() == "finished (exit 3)\n"
    assert (here / "runs/e/x-r2/state").read_text() == "finished (exit 0)\n"
    assert "[2/2] submitting e/x-r2" in capsys.readouterr().err


def test_cancel_of_a_local_run_that_has_ended_says_so_and_exits_0(tmp_path, monkeypatch, capsys):
    """Nothing runs any more: no error (was: exit 1, 'local runs end with the dlaunch command ...')."""
    from test_watch import finished, write_run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", "")
    run = write_run(tmp_path / "runs" / "e", "r", finished())
    assert main(["cancel", str(run)]) == 0
    assert "runs/e/r had ended (finished (exit 0); metrics ok): nothing to cancel" in capsys.readouterr().err
    assert (run / "state").read_text() == "finished (exit 0)\n"
