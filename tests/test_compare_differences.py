"""`dlaunch results compare` names everything that differs between its sides (issue 47 item 4): the trainer options
each run was given, its image, node count, library versions, ..., not only the experiment's name."""
import json
from pathlib import Path

from test_analysis import write_run
from typer.testing import CliRunner

from dlaunch import api
from dlaunch.cli import app
from dlaunch.resultsdb.store import record

RUNNER = CliRunner(env={"COLUMNS": "250"})


def with_header(path: Path, options: dict, **fields) -> Path:
    """The run's metrics file with `options` as the trainer options its request was given, and more header fields."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["request"] = {"framework": "ddp", "world_size": records[0]["world_size"], "options": options}
    records[0].update(fields)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def new_users_runs(root: Path) -> None:
    """The issue's case: `tiny` (threads 2 at 1 process, 1 at 2) against `prof` (threads 1, profile steps 20),
    three repeats each on 1 and 2 processes; prof at 2 processes on 2 nodes where tiny ran on one."""
    tiny_threads = {1: 2, 2: 1}
    for i in range(3):
        for gpus in (1, 2):
            tiny = write_run(root, "g%d-r%d" % (gpus, i), gpus, [1.0, 10.0 * gpus + i], experiment="tiny", gpus_per_node=2)
            with_header(tiny, {"model": "resnet50", "steps": 20, "threads": tiny_threads[gpus]})
            prof = write_run(root, "g%d-r%d" % (gpus, i), gpus, [1.0, 65.0 * gpus + i], experiment="prof",
                             gpus_per_node=1)
            with_header(prof, {"model": "resnet50", "steps": 20, "threads": 1, "profile-steps": 20},
                        image="/images/current-ddp-x86_64.sif", versions={"torch": "2.15.0"})


def test_compare_lists_every_option_and_fact_that_differs_not_only_the_experiment(tmp_path, results_db):
    new_users_runs(tmp_path / "runs")
    record(sorted((tmp_path / "runs").rglob("metrics.jsonl")))
    shown = RUNNER.invoke(app, ["results", "compare", "tiny", "prof"])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    changed = next(line for line in lines if line.startswith("changed: "))
    assert changed == ("changed: experiment tiny -> prof; stack - -> current; image - -> /images/current-ddp-x86_64.sif; "
                       "--profile-steps default -> 20")  # `stack`: the image's
    assert "versions: torch 2.14.1 -> 2.15.0" in lines
    # what differs only at one GPU count: tiny's 1-process runs had 2 threads, its 2-process runs one node
    assert "changed at gpus 1: --threads 2 -> 1" in lines
    assert "changed at gpus 2: nodes 1 -> 2" in lines
    assert not any("--steps" in line for line in lines)  # the same on both sides: not a difference

    compared = api.compare("tiny", "prof")
    assert compared.changed["experiment"] == ["tiny", "prof"] and compared.changed["--profile-steps"] == [None, 20]
    assert compared.pins == {"torch": ["2.14.1", "2.15.0"]}
    rows = {row.key["gpus"]: row for row in compared.rows}
    assert rows[1].changed == {"--threads": [2, 1]} and rows[2].changed == {"nodes": [1, 2]}
    assert json.loads(RUNNER.invoke(app, ["results", "compare", "tiny", "prof", "--json"]).stdout)["rows"][0]["changed"]


def test_a_side_whose_runs_differ_among_themselves_says_so(tmp_path, results_db):
    """Repeats of side A given different thread counts: the match lists A's values, B's one."""
    for i, threads in enumerate((1, 2, 2)):
        with_header(write_run(tmp_path, "r%d" % i, 1, [1.0, 100.0 + i], experiment="a"), {"threads": threads})
        with_header(write_run(tmp_path, "r%d" % i, 1, [1.0, 110.0 + i], experiment="b"), {"threads": 2})
    record(sorted(tmp_path.rglob("metrics.jsonl")))
    (row,) = api.compare("a", "b").rows
    assert row.changed == {"--threads": [[1, 2], 2]}
    shown = RUNNER.invoke(app, ["results", "compare", "a", "b"])
    assert "changed at model resnet50: --threads 1 or 2 -> 2" in shown.stdout.splitlines()  # one row: its first key


def test_sides_alike_but_for_the_experiment_say_only_that(tmp_path, results_db):
    for experiment in ("a", "b"):
        for i in range(3):
            with_header(write_run(tmp_path, "r%d" % i, 1, [1.0, 100.0 + i], experiment=experiment), {"threads": 1})
    record(sorted(tmp_path.rglob("metrics.jsonl")))
    compared = api.compare("a", "b")
    assert compared.changed == {"experiment": ["a", "b"]} and compared.pins == {}
    assert [row.changed for row in compared.rows] == [{}]


def test_the_report_says_what_else_tells_its_groups_apart(tmp_path, results_db):
    """report over the two experiments: their labels differ by the experiment's name; below the Scaling table, what
    else their runs were given or ran with, per group."""
    new_users_runs(tmp_path / "runs")
    shown = RUNNER.invoke(app, ["report", str(tmp_path / "runs"), "-o", str(tmp_path / "report")])
    assert shown.exit_code == 0, shown.output
    text = (tmp_path / "report" / "report.md").read_text()
    said = text.split("The groups differ beyond their labels in what their runs were given or ran with:\n\n")[1]
    assert said.split("\n\n")[0].splitlines() == [
        "- prof/testsite/resnet50/ddp/native b8: stack current; image /images/current-ddp-x86_64.sif; nodes 1 or 2; "
        "--profile-steps 20; --threads 1; version torch 2.15.0",
        "- tiny/testsite/resnet50/ddp/native b8: stack -; image -; nodes 1; --profile-steps default; --threads 1 or 2; "
        "version torch 2.14.1"]  # 2 processes on 2 nodes (prof) or one (tiny)


def test_a_report_of_groups_alike_says_nothing_more(tmp_path, results_db):
    for experiment in ("a", "b"):
        for gpus in (1, 2):
            with_header(write_run(tmp_path / "runs", "g%d" % gpus, gpus, [1.0, 10.0 * gpus], experiment=experiment),
                        {"threads": 1})
    shown = RUNNER.invoke(app, ["report", str(tmp_path / "runs"), "-o", str(tmp_path / "report")])
    assert shown.exit_code == 0, shown.output
    assert "differ beyond their labels" not in (tmp_path / "report" / "report.md").read_text()
