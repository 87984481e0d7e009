"""The hang timeout (issue 44) from the site profile's `hang_timeout`, or `--hang-timeout` on run and sweep, reaches
the trainer through the rendered job; a bad value is refused in one line naming the file and the field."""

import re
from pathlib import Path

import pytest

from dlaunch.cli import main

LOCAL = (Path(__file__).resolve().parent.parent / "sites" / "local.toml").read_text()


def profile(folder: Path, line: str) -> Path:
    path = folder / "site.toml"
    path.write_text(LOCAL.replace("[scheduler]", line + "\n\n[scheduler]"))
    return path


def trainer_line(out: str) -> list:
    return re.findall(r"--hang-timeout \S+", out)


def test_the_profiles_hang_timeout_reaches_the_trainer_and_the_flag_overrides_it(tmp_path, capsys):
    site = str(profile(tmp_path, "hang_timeout = 90"))
    assert main(["run", "--site", site, "--dry-run"]) == 0
    assert trainer_line(capsys.readouterr().out) == ["--hang-timeout 90.0"]
    assert main(["run", "--site", site, "--hang-timeout", "30", "--dry-run"]) == 0
    assert trainer_line(capsys.readouterr().out) == ["--hang-timeout 30.0"]
    assert main(["sweep", "--site", site, "--gpus", "1,2", "--dry-run"]) == 0
    assert trainer_line(capsys.readouterr().out) == ["--hang-timeout 90.0"] * 2
    assert main(["run", "--site", "local", "--dry-run"]) == 0
    assert trainer_line(capsys.readouterr().out) == []  # no profile value: the trainer's default (watchdog.py)
    assert main(["run", "--site", str(profile(tmp_path, "hang_timeout = 0")), "--dry-run"]) == 0
    assert trainer_line(capsys.readouterr().out) == ["--hang-timeout 0.0"]  # off


@pytest.mark.parametrize("value", ["1", "-5", "nan", "inf", '"ten"'])
def test_a_bad_hang_timeout_in_the_profile_is_refused_naming_file_and_field(tmp_path, capsys, value):
    site = profile(tmp_path, "hang_timeout = %s" % value)
    assert main(["run", "--site", str(site), "--dry-run"]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert "site.toml" in line and "hang_timeout" in line, line
    assert captured.out == ""


def test_a_bad_hang_timeout_flag_is_refused_in_one_line(capsys):
    assert main(["run", "--site", "local", "--hang-timeout", "1", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "dlaunch: error: trainer options: --hang-timeout 1.0 must be 0 (off) or at least 2 seconds")
