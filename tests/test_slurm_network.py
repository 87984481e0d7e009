"""The network a run really used, on the real Slurm cluster whose nodes carry a JSC-like second network
(`<node>i` on ib0): `status`, `watch` and `report` flag a run whose profile expects another interface than
the one its collective library used (the header's `network`, dlaunch/train/network.py).

The test world differs as a real site can: the profile expects the fabric (ib0) while its
GLOO_SOCKET_IFNAME sends Gloo over the nodes' first network (dl0), as a profile with a wrong or missing
interface name does. Before the network record existed the run finished `ok` and nothing said so: this
test failed (no `network` in the header, no flag in status or report)."""
import pytest

from test_slurm_dlaunch import JOB_TIMEOUT_S, dlaunch, job_id, log_text, submit
from dlaunch.train.metrics_schema import read_metrics

pytestmark = pytest.mark.slow


def test_a_run_off_its_profiles_interface_is_flagged_by_status_watch_and_report(two_nodes, tmp_path):
    if not two_nodes.second_ifname:
        pytest.skip("the cluster given by $SLURM_CONF has no second network")
    expects = {"latency_us": 50.0, "bandwidth_gbps_per_node": 10.0,  # a veth pair's order of magnitude (test only)
               "transport": "socket", "interfaces": [two_nodes.second_ifname]}
    site = two_nodes.site_profile(tmp_path / "slurm-expects-ib0.toml", extra={"network": expects})
    run_dir = submit(two_nodes, tmp_path, site, "off-network", "--nodes", "2", "--steps", "2")
    assert two_nodes.wait_job(job_id(run_dir), JOB_TIMEOUT_S) == "COMPLETED", log_text(run_dir)
    metrics = read_metrics(str(run_dir / "metrics.jsonl"))
    assert metrics.status == "ok"
    gloo = [r for r in metrics.header["network"] if r["library"] == "gloo"]  # in rank order, as the flag lists them
    assert sorted(r["host"] for r in gloo) == sorted(two_nodes.node_names[:2]), metrics.header["network"]
    assert all(r["interfaces"] == [two_nodes.ifname] for r in gloo), metrics.header["network"]
    flag = ("network: Gloo sent TCP traffic over %s (%s) on %s; the profile expects %s: not the fabric's throughput"
            % (two_nodes.ifname, ", ".join(r["addresses"][0] for r in gloo), ", ".join(r["host"] for r in gloo),
               two_nodes.second_ifname))

    shown = dlaunch(two_nodes, tmp_path, "status", str(run_dir))
    assert shown.returncode == 0 and "runs/tests/off-network: " + flag in shown.stdout, shown.stdout + shown.stderr
    watched = dlaunch(two_nodes, tmp_path, "watch", "--once", str(run_dir))
    assert watched.returncode == 0 and flag in watched.stdout, watched.stdout + watched.stderr

    reported = dlaunch(two_nodes, tmp_path, "report", str(run_dir), "--site", str(site), "--output", str(tmp_path / "report"))
    assert reported.returncode == 0, reported.stdout + reported.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "0 runs in 0 groups" in text and "1 run(s) off their network apart" in text
    assert "| off-network | 2 | Gloo sent TCP traffic over %s" % two_nodes.ifname in text.split("## Runs off their network")[1]
    assert "left out of the tables and plots (--include-network-mismatches keeps them)" in reported.stderr
