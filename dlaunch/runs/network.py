"""A run's network beside its profile's `[network]`: what its collective libraries recorded (the metrics
header's `network`, dlaunch/train/network.py) against what the profile expects (dlaunch/jobs/network.py).

A run is off its network when NCCL/RCCL selected another transport, net plugin or libfabric provider
than the profile names, or when TCP traffic (Gloo, MPI's TCP, NCCL's Socket transport) went over
interfaces the profile does not name: it finished, but its throughput is not the fabric's. What a
record does not say (an older trainer, NCCL's output not found) is not held against the run. Gloo and
MPI are judged by their interfaces only (they use TCP whatever the fabric), and only where they carry
the data: beside NCCL/RCCL (Horovod on GPUs) they are a controller.
"""
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dlaunch.errors import DlaunchError
from dlaunch.runs.rundir import SITE_PROFILE, RunDir
from dlaunch.train.network import NO_PLUGIN, TRANSPORTS, interfaces_match

LIBRARY_NAMES = {"nccl": "NCCL", "rccl": "RCCL", "gloo": "Gloo", "mpi": "MPI"}
GPU_LIBRARIES = ("nccl", "rccl")
CONSEQUENCE = "not the fabric's throughput"
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
            did = "loaded no net plugin" if record["plugin"] == NO_PLUGIN else "loaded the net plugin %s" % record["plugin"]
            found.append((did, "the plugin %s" % expected.plugin, []))
        if expected.provider and record.get("provider") and record["provider"] != expected.provider:
            found.append(("used the libfabric provider %s" % record["provider"], "the provider %s" % expected.provider, []))
    judged = transport == "socket" if record["library"] in GPU_LIBRARIES else not gpu_run
    if judged and expected.interfaces and record.get("interfaces") \
            and not interfaces_match(record["interfaces"], expected.interfaces):
        found.append(("sent TCP traffic over %s" % ", ".join(record["interfaces"]), ", ".join(expected.interfaces),
                      record.get("addresses", [])))
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
            hosts, addresses = groups.setdefault((LIBRARY_NAMES.get(record["library"], record["library"]), did, expects), ([], []))
            hosts.append(record["host"])
            addresses.extend(a for a in shown if a not in addresses)
    return ["%s %s%s on %s; the profile expects %s: %s" % (library, did, " (%s)" % ", ".join(addresses) if addresses else "",
                                                         _hosts(hosts), expects, CONSEQUENCE)
            for (library, did, expects), (hosts, addresses) in groups.items()]


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
            details += ["no net plugin" if r.get("plugin") == NO_PLUGIN else r.get("plugin"),
                        "provider " + r["provider"] if r.get("provider") else None]
            details += [", ".join(r.get("devices", [])) or None, r.get("gpudirect")]
            over = " over " + ", ".join(r["interfaces"]) if r.get("interfaces") else ""
            shown = "; ".join(d for d in details if d)
            text = "%s: %s%s%s" % (name, _transport(r["transport"]), " (%s)" % shown if shown else "", over)
        groups.setdefault(text, []).append(r["host"])
    return "; ".join("%s on %s" % (text, _hosts(hosts) if len(hosts) <= SHOWN_HOSTS else "%d nodes" % len(hosts))
                     for text, hosts in groups.items())


@functools.lru_cache(maxsize=None)
def profile_network(site: str) -> Any:
    """The `[network]` of a profile by name or path; None when it has none or cannot be read here."""
    from dlaunch.jobs.sites import resolve_site

    try:
        return resolve_site(site).network
    except DlaunchError:
        return None


def run_network_problems(run: RunDir, records: Optional[Sequence[Dict[str, Any]]]) -> List[str]:
    """`network_problems` of a run directory's records against the profile it was made from: the text
    it kept (`site.toml`), else the profile its request named (runs made before they kept one)."""
    if not records:
        return []
    from dlaunch.boundary import read_toml
    from dlaunch.jobs.sites import Site

    kept = run.path / SITE_PROFILE
    try:
        expected = read_toml(kept, Site, follow_links=False).network if kept.exists() else profile_network(run.request().site)
    except DlaunchError:
        expected = None
    return network_problems(records, expected)
