"""`dlaunch report`: tables, report.md, plots, determinism, rejects, reference verdicts, real runs."""

import re

import pytest
from typer.testing import CliRunner

from helpers_train import TINY, assert_ok, run_trainer
from dlaunch.cli import app, main
from dlaunch.reporting.plots import ENERGY_PLOT, PLOTS
from dlaunch.reporting.report import build_results, load_profiles
from dlaunch.analysis.scaling import load_runs
from test_analysis import write_run
from dlaunch.train.metrics_schema import read_metrics

RUNNER = CliRunner(env={"COLUMNS": "250"})  # wide enough for rich to print whole cells
PROFILE = dict(step_s=0.3, compute_s=0.2, comm_s=0.05, data_s=0.05)
SITE = (
    'name = "testsite"\ndescription = "test"\nbased_on = ["nothing"]\nscheduler = "local"\n'
    'gpus_per_node = 4\ncores_per_node = 8\ngpu_vendor = "nvidia"\n'
    "[network]\nlatency_us = 5.0\nbandwidth_gbps_per_node = 800.0\n"
    '[[reference]]\nmodel = "resnet50"\ngpus = 4\nimages_per_s = 1000.0\ntolerance = 0.1\n'
    '[[reference]]\nmodel = "resnet50"\ngpus = 8\nimages_per_s = 2000.0\ntolerance = 0.1\n'
)


def table_rows(markdown: str, heading: str):
    """Cells of the Markdown table under `heading` (header row left out)."""
    lines = markdown.split(heading + "\n\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def _report(*args: object):
    return RUNNER.invoke(app, ["report", *(str(a) for a in args)])


def embedded(markdown: str):
    """The figures report.md embeds."""
    return re.findall(r"!\[[^]]*\]\(([^)]+)\)", markdown)


def results_of(runs, site=None, include_doubtful=False):
    """The report's groups of the runs under `runs` (each judged by its own profile, or `site`)."""
    loaded = load_runs([str(runs)]).runs
    return build_results(loaded, load_profiles(loaded, site), include_doubtful=include_doubtful)


@pytest.fixture
def sweep(tmp_path):
    """A small DDP scaling sweep with profiles and accuracies, plus a site profile with references."""
    runs = tmp_path / "runs"
    for gpus, x, top1 in ((4, 950.0, 0.70), (8, 1700.0, 0.68), (16, 3000.0, 0.65)):
        write_run(runs, "g%d" % gpus, gpus, [100.0, x], top1=[0.3, top1], profile=PROFILE)
    write_run(runs, "cosine-g4", 4, [100.0, 960.0], batch=16, top1=[0.4, 0.72], schedule="cosine")
    site = tmp_path / "testsite.toml"
    site.write_text(SITE)
    return runs, site


def test_report_writes_tables_markdown_and_every_plot(tmp_path, sweep):
    runs, site = sweep
    out = tmp_path / "report"
    result = _report(runs, "--output", out, "--site", site)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(["report.md", "report.html", *PLOTS])
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "report.md").read_text()
    scaling = {(row[0], row[1]): row for row in table_rows(text, "## Scaling")}
    b8 = "scaling/testsite/resnet50/ddp/native b8"
    # X = 950, 1700, 3000 on 4, 8, 16 GPUs -> S_G = X / 950, E_G = S_G / (G / 4)
    assert [[scaling[b8, g][i] for i in (5, 7, 8)] for g in ("4", "8", "16")] == [
        ["950.0", "1.00", "1.000"], ["1700.0", "1.79", "%.3f" % (1700 / 950 / 2)], ["3000.0", "3.16", "%.3f" % (3000 / 950 / 4)]]
    assert [scaling[b8, "16"][i] for i in (4, 6, 9)] == ["-", "-", "-"]  # one run: no spread
    assert scaling[b8, "16"][11:] == ["16.7", "66.7", "16.7"]  # comm/compute/data shares of PROFILE
    assert scaling["scaling/testsite/resnet50/ddp/native b16", "4"][8] == "1.000"  # its own reference
    verdicts = {row[1]: row[-2] for row in table_rows(text, "## Runs")}
    assert verdicts == {"g4": "PASS -5.0%", "g8": "REGRESSION -15.0%", "g16": "no reference", "cosine-g4": "PASS -4.0%"}
    notes = text.split("## Notes\n\n", 1)[1]
    assert "site testsite has no [[reference]] for resnet50 on 16 GPUs: no verdict for 1 run" in notes
    assert str(runs / "scaling" / "g8" / "metrics.jsonl") in text
    assert "E_G = S_G / (G / G_ref)" in text
    assert "scaling/testsite/resnet50/ddp/native b8: runs" in result.output and "REGRESSION -15.0%" in result.output


def test_report_overlays_the_model_when_the_site_has_a_network(tmp_path, sweep):
    runs, site = sweep
    out = tmp_path / "report"
    _report(runs, "--output", out, "--site", site)
    predicted = [row[10] for row in table_rows((out / "report.md").read_text(), "## Scaling") if row[0].endswith("b8")]
    assert predicted[0] == "1.000" and "-" not in predicted  # the b8 group has profiles: pred. E_G filled
    site.write_text(SITE.replace("[network]\nlatency_us = 5.0\nbandwidth_gbps_per_node = 800.0\n", ""))
    _report(runs, "--output", out, "--site", site)
    assert {row[10] for row in table_rows((out / "report.md").read_text(), "## Scaling")} == {"-"}


def test_two_reports_of_the_same_runs_are_byte_identical(tmp_path, sweep):
    runs, site = sweep
    first, second = tmp_path / "one", tmp_path / "two"
    assert _report(runs, "-o", first, "--site", site).exit_code == 0
    assert _report(runs, "-o", second, "--site", site).exit_code == 0
    for name in ["report.md", "report.html", *PLOTS]:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_rejected_files_are_named_and_the_rest_reported(tmp_path, sweep):
    runs, site = sweep
    broken = runs / "scaling" / "broken" / "metrics.jsonl"
    broken.parent.mkdir()
    broken.write_text('{"schema": "dlaunch.metrics", "vers')
    out = tmp_path / "report"
    result = _report(runs, "-o", out, "--site", site)
    assert result.exit_code == 1
    assert "rejected: %s:1:" % broken in result.stderr
    assert main(["report", str(runs), "-o", str(out), "--site", str(site)]) == 1
    text = (out / "report.md").read_text()
    assert "## Rejected files" in text and str(broken) in text and "1700.0" in text


def test_no_valid_file_is_bad_input_and_writes_nothing(tmp_path, capsys):
    foreign = tmp_path / "metrics.jsonl"
    foreign.write_text('{"hello": 1}\n')
    out = tmp_path / "report"
    assert main(["report", str(foreign), "-o", str(out)]) == 2
    stderr = capsys.readouterr().err
    assert "rejected: %s:1: not a dlaunch.metrics record" % foreign in stderr
    assert "dlaunch: error: no valid metrics files in %s" % foreign in stderr
    assert main(["report", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert "missing: no such file or directory" in capsys.readouterr().err
    assert not out.exists()


def test_unknown_sites_of_runs_are_noted_not_fatal(tmp_path):
    write_run(tmp_path / "runs", "g1", 1, [10.0], site="nosuchsite")
    out = tmp_path / "report"
    result = _report(tmp_path / "runs", "-o", out)
    assert result.exit_code == 0, result.output
    assert "nosuchsite" in (out / "report.md").read_text()


def test_site_option_covers_runs_without_a_site(tmp_path, sweep):
    runs, site = sweep
    write_run(tmp_path / "bare", "g4", 4, [100.0, 950.0], site=None)  # e.g. a trainer run outside dlaunch
    out = tmp_path / "report"
    result = _report(tmp_path / "bare", "-o", out, "--site", site)
    assert result.exit_code == 0, result.output
    verdicts = {row[1]: row[-2] for row in table_rows((out / "report.md").read_text(), "## Runs")}
    assert verdicts == {"g4": "PASS -5.0%"}


@pytest.mark.slow
def test_report_on_real_one_and_two_process_runs(tmp_path):
    runs = tmp_path / "runs" / "real"
    for nproc in (1, 2):
        metrics = runs / ("np%d" % nproc) / "metrics.jsonl"
        assert_ok(run_trainer(TINY + ["--steps", "4", "--data", "synthetic", "--profile-steps", "2",
                                      "--metrics", str(metrics)], nproc=nproc, timeout=300))
    out = tmp_path / "report"
    # two processes on this machine's two shared cores may compute unevenly enough to be flagged, and an E_G beyond
    # what noise allows is a state of timing too: the runs are kept in the scaling figures whatever their flag and
    # verdict (the flag's and the verdict's own tests force the states)
    result = _report(tmp_path / "runs", "-o", out, "--include-stragglers", "--include-doubtful")
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert sorted(p.name for p in out.glob("*.png")) == sorted(embedded(text))
    assert {"throughput.png", "speedup.png", "efficiency.png", "time_shares.png"} <= set(embedded(text))
    rows = table_rows(text, "## Scaling")
    assert [(row[1], row[8]) for row in rows] == [("1", "1.000"), ("2", rows[1][8])]  # 1 process: the reference
    assert all(row[12] != "-" for row in rows)  # comm share from the profile records
    assert float(rows[0][11]) == 0 < float(rows[1][11])  # comm %: one process communicates nothing
    assert "resnet18" in result.output


NO_RAPL = "unavailable: no RAPL zones in /sys/class/powercap"


def test_energy_columns_and_plot_appear_when_a_source_exists(tmp_path, sweep):
    runs, site = sweep
    out = tmp_path / "report"
    _report(runs, "-o", out, "--site", site)
    text = (out / "report.md").read_text()
    assert "| J/img |" not in text and not (out / ENERGY_PLOT).exists()  # no source, no column, no plot
    # 8 per GPU x 2 GPUs x 10 steps = 160 images per epoch; the second epoch is the measured one
    write_run(runs, "energy-g2", 2, [100.0, 200.0], experiment="energy",
              energy=[{"gpu": 1000.0, "cpu": NO_RAPL}, {"gpu": 400.0, "cpu": NO_RAPL}],
              end=dict(energy_j={"gpu": 1400.0, "cpu": NO_RAPL}, target_accuracy=0.5, time_to_accuracy_s=30.0,
                       energy_to_accuracy_j=1200.0))
    result = _report(runs, "-o", out, "--site", site)
    assert result.exit_code == 0, result.output
    assert (out / ENERGY_PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "report.md").read_text()
    assert text.index("(efficiency.png)") < text.index("(%s)" % ENERGY_PLOT) < text.index("(time_shares.png)")
    scaling = {row[0]: row for row in table_rows(text, "## Scaling")}
    assert scaling["energy/testsite/resnet50/ddp/native b8"][-2:] == ["2.5", "-"]  # J/img = 400 J / 160 images
    runs_rows = {row[1]: row for row in table_rows(text, "## Runs")}
    # epochs to target (no target recorded), time to acc. s, J/img, kJ/epoch, energy kJ (what it counts),
    # energy to acc. kJ, metrics file
    assert runs_rows["energy-g2"][9:15] == ["-", "30.0", "2.5", "0.40", "1.40 (gpu)", "1.20"]
    assert runs_rows["g4"][9:15] == ["-", "-", "-", "-", "-", "-"]  # unmeasured: a dash, never a zero
    assert "J/img" in result.output and "time to acc. s" in result.output


def test_a_version_1_run_is_reported_beside_version_2_runs(tmp_path, sweep):
    runs, site = sweep
    write_run(runs, "old-g4", 4, [100.0, 900.0], version=1)
    out = tmp_path / "report"
    assert _report(runs, "-o", out, "--site", site).exit_code == 0
    rows = {row[1]: row for row in table_rows((out / "report.md").read_text(), "## Runs")}
    assert rows["old-g4"][6] == "900.0"


def test_diverged_runs_are_listed_apart_and_enter_no_table(tmp_path, sweep):
    runs, site = sweep
    write_run(runs, "nan-g8", 8, [100.0, 99999.0], end=dict(status="diverged", reason="the loss was not finite"))
    out = tmp_path / "report"
    result = _report(runs, "-o", out, "--site", site)
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "99999" not in text.split("## Diverged runs")[0]
    scaling = {(row[0], row[1]): row for row in table_rows(text, "## Scaling")}
    assert [scaling["scaling/testsite/resnet50/ddp/native b8", "8"][i] for i in (3, 5)] == ["1", "1700.0"]  # g8 alone
    assert "nan-g8" not in [row[1] for row in table_rows(text, "## Runs")]
    (row,) = table_rows(text, "## Diverged runs\n\nLeft out of every table and plot above.")
    assert row[1:5] == ["nan-g8", "8", "2", "the loss was not finite"]
    assert "diverged runs (left out of every table above)" in result.output


@pytest.mark.slow
def test_exploding_lr_run_ends_diverged_and_is_absent_from_the_report_tables(tmp_path):
    """Two gloo ranks with --lr 1e6: the loss becomes NaN/inf, both ranks stop together, exit 65."""
    runs = tmp_path / "runs"
    good, bad = runs / "lr0" / "metrics.jsonl", runs / "lr1e6" / "metrics.jsonl"
    common = TINY + ["--num-classes", "5", "--steps-per-epoch", "4", "--warmup-epochs", "0"]
    assert_ok(run_trainer(common + ["--steps", "4", "--metrics", str(good)], nproc=2, timeout=300))
    result = run_trainer(common + ["--steps", "40", "--lr", "1e6", "--max-nonfinite-steps", "2",
                                   "--metrics", str(bad)], nproc=2, timeout=300)
    assert result.returncode != 0  # torchrun reports the workers' exit code 65 as a failure
    assert "exitcode: 65" in result.stderr or "exit code 65" in result.stderr or result.returncode == 65, result.stderr
    end = read_metrics(str(bad)).end
    assert end["status"] == "diverged" and "not finite for 2 consecutive steps" in end["reason"]
    assert end["epochs_completed"] < 10  # stopped early, not after all 40 steps
    out = tmp_path / "report"
    report = _report(runs, "-o", out)
    assert report.exit_code == 0, report.output
    text = (out / "report.md").read_text()
    tables = text.split("## Diverged runs")[0]
    assert "lr1e6" not in tables and "lr0" in tables
    assert "lr1e6" in text.split("## Diverged runs")[1]


def test_repeats_are_reported_as_medians_with_their_spread_and_drawn_as_error_bars(tmp_path):
    runs = tmp_path / "runs"
    for i, x in enumerate([950.0, 900.0, 1000.0, 930.0, 960.0, 1100.0]):  # 6 repeats: a 95% CI of the median
        write_run(runs, "g4-r%d" % (i + 1), 4, [100.0, x])
    for i, x in enumerate([1500.0, 1700.0]):  # 2 repeats: min-max
        write_run(runs, "g8-r%d" % (i + 1), 8, [100.0, x])
    out = tmp_path / "report"
    # spreads of 21 % and 12 %: the quality verdict doubts both points (noisy), kept here to read their spreads
    result = _report(runs, "-o", out, "--include-doubtful")
    assert result.exit_code == 0, result.output
    rows = {row[1]: row for row in table_rows((out / "report.md").read_text(), "## Scaling")}
    x_ref = 955.0  # the median of the six
    assert rows["4"][3:10] == ["6", "95% CI", "955.0", "900.0-1100.0", "1.00", "1.000", "%.3f-%.3f" % (900 / x_ref, 1100 / x_ref)]
    assert rows["8"][3:10] == ["2", "min-max", "1600.0", "1500.0-1700.0", "%.2f" % (1600 / x_ref), "%.3f" % (1600 / x_ref / 2),
                               "%.3f-%.3f" % (1500 / x_ref / 2, 1700 / x_ref / 2)]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    from dlaunch.reporting.plots import plot_scaling

    fig, (ax_x, ax_s, ax_e) = plt.subplots(1, 3)
    plot_scaling(ax_x, ax_s, ax_e, results_of(runs, include_doubtful=True))
    expected = {ax_x: ([900.0, 1500.0], [1100.0, 1700.0]), ax_s: ([900 / x_ref, 1500 / x_ref], [1100 / x_ref, 1700 / x_ref]),
                ax_e: ([900 / x_ref, 1500 / x_ref / 2], [1100 / x_ref, 1700 / x_ref / 2])}
    for ax, (low, high) in expected.items():
        (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        segments = bars.lines[2][0].get_segments()
        assert [s[0][1] for s in segments] == pytest.approx(low) and [s[1][1] for s in segments] == pytest.approx(high)
        assert any("b8 (median, bars: 95% CI or min-max)" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close(fig)


def test_juwels_booster_reference_gives_verdicts_for_one_a100(tmp_path):
    """sites/juwels-booster.toml's [[reference]]: ResNet-50 on one A100, 938 images/s, tolerance 0.25."""
    from test_analysis import write_run

    write_run(tmp_path / "runs", "fast", 1, [100.0, 800.0], site="juwels-booster", experiment="ref")
    write_run(tmp_path / "runs", "slow", 1, [100.0, 600.0], site="juwels-booster", experiment="ref2")
    write_run(tmp_path / "runs", "g4", 4, [100.0, 3000.0], site="juwels-booster", experiment="ref")
    result = _report(tmp_path / "runs", "--output", tmp_path / "report")
    assert result.exit_code == 0, result.output
    runs = {row[1]: row for row in table_rows((tmp_path / "report" / "report.md").read_text(), "## Runs")}
    assert runs["fast"][8] == "PASS %+.1f%%" % (100 * (800 / 938 - 1))  # within 25 % of 938
    assert runs["slow"][8] == "REGRESSION %+.1f%%" % (100 * (600 / 938 - 1))
    assert runs["g4"][8] == "no reference"  # none for 4 GPUs


def test_every_shipped_reference_is_a_published_figure():
    """Each [[reference]] of sites/*.toml is a row of data/published/nvidia_resnet50_a100.csv (model resnet50,
    GPU count, precision: `amp = "fp16"` is NVIDIA's AMP, none is TF32); a site's figure can't drift from its source."""
    import csv
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    with open(repo / "data" / "published" / "nvidia_resnet50_a100.csv", newline="") as f:
        published = {(int(r["gpus"]), r["precision"]): float(r["images_per_s"])
                     for r in csv.DictReader(line for line in f if not line.startswith("#"))}
    checked = 0
    for path in sorted((repo / "sites").glob("*.toml")):
        site = tomllib.loads(path.read_text())
        for ref in site.get("reference", []):
            precision = "amp" if ref.get("amp") == "fp16" else "tf32"
            assert ref["model"] == "resnet50" and "A100" in site["gpu_model"], path
            assert ref["images_per_s"] == published[ref["gpus"], precision], (path, ref)
            checked += 1
    assert checked >= 1  # juwels-booster's one-GPU TF32 figure at least


def test_console_tables_fit_80_columns_cut_no_name_and_say_what_they_left_out(tmp_path, sweep):
    """Issue 37 item 2: at COLUMNS=80 `report` printed 94-96-column tables with no note of what they left out."""
    runs, site = sweep
    write_run(runs, "energy-and-accuracy-g2", 2, [100.0, 200.0], experiment="energy",
              energy=[{"gpu": 1000.0, "cpu": NO_RAPL}, {"gpu": 400.0, "cpu": NO_RAPL}],
              end=dict(energy_j={"gpu": 1400.0, "cpu": NO_RAPL}, target_accuracy=0.5, time_to_accuracy_s=30.0,
                       energy_to_accuracy_j=1200.0))
    out = tmp_path / "report"
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["report", str(runs), "-o", str(out), "--site", str(site)])
    assert result.exit_code == 0, result.output
    *tables, wrote = result.stdout.splitlines()
    assert wrote.startswith("wrote ")  # a path: printed whole, a terminal wraps it
    assert max(len(line) for line in tables) <= 80, "\n".join(line for line in tables if len(line) > 80)
    words = {word for line in tables for word in line.split()}
    assert {"energy-and-accuracy-g2", "cosine-g4", "g16", "scaling/testsite/resnet50/ddp/native"} <= words
    assert "left out at 80 columns: images/s range, E_G range" in result.stdout
    text = (out / "report.md").read_text()
    assert "| images/s range |" in text and "| schedule |" in text  # the files keep every column


def _drawn(ax):
    """Every y value an axis shows: its lines' points and its error bars' ends."""
    from matplotlib.collections import LineCollection

    values = [y for line in ax.get_lines() for y in line.get_ydata()]
    values += [y for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments() for _, y in seg]
    return values


def _ticks(axis):
    return [t.get_text() for t in axis.get_ticklabels()]


PLAIN = re.compile(r"^\d+(\.\d+)?$")  # "20", "0.5": no "2.9x10^1", no mathtext


def test_scaling_plots_have_log2_gpu_axes_with_integer_ticks_plain_values_ideal_lines_markers_and_error_bars(tmp_path):
    """Issue 37 item 4: GPU ticks were "1.0, 2.0", throughput ticks "2.9x10^1", a speed-up point lay below the lowest tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dlaunch.reporting.plots import plot_scaling

    runs = tmp_path / "runs"
    for gpus in (4, 8, 16, 32, 64, 128, 256, 512, 1024):
        for repeat, x in enumerate((0.97, 1.0, 1.03)):
            write_run(runs, "ddp-g%d-r%d" % (gpus, repeat), gpus, [1.0, 900.0 * gpus / 4 * 0.99 ** (gpus // 4) * x])
    for gpus in (4, 8, 16):
        path = write_run(runs, "hvd-g%d" % gpus, gpus, [1.0, 800.0 * gpus / 4], experiment="hvd")
        path.write_text(path.read_text().replace('"framework": "ddp"', '"framework": "horovod"'))
    fig, axes = plt.subplots(1, 3)
    plot_scaling(*axes, results_of(runs))
    ax_x, ax_s, ax_e = axes
    for ax in axes:
        assert _ticks(ax.xaxis) == ["4", "8", "16", "32", "64", "128", "256", "512", "1024"]
        assert ax.xaxis.get_scale() == "log" and ax.xaxis._scale.base == 2
        labels = _ticks(ax.yaxis)
        assert labels and all(PLAIN.match(t) for t in labels), labels
        ticks = [float(t) for t in labels]
        drawn = _drawn(ax)
        assert min(ticks) <= min(drawn) and max(drawn) <= max(ticks)  # no point outside the labelled ticks
    # ideal lines, dotted: X_ref G / G_ref, G / G_ref, E_G = 1
    ideal_s = [line for line in ax_s.get_lines() if line.get_linestyle() == ":" and len(line.get_xdata()) == 9]
    assert [list(line.get_ydata()) for line in ideal_s] == [[g / 4 for g in (4, 8, 16, 32, 64, 128, 256, 512, 1024)]]
    assert any(line.get_linestyle() == ":" and list(line.get_ydata()) == [1.0, 1.0] for line in ax_e.get_lines())
    assert any(line.get_linestyle() == ":" and line.get_ydata()[-1] == pytest.approx(900.0 * 0.99 * 256) for line in ax_x.get_lines())
    # one marker per framework (DDP circles, Horovod squares), error bars over the repeats
    from matplotlib.container import ErrorbarContainer

    bars = {c.get_label(): c for c in ax_e.containers if isinstance(c, ErrorbarContainer)}
    assert {label: c.lines[0].get_marker() for label, c in bars.items()} == {
        "hvd/testsite/resnet50/horovod/native b8": "s", "scaling/testsite/resnet50/ddp/native b8 (median, bars: min-max)": "o"}
    assert len(bars["scaling/testsite/resnet50/ddp/native b8 (median, bars: min-max)"].lines[2][0].get_segments()) == 9
    plt.close(fig)


def test_a_slower_second_gpu_has_plain_ticks_and_lies_above_the_lowest_tick(tmp_path):
    """Two CPU processes slower than one: images/s 29 and 26, S_G 0.9 (the case of the issue's screenshots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dlaunch.reporting.plots import plot_scaling

    write_run(tmp_path / "runs", "np1", 1, [20.0, 29.0], site=None)
    write_run(tmp_path / "runs", "np2", 2, [20.0, 26.0], site=None)
    fig, axes = plt.subplots(1, 3)
    plot_scaling(*axes, results_of(tmp_path / "runs"))
    for ax in axes:
        assert _ticks(ax.xaxis) == ["1", "2"]
        labels = _ticks(ax.yaxis)
        assert all(PLAIN.match(t) for t in labels), labels
        assert min(float(t) for t in labels) <= min(_drawn(ax))
    assert _ticks(axes[1].yaxis) == ["0.5", "1", "2"]  # S_G = 26 / 29 lies above 0.5
    plt.close(fig)


def test_a_figure_without_data_is_neither_written_nor_embedded(tmp_path):
    """Issue 37 item 4: three plots were empty axes with a note, and still embedded in report.md."""
    runs = tmp_path / "runs"
    write_run(runs, "g4", 4, [100.0, 950.0])  # no profile, no validation accuracy
    write_run(runs, "g8", 8, [100.0, 1700.0])
    out = tmp_path / "report"
    out.mkdir()
    (out / "time_shares.png").write_bytes(b"an earlier report's figure")
    result = _report(runs, "-o", out)
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert embedded(text) == ["throughput.png", "speedup.png", "efficiency.png"]
    assert sorted(p.name for p in out.glob("*.png")) == ["efficiency.png", "speedup.png", "throughput.png"]


def test_one_gpu_count_draws_no_speed_up_or_efficiency(tmp_path):
    """Issue 37 item 4: a report of one GPU count drew S_G and E_G as one point at (1, 1) on an axis out to 2."""
    runs = tmp_path / "runs"
    write_run(runs, "g4-r0", 4, [100.0, 950.0])
    write_run(runs, "g4-r1", 4, [100.0, 940.0])
    out = tmp_path / "report"
    out.mkdir()
    (out / "speedup.png").write_bytes(b"an earlier report's figure")
    result = _report(runs, "-o", out)
    assert result.exit_code == 0, result.output
    assert embedded((out / "report.md").read_text()) == ["throughput.png"]
    assert sorted(p.name for p in out.glob("*.png")) == ["throughput.png"]
    assert "Speed-up S_G against GPUs" not in (out / "report.html").read_text()  # the figure's title
    write_run(runs, "g8", 8, [100.0, 1700.0])  # a second count: both drawn
    assert _report(runs, "-o", out).exit_code == 0
    assert embedded((out / "report.md").read_text()) == ["throughput.png", "speedup.png", "efficiency.png"]


def test_dollars_in_an_experiment_name_are_drawn_as_written(tmp_path):
    """Issue 37 item 11: matplotlib read `$...$` as mathtext; `cost$_$` ended `report` in a ParseSyntaxException."""
    runs = tmp_path / "runs"
    for experiment in ("cost$_$", "a$5"):
        write_run(runs, "g4", 4, [100.0, 950.0], experiment=experiment, top1=[0.3, 0.5], profile=PROFILE)
        write_run(runs, "g8", 8, [100.0, 1700.0], experiment=experiment, top1=[0.3, 0.5], profile=PROFILE)
    out = tmp_path / "report"
    result = _report(runs, "-o", out)
    assert result.exit_code == 0, result.output
    assert sorted(embedded((out / "report.md").read_text())) == sorted(PLOTS)
    assert "cost$_$/testsite/resnet50/ddp/native b8" in result.output


def test_a_run_made_with_a_profile_path_is_judged_by_the_profile_its_directory_kept(tmp_path):
    """Issue 37 item 10: a run made with `--site path/to/my-site.toml` was reported with "no profile"."""
    runs = tmp_path / "runs"
    for gpus, x in ((4, 950.0), (8, 1700.0)):
        path = write_run(runs, "g%d" % gpus, gpus, [100.0, x], site="my-site", profile=PROFILE)
        (path.parent / "site.toml").write_text(SITE.replace('"testsite"', '"my-site"'))  # as `dlaunch run` keeps it
    out = tmp_path / "report"
    result = _report(runs, "-o", out)
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "no profile" not in text.split("## Definitions")[0] and "no profile" not in result.stderr
    assert {row[1]: row[-2] for row in table_rows(text, "## Runs")} == {"g4": "PASS -5.0%", "g8": "REGRESSION -15.0%"}
    assert [row[10] for row in table_rows(text, "## Scaling")][0] == "1.000"  # predicted from the kept [network]
    assert "my-site: 2 runs by the profile their run directories kept (site.toml)" in text


def test_a_kept_profile_that_is_a_link_or_invalid_is_not_used(tmp_path):
    runs = tmp_path / "runs"
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(SITE.replace('"testsite"', '"my-site"'))
    (write_run(runs, "linked", 4, [100.0, 950.0], site="my-site").parent / "site.toml").symlink_to(elsewhere)
    (write_run(runs, "broken", 4, [100.0, 950.0], site="my-site").parent / "site.toml").write_text("name = 5\n")
    out = tmp_path / "report"
    result = _report(runs, "-o", out)
    assert result.exit_code == 0, result.output
    assert {row[1]: row[-2] for row in table_rows((out / "report.md").read_text(), "## Runs")} == {
        "broken": "no profile", "linked": "no profile"}
    assert "the kept profile of run %s is not valid here" % (runs / "scaling" / "broken" / "metrics.jsonl") in result.stderr
    assert "site 'my-site' of the runs: no profile" in result.stderr


def test_the_efficiency_budget_is_a_table_per_gpu_count_and_a_plot(tmp_path):
    """Issue 36: report holds the budget, from ideal to the measured E_G (dlaunch/analysis/budget.py's rows)."""
    from test_efficiency import budget_runs

    budget_runs(tmp_path / "runs")
    out = tmp_path / "report"
    result = _report(tmp_path / "runs", "-o", out)
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    g2, g4 = table_rows(text, "## Efficiency budget\n\nPer GPU count, from ideal (1.000) to the measured E_G: the share of "
                              "the ideal lost to each cause (communication, stragglers, data, compute, epoch overhead, other) "
                              "against the group's reference G_ref (definitions below); the parts and E_G add up to 1.")
    assert g2[1:] == ["2", "1.000", "149.6", "0.000", "0.000", "0.000", "0.000", "0.000", "0.000"]
    t4 = 0.194  # the step time behind X at 4 GPUs (tests/test_efficiency.py)
    assert g4[1:] == ["4", "%.3f" % (0.1496 / t4), "194.0", "%.3f" % (0.01 / t4), "%.3f" % (0.008 / t4),
                      "%.3f" % (0.01 / t4), "0.000", "%.3f" % ((0.03 - 0.0136) / t4), "0.000"]  # compute: the median's
    assert 1 - sum(float(v) for v in g4[4:]) == pytest.approx(float(g4[2]), abs=0.003)
    assert "efficiency_budget.png" in embedded(text)
    assert (out / "efficiency_budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "scaling/testsite/resnet50/ddp/native b8: efficiency budget" in result.stdout


def test_a_budget_without_recorded_phases_is_neither_shown_nor_drawn(tmp_path, sweep):
    runs, site = sweep  # version 2 files: no phases, no overhead
    out = tmp_path / "report"
    result = _report(runs, "-o", out, "--site", site)
    text = (out / "report.md").read_text()
    assert "## Efficiency budget" not in text and not (out / "efficiency_budget.png").exists()
    assert "4 runs (metrics version 2 files, written before epoch overhead was recorded) recorded no epoch " \
           "overhead, so images/s is the steps-only rate: g4, g8, g16, cosine-g4" in result.stderr


def _flagged_sweep(root):
    """2 and 4 GPUs (version 4), a 4-GPU run whose rank 3 computed 30 % slower, and one with a power-capped GPU (fake NVML)."""
    from test_analysis import v4_fields
    from test_efficiency import FAKE_HEALTHY, FAKE_POWER_CAPPED
    from dlaunch.train.metrics_schema import VERSION

    equal2, equal4, slow = v4_fields([0.1, 0.1]), v4_fields([0.1] * 4), v4_fields([0.1, 0.1, 0.1, 0.13])
    capped = v4_fields([0.1] * 4, gpu=[FAKE_HEALTHY, FAKE_POWER_CAPPED, FAKE_HEALTHY, FAKE_HEALTHY])
    write_run(root, "g2", 2, [1.0, 200.0], epoch_fields=[equal2] * 2, version=VERSION, gpus_per_node=1)
    write_run(root, "g4", 4, [1.0, 380.0], epoch_fields=[equal4] * 2, version=VERSION, gpus_per_node=1)
    write_run(root, "g4-slow", 4, [1.0, 290.0], epoch_fields=[slow] * 2, version=VERSION, gpus_per_node=1)
    write_run(root, "g4-capped", 4, [1.0, 300.0], epoch_fields=[capped] * 2, version=VERSION, gpus_per_node=1)


def test_stragglers_and_throttled_gpus_are_listed_apart_and_left_out_unless_included(tmp_path):
    """Issue 36: such runs stay out of the scaling figures unless --include-stragglers, and are listed apart."""
    _flagged_sweep(tmp_path / "runs")
    out = tmp_path / "report"
    result = _report(tmp_path / "runs", "-o", out)
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert [row[1] for row in table_rows(text, "## Runs")] == ["g2", "g4"]
    assert [(row[1], row[3], row[5]) for row in table_rows(text, "## Scaling")] == [("2", "1", "200.0"), ("4", "1", "380.0")]
    apart = {row[1]: row[3] for row in table_rows(text, "## Stragglers and throttled GPUs\n\n2 run(s) with a straggler or a "
                                                        "throttled GPU (threshold: each site profile's straggler_threshold "
                                                        "(0.1 without one)) are left out of the tables and plots "
                                                        "(--include-stragglers keeps them).")}
    assert apart == {"g4-capped": "n1 GPU of local rank 1: SM clock 1095 of 1410 MHz (78 %), power cap: throttled",
                     "g4-slow": "n3 rank 3 (local rank 0) computed 30 % slower than the median of the ranks: a straggler; "
                                "this run's E_G is understated"}
    assert "runs with a straggler or a throttled GPU" in result.stdout and "g4-slow" in result.stdout
    included = _report(tmp_path / "runs", "-o", out, "--include-stragglers")
    assert included.exit_code == 0, included.output
    text = (out / "report.md").read_text()
    assert [row[1] for row in table_rows(text, "## Runs")] == ["g2", "g4-capped", "g4-slow", "g4"]
    assert "are kept in the tables and plots (--include-stragglers): their E_G is understated" in text
    # with them, 4 GPUs spread 290-380 (30 % of 300): a noisy point, set apart unless included, naming the flags
    assert [row[1] for row in table_rows(text, "## Scaling")] == ["2"]
    quality = {row[1]: row for row in table_rows(text, "## Measurement quality")}
    assert quality["4"][8] == "noisy (set apart)"
    assert "likely: flagged runs among them (straggler, throttled; kept by --include-stragglers)" in quality["4"][9]
    both = _report(tmp_path / "runs", "-o", out, "--include-stragglers", "--include-doubtful")
    assert both.exit_code == 0, both.output
    text = (out / "report.md").read_text()
    assert [(row[1], row[3], row[5]) for row in table_rows(text, "## Scaling")][1] == ("4", "3", "300.0")


def test_the_straggler_threshold_comes_from_the_flag_or_the_profile_the_run_kept(tmp_path, capsys):
    _flagged_sweep(tmp_path / "runs")
    out = tmp_path / "report"
    text = lambda: (out / "report.md").read_text()  # noqa: E731
    assert _report(tmp_path / "runs", "-o", out, "--straggler-threshold", "0.5").exit_code == 0
    # 30 % slower and a clock at 78 % of its maximum are within 50 %: nothing apart
    assert [row[1] for row in table_rows(text(), "## Runs")] == ["g2", "g4-capped", "g4-slow", "g4"]
    for run in ("g2", "g4", "g4-slow", "g4-capped"):
        (tmp_path / "runs" / "scaling" / run / "site.toml").write_text(SITE.replace("[network]", "straggler_threshold = 0.25\n[network]"))
    assert _report(tmp_path / "runs", "-o", out).exit_code == 0
    assert [row[1] for row in table_rows(text(), "## Runs")] == ["g2", "g4-capped", "g4"]  # 30 % > 25 %; 78 % > 75 %
    shutil_out = tmp_path / "not-written"
    assert main(["report", str(tmp_path / "runs"), "-o", str(shutil_out), "--straggler-threshold", "1.5"]) == 2
    assert "--straggler-threshold" in capsys.readouterr().err and not shutil_out.exists()


def test_many_groups_print_a_line_each_and_figures_say_which_groups_they_draw(tmp_path):
    """5,000 runs in 1,000 groups (issue 37 item 12): per-group console tables and 1,000 curves in one figure are
    neither readable nor fast; the files keep every table."""
    runs = tmp_path / "runs"
    for i in range(11):
        for gpus in (1, 2):
            write_run(runs, "g%d" % gpus, gpus, [50.0, {1: 100.0, 2: 180.0}[gpus]], experiment="e%02d" % i)
    out = tmp_path / "report"
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["report", str(runs), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "11 groups: images/s and E_G at each group's largest GPU count" in result.stdout
    assert "e10/testsite/resnet50/ddp/native b8  2     1-2   180.0     0.900" in result.stdout
    assert ": runs" not in result.stdout  # no per-group tables
    text = (out / "report.md").read_text()
    assert len(table_rows(text, "## Runs")) == 22
    assert "_The figures draw the first 10 of the 11 groups with data" in text
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    from dlaunch.reporting.plots import plot_scaling

    fig, axes = plt.subplots(1, 3)
    plot_scaling(*axes, results_of(runs))
    assert [c.get_label().split("/")[0] for c in axes[0].containers if isinstance(c, ErrorbarContainer)] == [
        "e%02d" % i for i in range(10)]
    plt.close(fig)


def test_counts_take_their_nouns_in_the_right_number(tmp_path, sweep):
    """Issue 37 item 9: "1 groups", "on 1 GPUs"."""
    runs, site = sweep
    write_run(tmp_path / "one", "g1", 1, [100.0, 250.0])
    out = tmp_path / "report"
    result = _report(tmp_path / "one", "-o", out, "--site", site)
    assert "site testsite has no [[reference]] for resnet50 on 1 GPU: no verdict for 1 run" in result.stderr
    assert "1 run in 1 group; 0 diverged runs apart; 0 files rejected." in (out / "report.md").read_text()


def test_help_shows_brackets_as_written():
    """Help is plain text (issue 37 item 6): a markup escape would show as a backslash."""
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["report", "--help"])
    assert "site's [network]" in " ".join(result.output.split()) and "\\[" not in result.output
    assert "--include-stragglers" in result.output and "--straggler-threshold" in result.output
