"""What the collective libraries really selected on this process, read at run time, never from a profile.

NCCL and RCCL say it while they create a communicator, in their INFO output: the version, the
network (`Using network IB | Socket | AWS Libfabric`), a net plugin (`NET/Plugin`, aws-ofi-nccl's
`NET/OFI` lines), the devices and interfaces (`NET/IB : Using [0]mlx5_0:1/IB ...`, `NET/Socket :
Using [0]ib0:10.0.0.1<0>`) and GPUDirect RDMA per connection (`via NET/IB/0/GDRDMA`).
`route_nccl_debug` sends that output to one file per process (`NCCL_DEBUG_FILE` with NCCL's `%h`
and `%p`) before the library starts, `parse_nccl_debug` reads it (formats: NCCL's debug.cc, init.cc,
net.cc and transport/net*.cc of 2.8 to 2.30; RCCL's init.cc; aws-ofi-nccl's nccl_ofi_log.h).
Between the GPUs of one node NCCL connects peer to peer where it can (`Channel 00/0 : 0[0] -> 1[1] via
P2P/IPC`: NVLink or PCIe through CUDA IPC; `P2P/CUMEM` with cuMem handles since 2.18, `P2P/direct
pointer` inside one process, `P2P/indirect` through a third GPU), else through host memory (`via
SHM/direct/direct`, 2.8-2.12 `via direct shared memory`) or, with both off, its network transport
(transport/p2p.cc and shm.cc of 2.8 to 2.30). A process that sees only its own GPU cannot map another
GPU's memory, so NCCL falls back to SHM (NVIDIA/nccl#324, #1066): `intra_node` lists the transports of
these connections, and `visible_devices` what the process saw (CUDA_VISIBLE_DEVICES and the like).
Gloo, and MPI's TCP transport, use TCP sockets: `tcp_sockets` lists this process's own (rows of
/proc/self/net/tcp and tcp6 whose socket inode is one of /proc/self/fd) and `interface_addresses`
names the interface that holds each local address. Open MPI's selected components are the `mca_*`
libraries it keeps loaded (/proc/self/maps).

A record is a plain dict (checked by `dlaunch.train.metrics_schema`): `host`, `library` (nccl, rccl, gloo,
mpi), `transport` (`TRANSPORTS`, or "unavailable: <reason>"), and where known `network`, `version`,
`plugin`, `provider`, `devices`, `interfaces`, `addresses`, `bootstrap`, `gpudirect`, `intra_node`,
`visible_devices`, `components`, `source`. `by_node` merges the records of all ranks into one per node,
library and transport.
Torch-free (the standard library and dlaunch/train/gpus.py; Python 3.9): the launcher's `doctor` uses the
same helpers.
"""

import fcntl
import glob
import ipaddress
import os
import re
import socket
from typing import Any, Dict, Iterable, List, Mapping, MutableMapping, NamedTuple, Optional, Sequence

from dlaunch.train.gpus import VISIBLE_VARIABLES

# What each transport word means, for people (the profile's `[network] transport` takes these words).
TRANSPORTS = {
    "ib": "InfiniBand verbs",
    "ofi": "libfabric",  # through an OFI net plugin: aws-ofi-nccl, aws-ofi-rccl
    "socket": "TCP sockets",
    "ucx": "UCX",
}
# NCCL's network names (`Using network X`) -> transport: its own IB and Socket, nccl-rdma-sharp-plugins'
# IBext (verbs), UCX and UCX-RMA, aws-ofi-nccl's "AWS Libfabric" (up to 1.11), "Libfabric" or "OFI".
_NETWORK_KINDS = (
    (re.compile(r"^IB(ext)?(_v\d+)?$", re.I), "ib"),
    (re.compile(r"^Socket$", re.I), "socket"),
    (re.compile(r"^(AWS Libfabric|Libfabric|OFI)$", re.I), "ofi"),
    (re.compile(r"^UCX", re.I), "ucx"),
)
NCCL_LOG_DIR = "nccl"  # beside the metrics file
NO_PLUGIN = "none"  # the `plugin` of a NCCL/RCCL that uses its internal IB and Socket transports
NCCL_LOG_PATTERN = "nccl.%h.%p.log"
SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
TCP_ESTABLISHED, TCP_LISTEN = "01", "0A"  # states in /proc/net/tcp (include/net/tcp_states.h)


def transport_kind(network: str) -> str:
    """The transport word of a NCCL/RCCL network name (an unknown name, lower-cased)."""
    for pattern, kind in _NETWORK_KINDS:
        if pattern.match(network.strip()):
            return kind
    return network.strip().lower()


def unavailable(reason: str) -> str:
    return "unavailable: " + reason


# -- interfaces and sockets -------------------------------------------------------------------------
def interface_addresses() -> Dict[str, List[str]]:
    """This machine's network interfaces and their addresses (IPv4 by ioctl, IPv6 from /proc/net/if_inet6)."""
    found: Dict[str, List[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            found[name] = []
            try:
                answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, name.encode()[:15].ljust(40, b"\0"))
                found[name].append(socket.inet_ntoa(answer[20:24]))
            except OSError:  # no IPv4 address
                pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) == 6 and fields[5] in found:
            found[fields[5]].append(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(fields[0])))
    return found


def interface_of(address: str, interfaces: Dict[str, List[str]]) -> Optional[str]:
    """The interface that holds `address` (IPv4-mapped IPv6 addresses count as IPv4), else None."""
    wanted = _plain_address(address)
    for name, addresses in interfaces.items():
        if wanted in (_plain_address(a) for a in addresses):
            return name
    return None


def _plain_address(address: str) -> str:
    """`address` in its canonical form, IPv4 for an IPv4-mapped IPv6 address, without a %scope."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


class TcpSocket(NamedTuple):
    local: str
    local_port: int
    remote: str
    remote_port: int
    state: str  # /proc/net/tcp's hex state: TCP_ESTABLISHED, TCP_LISTEN, ...


def _proc_address(text: str) -> str:
    """/proc/net/tcp's hex address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(text)
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _plain_address(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, swapped))


def tcp_sockets(proc: str = "/proc/self") -> List[TcpSocket]:
    """This process's TCP sockets: the rows of `proc`/net/tcp and tcp6 (every socket of the network
    namespace) whose inode is one of the process's file descriptors."""
    inodes = set()
    for fd in glob.glob(os.path.join(proc, "fd", "*")):
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", table), encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[9] not in inodes:
                continue
            (local, local_port), (remote, remote_port) = (field.split(":") for field in fields[1:3])
            found.append(
                TcpSocket(
                    _proc_address(local), int(local_port, 16), _proc_address(remote), int(remote_port, 16), fields[3]
                )
            )
    return found


def socket_record(library: str, host: str, store_port: Optional[int], proc: str = "/proc/self") -> Dict[str, Any]:
    """What this process's TCP traffic uses: the interfaces and addresses of its connections and of the
    listening sockets bound to one address (a library's own), leaving out the rendezvous store's port
    and, beside other addresses, loopback (node-local services such as a PMIx server)."""
    interfaces = interface_addresses()
    locals_: List[str] = []
    for s in tcp_sockets(proc):
        if store_port in (s.local_port, s.remote_port):
            continue
        bound = s.state == TCP_ESTABLISHED or (
            s.state == TCP_LISTEN and not ipaddress.ip_address(s.local).is_unspecified
        )
        if bound and s.local not in locals_:
            locals_.append(s.local)
    if any(not ipaddress.ip_address(a).is_loopback for a in locals_):  # then loopback ones are node-local (PMIx...)
        locals_ = [a for a in locals_ if not ipaddress.ip_address(a).is_loopback]
    record: Dict[str, Any] = {"host": host, "library": library, "source": "/proc/self/net/tcp, tcp6"}
    if not locals_:
        record["transport"] = unavailable("no TCP connection of this process (one process, or not connected yet)")
        return record
    names = [interface_of(a, interfaces) or "?" for a in locals_]
    record.update(transport="socket", network="TCP", interfaces=_unique(names), addresses=locals_)
    return record


# -- Open MPI ---------------------------------------------------------------------------------------
_MCA = re.compile(r"/mca_(pml|btl|mtl|coll)_(\w+)\.so")
_FABRIC_LIBRARIES = (("libucp.so", "ucx"), ("libfabric.so", "ofi"))


def mpi_components(maps: str = "/proc/self/maps") -> List[str]:
    """Open MPI's point-to-point components this process keeps loaded ("pml ob1", "btl tcp", ...;
    Open MPI closes the ones it did not select) and the fabric libraries loaded (ucx, ofi)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    found = ["%s %s" % m for m in _MCA.findall(text) if m[0] != "coll"]
    found += ["lib %s" % kind for name, kind in _FABRIC_LIBRARIES if name in text]
    return _unique(found)


def mpi_record(host: str, store_port: Optional[int]) -> Dict[str, Any]:
    """MPI's transport: UCX or libfabric where its selected components use them, else its TCP sockets."""
    record = socket_record("mpi", host, store_port)
    components = mpi_components()
    record["components"] = components
    for component, transport in (("pml ucx", "ucx"), ("mtl ofi", "ofi"), ("btl ofi", "ofi")):
        if component in components:
            record.update(transport=transport, network=component)
            break
    record["source"] = "/proc/self/maps (Open MPI components), " + record["source"]
    return record


# -- NCCL and RCCL ----------------------------------------------------------------------------------
def route_nccl_debug(environ: MutableMapping[str, str], directory: str) -> str:
    """Make NCCL/RCCL write their INIT and NET information of this process to a file of its own in
    `directory` (created); a file the user routes to already (NCCL_DEBUG_FILE) is kept. Call before the
    library starts. Returns the file pattern (NCCL expands %h to the host name, %p to the pid)."""
    pattern = environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        os.makedirs(directory, exist_ok=True)
        pattern = environ["NCCL_DEBUG_FILE"] = os.path.join(directory, NCCL_LOG_PATTERN)
    if environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        environ["NCCL_DEBUG"] = "INFO"
    subsystems = environ.get("NCCL_DEBUG_SUBSYS", "")
    if not subsystems:  # NCCL's default (INIT,BOOTSTRAP,ENV; INIT before 2.2x) and the network's lines
        environ["NCCL_DEBUG_SUBSYS"] = "INIT,BOOTSTRAP,ENV,NET"
    elif not subsystems.startswith("^"):
        given = subsystems.upper().split(",")
        environ["NCCL_DEBUG_SUBSYS"] = ",".join([subsystems] + [s for s in ("INIT", "NET") if s not in given])
    return pattern


def nccl_debug_path(pattern: str, host: str, pid: int) -> str:
    """The file NCCL writes for `pattern` in process `pid` on `host`: %h is the host name up to its first
    dot (with % and / as -), %p the pid, %% a %, anything else as written (NCCL's debug.cc)."""
    short = host.split(".")[0].replace("%", "-").replace("/", "-")
    return re.sub(r"%(.)", lambda m: {"h": short, "p": str(pid), "%": "%"}.get(m.group(1), m.group(0)), pattern)


_INFO = re.compile(r"NCCL INFO (.*)$")
_VERSION = re.compile(r"\b(NCCL|RCCL) version :? ?([0-9][0-9.]*(?:\+\S+)?)")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_OFI_PACKAGE = re.compile(r"^NET/OFI (?:Using|Initializing) (aws-ofi-[nr]ccl)\s*(\S*)")
_PLUGIN = re.compile(r"^NET/Plugin ?: ?Loaded net plugin (.+?) \(v(\d+)\)")
# Internal transports: older NCCLs say so in NET/Plugin lines; 2.2x names the internal plugin it gave a communicator.
_INTERNAL = re.compile(
    r"^(NET/Plugin ?: ?(No plugin found|.*Using internal network plugin)|Assigned NET plugin (IB|Socket) "
    r"to comm)"
)
_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is ([^,\s]+)")
_IB = re.compile(r"^NET/IB ?: ?Using(.*?);\s*OOB (.*)$")
_SOCKET = re.compile(r"^NET/Socket ?: ?Using(.*)$")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: ?Using(.*)$")
_DEVICE = re.compile(r"\[\d+\](\S+)")
_CONNECTION = re.compile(r"\[(?:send|receive)\] via NET/(.+?)/\d+(?:\(\d+\))?(/GDRDMA)?")
_GDR_SUPPORT = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for")
# A connection between two GPUs of the node (transport/p2p.cc, shm.cc): P2P/<how>, SHM/<send>/<receive> or,
# in 2.8-2.12, "direct shared memory".
_LOCAL_CONNECTION = re.compile(
    r"^Channel \d+(?:/\d+)? : .* via (P2P/(?:direct pointer|[A-Za-z]+)|SHM/|direct shared memory)"
)
_LOCAL_RANKS = re.compile(r"^comm \S+ rank \d+ nRanks \d+ nNodes \d+ localRanks (\d+)")  # init.cc, 2.20 on
P2P, SHM, NET = "P2P", "SHM", "NET"  # `intra_node` entries start with one of these


def _interface_address(token: str) -> List[str]:
    """`ib0:10.0.0.1<0>` -> [ib0, 10.0.0.1] (an IPv6 address keeps its colons, loses its %scope)."""
    name, _, rest = token.partition(":")
    return [name, rest.split("<")[0].split("%")[0]]


def parse_nccl_debug(text: str) -> Dict[str, Any]:
    """What one process's NCCL/RCCL INFO output says about its network (fields as in a record, no host)."""
    found: Dict[str, Any] = {}
    connections, gdr_connections, gdr_support = 0, 0, []
    local_kinds: List[str] = []  # P2P/IPC, P2P/CUMEM, SHM ... in order of appearance
    local_ranks = 0
    for line in text.splitlines():
        info = _INFO.search(line)
        if not info:
            continue
        message = info.group(1)
        version = _VERSION.search(message)
        if version and "version" not in found:
            found.update(library=version.group(1).lower(), version=version.group(2))
        for pattern, update in (
            (_NETWORK, lambda m: {"network": m.group(1), "transport": transport_kind(m.group(1))}),
            (_OFI_PACKAGE, lambda m: {"plugin": " ".join(filter(None, m.groups()))}),
            (_PROVIDER, lambda m: {"provider": m.group(1)}),
            (
                _IB,
                lambda m: dict(
                    {"bootstrap": " ".join(_interface_address(m.group(2)))},
                    **({"devices": _DEVICE.findall(m.group(1))} if _DEVICE.findall(m.group(1)) else {}),
                ),
            ),
            (
                _SOCKET,
                lambda m: {
                    "interfaces": [_interface_address(t)[0] for t in _DEVICE.findall(m.group(1))],
                    "addresses": [_interface_address(t)[1] for t in _DEVICE.findall(m.group(1))],
                },
            ),
        ):
            match = pattern.search(message)
            if match:
                found.update(update(match))
        plugin = _PLUGIN.search(message)
        if plugin and "plugin" not in found:
            found["plugin"] = "%s (net plugin API v%s)" % plugin.groups()
        if _INTERNAL.search(message) and "plugin" not in found:
            found["plugin"] = NO_PLUGIN
        bootstrap = _BOOTSTRAP.search(message)
        if bootstrap and bootstrap.group(1).split():  # ` ib0:10.0.0.1<0>` (2.8 to 2.30)
            found["bootstrap"] = " ".join(_interface_address(bootstrap.group(1).split()[0]))
        connection = _CONNECTION.search(message)
        if connection:
            connections += 1
            gdr_connections += bool(connection.group(2))
        support = _GDR_SUPPORT.search(message)
        if support:
            gdr_support.append(support.group(1))
        local = _LOCAL_CONNECTION.search(message)
        if local:
            kind = local.group(1) if local.group(1).startswith(P2P) else SHM
            local_kinds += [kind] if kind not in local_kinds else []
        ranks = _LOCAL_RANKS.search(message)
        if ranks:
            local_ranks = max(local_ranks, int(ranks.group(1)))
    if connections:
        found["gpudirect"] = "GPUDirect RDMA on %d of %d network connections" % (gdr_connections, connections)
    elif gdr_support:
        found["gpudirect"] = "GPUDirect RDMA %s" % (
            gdr_support[0].lower() if len(set(gdr_support)) == 1 else "enabled for some NICs"
        )
    if local_kinds:
        found["intra_node"] = local_kinds
    elif local_ranks > 1 and connections:  # peers on the node, connected, none by P2P or SHM: by the network
        found["intra_node"] = [NET]
    return found


def nccl_record(host: str, pattern: str, pid: Optional[int] = None) -> Dict[str, Any]:
    """This process's NCCL/RCCL record from its debug file (`pattern`, as in NCCL_DEBUG_FILE)."""
    path = nccl_debug_path(pattern, host, os.getpid() if pid is None else pid)
    record: Dict[str, Any] = {"host": host, "library": "nccl", "source": path}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            record.update(parse_nccl_debug(f.read()))
    except OSError as e:
        record["transport"] = unavailable("NCCL wrote no debug file %s (%s)" % (path, e.strerror or e))
        return record
    record.setdefault("transport", unavailable("no 'Using network' line in %s yet" % path))
    return record


def nccl_warnings(pattern: str) -> List[str]:
    """This process's `NCCL WARN` lines from its debug file (routed there, they are missing from the
    job's log), each prefixed with the file's name."""
    path = nccl_debug_path(pattern, socket.gethostname(), os.getpid())
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return ["%s: %s" % (path, line.strip()) for line in f if " NCCL WARN " in line]
    except OSError:
        return []


# -- a process, a job -------------------------------------------------------------------------------
def observe(libraries: Sequence[str], environ: Mapping[str, str]) -> List[Dict[str, Any]]:
    """This process's records for the collective libraries it uses ("nccl" covers RCCL): NCCL's from
    the file NCCL_DEBUG_FILE names, the others' sockets without the rendezvous store's (MASTER_PORT)."""
    host = socket.gethostname()
    nccl_pattern = environ.get("NCCL_DEBUG_FILE")
    port = environ.get("MASTER_PORT", "")
    store_port = int(port) if port.isdigit() else None
    records = []
    for library in libraries:
        if library == "nccl":
            records.append(
                nccl_record(host, nccl_pattern)
                if nccl_pattern
                else {"host": host, "library": "nccl", "transport": unavailable("NCCL's debug output not routed")}
            )
        elif library == "mpi":
            records.append(mpi_record(host, store_port))
        else:
            records.append(socket_record(library, host, store_port))
    visible = visible_devices(environ)
    for record in records if visible else ():
        record["visible_devices"] = visible
    return records


def visible_devices(environ: Mapping[str, str]) -> List[str]:
    """The GPUs this process may use, as its scheduler or job script narrowed them: `CUDA_VISIBLE_DEVICES=0`
    (blanks around the list dropped: psslurm pads the value it sets), [] where nothing narrows them."""
    return ["%s=%s" % (name, environ[name].strip()) for name in VISIBLE_VARIABLES if name in environ]


def _unique(items: Iterable[Any]) -> List[Any]:
    return list(dict.fromkeys(items))


def by_node(records: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One record per host, library and transport: lists united, other fields the first rank's; the
    source of each merged record says how many processes it stands for."""
    merged: Dict[tuple, Dict[str, Any]] = {}
    counts: Dict[tuple, int] = {}
    for record in records:
        key = (record["host"], record["library"], record["transport"])
        counts[key] = counts.get(key, 0) + 1
        into = merged.setdefault(key, {})
        for name, value in record.items():
            if isinstance(value, list):
                into[name] = _unique(into.get(name, []) + value)
            elif name not in into:
                into[name] = value
    for key, record in merged.items():
        if counts[key] > 1 and "source" in record:
            record["source"] += " (first of %d processes)" % counts[key]
    return list(merged.values())


def interfaces_match(used: Sequence[str], expected: Sequence[str]) -> bool:
    """Whether every interface used is one the expectation names (a name or a prefix, as NCCL_SOCKET_IFNAME)."""
    return all(any(name.startswith(prefix) for prefix in expected) for name in used)
