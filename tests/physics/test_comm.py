"""Collective costs: placement (Megatron rank order), mesh vs switch bandwidth, ring/tree, monotonicity."""

import math
import random

import pytest

from primus_optuna.physics.comm import Group, Topology, hit_probability
from primus_optuna.spec import GB, GPU_CATALOG

MI355X = GPU_CATALOG["mi355x"]
H100 = GPU_CATALOG["h100"]
S = 1e9  # bytes: large messages, bandwidth-bound


def topo(gpu=H100, gpn: int = 8) -> Topology:
    return Topology(gpu, gpn, coll_eff=0.8, a2a_eff=0.6)


def test_placement_follows_inner_group_sizes() -> None:
    t = topo()
    assert t.intra(Group(8, 1))  # TP 8 innermost
    assert t.intra(Group(2, 4))  # CP 2 inside TP 4
    assert not t.intra(Group(2, 8))  # DP 2 outside TP 8 crosses nodes
    assert not t.intra(Group(4, 4))
    assert t.members_per_node(Group(4, 4)) == 2


def test_size_one_groups_cost_nothing() -> None:
    t = topo()
    g = Group(1, 1)
    assert t.all_gather(S, g) == t.all_reduce(S, g) == t.all_to_all(S, g) == t.p2p(S, g) == 0.0


def test_switch_gives_every_group_full_bandwidth() -> None:
    t = topo(H100)
    bw2, _ = t.ring_bw(Group(2, 1))
    bw8, _ = t.ring_bw(Group(8, 1))
    assert bw2 == bw8 == H100.intra_node_bw_gbs * GB


def test_mesh_subgroup_sees_its_share_of_links() -> None:
    # hardware.md: a group of g GPUs on an xGMI mesh sees ~(g-1)/7 of the aggregate
    t = topo(MI355X)
    for g in (2, 4, 8):
        bw, _ = t.ring_bw(Group(g, 1))
        assert bw == pytest.approx(MI355X.intra_node_bw_gbs * GB * (g - 1) / 7)
    # TP 2 on a mesh is much slower than TP 2 on a switch of the same aggregate bandwidth
    switch_like = topo(MI355X.model_copy(update={"topology": "switch"}))
    assert t.all_gather(S, Group(2, 1)) > 3 * switch_like.all_gather(S, Group(2, 1))


def test_ring_formulas() -> None:
    t = topo(H100)
    g = Group(8, 1)
    bw = H100.intra_node_bw_gbs * GB * 0.8
    lat = H100.intra_node_latency_us * 1e-6
    assert t.all_gather(S, g) == pytest.approx(7 / 8 * S / bw + 7 * lat)
    assert t.reduce_scatter(S, g) == t.all_gather(S, g)
    assert t.all_reduce(S, g) == pytest.approx(2 * 7 / 8 * S / bw + 14 * lat)


def test_tree_wins_for_small_messages_on_large_groups() -> None:
    t = topo(H100)
    g = Group(64, 8)  # 64 ranks across nodes
    small = 1e3
    bw, lat = t.ring_bw(g)
    ring = 2 * 63 / 64 * small / (bw * 0.8) + 2 * 63 * lat
    assert t.all_reduce(small, g) < ring


def test_cross_node_groups_use_the_nic() -> None:
    t = topo(H100)
    intra = t.all_gather(S, Group(8, 1))
    inter = t.all_gather(S, Group(8, 8))
    assert inter > intra
    bw, _ = t.ring_bw(Group(8, 8))
    assert bw == H100.inter_node_bw_gbs * GB


def test_all_to_all_intra_and_inter() -> None:
    t = topo(H100)
    lat = H100.intra_node_latency_us * 1e-6
    assert t.all_to_all(S, Group(8, 1)) == pytest.approx(
        7 / 8 * S / (H100.intra_node_bw_gbs * GB * 0.6) + 4 * lat
    )
    # EP 16 over two nodes: half of the tokens leave the node over the NIC
    t16 = t.all_to_all(S, Group(16, 1))
    assert t16 >= 8 / 16 * S / (H100.inter_node_bw_gbs * GB * 0.6)
    # DeepEP efficiencies are used when given
    assert t.all_to_all(S, Group(16, 1), 0.77, 0.9) < t16


@pytest.mark.parametrize("gpu", [H100, MI355X])
def test_faster_links_never_slow_a_collective(gpu) -> None:
    slow = topo(gpu)
    fast = topo(
        gpu.model_copy(
            update={
                "intra_node_bw_gbs": gpu.intra_node_bw_gbs * 2,
                "inter_node_bw_gbs": gpu.inter_node_bw_gbs * 2,
                "intra_node_latency_us": gpu.intra_node_latency_us / 2,
                "inter_node_latency_us": gpu.inter_node_latency_us / 2,
            }
        )
    )
    for g in (Group(2, 1), Group(8, 1), Group(4, 4), Group(16, 1), Group(8, 8)):
        for nbytes in (1e3, 1e6, 1e9):
            assert fast.all_gather(nbytes, g) <= slow.all_gather(nbytes, g)
            assert fast.all_reduce(nbytes, g) <= slow.all_reduce(nbytes, g)
            assert fast.all_to_all(nbytes, g) <= slow.all_to_all(nbytes, g)
            assert fast.p2p(nbytes, g) <= slow.p2p(nbytes, g)


def test_p2p_on_a_mesh_uses_one_link() -> None:
    t = topo(MI355X)
    one_link = MI355X.intra_node_bw_gbs * GB / 7 * 0.8
    assert t.p2p(S, Group(2, 1)) == pytest.approx(S / one_link + MI355X.intra_node_latency_us * 1e-6)


# --- issue 21: NCCL's collective model across nodes (NVIDIA/nccl src/graph/tuning.cc) --------------------------
def test_cross_node_ring_bus_bandwidth_is_k_nic_shares_capped_by_the_fabric() -> None:
    """NCCL: ``busBw = nChannels * bwInter`` with a ring's channels spread over the NICs its GPUs reach: a group
    with k members per node gets min(fabric, k x per-GPU NIC share)."""
    t = topo(H100)
    nic = H100.inter_node_bw_gbs * GB
    assert t.ring_bw(Group(16, 1))[0] == pytest.approx(min(H100.intra_node_bw_gbs * GB, 8 * nic))  # TP 16
    assert t.ring_bw(Group(8, 2))[0] == pytest.approx(4 * nic)  # 4 members per node
    assert t.ring_bw(Group(8, 8))[0] == pytest.approx(nic)  # one member per node
    # TP across two nodes is no longer priced at one GPU's NIC share
    assert t.all_gather(S, Group(16, 1)) < t.all_gather(S, Group(16, 8)) / 4


def test_only_node_crossing_steps_pay_the_network_latency() -> None:
    """NCCL: ``(nsteps − nInterSteps)·intraLat + nInterSteps·interLat``, ``nInterSteps = nNodes − 1`` (doubled
    for all-reduce)."""
    t = topo(H100)
    tiny = 1.0
    lat_i, lat_x = H100.intra_node_latency_us * 1e-6, H100.inter_node_latency_us * 1e-6
    g = Group(64, 1)  # 8 nodes x 8
    bw, _ = t.ring_bw(g)
    bwt = tiny * 63 / 64 / (bw * 0.8)
    assert t.all_gather(tiny, g) == pytest.approx(bwt + (63 - 7) * lat_i + 7 * lat_x)
    assert t.ring_all_reduce(tiny, g) == pytest.approx(2 * bwt + 2 * ((63 - 7) * lat_i + 7 * lat_x))


def test_tree_all_reduce_where_nccl_picks_it() -> None:
    """NCCL's tree: ``2((ppn − 1)·intraLat + log2(nNodes)·interLat)`` latency at 92% of the ring's bandwidth:
    cheaper for small messages on many nodes, the ring for large messages."""
    t = topo(H100)
    g = Group(64, 8)  # one member per node, 64 nodes
    small, large = 64e3, 4e9
    assert t.tree_all_reduce(small, g) < t.ring_all_reduce(small, g)
    assert t.all_reduce(small, g) == pytest.approx(t.tree_all_reduce(small, g))
    assert t.ring_all_reduce(large, g) < t.tree_all_reduce(large, g)
    assert t.all_reduce(large, g) == pytest.approx(t.ring_all_reduce(large, g))


def test_data_parallel_groups_may_run_two_dimensional() -> None:
    """2-D (intra-node reduce-scatter, inter-node all-reduce of S/k on each member's NIC share, intra-node
    all-gather; Megatron-Core num_distributed_optimizer_instances): it sends half the bytes over the network
    that a flat ring over two nodes does, so it wins where the network is the bottleneck (here 100 Gb/s NICs),
    and never costs more than the flat algorithms (the cheapest counts)."""
    slow_net = H100.model_copy(update={"inter_node_bw_gbs": 12.5})
    t = topo(slow_net)
    g = Group(16, 1)
    flat = t.all_reduce(S, g)
    two_d = t.all_reduce(S, g, hierarchical=True)
    assert two_d < 0.8 * flat
    assert two_d >= S / 8 / (12.5 * GB * 0.8)  # the inter-node all-reduce of S/8 over 2 nodes
    fast = topo(H100)
    assert fast.all_reduce(S, g, hierarchical=True) <= fast.all_reduce(S, g)
    # one member per node: nothing to split, same as flat
    assert fast.all_reduce(S, Group(8, 8), hierarchical=True) == fast.all_reduce(S, Group(8, 8))


def test_nic_share_from_the_cluster() -> None:
    """The per-GPU network share is nics_per_node x NIC bandwidth / gpus_per_node (hardware.md: 8 NICs per
    8-GPU node in the catalog)."""
    assert topo(H100).nic_share == pytest.approx(H100.inter_node_bw_gbs * GB)
    four_nics = H100.model_copy(update={"nics_per_node": 4})
    assert topo(four_nics).nic_share == pytest.approx(H100.inter_node_bw_gbs * GB / 2)
    assert topo(four_nics).all_gather(S, Group(8, 8)) > topo(H100).all_gather(S, Group(8, 8))


def test_a100_all_reduce_against_vtrain_luts() -> None:
    """VIA-Research/vTrain trace/a100/AR_GPU{2,8}_1M_1024M_LUT (f8dda84, measured nccl all-reduce on 8 A100
    SXM): busbw at 1 GiB 197.3 GB/s (2 GPUs) and 229.4 GB/s (8 GPUs); time at 1 MiB 44 us and 93 us. The model's
    large-message bus bandwidth (300 GB/s x coll_eff 0.8 = 240 GB/s) is within 25% of both. At 1 MiB the model
    gives 20 us (2 GPUs) and 120 us (8 GPUs), within a factor 2.5: the LUTs show ~36 us per call plus ~4 us
    per ring step, the model 8 us per step and nothing per call (catalog latency, not refitted here)."""
    a100 = GPU_CATALOG["a100-80gb"]
    t = Topology(a100, 8, coll_eff=0.8)
    for n, busbw in ((2, 197.28e9), (8, 229.35e9)):
        g = Group(n, 1)
        size = 1024 * 2**20
        model_busbw = 2 * (n - 1) / n * size / t.all_reduce(size, g)
        assert model_busbw == pytest.approx(busbw, rel=0.25)
    for n, us in ((2, 44.21), (8, 92.79)):
        got = t.all_reduce(2**20, Group(n, 1)) * 1e6
        assert us / 2.5 <= got <= us * 2.5


def test_hit_probability_without_groups_is_the_hypergeometric_miss() -> None:
    # 128 experts top-8, a rank holding 8 of them: 1 - C(120, 8) / C(128, 8)
    assert hit_probability(128, 8, 8) == pytest.approx(1 - math.comb(120, 8) / math.comb(128, 8))
    assert hit_probability(8, 8, 1) == 1.0


def test_hit_probability_with_node_limited_routing() -> None:
    # DeepSeek-V3-like: 256 experts in 8 groups, 4 groups picked, top-8 among their 128 experts; a node holding
    # exactly one group is reached only when its group is picked (moe_utils.py@d98e8a64:673-720)
    p = hit_probability(256, 8, 32, groups=8, group_topk=4)
    assert p == pytest.approx(4 / 8 * (1 - math.comb(96, 8) / math.comb(128, 8)))
    assert p < hit_probability(256, 8, 32)  # fewer nodes per token than unrestricted routing


@pytest.mark.parametrize("held", [16, 32, 64])
def test_hit_probability_matches_a_simulation_of_group_limited_routing(held: int) -> None:
    # random logits (force load balancing): 4 of 8 groups uniformly, then top-8 uniformly among their experts
    rng = random.Random(7)
    experts, groups, group_topk, topk, trials = 256, 8, 4, 8, 20000
    per_group = experts // groups
    hits = 0
    for _ in range(trials):
        chosen = rng.sample(range(groups), group_topk)
        pool = [g * per_group + i for g in chosen for i in range(per_group)]
        hits += any(e < held for e in rng.sample(pool, topk))  # the block = the first `held` experts
    p = hit_probability(experts, topk, held, groups, group_topk)
    assert p == pytest.approx(hits / trials, abs=0.015)


def test_deepep_nvlink_side_carries_the_forwarded_tokens() -> None:
    # DeepEP internode on H800 (200 GB/s NVLink, one 50 GB/s NIC per GPU), EP16 over 2 nodes: a rank's NVLink
    # side receives everything sent to it (16 senders' copies, forwarded from the RDMA buffers or local) and is
    # the bottleneck; its NIC side only the copies for the other node
    h800 = H100.model_copy(update={"intra_node_bw_gbs": 200.0})
    t = Topology(h800, 8)
    tokens, tb = 4096, 7168 * 2
    sec = t.deepep_dispatch(tokens, tb, 8, 256, Group(16, 1), 0.8, 0.9)
    nvl = tokens * tb * 16 * hit_probability(256, 8, 16) / (200 * GB * 0.8)
    nic = tokens * tb * 1 * hit_probability(256, 8, 128) / (t.inter_bw * 0.9)
    assert nvl > nic
    assert sec == pytest.approx(nvl + 5 * t.inter_lat)


def test_deepep_on_a_mesh_sends_no_own_copy_over_the_links() -> None:
    # xGMI full mesh: each peer has its own link; a rank's own copy stays in its HBM
    t = Topology(MI355X, 8)
    tokens, tb = 4096, 5120 * 2
    sec = t.deepep_dispatch(tokens, tb, 6, 160, Group(8, 1), 0.8, 0.9)
    links = tokens * tb * 7 * hit_probability(160, 6, 20) / (t.fabric_bw(7) * 0.8)
    assert sec == pytest.approx(links + 4 * t.intra_lat)
