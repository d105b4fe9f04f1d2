"""Per-kind layer terms (MLA, shared experts, dense-first, MTP) and uneven pipeline stages in the memory and
step-time models."""

from __future__ import annotations

import pytest

from primus_optuna import StudySpec
from primus_optuna.physics.layer_mix import (
    kind_activation_bytes,
    mla_activation_terms,
    rank_layer_params,
    shared_expert_activation_terms,
    stage_mixes,
)
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.shapes import LayerShape
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.space import Space
from primus_optuna.spec.model import MODEL_CATALOG


def _study(model: str, pipeline: dict | None = None, nodes: int = 8, gbs: int = 1024) -> StudySpec:
    data = {
        "name": "t",
        "model": {"catalog": model},
        "cluster": {"gpu": "mi355x", "nodes": nodes},
        "workload": {"seq_length": 4096, "global_batch_size": gbs, "precision": "bf16"},
    }
    if pipeline:
        data["pipeline"] = pipeline
    return StudySpec.from_dict(data)


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2", "gpt-oss-120b", "moonlight-16b-a3b"])
@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 8)])
def test_rank_params_sum_to_the_model(name: str, tp: int, ep: int) -> None:
    """Per-GPU layer parameters × TP (split parts) and × EP (experts) rebuild the whole-model count."""
    m = MODEL_CATALOG[name]
    if m.num_attention_heads % tp or m.experts % ep:
        pytest.skip("not divisible")
    one = rank_layer_params(m, 1, 1, True)
    assert one.dense + one.expert == m.layer_params(True)[0]
    dense_one = rank_layer_params(m, 1, 1, False)
    assert dense_one.dense + dense_one.expert == m.layer_params(False)[0]
    split = rank_layer_params(m, tp, ep, True)
    assert split.expert * ep == one.expert
    if tp > 1:
        assert split.dense < one.dense


def test_mla_terms_and_mla_up_proj_recompute() -> None:
    m = MODEL_CATALOG["deepseek-v3"]
    spec = _study("deepseek-v3", {"layout": "Et*4|(t*4|)*14tmL"})
    shape = LayerShape.from_config(spec, Space(spec).make(tp=1, pp=8, vpp=2, ep=8, pp_schedule="interleaved"))
    keep = mla_activation_terms(m, shape)
    T, a = shape.tokens, shape.heads
    # Q and K are 192 wide per head (128 nope + 64 rope), V 128
    assert keep["mla_q_up"] == 2 * T * a * 192 and keep["mla_kv_up"] == 2 * T * a * (192 + 128)
    assert keep["core_out"] == 2 * T * a * 128
    full = kind_activation_bytes(m, shape, "none")
    # mla_up_proj drops Q, K, V (rebuilt from the latents, which stay); core_attn the softmax statistics
    assert kind_activation_bytes(m, shape, "selective:core_attn+mla_up_proj") == (
        full - keep["mla_q_up"] - keep["mla_kv_up"] - keep["softmax_lse"]
    )
    assert keep["mla_kv_latent"] > 0 and keep["mla_q_latent"] > 0
    sh = shared_expert_activation_terms(m, shape)
    assert sh["shared_fc1_out"] == 2 * T * 2 * 2048
    assert kind_activation_bytes(m, shape, "selective:shared_experts") == (
        full - sh["shared_fc1_out"] - sh["shared_act_out"]
    )


def test_dense_first_layers_are_lighter_than_moe_layers() -> None:
    spec = _study("deepseek-v3")
    shape = LayerShape.from_config(spec, Space(spec).make(tp=1, ep=8))
    m = spec.model
    assert kind_activation_bytes(m, shape.replace(moe=False), "none") < kind_activation_bytes(
        m, shape, "none"
    )
    assert rank_layer_params(m, 1, 8, False).total < rank_layer_params(m, 1, 8, True).total


def test_uneven_layout_stages_differ_and_the_peak_stage_decides() -> None:
    spec = _study("deepseek-v3", {"layout": "Et*4|(t*4|)*14tmL"})
    mixes = stage_mixes(spec.model, spec.pipeline, 8, 2, "interleaved")
    assert mixes is not None
    # stage 0: chunks 0 (E + 3 dense + 1 MoE) and 8 (4 MoE); stage 7: chunks 7 (4 MoE) and 15 (1 MoE + MTP + L)
    assert (mixes[0].dense, mixes[0].moe, mixes[0].embedding) == (3, 5, True)
    assert (mixes[7].moe, mixes[7].mtp, mixes[7].loss) == (5, 1, True)
    cfg = Space(spec).make(tp=1, pp=8, vpp=2, ep=8, recompute="full", pp_schedule="interleaved")
    est = estimate_memory(spec, cfg.derive(spec.world, 1024))
    params = [s.layer_params for s in est.stages]
    assert params[0] < params[1] and params[7] < params[1]  # dense-first stage and the light last stage
    assert est.peak_gib == max(s.total_gib for s in est.stages)
    # the same model split evenly (first/last-stage counts) gives different per-stage parameters
    even = _study(
        "deepseek-v3", {"decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": 2}
    )
    est2 = estimate_memory(even, Space(even).make(tp=1, pp=8, ep=8, recompute="full").derive(64, 1024))
    assert [s.layer_params for s in est2.stages] != params[:8]


def test_mtp_and_shared_experts_cost_step_time_and_flops() -> None:
    from primus_optuna.physics.flops import model_flops_per_token

    v3 = MODEL_CATALOG["deepseek-v3"]
    assert model_flops_per_token(v3, 4096, mtp=True) > model_flops_per_token(v3, 4096, mtp=False)
    spec = _study("deepseek-v3", {"layout": "Et*4|(t*4|)*14tmL"})
    cfg = (
        Space(spec)
        .make(tp=1, pp=8, vpp=2, ep=8, recompute="full", pp_schedule="interleaved")
        .derive(64, 1024)
    )
    base = estimate_throughput(spec, cfg).step_time_s
    no_shared = spec.model.model_copy(update={"moe_shared_expert_intermediate_size": None})
    spec2 = spec.model_copy(update={"model": no_shared})
    assert estimate_throughput(spec2, cfg).step_time_s < base


def test_sliding_window_attention_is_cheaper() -> None:
    from primus_optuna.physics.flops import model_flops_per_token

    g = MODEL_CATALOG["gpt-oss-120b"]
    full = g.model_copy(update={"window_size": None, "window_attn_skip_freq": None})
    assert model_flops_per_token(g, 4096) < model_flops_per_token(full, 4096)


@pytest.mark.parametrize("name", ["deepseek-v3-mi355x-fp8", "gpt-oss-120b-h100-bf16"])
def test_new_studies_have_a_legal_published_baseline_and_a_plan(name: str) -> None:
    from primus_optuna.physics.plan import plan_space
    from tests.conftest import STUDIES

    spec = StudySpec.from_yaml(STUDIES / f"{name}.yaml")
    space = Space(spec)
    assert space.check(space.baseline) == []
    result = plan_space(spec, space, top=3)
    assert result.feasible_configs > 0
    best = result.top[0]
    assert best.fits and best.peak_gib <= spec.cluster.gpu.hbm_gib and best.tokens_per_s_per_gpu > 0
    # both published recipes fit under the study's margin (DeepSeek-V3's with the recipe's bf16 Adam moments:
    # see the study file) and are ranked
    assert result.baseline_rank is not None


def test_each_stage_is_timed_with_its_own_layers() -> None:
    """The stage holding MTP and the loss is timed with its own layers: a layout that gives the loss chunk one
    layer (the recipe's) runs faster than one that gives it four with the same 61 layers, and the breakdown is
    the busiest stage's (four-layer chunks: its MoE layers, no output layer)."""
    from primus_optuna.physics.throughput import _context

    light = _study("deepseek-v3", {"layout": "Et*4|(t*4|)*14tmL"}, nodes=16)
    heavy = _study("deepseek-v3", {"layout": "Et*4|t|(t*4|)*13t*4mL"}, nodes=16)
    cfg = Space(light).make(tp=1, pp=16, ep=8, recompute="full").derive(light.world, 1024)
    a, b = estimate_throughput(light, cfg), estimate_throughput(heavy, cfg)
    assert a.step_time_s < b.step_time_s
    ctx = _context(light)
    moe = ctx.layer(1, 1, 8, 1, cfg.moe_dispatcher, True)
    m = cfg.num_microbatches
    # a middle stage: 4 MoE layers, 3 GEMM passes each; no output layer's cross entropy in compute_other
    assert a.breakdown_s["compute_mlp"] == pytest.approx(m * 4 * 3 * moe.mlp_lin)
    assert a.breakdown_s["compute_other"] == pytest.approx(
        m * 4 * (3 * moe.other_f + moe.host_f + moe.host_b)
    )


def test_a_split_the_layout_does_not_allow_is_estimated_with_layers_rounded_up() -> None:
    """DeepSeek-V3's 61 layers over pp = 8 without a layout is illegal (Space.check says why), yet the estimate
    still prices it, as Megatron's uneven split at its busiest: ceil(61 / 8) = 8 layers per stage, the dense
    share spread over the stages (layer_mix.chunk_counts from even_fallback); the step is no shorter than that
    of a legal layout holding 8 layers on its busiest stage."""
    from primus_optuna.physics.layer_mix import chunk_counts

    spec = _study("deepseek-v3", nodes=16)
    config = Space(spec).make(tp=1, pp=8, ep=8, recompute="full").derive(spec.world, 1024)
    assert Space(spec).check(config)
    counts = chunk_counts(spec.model, spec.pipeline, 8, 1, "1f1b")
    assert len(counts) == 8 and all(main + dense == 8 for main, dense, _ in counts)
    assert [heads for *_, heads in counts] == [0.0] * 7 + [2.0]  # the output layer and MTP's, on the last
    laid = _study("deepseek-v3", {"layout": "Et*8|(t*8|)*6t*5mL"}, nodes=16)
    est, legal = estimate_throughput(spec, config), estimate_throughput(laid, config)
    assert est.tokens_per_s_per_gpu > 0 and est.step_time_s >= 0.98 * legal.step_time_s
