"""What belongs to the machine: NCCL's own cost model of the collectives data-parallel training uses.

After NCCL's tuning model (src/graph/tuning.cc, NCCL 2.8-2.10 as in the paper's torch 1.11 stack,
Simple protocol, the one large gradient buckets use): a collective costs latency + bytes / algBw.

    ring all-reduce  latency = 8.4 + 2(p-n) * lat_intra + 2(n-1) * lat_inter   (x1.9 across nodes:
                               NCCL's "plateau effect of ring")
                     algBw   = busBw * p / (2(p-1))
    tree all-reduce  latency = 2 * ((p/n - 1) * lat_intra_tree + log2(n) * lat_inter_tree)
                     algBw   = min(0.9 * busBw, 80 GB/s beyond 2 nodes, else 110 GB/s) * 0.5
    reduce-scatter / all-gather (ring only): p-1 steps of which n-1 inter-node, algBw = busBw * p/(p-1)

NCCL picks the cheaper algorithm per message; so does the model. busBw is the NVLink bandwidth of a
GPU inside a node and the node's network bandwidth (all its NICs) across nodes: every ring crosses each
node boundary once per channel, so a node's NICs together carry 2(p-1)/p of the message.
Inter-node step latencies are NCCL's software latency plus the fabric's (the site's `latency_us`).

Three more machine properties are not NCCL's but decide what a step sees (fitted, see fit.py and paper.py):
`noise_s`, the ranks' timing noise: each rank's lateness is the sum of many small host and OS delays
met since the step began, so its spread after t seconds of work is sqrt(noise_s * t) (noise_s in
seconds: the variance of the delay per second of work). A collective synchronises in rounds, 2, 4,
... p ranks (a tree's levels, the log2 p stages of NCCL's reduction), and each round waits for the
slowest of its ranks, whose delay is exponential-tailed: the slowest rank is spread *
`straggler_factor(p)` late = spread * sum over the rounds of (H_n - 1), H_n the n-th harmonic number
(the expected maximum of n unit exponential delays); it grows like (log2 p)^2 / 2. Every message's
NCCL kernel waits that long for its peers (kernel time), the step only at its last message.
`beside_compute`, NCCL kernel time beside back-propagation (a fraction of the back-propagation the
messages overlap) that is neither transfer nor waiting for a peer: kernel-time profiles count it,
the step never waits for it. `storage_images_per_s`, the images per second the site's shared file
system sustains for a loader that reads every sample as a file through the CPU (None: unknown, no
ceiling): p ranks taking batch images per step cannot step faster than p * batch /
storage_images_per_s.
"""

import math
from dataclasses import dataclass
from typing import Optional, Tuple

DEFAULT_INTRA_NODE_GBPS = 2400.0  # A100 NVLink 3: 300 GB/s per GPU and direction
# NCCL 2.8-2.10 tuning.cc, Simple protocol (microseconds).
RING_BASE_US = 8.4
RING_STEP_US = {"nvlink": 3.4, "net": 9.6}
TREE_STEP_US = {"nvlink": 28.0, "net": 50.0}
RING_PLATEAU = 1.9  # large multi-node ring all-reduces
TREE_BW_FACTOR = 0.9
TREE_MAX_GBYTES = (110.0, 80.0)  # per s: up to 2 nodes, beyond


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n: the expected maximum of n unit exponential delays."""
    return math.fsum(1.0 / k for k in range(1, n + 1))


def straggler_factor(gpus: int) -> float:
    """How late the last of `gpus` ranks finishes a collective, in units of one rank's delay spread: the
    slowest-of-n waits of the rounds 2, 4, ... `gpus` ranks added up (0 for one rank)."""
    rounds, size = [], 2
    while size < gpus:
        rounds.append(size)
        size *= 2
    if gpus > 1:
        rounds.append(gpus)
    return math.fsum(harmonic(n) - 1.0 for n in rounds)


@dataclass(frozen=True)
class Machine:
    """A site's interconnect (bandwidths in Gbit/s, latency in us) and its ranks' synchronisation behaviour."""

    gpus_per_node: int
    latency_us: float  # fabric latency per inter-node step, on top of NCCL's own
    bandwidth_gbps_per_node: float  # all NICs of a node
    intra_node_gbps: float = DEFAULT_INTRA_NODE_GBPS
    noise_s: float = 0.0
    beside_compute: float = 0.0
    storage_images_per_s: Optional[float] = None

    def lateness_s(self, busy_s: float, gpus: int) -> float:
        """How late the slowest of `gpus` ranks is after `busy_s` of work (the noise it accumulated)."""
        return math.sqrt(self.noise_s * busy_s) * straggler_factor(gpus)

    def nodes(self, gpus: int) -> int:
        return -(-gpus // self.gpus_per_node)

    def bus_bytes_per_s(self, gpus: int) -> float:
        intra = self.intra_node_gbps * 1e9 / 8
        if self.nodes(gpus) == 1:
            return intra
        return min(intra, self.bandwidth_gbps_per_node * 1e9 / 8)

    def _steps(self, gpus: int, steps_per_rank: int) -> Tuple[int, int]:
        """(intra-node, inter-node) ring steps of a collective with `steps_per_rank` * (p-1) steps."""
        inter = steps_per_rank * (self.nodes(gpus) - 1)
        return steps_per_rank * (gpus - 1) - inter, inter

    def ring_allreduce_s(self, gpus: int, nbytes: float) -> float:
        intra, inter = self._steps(gpus, 2)
        latency = RING_BASE_US + intra * RING_STEP_US["nvlink"] + inter * (RING_STEP_US["net"] + self.latency_us)
        if inter:
            latency *= RING_PLATEAU
        return latency * 1e-6 + 2 * (gpus - 1) / gpus * nbytes / self.bus_bytes_per_s(gpus)

    def tree_allreduce_s(self, gpus: int, nbytes: float) -> float:
        nodes = self.nodes(gpus)
        local = min(gpus, self.gpus_per_node)
        latency = 2 * (
            (local - 1) * TREE_STEP_US["nvlink"] + int(math.log2(nodes)) * (TREE_STEP_US["net"] + self.latency_us)
        )
        bus = min(TREE_BW_FACTOR * self.bus_bytes_per_s(gpus), TREE_MAX_GBYTES[nodes > 2] * 1e9)
        return latency * 1e-6 + nbytes / (0.5 * bus)

    def allreduce(self, gpus: int, nbytes: float) -> Tuple[float, str]:
        """Seconds and algorithm ('ring' or 'tree') of NCCL's cheaper all-reduce of `nbytes`."""
        if gpus <= 1:
            return 0.0, "-"
        return min((self.ring_allreduce_s(gpus, nbytes), "ring"), (self.tree_allreduce_s(gpus, nbytes), "tree"))

    def allreduce_s(self, gpus: int, nbytes: float) -> float:
        return self.allreduce(gpus, nbytes)[0]

    def ring_half_s(self, gpus: int, nbytes: float) -> float:
        """A ring reduce-scatter or all-gather of `nbytes` (the whole buffer) over `gpus` ranks."""
        if gpus <= 1:
            return 0.0
        intra, inter = self._steps(gpus, 1)
        latency = RING_BASE_US + intra * RING_STEP_US["nvlink"] + inter * (RING_STEP_US["net"] + self.latency_us)
        return latency * 1e-6 + (gpus - 1) / gpus * nbytes / self.bus_bytes_per_s(gpus)
