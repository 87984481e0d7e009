"""Site profiles beyond rendering: partition rows picked by the job's size, source dates, `sites check`
warnings, `sites migrate` (first schema -> current)."""
import datetime
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dlaunch.cli import main
from dlaunch.errors import DlaunchError
from dlaunch.jobs.request import LaunchRequest
from dlaunch.jobs.sitecheck import age_warnings, check_warnings, migrate, source_dates
from dlaunch.jobs.sites import SHIPPED_SITES_DIR, load_site, resolve_site
from test_backends import V1
from test_launcher_fakes import plan_for


def site(name: str):
    return load_site(SHIPPED_SITES_DIR / ("%s.toml" % name))


def request(site_name: str, **fields) -> LaunchRequest:
    return LaunchRequest(site=site_name, account="proj42", experiment="exp", **fields)


@pytest.mark.parametrize("site_name, nodes, row, partition, qos", [
    ("frontier", 128, "batch-92", "batch", None),  # OLCF's 92-183 node bin
    ("leonardo-booster", 128, "boost_qos_bprod", "boost_usr_prod", "boost_qos_bprod"),  # 65-256 full nodes
    ("frontier", 2, "batch", "batch", None),  # the default row when it fits
])
def test_a_row_is_picked_by_the_job_size_and_named(site_name, nodes, row, partition, qos):
    plan = plan_for(site(site_name), request(site_name, nodes=nodes))
    assert plan.partition == row
    assert "--partition=%s" % partition in plan.directives
    assert ("--qos=%s" % qos in plan.directives) if qos else not any(d.startswith("--qos") for d in plan.directives)
    if row == site(site_name).partition(None).name:
        assert plan.notes == ()
    else:
        (note,) = plan.notes
        assert note.startswith("partition %s (" % row) and "chosen for %d node(s)" % nodes in note


def test_the_time_picks_a_row_too():
    """Frontier: 12 h on 12 nodes is the `extended` row (64 nodes, 24 h), not the default batch bin (2 h)."""
    assert plan_for(site("frontier"), request("frontier", nodes=12, time="12:00:00")).partition == "extended"


def test_rows_marked_auto_false_are_used_only_when_named(tmp_path):
    text = (SHIPPED_SITES_DIR / "frontier.toml").read_text().replace('name = "extended"', 'name = "extended"\nauto = false')
    (tmp_path / "f.toml").write_text(text)
    profile = load_site(tmp_path / "f.toml")
    with pytest.raises(DlaunchError, match=r"^--time: no partition of site frontier takes 12 node\(s\) for 12:00:00; "
                                           r"its partitions: batch \(1-91 nodes, up to 02:00:00\), "):
        plan_for(profile, request("frontier", nodes=12, time="12:00:00"))
    assert plan_for(profile, request("frontier", nodes=12, time="12:00:00", partition="extended")).partition == "extended"


# -- sources, `sites check`, `sites show`, `sites migrate` ------------------------------------------------

V1_FILES = sorted((Path(__file__).parent / "sites-v1").glob("*.toml"))
TODAY = datetime.date(2026, 11, 24)


def dated(text: str, date: str) -> str:
    return text.replace('based_on = ["x"]', 'based_on = ["[1] https://example.org/a, read %s (a)", "[2] b (no date)"]' % date)


def test_sources_say_when_they_were_read_and_old_ones_are_flagged(tmp_path):
    (tmp_path / "old.toml").write_text(dated(V1, "2026-03-01"))
    site = load_site(tmp_path / "old.toml")
    assert source_dates(site) == [datetime.date(2026, 3, 1), None]
    undated, stale = age_warnings(site, TODAY)
    assert undated.startswith("1 of 2 sources do not say when they were read") and undated.endswith(": [2]")
    assert stale.startswith("the newest source was read 2026-03-01, more than six months ago")
    (tmp_path / "new.toml").write_text(dated(V1, "2026-06-01"))
    assert len(age_warnings(load_site(tmp_path / "new.toml"), TODAY)) == 1  # under six months: undated only


def test_sites_show_warns_on_stderr_when_the_newest_source_is_old(tmp_path, capsys):
    (tmp_path / "old.toml").write_text(dated(V1, "2025-01-01"))
    assert main(["sites", "show", str(tmp_path / "old.toml")]) == 0
    captured = capsys.readouterr()
    assert '"name": "old"' in captured.out
    assert "dlaunch: warning: site old: the newest source was read 2025-01-01, more than six months ago" in captured.err


def test_an_unknown_site_is_named_with_the_argument_or_flag_that_gave_it(capsys):
    with pytest.raises(DlaunchError, match=r"^--site: unknown site 'nosuch' \(known: .*juwels-booster"):
        resolve_site("nosuch")
    with pytest.raises(DlaunchError, match=r"^sites show NAME: unknown site 'nosuch' \(known: "):
        resolve_site("nosuch", given_by="sites show NAME")
    assert main(["sites", "show", "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("dlaunch: error: sites show NAME: unknown site 'nosuch' (known: ")


def test_a_dry_run_reads_its_profile_without_importing_the_analysis(tmp_path):
    """The straggler threshold's default is below both the profile and the analysis (dlaunch/thresholds.py)."""
    shown = subprocess.run([sys.executable, "-c", (
        "import sys; from dlaunch.cli import main; code = main(['run', '--dry-run', '--site', 'local', '--gpus', '2', "
        "'--steps', '6', '--device', 'cpu']); print(sorted(m for m in sys.modules if m.startswith('dlaunch.analysis'))); "
        "sys.exit(code)")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("name", sorted(p.stem for p in SHIPPED_SITES_DIR.glob("*.toml")))
def test_shipped_profiles_date_every_source_within_six_months(name):
    assert age_warnings(site(name), TODAY) == []


@pytest.mark.parametrize("change, warning", [
    (lambda t: t, "written in the first schema (scheduler = 'slurm' at the top): `dlaunch sites migrate"),
    (lambda t: t.replace('gpu_vendor = "nvidia"', 'gpu_vendor = "nvidia"\ngpu_model = "GH200"'),
     "arch = 'x86_64' contradicts gpu_model = 'GH200' (GH200 nodes are aarch64)"),
    (lambda t: t.replace('based_on = ["x"]', 'based_on = ["x"]\naliases = ["juwels"]'),
     "'juwels' also names profile juwels-booster"),
    (lambda t: t.replace('name = "old"', 'name = "frontier"'), "'frontier' also names profile frontier"),
])
def test_sites_check_warns(tmp_path, capsys, change, warning):
    (tmp_path / "p.toml").write_text(change(V1))
    assert any(warning in w for w in check_warnings(tmp_path / "p.toml", TODAY))
    assert main(["sites", "check", str(tmp_path / "p.toml")]) == 0  # valid: warnings, not errors
    captured = capsys.readouterr()
    assert warning in captured.err and "warning(s))" in captured.out


def test_a_current_and_consistent_profile_draws_no_warning():
    assert check_warnings(SHIPPED_SITES_DIR / "juwels-booster.toml", TODAY) == []


@pytest.mark.parametrize("path", V1_FILES + ["V1"], ids=lambda p: getattr(p, "name", p))
def test_migrate_round_trips_first_schema_profiles(tmp_path, capsys, path):
    """The migrated file is in the current schema, keeps the comments, and means the same profile."""
    if path == "V1":
        path = tmp_path / "v1.toml"
        path.write_text(V1)
    assert main(["sites", "migrate", str(path), "-o", str(tmp_path / "new.toml")]) == 0
    new = (tmp_path / "new.toml").read_text()
    data = tomllib.loads(new)
    assert data["scheduler"]["kind"] == "slurm" and "partitions" not in data and "runtime" not in data["container"]
    assert load_site(tmp_path / "new.toml") == load_site(path)
    comments = [line.strip() for line in path.read_text().splitlines() if line.strip().startswith("#")]
    assert all(comment in new for comment in comments)
    assert check_warnings(tmp_path / "new.toml", TODAY)[:1] != check_warnings(path, TODAY)[:1]  # no first-schema warning
    assert migrate(tmp_path / "new.toml") == (new, False)  # a second migration changes nothing
    assert main(["sites", "migrate", str(path)]) == 0 and capsys.readouterr().out == new
