"""Issue 39 item 1: the trainer's workload options (--compile, --cuda-graphs, --optimizer-impl, --host-syncs) and the
compile time in `dlaunch report` and the results database: runs made with other options are a group of their own."""
import json

import pytest
from typer.testing import CliRunner

from helpers_train import TINY, assert_ok, run_trainer
from dlaunch.analysis.scaling import load_runs
from dlaunch.cli import app
from dlaunch.resultsdb.store import ResultsDB, record
from test_analysis import write_run
from test_report import table_rows

RUNNER = CliRunner(env={"COLUMNS": "250"})
SHORT = ["--steps", "4", "--warmup-steps", "1", "--data", "synthetic", "--site", "local", "--experiment", "opts"]
DEFAULT_LABEL = "opts/local/resnet18/ddp/native b4 t1"  # CPU runs of one thread per rank (--threads 1)


@pytest.mark.slow
def test_runs_with_other_step_options_are_a_group_of_their_own_named_by_them(tmp_path, results_db):
    """Two real CPU runs, one with --optimizer-impl foreach: before, one group of 2 runs (a min-max over both)."""
    runs = tmp_path / "runs"
    for name, options in (("default", []), ("foreach", ["--optimizer-impl", "foreach"])):
        assert_ok(run_trainer(TINY + SHORT + options + ["--metrics", str(runs / name / "metrics.jsonl")], timeout=300))
    out = tmp_path / "report"
    shown = RUNNER.invoke(app, ["report", str(runs), "-o", str(out), "--include-stragglers"])
    assert shown.exit_code == 0, shown.output
    text = (out / "report.md").read_text()
    scaling = table_rows(text, "## Scaling")
    assert [(row[0], row[3]) for row in scaling] == [(DEFAULT_LABEL, "1"), (DEFAULT_LABEL + " --optimizer-impl foreach", "1")]
    assert [(row[0], row[1]) for row in table_rows(text, "## Runs")] == [(DEFAULT_LABEL, "default"),
                                                                          (DEFAULT_LABEL + " --optimizer-impl foreach", "foreach")]
    assert DEFAULT_LABEL + " --optimizer-impl foreach" in shown.stdout  # the console table's title
    rows = {r["run"]: r for r in ResultsDB(results_db).rows()}
    assert sorted(r["step_options"] for r in rows.values()) == ["-", "--optimizer-impl foreach"]


def test_metrics_without_the_options_read_as_the_defaults_and_compile_time_is_listed(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "old", 1, [1.0, 100.0])  # a header from before the options: none recorded
    write_run(runs, "compiled", 1, [1.0, 120.0], config={"compile": "default", "cuda_graphs": True},
              epoch_fields=[{"compile_s": 41.5}, {}])
    old, compiled = sorted(load_runs([str(runs)]).runs, key=lambda r: r.key.step_options)
    assert (old.key.step_options, old.compile_s) == ("-", None)
    assert (compiled.key.step_options, compiled.compile_s) == ("--compile default --cuda-graphs", 41.5)
    assert compiled.throughput == 120.0  # the compiling epoch is warm-up: never in images/s
    out = tmp_path / "report"
    shown = RUNNER.invoke(app, ["report", str(runs), "-o", str(out)])
    assert shown.exit_code == 0, shown.output
    text = (out / "report.md").read_text()
    headers = text.split("## Runs\n\n", 1)[1].splitlines()[0]
    column = [c.strip() for c in headers.strip("|").split(" | ")].index("compile s")
    assert {row[0]: row[column] for row in table_rows(text, "## Runs")} == {
        "scaling/testsite/resnet50/ddp/native b8": "-",
        "scaling/testsite/resnet50/ddp/native b8 --compile default --cuda-graphs": "41.5"}
    assert "compile s" in shown.stdout


def test_the_results_database_keeps_the_options_and_compile_time(tmp_path, results_db):
    write_run(tmp_path, "old", 1, [1.0, 100.0])
    write_run(tmp_path, "fused", 1, [1.0, 110.0], config={"optimizer_impl": "fused", "host_syncs": "minimal"},
              epoch_fields=[{"compile_s": 3.0}, {}])
    record(sorted(tmp_path.rglob("metrics.jsonl")))
    rows = {r["run"]: r for r in ResultsDB(results_db).rows()}
    assert (rows["old"]["step_options"], rows["old"]["compile_s"]) == ("-", None)
    assert (rows["fused"]["step_options"], rows["fused"]["compile_s"]) == ("--optimizer-impl fused --host-syncs minimal", 3.0)
    listed = RUNNER.invoke(app, ["results", "--format", "json", "-w", "step_options=--optimizer-impl fused --host-syncs minimal"])
    assert listed.exit_code == 0, listed.output
    assert [r["run"] for r in json.loads(listed.stdout)] == ["fused"]
    # each is the reference of its own curve: the two options are not one scaling curve
    assert all(r["speedup"] == 1.0 for r in json.loads(RUNNER.invoke(app, ["results", "--format", "json"]).stdout))
