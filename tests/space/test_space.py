import pytest

from primus_optuna import Space, SpecError, StudySpec, TrainingConfig
from primus_optuna.space import parse_config_string
from tests.conftest import FLAGSHIP, small_dense_study, small_moe_study


def test_enumeration_equals_brute_force_filter_moe():
    space = Space(StudySpec.from_dict(small_moe_study()))
    brute = {c for c in space.product() if not space.check(c)}
    fast = space.configs()
    assert len(fast) == len(set(fast)) == len(brute) > 100
    assert set(fast) == brute


def test_enumeration_is_depth_first_over_the_enumeration_order():
    # the space's order (ties in a plan keep it): depth-first over ENUM_ORDER, each axis in candidate order
    from primus_optuna.space.space import ENUM_ORDER

    space = Space(StudySpec.from_dict(small_moe_study()))
    rank = {a: {v: i for i, v in enumerate(space.candidates[a])} for a in ENUM_ORDER}
    brute = [c for c in space.product() if not space.check(c)]
    expected = sorted(brute, key=lambda c: tuple(rank[a][getattr(c, a)] for a in ENUM_ORDER))
    assert len({c.ep_overlap for c in expected}) == 2 and len({c.moe_dispatcher for c in expected}) == 2
    assert [c.to_dict() for c in space.configs()] == [
        c.derive(space.facts.world, space.facts.gbs).to_dict() for c in expected
    ]


def test_enumeration_equals_brute_force_filter_dense_with_restricted_axes():
    spec = StudySpec.from_dict(
        small_dense_study(axes={"tp": [1, 2, 4], "mbs": [1, 2], "recompute": ["none", "full"]})
    )
    space = Space(spec)
    brute = {c for c in space.product() if not space.check(c)}
    assert set(space.configs()) == brute
    assert {c.tp for c in brute} <= {1, 2, 4} and {c.recompute for c in brute} == {"none", "full"}


def test_legal_configs_are_canonical_and_derived():
    space = Space(StudySpec.from_yaml(FLAGSHIP))
    for c in space.configs()[::97]:
        assert space.canonical(c) == c
        assert c.dp * c.tp * c.cp * c.pp == 64
        assert c.num_microbatches * c.mbs * c.dp == 512


def test_canonicalisation():
    moe = Space(StudySpec.from_yaml(FLAGSHIP))
    c = moe.canonical(TrainingConfig(pp=1, vpp=2, pp_schedule="zbv", ep=8))
    assert (c.vpp, c.pp_schedule) == (1, "1f1b")
    assert moe.canonical(TrainingConfig(pp=4, vpp=1, pp_schedule="interleaved")).pp_schedule == "1f1b"
    # canonical forms are equal; different physical configs are not
    assert moe.canonical(TrainingConfig(pp=1, vpp=2)) == moe.canonical(TrainingConfig(pp=1, vpp=1))
    assert moe.canonical(TrainingConfig(pp=2)) != moe.canonical(TrainingConfig(pp=4))
    dense = Space(StudySpec.from_dict(small_dense_study()))
    d = dense.canonical(TrainingConfig(ep=8, moe_dispatcher="deepep"))
    assert (d.ep, d.moe_dispatcher) == (1, "alltoall")
    assert dense.check(d) == []  # tp1 pp1 on 8 GPUs


def test_config_is_hashable_and_ignores_derived_fields():
    a = TrainingConfig(tp=2).derive(64, 512)
    b = TrainingConfig(tp=2)
    assert a == b and hash(a) == hash(b) and a.dp == 32 and b.dp == 0
    assert TrainingConfig.from_params(a.to_params()) == a
    assert a.key() == "tp2-pp1-ep1-cp1-vpp1-mbs1-none-alltoall-1f1b"


def test_parse_config_string():
    assert parse_config_string("tp=2, pp=4,recompute=full") == {"tp": 2, "pp": 4, "recompute": "full"}
    for bad, needle in [
        ("tp", "KEY=VALUE"),
        ("tq=1", "unknown axis"),
        ("tp=0", "positive"),
        ("recompute=some", "allowed values"),
        ("tp=8;pp=4", r"^--config: tp must be a positive integer, got '8;pp=4'; separate axes with commas"),
    ]:
        with pytest.raises(SpecError, match=needle):
            parse_config_string(bad)


def test_baseline_missing_axes_default_and_legality():
    space = Space(StudySpec.from_yaml(FLAGSHIP))
    assert space.baseline == TrainingConfig(
        tp=1, pp=4, vpp=2, ep=8, cp=1, mbs=1, recompute="full:1", pp_schedule="interleaved"
    )
    assert space.check(space.baseline) == []
    assert space.baseline in space


def test_empty_space_names_the_rules_that_block():
    spec = StudySpec.from_dict(small_moe_study(axes={"tp": [3]}))
    with pytest.raises(SpecError) as e:
        Space(spec).configs()
    msg = str(e.value)
    assert "no legal configuration" in msg and "Widen search.axes" in msg
    blockers = msg.split("every combination breaks ")[1]
    for rule in ("tp_heads", "tp_kv_groups", "tp_ffn", "seq_tp", "world"):  # every point fails these for tp=3
        assert rule + " (" in blockers
    assert "tp=3 does not divide the 32 attention heads" in blockers
    # a rule that rejects only some combinations is not named as a blocker
    assert "mb_whole" not in blockers
    sp = Space(spec)
    total = 1
    for values in sp.candidates.values():
        total *= len(values)
    assert f"among the {total} combinations" in msg


def test_summary_shape():
    s = Space(StudySpec.from_dict(small_moe_study())).summary()
    assert set(s) == {"axes", "legal_configs", "baseline"}
    assert set(s["baseline"]) == {"config", "legal", "reasons"}
    assert list(s["axes"]) == [
        "tp",
        "pp",
        "ep",
        "cp",
        "vpp",
        "mbs",
        "recompute",
        "moe_dispatcher",
        "pp_schedule",
        "ep_overlap",
        "dp_shard",
    ]


def test_repeated_axis_in_config_string_is_refused():
    with pytest.raises(SpecError, match="given twice"):
        parse_config_string("tp=1,tp=2")


def test_training_config_refuses_values_outside_the_vocabulary():
    """Item 7 of issue 12: one ValueError naming the field and the allowed values; the CLI exits 2."""
    from click.testing import CliRunner

    from primus_optuna.cli import cli

    with pytest.raises(ValueError, match=r"recompute: .*allowed values: none, selective, selective:<modules"):
        TrainingConfig(recompute="bogus")
    with pytest.raises(
        ValueError, match="moe_dispatcher: 'x' is not allowed; allowed values: alltoall, deepep"
    ):
        TrainingConfig(moe_dispatcher="x")
    with pytest.raises(ValueError, match="pp_schedule: 'gpipe' is not allowed"):
        TrainingConfig(pp_schedule="gpipe")
    with pytest.raises(ValueError, match="unknown recompute module"):
        TrainingConfig(recompute="selective:attn")
    # canonical spelling: module order, the default module set
    assert TrainingConfig(recompute="selective:layernorm+moe_act").recompute == "selective:moe_act+layernorm"
    assert TrainingConfig(recompute="selective:core_attn").recompute == "selective"
    r = CliRunner().invoke(cli, ["estimate", str(FLAGSHIP), "--config", "recompute=bogus"])
    assert r.exit_code == 2 and "allowed values" in r.output


def test_empty_space_names_the_single_blocking_rule():
    spec = StudySpec.from_dict(
        small_moe_study(axes={"tp": [1], "pp": [1], "ep": [8], "cp": [1], "mbs": [64]})
    )
    space = Space(spec)
    assert space.empty and not Space(StudySpec.from_dict(small_moe_study())).empty
    msg = space.explain_empty()
    assert "every combination breaks mb_whole (global_batch_size=32 is not divisible by mbs" in msg
    assert "every combination breaks mb_whole (" in msg and "; " not in msg.split("breaks ", 1)[1]  # alone


def test_full_n_covering_every_layer_of_a_chunk_is_full_when_layers_do_not_divide_evenly():
    # DeepSeek-V3: 61 layers in the 16 chunks of its pipeline.layout (pp·vpp = 4·4 or 8·2), so 3.8 layers a
    # chunk: full:4 recomputes every layer, is canonically `full`, and must not be a second configuration of
    # the space (the fallback excluded the measured `full` and proposed `full:4`, the same run, again and again)
    space = Space(StudySpec.from_yaml(FLAGSHIP.with_name("deepseek-v3-mi355x-fp8.yaml")))
    c = space.make(tp=1, pp=4, vpp=4, ep=8, mbs=2, recompute="full:4", pp_schedule="interleaved")
    assert space.canonical(c).recompute == "full"
    assert any("N = all of them is recompute=full" in r for r in space.check(c))
    assert space.check(c.replace(recompute="full:2")) == []  # 2 of ~4 layers: a real partial recompute
    assert space.canonical(c.replace(recompute="full:2")).recompute == "full:2"
    configs = space.configs()
    assert all(space.canonical(x) == x for x in configs)
    assert len({space.canonical(x) for x in configs}) == len(configs)


def test_enumeration_builds_configurations_positionally_in_field_order() -> None:
    # Space._enumerate_list passes the axes positionally: TrainingConfig's fields must be AXES, then the
    # derived dp and num_microbatches, and the leaves must equal TrainingConfig(...).derive(...)
    import dataclasses

    from primus_optuna.spec.study import AXES

    assert tuple(f.name for f in dataclasses.fields(TrainingConfig)) == (*AXES, "dp", "num_microbatches")
    spec = StudySpec.from_yaml(FLAGSHIP)
    space = Space(spec)
    for c in space.configs()[::997]:
        again = TrainingConfig.from_params(c.to_params()).derive(space.facts.world, space.facts.gbs)
        assert c == again and (c.dp, c.num_microbatches) == (again.dp, again.num_microbatches)


def test_baseline_values_join_the_default_candidates():
    """An imported baseline's own values (e.g. full:4 on a dense model) are swept from, not replaced."""
    from primus_optuna.record.storage import space_hash

    data = small_dense_study()
    plain = Space(StudySpec.from_dict(data))
    assert "full:4" not in plain.candidates["recompute"] and plain.baseline_added == {}
    data["search"]["baseline"]["recompute"] = "full:4"
    spec = StudySpec.from_dict(data)
    space = Space(spec)
    assert space.baseline_added == {"recompute": "full:4"}
    rc = space.candidates["recompute"]
    assert rc.index("full:2") < rc.index("full:4") < rc.index("full")  # decreasing memory order
    assert space.canonical(space.baseline) in space.configs()
    assert space_hash(spec) != space_hash(StudySpec.from_dict(small_dense_study()))
    # an axis the study restricts keeps exactly its listed values
    restricted = Space(
        StudySpec.from_dict({**data, "search": {**data["search"], "axes": {"recompute": ["none", "full"]}}})
    )
    assert restricted.candidates["recompute"] == ["none", "full"]


def test_a_value_written_in_search_axes_that_no_legal_configuration_has_is_named():
    data = small_dense_study()  # Llama 3.1 8B: 32 heads, 8 KV groups
    data["search"]["axes"] = {"tp": [1, 2, 3], "mbs": [1, 2]}
    space = Space(StudySpec.from_dict(data))
    assert 3 not in space.legal_values()["tp"]
    lines = space.axis_warnings()
    assert lines == [
        "search.axes.tp: 3 is in no legal configuration (tp=3 does not divide the 32 attention heads); "
        "it is left out of the search"
    ]
    data["search"]["axes"] = {"tp": [1, 2]}
    assert Space(StudySpec.from_dict(data)).axis_warnings() == []


def test_a_layer_count_no_pp_divides_is_named_with_the_pipeline_section_as_the_fix():
    data = small_moe_study()
    data["model"] = {"catalog": "deepseek-v3"}  # 61 layers
    data.pop("pipeline", None)
    data["search"].pop("axes", None)
    space = Space(StudySpec.from_dict(data))
    assert space.legal_values()["pp"] == [1]
    (line,) = [w for w in space.axis_warnings() if w.startswith("pp:")]
    assert "divides the model's 61 layers evenly; add a pipeline section" in line


def test_adopt_enumeration_only_of_the_same_space():
    """A space takes another's enumeration (the same list) when facts, model, pipeline layout and candidates are
    the same, whatever the GPU; not when the world differs or the launcher adds schedules (Primus on AMD)."""
    d = small_dense_study()
    h100 = Space(StudySpec.from_dict(d))
    h200 = Space(StudySpec.from_dict({**d, "cluster": {**d["cluster"], "gpu": "h200"}}))
    assert h200.adopt_enumeration(h100) and h200.configs() is h100.configs()
    mi300x = Space(StudySpec.from_dict({**d, "cluster": {**d["cluster"], "gpu": "mi300x"}}))
    bigger = Space(StudySpec.from_dict({**d, "cluster": {**d["cluster"], "nodes": 2}}))
    for other in (mi300x, bigger):
        assert not other.adopt_enumeration(h100)
        assert other.configs() is not h100.configs()
