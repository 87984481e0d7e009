"""A profile's `[network]` section: the interconnect's nominal figures and what runs must use on it,
and a run's record against it.

`latency_us` and `bandwidth_gbps_per_node` feed `dlaunch predict` and stand beside the bus bandwidth
that `dlaunch doctor` measures. `transport`, `plugin`, `provider` and `interfaces` state what the
collective libraries must select; `network_problems` checks a run's record (what the libraries really
selected: the metrics header's `network`, dlaunch/train/network.py) against them for `status`, `watch`,
`report` and `doctor`, and `describe` says what they selected.

A run is off its network when NCCL/RCCL selected another transport, net plugin or libfabric provider
than the profile names, or when TCP traffic (Gloo, MPI's TCP, NCCL's Socket transport) went over
interfaces the profile does not name: it finished, but its throughput is not the fabric's. Where the
profile says a node's GPUs are linked peer to peer (`intra_node = "p2p"`: NVLink, Infinity Fabric), a run
whose ranks NCCL/RCCL connected inside a node through host memory (SHM) or the network instead is off too:
typically its ranks each saw only their own GPU, so CUDA IPC was impossible (NVIDIA/nccl#324). What a
record does not say (an older trainer, NCCL's output not found) is not held against the run. Gloo and
MPI are judged by their interfaces only (they use TCP whatever the fabric), and only where they carry
the data: beside NCCL/RCCL (Horovod on GPUs) they are a controller.
"""

from typing import Annotated, Any, Dict, List, Literal, Optional, Sequence, Tuple

from pydantic import Field, StringConstraints

from dlaunch.specs.schema import SafeName, StrictModel
from dlaunch.train.network import NET, NO_PLUGIN, P2P, SHM, TRANSPORTS, interfaces_match

INTERFACE = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


class Network(StrictModel):
    """Per node. `transport`: what NCCL/RCCL must select for GPU collectives (`ib`: InfiniBand verbs,
    `ofi`: a libfabric net plugin, `socket`: TCP, `ucx`); `plugin`: the net plugin's name as it logs
    itself (aws-ofi-nccl, aws-ofi-rccl), matched as a prefix; `provider`: the libfabric provider it
    must pick (cxi on Slingshot); `interfaces`: where TCP traffic must go (Gloo, MPI's TCP, NCCL's
    Socket transport), names or prefixes as NCCL_SOCKET_IFNAME takes them (`hsn` covers hsn0..3)."""

    latency_us: float = Field(gt=0)
    bandwidth_gbps_per_node: float = Field(gt=0)
    transport: Optional[Literal[tuple(TRANSPORTS)]] = None  # type: ignore[valid-type]
    plugin: Optional[SafeName] = None
    provider: Optional[SafeName] = None
    interfaces: List[Annotated[str, StringConstraints(pattern=INTERFACE)]] = []
    # How NCCL/RCCL must connect the GPUs of one node: "p2p" where they are linked (NVLink, Infinity Fabric).
    intra_node: Optional[Literal["p2p"]] = None


LIBRARY_NAMES = {"nccl": "NCCL", "rccl": "RCCL", "gloo": "Gloo", "mpi": "MPI"}
GPU_LIBRARIES = ("nccl", "rccl")
CONSEQUENCE = "not the fabric's throughput"
INTRA_NODE = {SHM: "SHM (host memory)", NET: "its network transport"}  # the ways other than P2P
SHOWN_HOSTS = 3


def _hosts(hosts: Sequence[str]) -> str:
    """'a, b' or '64 nodes (a, b, c, ...)'."""
    if len(hosts) <= SHOWN_HOSTS:
        return ", ".join(hosts)
    return "%d nodes (%s, ...)" % (len(hosts), ", ".join(hosts[:SHOWN_HOSTS]))


def _transport(word: str) -> str:
    return TRANSPORTS.get(word, word)


def _deviations(record: Dict[str, Any], expected: Any, gpu_run: bool) -> List[Tuple[str, str, List[str]]]:
    """(what the library did, what the profile expects, addresses to show) for each way one record is off;
    in a run whose data goes through NCCL/RCCL (`gpu_run`) the TCP of the others (a controller) is not judged."""
    transport = record["transport"]
    found = []
    if record["library"] in GPU_LIBRARIES:
        if expected.transport and transport != expected.transport:
            wanted = _transport(expected.transport) + (" (%s)" % expected.plugin if expected.plugin else "")
            found.append(("ran on %s (%s)" % (_transport(transport), record.get("network", transport)), wanted, []))
        elif expected.plugin and record.get("plugin") and not record["plugin"].startswith(expected.plugin):
            did = (
                "loaded no net plugin"
                if record["plugin"] == NO_PLUGIN
                else "loaded the net plugin %s" % record["plugin"]
            )
            found.append((did, "the plugin %s" % expected.plugin, []))
        if expected.provider and record.get("provider") and record["provider"] != expected.provider:
            found.append(
                ("used the libfabric provider %s" % record["provider"], "the provider %s" % expected.provider, [])
            )
        local = record.get("intra_node") or []
        if expected.intra_node == "p2p" and local and not any(kind.startswith(P2P) for kind in local):
            how = " and ".join(INTRA_NODE.get(kind, kind) for kind in local)
            saw = record.get("visible_devices") or []
            found.append(
                (
                    "connected the GPUs of a node through %s, not P2P%s"
                    % (how, " (ranks saw %s)" % "; ".join(saw) if saw else ""),
                    "P2P between them (NVLink, CUDA IPC: every rank must see the node's GPUs)",
                    [],
                )
            )
    judged = transport == "socket" if record["library"] in GPU_LIBRARIES else not gpu_run
    if (
        judged
        and expected.interfaces
        and record.get("interfaces")
        and not interfaces_match(record["interfaces"], expected.interfaces)
    ):
        found.append(
            (
                "sent TCP traffic over %s" % ", ".join(record["interfaces"]),
                ", ".join(expected.interfaces),
                record.get("addresses", []),
            )
        )
    return found


def network_problems(records: Optional[Sequence[Dict[str, Any]]], expected: Any) -> List[str]:
    """One sentence per way the run is off its profile's network (nodes alike in one), e.g. "Gloo sent TCP
    traffic over dl0 (10.77.0.11) on dl-node1; the profile expects ib0: not the fabric's throughput";
    [] when it is on it, or when the profile or the run says nothing to compare."""
    if not records or expected is None:
        return []
    groups: Dict[Tuple[str, str, str], Tuple[List[str], List[str]]] = {}
    gpu_run = any(r["library"] in GPU_LIBRARIES for r in records)
    for record in records:
        if record["transport"].startswith("unavailable"):
            continue
        for did, expects, shown in _deviations(record, expected, gpu_run):
            hosts, addresses = groups.setdefault(
                (LIBRARY_NAMES.get(record["library"], record["library"]), did, expects), ([], [])
            )
            hosts.append(record["host"])
            addresses.extend(a for a in shown if a not in addresses)
    return [
        "%s %s%s on %s; the profile expects %s: %s"
        % (library, did, " (%s)" % ", ".join(addresses) if addresses else "", _hosts(hosts), expects, CONSEQUENCE)
        for (library, did, expects), (hosts, addresses) in groups.items()
    ]


def describe(records: Optional[Sequence[Dict[str, Any]]]) -> str:
    """What the libraries selected, nodes alike in one: "NCCL 2.21.5: libfabric (AWS Libfabric; aws-ofi-nccl
    1.9.2-aws; provider cxi) on 2 nodes; Gloo: TCP sockets over ib0 on 2 nodes"; '' when nothing is recorded."""
    groups: Dict[str, List[str]] = {}
    for r in records or ():
        name = LIBRARY_NAMES.get(r["library"], r["library"]) + (" " + r["version"] if r.get("version") else "")
        if r["transport"].startswith("unavailable"):
            text = "%s: %s" % (name, r["transport"])
        else:
            details = [r.get("network")] if r.get("network") and r["library"] in GPU_LIBRARIES else []
            details += [
                "no net plugin" if r.get("plugin") == NO_PLUGIN else r.get("plugin"),
                "provider " + r["provider"] if r.get("provider") else None,
            ]
            details += [", ".join(r.get("devices", [])) or None, r.get("gpudirect")]
            details += ["within nodes " + ", ".join(r["intra_node"]) if r.get("intra_node") else None]
            over = " over " + ", ".join(r["interfaces"]) if r.get("interfaces") else ""
            shown = "; ".join(d for d in details if d)
            text = "%s: %s%s%s" % (name, _transport(r["transport"]), " (%s)" % shown if shown else "", over)
        groups.setdefault(text, []).append(r["host"])
    return "; ".join(
        "%s on %s" % (text, _hosts(hosts) if len(hosts) <= SHOWN_HOSTS else "%d nodes" % len(hosts))
        for text, hosts in groups.items()
    )
