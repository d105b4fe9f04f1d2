"""The measured network in the collective model: interpolation, extrapolation, scopes, and a study's estimate."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from primus_optuna.physics.calibration import family_constants
from primus_optuna.physics.comm import Group, Topology
from primus_optuna.physics.network import ANCHORED, CATALOG, MEASURED, SCALED, MeasuredNetwork, study_topology
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.space import Space, TrainingConfig
from primus_optuna.spec import GPU_CATALOG, StudySpec

DATA = Path(__file__).parents[1] / "spec" / "data" / "network"
STUDY = Path(__file__).parents[2] / "studies" / "llama3.1-70b-h100-bf16.yaml"
H100 = GPU_CATALOG["h100"]
GiB = 2**30

ROWS = [
    ("all_reduce", 16, 8, 2**20, 6.0),
    ("all_reduce", 16, 8, 2**26, 30.0),
    ("all_reduce", 16, 8, GiB, 40.0),
    ("all_reduce", 64, 8, 2**20, 2.0),
    ("all_reduce", 64, 8, 2**26, 8.0),
    ("all_reduce", 64, 8, GiB, 10.0),
]


def _topo(rows=ROWS) -> Topology:
    k = family_constants(H100)
    return Topology(H100, 8, k.coll_eff, k.a2a_eff, k.a2a_inter_eff, measured=MeasuredNetwork(rows, 8))


def _catalog() -> Topology:
    k = family_constants(H100)
    return Topology(H100, 8, k.coll_eff, k.a2a_eff, k.a2a_inter_eff)


def _busbw(t: Topology, nbytes: float, n: int) -> float:
    return nbytes / t.all_reduce(nbytes, Group(n, 1)) * 2 * (n - 1) / n / 1e9


def test_measured_points_are_reproduced_and_interpolated_in_log_bytes_and_log_ranks():
    t = _topo()
    assert _busbw(t, GiB, 16) == pytest.approx(40.0)
    assert _busbw(t, 2**20, 64) == pytest.approx(2.0)
    assert t.priced_by("all_reduce", GiB, Group(16, 1)) == MEASURED
    # half way in log(bytes) between 64 MiB and 1 GiB: half way in bus bandwidth
    assert _busbw(t, 2**28, 16) == pytest.approx(35.0)
    # 32 ranks lies half way in log(ranks) between 16 and 64
    assert _busbw(t, GiB, 32) == pytest.approx(25.0)
    assert t.priced_by("all_reduce", GiB, Group(32, 1)) == MEASURED


def test_monotone_in_bytes_and_ranks_where_the_data_is():
    t = _topo()
    sizes = [2 ** (20 + i / 4) for i in range(41)]  # 1 MiB .. 1 GiB
    for n in (16, 24, 32, 48, 64):
        bws = [_busbw(t, s, n) for s in sizes]
        assert all(b2 >= b1 - 1e-9 for b1, b2 in zip(bws, bws[1:], strict=False))
    for s in (2**20, 2**26, GiB):
        by_ranks = [_busbw(t, s, n) for n in (16, 24, 32, 48, 64)]
        assert all(b2 <= b1 + 1e-9 for b1, b2 in zip(by_ranks, by_ranks[1:], strict=False))


def test_beyond_the_largest_job_and_message_the_model_is_anchored_and_continuous():
    t, cat = _topo(), _catalog()
    g64, g128 = Group(64, 1), Group(128, 1)
    # larger job: the catalog's time scaled by measured / catalog at the largest measured job
    ratio = t.all_reduce(GiB, g64) / cat.all_reduce(GiB, g64)
    assert t.all_reduce(GiB, g128) == pytest.approx(cat.all_reduce(GiB, g128) * ratio)
    assert t.priced_by("all_reduce", GiB, g128) == ANCHORED
    # larger message: continuous at 1 GiB, then the model's shape
    at, past = t.all_reduce(GiB, g64), t.all_reduce(GiB * (1 + 1e-9), g64)
    assert past == pytest.approx(at, rel=1e-6)
    four = t.all_reduce(4 * GiB, g64)
    assert four / at == pytest.approx(cat.all_reduce(4 * GiB, g64) / cat.all_reduce(GiB, g64))
    # smaller message: anchored at 1 MiB the same way
    assert t.all_reduce(2**20 * (1 - 1e-9), g64) == pytest.approx(t.all_reduce(2**20, g64), rel=1e-6)


def test_scopes_other_ranks_per_node_and_the_node_boundary():
    t, cat = _topo(), _catalog()
    # one rank per node over 16 nodes (a DP group under TP8): scaled from the 8-per-node measurements
    one_per_node = Group(16, 8)
    assert t.priced_by("all_reduce", GiB, one_per_node) == SCALED
    assert t.all_reduce(GiB, one_per_node) > cat.all_reduce(GiB, one_per_node)
    # a group inside one node: nothing measured there, the catalog
    assert t.priced_by("all_reduce", GiB, Group(8, 1)) == CATALOG
    assert t.all_reduce(GiB, Group(8, 1)) == cat.all_reduce(GiB, Group(8, 1))
    # an unmeasured collective: the catalog
    assert t.all_gather(GiB, Group(64, 1)) == cat.all_gather(GiB, Group(64, 1))
    # a scope measured exactly is used as such (send/recv one rank per node, from the split log)
    split = [("send_recv", 2, 1, 2**20, 20.0), ("send_recv", 2, 1, GiB, 21.0)]
    ts = _topo(split)
    pp = Group(2, 8)  # two stages on two nodes
    assert ts.priced_by("send_recv", GiB, pp) == MEASURED
    assert ts.p2p(GiB, pp) == pytest.approx(GiB / 21e9)


def _spec(network: list[str] | None) -> StudySpec:
    data = yaml.safe_load(STUDY.read_text())
    if network is not None:
        data["cluster"]["network"] = network
    return StudySpec.from_dict(data, base_dir=DATA)


def test_a_study_with_a_slow_network_file_gets_slower_communication_at_scale():
    catalog, measured = _spec(None), _spec(["cloud.csv"])
    # TP8 with DP across the 8 nodes: the gradient reduce-scatter and parameter all-gather cross nodes
    config = TrainingConfig(tp=8, pp=1, ep=1, cp=1, vpp=1, mbs=1, recompute="full")
    assert not Space(catalog).check(config)
    a, b = estimate_throughput(catalog, config), estimate_throughput(measured, config)
    assert b.breakdown_s["dp_comm"] > 2 * a.breakdown_s["dp_comm"]
    assert b.tokens_per_s_per_gpu < a.tokens_per_s_per_gpu
    # inside a node (TP) nothing was measured: the same price
    assert b.breakdown_s["tp_comm"] == pytest.approx(a.breakdown_s["tp_comm"])
    # and the topology says where the numbers came from
    topo = study_topology(measured)
    assert topo.priced_by("reduce_scatter", GiB, Group(64, 1)) == MEASURED
    assert topo.priced_by("all_to_all", GiB, Group(64, 1)) == CATALOG
    assert math.isfinite(b.step_time_s)


def test_the_hardware_profiles_own_node_collectives_price_collectives_inside_the_node() -> None:
    """``calibrate``'s collectives (all ranks on one node) join the measured network for the scopes that
    ``cluster.network`` does not measure: a node measured slow is priced slow, a catalog one is not."""
    from primus_optuna.physics.network import measured_rows
    from primus_optuna.spec import StudySpec
    from tests.conftest import STUDIES
    from tests.helpers.profiles import synthetic_profile

    points = [
        {"op": "all_reduce", "ranks": 2, "bytes": b, "seconds": 1.0, "algbw_gbs": 0.05, "busbw_gbs": 0.05}
        for b in (2**16, 2**20, 2**24)
    ]
    data = yaml.safe_load((STUDIES / "local-gpt-cpu.yaml").read_text())
    plain = StudySpec.from_dict(data)
    data["cluster"]["profile"] = synthetic_profile(
        extra={"collectives": {"backend": "gloo", "ranks": 2, "points": points, "unsupported": {}}}
    )
    spec = StudySpec.from_dict(data)
    assert [r[:3] for r in measured_rows(spec)] == [("all_reduce", 2, 2)] * 3
    assert measured_rows(plain) == []
    g = Group(2, 1)  # two ranks on one node
    slow = study_topology(spec).all_reduce(2**20, g)
    assert slow == pytest.approx(
        2**20 * 1.0 / 0.05e9, rel=0.05
    )  # busbw 0.05 GB/s, all-reduce factor 1 at n=2
    assert slow > 10 * study_topology(plain).all_reduce(2**20, g)
