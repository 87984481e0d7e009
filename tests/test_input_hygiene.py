"""NaN and infinity in float flags: refused by the launcher before anything is written or submitted.

The launcher runs the trainer's own parser (dlaunch/train/config.py, torch-free) on the trainer flags, so a
value that the trainer refuses is refused by `dlaunch run --dry-run` too: exit 2, one line naming the
flag. (The trainer side, every float flag, is in tests/test_train_config.py.)

Absurd figures in a metrics file (1e308 images/s, whose mean overflowed: `OverflowError: intermediate overflow in
fsum`; an integer too large for a float): every command that reads runs rejects the file in one line naming it and
the field, and goes on with the others.
"""
import pytest

import dlaunch.cli
from dlaunch.cli import main
from dlaunch.jobs.request import TRAINER_FLAGS
from hostile import ABSURD_FIELDS, ABSURD_FIGURES, absurd_metrics, kept_promises, sandbox, write_run

FLOAT_FLAGS = sorted("--" + flag.name for flag in TRAINER_FLAGS if flag.kind is float)


def test_the_launcher_passes_the_issue_s_float_flags():
    assert {"--lr", "--momentum", "--weight-decay", "--grad-clip", "--fusion-threshold-mb",
            "--warmup-epochs"} <= set(FLOAT_FLAGS)


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_dry_run_refuses_a_non_finite_float_flag_naming_it(flag, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dlaunch.cli.out, "width", 300)
    assert main(["run", "--site", "local", "--dry-run", flag, value]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("dlaunch: error: ") and flag in lines[0] and "not a finite number" in lines[0]
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_a_finite_value_of_the_same_flag_renders(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--site", "local", "--dry-run", "--lr", "0.1", "--max-nonfinite-steps", "3"]) == 0
    script = capsys.readouterr().out
    assert "--lr 0.1" in script and "--max-nonfinite-steps 3" in script


READERS = [["report", "runs", "-o", "report"], ["status", "runs"], ["runs", "--json"], ["watch", "--once", "runs"],
           ["results", "rebuild", "runs"], ["predict", "--site", "juwels", "--from-runs", "runs/exp/bad", "--gpus", "8"],
           ["archive", "runs/exp", "-o", "x.tar.gz"]]


@pytest.mark.parametrize("value", ABSURD_FIGURES, ids=["1e308", "-1e308", "int400", "1e19"])
@pytest.mark.parametrize("index,field", ABSURD_FIELDS, ids=[f for _, f in ABSURD_FIELDS])
def test_report_rejects_a_run_with_an_absurd_figure_in_one_line(index, field, value):
    with sandbox() as box:
        write_run(box.work, "exp/good")
        write_run(box.work, "exp/bad", files={"metrics.jsonl": absurd_metrics(index, field, value)})
        outcome = box.run("report", "runs", "-o", "report")
        kept_promises(outcome, codes=(0, 1), may_change=["work/report", "work/runs/results.sqlite",
                                                         "work/runs/results.status-cache.json"])
        (line,) = [line for line in outcome.err.splitlines() if "bad" in line]
        assert line.startswith("rejected: runs/exp/bad/metrics.jsonl:") and repr(field) in line, outcome


@pytest.mark.parametrize("value", [1e308, 10**400], ids=["1e308", "int400"])
@pytest.mark.parametrize("command", READERS, ids=[" ".join(c[:2]) for c in READERS])
def test_every_reader_of_runs_refuses_an_absurd_throughput_without_a_traceback(command, value):
    with sandbox() as box:
        write_run(box.work, "exp/good")
        write_run(box.work, "exp/bad", files={"metrics.jsonl": absurd_metrics(1, "images_per_s", value)})
        outcome = box.run(*command)
        kept_promises(outcome, codes=(0, 1, 2), may_change=["work/report", "work/runs", "work/x.tar.gz"])
        assert "'images_per_s'" in outcome.out + outcome.err or command[0] == "archive", outcome  # archive: files as they are
