"""Collective costs on the real topology.

Placement (Megatron-Core ``RankGenerator``, order ``tp-cp-ep/dp-pp``): TP is innermost, then CP, then
DP (EP for expert layers, with ``expert_tensor_parallel_size = 1`` so an EP group is ``ep`` consecutive
ranks), PP outermost. A group of ``size`` ranks whose members are ``inner`` ranks apart is intra-node iff
``size · inner ≤ gpus_per_node``; otherwise it crosses nodes and its bottleneck is the per-GPU NIC.

Bandwidth (shared/reference/hardware.md): an NVSwitch node gives any group the full per-GPU NVLink bandwidth;
an xGMI full mesh splits a GPU's egress over its ``links`` peers, so an intra-node group of ``g`` GPUs sees
``(g − 1)/links`` of the aggregate (one link for a point-to-point transfer). Collectives reach ``coll_eff``
of it (~70-90% for large messages), all-to-all ``a2a_eff``.

Costs (``S`` = bytes of the full, gathered tensor; ``n`` ranks; ``α`` fixed cost per hop):

- all-gather / reduce-scatter (ring): ``(n−1)/n · S/bw + (n−1)·α``;
- all-reduce: the cheaper of ring ``2(n−1)/n · S/bw + 2(n−1)·α`` and tree ``2·S/bw + 2⌈log₂n⌉·α``;
- all-to-all (``S`` = bytes one rank sends, itself included): the intra-node share over the fabric and the
  off-node share over the NIC, in parallel, plus ``(1 + ⌈log₂n⌉)·α``;
- point-to-point: ``S/bw + α``;
- DeepEP-class dispatch (:meth:`Topology.deepep_dispatch`): a token goes once to each destination *rank*
  that holds one of its top-k experts inside the node, and once to each destination *node* across nodes
  (DeepEP's internode kernels send over RDMA once per node and forward over NVLink), so fine-grained MoE
  (many experts, top-k > experts per rank) moves fewer bytes than an all-to-all of ``k`` copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..spec.hardware import GB, GPUSpec


@dataclass(frozen=True, slots=True)
class Group:
    """A process group: ``size`` ranks, ``inner`` = product of the group sizes placed inside it."""

    size: int
    inner: int = 1


class Topology:
    """Link bandwidths and latencies of one cluster, with collective cost functions (seconds)."""

    def __init__(
        self,
        gpu: GPUSpec,
        gpus_per_node: int,
        coll_eff: float = 0.8,
        a2a_eff: float = 0.6,
        a2a_inter_eff: float | None = None,
    ) -> None:
        self.gpu = gpu
        self.gpn = gpus_per_node
        self.coll_eff = coll_eff
        self.a2a_eff = a2a_eff
        self.a2a_inter_eff = a2a_eff if a2a_inter_eff is None else a2a_inter_eff
        self.intra_bw = gpu.intra_node_bw_gbs * GB
        self.inter_bw = gpu.inter_node_bw_gbs * GB
        self.intra_lat = gpu.intra_node_latency_us * 1e-6
        self.inter_lat = gpu.inter_node_latency_us * 1e-6
        self.mesh = gpu.topology == "mesh"
        self.links = max(1, gpu.intra_node_links)

    # --- placement ------------------------------------------------------------------------------------------
    def intra(self, g: Group) -> bool:
        return g.size * g.inner <= self.gpn

    def members_per_node(self, g: Group) -> int:
        """How many of the group's ranks share a node."""
        if self.intra(g):
            return g.size
        return max(1, min(g.size, self.gpn // max(1, g.inner)))

    def fabric_bw(self, peers: int) -> float:
        """Intra-node bandwidth a GPU can use towards ``peers`` other GPUs of its node (bytes/s)."""
        if peers <= 0:
            return self.intra_bw
        if self.mesh:
            return self.intra_bw * min(peers, self.links) / self.links
        return self.intra_bw

    def ring_bw(self, g: Group) -> tuple[float, float]:
        """(bandwidth, latency) a ring over ``g`` sees: the fabric inside a node, the NIC across nodes."""
        if self.intra(g):
            return self.fabric_bw(g.size - 1), self.intra_lat
        k = self.members_per_node(g)
        bw = self.inter_bw if k <= 1 else min(self.inter_bw, self.fabric_bw(k - 1))
        return bw, self.inter_lat

    # --- collectives ------------------------------------------------------------------------------------------
    def all_gather(self, nbytes: float, g: Group) -> float:
        n = g.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        bw, lat = self.ring_bw(g)
        return (n - 1) / n * nbytes / (bw * self.coll_eff) + (n - 1) * lat

    reduce_scatter = all_gather

    def all_reduce(self, nbytes: float, g: Group) -> float:
        n = g.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        bw, lat = self.ring_bw(g)
        eff_bw = bw * self.coll_eff
        ring = 2 * (n - 1) / n * nbytes / eff_bw + 2 * (n - 1) * lat
        tree = 2 * nbytes / eff_bw + 2 * math.ceil(math.log2(n)) * lat
        return min(ring, tree)

    def all_to_all(
        self, nbytes: float, g: Group, intra_eff: float | None = None, inter_eff: float | None = None
    ) -> float:
        """``nbytes`` = what one rank sends in total (balanced: 1/n of it to each rank, itself included)."""
        n = g.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        ie = self.a2a_eff if intra_eff is None else intra_eff
        xe = self.a2a_inter_eff if inter_eff is None else inter_eff
        k = self.members_per_node(g)
        intra_t = nbytes * (k - 1) / n / (self.fabric_bw(k - 1) * ie) if k > 1 else 0.0
        inter_t = nbytes * (n - k) / n / (self.inter_bw * xe) if n > k else 0.0
        lat = self.inter_lat if n > k else self.intra_lat
        return max(intra_t, inter_t) + (1 + math.ceil(math.log2(n))) * lat

    def deepep_dispatch(
        self,
        tokens: float,
        token_bytes: float,
        topk: int,
        experts: int,
        g: Group,
        intra_eff: float,
        inter_eff: float,
    ) -> float:
        """One DeepEP dispatch (or combine) of ``tokens`` tokens of ``token_bytes`` each over EP group ``g``
        (balanced routing, each token's ``topk`` experts uniform over ``experts`` spread evenly on the ranks):
        de-duplicated bytes, intra-node share over the fabric and off-node share over the NIC, in parallel."""
        n = g.size
        if n <= 1 or tokens <= 0:
            return 0.0
        k = self.members_per_node(g)
        per_rank = experts / n
        # P(a given set of `c` experts holds none of a token's top-k) = C(E - c, topk) / C(E, topk)
        p_rank = 1.0 - _miss(experts, per_rank, topk)
        p_node = 1.0 - _miss(experts, per_rank * k, topk)
        intra_b = tokens * token_bytes * (k - 1) * p_rank
        inter_b = tokens * token_bytes * (n // k - 1) * p_node
        intra_t = intra_b / (self.fabric_bw(k - 1) * intra_eff) if k > 1 else 0.0
        inter_t = inter_b / (self.inter_bw * inter_eff) if n > k else 0.0
        lat = self.inter_lat if n > k else self.intra_lat
        return max(intra_t, inter_t) + (1 + math.ceil(math.log2(n))) * lat

    def p2p(self, nbytes: float, g: Group) -> float:
        """One send/receive between neighbours of group ``g`` (e.g. adjacent pipeline stages)."""
        if g.size <= 1 or nbytes <= 0:
            return 0.0
        if self.intra(g):
            return nbytes / (self.fabric_bw(1) * self.coll_eff) + self.intra_lat
        return nbytes / (self.inter_bw * self.coll_eff) + self.inter_lat


def _miss(experts: int, held: float, topk: int) -> float:
    """Probability that none of a token's ``topk`` distinct experts (of ``experts``) is among ``held``."""
    held = min(held, experts)
    if topk >= experts:
        return 0.0 if held > 0 else 1.0
    out = 1.0
    for i in range(topk):
        out *= max(0.0, (experts - held - i) / (experts - i))
    return out
