"""`--straggler-threshold` on `status`, `runs` and `watch` (issue 36 item 3: settable on the command line, as for
`report`), and `straggler_threshold=` of api.status and api.watch: a finished run whose recorded phases put rank 1 6 % over the
median rank (written as the trainer writes them, so no timing decides it) is flagged at 5 % and not at 20 %."""
import json
import re

import pytest

from dlaunch import api
from dlaunch.cli import main
from test_watch import end, header, site_profile, v4_epoch, write_run

FLAG = r"straggler: n1 rank 1 \(local rank 0\) computed 6 % slower than the median"


@pytest.fixture
def ended_run(tmp_path, monkeypatch):
    """runs/e/ended: ended ok; its measured epochs (the warm-up one left out) put rank 1 6 % over the median rank."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLAUNCH_STATUS_CACHE", str(tmp_path / "cache.json"))
    warm, equal, late = [0.1, 0.5], [0.1, 0.1], [0.1, 0.14]
    epochs = [v4_epoch(0, warm), v4_epoch(1, equal), v4_epoch(2, equal), v4_epoch(3, late)]
    run = write_run(tmp_path / "runs" / "e", "ended", [header(8)] + epochs + [end()], state="finished (exit 0)")
    (run / "site.toml").write_text(site_profile(0.10))  # the profile the run kept: 10 %
    return run


def flags_of(capsys, argv):
    capsys.readouterr()
    assert main(argv) == 0
    (seen,) = json.loads(capsys.readouterr().out)
    return api.RunStatus.from_dict(seen).flags


@pytest.mark.parametrize("command", [["status", "runs/e"], ["status"], ["runs"]])
def test_status_and_runs_flag_at_the_threshold_given(ended_run, capsys, command):
    assert flags_of(capsys, command + ["--json"]) == []  # the profile's 10 %
    (flag,) = flags_of(capsys, command + ["--json", "--straggler-threshold", "0.05"])
    assert re.match(FLAG, flag), flag
    assert flags_of(capsys, command + ["--json", "--straggler-threshold", "0.2"]) == []


def test_watch_flags_at_the_threshold_given(ended_run, capsys):
    capsys.readouterr()
    assert main(["watch", "--once", "runs/e", "--straggler-threshold", "0.05"]) == 0
    assert re.search(FLAG, capsys.readouterr().out)
    assert main(["watch", "--once", "runs/e", "--straggler-threshold", "0.2"]) == 0
    assert "straggler" not in capsys.readouterr().out


def test_the_apis_status_and_watch_take_it(ended_run):
    (strict,) = api.status(["runs/e"], straggler_threshold=0.05)
    assert len(strict.flags) == 1 and re.match(FLAG, strict.flags[0])
    assert api.status(["runs/e"], straggler_threshold=0.2)[0].flags == []
    assert api.watch(["runs/e"], interval=0.1, timeout=0, straggler_threshold=0.05)[0].flags == strict.flags


@pytest.mark.parametrize("value", ["1.5", "0", "abc", "nan"])
@pytest.mark.parametrize("command", [["status", "runs/e"], ["runs"], ["watch", "--once", "runs/e"]])
def test_a_bad_threshold_is_one_line_naming_the_flag_exit_2(ended_run, capsys, command, value):
    capsys.readouterr()
    assert main(command + ["--straggler-threshold", value]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("dlaunch: error: Invalid value for '--straggler-threshold': ") and captured.out == ""


def test_the_api_refuses_a_bad_threshold_with_the_same_line(ended_run):
    for call in (lambda: api.status(["runs/e"], straggler_threshold=1.5),
                 lambda: api.watch(["runs/e"], timeout=0, straggler_threshold=0.0)):
        with pytest.raises(api.DlaunchError, match="^Invalid value for '--straggler-threshold': straggler threshold"):
            call()
