"""A profile's `[network]` section: the interconnect's nominal figures and what runs must use on it.

`latency_us` and `bandwidth_gbps_per_node` feed `dlaunch predict` and stand beside the bus bandwidth
that `dlaunch doctor` measures. `transport`, `plugin`, `provider` and `interfaces` state what the
collective libraries must select; dlaunch/runs/network.py checks a run's record (what the libraries
really selected, dlaunch/train/network.py) against them for `status`, `watch`, `report` and `doctor`.
"""
from typing import Annotated, List, Literal, Optional

from pydantic import Field, StringConstraints

from dlaunch.jobs.schema import SafeName, StrictModel
from dlaunch.train.network import TRANSPORTS

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
