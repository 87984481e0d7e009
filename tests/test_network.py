"""What the collective libraries selected (dlaunch/train/network.py), recorded in the metrics header (schema
version 3) and checked against the profile's `[network]` by status, watch and report.

NCCL/RCCL output: the samples in tests/nccl_logs/ (one file each, its source in its first line; no GPU
was lent, so they are NCCL's documented and source formats and the lines operators quote). Gloo: real
TCP sockets of this process. The Slurm cluster's runs: tests/test_slurm_network.py.
"""
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from typer.testing import CliRunner

from dlaunch.cli import app, main
from dlaunch.errors import DlaunchError
from dlaunch.jobs.network import Network, describe, network_problems
from dlaunch.jobs.sites import load_site
from dlaunch.boundary import display_path
from test_analysis import write_run as write_metrics
from test_watch import finished, header, write_run
from dlaunch.train.metrics_schema import VERSION, MetricsError, make_record, read_metrics, validate_record
from dlaunch.train.network import (by_node, interface_addresses, interfaces_match, mpi_components, nccl_debug_path, nccl_record, observe,
                           parse_nccl_debug, route_nccl_debug,
                           socket_record, tcp_sockets, transport_kind)

SAMPLES = sorted((Path(__file__).parent / "nccl_logs").glob("*.log"))
GLOO_IB0 = [{"host": "dl-node1", "library": "gloo", "transport": "socket", "network": "TCP", "interfaces": ["ib0"],
             "addresses": ["10.78.0.11"]},
            {"host": "dl-node2", "library": "gloo", "transport": "socket", "network": "TCP", "interfaces": ["ib0"],
             "addresses": ["10.78.0.12"]}]
NCCL_SOCKET = [{"host": "nid00%d" % n, "library": "nccl", "version": "2.21.5+cuda12.4", "transport": "socket",
                "network": "Socket", "interfaces": ["hsn0"], "addresses": ["10.100.0.%d" % n]} for n in (1, 2)]
SLINGSHOT = Network(latency_us=2.0, bandwidth_gbps_per_node=800.0, transport="ofi", plugin="aws-ofi-nccl", provider="cxi",
                    interfaces=["hsn"])


def sample(path: Path):
    """(source, expected fields, log text) of one sample file."""
    lines = path.read_text().splitlines()
    header_lines = {line[2:].split(":", 1)[0]: line[2:].split(":", 1)[1].strip() for line in lines if line.startswith("# ")}
    return header_lines["source"], json.loads(header_lines["expect"]), "\n".join(l for l in lines if not l.startswith("# "))


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_nccl_output_samples_parse_to_what_their_header_expects(path):
    source, expected, text = sample(path)
    assert source  # every sample says where it came from
    parsed = parse_nccl_debug(text)
    assert {k: parsed.get(k) for k in expected} == expected


H100_SOCKET = Path(__file__).parent / "nccl_logs" / "nccl-2.28.9-h100-socket.log"
H100_SOCKET_SHA256 = "876c19414bdd7f135df98fa6015d008cb7c0d38d6535bd20771fd314e6bc0e9c"  # as captured (README there)


def test_real_nccl_2_28_output_of_an_h100_without_infiniband_reads_as_socket_over_eth0(tmp_path):
    """NCCL 2.28.9's own init output on an H100 VM (no IB device: Socket over eth0), kept byte for byte, read
    the trainer's way (one process's debug file) into the record, the metrics header and what status prints."""
    captured = "".join(line for line in H100_SOCKET.read_text().splitlines(keepends=True) if not line.startswith("# "))
    assert hashlib.sha256(captured.encode()).hexdigest() == H100_SOCKET_SHA256
    (tmp_path / "nccl.vm.2043.log").write_text(captured)
    record = nccl_record("vm", str(tmp_path / "nccl.%h.%p.log"), pid=2043)
    assert {k: record.get(k) for k in ("host", "library", "version", "network", "transport", "interfaces", "addresses",
                                        "bootstrap", "gpudirect")} == {
        "host": "vm", "library": "nccl", "version": "2.28.9+cuda13.0", "network": "Socket", "transport": "socket",
        "interfaces": ["eth0"], "addresses": ["192.0.2.2"], "bootstrap": "eth0 192.0.2.2",
        "gpudirect": "GPUDirect RDMA disabled"}
    assert "devices" not in record  # NCCL found no IB device ("NET/IB : Using [RO]" after "No device found")
    assert record["plugin"] == "none"  # "Assigned NET plugin Socket to comm": NCCL's internal transport
    validate_record(network_header([record]))
    assert describe([record]) == ("NCCL 2.28.9+cuda13.0: TCP sockets (Socket; no net plugin; GPUDirect RDMA disabled) "
                                 "over eth0 on vm")
    fabric = Network(latency_us=1.0, bandwidth_gbps_per_node=100.0, transport="ib")
    assert network_problems([record], fabric) == [
        "NCCL ran on TCP sockets (Socket) on vm; the profile expects InfiniBand verbs: not the fabric's throughput"]
    assert network_problems([record], fabric.model_copy(update={"transport": "socket", "interfaces": ["eth"]})) == []


def test_samples_cover_ib_socket_and_a_net_plugin():
    kinds = {sample(p)[1].get("transport") for p in SAMPLES}
    assert {"ib", "socket", "ofi"} <= kinds
    local = {kind for p in SAMPLES for kind in sample(p)[1].get("intra_node", [])}
    assert {"P2P/CUMEM", "SHM"} <= local


def nccl_lines(*messages: str) -> str:
    return "".join("jwb0001:7:7 [0] NCCL INFO %s\n" % m for m in messages)


def test_the_transports_between_a_nodes_gpus_are_read_from_nccls_connection_lines():
    """transport/p2p.cc and shm.cc of NCCL 2.8 to 2.30: how two GPUs of one node were connected."""
    cases = [
        ("Channel 00 : 0[1000] -> 1[2000] via P2P/IPC/read", ["P2P/IPC"]),  # 2.8-2.17, legacy CUDA IPC
        ("Channel 02/0 : 3[3] -> 4[4] via P2P/direct pointer", ["P2P/direct pointer"]),  # GPUs of one process
        ("Channel 00/1 : 0[0] -> 1[1] via P2P/MNNVL/read", ["P2P/MNNVL"]),
        ("Channel 00/0 : 0[0] -> 2[2] via P2P/indirect/1[1]", ["P2P/indirect"]),
        ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/CE", ["P2P/CUMEM"]),
        ("Channel 09 : 4[4] -> 3[3] via SHM/direct/direct", ["SHM"]),
        ("Channel 01 : 0[31000] -> 1[32000] via direct shared memory", ["SHM"]),
    ]
    for line, kinds in cases:
        assert parse_nccl_debug(nccl_lines(line)).get("intra_node") == kinds, line
    mixed = parse_nccl_debug(nccl_lines("Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
                                        "Channel 01/0 : 0[0] -> 1[1] via P2P/IPC", "Channel 02 : 0[0] -> 1[1] via SHM/CE/direct"))
    assert mixed["intra_node"] == ["SHM", "P2P/IPC"]
    # Four ranks on the node (2.20 on says so), connected, none by P2P or SHM: through the network transport.
    by_net = parse_nccl_debug(nccl_lines("comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0",
                                         "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0",
                                         "Channel 00/0 : 3[3] -> 0[0] [receive] via NET/IB/0"))
    assert by_net["intra_node"] == ["NET"]
    # One rank per node, or not connected yet: nothing said about the inside of a node.
    alone = nccl_lines("comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
                       "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0")
    assert "intra_node" not in parse_nccl_debug(alone)
    assert "intra_node" not in parse_nccl_debug(nccl_lines("comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0"))


def test_each_process_records_the_gpus_it_saw(tmp_path):
    """psslurm pads the list it sets with blanks (to tell it from the user's); the record drops them."""
    environ = {"CUDA_VISIBLE_DEVICES": "0,1,2,3     ", "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log")}
    (record,) = observe(["nccl"], environ)
    assert record["visible_devices"] == ["CUDA_VISIBLE_DEVICES=0,1,2,3"]
    assert "visible_devices" not in observe(["nccl"], {})[0]
    ranks = [dict(NCCL_SOCKET[0], visible_devices=["CUDA_VISIBLE_DEVICES=%d" % i], intra_node=["SHM"]) for i in range(2)]
    assert by_node(ranks)[0]["visible_devices"] == ["CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1"]


@pytest.mark.parametrize("name, kind", [("IB", "ib"), ("IBext_v8", "ib"), ("Socket", "socket"), ("AWS Libfabric", "ofi"),
                                        ("Libfabric", "ofi"), ("OFI", "ofi"), ("UCX-RMA", "ucx"), ("Mystery Net", "mystery net")])
def test_transport_words_of_nccl_network_names(name, kind):
    assert transport_kind(name) == kind


def test_nccl_output_is_routed_to_one_file_per_process(tmp_path):
    environ: Dict[str, str] = {}
    pattern = route_nccl_debug(environ, str(tmp_path / "nccl"))
    assert (tmp_path / "nccl").is_dir() and pattern == str(tmp_path / "nccl" / "nccl.%h.%p.log")
    assert environ == {"NCCL_DEBUG_FILE": pattern, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV,NET"}
    assert nccl_debug_path(pattern, "jwb0001.juwels", 4711) == str(tmp_path / "nccl" / "nccl.jwb0001.4711.log")
    assert nccl_debug_path("/x/%h-%p-%%-%q", "a/b%c.d", 1) == "/x/a-b-c-1-%-%q"  # NCCL's debug.cc rules


def test_the_users_nccl_debug_settings_are_kept_or_widened(tmp_path):
    environ = {"NCCL_DEBUG_FILE": "/mine/%h.log", "NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "COLL"}
    assert route_nccl_debug(environ, str(tmp_path / "nccl")) == "/mine/%h.log" and not (tmp_path / "nccl").exists()
    assert environ == {"NCCL_DEBUG_FILE": "/mine/%h.log", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL,INIT,NET"}
    environ = {"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "^COLL"}
    route_nccl_debug(environ, str(tmp_path / "nccl"))
    assert environ["NCCL_DEBUG"] == "TRACE" and environ["NCCL_DEBUG_SUBSYS"] == "^COLL"


def test_a_missing_nccl_file_is_unavailable_not_a_guess(tmp_path):
    record = nccl_record("h", str(tmp_path / "nccl.%h.%p.log"), pid=1)
    assert record["transport"].startswith("unavailable: NCCL wrote no debug file")
    (tmp_path / "nccl.h.1.log").write_text("h:1:1 [0] NCCL INFO NET/Plugin: Using internal network plugin.\n")
    assert nccl_record("h", str(tmp_path / "nccl.%h.%p.log"), pid=1)["transport"].startswith("unavailable: no 'Using network'")


def test_gloo_like_connections_of_this_process_name_their_interface():
    """A real TCP connection of this process over loopback (as Gloo's pairs are), and a store's port left out."""
    with socket.socket() as server, socket.socket() as client, socket.socket() as store:
        server.bind(("127.0.0.1", 0))
        server.listen()
        store.bind(("0.0.0.0", 0))  # a store listens on every address: not a library's own
        store.listen()
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        with accepted:
            ours = [s for s in tcp_sockets() if server.getsockname()[1] in (s.local_port, s.remote_port)]
            assert len(ours) == 3 and {s.local for s in ours} == {"127.0.0.1"}  # listener, both ends
            record = socket_record("gloo", "here", store_port=None)
            assert record["transport"] == "socket" and record["interfaces"] == ["lo"] and record["addresses"] == ["127.0.0.1"]
            assert socket_record("gloo", "here", store_port=server.getsockname()[1])["transport"].startswith("unavailable")


def test_records_of_the_ranks_become_one_per_node():
    ranks = [dict(GLOO_IB0[0], source="s"), dict(GLOO_IB0[0], source="s", addresses=["10.78.0.21"]), dict(GLOO_IB0[1])]
    merged = by_node(ranks)
    assert [r["host"] for r in merged] == ["dl-node1", "dl-node2"]
    assert merged[0]["addresses"] == ["10.78.0.11", "10.78.0.21"] and merged[0]["source"] == "s (first of 2 processes)"


def test_interfaces_match_names_or_prefixes():
    assert interfaces_match(["hsn0", "hsn3"], ["hsn"]) and interfaces_match(["ib0"], ["ib0", "eth"])
    assert not interfaces_match(["dl0"], ["ib0"]) and not interfaces_match(["eth0", "ib0"], ["ib"])


# Schema


def network_header(network: Any) -> dict:
    return make_record("header", 1.0, run_id="r", argv=[], config={}, framework="ddp", loader="native", model="resnet18",
                       device="cpu", world_size=2, nodes=2, hosts=["a", "b"], batch_per_worker=4, global_batch=8,
                       lr_scaled=0.1, versions={}, slurm_job_id=None, site=None, experiment=None, image=None,
                       git_revision=None, network=network)


def test_headers_carry_network_records_and_readers_keep_older_files(tmp_path):
    """Headers carry `network` since version 3 (written now: the current version)."""
    record = network_header(GLOO_IB0)
    assert record["version"] == VERSION >= 3
    for bad in ([{"host": "a", "library": "gloo"}], [{"host": "a", "library": "gloo", "transport": 1}],
                {"host": "a"}, [{"host": "a", "library": "gloo", "transport": "socket", "interfaces": [0]}]):
        with pytest.raises(MetricsError, match="field 'network' is .* expected a list of records with the texts host, library, transport"):
            validate_record(dict(record, network=bad))
    path = write_metrics(tmp_path, "old", 2, [10.0, 20.0], version=2)
    assert read_metrics(str(path)).network is None  # not recorded: nothing to hold against the run
    resumed = make_record("resume", 2.0, epoch=1, step=2, checkpoint="c", network=GLOO_IB0[:1])
    path.write_text(path.read_text() + json.dumps(resumed) + "\n")
    assert read_metrics(str(path)).network == GLOO_IB0[:1]  # the latest session's


# The profile's expectations and the check


def test_profile_network_expectations_are_validated(tmp_path):
    def profile(network: str) -> Path:
        path = tmp_path / "s.toml"
        path.write_text('name = "s"\ndescription = "d"\nbased_on = ["x"]\nscheduler = "local"\ngpus_per_node = 1\n'
                        'cores_per_node = 2\ngpu_vendor = "none"\n[network]\nlatency_us = 1.0\n'
                        'bandwidth_gbps_per_node = 10.0\n' + network)
        return path

    site = load_site(profile('transport = "ofi"\nplugin = "aws-ofi-nccl"\nprovider = "cxi"\ninterfaces = ["hsn"]\n'))
    assert site.network == SLINGSHOT.model_copy(update=dict(latency_us=1.0, bandwidth_gbps_per_node=10.0))
    with pytest.raises(DlaunchError, match=r"s.toml: network.transport: Input should be 'ib', 'ofi', 'socket' or 'ucx'"):
        load_site(profile('transport = "infiniband"\n'))
    with pytest.raises(DlaunchError, match=r"s.toml: network.interfaces.0: String should match pattern"):
        load_site(profile('interfaces = ["ib0; rm -rf /"]\n'))


def test_gloo_over_another_interface_is_off_the_network():
    expected = Network(latency_us=1.0, bandwidth_gbps_per_node=10.0, transport="socket", interfaces=["dl0"])
    (problem,) = network_problems(GLOO_IB0, expected)
    assert problem == ("Gloo sent TCP traffic over ib0 (10.78.0.11, 10.78.0.12) on dl-node1, dl-node2; "
                       "the profile expects dl0: not the fabric's throughput")
    assert network_problems(GLOO_IB0, expected.model_copy(update={"interfaces": ["ib"]})) == []
    assert network_problems(GLOO_IB0, SLINGSHOT.model_copy(update={"interfaces": []})) == []  # Gloo: interfaces only


def test_nccl_on_sockets_where_the_profile_expects_libfabric_is_off_the_network():
    (problem,) = network_problems(NCCL_SOCKET, SLINGSHOT)
    assert problem == ("NCCL ran on TCP sockets (Socket) on nid001, nid002; the profile expects libfabric "
                       "(aws-ofi-nccl): not the fabric's throughput")
    on_fabric = [dict(r, transport="ofi", network="AWS Libfabric", plugin="aws-ofi-nccl 1.9.1-aws", provider="cxi",
                      interfaces=[]) for r in NCCL_SOCKET]
    assert network_problems(on_fabric, SLINGSHOT) == []
    wrong = [dict(r, plugin="aws-ofi-rccl 1.4.0", provider="tcp") for r in on_fabric[:1]]
    assert network_problems(wrong, SLINGSHOT) == [
        "NCCL loaded the net plugin aws-ofi-rccl 1.4.0 on nid001; the profile expects the plugin aws-ofi-nccl: not the fabric's throughput",
        "NCCL used the libfabric provider tcp on nid001; the profile expects the provider cxi: not the fabric's throughput"]


def test_a_node_whose_gpus_nccl_connected_through_host_memory_is_off_where_the_profile_expects_p2p():
    """One GPU visible per rank (psslurm's default, --gpus-per-task=1): NCCL cannot use CUDA IPC, so NVLink
    stays unused (NVIDIA/nccl#324, #1066: 687 against 791 images/s per A100)."""
    linked = Network(latency_us=1.5, bandwidth_gbps_per_node=800.0, transport="ib", intra_node="p2p")
    one_each = [dict(r, transport="ib", network="IB", interfaces=[], intra_node=["SHM"],
                     visible_devices=["CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1"]) for r in NCCL_SOCKET]
    validate_record(network_header(one_each))  # version 4 headers carry the new fields; older ones lack them
    assert network_problems(one_each, linked) == [
        "NCCL connected the GPUs of a node through SHM (host memory), not P2P (ranks saw CUDA_VISIBLE_DEVICES=0; "
        "CUDA_VISIBLE_DEVICES=1) on nid001, nid002; the profile expects P2P between them (NVLink, CUDA IPC: every "
        "rank must see the node's GPUs): not the fabric's throughput"]
    by_net = [dict(one_each[0], intra_node=["NET"], visible_devices=[])]
    assert network_problems(by_net, linked) == [
        "NCCL connected the GPUs of a node through its network transport, not P2P on nid001; the profile expects "
        "P2P between them (NVLink, CUDA IPC: every rank must see the node's GPUs): not the fabric's throughput"]
    all_seen = [dict(r, intra_node=["P2P/CUMEM"], visible_devices=["CUDA_VISIBLE_DEVICES=0,1,2,3"]) for r in one_each]
    assert network_problems(all_seen, linked) == []
    assert network_problems([dict(one_each[0], intra_node=["SHM", "P2P/IPC"])], linked) == []  # P2P where it could
    assert network_problems(one_each, linked.model_copy(update={"intra_node": None})) == []  # PCIe GPUs without P2P
    older = [{k: v for k, v in r.items() if k not in ("intra_node", "visible_devices")} for r in one_each]
    assert network_problems(older, linked) == []  # a record from before issue 46 says nothing about it
    assert describe(all_seen[:1]) == ("NCCL 2.21.5+cuda12.4: InfiniBand verbs (IB; within nodes P2P/CUMEM) on nid001")


def test_what_a_record_does_not_say_is_not_held_against_the_run():
    unknown = [{"host": "a", "library": "nccl", "transport": "unavailable: NCCL wrote no debug file x"}]
    assert network_problems(unknown, SLINGSHOT) == [] and network_problems(None, SLINGSHOT) == []
    assert network_problems(NCCL_SOCKET, None) == []  # a profile without [network]
    assert describe(unknown) == "NCCL: unavailable: NCCL wrote no debug file x on a"


def test_describe_names_the_libraries_nodes_alike_in_one():
    many = [dict(GLOO_IB0[0], host="n%d" % i) for i in range(5)]
    assert describe(many) == "Gloo: TCP sockets over ib0 on 5 nodes"
    assert describe(NCCL_SOCKET[:1]) == "NCCL 2.21.5+cuda12.4: TCP sockets (Socket) over hsn0 on nid001"


# status, watch and report on written runs


def profile_expecting(tmp_path: Path, interfaces: List[str], name: str = "fabric") -> Path:
    path = tmp_path / ("%s.toml" % name)
    path.write_text('name = "fabric"\ndescription = "d"\nbased_on = ["x"]\nscheduler = "local"\ngpus_per_node = 1\n'
                    'cores_per_node = 2\ngpu_vendor = "none"\n[network]\nlatency_us = 1.0\nbandwidth_gbps_per_node = 10.0\n'
                    'interfaces = %s\n' % json.dumps(interfaces))
    return path


def written_run(tmp_path: Path, name: str, site: Path, network: list) -> Path:
    records = finished()
    records[0] = dict(header(), version=3, network=network)
    run = write_run(tmp_path / "runs", name, records)
    plan = json.loads((run / "plan.json").read_text())
    plan["request"]["site"] = str(site)
    (run / "plan.json").write_text(json.dumps(plan))
    return run


def test_status_and_watch_flag_a_run_off_its_profiles_interface(tmp_path, capsys, monkeypatch):
    off = written_run(tmp_path, "off", profile_expecting(tmp_path, ["dl0"]), GLOO_IB0)
    on = written_run(tmp_path, "on", profile_expecting(tmp_path, ["ib0"], name="ib"), GLOO_IB0)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["status", str(off), str(on)]) == 0
    flagged = [line for line in capsys.readouterr().out.splitlines() if "network:" in line]
    assert flagged == ["%s: network: Gloo sent TCP traffic over ib0 (10.78.0.11, 10.78.0.12) on dl-node1, dl-node2; "
                       "the profile expects dl0: not the fabric's throughput" % display_path(off)]
    assert main(["watch", "--once", str(off)]) == 0  # flagged, not failed
    (line,) = [l for l in capsys.readouterr().out.splitlines() if "off" in l]
    assert "ok" in line and "network: Gloo sent TCP traffic over ib0" in line


def test_status_judges_a_run_by_the_profile_text_it_kept_and_survives_a_tampered_request(tmp_path, capsys, monkeypatch):
    """The profile a run was made from (`site.toml` in its directory) decides, not today's file of that
    name; a plan.json whose request names no readable profile gives no flag, never a traceback."""
    profile = profile_expecting(tmp_path, ["dl0"])
    kept = written_run(tmp_path, "kept", profile, GLOO_IB0)
    (kept / "site.toml").write_text(profile.read_text())
    profile.write_text(profile_expecting(tmp_path / "..", ["ib0"]).read_text())  # the file changed since
    tampered = written_run(tmp_path, "tampered", profile, GLOO_IB0)
    plan = json.loads((tampered / "plan.json").read_text())
    plan["request"]["site"] = 5
    (tampered / "plan.json").write_text(json.dumps(plan))
    monkeypatch.setenv("COLUMNS", "200")
    main(["status", str(kept), str(tampered)])
    shown = capsys.readouterr()
    assert "Traceback" not in shown.out + shown.err
    flagged = [line for line in shown.out.splitlines() if "network:" in line]
    assert flagged == ["%s: network: Gloo sent TCP traffic over ib0 (10.78.0.11, 10.78.0.12) on dl-node1, dl-node2; "
                       "the profile expects dl0: not the fabric's throughput" % display_path(kept)]


def network_run(root: Path, name: str, gpus: int, x: float, network: list) -> None:
    path = write_metrics(root, name, gpus, [x / 2, x], site="fabric", version=3)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["network"] = network
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_report_leaves_runs_off_their_network_out_of_scaling_unless_asked(tmp_path):
    site = profile_expecting(tmp_path, ["ib0"])
    runs = tmp_path / "runs"
    network_run(runs, "g1", 1, 100.0, GLOO_IB0[:1])
    network_run(runs, "g2", 2, 190.0, GLOO_IB0)
    network_run(runs, "g4-eth", 4, 150.0, [dict(r, interfaces=["dl0"], addresses=["10.77.0.1%d" % i])
                                           for i, r in enumerate(GLOO_IB0)])
    runner = CliRunner(env={"COLUMNS": "250"})
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", str(runs), "--output", str(out), "--site", str(site)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    scaling = text.split("## Scaling", 1)[1].split("## Runs", 1)[0]
    assert "| 4 |" not in scaling and "| 2 |" in scaling
    off = text.split("## Runs off their network\n\n", 1)[1]
    assert off.startswith("1 run(s) off their site's [network] are left out of the tables and plots "
                          "(--include-network-mismatches keeps them).")
    assert "g4-eth | 4 | Gloo sent TCP traffic over dl0 (10.77.0.10, 10.77.0.11)" in off
    assert "runs off their network" in result.output
    kept = runner.invoke(app, ["report", str(runs), "--output", str(out), "--site", str(site), "--include-network-mismatches"])
    assert kept.exit_code == 0, kept.output
    text = (out / "report.md").read_text()
    assert "| 4 |" in text.split("## Scaling", 1)[1].split("## Runs", 1)[0]
    assert "are kept in the tables and plots (--include-network-mismatches)" in text


# doctor's all-reduce


def test_doctor_measures_only_inside_an_allocation_of_several_nodes(tmp_path):
    from dlaunch import preflight
    from test_doctor import write_site

    site = load_site(write_site(tmp_path, "slurm"))
    outside = preflight.check_allreduce(site, "x", preflight.Node((), on_node=False, first=False), None, "ddp", None)
    assert (outside.result, outside.found) == ("skip", "nominal unknown (no [network])")
    assert "srun -N2 --ntasks-per-node=1 dlaunch doctor" in outside.fix
    one = preflight.check_allreduce(site, "x", preflight.Node((socket.gethostname(),), on_node=True, first=True), None, "ddp", None)
    assert one.result == "skip"
    local = preflight.check_allreduce(load_site(write_site(tmp_path)), "x", preflight.Node((), True, True), None, "ddp", None)
    assert (local.result, local.found) == ("skip", "local site")


def test_the_all_reduce_runs_in_the_jobs_environment_without_its_step(tmp_path):
    """Modules, the site's variables and path prepends as in the job script, then the command; no srun."""
    from dlaunch.jobs.plan import build_plan
    from dlaunch.jobs.render import render_in_job_environment
    from dlaunch.jobs.request import LaunchRequest
    from test_doctor import write_site

    path = write_site(tmp_path, "slurm", env={"GLOO_SOCKET_IFNAME": "ib0"})
    path.write_text(path.read_text().replace('gpu_vendor = "none"', 'gpu_vendor = "none"\nmodules = ["Stages/2026"]\n'
                                             'env_prepend = { LD_LIBRARY_PATH = "/opt/plugin/lib" }'))
    site = load_site(path)
    plan = build_plan(site, LaunchRequest(site=str(path), nodes=2, time="00:10:00"), run_dir=str(tmp_path / "run"),
                      git_revision=None, image=None, environ={}, require_account=False)
    script = render_in_job_environment(plan, ("python", "-m", "dlaunch.train.netcheck", "--node-rank", "1", "--nodes", "2"))
    assert script.splitlines()[:3] == ["set -eo pipefail", "module load Stages/2026", "export GLOO_SOCKET_IFNAME=ib0"]
    assert 'export LD_LIBRARY_PATH=/opt/plugin/lib"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' in script
    assert script.endswith("python -m dlaunch.train.netcheck --node-rank 1 --nodes 2\n")
    assert "srun" not in script and "MASTER_ADDR" not in script and "echo" not in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.slow
def test_netcheck_on_two_processes_prints_transport_and_bus_bandwidth_on_each_node(tmp_path):
    """Two `python -m dlaunch.train.netcheck` as two nodes of one machine (Gloo over loopback); every node prints
    the same line. No assertion on the bandwidth's value: it is timing."""
    environ = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo")
    started = [subprocess.Popen([sys.executable, "-m", "dlaunch.train.netcheck", "--node-rank", str(n), "--nodes", "2",
                                 "--megabytes", "1", "--iterations", "2"], stdout=subprocess.PIPE, text=True, env=environ)
               for n in (0, 1)]
    outputs = [p.communicate(timeout=240)[0] for p in started]
    assert [p.returncode for p in started] == [0, 0]
    first, second = (json.loads(out.strip().splitlines()[-1]) for out in outputs)
    assert first == second and (first["nodes"], first["ranks"], first["bytes"]) == (2, 2, 2 ** 20)
    assert first["busbw_gbps"] > 0 and first["device"] == "cpu"
    (record,) = first["network"]
    assert (record["library"], record["transport"], record["interfaces"]) == ("gloo", "socket", ["lo"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_describe_a_fabric_run():
    record = dict(NCCL_SOCKET[0], transport="ofi", network="AWS Libfabric", plugin="aws-ofi-nccl 1.9.1-aws", provider="cxi",
                  gpudirect="GPUDirect RDMA on 2 of 2 network connections", interfaces=[])
    assert describe([record]) == ("NCCL 2.21.5+cuda12.4: libfabric (AWS Libfabric; aws-ofi-nccl 1.9.1-aws; provider cxi; "
                                  "GPUDirect RDMA on 2 of 2 network connections) on nid001")


def test_open_mpi_components_kept_loaded_name_its_transport(tmp_path):
    """/proc/<pid>/maps lines of a process that selected Open MPI's UCX pml (paths as Debian's openmpi packages lay them out)."""
    maps = tmp_path / "maps"
    maps.write_text("\n".join("7f00%02d000000-7f00%02d100000 r-xp 00000000 08:01 %d /usr/lib/x86_64-linux-gnu/%s" % (i, i, i, lib)
                              for i, lib in enumerate(["openmpi/lib/openmpi3/mca_pml_ucx.so", "openmpi/lib/openmpi3/mca_btl_tcp.so",
                                                       "openmpi/lib/openmpi3/mca_btl_tcp.so", "openmpi/lib/openmpi3/mca_coll_tuned.so",
                                                       "libucp.so.0.0.0", "libmpi.so.40.30.4"])))
    assert mpi_components(str(maps)) == ["pml ucx", "btl tcp", "lib ucx"]
    assert mpi_components(str(tmp_path / "absent")) == []


def test_nccl_without_the_expected_plugin_says_so():
    internal = [dict(NCCL_SOCKET[0], transport="ofi", network="AWS Libfabric", plugin="none", interfaces=[])]
    assert network_problems(internal, SLINGSHOT) == [
        "NCCL loaded no net plugin on nid001; the profile expects the plugin aws-ofi-nccl: not the fabric's throughput"]
    assert describe(internal).startswith("NCCL 2.21.5+cuda12.4: libfabric (AWS Libfabric; no net plugin) on nid001")


def test_mpi_beside_nccl_is_a_controller_and_alone_carries_the_data():
    mpi = [{"host": "n1", "library": "mpi", "transport": "socket", "interfaces": ["eth0", "ib0"], "addresses": ["10.0.0.1", "10.1.0.1"]}]
    expected = Network(latency_us=1.0, bandwidth_gbps_per_node=800.0, transport="ib", interfaces=["ib0"])
    (problem,) = network_problems(mpi, expected)  # Horovod on CPUs: Open MPI's TCP over every interface
    assert problem.startswith("MPI sent TCP traffic over eth0, ib0 (10.0.0.1, 10.1.0.1) on n1; the profile expects ib0")
    nccl = {"host": "n1", "library": "nccl", "transport": "ib", "network": "IB"}
    assert network_problems([nccl] + mpi, expected) == []  # Horovod on GPUs: the gradients go through NCCL


def test_loopback_beside_a_network_address_is_node_local():
    """A connection over loopback (a PMIx server's, say) and one over this machine's other address."""
    others = [(name, a) for name, addresses in interface_addresses().items() if name != "lo" for a in addresses if "." in a]
    if not others:
        pytest.skip("this machine has no IPv4 address besides loopback")
    name, address = others[0]
    with socket.socket() as local, socket.socket() as wide, socket.socket() as a, socket.socket() as b:
        local.bind(("127.0.0.1", 0))
        wide.bind((address, 0))
        for server, client in ((local, a), (wide, b)):
            server.listen()
            client.connect(server.getsockname())
        accepted = [server.accept()[0] for server in (local, wide)]
        try:
            record = socket_record("mpi", "here", None)
        finally:
            for sock in accepted:
                sock.close()
    assert (record["interfaces"], record["addresses"]) == ([name], [address])
