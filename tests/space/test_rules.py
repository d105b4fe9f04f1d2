"""Every legality rule has a passing and a failing case."""

import dataclasses

import pytest

from primus_optuna import Space, StudySpec, TrainingConfig
from primus_optuna.space import RULES
from tests.conftest import FLAGSHIP, small_dense_study


@pytest.fixture(scope="module")
def moe() -> Space:
    return Space(StudySpec.from_yaml(FLAGSHIP))  # Mixtral 8x22B, 64 MI355X, seq 8192, GBS 512


@pytest.fixture(scope="module")
def dense() -> Space:
    return Space(StudySpec.from_dict(small_dense_study()))  # Llama 3.1 8B, 8 H100, seq 4096, GBS 64


def reasons(space: Space, **axes) -> list[str]:
    return space.check(space.make(**axes))


BASE_OK = dict(
    tp=1,
    pp=4,
    vpp=2,
    ep=8,
    cp=1,
    mbs=2,
    recompute="none",
    moe_dispatcher="alltoall",
    pp_schedule="interleaved",
)

# rule id -> (passing axes, failing axes, substring of the failing reason), all on the flagship study
CASES = {
    "tp_max": ({"tp": 8}, {"tp": 16, "pp": 1, "vpp": 1, "pp_schedule": "1f1b"}, "max_tp"),
    "tp_heads": ({"tp": 8}, {"tp": 32, "pp": 1, "vpp": 1, "pp_schedule": "1f1b"}, "attention heads"),
    "tp_kv_groups": ({"tp": 4}, {"tp": 3}, "KV groups"),
    "tp_ffn": ({"tp": 2}, {"tp": 6}, "ffn_hidden_size"),
    "seq_cp": ({"cp": 8}, {"cp": 3}, "2·cp"),
    "seq_tp": ({"tp": 2}, {"tp": 3}, "tp·cp"),
    "world": (
        {"tp": 2, "cp": 2},
        {"tp": 1, "cp": 1, "pp": 7, "vpp": 1, "pp_schedule": "1f1b"},
        "does not divide the 64 GPUs",
    ),
    "pp_layers": ({"pp": 8}, {"pp": 16, "vpp": 1, "pp_schedule": "1f1b"}, "layers"),
    "ep_experts": ({"ep": 4}, {"ep": 16}, "experts"),
    "ep_fold": ({"ep": 8, "pp": 8}, {"ep": 8, "pp": 16, "vpp": 1, "pp_schedule": "1f1b"}, "world/pp"),
    "vpp_layers": ({"vpp": 7}, {"vpp": 3}, "pp·vpp"),
    "schedule_vpp": ({"vpp": 2, "pp_schedule": "zbv"}, {"vpp": 4, "pp_schedule": "zbv"}, "exactly vpp=2"),
    "pp1_no_pipeline": ({"pp": 1, "vpp": 1, "pp_schedule": "1f1b"}, {"pp": 1}, "no pipeline"),
    "mb_whole": ({"mbs": 2}, {"mbs": 3}, "not divisible by mbs·dp"),
    "zb_recompute": (
        {"pp_schedule": "zbv", "recompute": "none"},
        {"pp_schedule": "zbv", "recompute": "full"},
        "zero bubble",
    ),
    "ep_overlap": (
        {"ep_overlap": True},  # interleaved, ep 8, no recompute
        {"ep_overlap": True, "vpp": 1, "pp_schedule": "1f1b"},
        "pp_schedule=interleaved",
    ),
    # flagship: 56 layers, pp4·vpp2 -> 7 layers per chunk
    "recompute_layers": ({"recompute": "full:6"}, {"recompute": "full:7"}, "N < the 7 layers"),
    # flagship is FP8 with Megatron's default delayed scaling
    "recompute_fp8": ({"recompute": "selective:moe"}, {"recompute": "selective:moe_act"}, "delayed scaling"),
    "recompute_modules": ({"recompute": "selective:moe"}, {"recompute": "selective:mlp"}, "no dense MLP"),
    # flagship at tp1 pp4 cp1: dp = 16, ep = 8 (TorchTitan parallel_dims.py@b5bcd76c:182-191)
    "fsdp_dp": ({"dp_shard": 8}, {"dp_shard": 3}, "does not divide dp=16"),
    "fsdp_ep": ({"dp_shard": 8}, {"dp_shard": 2}, "dp_shard·cp·tp"),
}


def test_ep_overlap_follows_megatron(moe, dense):
    # Megatron-Core TransformerConfig.__post_init__ (overlap_moe_expert_parallel_comm): ep > 1, a virtual
    # pipeline when pp > 1, no full recompute; both dispatchers; pp = 1 allowed
    assert reasons(moe, **{**BASE_OK, "ep_overlap": True, "moe_dispatcher": "deepep"}) == []
    assert reasons(moe, **{**BASE_OK, "ep_overlap": True, "pp": 1, "vpp": 1, "pp_schedule": "1f1b"}) == []
    assert "recompute=full" in " ".join(reasons(moe, **{**BASE_OK, "ep_overlap": True, "recompute": "full"}))
    assert "ep > 1" in " ".join(reasons(moe, **{**BASE_OK, "ep_overlap": True, "ep": 1}))
    assert "recompute=full:1" in " ".join(
        reasons(moe, **{**BASE_OK, "ep_overlap": True, "recompute": "full:1"})
    )
    assert "'moe'" in " ".join(reasons(moe, **{**BASE_OK, "ep_overlap": True, "recompute": "selective:moe"}))
    assert "zbv" not in " ".join(reasons(moe, **{**BASE_OK, "pp_schedule": "zbv"}))
    assert reasons(moe, **{**BASE_OK, "ep_overlap": True, "pp_schedule": "zbv"})
    # a dense model never has it: canonical form drops it, the candidates hold only false
    assert dense.candidates["ep_overlap"] == [False]
    assert dense.canonical(dense.make(ep_overlap=True)).ep_overlap is False


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_pass_and_fail(moe, rule_id):
    ok, bad, needle = CASES[rule_id]
    rule = next(r for r in RULES if r.id == rule_id)
    good_cfg = moe.make(**{**BASE_OK, **ok})
    bad_cfg = moe.make(**{**BASE_OK, **bad})
    assert rule.fn(moe.facts, good_cfg) is None
    reason = rule.fn(moe.facts, bad_cfg)
    assert reason and needle in reason


def test_microbatch_rules():
    # Llama 3.1 8B on 8 GPUs with GBS 40: pp=4, tp=1 -> dp=2
    data = small_dense_study()
    data["workload"]["global_batch_size"] = 40
    sp = Space(StudySpec.from_dict(data))
    ge = next(r for r in RULES if r.id == "mb_ge_pp")
    inter = next(r for r in RULES if r.id == "mb_interleaved")
    base = dict(tp=1, pp=4, vpp=2, pp_schedule="interleaved")
    assert ge.fn(sp.facts, sp.make(**base, mbs=5)) is None  # m = 4
    assert "cannot fill" in ge.fn(sp.facts, sp.make(**base, mbs=10))  # m = 2 < 4
    # 1F1B caps its warm-up at the micro-batches there are: m = 2 < pp = 4 runs (idle stages and all)
    assert ge.fn(sp.facts, sp.make(tp=1, pp=4, mbs=10, vpp=1, pp_schedule="1f1b")) is None
    assert "zb1p cannot fill" in ge.fn(sp.facts, sp.make(tp=1, pp=4, mbs=10, vpp=1, pp_schedule="zb1p"))
    # torch's Schedule1F1B (TorchTitan's) refuses it
    titan = dataclasses.replace(sp.facts, torchtitan=True)
    assert "cannot fill" in ge.fn(titan, sp.make(tp=1, pp=4, mbs=10, vpp=1, pp_schedule="1f1b"))
    assert inter.fn(sp.facts, sp.make(**base, mbs=5)) is None  # m = 4
    assert "multiple of pp" in inter.fn(sp.facts, sp.make(**base, mbs=4))  # m = 5
    assert (
        inter.fn(sp.facts, sp.make(tp=1, pp=4, mbs=4, vpp=1, pp_schedule="1f1b")) is None
    )  # 1f1b: no multiple


def test_dense_only_rules(dense):
    for rule_id, good, bad, needle in [
        ("ep_moe", {"ep": 1}, {"ep": 2}, "MoE"),
        ("deepep_moe", {"moe_dispatcher": "alltoall"}, {"moe_dispatcher": "deepep"}, "MoE layers only"),
    ]:
        rule = next(r for r in RULES if r.id == rule_id)
        assert rule.fn(dense.facts, dense.make(**good)) is None
        assert needle in rule.fn(dense.facts, dense.make(**bad))


def test_recompute_module_rules():
    dense = Space(StudySpec.from_dict(small_dense_study()))
    moe_data = StudySpec.from_yaml(FLAGSHIP).to_dict()
    moe_data["workload"]["fp8_recipe"] = "tensorwise"
    moe = Space(StudySpec.from_dict(moe_data))
    rule = next(r for r in RULES if r.id == "recompute_modules")
    fp8 = next(r for r in RULES if r.id == "recompute_fp8")
    assert rule.fn(dense.facts, dense.make(recompute="selective:mlp")) is None
    assert "dense" in rule.fn(dense.facts, dense.make(recompute="selective:moe_act"))
    assert "multi-latent" in rule.fn(moe.facts, moe.make(recompute="selective:mla_up_proj"))
    assert "shared experts" in rule.fn(moe.facts, moe.make(recompute="selective:shared_experts"))
    # tensorwise FP8 allows moe_act/layernorm
    assert fp8.fn(moe.facts, moe.make(recompute="selective:moe_act+layernorm")) is None


def test_full_n_canonical_and_bounds(moe):
    # 7 layers per chunk at pp4 vpp2: full:7 is `full`, full:8 illegal, full:6 legal
    assert moe.canonical(moe.make(**{**BASE_OK, "recompute": "full:7"})).recompute == "full"
    assert moe.canonical(moe.make(**{**BASE_OK, "recompute": "full:6"})).recompute == "full:6"
    assert reasons(moe, **{**BASE_OK, "recompute": "full:8"})
    assert not reasons(moe, **{**BASE_OK, "recompute": "full:1"})


def test_every_rule_is_covered():
    from tests.space.test_framework_rules import FRAMEWORK_RULES
    from tests.space.test_torchtitan_args import TITAN_RULES

    # moe_tp_sp: tests/physics/test_sequence_parallel.py (it needs a study with sequence_parallel: false)
    elsewhere = {
        "ep_moe",
        "deepep_moe",
        "mb_ge_pp",
        "mb_interleaved",
        "moe_tp_sp",
        "cp_a2a_heads",
        *FRAMEWORK_RULES,
        *TITAN_RULES,
    }
    assert set(CASES) | elsewhere == {r.id for r in RULES}


def test_schedule_vpp_other_branches(moe):
    assert "needs vpp=1" in " ".join(reasons(moe, **{**BASE_OK, "pp_schedule": "1f1b", "vpp": 2}))
    assert "needs vpp=1" in " ".join(reasons(moe, **{**BASE_OK, "pp_schedule": "zb1p", "vpp": 2}))
    assert "needs vpp>1" in " ".join(reasons(moe, **{**BASE_OK, "pp_schedule": "interleaved", "vpp": 1}))


def test_mixtral_rejects_tp3_and_tp6(moe):
    for tp in (3, 6):
        r = reasons(moe, **{**BASE_OK, "tp": tp})
        assert any("KV groups" in x for x in r), r
        assert TrainingConfig(tp=tp) not in moe
    assert 3 not in moe.legal_values()["tp"] and 6 not in moe.legal_values()["tp"]


def test_moe_dp_and_microbatches_are_derived(moe):
    c = moe.make(**BASE_OK)
    assert (c.dp, c.num_microbatches) == (16, 16)
    assert moe.check(c) == []
    # expert data parallel = world / (pp * ep) must be whole: ep folds into tp*cp*dp = 16 ranks per stage
    assert moe.check(moe.make(**{**BASE_OK, "ep": 8, "tp": 2, "cp": 2})) == []


def test_ep_overlap_with_an_mtp_layer_needs_a_pipeline() -> None:
    # Megatron-Core 0.16 / Primus's pin (transformer_config.py@d3528a21:2065-2071): with overlap_moe_expert_
    # parallel_comm, at most one MTP layer, and pp > 1 when there is one
    space = Space(StudySpec.from_yaml("studies/deepseek-v3-mi355x-fp8.yaml"))
    assert space.spec.model.mtp_num_layers == 1
    legal = [c for c in space.configs() if c.ep_overlap]
    assert legal and all(c.pp > 1 for c in legal)
    one_stage = next(c for c in space.configs() if c.pp == 1 and c.ep > 1 and not c.ep_overlap)
    assert "MTP layer needs pp > 1" in " ".join(space.check(one_stage.replace(ep_overlap=True)))


def test_a_pp_that_cannot_split_the_layers_is_reported_once_with_the_fix() -> None:
    """Qwen3-235B-A22B's 94 layers over pp=8: one reason (not the pp rule and the vpp rule both), naming how to
    make the split legal."""
    spec = StudySpec.from_dict(
        {
            "name": "q",
            "model": {"catalog": "qwen3-235b-a22b"},
            "cluster": {"gpu": "gb200", "nodes": 4, "gpus_per_node": 64},
            "workload": {"seq_length": 4096, "global_batch_size": 1024, "precision": "bf16"},
        }
    )
    space = Space(spec)
    reasons = space.check(space.make(tp=1, pp=8, vpp=3, ep=32, cp=1, mbs=1, pp_schedule="interleaved"))
    layers = [r for r in reasons if "94 layers" in r]
    assert len(layers) == 1, reasons
    assert "account_for_embedding_in_pipeline_split" in layers[0] and "pipeline.layout" in layers[0]


def test_a2a_context_parallelism_needs_cp_to_divide_a_ranks_heads():
    """Attention sinks (GPT-OSS, softmax_type learnable) and sliding windows run under context parallelism only as
    TransformerEngine's a2a (dot_product_attention/utils.py@d0067d0d:1146-1155, 1262-1271), which asserts that cp
    divides a TP rank's query and KV heads (context_parallel.py@d0067d0d:4246-4249). GPT-OSS-120B: 64 heads, 8
    KV groups."""
    oss = Space(StudySpec.from_yaml("studies/gpt-oss-120b-h100-bf16.yaml"))
    assert oss.spec.model.cp_comm_type == "a2a"
    base = oss.make(tp=1, pp=4, vpp=1, ep=8, cp=1, mbs=1, recompute="none", pp_schedule="1f1b")
    assert oss.check(base.replace(cp=2)) == [] and oss.check(base.replace(cp=4)) == []
    bad = " ".join(oss.check(base.replace(tp=8, pp=1, cp=2, ep=4)))
    assert "does not divide the 8 attention heads and 1 KV heads" in bad and "a2a" in bad
    assert any(c.cp > 1 for c in oss.configs())
    assert all((8 // c.tp) % c.cp == 0 for c in oss.configs())
    data = StudySpec.from_yaml("studies/gpt-oss-120b-h100-bf16.yaml").to_dict()
    data["model"] = {**data["model"], "softmax_type": "vanilla"}
    assert StudySpec.from_dict(data).model.cp_comm_type == "a2a"  # the sliding windows alone
    data["model"] = {**data["model"], "window_size": None, "window_attn_skip_freq": None}
    full = Space(StudySpec.from_dict(data))
    assert full.spec.model.cp_comm_type == "p2p"
    assert full.check(base.replace(tp=8, pp=1, cp=2, ep=4)) == []  # the p2p ring splits no heads
