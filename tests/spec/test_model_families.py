"""MLA / shared-expert / dense-first / MTP / GPT-OSS model fields, catalog entries, parameter counts and the
Hugging Face config.json importer (hand-written config.json files of each family under tests/spec/data/hf,
transcribed from the models' Hugging Face repositories)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.spec import ModelSpec
from primus_optuna.spec.model import MODEL_CATALOG, hf_to_megatron, parse_layer_pattern

HF = Path(__file__).parent / "data" / "hf"

# Published totals / active-per-token counts (model cards and papers named in each row). The published active
# counts of these families exclude the input-embedding lookup (DeepSeek-V2/V3 papers, GPT-OSS model card:
# 5.13B = attention + 4 experts + router + unembedding), so ``active - embedding`` is compared.
# ``digits`` is the precision the source states: a figure given as "37B" means 36.5-37.5B, so the tolerance is
# half a unit of the last stated digit (the rounding interval) widened by 1%.
PUBLISHED = [
    # name, total, active (both in units of 1e9), unit of the last stated digit (1e9)
    ("deepseek-v3", 671, 37, 1),  # DeepSeek-V3 technical report (arXiv 2412.19437): 671B total, 37B activated
    ("deepseek-v2", 236, 21, 1),  # DeepSeek-V2 paper (arXiv 2405.04434): 236B total, 21B activated
    ("deepseek-v2-lite", 15.7, 2.4, 0.1),  # HF deepseek-ai/DeepSeek-V2-Lite model card: 15.7B, 2.4B active
    # HF moonshotai/Kimi-K2-Base model card: "1T" total (one significant figure: the 60 x 384 experts alone are
    # 1.015T; the config's shapes give 1.026T), 32B activated
    ("kimi-k2", 1000, 32, 100),
    ("moonlight-16b-a3b", 16, 3, 1),  # HF moonshotai/Moonlight-16B-A3B model card: 16B total, 3B activated
    ("gpt-oss-120b", 116.83, 5.13, 0.01),  # OpenAI gpt-oss model card: 116.83B total, 5.13B active
    ("gpt-oss-20b", 20.91, 3.61, 0.01),  # OpenAI gpt-oss model card: 20.91B total, 3.61B active
    ("qwen3-235b-a22b", 235, 22, 1),  # Qwen3 model card: 235B total, 22B activated
    ("mixtral-8x22b", 141, 39, 1),  # Mistral AI: 141B total, 39B active
]


def _close(value: float, published: float, unit: float) -> bool:
    tol = unit / 2 + 0.01 * published
    return abs(value - published) <= tol


@pytest.mark.parametrize(("name", "total", "active", "unit"), PUBLISHED)
def test_parameter_counts_match_published(name: str, total: float, active: float, unit: float) -> None:
    c = MODEL_CATALOG[name].parameter_counts()
    assert _close(c.total / 1e9, total, unit), (name, c.total / 1e9)
    assert _close((c.active - c.embedding) / 1e9, active, unit), (name, (c.active - c.embedding) / 1e9)


def test_deepseek_v3_counts_within_one_percent_and_mtp_apart() -> None:
    c = MODEL_CATALOG["deepseek-v3"].parameter_counts()
    assert abs(c.total / 671e9 - 1) < 0.01
    assert abs(c.active / 37e9 - 1) < 0.016  # embedding included: 37.55B against the rounded "37B"
    # MTP: one MoE layer (~11.5B) + eh_proj + norms; the HF checkpoint's 14B adds its own embedding/head copy
    assert 11e9 < c.mtp < 12e9
    assert abs((c.mtp + c.embedding + c.output) / 14e9 - 1) < 0.05
    assert c.total_with_mtp == c.total + c.mtp


def test_kimi_k2_total_near_the_tech_report() -> None:
    # Kimi K2 technical report (arXiv 2507.20534) states 1.04T; the config's shapes give 1.026T (1.3% below)
    c = MODEL_CATALOG["kimi-k2"].parameter_counts()
    assert abs(c.total / 1.04e12 - 1) < 0.015


def test_gpt_oss_120b_within_one_percent() -> None:
    c = MODEL_CATALOG["gpt-oss-120b"].parameter_counts()
    assert abs(c.total / 116.83e9 - 1) < 0.01
    assert abs((c.active - c.embedding) / 5.13e9 - 1) < 0.01


def test_layer_patterns() -> None:
    m = MODEL_CATALOG["deepseek-v3"]
    assert (m.num_dense_layers, m.num_moe_layers) == (3, 58)
    assert m.moe_layer_flags[:4] == (False, False, False, True)
    assert parse_layer_pattern("([0]*3+[1]*58)") == [0] * 3 + [1] * 58
    assert parse_layer_pattern("[1,0]+[1]*2") == [1, 0, 1, 1]
    with pytest.raises(ValueError, match="moe_layer_freq"):
        parse_layer_pattern("__import__('os')")
    # Megatron's list form of window_attn_skip_freq: 1 = sliding window, 0 = full attention
    w = ModelSpec(**{**MODEL_CATALOG["gpt-oss-20b"].model_dump(), "window_attn_skip_freq": "([1]*23+[0]*1)"})
    assert w.full_attention_flags == (False,) * 23 + (True,)
    g = MODEL_CATALOG["gpt-oss-120b"]
    assert g.full_attention_flags[:4] == (False, True, False, True)
    assert sum(g.full_attention_flags) == 18


def test_model_validation_names_the_field() -> None:
    base = MODEL_CATALOG["deepseek-v2-lite"].model_dump()
    with pytest.raises(ValueError, match="num_query_groups"):
        ModelSpec(**{**base, "num_query_groups": 4})
    with pytest.raises(ValueError, match="moe_layer_freq"):
        ModelSpec(**{**base, "moe_layer_freq": [0, 1]})
    with pytest.raises(ValueError, match="window_size"):
        ModelSpec(**{**MODEL_CATALOG["llama3.1-8b"].model_dump(), "window_attn_skip_freq": 2})
    # Megatron's string form is accepted
    m = ModelSpec(**{**base, "moe_layer_freq": "([0]*1+[1]*26)"})
    assert m.moe_layer_flags == MODEL_CATALOG["deepseek-v2-lite"].moe_layer_flags


@pytest.mark.parametrize(
    ("file", "catalog"),
    [
        ("deepseek-v3.json", "deepseek-v3"),
        ("deepseek-v2-lite.json", "deepseek-v2-lite"),
        ("kimi-k2.json", "kimi-k2"),
        ("moonlight-16b-a3b.json", "moonlight-16b-a3b"),
        ("gpt-oss-120b.json", "gpt-oss-120b"),
    ],
)
def test_hf_import_matches_catalog(file: str, catalog: str) -> None:
    imported = ModelSpec.from_hf_config(HF / file)
    ref = MODEL_CATALOG[catalog]
    skip = {"name", "moe_router_num_groups", "moe_router_group_topk"}
    a = {k: v for k, v in imported.model_dump().items() if k not in skip}
    b = {k: v for k, v in ref.model_dump().items() if k not in skip}
    assert a == b
    assert imported.parameter_counts() == ref.parameter_counts()


def test_hf_import_deepseek_v2_lite_is_moe_with_mla() -> None:
    m = ModelSpec.from_hf_config(HF / "deepseek-v2-lite.json")
    assert m.multi_latent_attention and m.q_lora_rank is None and m.kv_lora_rank == 512
    assert m.is_moe and m.num_dense_layers == 1 and m.shared_expert_ffn == 2 * 1408


def test_hf_import_qwen_moe_keeps_its_shared_expert() -> None:
    m = ModelSpec.from_hf_config(HF / "qwen1.5-moe-a2.7b.json")
    assert m.shared_expert_ffn == 5632 and m.moe_shared_expert_gate and m.add_qkv_bias
    assert m.window_size is None  # use_sliding_window: false
    c = m.parameter_counts()
    # Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated; Qwen counts the embedding in the active
    # figure (2.69B with it, 2.38B without)
    assert _close(c.total / 1e9, 14.3, 0.1)
    assert _close(c.active / 1e9, 2.7, 0.1)
    no_shared = ModelSpec(**{**m.model_dump(), "moe_shared_expert_intermediate_size": None})
    assert c.active - no_shared.parameter_counts().active > 0.25 * (c.active - c.embedding)


def test_hf_import_refuses_unknown_moe_keys() -> None:
    cfg = json.loads((HF / "deepseek-v3.json").read_text())
    cfg["moe_capacity_factor_x"] = 1.5
    cfg["num_shared_expert_groups"] = 2
    with pytest.raises(SpecError) as err:
        hf_to_megatron(cfg)
    msg = str(err.value)
    assert "moe_capacity_factor_x" in msg and "num_shared_expert_groups" in msg
    assert msg.count("\n") == 0


def test_hf_import_irregular_layer_types_become_megatrons_list() -> None:
    cfg = json.loads((HF / "gpt-oss-120b.json").read_text())
    cfg["layer_types"] = ["sliding_attention"] * 30 + ["full_attention"] * 6
    m = ModelSpec(**hf_to_megatron(cfg))
    assert m.window_attn_skip_freq == [1] * 30 + [0] * 6
    assert m.full_attention_flags == (False,) * 30 + (True,) * 6


def test_hf_import_decoder_sparse_step_and_mlp_only_layers() -> None:
    cfg = json.loads((HF / "qwen1.5-moe-a2.7b.json").read_text())
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[23])
    m = ModelSpec(**hf_to_megatron(cfg))
    assert m.moe_layer_flags[:4] == (False, True, False, True)
    assert not m.moe_layer_flags[23]


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2-lite", "gpt-oss-120b", "qwen3-235b-a22b"])
def test_layer_gemm_flops_are_twice_the_active_weights(name: str) -> None:
    """Forward GEMM FLOPs per token = 2 × the active GEMM weights of the layer (norms, biases, sinks, MLA's
    latent norms and the router's bias excluded), for the MoE and the dense layer kinds."""
    from primus_optuna.physics.flops import layer_gemms

    m = MODEL_CATALOG[name]
    tokens = 1024
    for moe in (True, False):
        g = layer_gemms(m, tokens, 1, 1, 1, 1, moe=moe)
        gemm = sum(x.flops for x in g.attention + g.mlp + g.shared) / tokens
        total, active = m.layer_params(moe and m.is_moe)
        h = m.hidden_size
        non_gemm = 2 * h  # two RMSNorms
        if m.multi_latent_attention:
            non_gemm += (m.q_lora_rank or 0) + m.kv_lora_rank
        if m.linear_bias:
            qkv = (m.num_attention_heads + 2 * m.query_groups) * m.head_dim
            fc1 = 2 * (m.expert_ffn if moe else m.ffn_hidden_size)
            k = m.moe_router_topk if moe else 1
            non_gemm += qkv + h + k * (fc1 + h) + (m.experts if moe else 0)
        if m.softmax_type == "learnable":
            non_gemm += m.num_attention_heads
        assert gemm == pytest.approx(2 * (active - non_gemm), rel=1e-9)


def test_gpt_oss_clamp_from_the_catalog_and_hf_and_checked() -> None:
    """GPT-OSS's clamped GLU: 7.0 in the catalog and from HF's swiglu_limit (openai/gpt-oss config.json);
    Megatron-Core requires a finite, positive value (transformer_config.py@d98e8a64:2476-2482)."""
    assert MODEL_CATALOG["gpt-oss-120b"].activation_func_clamp_value == 7.0
    assert MODEL_CATALOG["gpt-oss-20b"].activation_func_clamp_value == 7.0
    assert MODEL_CATALOG["llama3.1-8b"].activation_func_clamp_value is None
    hf = {
        "model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880, "intermediate_size": 2880,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
        "num_local_experts": 32, "num_experts_per_tok": 4, "swiglu_limit": 5.5,
    }  # fmt: skip
    assert hf_to_megatron(hf)["activation_func_clamp_value"] == 5.5
    base = MODEL_CATALOG["gpt-oss-20b"].model_dump()
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises((SpecError, ValueError)):
            ModelSpec(**{**base, "activation_func_clamp_value": bad})


def test_gpt_oss_yarn_rope_runs_unfused() -> None:
    """GPT-OSS's YaRN (factor 32, HF rope_scaling; Megatron-Bridge's provider, gpt_oss_bridge.py@067f987d:94-100,
    leaves mscale/mscale_all_dim unset): Megatron's concentration factor 0.1·ln 32 + 1 ≈ 1.347
    (yarn_rotary_pos_embedding.py@d98e8a64:275-293) is not 1, so TE's fused RoPE is not taken
    (rope_utils.py@d98e8a64:351-356). Equal mscale and mscale_all_dim (DeepSeek's style) give 1."""
    m = MODEL_CATALOG["gpt-oss-120b"]
    assert m.yarn_rotary_scaling_factor == 32.0
    assert m.rope_mscale == pytest.approx(0.1 * math.log(32) + 1) and m.rope_unfused
    assert not MODEL_CATALOG["llama3.1-8b"].rope_unfused and MODEL_CATALOG["llama3.1-8b"].rope_mscale == 1.0
    same = m.model_copy(update={"yarn_mscale": 1.0, "yarn_mscale_all_dim": 1.0})
    assert same.rope_mscale == 1.0 and not same.rope_unfused
    # MLA's own RoPE path is not this field's (its interleaved fallback is not modelled)
    assert not MODEL_CATALOG["deepseek-v3"].rope_unfused
    assert ModelSpec.from_hf_config(HF / "gpt-oss-120b.json").yarn_rotary_scaling_factor == 32.0
