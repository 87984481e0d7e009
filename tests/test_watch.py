"""`dlaunch watch`, `runs` and `status`: on run directories the tests write (named `written` here), on
real `--site local` runs, and with fake Slurm commands where a test needs a queue (named `fake`).
The real Slurm cluster: tests/test_slurm_watch.py."""
import json
import os
import re
import shlex
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
from io import StringIO
from pathlib import Path
from typing import Callable, List, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rich.console import Console

import dlaunch.cli
import dlaunch.runs.watch
from dlaunch.cli import main
from dlaunch.cli.terminal import STATUS_HEADERS, STATUS_LEAVE_OUT
from dlaunch.runs.runstate import SUBMIT_GRACE_S, Progress, read_progress
from dlaunch.schedulers import RUNNING_HERE
from dlaunch.tables import fit_table, print_table
from dlaunch.runs.watch import duration
from holds import Hold, run_until_released
from prerequisites import require
from test_launcher_fakes import install_fakes
from test_launcher_local import step_processes
from dlaunch.train.metrics_schema import make_record

DLAUNCH = [sys.executable, "-m", "dlaunch.cli"]
TINY = ["--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--threads", "1", "--device", "cpu",
        "--warmup-steps", "1"]
LINE = re.compile(r"^\d\d:\d\d:\d\d (\S+): (.*)$")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def header(total_steps: int = 6, steps_per_epoch: int = 2) -> dict:
    return make_record("header", 100.0, run_id="x", argv=[], config={}, framework="ddp", loader="native",
                       model="resnet18", device="cpu", world_size=2, nodes=1, hosts=["h", "h"], batch_per_worker=4,
                       global_batch=8, lr_scaled=0.1, versions={}, slurm_job_id=None, site="local", experiment="e",
                       image=None, git_revision=None,
                       loader_settings={"total_steps": total_steps, "steps_per_epoch": steps_per_epoch})


def epoch(n: int, steps: int = 2, seconds: float = 4.0, time_s: Optional[float] = None) -> dict:
    return make_record("epoch", time_s if time_s is not None else 104.0 + 4 * n, epoch=n, steps=steps,
                       images=8 * steps, images_per_s=16.0 + n, epoch_time_s=seconds, data_wait_s=0.1,
                       loss=3.0 / (n + 1), lr=0.1)


def end(status: str = "ok", reason: Optional[str] = None) -> dict:
    fields = {"reason": reason} if reason else {}
    return make_record("end", 120.0, status=status, total_time_s=20.0, epochs_completed=3, **fields)


def finished() -> List[dict]:
    """The records of a run that went well: 3 epochs of 2 steps, `ok`."""
    return [header(), epoch(0), epoch(1), epoch(2), end()]


def write_run(root: Path, name: str, records: List[dict] = (), state: Optional[str] = "finished (exit 0)",
              scheduler: str = "local", job_id: Optional[str] = "local-1", log: str = "") -> Path:
    """A run directory as dlaunch leaves it (plan.json, job_id, state, log, metrics.jsonl)."""
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({"plan": {"scheduler": scheduler, "site": "local", "run_dir": str(run)},
                                               "request": {}}))
    if job_id:
        (run / "job_id").write_text(job_id + "\n")
    if state:
        (run / "state").write_text(state + "\n")
    if log:
        (run / ("slurm-%s.out" % job_id if scheduler == "slurm" else "local.log")).write_text(log)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def watch_lines(capsys) -> List[str]:
    """What `dlaunch watch` printed through the captured (non-terminal) stdout: plain lines."""
    out = capsys.readouterr().out
    assert not CONTROL.search(out), repr(out)
    return out.splitlines()


def test_progress_from_written_metrics_steps_epochs_rate_and_eta(tmp_path):
    run = write_run(tmp_path, "r", [header(), epoch(0), epoch(1, seconds=2.0)], state=None)
    p = read_progress(run / "metrics.jsonl")
    assert (p.status, p.steps_done, p.steps_total, p.epochs_done, p.epochs_total) == ("running", 4, 6, 2, 3)
    assert (p.images_per_s, p.last_epoch_images_per_s, p.loss, p.seconds_per_step) == (None, 17.0, 1.5, 1.5)
    assert p.eta_s() == 3.0  # 2 steps left at 1.5 s each, as of the last record
    assert p.eta_s(now=p.last_record_time + 1.0) == 2.0  # counting down between records
    assert read_progress(tmp_path / "missing.jsonl").status == "no metrics yet"
    assert Progress("ok", steps_done=6, steps_total=6).eta_s() is None


def v4_epoch(n: int, compute: List[float]) -> dict:
    """An epoch record of metrics version 4 whose ranks (one per host n0, n1, ...) compute `compute` s per step."""
    from test_analysis import v4_fields

    return make_record("epoch", 104.0 + 4 * n, epoch=n, steps=2, images=16, images_per_s=16.0, epoch_time_s=4.0,
                       data_wait_s=0.1, loss=1.0, lr=0.1, **v4_fields(compute, measured_steps=2, steps=2))


def site_profile(straggler_threshold: float) -> str:
    """sites/local.toml with `straggler_threshold` (whatever the shipped profile sets)."""
    text = (Path(__file__).resolve().parents[1] / "sites" / "local.toml").read_text()
    text = re.sub(r"(?m)^straggler_threshold *=.*\n", "", text)
    return text.replace('gpu_vendor = "none"', 'gpu_vendor = "none"\nstraggler_threshold = %r' % straggler_threshold)


def straggler(percent: int) -> str:
    """dlaunch/analysis/stragglers.py's flag on the written runs' rank 1 (a pattern: its wording is that module's)."""
    return r"straggler: n1 rank 1 \(local rank 0\) computed %d %% slower than the median [^;]*; this run's E_G is understated" % percent


def write_ended_and_live_runs(root: Path) -> None:
    """runs/ended and runs/live (this process's local run), each with a warm-up, two equal epochs and a last one in
    which rank 1 computes 17 % over the median rank (0.12), keeping a profile of threshold 0.10."""
    profile = site_profile(0.10)
    warm, equal, late = [0.1, 0.5], [0.1, 0.1], [0.1, 0.14]
    epochs = [v4_epoch(0, warm), v4_epoch(1, equal), v4_epoch(2, equal), v4_epoch(3, late)]
    for name, records, state in (("ended", [header(8)] + epochs + [end()], "finished (exit 0)"),
                                 ("live", [header(8)] + epochs, RUNNING_HERE % os.getpid())):
        (write_run(root, name, records, state=state) / "site.toml").write_text(profile)


def test_stragglers_are_flagged_with_the_runs_profile_threshold_ended_runs_on_their_measured_epochs(tmp_path, monkeypatch, capsys):
    """dlaunch/analysis/stragglers.py's flags in watch's lines: an ended run judged on its measured epochs, a
    live one on its last epoch; the threshold is the profile's the run kept (site.toml: straggler_threshold)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", "")
    write_ended_and_live_runs(tmp_path / "runs")
    assert main(["watch", "--once", "runs"]) == 0
    shown = {LINE.match(line).group(1): LINE.match(line).group(2) for line in watch_lines(capsys)}
    assert "straggler" not in shown["runs/ended"]  # the warm-up epoch is left out, the last one diluted: 6 %
    assert re.search("; %s$" % straggler(17), shown["runs/live"]), shown["runs/live"]
    (tmp_path / "runs/ended/site.toml").write_text(site_profile(0.05))
    assert main(["watch", "--once", "runs/ended"]) == 0
    line = watch_lines(capsys)[0]
    assert re.search("; %s$" % straggler(6), line), line


def test_a_straggler_threshold_given_overrides_the_profiles_and_the_cached_flags_without_changing_them(tmp_path, monkeypatch):
    """observe(..., straggler_threshold=) judges live and ended runs at it, an ended run's kept snapshot too; the
    status cache keeps the flags at the profile's threshold."""
    from dlaunch.runs import service
    from dlaunch.runs.rundir import find_runs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", str(tmp_path / "cache.json"))
    write_ended_and_live_runs(tmp_path / "runs")

    def flags(threshold: Optional[float] = None) -> dict:
        return {s.run.path.name: s.flags for s in service.observe(find_runs([tmp_path / "runs"]), straggler_threshold=threshold)}

    def profiles() -> None:  # the profile's 10 %: the ended run's 6 % is no straggler, the live run's 17 % is
        judged = flags()
        assert judged["ended"] == () and len(judged["live"]) == 1 and re.fullmatch(straggler(17), judged["live"][0])

    profiles()
    assert json.loads((tmp_path / "cache.json").read_text())["runs"]  # the ended run is kept
    strict = flags(0.05)
    assert len(strict["ended"]) == 1 and re.fullmatch(straggler(6), strict["ended"][0]), strict
    assert flags(0.2) == {"ended": (), "live": ()}  # 17 % under 20 %
    profiles()  # the cache kept the profile's judgement
    assert dlaunch.runs.watch.Watcher([tmp_path / "runs/ended"], str, straggler_threshold=0.05).poll()[0].flags == strict["ended"]
    with pytest.raises(ValueError, match="straggler threshold 1.5"):
        flags(1.5)


def test_an_ended_runs_images_per_s_is_its_throughput_x_as_the_report_defines_it(tmp_path):
    """X = Run.throughput (dlaunch/analysis/scaling.py): the measured epochs' mean, the first epoch left out;
    the last epoch's own figure stays beside it."""
    from dlaunch.analysis.scaling import run_from_metrics
    from dlaunch.train.metrics_schema import read_metrics

    run = write_run(tmp_path, "r", finished())
    p = read_progress(run / "metrics.jsonl")
    assert (p.images_per_s, p.last_epoch_images_per_s) == (17.5, 18.0)
    assert p.images_per_s == run_from_metrics(read_metrics(str(run / "metrics.jsonl"))).throughput


def test_a_live_runs_last_epoch_images_per_s_is_that_epochs_part_of_x_its_overhead_included(tmp_path, monkeypatch, capsys):
    """One definition of images/s: the last epoch's figure shown while the run runs is EpochPoint.throughput (16
    images in 1 s of steps and 1 s of overhead: 8.0), not the record's steps-only images_per_s (16.0)."""
    from test_analysis import v4_fields

    monkeypatch.chdir(tmp_path)
    record = make_record("epoch", 104.0, epoch=0, steps=2, images=16, images_per_s=16.0, epoch_time_s=1.0,
                         data_wait_s=0.1, loss=1.0, lr=0.1, **v4_fields([0.1, 0.1], measured_steps=2, steps=2, overhead_s=1.0))
    write_run(tmp_path / "runs", "r", [header(), record], state=RUNNING_HERE % os.getpid())
    assert main(["watch", "--once", "runs/r"]) == 0
    assert "; running; steps 2/6, epoch 1/3, 8.0 images/s (last epoch), loss 1.000, ETA 2s" in watch_lines(capsys)[0]


def progress_file(run: Path, time_s: float, **fields) -> None:
    """The trainer's progress file (dlaunch/train/progress.py) of a run 1 step into its second epoch of 2 steps."""
    written = dict(time=time_s, epoch=1, epochs=3, step_in_epoch=1, steps_per_epoch=2, global_step=3, total_steps=6,
                   epoch_time_s=2.0, measured_steps=1, images_per_s=5.5, loss=0.75, loss_steps=1)
    written.update(fields)
    (run / "progress.json").write_text(json.dumps(written))


def test_a_running_runs_progress_file_shows_where_it_is_within_its_epoch_each_figure_labelled(tmp_path, monkeypatch, capsys):
    """Newer than the metrics file's last record: steps, the epoch's images/s and loss so far, the ETA at the rate
    of every step so far (the epochs' and this one's: 6 s over 3 steps)."""
    monkeypatch.chdir(tmp_path)
    run = write_run(tmp_path / "runs", "r", [header(), epoch(0)], state=RUNNING_HERE % os.getpid())
    progress_file(run, 110.0)
    p = read_progress(run / "metrics.jsonl")
    assert (p.steps_done, p.epochs_done, p.seconds_per_step, p.last_record_time) == (3, 1, 2.0, 110.0)
    assert (p.epoch_so_far_images_per_s, p.epoch_so_far_loss, p.eta_s(now=111.0)) == (5.5, 0.75, 5.0)
    assert main(["watch", "--once", "runs/r"]) == 0
    assert LINE.match(watch_lines(capsys)[0]).group(2) == (
        "%s; running; steps 3/6, epoch 1/3, 5.5 images/s (this epoch so far, steps only), "
        "loss 0.750 (rank 0, this epoch so far), ETA 6s" % (RUNNING_HERE % os.getpid()))
    progress_file(run, 110.0, images_per_s=None, loss=None, loss_steps=0)  # in the warm-up; no loss read yet
    assert main(["watch", "--once", "runs/r"]) == 0
    assert watch_lines(capsys)[0].endswith("running; steps 3/6, epoch 1/3, 16.0 images/s (last epoch), loss 3.000, ETA 6s")


@pytest.mark.parametrize("case", ["older than the last record", "of another epoch", "malformed", "a link"])
def test_a_progress_file_that_is_not_the_runs_latest_word_is_ignored(tmp_path, case):
    run = write_run(tmp_path, "r", [header(), epoch(0)], state=RUNNING_HERE % os.getpid())
    if case == "older than the last record":
        progress_file(run, 103.0)
    elif case == "of another epoch":
        progress_file(run, 110.0, epoch=0)
    elif case == "malformed":
        progress_file(run, 110.0, global_step="3")
    else:
        progress_file(tmp_path, 110.0)
        (run / "progress.json").symlink_to(tmp_path / "progress.json")
    p = read_progress(run / "metrics.jsonl")
    assert (p.steps_done, p.epoch_so_far_images_per_s, p.epoch_so_far_loss, p.last_record_time) == (2, None, None, 104.0)


def test_an_ended_run_ignores_its_progress_file_its_epoch_records_are_the_truth(tmp_path, monkeypatch, capsys):
    """A run whose trainer died mid-epoch (no end record) has ended: a progress file newer than its records is not
    shown; nor is one beside an end record."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", "")
    died = write_run(tmp_path / "runs", "died", [header(), epoch(0)], state="finished (exit 1)")
    ok = write_run(tmp_path / "runs", "ok", finished())
    for run in (died, ok):
        progress_file(run, 130.0)
    assert main(["watch", "--once", "runs"]) == 1
    lines = [LINE.match(line).group(2) for line in watch_lines(capsys)]
    assert lines[0].startswith("finished (exit 1); died; steps 2/6, epoch 1/3, 16.0 images/s (last epoch), loss 3.000; why: ")
    assert lines[1] == "finished (exit 0); ok; steps 6/6, epoch 3/3, 17.5 images/s, loss 1.000"
    assert read_progress(died / "metrics.jsonl", ended=True).steps_done == 2
    assert read_progress(died / "metrics.jsonl").steps_done == 3  # as a live run's


def test_written_runs_through_a_pipe_one_plain_line_each_and_an_overall_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    long_name = "an-experiment-with-a-name-long-enough-to-wrap-an-80-column-terminal"
    write_run(tmp_path / "runs" / long_name, "n0001", finished())
    write_run(tmp_path / "runs" / long_name, "n0002", finished())
    assert main(["watch", long_name]) == 0  # an experiment's name stands for runs/NAME
    lines = watch_lines(capsys)
    assert [LINE.match(line).group(1) for line in lines] == [
        "runs/%s/n0001" % long_name, "runs/%s/n0002" % long_name, "overall"]
    assert LINE.match(lines[0]).group(2) == (
        "finished (exit 0); ok; steps 6/6, epoch 3/3, 17.5 images/s, loss 1.000")
    assert LINE.match(lines[2]).group(2) == "2 of 2 runs ended (2 ok, 0 failed)"


def test_written_failed_run_exits_1_and_says_why_without_control_characters(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    log = "epoch 0\n\x1b[31mtorch.distributed.elastic: Signal 9 (SIGKILL) received by PID 4242\x1b[0m\n"
    write_run(tmp_path / "runs" / "e", "bad", [header(), epoch(0), end("failed")], state="finished (exit 1)", log=log)
    write_run(tmp_path / "runs" / "e", "good", finished())
    assert main(["watch", "runs/e"]) == 1
    lines = watch_lines(capsys)
    assert lines[0].endswith("runs/e/bad: finished (exit 1); failed; steps 2/6, epoch 1/3, 16.0 images/s, loss 3.000; "
                             "why: local.log:2: torch.distributed.elastic: Signal 9 (SIGKILL) received by PID 4242")
    assert lines[2].endswith("overall: 2 of 2 runs ended (1 ok, 1 failed)")


def test_written_end_record_reason_explains_a_failure_without_log_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs", "r", [header(), end("failed", reason="loss is nan at step 3")], state="finished (exit 1)")
    assert main(["watch", "runs/r"]) == 1
    assert watch_lines(capsys)[0].endswith("why: loss is nan at step 3")


def test_once_reports_a_running_written_run_and_exits_at_once(tmp_path, monkeypatch, capsys):
    """--once (cron): one look, exit 0 while nothing failed even though the run goes on."""
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "runs", "r", [header(), epoch(0)], state=RUNNING_HERE % os.getpid())
    def no_sleep(seconds):
        raise AssertionError("--once slept %g s" % seconds)

    with pytest.MonkeyPatch.context() as patched:  # one look, no wait (time.sleep is the module's, shared)
        patched.setattr(dlaunch.runs.watch.time, "sleep", no_sleep)
        assert main(["watch", "--once", "--interval", "30", "runs/r"]) == 0
    [line] = watch_lines(capsys)
    assert "runs/r: running here (dlaunch pid %d); running; steps 2/6, epoch 1/3" % os.getpid() in line and "ETA" in line
    write_run(tmp_path / "runs", "failed", [header(), end("failed")], state="finished (exit 1)")
    assert main(["watch", "--once", "runs"]) == 1


def test_local_run_whose_dlaunch_died_ends_as_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    write_run(tmp_path / "runs", "r", [header(), epoch(0)], state=RUNNING_HERE % gone.pid)
    assert main(["watch", "runs/r"]) == 1
    assert "dlaunch (pid %d) ended without recording the job's exit" % gone.pid in watch_lines(capsys)[0]


def test_run_directory_never_submitted_ends_after_the_grace_time(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = write_run(tmp_path / "runs", "r", state=None, job_id=None, scheduler="slurm")
    old = time.time() - SUBMIT_GRACE_S - 1
    os.utime(run / "plan.json", (old, old))
    assert main(["watch", "runs/r"]) == 1
    assert "runs/r: not submitted; no metrics yet" in watch_lines(capsys)[0]


class Looks:
    """Counts the watcher's looks at the runs (`dlaunch.runs.watch.observe`), so that a writer thread can wait
    for them instead of sleeping and hoping the watcher keeps up."""

    def __init__(self, monkeypatch) -> None:
        import dlaunch.runs.watch

        self.count = 0
        self.changed = threading.Condition()
        observe = dlaunch.runs.watch.observe

        def counted(runs, **options):
            snapshots = observe(runs, **options)
            with self.changed:
                self.count += 1
                self.changed.notify_all()
            return snapshots

        monkeypatch.setattr(dlaunch.runs.watch, "observe", counted)

    def wait_for_two_more(self, timeout: float = 60) -> None:
        with self.changed:
            target = self.count + 2
            assert self.changed.wait_for(lambda: self.count >= target, timeout), "the watcher stopped looking"


def test_watch_follows_a_written_run_as_records_arrive_one_line_per_change(tmp_path, monkeypatch, capsys):
    """A writer thread plays the trainer and `dlaunch run`: epochs, the end record, the finished state. After
    each write it waits until the watcher has looked at the run twice (so once after the write, whatever the
    machine's speed): every state is seen."""
    monkeypatch.chdir(tmp_path)
    run = write_run(tmp_path / "runs", "r", [header()], state=RUNNING_HERE % os.getpid())
    looks = Looks(monkeypatch)

    def trainer() -> None:
        for record in [epoch(0), epoch(1), epoch(2), end()]:
            looks.wait_for_two_more()
            with open(run / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        looks.wait_for_two_more()
        (run / "state").write_text("finished (exit 0)\n")

    writer = threading.Thread(target=trainer)
    writer.start()
    try:
        assert main(["watch", "--interval", "0.1", "runs/r"]) == 0
    finally:
        writer.join()
    shown = [LINE.match(line).group(2) for line in watch_lines(capsys)]
    assert len(shown) == len(set(shown))  # a line only when something changed
    steps = [int(m.group(1)) for m in (re.search(r"steps (\d+)/6", line) for line in shown) if m]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 6 and set(steps) == {0, 2, 4, 6}
    assert shown[-1] == "finished (exit 0); ok; steps 6/6, epoch 3/3, 17.5 images/s, loss 1.000"


FAKE_QUEUE = {
    # fake squeue: two of our jobs (one pending behind job 4700), the partition's pending queue; a job
    # asked about alone (-o %T) is not in the queue any more
    "squeue": 'case "$*" in\n'
              '  *"-t PENDING"*) printf "4700\\n4712\\n" ;;\n'
              '  *"%i|%T"*) printf "4711|RUNNING|None|2026-11-22T10:00:00|booster\\n'
              '4712|PENDING|Priority|2026-11-22T10:42:00|booster\\n" ;;\n'
              'esac\n',
    "scontrol": 'echo "JobId=${4:-4690} JobState=COMPLETED"\n',  # of one job, or of all it holds: 4690
}


def test_fake_slurm_queue_place_and_start_of_a_pending_job_and_one_squeue_for_all(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "%s:%s" % (install_fakes(tmp_path / "bin", FAKE_QUEUE), os.environ["PATH"]))
    write_run(tmp_path / "runs" / "e", "a", [header(), epoch(0)], state="submitted", scheduler="slurm", job_id="4711")
    write_run(tmp_path / "runs" / "e", "b", state="submitted", scheduler="slurm", job_id="4712")
    write_run(tmp_path / "runs" / "e", "c", finished(), state="submitted",
              scheduler="slurm", job_id="4690")  # not in squeue any more: scontrol says COMPLETED
    assert main(["watch", "--once", "runs/e"]) == 0
    lines = [LINE.match(line).groups() for line in watch_lines(capsys)]
    assert lines[0] == ("runs/e/a", "RUNNING; running; steps 2/6, epoch 1/3, 16.0 images/s (last epoch), loss 3.000, ETA 8s")
    assert lines[1] == ("runs/e/b", "PENDING; no metrics yet; Priority, 2nd in queue, start about 2026-11-22T10:42:00")
    assert lines[2][1].startswith("COMPLETED; ok; steps 6/6")
    assert lines[3] == ("overall", "1 of 3 runs ended (1 ok, 0 failed), 1 running, 1 pending")


@pytest.mark.parametrize("seconds, text", [(5, "5s"), (192, "3m12s"), (7500, "2h05m"), (2 * 86400 + 3600, "2d01h")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_runs_newest_first_and_status_without_arguments_is_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 200)
    for name, mtime in (("older", 1000), ("newest", 3000), ("middle", 2000)):
        run = write_run(tmp_path / "runs" / "e", name, finished())
        os.utime(run / "plan.json", (mtime, mtime))
    assert main(["runs"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("runs/")]
    assert listed == ["runs/e/newest", "runs/e/middle", "runs/e/older"]
    assert main(["status"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("runs/")] == listed
    assert main(["runs", "nowhere"]) == 2


def render(renderable, width: int) -> str:
    """As the dlaunch consoles print it through a pipe (soft wrapping: long lines stay whole)."""
    buffer = StringIO()
    Console(file=buffer, width=width, soft_wrap=True).print(renderable)
    return buffer.getvalue()


STATUS_CELLS = {"site": "juwels-booster", "job": "12345678", "GPUs": "16", "scheduler": "COMPLETED",
                "metrics": "no metrics yet", "epochs": "2/3", "images/s": "2560.0"}


def status_row(path: str) -> tuple:
    """A row of the status table, in the order of its headers (dlaunch/cli/terminal.py)."""
    return tuple({"run": path, "results": path + "/metrics.jsonl"}.get(h, STATUS_CELLS.get(h, "-")) for h in STATUS_HEADERS)


@pytest.mark.parametrize("width", [80, 100, 300])
def test_status_table_keeps_names_and_paths_whole_at_any_width(width):
    path = "runs/juwels-booster-ddp-resnet50/20261122-101010"  # the default experiment and run names
    text = render(fit_table("t", STATUS_HEADERS, [status_row(path)], width, leave_out=STATUS_LEAVE_OUT), width)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    words = text.split()
    assert path in words and "COMPLETED" in words
    if width == 80:  # the least important columns give way, named below the table
        last = text.splitlines()[-1].strip()
        assert last.startswith("left out at 80 columns: ")
        assert set(last[len("left out at 80 columns: "):].split(", ")) <= set(STATUS_LEAVE_OUT)
    if width == 300:
        assert path + "/metrics.jsonl" in words and "juwels-booster" in words and "left out" not in text


def test_status_rows_too_wide_for_a_table_are_stacked_whole():
    path = "runs/juwels-booster-ddp-resnet50-with-a-long-experiment-name/20261122-101010"
    text = render(fit_table("t", STATUS_HEADERS, [status_row(path)], 80, leave_out=STATUS_LEAVE_OUT), 80)
    assert text.splitlines()[1:] == [path, "  " + "; ".join("%s: %s" % (h, v) for h, v in zip(STATUS_HEADERS[1:], status_row(path)[1:]))]


WORDS = st.text(st.sampled_from(string.ascii_letters + string.digits + "/-._()" + " " * 8), max_size=40)
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=":"), max_size=30)  # ':': see below


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.text(string.ascii_letters + " /", min_size=1, max_size=12), min_size=n, max_size=n, unique=True),
    st.lists(st.lists(st.one_of(WORDS, ANY_TEXT), min_size=n, max_size=n), max_size=6),
    st.integers(0, n - 1))), st.integers(10, 120), st.booleans())
def test_print_table_prints_the_lines_fit_table_prints(table, width, terminal):
    """status writes its table's rows as plain lines (tables.print_table): the same lines as rich's table of
    fit_table, through a pipe and on a terminal (its styles too), whatever the cells hold."""
    headers, rows, leaving = table
    shown = []
    for show in (lambda c: c.print(fit_table("t", headers, rows, width, leave_out=headers[len(headers) - leaving:])),
                 lambda c: print_table(c, "t", headers, rows, leave_out=headers[len(headers) - leaving:])):
        buffer = StringIO()
        show(Console(file=buffer, width=width, soft_wrap=True, markup=False, force_terminal=terminal,
                     color_system="truecolor" if terminal else None))
        shown.append(buffer.getvalue())
    assert shown[0] == shown[1]


def test_status_shows_names_as_they_are(tmp_path, monkeypatch, capsys):
    """Run names and notes as the files have them: rich's table and print turned `:rocket:` into an emoji."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 200)
    write_run(tmp_path / "runs" / "e", ":rocket:", [header(), epoch(0), end("failed", reason="x :fire: y")])
    assert main(["status", "runs"]) == 0
    shown = capsys.readouterr().out
    assert "runs/e/:rocket:" in shown.split() and "runs/e/:rocket:: x :fire: y" in shown.splitlines()


def test_an_ended_run_is_read_once_then_taken_from_the_status_cache(tmp_path, monkeypatch, capsys):
    """`status` reads an ended run's files once (dlaunch/runs/statuscache.py); while they are unchanged, the
    next `status` shows the same without reading its plan or metrics; once a file changes, it reads them again."""
    import dlaunch.runs.runstate
    from dlaunch.runs.rundir import RunDir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 200)
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", str(tmp_path / "cache" / "status.json"))
    run = write_run(tmp_path / "runs" / "e", "r", finished())
    assert main(["status", "runs"]) == 0
    first = capsys.readouterr().out
    assert "runs/e/r" in first and "17.5" in first
    reads = []

    with pytest.MonkeyPatch.context() as patched:
        def refused(*args):
            reads.append(args)
            raise AssertionError("read again")

        patched.setattr(RunDir, "plan", refused)
        patched.setattr(dlaunch.runs.runstate, "_read_progress", refused)
        assert main(["status", "runs"]) == 0
        assert capsys.readouterr().out == first and not reads
    (run / "state").write_text(RUNNING_HERE % os.getpid() + "\n")  # resumed: running again
    assert main(["status", "runs"]) == 0
    assert "running here (dlaunch pid %d)" % os.getpid() in capsys.readouterr().out


def test_the_status_cache_is_not_used_for_live_runs_nor_after_another_dlaunch_version(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 200)
    cache = tmp_path / "status.json"
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", str(cache))
    live = write_run(tmp_path / "runs", "live", [header(), epoch(0)], state=RUNNING_HERE % os.getpid())
    write_run(tmp_path / "runs", "ended", finished())
    assert main(["status", "runs"]) == 0
    capsys.readouterr()
    kept = json.loads(cache.read_text())
    assert [os.path.basename(path) for path in kept["runs"]] == ["ended"]
    with open(live / "metrics.jsonl", "a") as f:
        f.write(json.dumps(epoch(1)) + "\n")
    assert main(["status", "runs"]) == 0
    assert re.search(r"runs/live .* 2/3 ", capsys.readouterr().out)
    kept["code"] = "another version"
    kept["runs"][str(tmp_path / "runs" / "ended")]["snapshot"]["state"] = "what another version said"
    cache.write_text(json.dumps(kept))
    assert main(["status", "runs"]) == 0
    assert "what another version said" not in capsys.readouterr().out
    cache.write_text("{not json")  # a broken cache is no cache
    assert main(["status", "runs"]) == 0
    assert "runs/ended" in capsys.readouterr().out


COUNTED_QUEUE = {  # fake squeue and scontrol (no Slurm here) that count their calls: job 4690 ended long ago
    "squeue": 'echo squeue >> "$FAKE_LOG/calls"\n',
    "scontrol": 'echo scontrol >> "$FAKE_LOG/calls"\necho "JobId=${4:-4690} JobState=COMPLETED"\n',
    "sacct": 'echo sacct >> "$FAKE_LOG/calls"\n',
}


def test_status_asks_the_scheduler_about_an_ended_job_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "%s:%s" % (install_fakes(tmp_path / "bin", COUNTED_QUEUE), os.environ["PATH"]))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path))
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", str(tmp_path / "status.json"))
    write_run(tmp_path / "runs" / "e", "c", finished(), state="submitted", scheduler="slurm", job_id="4690")
    assert main(["status", "runs"]) == 0
    assert "COMPLETED" in capsys.readouterr().out
    asked = (tmp_path / "calls").read_text().split()
    assert "squeue" in asked and "scontrol" in asked
    assert main(["status", "runs"]) == 0
    assert "COMPLETED" in capsys.readouterr().out
    assert (tmp_path / "calls").read_text().split() == asked  # nothing asked the second time


# A fake Slurm (no Slurm here) whose jobs all left the queue: the controller still holds 4801 and 4802, the
# accounting database knows 4801-4803 (4803: the controller forgot it), nobody knows 4804. Each call is logged.
FAKE_ACCOUNTING = r"""
import os, sys
command, args = os.path.basename(sys.argv[1]), sys.argv[2:]
with open(os.path.join(os.environ["FAKE_LOG"], "calls"), "a") as log:
    log.write(" ".join([command] + args) + "\n")
jobs = {"4801": dict(JobState="COMPLETED", ExitCode="0:0", Reason="None", ConsumedEnergyRaw="7200", held=True),
        "4802": dict(JobState="FAILED", ExitCode="1:0", Reason="NonZeroExitCode", ConsumedEnergyRaw="0", held=True),
        "4803": dict(JobState="CANCELLED", ExitCode="0:15", Reason="None", ConsumedEnergyRaw="1.50M", held=False)}
if command == "scontrol":  # show job -o [ID]
    wanted = args[3:] or [j for j in jobs if jobs[j]["held"]]
    if any(j not in jobs or not jobs[j]["held"] for j in wanted):
        sys.exit("slurm_load_jobs error: Invalid job id specified")
    for j in wanted:
        print("JobId=%s JobName=r UserId=u(1) JobState=%s Reason=%s Dependency=(null) ExitCode=%s DerivedExitCode=0:0"
              % (j, jobs[j]["JobState"], jobs[j]["Reason"], jobs[j]["ExitCode"]))
elif command == "sacct":  # -j IDS -X --noheader --parsable2 -o JobID,FIELDS
    fields = args[args.index("-o") + 1].split(",")
    for j in args[args.index("-j") + 1].split(","):
        if j in jobs:
            row = dict(jobs[j], JobID=j, State=jobs[j]["JobState"] + (" by 0" if j == "4803" else ""))
            print("|".join(row[f] for f in fields))
"""


def test_status_asks_slurm_once_for_all_jobs_that_left_the_queue_and_each_answer_is_as_asked_alone(tmp_path, monkeypatch):
    from dlaunch.runs import service
    from dlaunch.runs.rundir import find_runs
    from dlaunch.schedulers.slurm import GONE, Slurm

    (tmp_path / "fake.py").write_text(FAKE_ACCOUNTING)
    fakes = {name: 'exec %s %s "$0" "$@"\n' % (sys.executable, tmp_path / "fake.py") for name in ("scontrol", "sacct")}
    fakes["squeue"] = 'echo "squeue $*" >> "$FAKE_LOG/calls"\n'  # every job left the queue
    monkeypatch.setenv("PATH", "%s:%s" % (install_fakes(tmp_path / "bin", fakes), os.environ["PATH"]))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path))
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", str(tmp_path / "status.json"))
    crashed = [header(), epoch(0)]  # no end record: only Slurm says how the job ended
    for job in ("4801", "4802", "4803", "4804"):
        write_run(tmp_path / "runs", "r" + job, finished() if job == "4801" else crashed, state="submitted",
                  scheduler="slurm", job_id=job)
    snapshots = {s.job: s for s in service.observe(find_runs([tmp_path / "runs"]))}
    assert (tmp_path / "calls").read_text().splitlines() == [
        "squeue -h -j 4801,4802,4803,4804 -o %i|%T|%r|%S|%P", "scontrol show job -o",
        "sacct -j 4801,4802,4803,4804 -X --noheader --parsable2 -o JobID,State,ExitCode,Reason,ConsumedEnergyRaw"]
    assert [snapshots[j].state for j in ("4801", "4802", "4803", "4804")] == ["COMPLETED", "FAILED", "CANCELLED", GONE]
    assert "energy 7.2 kJ (Slurm accounting: the job's nodes)" in snapshots["4801"].figures
    # cancelled before its trainer wrote an end record: stopped, not failed, and by whom as Slurm's accounting says
    assert snapshots["4803"].progress.status == "cancelled" and snapshots["4803"].reason == ""
    assert snapshots["4803"].stopped_by == ("cancelled by Slurm (scancel or an administrator, not dlaunch cancel) (before "
                                           "its trainer wrote how it ended); Slurm: CANCELLED by 0, exit code 0:15, "
                                           "reason None")
    kept, alone = Slurm(), Slurm(environ=dict(os.environ, FAKE_ASKED_ALONE="1"))  # no jobs() in its environment
    for job in ("4801", "4802", "4803", "4804"):
        assert kept.end_reason(job) == alone.end_reason(job)
        assert kept.job_energy(job) == alone.job_energy(job)
    assert [kept.job_energy(j) for j in ("4801", "4803")] == [7200.0, 1.5e6]
    assert kept.end_reason("4802") == "FAILED, exit code 1:0, reason NonZeroExitCode" and kept.end_reason("4804") is None


def watch_in_tmux(cwd: Path, argv: List[str], env: dict, timeout: float,
                  on_screen: Callable[[str], None] = lambda screen: None) -> tuple:
    """Run `argv` in an 80x30 tmux terminal until it exits: (exit code, every screen seen, the last screen).
    `on_screen` is called with each screen as it is seen (e.g. to release a held run once it showed)."""
    require(shutil.which("tmux") is not None, "tmux is not installed (scripts/bootstrap.sh full)")
    socket = "dlaunch-test-%d-%d" % (os.getpid(), time.monotonic_ns())
    done = cwd / "tmux-exit-code"
    command = "cd %s && env -u COLUMNS -u LINES %s %s; echo $? > %s; sleep 600" % (  # the terminal's size, not ours
        shlex.quote(str(cwd)), " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in env.items()), shlex.join(argv),
        shlex.quote(str(done)))

    def tmux(*args: str) -> str:
        ran = subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=30)
        assert ran.returncode == 0, ran.stderr
        return ran.stdout

    tmux("new-session", "-d", "-s", "watch", "-x", "80", "-y", "30", command)
    screens: List[str] = []
    try:
        deadline = time.monotonic() + timeout
        while not done.is_file():
            assert time.monotonic() < deadline, "still running after %g s:\n%s" % (timeout, screens[-1:])
            screens.append(tmux("capture-pane", "-p", "-t", "watch"))
            on_screen(screens[-1])
            time.sleep(0.3)
        final = tmux("capture-pane", "-p", "-t", "watch")
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30)
    return int(done.read_text()), screens, final


def test_watch_in_an_80_column_terminal_live_bars_and_whole_names(tmp_path):
    """In tmux: the live view of a written run as a writer thread adds its records, and a failed run."""
    long_name = "an-experiment-with-a-name-long-enough-to-wrap-an-80-column-terminal"
    run = write_run(tmp_path / "runs" / long_name, "r", [header(total_steps=40, steps_per_epoch=2)],
                    state=RUNNING_HERE % os.getpid())
    write_run(tmp_path / "runs" / long_name, "bad", [header(), epoch(0), end("failed", reason="loss is nan at step 3")],
              state="finished (exit 1)")

    name = "runs/%s/r" % long_name
    live_bar_shown = threading.Event()

    def trainer() -> None:  # half-way it waits until the terminal has shown the live bar (no race with the view)
        for n in range(20):
            if n == 10:
                live_bar_shown.wait(120)
            time.sleep(0.2)
            with open(run / "metrics.jsonl", "a") as f:
                f.write(json.dumps(epoch(n, time_s=time.time())) + "\n")
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps(end()) + "\n")
        (run / "state").write_text("finished (exit 0)\n")

    def live_bar(screen: str) -> bool:
        return "━" in screen and "ETA" in screen and name in screen.splitlines() and "running here" in screen

    writer = threading.Thread(target=trainer)
    writer.start()
    try:
        code, screens, final = watch_in_tmux(tmp_path, DLAUNCH + ["watch", "--interval", "0.2", long_name], {}, 120,
                                             on_screen=lambda screen: live_bar(screen) and live_bar_shown.set())
    finally:
        live_bar_shown.set()
        writer.join()
    assert code == 1  # one of the two failed
    # the name is whole on its line, its state wrapped to the next
    assert any(live_bar(s) for s in screens)
    assert name in final.splitlines() and "finished (exit 0)" in final and "steps 40/40" in final, final
    assert "why: loss is nan at step 3" in final and "2 of 2 runs ended (1 ok, 1 failed)" in final, final
    assert not any("…" in s for s in screens + [final])


@pytest.mark.slow
def test_watch_follows_a_real_local_run_through_a_pipe_to_its_end(tmp_path):
    """`dlaunch run --site local` (2 gloo workers) in the background, `dlaunch watch` on it through a pipe. The
    run holds after its first epoch until the watcher has shown it running (tests/holds.py)."""
    hold = Hold(tmp_path)
    run = subprocess.Popen(DLAUNCH + ["run", "--site", "local", "--gpus", "2", "--steps", "6", "--steps-per-epoch", "2",
                                      "--experiment", "e", "--run-name", "r", "--data", "synthetic"] + TINY,
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=dict(os.environ, **hold.env()))
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "runs/e/r/state").is_file():
            assert time.monotonic() < deadline and run.poll() is None, "no run directory"
            time.sleep(0.1)
        watched = run_until_released(DLAUNCH + ["watch", "--interval", "0.2", "runs/e/r"], hold,
                                     r"running; steps [0-5]/6", 600, cwd=tmp_path)
    finally:
        hold.release()
        assert run.wait(timeout=600) == 0
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert not CONTROL.search(watched.stdout)
    shown = [LINE.match(line).group(2) for line in watched.stdout.splitlines()]
    assert shown[0].startswith("running here (dlaunch pid %d)" % run.pid)
    assert any(re.search(r"steps [0-5]/6", line) for line in shown)  # seen while it ran
    assert shown[-1].startswith("finished (exit 0); ok; steps 6/6, epoch 3/3")


def worker_of_rank(root: int, rank: str) -> int:
    """The trainer process of `rank` below process `root` (dlaunch -> bash -> torchrun -> workers)."""
    for pid in step_processes(root):
        try:
            environ = Path("/proc/%d/environ" % pid).read_bytes().split(b"\0")
            argv = Path("/proc/%d/cmdline" % pid).read_bytes().split(b"\0")
        except OSError:
            continue
        if b"RANK=" + rank.encode() in environ and b"dlaunch.train" in argv and not any(a.endswith(b"torchrun") for a in argv):
            return pid
    raise AssertionError("no rank %s trainer below %d" % (rank, root))


@pytest.mark.slow
def test_watch_sees_a_real_local_run_fail_and_exits_1_with_the_reason(tmp_path):
    """A rank of a running 2-worker local run is killed; `dlaunch watch` (through a pipe) ends with 1 and why.
    Both ranks hold after their first epoch, so rank 1 dies at the same place in every run (not mid-collective
    or mid-checkpoint), and rank 0 leaves the hold only on torchrun's SIGTERM."""
    run = subprocess.Popen(DLAUNCH + ["run", "--site", "local", "--gpus", "2", "--steps", "1000", "--steps-per-epoch", "2",
                                      "--experiment", "e", "--run-name", "killed", "--data", "synthetic"] + TINY,
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=dict(os.environ, **Hold(tmp_path).env()))
    try:
        deadline = time.monotonic() + 300
        while read_progress(tmp_path / "runs/e/killed/metrics.jsonl").epochs_done < 1:
            assert time.monotonic() < deadline and run.poll() is None, "no first epoch"
            time.sleep(0.2)
        watch = subprocess.Popen(DLAUNCH + ["watch", "--interval", "0.2", "runs/e/killed"], cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        victim = worker_of_rank(run.pid, "1")
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = watch.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
        run.wait(timeout=60)
    assert watch.returncode == 1, stdout + stderr
    assert not CONTROL.search(stdout)
    last = LINE.match(stdout.splitlines()[-1]).group(2)
    assert last.startswith("finished (exit 1); ") and "; why: local.log:" in last, stdout
    assert "Signal 9 (SIGKILL) received by PID %d" % victim in last, stdout


def test_watching_slurm_jobs_without_slurm_commands_is_refused_but_once_shows_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no squeue: not a login node of the jobs' cluster
    write_run(tmp_path / "runs", "r", [header(), epoch(0)], state="submitted", scheduler="slurm", job_id="4711")
    assert main(["watch", "runs/r"]) == 1
    assert "squeue: command not found" in capsys.readouterr().err
    assert main(["watch", "--once", "runs/r"]) == 0
    assert "runs/r: unknown (squeue: command not found" in watch_lines(capsys)[0]


def test_live_view_of_more_runs_than_the_screen_holds_shows_the_failed_and_running_first(tmp_path, monkeypatch):
    from dlaunch.runs.service import why_failed
    from dlaunch.runs.watch import Watcher, view

    monkeypatch.chdir(tmp_path)
    for i in range(8):
        write_run(tmp_path / "runs" / "study", "ok%d" % i, finished())
    write_run(tmp_path / "runs" / "study", "zz-failed", [header(), end("failed", reason="loss is nan")], state="finished (exit 1)")
    write_run(tmp_path / "runs" / "study", "zz-running", [header(), epoch(0)], state=RUNNING_HERE % os.getpid())
    watcher = Watcher([Path("runs/study")], why_failed)
    buffer = StringIO()
    Console(file=buffer, width=80, height=16).print(view(watcher, watcher.poll(), time.time(), "title", height=16))
    lines = buffer.getvalue().splitlines()
    heads = [line for line in lines if line.startswith("runs/")]
    assert heads == ["runs/study/zz-failed  finished (exit 1)",
                     "runs/study/zz-running  running here (dlaunch pid %d)" % os.getpid(),
                     "runs/study/ok0  finished (exit 0)"]
    assert "7 more not shown (7 ended ok, 0 not ended); `dlaunch runs` lists all" in lines
    assert lines[-1].endswith("9 of 10 runs ended (8 ok, 1 failed), 1 running") and len(lines) <= 16
