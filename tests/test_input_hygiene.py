"""NaN and infinity in float flags: refused by the launcher before anything is written or submitted.

The launcher runs the trainer's own parser (dlaunch/train/config.py, torch-free) on the trainer flags, so a
value that the trainer refuses is refused by `dlaunch run --dry-run` too: exit 2, one line naming the
flag. (The trainer side, every float flag, is in tests/test_train_config.py.)
"""
import pytest

import dlaunch.cli
from dlaunch.cli import main
from dlaunch.jobs.request import TRAINER_FLAGS

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
