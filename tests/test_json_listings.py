"""Every `--json` listing prints one JSON document on stdout whatever happens (issue 47 item 6): `[]` and exit 0 where
there is nothing to list (no runs yet, no run ended yet), an {"error", "exit_code"} object where the command cannot
answer (a path that does not exist, bad input, nothing to compare), beside its `dlaunch: error:` line on stderr."""
import json

import pytest

from dlaunch.cli import main


def json_of(capsys, *args: str):
    """(exit code, stdout parsed as JSON, stderr) of `dlaunch ARGS`."""
    code = main(list(args))
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


@pytest.fixture
def empty(tmp_path, monkeypatch, results_db):
    """A working directory without runs/ and without a results database; `folder` there exists and is empty."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    return tmp_path


@pytest.mark.parametrize("args", [
    ["status", "--json"], ["runs", "--json"], ["status", "folder", "--json"], ["runs", "folder", "--json"],
    ["study", "status", "folder", "--json"], ["results", "--json"], ["results", "--format", "json"],
])
def test_nothing_to_list_is_an_empty_list_and_exit_0(capsys, empty, args):
    code, found, err = json_of(capsys, *args)
    assert (code, found) == (0, [])
    assert "error" not in err


@pytest.mark.parametrize("args,says", [
    (["status", "nowhere", "--json"], "nowhere: no such run directory or folder"),
    (["runs", "nowhere", "--json"], "nowhere: no such run directory or folder"),
    (["study", "status", "nowhere", "--json"], "nowhere: no such study directory"),
    (["results", "--db", "nowhere.sqlite", "--json"], "nowhere.sqlite: no results database"),
    (["results", "-w", "gpus=x", "--format", "json"], "selector 'gpus=x': gpus takes a count"),
    (["results", "compare", "a", "b", "--json"], "no results database"),
    (["results", "compare", "a", "b", "--format=json"], "no results database"),
    (["predict", "--site", "local", "--json"], "--site: site local has no [network] section"),
    (["doctor", "--site", "nowhere", "--json"], "--site: unknown site 'nowhere'"),
    (["sites", "--json", "--bogus"], "No such option: --bogus"),
    (["status", "--json", "--straggler-threshold", "7"], "Invalid value for '--straggler-threshold'"),
])
def test_a_command_that_cannot_answer_prints_its_error_as_json(capsys, empty, args, says):
    code, found, err = json_of(capsys, *args)
    assert code == 2 and found == {"error": found["error"], "exit_code": 2} and says in found["error"]
    assert err == "dlaunch: error: %s\n" % found["error"]  # the same line on stderr


def test_a_comparison_of_runs_the_database_lacks_is_an_error_object(capsys, empty, tmp_path):
    from test_analysis import write_run
    from dlaunch.resultsdb.store import record

    record([write_run(tmp_path / "runs", "r", 1, [1.0, 10.0], experiment="a")])
    code, found, _ = json_of(capsys, "results", "compare", "a", "b", "--json")
    assert code == 2 and "B (b): no ok run with images_per_s in the results database" in found["error"]
    code, found, _ = json_of(capsys, "results", "-w", "experiment=b", "--json")
    assert (code, found) == (0, [])  # a selector that matches nothing: nothing to list


@pytest.mark.parametrize("args", [["sites", "--json"], ["images", "--json"], ["doctor", "--site", "local", "--json"]])
def test_listings_that_always_have_something_print_json(capsys, empty, args):
    code, found, _ = json_of(capsys, *args)
    assert code in (0, 1) and found  # doctor exits 1 when a check fails here


def test_text_listings_say_there_is_nothing_and_exit_0(capsys, empty):
    assert main(["status"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "no run directories under runs\n"
    assert main(["status", "nowhere"]) == 2
    assert capsys.readouterr().err == "dlaunch: error: nowhere: no such run directory or folder\n"
