"""Site profiles beyond rendering: partition rows picked by the job's size, source dates, `sites check`
warnings, `sites migrate` (first schema -> current)."""
import pytest

from launcher.errors import DlaunchError
from launcher.jobs.request import LaunchRequest
from launcher.jobs.sites import SHIPPED_SITES_DIR, load_site
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
