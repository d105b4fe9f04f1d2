"""Capacity planning: the study's own size is ``plan``'s top, whole nodes only, excluded GPU types say why, rows
that fit nothing or give fewer tokens per day say why, the metrics and the answers follow from the rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.physics.capacity import capacity_table, resolve_gpu_types
from primus_optuna.physics.plan import plan_space
from primus_optuna.spec import StudySpec
from tests.conftest import small_dense_study, small_moe_study


def dense(**workload: object) -> StudySpec:
    d = small_dense_study()
    d["workload"].update(workload)
    return StudySpec.from_dict(d)


@pytest.mark.parametrize("make", [small_dense_study, small_moe_study])
def test_the_study_own_size_is_exactly_plans_best(make):
    spec = StudySpec.from_dict(make())
    table = capacity_table(spec, [spec.world, 2 * spec.world])
    row = table.rows(spec.cluster.gpu.name)[0]
    top = plan_space(spec, top=1).top[0]
    assert row.gpus == spec.world and row.best is not None
    assert row.best.config == top.config
    assert row.tokens_per_s_per_gpu == top.tokens_per_s_per_gpu
    assert row.best.peak_gib == top.peak_gib


def test_more_gpus_never_fewer_tokens_per_day_unless_the_row_says_why():
    spec = dense(global_batch_size=16)
    table = capacity_table(spec, [8, 16, 32, 64], ["h100", "mi300x"])
    for t in table.types:
        best = 0.0
        for r in table.rows(t.name):
            if not r.fits:
                assert r.why_not and r.why_kind in {"batch", "memory", "rules", "node", "spec"}
                continue
            assert r.tokens_per_day >= best or r.note, (t.name, r.gpus)
            best = max(best, r.tokens_per_day)


def test_fewer_tokens_per_day_names_the_step_term_that_grows():
    # a network 100x slower than a NIC: every 16-GPU layout (no pipeline allowed) talks across nodes
    d = small_dense_study(axes={"pp": [1]})
    d["cluster"]["gpu"] = {"catalog": "h100", "inter_node_bw_gbs": 0.5}
    table = capacity_table(StudySpec.from_dict(d), [8, 16])
    one, two = table.rows("h100")
    assert two.tokens_per_day < one.tokens_per_day
    assert two.note and "than 8 GPUs" in two.note and "dp_comm" in two.note
    assert one.note is None


def test_whole_nodes_only_and_hosts_of_one_nvlink_domain():
    spec = dense()
    with pytest.raises(SpecError, match=r"sizes: 12 GPUs are not whole nodes \(8 GPUs per h100 node\)"):
        capacity_table(spec, [8, 12])
    with pytest.raises(SpecError, match="sizes: 0 is not a GPU count"):
        capacity_table(spec, [0])
    h100, gb200 = resolve_gpu_types(spec, ["h100", "gb200"])
    assert h100.layout(16) == (2, 8) and isinstance(h100.layout(4), str)
    # GB200: 64-GPU NVLink domains; a smaller job runs on whole 4-GPU trays of one domain
    assert gb200.layout(128) == (2, 64) and gb200.layout(32) == (1, 32)
    assert "not whole 64-GPU gb200 nodes or whole 4-GPU hosts" in str(gb200.layout(96))
    # 12 is whole hosts of one GB200 domain: legal for gb200, a row that says why for h100
    table = capacity_table(spec, [8, 12], ["h100", "gb200"])
    row = table.rows("h100")[1]
    assert not row.fits and row.why_kind == "node" and "not whole 8-GPU h100 nodes" in row.why_not
    assert table.rows("gb200")[1].gpus_per_node == 12


def test_a_gpu_type_changes_the_node_and_network_from_the_catalog():
    spec = dense()
    table = capacity_table(spec, [16], ["h100", "mi300x"])
    h100, mi300x = table.types
    assert h100.own and h100.gpu is spec.cluster.gpu
    assert mi300x.gpu.name == "mi300x" and mi300x.gpus_per_node == 8 and mi300x.gpu.topology == "mesh"
    assert table.rows("mi300x")[0].best is not None
    assert table.rows("mi300x")[0].tokens_per_s_per_gpu != table.rows("h100")[0].tokens_per_s_per_gpu


def test_unknown_gpu_type_is_refused_with_the_catalog():
    with pytest.raises(SpecError, match="gpu_types: unknown GPU 'h1000'.*mi355x"):
        capacity_table(dense(), [8], ["h1000"])


def test_excluded_types_say_why():
    fp8 = dense(precision="fp8", fp8_recipe="mxfp8")
    d = small_dense_study()
    d["cluster"]["gpu"] = "b200"
    d["workload"].update(precision="fp8", fp8_recipe="mxfp8")
    spec = StudySpec.from_dict(d)
    table = capacity_table(spec, [8], ["b200", "a100-80gb", "h100", "mi355x"])
    why = {t.name: t.excluded for t in table.types}
    assert why["b200"] is None and why["mi355x"] is None
    assert "has no FP8" in why["a100-80gb"]
    assert "MXFP8" in why["h100"] and "no MX block scaling" in why["h100"]
    assert table.rows("h100") == [] and table.rows("mi355x")[0].fits
    # the study's own GPU keeps what the study says (an h100 study in mxfp8 is the user's call)
    assert resolve_gpu_types(fp8, ["h100"])[0].excluded is None


def test_te_op_fuser_excludes_amd_types():
    d = small_moe_study()
    d["cluster"] = {"gpu": "b200", "nodes": 1, "gpus_per_node": 8}
    d["workload"]["te_op_fuser"] = True
    spec = StudySpec.from_dict(d)
    types = resolve_gpu_types(spec, ["b200", "mi355x"])
    assert types[0].excluded is None
    assert "te_op_fuser" in types[1].excluded


def test_nothing_fits_says_why_and_the_smallest_size_that_fits():
    spec = StudySpec.from_dict(small_moe_study())  # Mixtral 8x7B on MI300X nodes of 4
    table = capacity_table(spec, [4, 8])
    small, big = table.rows("mi300x")
    assert not small.fits and small.why_kind == "memory"
    assert "nothing fits in memory: the smallest peak is" in small.why_not and "GiB usable" in small.why_not
    assert big.fits and table.smallest_fit["mi300x"] == 8
    # none of the sizes asked fits: larger sizes (doubling) name the smallest that does
    beyond = capacity_table(spec, [4])
    assert beyond.rows("mi300x")[0].why_kind == "memory" and beyond.smallest_fit["mi300x"] == 8


def test_a_batch_too_small_to_split_says_so():
    d = small_dense_study(
        axes={"tp": [1, 2], "pp": [1], "cp": [1]}
    )  # (1F1B runs with one micro-batch per pp stage)
    d["workload"]["global_batch_size"] = 16
    spec = StudySpec.from_dict(d)
    table = capacity_table(spec, [8, 64], ["h100"])
    row = table.rows("h100")[1]
    assert not row.fits and row.why_kind == "batch"
    assert "global batch (16 sequences) is too small to split over 64 GPUs" in row.why_not
    # per GPU: the batch grows with the GPU count and the size fits
    per_gpu = capacity_table(spec, [8, 64], ["h100"], batch="per-gpu")
    assert [r.global_batch_size for r in per_gpu.rows("h100")] == [16, 128]
    assert per_gpu.rows("h100")[1].fits


def test_metrics_follow_from_the_throughput():
    spec = dense()
    table = capacity_table(spec, [8, 16, 32], ["h100", "mi300x"], tokens=1e11, days=10, prices={"h100": 2.0})
    for r in table.all_rows:
        tps = r.tokens_per_s_per_gpu
        assert r.tokens_per_day == pytest.approx(tps * r.gpus * 86_400)
        assert r.days == pytest.approx(1e11 / r.tokens_per_day)
        assert r.gpu_hours == pytest.approx(r.days * 24 * r.gpus)
        assert r.meets == (r.days <= 10)
        assert r.cost == (pytest.approx(2.0 * r.gpu_hours) if r.gpu == "h100" else None)
    for t in table.types:
        rows = table.rows(t.name)
        assert rows[0].efficiency == 1.0
        assert rows[2].efficiency == pytest.approx(
            rows[2].tokens_per_s_per_gpu / rows[0].tokens_per_s_per_gpu
        )


def test_answers_and_pareto_front_follow_from_the_rows():
    spec = dense()
    prices = {"h100": 2.5, "mi300x": 1.5}
    table = capacity_table(spec, [8, 16, 32], ["h100", "mi300x"], tokens=3e11, days=16, prices=prices)
    rows = [r for r in table.all_rows if r.fits]
    meeting = [r for r in rows if r.days <= 16]
    a = table.answers
    assert a.cheapest_by == "cost"
    assert a.fewest.gpus == min(r.gpus for r in meeting) and a.fewest.meets
    assert a.cheapest.cost == min(r.cost for r in meeting)
    assert a.fastest.cluster_tokens_per_s == max(r.cluster_tokens_per_s for r in rows)
    front = table.pareto
    assert a.fastest in front
    for p in front:  # nothing is both faster and cheaper than a front member
        assert not any(r.days < p.days and r.cost < p.cost for r in rows)
    for r in rows:
        if r not in front:  # every other row is dominated by a front member
            assert any(p.days <= r.days and p.cost <= r.cost for p in front)
    # without prices for every type, the cheapest is by GPU-hours
    assert capacity_table(
        spec, [8], ["h100", "mi300x"], tokens=1e9, prices={"h100": 1}
    ).answers.cheapest_by == ("gpu-hours")


def test_no_size_meets_the_deadline():
    table = capacity_table(dense(), [8], tokens=1e15, days=1)
    assert table.answers.fewest is None and table.answers.cheapest is None
    assert table.answers.fastest is table.rows("h100")[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tokens": -1.0}, "tokens: -1.0 is not a token count"),
        ({"tokens": math.inf}, "tokens: inf is not a token count"),
        ({"days": 3.0}, "days: a deadline needs a token target"),
        ({"tokens": 1e9, "days": 0.0}, "days: 0.0 is not a duration"),
        ({"batch": "weak"}, "batch: 'weak' is not one of fixed, per-gpu"),
        ({"prices": {"b200": 3.0}}, "prices: a price for 'b200', which is not among the GPU types planned"),
        ({"prices": {"h100": -3.0}}, r"prices: h100=-3.0 is not a price per GPU-hour"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(SpecError, match=match):
        capacity_table(dense(), [8], **kwargs)


@dataclass
class _Band:
    low: float
    high: float
    source: str


def test_the_band_hook_fills_each_fitting_row():
    seen = []

    def band(spec_at_size, best):
        seen.append((spec_at_size.world, best.config))
        return _Band(0.9 * best.tokens_per_s_per_gpu, 1.1 * best.tokens_per_s_per_gpu, "test")

    table = capacity_table(dense(), [8, 16], band=band)
    rows = table.rows("h100")
    assert seen == [(8, rows[0].best.config), (16, rows[1].best.config)]
    assert rows[0].to_dict()["band"]["source"] == "test"
    assert capacity_table(dense(), [8], band=None).rows("h100")[0].to_dict()["band"] is None


def test_a_size_the_study_refuses_says_why():
    spec = StudySpec.from_dict(small_dense_study(max_tp=8))
    table = capacity_table(spec, [4, 8], ["h100", "gb200"])
    row = table.rows("gb200")[0]  # one 4-GPU tray of a GB200 rack: search.max_tp 8 exceeds it
    assert not row.fits and row.why_kind == "spec" and "search.max_tp=8 exceeds the 4 GPUs" in row.why_not
    assert table.rows("h100")[0].why_kind == "node" and table.rows("gb200")[1].fits


def test_cells_alike_share_the_enumeration_and_peaks_and_give_the_same_rows():
    """H100 and H200 nodes (8 GPUs, Megatron-LM) enumerate the same space at a size: the table plans them from
    one enumeration and one set of peaks, and each row is what planning its type alone gives (legal and fitting
    counts, best configuration, throughput, peak); MI300X (Primus: zero-bubble schedules) enumerates its own."""
    from primus_optuna.physics.capacity import _Reuse, _size_spec

    spec = StudySpec.from_dict(small_dense_study())
    types = resolve_gpu_types(spec, ["h100", "h200", "mi300x"])
    reuse = _Reuse()
    spaces = [reuse.space(_size_spec(spec, t, 16, "fixed")) for t in types]
    assert spaces[1].configs() is spaces[0].configs()
    assert spaces[2].configs() is not spaces[0].configs()
    together = capacity_table(spec, [8, 16], ["h100", "h200", "mi300x"])
    for t in ["h100", "h200", "mi300x"]:
        alone = capacity_table(spec, [8, 16], [t])
        for a, b in zip(together.rows(t), alone.rows(t), strict=True):
            assert (a.legal_configs, a.feasible_configs) == (b.legal_configs, b.feasible_configs)
            assert a.best is not None and b.best is not None
            assert (a.best.config, a.tokens_per_s_per_gpu, a.best.peak_gib) == (
                b.best.config,
                b.tokens_per_s_per_gpu,
                b.best.peak_gib,
            )
