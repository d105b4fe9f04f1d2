"""Collective costs on the real topology, after NCCL's own cost model (``src/graph/tuning.cc``).

Placement (Megatron-Core ``RankGenerator``, order ``tp-cp-ep/dp-pp``): TP is innermost, then CP, then
DP (EP for expert layers, with ``expert_tensor_parallel_size = 1`` so an EP group is ``ep`` consecutive
ranks), PP outermost. A group of ``size`` ranks whose members are ``inner`` ranks apart is intra-node iff
``size · inner ≤ gpus_per_node``; otherwise it spans ``N = size / k`` nodes with ``k`` members on each.

Bandwidth (shared/reference/hardware.md): an NVSwitch node gives any group the full per-GPU NVLink bandwidth;
an xGMI full mesh splits a GPU's egress over its ``links`` peers, so an intra-node group of ``g`` GPUs sees
``(g − 1)/links`` of the aggregate (one link for a point-to-point transfer). A GPU's share of the network is
``nics_per_node · NIC bandwidth / gpus_per_node`` (:meth:`Topology.nic_share`). Collectives reach
``coll_eff`` of the bus bandwidth (~70-90% for large messages), all-to-all ``a2a_eff``.

Across nodes, a ring crosses each node boundary once per channel and NCCL spreads its channels over the node's
NICs: a group with ``k`` members per node has the bus bandwidth ``min(fabric, k · nic_share)`` (NCCL
``tuning.cc``: ``busBw = nChannels · bwInter``, one channel per NIC the group's GPUs reach), and only the
node-crossing steps pay the network latency (``nInterSteps = nNodes − 1``, doubled for all-reduce;
``(nsteps − nInterSteps)·intraLat + nInterSteps·interLat``).

Costs (``S`` = bytes of the full, gathered tensor; ``n`` ranks on ``N`` nodes, ``k`` per node; ``B`` = bus
bandwidth · ``coll_eff``; ``αi``/``αx`` intra/inter-node step latency):

- all-gather / reduce-scatter (ring): ``(n−1)/n · S/B + (n−N)·αi + (N−1)·αx``;
- all-reduce: the cheapest of the ring ``2(n−1)/n · S/B + 2(n−N)·αi + 2(N−1)·αx`` and NCCL's tree
  (intra-node chain, inter-node double binary tree: ``2·S/(0.92·B) + 2((k−1)·αi + ⌈log₂N⌉·αx)``; NCCL's
  tree bandwidth is 92% of the ring's, ``tuning.cc`` ``busBw * .92``), which wins for small messages on
  many nodes;
- data-parallel groups (``hierarchical=True``) may also run 2-D: reduce-scatter inside the node over the
  ``k`` local members, the inter-node collective of ``S/k`` over the ``N`` nodes (each local member on its
  own NIC share), all-gather inside the node: Megatron-Core's ``num_distributed_optimizer_instances > 1``
  (``megatron/core/distributed/param_and_grad_buffer.py@d98e8a64``:737-759, intra-instance reduce-scatter
  then inter-instance all-reduce) and NCCL's NVLS-tree on NVSwitch nodes; the cheapest of the three counts;
- all-to-all (``S`` = bytes one rank sends, itself included): the intra-node share over the fabric and the
  off-node share over the NIC, in parallel, plus ``(1 + ⌈log₂n⌉)·α``;
- point-to-point: ``S/bw + α``;
- DeepEP-class dispatch (:meth:`Topology.deepep_dispatch`): a token goes once to each destination *rank*
  that holds one of its top-k experts inside the node, and once to each destination *node* across nodes
  (DeepEP's internode kernels send over RDMA once per node and forward over NVLink), so fine-grained MoE
  (many experts, top-k > experts per rank) moves fewer bytes than an all-to-all of ``k`` copies. The NVLink
  side carries everything a rank receives (its own copy and, across nodes, the forwarded tokens too), the
  NIC side the copies for other nodes; group-limited routing (Megatron's ``moe_router_num_groups`` /
  ``moe_router_group_topk``) narrows which ranks and nodes a token can reach (:func:`hit_probability`).

:func:`bus_bandwidth_table` prints NCCL-style bus bandwidths (``primus-optuna estimate --explain-comm``).

A cluster's measured collectives (``cluster.network``, :mod:`.network`) replace these prices where they apply:
each flat collective goes through :meth:`Topology._priced` with its catalog price (:meth:`Topology.catalog_model`)
as the model the measurements are interpolated against and anchored to; DeepEP's dispatch stays the catalog's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..spec.hardware import GB, GPUSpec

TREE_BW_FACTOR = 0.92
"""NCCL's tree all-reduce reaches 92% of the ring's bus bandwidth (``src/graph/tuning.cc``: ``busBw * .92``)"""


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
        measured: Any = None,
    ) -> None:
        self.measured = measured
        """the cluster's measured collectives (:class:`~.network.MeasuredNetwork`; None: the catalog alone)"""
        self.gpu = gpu
        self.gpn = gpus_per_node
        self.coll_eff = coll_eff
        self.a2a_eff = a2a_eff
        self.a2a_inter_eff = a2a_eff if a2a_inter_eff is None else a2a_inter_eff
        self.intra_bw = gpu.intra_node_bw_gbs * GB
        nics = gpu.nics_per_node if gpu.nics_per_node is not None else gpus_per_node
        self.inter_bw = gpu.inter_node_bw_gbs * GB * nics / gpus_per_node
        """one GPU's share of its node's NICs (bytes/s)"""
        self.node_net_bw = gpu.inter_node_bw_gbs * GB * nics
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

    def nodes(self, g: Group) -> int:
        """How many nodes the group spans."""
        return max(1, -(-g.size // self.members_per_node(g)))

    @property
    def nic_share(self) -> float:
        """One GPU's share of its node's network bandwidth (bytes/s)."""
        return self.inter_bw

    def fabric_bw(self, peers: int) -> float:
        """Intra-node bandwidth a GPU can use towards ``peers`` other GPUs of its node (bytes/s)."""
        if peers <= 0:
            return self.intra_bw
        if self.mesh:
            return self.intra_bw * min(peers, self.links) / self.links
        return self.intra_bw

    def ring_bw(self, g: Group) -> tuple[float, float]:
        """(bus bandwidth, latency of a node-crossing step) of a ring over ``g``: the fabric inside a node;
        across nodes ``min(fabric, k · nic_share)`` for ``k`` members per node (NCCL spreads a ring's channels
        over the NICs its GPUs reach), never more than the node's NICs."""
        if self.intra(g):
            return self.fabric_bw(g.size - 1), self.intra_lat
        k = self.members_per_node(g)
        net = min(k * self.inter_bw, self.node_net_bw)
        bw = net if k <= 1 else min(net, self.fabric_bw(k - 1))
        return bw, self.inter_lat

    def _steps_latency(self, g: Group, rounds: int) -> float:
        """Latency of ``rounds`` passes of a ring over ``g`` (1 = all-gather, 2 = all-reduce): only the
        ``N − 1`` node-crossing steps of each pass pay the network latency (NCCL ``tuning.cc``)."""
        n, nn = g.size, self.nodes(g)
        inter = nn - 1 if n > 1 and not self.intra(g) else 0
        return rounds * ((n - 1 - inter) * self.intra_lat + inter * self.inter_lat)

    # --- collectives ------------------------------------------------------------------------------------------
    def ring_all_gather(self, nbytes: float, g: Group) -> float:
        """Ring all-gather (= reduce-scatter) of ``nbytes`` (the gathered size) over ``g``."""
        n = g.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        bw, _ = self.ring_bw(g)
        return (n - 1) / n * nbytes / (bw * self.coll_eff) + self._steps_latency(g, 1)

    def _priced(self, coll: str, nbytes: float, g: Group, model: Callable[[float, Group], float]) -> float:
        """``model``'s price of ``coll``, or the measured network's where it has one (:mod:`.network`)."""
        if self.measured is None:
            return model(nbytes, g)
        return self.measured.seconds(coll, nbytes, g, self, model)[0]

    def catalog_model(self, coll: str) -> Callable[[float, Group], float]:
        """The catalog's price of one flat collective (what measurements replace): NCCL's ring (and tree for
        all-reduce), the all-to-all and the point-to-point send."""
        return {
            "all_reduce": self._flat_all_reduce,
            "all_gather": self.ring_all_gather,
            "reduce_scatter": self.ring_all_gather,
            "all_to_all": self._model_all_to_all,
            "send_recv": self._model_p2p,
        }[coll]

    def priced_by(self, coll: str, nbytes: float, g: Group) -> str:
        """How :meth:`_priced` prices ``coll`` over ``g``: ``catalog``, ``measured``, ... (:mod:`.network`)."""
        if self.measured is None or g.size <= 1:
            return "catalog"
        return self.measured.seconds(coll, nbytes, g, self, self.catalog_model(coll))[1]

    def all_gather(self, nbytes: float, g: Group, hierarchical: bool = False) -> float:
        """All-gather of ``nbytes`` (the gathered size): NCCL's ring; ``hierarchical`` (DP groups): or 2-D."""
        return self._gather_or_scatter("all_gather", nbytes, g, hierarchical)

    def reduce_scatter(self, nbytes: float, g: Group, hierarchical: bool = False) -> float:
        """Reduce-scatter of ``nbytes`` (the reduced size): priced as the all-gather by the catalog."""
        return self._gather_or_scatter("reduce_scatter", nbytes, g, hierarchical)

    def _gather_or_scatter(self, coll: str, nbytes: float, g: Group, hierarchical: bool) -> float:
        ring = self._priced(coll, nbytes, g, self.ring_all_gather)
        if hierarchical and ring > 0:
            return min(ring, self._two_d(nbytes, g, coll))
        return ring

    def ring_all_reduce(self, nbytes: float, g: Group) -> float:
        n = g.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        bw, _ = self.ring_bw(g)
        return 2 * (n - 1) / n * nbytes / (bw * self.coll_eff) + self._steps_latency(g, 2)

    def tree_all_reduce(self, nbytes: float, g: Group) -> float:
        """NCCL's tree all-reduce: a chain through the ``k`` members of each node, a double binary tree over
        the ``N`` nodes; bandwidth :data:`TREE_BW_FACTOR` of the ring's (NCCL ``tuning.cc``)."""
        n = g.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        bw, _ = self.ring_bw(g)
        k, nn = self.members_per_node(g), self.nodes(g)
        lat = 2 * ((k - 1) * self.intra_lat + math.ceil(math.log2(nn)) * self.inter_lat)
        return 2 * nbytes / (bw * self.coll_eff * TREE_BW_FACTOR) + lat

    def all_reduce(self, nbytes: float, g: Group, hierarchical: bool = False) -> float:
        """The cheapest of NCCL's ring and tree all-reduce (NCCL picks by its own time model);
        ``hierarchical`` (DP groups): also the 2-D decomposition."""
        if g.size <= 1 or nbytes <= 0:
            return 0.0
        best = self._priced("all_reduce", nbytes, g, self._flat_all_reduce)
        if hierarchical:
            best = min(best, self._two_d(nbytes, g, "all_reduce"))
        return best

    def _flat_all_reduce(self, nbytes: float, g: Group) -> float:
        return min(self.ring_all_reduce(nbytes, g), self.tree_all_reduce(nbytes, g))

    def _two_d(self, nbytes: float, g: Group, coll: str) -> float:
        """2-D: intra-node ring passes over the ``k`` local members (the reduce-scatter, all-gather, or for an
        all-reduce both) around ``coll`` of ``nbytes / k`` over the ``N`` nodes, one member per node on its own
        NIC share."""
        if self.intra(g):
            return math.inf
        k, nn = self.members_per_node(g), self.nodes(g)
        if k <= 1:
            return math.inf
        local = Group(k, g.inner)
        across = Group(nn, g.inner * max(1, self.gpn // max(1, g.inner)))
        passes = ("reduce_scatter", "all_gather") if coll == "all_reduce" else (coll,)
        inside = sum(self._priced(p, nbytes, local, self.ring_all_gather) for p in passes)
        return inside + self._priced(coll, nbytes / k, across, self.catalog_model(coll))

    def all_to_all(
        self, nbytes: float, g: Group, intra_eff: float | None = None, inter_eff: float | None = None
    ) -> float:
        """``nbytes`` = what one rank sends in total (balanced: 1/n of it to each rank, itself included);
        explicit efficiencies price it by the catalog's formula alone."""
        if intra_eff is not None or inter_eff is not None:
            return self._model_all_to_all(nbytes, g, intra_eff, inter_eff)
        return self._priced("all_to_all", nbytes, g, self._model_all_to_all)

    def _model_all_to_all(
        self, nbytes: float, g: Group, intra_eff: float | None = None, inter_eff: float | None = None
    ) -> float:
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
        groups: int | None = None,
        group_topk: int | None = None,
    ) -> float:
        """One DeepEP dispatch (or combine) of ``tokens`` tokens of ``token_bytes`` each over EP group ``g``
        (balanced routing: each token's ``topk`` experts uniform over ``experts``, or over its ``group_topk``
        of ``groups`` expert groups, the experts spread evenly on the ranks), the NVLink and NIC sides in
        parallel.

        DeepEP's own benchmark counts the bytes a rank receives over NVLink including its own copy
        (``tests/legacy/test_intranode.py@dd758ca``:188 ``recv_x.numel()``), and its "RDMA" bytes once per
        destination node *including its own* (``tests/legacy/test_internode.py@dd758ca``:59-63,224: logical
        bandwidth, as its README@dd758ca:53 notes); so on a switched fabric (NVSwitch: the kernel's SMs are
        shared by all destinations, its own among them) the NVLink side here is everything a rank receives
        (``n · p_rank`` tokens: inside a node from its peers and itself, across nodes also the tokens its
        same-index peers forward from the RDMA buffers). On a full mesh (xGMI) each peer has its own link and
        a rank's own copy and the tokens it receives straight over RDMA use none: ``(n − N) · p_rank``. The NIC
        side carries the copies for the other nodes."""
        n = g.size
        if n <= 1 or tokens <= 0:
            return 0.0
        k = self.members_per_node(g)
        per_rank = experts / n
        p_rank = hit_probability(experts, topk, per_rank, groups, group_topk)
        p_node = hit_probability(experts, topk, per_rank * k, groups, group_topk)
        nodes = n // k
        nvl_b = tokens * token_bytes * (n - nodes if self.mesh else n) * p_rank
        inter_b = tokens * token_bytes * (nodes - 1) * p_node
        nvl_t = nvl_b / (self.fabric_bw(k - 1) * intra_eff) if k > 1 else 0.0
        inter_t = inter_b / (self.inter_bw * inter_eff) if n > k else 0.0
        lat = self.inter_lat if n > k else self.intra_lat
        return max(nvl_t, inter_t) + (1 + math.ceil(math.log2(n))) * lat

    def p2p(self, nbytes: float, g: Group) -> float:
        """One send/receive between neighbours of group ``g`` (e.g. adjacent pipeline stages)."""
        return self._priced("send_recv", nbytes, g, self._model_p2p)

    def _model_p2p(self, nbytes: float, g: Group) -> float:
        if g.size <= 1 or nbytes <= 0:
            return 0.0
        if self.intra(g):
            return nbytes / (self.fabric_bw(1) * self.coll_eff) + self.intra_lat
        return nbytes / (self.inter_bw * self.coll_eff) + self.inter_lat


def _miss(experts: float, held: float, topk: int) -> float:
    """Probability that none of a token's ``topk`` distinct experts (of ``experts``) is among ``held``."""
    held = min(held, experts)
    if topk >= experts:
        return 0.0 if held > 0 else 1.0
    out = 1.0
    for i in range(topk):
        out *= max(0.0, (experts - held - i) / (experts - i))
    return out


def hit_probability(
    experts: int, topk: int, held: float, groups: int | None = None, group_topk: int | None = None
) -> float:
    """Probability that one of a token's ``topk`` experts lies in a block of ``held`` consecutive experts (a
    rank's or a node's: Megatron-Core places ``experts / ep`` consecutive experts per EP rank,
    ``megatron/core/transformer/moe/moe_layer.py@d98e8a64``:187-196).

    Routing is taken as balanced (uniform over the experts, as ``moe_router_force_load_balancing``'s random
    logits make it, ``router.py@d98e8a64``:861-863). Group-limited routing (``group_limited_topk``,
    ``moe_utils.py@d98e8a64``:673-720, applied after those logits, ``router.py@d98e8a64``:779-790) first
    picks ``group_topk`` of ``groups`` equal groups of consecutive experts, then ``topk`` experts among
    theirs: the block is reached only through its selected groups."""
    if not groups or not group_topk or group_topk >= groups:
        return 1.0 - _miss(experts, held, topk)
    per_group = experts / groups
    touched = max(1, min(groups, math.ceil(held / per_group - 1e-9)))
    pool = group_topk * per_group
    total = math.comb(groups, group_topk)
    miss = 0.0
    for j in range(max(0, group_topk - (groups - touched)), min(touched, group_topk) + 1):
        weight = math.comb(touched, j) * math.comb(groups - touched, group_topk - j) / total
        miss += weight * _miss(pool, j * held / touched, topk)
    return 1.0 - miss


# --- the communication check (``estimate --explain-comm``, scripts/check_comm.py) ------------------------------
COMM_SIZES = (2**20, 16 * 2**20, 256 * 2**20, 2**30)
"""message sizes of :func:`bus_bandwidth_table` (bytes: 1 MiB, 16 MiB, 256 MiB, 1 GiB)"""
COMM_NODES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, slots=True)
class BusBandwidth:
    """One collective over every GPU of ``nodes`` nodes: time and NCCL-tests bus bandwidth."""

    collective: str
    nodes: int
    ranks: int
    nbytes: float
    seconds: float
    source: str = "catalog"
    """how the collective was priced: ``catalog``, or from the cluster's measurements (:mod:`.network`)"""

    @property
    def bus_gbs(self) -> float:
        """nccl-tests' bus bandwidth: ``S/t · 2(n−1)/n`` (all-reduce), ``S/t · (n−1)/n`` (all-gather, RS)."""
        n = self.ranks
        factor = 2 * (n - 1) / n if self.collective == "all_reduce" else (n - 1) / n
        return self.nbytes / self.seconds * factor / GB if self.seconds > 0 else 0.0


def bus_bandwidth_table(
    topo: Topology,
    nodes: tuple[int, ...] = COMM_NODES,
    sizes: tuple[int, ...] = COMM_SIZES,
    gpus: tuple[int, ...] | None = None,
) -> list[BusBandwidth]:
    """All-reduce / all-gather / reduce-scatter over every GPU of 1-64 nodes (``gpus``: single-node group
    sizes instead), NCCL's algorithms (ring, tree) as the model prices them, or the cluster's measurements."""
    groups = [Group(g, 1) for g in gpus] if gpus else [Group(n * topo.gpn, 1) for n in nodes]
    out = []
    for g in groups:
        for size in sizes:
            for name, fn in (
                ("all_reduce", topo.all_reduce),
                ("all_gather", topo.all_gather),
                ("reduce_scatter", topo.reduce_scatter),
            ):
                src = topo.priced_by(name, size, g)
                out.append(BusBandwidth(name, topo.nodes(g), g.size, float(size), fn(size, g), src))
    return out


SOURCE_MARKS = {"catalog": "", "measured": "*"}
"""the table's mark after a bus bandwidth by how it was priced (any other measured-based price: ``~``)"""


def format_bus_bandwidth(rows: list[BusBandwidth]) -> str:
    """A text table: one line per (collective, group), bus bandwidth (GB/s) per message size (``*``: measured,
    ``~``: the model anchored at the measurements)."""
    sizes = sorted({r.nbytes for r in rows})
    head = f"{'collective':<15}{'nodes':>6}{'ranks':>6}" + "".join(f"{_size_label(s):>11}" for s in sizes)
    lines = ["NCCL-style bus bandwidth (GB/s) by message size:", head]
    keyed: dict[tuple[str, int], dict[float, BusBandwidth]] = {}
    for r in rows:
        keyed.setdefault((r.collective, r.ranks), {})[r.nbytes] = r
    for (name, ranks), by_size in keyed.items():
        nodes = next(iter(by_size.values())).nodes
        cells = ""
        for s in sizes:
            r = by_size.get(s)
            mark = SOURCE_MARKS.get(r.source, "~") if r else ""
            value = r.bus_gbs if r else 0.0
            cells += f"{value:>10.1f}{mark}" if mark else f"{value:>11.1f}"
        lines.append(f"{name:<15}{nodes:>6}{ranks:>6}{cells}")
    if any(r.source != "catalog" for r in rows):
        lines.append(
            "* measured (cluster.network), ~ the catalog model anchored at the measurements, else catalog"
        )
    return "\n".join(lines)


def _size_label(nbytes: float) -> str:
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"
