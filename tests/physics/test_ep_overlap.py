"""Expert-parallel communication as Megatron runs it: ep_overlap, DeepEP, and their invariants (issue 14)."""

from __future__ import annotations

import dataclasses

import pytest

from primus_optuna.physics import calibration
from primus_optuna.physics.comm import Group, Topology
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.space import Space
from primus_optuna.spec import GPU_CATALOG, StudySpec
from tests.conftest import FLAGSHIP
from tests.physics.test_throughput import with_changes

FLAG = StudySpec.from_yaml(FLAGSHIP)
SPACE = Space(FLAG)


def _pairs(n: int = 60) -> list:
    on = [c for c in SPACE.configs() if c.ep_overlap][:: max(1, len(SPACE.configs()) // (4 * n))][:n]
    return [(c.replace(ep_overlap=False).derive(FLAG.world, 512), c) for c in on]


def test_overlap_never_slows_a_step_and_hides_at_most_the_compute() -> None:
    for off, on in _pairs():
        a, b = estimate_throughput(FLAG, off), estimate_throughput(FLAG, on)
        assert b.step_time_s <= a.step_time_s * (1 + 1e-12), on
        assert b.breakdown_s["ep_comm"] <= a.breakdown_s["ep_comm"]
        hidden = a.breakdown_s["ep_comm"] - b.breakdown_s["ep_comm"]
        compute = sum(b.breakdown_s[t] for t in ("compute_attention", "compute_mlp", "compute_other"))
        assert hidden <= compute


def test_overlap_costs_one_more_chunk_of_activations() -> None:
    for off, on in _pairs(10):
        assert estimate_memory(FLAG, on).peak_gib > estimate_memory(FLAG, off).peak_gib


def test_overlap_gain_is_bounded_by_compute_when_comm_dominates() -> None:
    # a cluster whose network is 100x slower: the all-to-all dwarfs compute, overlap can hide only compute
    slow = with_changes(
        FLAG,
        cluster={"gpu": GPU_CATALOG["mi355x"].model_copy(update={"inter_node_bw_gbs": 0.5}).model_dump()},
    )
    sp = Space(slow)
    on = sp.make(tp=1, pp=1, vpp=1, ep=16, mbs=1, pp_schedule="1f1b", ep_overlap=True)
    off = on.replace(ep_overlap=False).derive(slow.world, 512)
    a, b = estimate_throughput(slow, off), estimate_throughput(slow, on)
    compute = sum(a.breakdown_s[t] for t in ("compute_attention", "compute_mlp", "compute_other"))
    assert a.breakdown_s["ep_comm"] > compute  # comm-bound
    assert a.breakdown_s["ep_comm"] - b.breakdown_s["ep_comm"] <= compute


def test_a_faster_dispatcher_never_loses() -> None:
    fam = calibration.FAMILIES["cdna4"]
    fast = dataclasses.replace(fam, deepep_intra_eff=fam.deepep_intra_eff * 1.5, deepep_inter_eff=1.0)
    configs = [c for c in SPACE.configs() if c.moe_dispatcher == "deepep"][::400]
    slow_t = [estimate_throughput(FLAG, c).step_time_s for c in configs]
    calibration.FAMILIES["cdna4"] = fast
    try:
        spec = FLAG.model_copy()  # fresh object: no cached context
        fast_t = [estimate_throughput(spec, c).step_time_s for c in configs]
    finally:
        calibration.FAMILIES["cdna4"] = fam
    assert all(f <= s * (1 + 1e-12) for f, s in zip(fast_t, slow_t, strict=True))


def test_deepep_sends_a_token_once_per_rank_and_node() -> None:
    # Qwen3-30B-A3B-like routing: 128 experts, top-8, EP 16 over two nodes. An all-to-all sends 8 copies of
    # a token; DeepEP sends one per destination rank holding any of its experts (about 6.9 of 16 ranks) inside
    # the node and one per other node across nodes
    topo = Topology(GPU_CATALOG["h100"], 8)
    g = Group(16, 1)
    tokens, tb = 4096, 2048 * 2
    dedup = topo.deepep_dispatch(tokens, tb, 8, 128, g, 0.6, 0.6)
    a2a = topo.all_to_all(tokens * 8 * tb, g)
    assert dedup < a2a
    # coarse experts (top-2 of 8 on 8 ranks): nothing to de-duplicate, the all-to-all's bytes; DeepEP's NVLink
    # side also carries the rank's own copy (as DeepEP's benchmark counts it), 8/7 of the all-to-all's share
    g8 = Group(8, 1)
    lat = 4 * topo.intra_lat
    same = topo.deepep_dispatch(tokens, tb, 2, 8, g8, 0.6, 0.6) - lat
    assert same == pytest.approx((topo.all_to_all(tokens * 2 * tb, g8) - lat) * 8 / 7)


def test_deepep_has_no_in_microbatch_overlap_credit() -> None:
    # Megatron's flex dispatcher: the compute stream waits for dispatch/combine of its own micro-batch; with
    # the same bandwidths DeepEP's exposed time is its whole transfer time (plus the host sync unless sync-free)
    c = SPACE.make(tp=1, pp=1, vpp=1, ep=16, mbs=1, pp_schedule="1f1b", moe_dispatcher="deepep")
    est = estimate_throughput(FLAG, c)
    free = estimate_throughput(with_changes(FLAG, workload={"moe_sync_free": True}), c)
    assert est.breakdown_s["ep_comm"] > free.breakdown_s["ep_comm"] > 0
