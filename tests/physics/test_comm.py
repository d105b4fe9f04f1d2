"""Collective costs: placement (Megatron rank order), mesh vs switch bandwidth, ring/tree, monotonicity."""

import pytest

from primus_optuna.physics.comm import Group, Topology
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
