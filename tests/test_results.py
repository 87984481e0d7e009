"""The results database: rows of ended runs, concurrent writers, rebuild, selectors, `dlaunch results`
(list, compare with the exact Mann-Whitney test, CSV/JSON/Markdown), history verdicts."""
import csv
import io
import json
import multiprocessing
import random
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlaunch.cli import app, main
from prerequisites import require_library
from dlaunch.resultsdb.compare import history_verdict, left_out_of_scaling, mann_whitney, smallest_p, with_history, with_scaling
from dlaunch.resultsdb.store import NETWORK_FILESYSTEMS, SCHEMA_VERSION, ResultsDB, filesystem_type, journal_mode, record
from dlaunch.train.metrics_schema import VERSION
from test_analysis import v4_fields, write_run

RUNNER = CliRunner(env={"COLUMNS": "250"})


def results(*args: object):
    return RUNNER.invoke(app, ["results", *(str(a) for a in args)])


def rows_as_json(db: Path) -> list:
    shown = results("--format", "json", "--db", db)
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.stdout)


def two_experiments(root: Path) -> None:
    """ddp and horovod on 1 and 2 GPUs, 4 repeats each: horovod clearly faster on 2 GPUs, alike on 1."""
    for framework, experiment in (("ddp", "exp-ddp"), ("horovod", "exp-hvd")):
        for i in range(4):
            write_run(root, "g1-r%d" % i, 1, [1.0, 100.0 + i], experiment=experiment, gpus_per_node=1)
            x = (180.0 if framework == "ddp" else 195.0) + i
            write_run(root, "g2-r%d" % i, 2, [1.0, x], experiment=experiment, gpus_per_node=1)
    for path in root.rglob("metrics.jsonl"):  # write_run writes ddp: set the framework the experiment ran
        if "exp-hvd" in str(path):
            path.write_text(path.read_text().replace('"framework": "ddp"', '"framework": "horovod"'))


def test_rows_land_once_per_run_and_a_changed_run_is_updated(tmp_path, results_db):
    first = write_run(tmp_path / "runs", "a", 2, [10.0, 200.0, 220.0], top1=[0.1, 0.5, 0.8], end={"target_accuracy": 0.7})
    assert record([first]).rows == 1
    assert record([first]).rows == 0  # unchanged file: skipped
    (row,) = rows_as_json(results_db)
    assert (row["run"], row["experiment"], row["gpus"], row["status"]) == ("a", "scaling", 2, "ok")
    assert row["images_per_s"] == pytest.approx(210.0)  # as report: the first of several epochs left out
    assert (row["epochs_to_target"], row["target_accuracy"]) == (3, 0.7)
    assert row["pins"] == {"torch": "2.14.1"} and row["provenance"]["metrics_file"] == str(first)
    assert row["speedup"] == 1.0 and row["efficiency"] == 1.0
    first.write_text(first.read_text().replace('"images_per_s": 220.0', '"images_per_s": 240.0'))
    assert record([first]).rows == 1
    (row,) = rows_as_json(results_db)
    assert row["images_per_s"] == pytest.approx(220.0)


def test_a_run_without_end_record_has_no_row(tmp_path, results_db):
    path = write_run(tmp_path, "running", 1, [10.0])
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-1]))  # no end record yet
    assert record([path]).rows == 0
    assert not results_db.exists()  # no database is created while no run has ended


def _end_together(barrier, path: str, db: str, queue) -> None:
    """One process of several: wait until all are ready, then record its run as `dlaunch status` does."""
    barrier.wait()
    queue.put([record([Path(path)], Path(db)).warning, record([Path(path)], Path(db)).warning])


def test_runs_ending_together_all_land_in_the_database(tmp_path, results_db):
    """Eight processes write at the same moment (a barrier, not timing): every row lands, none is lost
    to 'database is locked' (with no busy timeout and deferred transactions several were)."""
    paths = [write_run(tmp_path / "runs", "r%d" % i, 1 + i % 2, [10.0, 100.0 + i]) for i in range(8)]
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(len(paths)), context.Queue()
    workers = [context.Process(target=_end_together, args=(barrier, str(p), str(results_db), queue)) for p in paths]
    for worker in workers:
        worker.start()
    warnings = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert warnings == [[None, None]] * len(paths)
    assert sorted(r["run"] for r in rows_as_json(results_db)) == ["r%d" % i for i in range(8)]
    conn = sqlite3.connect(str(results_db))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_deleting_the_database_and_rebuilding_gives_the_same_rows(tmp_path, results_db):
    two_experiments(tmp_path / "runs")
    record(sorted((tmp_path / "runs").rglob("metrics.jsonl")))
    before = rows_as_json(results_db)
    assert len(before) == 16
    for path in results_db.parent.glob(results_db.name + "*"):
        path.unlink()
    assert main(["results", "rebuild", str(tmp_path / "runs"), "--db", str(results_db)]) == 0
    assert rows_as_json(results_db) == before


def test_rebuild_keeps_rows_of_runs_elsewhere_unless_pruned_and_names_unreadable_files(tmp_path, results_db, capsys):
    gone = write_run(tmp_path / "old", "gone", 1, [10.0])
    write_run(tmp_path / "runs", "here", 1, [10.0])
    record([gone])
    gone.unlink()
    broken = tmp_path / "runs" / "x" / "broken" / "metrics.jsonl"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json\n")
    assert main(["results", "rebuild", str(tmp_path / "runs")]) == 1
    assert "rejected: %s:1:" % broken in capsys.readouterr().err
    assert sorted(r["run"] for r in rows_as_json(results_db)) == ["gone", "here"]
    main(["results", "rebuild", str(tmp_path / "runs"), "--prune"])
    assert [r["run"] for r in rows_as_json(results_db)] == ["here"]


def test_compare_two_experiments_per_model_and_gpu_count_in_csv_and_markdown(tmp_path, results_db):
    two_experiments(tmp_path / "runs")
    record(sorted((tmp_path / "runs").rglob("metrics.jsonl")))
    shown = results("compare", "exp-ddp", "experiment=exp-hvd", "--format", "csv")
    assert shown.exit_code == 0, shown.output
    rows = {int(r["gpus"]): r for r in csv.DictReader(io.StringIO(shown.stdout))}
    assert sorted(rows) == [1, 2]  # matched per GPU count: the framework tells the sides apart
    two = rows[2]
    assert (float(two["a_median"]), float(two["b_median"]), two["a_runs"], two["b_runs"]) == (181.5, 196.5, "4", "4")
    assert float(two["change_pct"]) == pytest.approx(100 * (196.5 / 181.5 - 1))
    assert float(two["p_value"]) == pytest.approx(2 / 70) and two["significant"] == "yes"
    assert float(rows[1]["p_value"]) == 1.0 and rows[1]["significant"] == "no"
    assert (two["a_low"], two["a_high"], two["a_spread"]) == ("180.0", "183.0", "min-max")
    shown = results("compare", "exp-ddp", "exp-hvd", "--format", "markdown")
    assert shown.exit_code == 0, shown.output
    assert "changed: experiment exp-ddp -> exp-hvd; framework ddp -> horovod" in shown.stdout
    table = [line for line in shown.stdout.splitlines() if line.startswith("| 2 |")]
    assert table == ["| 2 | 181.5 | 180-183 | 4 | 196.5 | 195-198 | 4 | +8.3 | 0.0286 | yes |"]
    assert "Mann-Whitney U" in shown.stdout


def test_three_repeats_a_side_can_never_be_significant(tmp_path, results_db):
    for experiment, base in (("a", 100.0), ("b", 200.0)):
        for i in range(3):
            write_run(tmp_path, "r%d" % i, 1, [1.0, base + i], experiment=experiment)
    record(sorted(tmp_path.rglob("metrics.jsonl")))
    shown = results("compare", "a", "b", "--format", "json")
    (match,) = json.loads(shown.stdout)
    assert match["p_value"] == pytest.approx(0.1) and match["significant"] == "no (too few runs: p >= 0.1)"


def test_selectors_filter_by_date_pins_and_keys_and_bad_ones_are_bad_input(tmp_path, results_db, capsys):
    two_experiments(tmp_path / "runs")
    record(sorted((tmp_path / "runs").rglob("metrics.jsonl")))
    # write_run's end records are at t=1200 s: 1970-01-01T00:20:00Z
    assert len(rows_as_json(results_db)) == 16
    listed = results("--where", "framework=horovod,gpus=2", "--where", "date=1970-01-01..1970-01", "--format", "json")
    assert sorted(r["run"] for r in json.loads(listed.stdout)) == ["g2-r0", "g2-r1", "g2-r2", "g2-r3"]
    assert json.loads(results("-w", "date=1971..", "--format", "json").stdout) == []
    assert len(json.loads(results("-w", "pins.torch=2.14.1", "--format", "json").stdout)) == 16
    assert main(["results", "-w", "colour=red"]) == 2
    assert "dlaunch: error: selector 'colour=red': unknown key 'colour'" in capsys.readouterr().err
    assert main(["results", "compare", "exp-ddp", "nosuch"]) == 2
    assert "B (nosuch): no ok run with images_per_s" in capsys.readouterr().err


def test_the_table_keeps_whole_names_at_80_columns(tmp_path, results_db):
    write_run(tmp_path, "a-long-run-name-kept-whole-0001", 1, [1.0, 10.0], experiment="an-experiment")
    record(sorted(tmp_path.rglob("metrics.jsonl")))
    shown = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["results"])
    assert shown.exit_code == 0
    table = shown.stdout.split("left out at 80 columns: ")[0].splitlines()
    assert any("a-long-run-name-kept-whole-0001" in line for line in table)
    assert max(len(line) for line in table) <= 80
    assert "database: %s" % results_db in shown.stdout  # the path whole, on a line of its own


def test_history_verdict_against_the_recent_median_with_the_sites_tolerance(tmp_path, results_db):
    site = tmp_path / "histsite.toml"
    site.write_text('name = "histsite"\ndescription = "t"\nbased_on = ["nothing"]\nscheduler = "local"\n'
                    'gpus_per_node = 4\ncores_per_node = 8\ngpu_vendor = "nvidia"\n'
                    '[[reference]]\nmodel = "resnet50"\ngpus = 1\nimages_per_s = 1000.0\ntolerance = 0.2\n')
    paths = []
    for i, x in enumerate((1000.0, 1010.0, 990.0, 850.0, 700.0)):
        path = write_run(tmp_path / "runs", "r%d" % i, 1, [1.0, x], site=str(site))
        text = path.read_text().replace('"time": 1000.0', '"time": %.1f' % (10000.0 * i + 1000))
        path.write_text(text.replace('"time": 1200.0', '"time": %.1f' % (10000.0 * i + 1200)))
        paths.append(path)
    record(paths)
    verdicts = {r["run"]: r["history"] for r in json.loads(results("--format", "json").stdout)}
    assert verdicts["r0"] is None and verdicts["r2"] is None  # fewer than 3 earlier runs
    assert verdicts["r3"] == "PASS -15.0% vs last 3 (tol. 20%)"  # within the reference's 20 %
    assert verdicts["r4"] == "REGRESSION -29.6% vs last 4 (tol. 20%)"  # median 995


def test_a_database_that_cannot_be_written_warns_and_the_command_succeeds(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "runs" / "e" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"plan": {"scheduler": "local", "site": "local"}, "request": {}}))
    (run_dir / "state").write_text("finished (exit 0)\n")
    write_run(tmp_path / "m", "r", 1, [10.0]).replace(run_dir / "metrics.jsonl")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("DLAUNCH_RESULTS_DB", str(blocked / "results.sqlite"))  # its folder is a file
    assert main(["status", str(run_dir)]) == 0
    assert "dlaunch: warning: results database %s not written" % (blocked / "results.sqlite") in capsys.readouterr().err
    monkeypatch.setenv("DLAUNCH_RESULTS_DB", str(tmp_path / "ok.sqlite"))
    assert main(["status", str(run_dir)]) == 0
    assert [r["run"] for r in ResultsDB(tmp_path / "ok.sqlite").rows()] == ["r"]


def test_foreign_and_newer_databases_are_refused_naming_the_file(tmp_path, capsys):
    foreign = tmp_path / "foreign.sqlite"
    foreign.write_text("not a database at all, just text " * 20)
    assert main(["results", "--db", str(foreign)]) == 2
    assert "dlaunch: error: %s: not a dlaunch results database" % foreign in capsys.readouterr().err
    newer = tmp_path / "newer.sqlite"
    sqlite3.connect(str(newer)).execute("PRAGMA user_version = 99")
    assert main(["results", "--db", str(newer)]) == 2
    assert "schema version 99; this dlaunch knows up to %d" % SCHEMA_VERSION in capsys.readouterr().err


def test_wal_on_local_file_systems_rollback_journal_on_shared_ones(tmp_path):
    assert journal_mode(tmp_path / "x.sqlite") == "WAL"
    # A mount table as on a site whose home is Lustre (cannot be mounted here: a fake file, named so).
    fake_mounts = tmp_path / "mounts"
    fake_mounts.write_text("/dev/sda1 / ext4 rw 0 0\n10.0.0.1@o2ib:/home /p/home lustre rw 0 0\n")
    assert filesystem_type(Path("/p/home/user/runs"), str(fake_mounts)) == "lustre" in NETWORK_FILESYSTEMS
    assert filesystem_type(Path("/tmp/x"), str(fake_mounts)) == "ext4"


def test_exact_mann_whitney_agrees_with_scipy():
    require_library("scipy")
    import scipy.stats as scipy_stats
    rng = random.Random(4)
    for n, m in ((3, 3), (4, 5), (6, 2), (7, 7)):
        a = [rng.uniform(90, 110) for _ in range(n)]
        b = [rng.uniform(95, 120) for _ in range(m)]
        u, p = mann_whitney(a, b)
        expected = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="exact")
        assert (u, p) == pytest.approx((expected.statistic, expected.pvalue))
    a, b = [1.0, 2.0, 2.0, 3.0], [2.0, 3.0, 3.0, 4.0, 5.0]  # ties: the exact permutation test of U
    expected = scipy_stats.permutation_test((a, b), lambda x, y: scipy_stats.mannwhitneyu(x, y).statistic,
                                            permutation_type="independent", alternative="two-sided", n_resamples=10 ** 6)
    assert mann_whitney(a, b)[1] == pytest.approx(expected.pvalue)
    assert smallest_p(3, 3) == pytest.approx(0.1) and smallest_p(4, 4) == pytest.approx(2 / 70)


@pytest.mark.slow
def test_a_local_run_lands_in_the_database_when_it_ends(tmp_path, results_db):
    shown = RUNNER.invoke(app, ["run", "--site", "local", "--gpus", "1", "--output", str(tmp_path / "runs"),
                                "--experiment", "local-exp", "--model", "resnet18", "--image-size", "32",
                                "--batch-size", "2", "--steps", "3", "--warmup-steps", "1", "--threads", "1",
                                "--device", "cpu", "--workers", "0", "--num-classes", "10"])
    assert shown.exit_code == 0, shown.output
    (row,) = ResultsDB(results_db).rows()
    assert (row["experiment"], row["site"], row["status"], row["gpus"]) == ("local-exp", "local", "ok", 1)
    assert row["pins"]["torch"] and row["request"]["options"]["model"] == "resnet18"


def test_header_time_keeps_two_runs_of_one_name_apart(tmp_path, results_db):
    one = write_run(tmp_path / "out1", "n0001", 1, [10.0])
    two = write_run(tmp_path / "out2", "n0001", 1, [20.0])
    two.write_text(two.read_text().replace('"time": 1000.0', '"time": 5000.0'))
    record([one, two])
    assert len(ResultsDB(results_db).rows()) == 2


def test_the_version_of_a_record_in_a_row_does_not_matter(tmp_path, results_db):
    """A version 1 file (no energy) has a row too, its energy columns empty."""
    path = write_run(tmp_path, "v1", 1, [10.0, 20.0], version=1)
    record([path])
    (row,) = ResultsDB(results_db).rows()
    assert row["energy_j"] is None and row["images_per_s"] == 20.0


def test_a_row_keeps_the_runs_straggler_and_throttle_flags(tmp_path, results_db):
    slow = v4_fields([0.1, 0.2, 0.1, 0.1], ranks_per_node=2)
    flagged = write_run(tmp_path, "slow", 4, [1.0, 50.0], epoch_fields=[slow, slow], version=VERSION)
    equal = v4_fields([0.1, 0.1])
    fine = write_run(tmp_path, "fine", 2, [1.0, 50.0], epoch_fields=[equal, equal], version=VERSION)
    old = write_run(tmp_path, "old", 2, [1.0, 50.0], version=3)
    record([flagged, fine, old])
    rows = {r["run"]: r for r in rows_as_json(results_db)}
    assert rows["slow"]["flags"] == [{"kind": "straggler", "message": "n0 rank 1 (local rank 1) computed 100 % slower "
                                                                      "than the median of the ranks: a straggler; this run's E_G is understated"}]
    assert rows["fine"]["flags"] == [] and rows["old"]["flags"] is None  # none found; not recorded


def test_scaling_figures_leave_straggler_runs_out_as_the_report_does(tmp_path, results_db):
    slow, equal = v4_fields([0.1, 0.2]), v4_fields([0.1, 0.1])
    runs = [write_run(tmp_path, "g2", 2, [1.0, 100.0], epoch_fields=[equal, equal], version=VERSION),
            write_run(tmp_path, "g2-slow", 2, [1.0, 50.0], epoch_fields=[slow, slow], version=VERSION),
            write_run(tmp_path, "g4", 4, [1.0, 180.0], epoch_fields=[equal, equal], version=VERSION)]
    record(runs)
    rows = {r["run"]: r for r in rows_as_json(results_db)}
    assert rows["g2-slow"]["flags"][0]["kind"] == "straggler"
    assert rows["g4"]["speedup"] == pytest.approx(1.8)  # against g2 alone (with g2-slow's 50 in the median: 2.4)
    assert rows["g2"]["speedup"] == 1.0 and rows["g2-slow"]["speedup"] is None and rows["g2-slow"]["efficiency"] is None
    listed = results("--db", results_db, "--format", "markdown").stdout  # the E_G cell says why it is empty
    (line,) = [line for line in listed.splitlines() if line.startswith("| g2-slow ")]
    assert "| - (straggler) |" in line, line


def test_a_row_is_judged_at_the_straggler_threshold_of_the_profile_its_run_kept(tmp_path, results_db):
    """Issue 36: rows were judged at the default threshold whatever the kept profile said, so S_G and E_G left out
    a run that `dlaunch report` keeps, and `results` did not say why."""
    from test_report import SITE

    slow = v4_fields([0.1, 0.2])  # rank 1 a third slower than the median of the ranks
    runs = [write_run(tmp_path / "kept", "g2-kept", 2, [1.0, 100.0], epoch_fields=[slow, slow], version=VERSION),
            write_run(tmp_path / "plain", "g2-plain", 2, [1.0, 100.0], epoch_fields=[slow, slow], version=VERSION)]
    (runs[0].parent / "site.toml").write_text(SITE.replace("[network]", "straggler_threshold = 0.5\n[network]"))
    record(runs)
    rows = {r["run"]: r for r in with_scaling(ResultsDB(results_db).rows())}
    assert (rows["g2-kept"]["flags"], rows["g2-kept"]["flags_threshold"], rows["g2-kept"]["efficiency"]) == ([], 0.5, 1.0)
    assert [f["kind"] for f in rows["g2-plain"]["flags"]] == ["straggler"] and rows["g2-plain"]["flags_threshold"] == 0.1
    assert rows["g2-plain"]["efficiency"] is None and left_out_of_scaling(rows["g2-plain"]) == "straggler"
    assert left_out_of_scaling(rows["g2-kept"]) is None


def test_why_a_row_has_no_scaling_figures():
    row = {"status": "ok", "images_per_s": 10.0, "flags": None}
    assert left_out_of_scaling(row) is None  # not judged (metrics before version 4): kept, as report keeps it
    assert left_out_of_scaling(dict(row, status="failed")) == "status failed"
    assert left_out_of_scaling(dict(row, images_per_s=None)) == "no images/s"
    flags = [{"kind": "throttled", "message": "n1 ..."}, {"kind": "straggler", "message": "n0 ..."}]
    assert left_out_of_scaling(dict(row, flags=flags)) == "straggler and throttled"


def test_a_throttled_gpu_leaves_a_row_out_of_scaling_as_report_leaves_it_out(tmp_path, results_db):
    """One rule: before, the database left out stragglers only, and report both."""
    from test_efficiency import FAKE_POWER_CAPPED

    equal, capped = v4_fields([0.1, 0.1]), v4_fields([0.1, 0.1], gpu=[FAKE_POWER_CAPPED, FAKE_POWER_CAPPED])
    record([write_run(tmp_path, "g1", 1, [1.0, 100.0], epoch_fields=[v4_fields([0.1])] * 2, version=VERSION),
            write_run(tmp_path, "g2", 2, [1.0, 180.0], epoch_fields=[equal, equal], version=VERSION),
            write_run(tmp_path, "g2-capped", 2, [1.0, 20.0], epoch_fields=[capped, capped], version=VERSION)])
    rows = {r["run"]: r for r in rows_as_json(results_db)}
    assert rows["g2-capped"]["efficiency"] is None and rows["g2"]["efficiency"] == pytest.approx(0.9)


def history_row(rng: random.Random, uid: int) -> dict:
    """A fabricated database row for the history verdict: one of a few keys, random times (some ending
    before they start, many sharing an end time), some not ok or without images/s."""
    started = rng.randrange(10, 400)
    return {"uid": "u%d" % uid, "site": "-", "model": rng.choice(("resnet50", "resnet18")), "gpus": rng.choice((1, 8)),
            "amp": "none", "framework": rng.choice(("ddp", "horovod")), "loader": "native", "batch_per_gpu": 64, "step_options": "-",
            "status": "failed" if rng.random() < 0.1 else "ok", "images_per_s": None if rng.random() < 0.1 else rng.uniform(80, 120),
            "started": "2026-10-01T00:%04d" % started, "ended": "2026-10-01T00:%04d" % (started + rng.randrange(-5, 60))}


def test_history_verdicts_from_the_index_are_those_of_every_row_scanned():
    rng = random.Random(7)
    rows = [history_row(rng, i) for i in range(1500)]
    judged = with_history(rows, rows)
    expected = [history_verdict(row, rows, None) for row in rows]
    assert [r["history"] for r in judged] == expected
    assert sum(v is not None for v in expected) > 1000 and any(v and v.startswith("REGRESSION") for v in expected)


def test_a_version_1_database_is_upgraded_and_its_rows_judged_when_read_again(tmp_path, results_db):
    slow = v4_fields([0.1, 0.2])
    path = write_run(tmp_path, "slow", 2, [1.0, 50.0], epoch_fields=[slow, slow], version=VERSION)
    record([path])
    conn = sqlite3.connect(str(results_db))  # the database as schema version 1 left it: no flags column
    for column in ("flags", "flags_threshold", "step_options", "compile_s",  # nor those of version 3
                   "device", "threads", "measured_steps", "step_compute_s", "engine", "architecture", "updates",
                   "scheduler"):  # and version 4's
        conn.execute("ALTER TABLE runs DROP COLUMN %s" % column)
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    (row,) = ResultsDB(results_db).rows()
    assert row["run"] == "slow" and row["flags"] is None and row["step_options"] == "-"  # upgraded: not judged yet
    assert sqlite3.connect(str(results_db)).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert record([path]).rows == 1  # the unchanged file is read again after the upgrade
    (row,) = ResultsDB(results_db).rows()
    assert [f["kind"] for f in row["flags"]] == ["straggler"] and row["flags_threshold"] == 0.1
