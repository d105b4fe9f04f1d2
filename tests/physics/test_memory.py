"""Memory model: published validation rows (Korthikanti et al. 2022), units, breakdown, invariants."""

import dataclasses

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.physics import (
    BREAKDOWN_KEYS,
    LayerShape,
    chunks_in_flight,
    estimate_memory,
    layer_activation_bytes,
    layer_params,
    stage_chunks,
)
from primus_optuna.physics import memory as mem
from primus_optuna.physics.shapes import embedding_params, output_params
from primus_optuna.space import Space
from primus_optuna.spec import GIB, StudySpec
from tests.conftest import FLAGSHIP, STUDIES, small_dense_study, small_moe_study
from tests.helpers.models import gpt_model

# --- Korthikanti et al. 2022, Fig. 1 (shared/reference/validation.md) -----------------------------------------
# (name, hidden, layers, heads, pp, vpp, gbs, mbs, params+optimizer GiB, activations GiB (SP + selective))
KORTHIKANTI = [
    ("22B", 6144, 48, 64, 1, 1, 4, 4, 45.56, 9.56),
    ("175B", 12288, 96, 96, 8, 3, 64, 1, 45.56, 12.35),
    ("530B", 20480, 105, 128, 35, 3, 280, 1, 31.64, 23.08),
    ("1T", 25600, 128, 160, 64, 1, 512, 1, 32.96, 26.56),
]


def korthikanti_spec(hidden: int, layers: int, heads: int, pp: int) -> StudySpec:
    """A100, fp16, Adam without distributed optimizer, seq 2048, vocab 51200, GPT (GeLU 4h MLP, LayerNorm,
    learned positions, tied embeddings), TP 8, dp 1."""
    return StudySpec.from_dict(
        {
            "name": "korthikanti",
            "model": {**gpt_model(hidden, layers, heads), "name": "korthikanti"},
            "cluster": {"gpu": "a100-80gb", "nodes": pp, "gpus_per_node": 8},
            "workload": {
                "seq_length": 2048,
                "global_batch_size": 1,  # replaced per row below
                "precision": "fp16",
                "distributed_optimizer": False,
            },
            "search": {"max_tp": 8},
        }
    )


def korthikanti_case(row: tuple) -> tuple[StudySpec, object]:
    _, h, layers, heads, pp, vpp, gbs, mbs, *_ = row
    spec = korthikanti_spec(h, layers, heads, pp)
    spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"global_batch_size": gbs})})
    space = Space(spec)
    config = space.make(
        tp=8,
        pp=pp,
        vpp=vpp,
        mbs=mbs,
        recompute="selective",
        pp_schedule="interleaved" if vpp > 1 else "1f1b",
    )
    assert space.check(config) == [], space.check(config)
    return spec, config


@pytest.mark.parametrize("row", KORTHIKANTI, ids=[r[0] for r in KORTHIKANTI])
def test_korthikanti_fig1_activations_first_stage(row: tuple) -> None:
    """±5%: the rows follow Table 2's 34·sbh/t per layer times Korthikanti's in-flight factor; we add what the
    paper leaves out (fp32 norm statistics, and for the single-stage 22B row the logits of the last stage,
    ~3%), so the estimate may sit a few percent above, never more than 5%."""
    spec, config = korthikanti_case(row)
    first = estimate_memory(spec, config).stages[0]
    assert first.breakdown["activations_gib"] == pytest.approx(row[9], rel=0.05)


# Fig. 1's "no SP, no recompute" bars (GiB): TP 8 only, Table 2's sbh(10 + 24/t + 5as/(ht)) per layer
KORTHIKANTI_NO_SP = {"22B": 59.25, "175B": 66.84, "530B": 114.02, "1T": 131.25}


@pytest.mark.parametrize("row", KORTHIKANTI, ids=[r[0] for r in KORTHIKANTI])
def test_korthikanti_fig1_activations_without_sequence_parallelism(row: tuple) -> None:
    """``sequence_parallel: false`` + no recompute + unfused attention (the paper's s² scores) reproduces
    Fig. 1's plain-TP bars (Korthikanti 2022 §4.2, Table 2: the 10·sbh of norms, dropout and residual inputs
    are not divided by t), ±5% as the SP + selective rows (we add the fp32 norm statistics and logits)."""
    spec, config = korthikanti_case(row)
    w = spec.workload.model_copy(update={"sequence_parallel": False, "flash_attention": False})
    spec = spec.model_copy(update={"workload": w})
    config = config.replace(recompute="none")
    first = estimate_memory(spec, config).stages[0]
    assert first.breakdown["activations_gib"] == pytest.approx(KORTHIKANTI_NO_SP[row[0]], rel=0.05)


@pytest.mark.parametrize("row", KORTHIKANTI, ids=[r[0] for r in KORTHIKANTI])
def test_korthikanti_fig1_params_and_optimizer_first_stage(row: tuple) -> None:
    """±5% on the transformer layers: Fig. 1 counts 12·L·h²/(t·p) parameters at 18 bytes each (fp16 weight,
    fp32 main grad, fp32 master, Adam m and v), which reproduces every row to 0.1%. Our first stage also
    holds the word + position embedding (V·h/t + s·h), which the figure omits: that adds 2-11% (largest
    for 1T, whose stage holds only 2 layers), checked exactly rather than against the figure."""
    spec, config = korthikanti_case(row)
    first = estimate_memory(spec, config).stages[0]
    b = first.breakdown
    static = b["weights_gib"] + b["gradients_gib"] + b["optimizer_gib"]
    assert static == pytest.approx(18 * first.params / GIB, rel=1e-9)
    assert 18 * first.layer_params / GIB == pytest.approx(row[8], rel=0.05)
    h, pp = row[1], row[4]
    embedding = 51200 * h // 8 + 2048 * h
    final_norm = 2 * h if pp == 1 else 0  # a single stage is also the last one
    assert first.params - first.layer_params == embedding + final_norm


# --- units, structure ----------------------------------------------------------------------------------------
def test_capacity_in_gib_usable_margin_and_breakdown_sum() -> None:
    spec = StudySpec.from_yaml(FLAGSHIP)
    est = estimate_memory(spec, Space(spec).baseline)
    assert est.capacity_gib == pytest.approx(spec.cluster.gpu.hbm_gib) == pytest.approx(287.9)
    assert est.usable_gib == pytest.approx(est.capacity_gib * 0.9)
    assert len(est.stages) == 4
    for st in est.stages:
        assert tuple(st.breakdown) == BREAKDOWN_KEYS
        assert sum(st.breakdown.values()) == pytest.approx(st.total_gib)
    assert est.peak_gib == max(s.total_gib for s in est.stages)
    assert est.fits == (est.peak_gib <= est.usable_gib)
    d = est.to_dict()
    assert set(d) == {"peak_gib", "usable_gib", "capacity_gib", "fits", "peak_stage", "recompute", "stages"}
    assert set(d["stages"][0]) == {"stage", "total_gib", "breakdown"}


def test_reason_text() -> None:
    spec = StudySpec.from_yaml(FLAGSHIP)
    space = Space(spec)
    est = estimate_memory(spec, space.make(mbs=4, recompute="none"))
    assert not est.fits
    assert est.reason() == (
        f"memory: {est.peak_gib:.1f} GiB on stage {est.peak_stage} > {est.usable_gib:.1f} GiB usable"
    )


def test_distributed_optimizer_shards_dense_over_dp_cp_and_experts_over_edp() -> None:
    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    c = space.canonical(space.make(tp=1, pp=2, ep=2, cp=2, mbs=1))
    assert space.check(c) == []
    st = estimate_memory(spec, c).stages[1]
    shape = LayerShape.from_config(spec, c)
    lp = layer_params(shape)
    n = spec.model.num_layers // 2
    dense = n * lp.dense + output_params(spec, 1, 2)
    expert = n * lp.expert
    edp = spec.world // (2 * 2)
    expect = 12 * (dense / (c.dp * c.cp) + expert / edp) / GIB
    assert st.breakdown["optimizer_gib"] == pytest.approx(expect)
    assert st.breakdown["gradients_gib"] == pytest.approx(4 * (dense + expert) / GIB)


# Megatron-Core precision-aware optimizer: (workload, optimizer bytes per parameter = master + exp_avg +
# exp_avg_sq). bf16 parameters with an fp32 master held by TE FusedAdam store 16-bit remainders (2 bytes);
# MXFP8 with fp32 master: Megatron keeps the full fp32 master (4 bytes).
PAO = {"precision_aware_optimizer": True}
OPTIMIZER_BYTES_CASES = [
    ({}, 12),
    ({**PAO}, 2 + 4 + 4),
    ({**PAO, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 2 + 2 + 2),
    ({**PAO, "precision": "fp16", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 4 + 2 + 2),
    (
        {
            **PAO,
            "precision": "fp8",
            "fp8_recipe": "mxfp8",
            "exp_avg_dtype": "bf16",
            "exp_avg_sq_dtype": "bf16",
        },
        8,
    ),
    (
        {
            **PAO,
            "precision": "fp8",
            "fp8_recipe": "delayed",
            "exp_avg_dtype": "fp16",
            "exp_avg_sq_dtype": "fp16",
        },
        6,
    ),
    (
        {
            **PAO,
            "precision": "fp8",
            "fp8_recipe": "delayed",
            "fp8_param_gather": True,
            "exp_avg_dtype": "bf16",
        },
        4 + 2 + 4,
    ),
    ({**PAO, "main_params_dtype": "fp16", "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp8"}, 2 + 1 + 1),
]


@pytest.mark.parametrize(("over", "per_param"), OPTIMIZER_BYTES_CASES)
def test_precision_aware_optimizer_bytes_per_parameter(over: dict, per_param: int) -> None:
    data = small_moe_study()
    spec = StudySpec.from_dict({**data, "workload": {**data["workload"], **over}})
    assert mem.optimizer_bytes_per_param(spec.workload) == per_param
    # closed form on the stage: per_param x (dense / dp·cp + expert / edp), as the fp32 test above
    space = Space(spec)
    c = space.canonical(space.make(tp=1, pp=2, ep=2, cp=2, mbs=1))
    assert space.check(c) == []
    st = estimate_memory(spec, c).stages[1]
    lp = layer_params(LayerShape.from_config(spec, c))
    n = spec.model.num_layers // 2
    dense, expert = n * lp.dense + output_params(spec, 1, 2), n * lp.expert
    expect = per_param * (dense / (c.dp * c.cp) + expert / (spec.world // 4)) / GIB
    assert st.breakdown["optimizer_gib"] == pytest.approx(expect)


def test_bf16_moments_take_a_third_off_the_optimizer_states_under_mxfp8() -> None:
    """12 -> 8 bytes per parameter (fp32 master kept by Megatron under MXFP8, bf16 moments): the DeepSeek-V3
    recipe's setting; nothing else in the estimate moves."""
    data = small_moe_study()
    w = {**data["workload"], "precision": "fp8", "fp8_recipe": "mxfp8", "grad_reduce_in_fp32": False}
    base = StudySpec.from_dict({**data, "workload": w})
    lean = StudySpec.from_dict(
        {
            **data,
            "workload": {
                **w,
                **PAO,
                "main_grads_dtype": "bf16",
                "exp_avg_dtype": "bf16",
                "exp_avg_sq_dtype": "bf16",
            },
        }
    )
    c = Space(base).baseline
    for a, b in zip(estimate_memory(base, c).stages, estimate_memory(lean, c).stages, strict=True):
        assert b.breakdown["optimizer_gib"] == pytest.approx(a.breakdown["optimizer_gib"] * 8 / 12)
        for k in ("weights_gib", "gradients_gib", "activations_gib"):
            assert b.breakdown[k] == pytest.approx(a.breakdown[k])


def test_fp8_adds_two_bytes_per_gemm_parameter() -> None:
    data = small_moe_study()
    bf16 = StudySpec.from_dict(data)
    fp8 = StudySpec.from_dict({**data, "workload": {**data["workload"], "precision": "fp8"}})
    c = Space(bf16).baseline
    w16 = estimate_memory(bf16, c).stages[0].breakdown["weights_gib"]
    w8 = estimate_memory(fp8, c).stages[0].breakdown["weights_gib"]
    lp = layer_params(LayerShape.from_config(bf16, c))
    assert (w8 - w16) * GIB == pytest.approx(2 * lp.gemm * bf16.model.num_layers / c.pp)


def test_deepep_buffers_only_with_deepep() -> None:
    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    a = estimate_memory(spec, space.make(moe_dispatcher="alltoall")).stages[0].breakdown
    d = estimate_memory(spec, space.make(moe_dispatcher="deepep")).stages[0].breakdown
    assert a["dispatcher_buffers_gib"] == 0
    assert d["dispatcher_buffers_gib"] == pytest.approx(mem.DEEPEP_NVL_GIB * 4096 / 7168)


RECOMPUTE = ("none", "selective", "full")


def test_flagship_baseline_fits() -> None:
    """AMD's Mixtral 8x22B recipe for 8 nodes of MI355X (TP1 PP4 VPP2 EP8 MBS1, full:1, all-to-all,
    interleaved) ran, so it must fit (shared/reference/megatron-memory.md; study comment)."""
    spec = StudySpec.from_yaml(FLAGSHIP)
    est = estimate_memory(spec, Space(spec).baseline)
    assert est.fits and est.recompute == "full:1"
    assert est.peak_gib < 0.85 * est.usable_gib  # fits with margin, not by a hair


# --- the per-tensor account's closed form (shared/reference/megatron-memory.md) ------------------------------
def mixtral_shape(fp8: bool) -> LayerShape:
    """Mixtral 8x22B at MBS 2, seq 8192, TP1, EP8 (the account's worked example)."""
    return LayerShape(
        hidden=6144, heads=48, groups=8, head_dim=128, ffn=16384, seq=8192, mbs=2, moe=True, experts=8,
        local_experts=1, topk=2, expert_ffn=16384, fp8=fp8,
    )  # fmt: skip


def test_mixtral_layer_bytes_equal_the_account_closed_form_bf16() -> None:
    """b·T·(4h + 2ad + 2gd) + b·K·(h + 3F) + the small fp32 terms (router ~16·T·E, maps ~12·K, norm rstd)."""
    s = mixtral_shape(fp8=False)
    T, h, a, g, d, F, E = 16384, 6144, 48, 8, 128, 16384, 8
    K = 2 * T
    big = 2 * T * (4 * h + 2 * a * d + 2 * g * d) + 2 * K * (h + 3 * F)
    small = 16 * T * E + 12 * K + 4 * T * a + 2 * 4 * T
    assert layer_activation_bytes(s, "none") == big + small
    # the account's figures: 1.19 GiB (attention, norms, router input) + 3.375 GiB (grouped GEMMs, SwiGLU)
    assert 2 * T * (4 * h + 2 * a * d + 2 * g * d) / GIB == pytest.approx(1.19, abs=0.005)
    assert 2 * K * (h + 3 * F) / GIB == pytest.approx(3.375, abs=1e-9)
    assert layer_activation_bytes(s, "none") / GIB == pytest.approx(4.57, abs=0.01)


def test_mixtral_layer_bytes_fp8() -> None:
    """FP8: norm output, fc1 input and fc2 input are kept as 1-byte casts, O gains an FP8 copy; the SwiGLU
    input stays bf16. The account: about 15% less than BF16."""
    s8, s16 = mixtral_shape(fp8=True), mixtral_shape(fp8=False)
    T, h, a, F = 16384, 6144, 48 * 128, 16384
    K = 2 * T
    saved = T * h + K * h + K * F - T * a  # qkv_input, fc1 input, fc2 input at 1 byte; + O's FP8 copy
    assert layer_activation_bytes(s16, "none") - layer_activation_bytes(s8, "none") == saved
    assert 1 - layer_activation_bytes(s8, "none") / layer_activation_bytes(s16, "none") == pytest.approx(
        0.15, abs=0.02
    )


def test_fp8_attention_saves_what_transformer_engine_keeps() -> None:
    """FP8 attention (TE dot_product_attention/backends.py@d0067d0d:1580-1589): under delayed scaling Q, K, V
    and O are kept as 1-byte FP8 (O's projection keeps its own FP8 copy as before); under current scaling Q, K,
    V in FP8 and O in BF16 (TE's default NVTE_DPA_FP8CS_O_in_F16=1); under MXFP8 a row-wise and a column-wise
    copy of Q, K, V with one scale byte per 32 values: 1/16 more than BF16."""
    base = mixtral_shape(fp8=True)
    T, a, g, d = 16384, 48, 8, 128
    qkv, o = T * (a + 2 * g) * d, T * a * d
    none = layer_activation_bytes(base, "none")
    assert none - layer_activation_bytes(base.replace(fp8_attention="delayed"), "none") == qkv + o
    assert none - layer_activation_bytes(base.replace(fp8_attention="tensorwise"), "none") == qkv
    assert layer_activation_bytes(base.replace(fp8_attention="mxfp8"), "none") - none == qkv // 16


def test_dense_llama_layer_bytes_closed_form() -> None:
    """Llama 3.1 70B layer, TP 4 with SP, seq 8192, MBS 1: attention as above plus fc1 input T·h·b, SwiGLU
    input T·2F·b, fc2 input T·F·b (F per rank)."""
    s = LayerShape(hidden=8192, heads=16, groups=2, head_dim=128, ffn=7168, seq=8192, mbs=1, tp=4)
    T, Tl, h, a, g, d, F = 8192, 2048, 8192, 16, 2, 128, 7168
    expect = 2 * (4 * Tl * h + T * (a + 2 * g) * d + T * a * d) + 2 * T * 3 * F
    expect += 4 * T * a + 2 * 4 * Tl
    assert layer_activation_bytes(s, "none") == expect


def test_selective_modules_remove_exactly_their_tensors() -> None:
    s = mixtral_shape(fp8=False)
    T, h, F, K = 16384, 6144, 16384, 32768
    none = layer_activation_bytes(s, "none")
    assert none - layer_activation_bytes(s, "selective") == 4 * T * 48  # core_attn: softmax statistics
    assert none - layer_activation_bytes(s, "selective:moe_act") == 2 * K * F
    assert none - layer_activation_bytes(s, "selective:moe_act+layernorm") == 2 * K * F + 2 * T * h
    moe_block = 16 * T * 8 + 12 * K + 2 * K * (h + 3 * F)
    assert none - layer_activation_bytes(s, "selective:moe") == moe_block
    assert none - layer_activation_bytes(s, "selective:layernorm+moe") == moe_block + 2 * T * h
    assert layer_activation_bytes(s, "full") == layer_activation_bytes(s, "full:3") == 2 * T * h
    dense = LayerShape(hidden=4096, heads=32, groups=8, head_dim=128, ffn=14336, seq=4096, mbs=1)
    kept = layer_activation_bytes(dense, "selective:mlp")
    assert layer_activation_bytes(dense, "none") - kept == 2 * 4096 * 3 * 14336  # fc1 out + fc2 input


def test_full_n_recomputes_the_first_n_layers_of_every_chunk() -> None:
    spec = StudySpec.from_yaml(FLAGSHIP)
    space = Space(spec)
    c = space.make(tp=1, pp=4, vpp=2, ep=8, mbs=1, pp_schedule="interleaved")
    shape = LayerShape.from_config(spec, c)
    plain, inp = layer_activation_bytes(shape, "none"), layer_activation_bytes(shape, "full")
    chunks = chunks_in_flight(4, 2, c.num_microbatches, "interleaved", 1)  # stage 1: no logits
    for n in (1, 2, 4):
        est = estimate_memory(spec, c.replace(recompute=f"full:{n}").derive(64, 512))
        # backward rebuilds a recomputed layer after freeing the plain layers behind it: the rebuild adds only
        # what it exceeds them by (nothing here), while full (all 7) adds the whole rebuilt layer
        expect = chunks * (n * inp + (7 - n) * plain) + max(0.0, plain - inp - (7 - n) * plain)
        assert est.stages[1].breakdown["activations_gib"] == pytest.approx(expect / GIB)
    full = estimate_memory(spec, c.replace(recompute="full").derive(64, 512))
    assert full.stages[1].breakdown["activations_gib"] == pytest.approx(
        (chunks * 7 * inp + plain - inp) / GIB
    )
    # DeepSeek-V3 on one stage (3 dense layers first): full:1 never holds more than no recompute
    data = small_moe_study()
    data["model"] = {"catalog": "deepseek-v3"}
    ds = StudySpec.from_dict(data)
    d = Space(ds).make(tp=1, pp=1, ep=8, mbs=1)
    none, one = (
        estimate_memory(ds, d),
        estimate_memory(ds, d.replace(recompute="full:1").derive(ds.world, ds.workload.global_batch_size)),
    )
    assert one.stages[0].breakdown["activations_gib"] < none.stages[0].breakdown["activations_gib"]
    # EP all-to-all overlap holds one more chunk in the interleaved warm-up
    assert chunks_in_flight(4, 2, 32, "interleaved", 1, extra_chunk=True) == chunks + 1


def test_gradient_and_parameter_byte_widths_follow_the_workload() -> None:
    data = StudySpec.from_yaml(FLAGSHIP).to_dict()
    base = StudySpec.from_dict(data)
    c = Space(base).baseline
    lean = StudySpec.from_dict(
        {**data, "workload": {**data["workload"], "grad_reduce_in_fp32": False, "fp8_param_gather": True}}
    )
    a, b = estimate_memory(base, c).stages[0], estimate_memory(lean, c).stages[0]
    assert b.breakdown["gradients_gib"] == pytest.approx(a.breakdown["gradients_gib"] / 2)
    lp = layer_params(LayerShape.from_config(base, c))
    gemm = lp.gemm * 56 // 4
    # FP8 params: no bf16 copy beside the FP8 weight + transpose (4 -> 2 bytes per GEMM parameter)
    assert (a.breakdown["weights_gib"] - b.breakdown["weights_gib"]) * GIB == pytest.approx(2 * gemm)
    with pytest.raises(SpecError, match="fp8_param_gather needs precision fp8"):
        StudySpec.from_dict(
            {**data, "workload": {**data["workload"], "precision": "bf16", "fp8_param_gather": True}}
        )


# --- invariants over whole spaces -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flagship() -> tuple[StudySpec, list]:
    spec = StudySpec.from_yaml(FLAGSHIP)
    return spec, Space(spec).configs()


def test_recompute_none_ge_selective_ge_full(flagship: tuple) -> None:
    spec, configs = flagship
    n = 0
    for c in configs:
        if c.recompute != "none" or c.pp_schedule in ("zb1p", "zbv"):
            continue
        peaks = [estimate_memory(spec, dataclasses.replace(c, recompute=r)).stages for r in RECOMPUTE]
        for stage in range(c.pp):
            none, sel, full = (p[stage].breakdown["activations_gib"] for p in peaks)
            assert none >= sel >= full
        n += 1
    assert n > 1000


def test_default_recompute_candidates_are_in_memory_order() -> None:
    """The sweep walks the recompute axis in the candidates' order: none first, full last, each family
    (selective module sets, full:N) in decreasing activation memory. Between the families the order depends
    on the layers per chunk (full:1 of 4 layers keeps 3 whole layers, more than selective:moe on all 4)."""
    for study in (small_moe_study(), small_dense_study()):
        spec = StudySpec.from_dict(study)
        space = Space(spec)
        c = space.make(tp=1, pp=4, vpp=2, mbs=1, pp_schedule="interleaved")
        acts = [
            estimate_memory(spec, c.replace(recompute=r).derive(spec.world, spec.workload.global_batch_size))
            .stages[0]
            .breakdown["activations_gib"]
            for r in space.candidates["recompute"]
        ]
        by = dict(zip(space.candidates["recompute"], acts, strict=True))
        assert by["none"] == max(acts) and by["full"] == min(acts)
        for family in ("selective", "full:"):
            chain = [v for r, v in by.items() if r.startswith(family)]
            assert len(chain) >= 2 and chain == sorted(chain, reverse=True), by


@pytest.mark.parametrize("axis", ["tp", "ep", "cp"])
def test_more_parallelism_never_raises_weights(flagship: tuple, axis: str) -> None:
    spec, configs = flagship
    by_key = {c: c for c in configs}
    pairs = 0
    for c in configs:
        bigger = dataclasses.replace(c, **{axis: getattr(c, axis) * 2})
        other = by_key.get(bigger)
        if other is None:
            continue
        a, b = estimate_memory(spec, c), estimate_memory(spec, other)
        for sa, sb in zip(a.stages, b.stages, strict=True):
            assert sb.breakdown["weights_gib"] <= sa.breakdown["weights_gib"] + 1e-12
        pairs += 1
    assert pairs > 100


def test_more_dp_never_raises_weights_or_optimizer() -> None:
    small = StudySpec.from_dict(small_dense_study())
    data = small_dense_study()
    big = StudySpec.from_dict({**data, "cluster": {**data["cluster"], "nodes": 2}})
    c = Space(small).baseline
    a, b = estimate_memory(small, c), estimate_memory(big, Space(big).canonical(c))
    for sa, sb in zip(a.stages, b.stages, strict=True):
        assert sb.breakdown["weights_gib"] == pytest.approx(sa.breakdown["weights_gib"])
        assert sb.breakdown["optimizer_gib"] < sa.breakdown["optimizer_gib"]


def test_more_microbatches_in_flight_never_lowers_memory() -> None:
    data = small_dense_study()
    prev = None
    for gbs in (4, 8, 16, 32, 64):
        spec = StudySpec.from_dict({**data, "workload": {**data["workload"], "global_batch_size": gbs}})
        c = Space(spec).canonical(Space(spec).make(tp=2, pp=4, mbs=1))
        stages = [s.total_gib for s in estimate_memory(spec, c).stages]
        if prev is not None:
            assert all(b >= a for a, b in zip(prev, stages, strict=True))
        prev = stages
    for pp in (2, 4, 8):
        for sched, vpp in (("1f1b", 1), ("interleaved", 2), ("zbv", 2)):
            for stage in range(pp):
                counts = [chunks_in_flight(pp, vpp, m, sched, stage) for m in range(1, 4 * pp)]
                assert counts == sorted(counts)


def test_stages_follow_the_schedule() -> None:
    # 1F1B: stage i holds min(pp - i, m) micro-batches
    assert [chunks_in_flight(4, 1, 16, "1f1b", i) for i in range(4)] == [4, 3, 2, 1]
    assert [chunks_in_flight(4, 1, 2, "1f1b", i) for i in range(4)] == [2, 2, 2, 1]
    assert [chunks_in_flight(4, 1, 16, "zb1p", i) for i in range(4)] == [4, 3, 2, 1]
    # interleaved: Megatron warm-up 2(pp-i-1) + (v-1)pp, plus one
    assert [chunks_in_flight(4, 2, 16, "interleaved", i) for i in range(4)] == [11, 9, 7, 5]
    # zbv: balanced, 2·pp chunk micro-batches everywhere
    assert {chunks_in_flight(4, 2, 16, "zbv", i) for i in range(4)} == {8}
    assert stage_chunks(4, 2, "zbv")[0] == (0, 7)
    assert stage_chunks(4, 2, "interleaved")[0] == (0, 4)

    spec = StudySpec.from_yaml(FLAGSHIP)
    space = Space(spec)
    base = dict(tp=1, pp=4, ep=8, mbs=1, recompute="none")
    f1b = estimate_memory(spec, space.make(**base, vpp=1, pp_schedule="1f1b")).stages
    acts = [s.breakdown["activations_gib"] for s in f1b]
    assert acts[0] > acts[1] > acts[2]  # fewer micro-batches in flight down the pipeline
    assert f1b[0].params > f1b[1].params == f1b[2].params < f1b[3].params  # embedding first, output last
    zbv = estimate_memory(spec, space.make(**base, vpp=2, pp_schedule="zbv")).stages
    # V placement: stage 0 holds both the embedding and the output layer; activations are balanced
    assert zbv[0].params > zbv[1].params == zbv[3].params
    assert zbv[1].breakdown["activations_gib"] == pytest.approx(zbv[2].breakdown["activations_gib"])
    assert zbv[1].breakdown["activations_gib"] == pytest.approx(f1b[1].breakdown["activations_gib"] * 4 / 3)
    inter = estimate_memory(spec, space.make(**base, vpp=2, pp_schedule="interleaved")).stages
    one_layer = acts[1] / 3 / (56 / 4)
    # Korthikanti: the first stage holds L·(1 + (p-1)/(p·v)) layers' worth
    assert inter[0].breakdown["activations_gib"] == pytest.approx(one_layer * 56 * (1 + 3 / 8))


def test_full_recompute_keeps_inputs_and_rebuilds_one_layer() -> None:
    spec = StudySpec.from_dict(small_dense_study())
    space = Space(spec)
    c = space.canonical(space.make(tp=2, pp=2, mbs=1, recompute="full"))
    shape = LayerShape.from_config(spec, c)
    n = 2 * spec.model.num_layers // 2  # stage 0 of 1F1B holds 2 micro-batches of 16 layers
    expect = (n - 1) * layer_activation_bytes(shape, "full") + layer_activation_bytes(shape, "none")
    assert estimate_memory(spec, c).stages[0].breakdown["activations_gib"] == pytest.approx(expect / GIB)
    assert layer_activation_bytes(shape, "full") == 2 * 4096 * 4096 // 2


def test_layer_params_of_known_models() -> None:
    """Whole-model parameter counts against the published sizes (±3%: catalog sizes are rounded)."""
    for study, billions in ((small_dense_study(), 8.03), (small_moe_study(), 46.7)):
        spec = StudySpec.from_dict(study)
        c = Space(spec).canonical(Space(spec).make(tp=1, pp=1, ep=1, cp=1))
        total = estimate_memory(spec, c).stages[0].params
        assert total / 1e9 == pytest.approx(billions, rel=0.03)


def test_deepseek_v3_study_baseline_fits_with_the_recipes_bf16_moments() -> None:
    """studies/deepseek-v3-mi355x-fp8.yaml keeps Megatron-Bridge's recipe, precision-aware optimizer included:
    its baseline fits the 10% margin (~234 GiB of 259); with fp32 moments (12 bytes/parameter) it would not."""
    spec = StudySpec.from_yaml(STUDIES / "deepseek-v3-mi355x-fp8.yaml")
    assert spec.workload.precision_aware_optimizer and spec.workload.exp_avg_dtype == "bf16"
    space = Space(spec)
    c = space.canonical(space.baseline)
    est = estimate_memory(spec, c)
    assert est.fits and 225 < est.peak_gib < est.usable_gib, est.reason()
    fp32 = {**spec.to_dict()["workload"], "precision_aware_optimizer": False, "main_grads_dtype": "fp32"}
    fp32 |= {"exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32"}
    heavy = estimate_memory(StudySpec.from_dict({**spec.to_dict(), "workload": fp32}), c)
    assert not heavy.fits
    peak = est.stages[est.peak_stage].breakdown["optimizer_gib"]
    assert heavy.stages[est.peak_stage].breakdown["optimizer_gib"] == pytest.approx(peak * 12 / 8)


def test_clamped_glu_keeps_its_clamped_copy_unless_moe_act_is_recomputed() -> None:
    # GPT-OSS's quick-GeGLU clamps both halves of fc1's output and concatenates them in eager PyTorch: the clamps
    # keep fc1's output, the fused GLU function saves the concatenation (fused_bias_geglu.py@d98e8a64:327,
    # 424-432); a moe_act recompute checkpoints all of it, TE's fused grouped MLP clamps in its kernel
    from primus_optuna.physics.shapes import LayerShape, layer_activation_bytes, moe_terms

    spec = StudySpec.from_dict(
        {
            "name": "gpt-oss",
            "model": {"catalog": "gpt-oss-120b"},
            "cluster": {"gpu": "h100", "nodes": 8, "gpus_per_node": 8},
            "workload": {"seq_length": 4096, "global_batch_size": 512},
        }
    )
    c = Space(spec).make(tp=1, pp=4, ep=8, mbs=1, recompute="none")
    shape = LayerShape.from_config(spec, c)
    assert shape.glu_clamp
    copies = shape.local_tokens * shape.topk
    assert moe_terms(shape)["expert_glu_clamped"] == 2 * copies * 2 * shape.expert_ffn
    plain = shape.replace(glu_clamp=False)
    assert layer_activation_bytes(shape) - layer_activation_bytes(plain) == 4 * copies * shape.expert_ffn
    assert layer_activation_bytes(shape, "selective:moe_act") == layer_activation_bytes(
        plain, "selective:moe_act"
    )


def test_peaks_key_names_what_the_peaks_read():
    """Two studies alike but for the GPU give the same peaks (their usable memory differs) and share the memo
    tables; another global batch changes the key."""
    d = small_dense_study()
    h100 = StudySpec.from_dict(d)
    h200 = StudySpec.from_dict({**d, "cluster": {**d["cluster"], "gpu": "h200"}})
    configs = Space(h100).configs()
    assert mem.peaks_key(h100) == mem.peaks_key(h200)
    assert mem.peak_memory_all(h100, configs)[0] == mem.peak_memory_all(h200, configs)[0]
    assert mem.usable_gib(h100) < mem.usable_gib(h200)
    assert mem._context(h100).stage_acts is mem._context(h200).stage_acts  # one set of memo tables
    other = StudySpec.from_dict({**d, "workload": {**d["workload"], "global_batch_size": 128}})
    assert mem.peaks_key(other) != mem.peaks_key(h100)


def test_fsdp_shards_weights_grads_and_optimizer_over_dp_shard_and_keeps_two_layers_unsharded() -> None:
    """pp = 1: two units gathered (the one computing, the one prefetched) in 16-bit, one unit's 16-bit
    gradients and one unit's fp32 reduce-scatter input (tests/physics/test_fsdp_memory.py measures it)."""
    spec = StudySpec.from_dict(small_moe_study(axes={"dp_shard": [1, 2, 4, 8]}))
    space = Space(spec)
    base = space.canonical(space.make(tp=1, pp=1, ep=2, cp=1, mbs=1))
    zero1 = estimate_memory(spec, base).stages[0]
    lp = layer_params(LayerShape.from_config(spec, base))
    n = spec.model.num_layers
    dense = n * lp.dense + output_params(spec, 1, 1) + embedding_params(spec, 1)
    expert = n * lp.expert
    unit = max(lp.dense + lp.expert, output_params(spec, 1, 1), embedding_params(spec, 1))
    for shard in (2, 8):
        c = base.replace(dp_shard=shard).derive(spec.world, spec.workload.global_batch_size)
        assert space.check(c) == []
        st = estimate_memory(spec, c).stages[0]
        share = dense / shard + expert / (shard // 2)  # experts over dp_shard·cp·tp/ep ranks
        assert st.breakdown["optimizer_gib"] == pytest.approx(12 * share / GIB)
        assert st.breakdown["gradients_gib"] == pytest.approx((4 * share + (2 + 4) * unit) / GIB)
        assert st.breakdown["weights_gib"] == pytest.approx(
            2 * (share + mem.FSDP_UNITS_IN_FLIGHT * unit) / GIB
        )
        assert st.breakdown["activations_gib"] == zero1.breakdown["activations_gib"]
    assert zero1.breakdown["gradients_gib"] == pytest.approx(
        4 * (dense + expert) / GIB
    )  # ZeRO-1: not sharded


def test_fsdp_with_pipeline_parallelism_keeps_the_stage_gathered_with_its_unsharded_gradients() -> None:
    """pp > 1: the stage's 16-bit parameters and its fp32 unsharded gradients are held all step (torch's
    pipeline stage defers resharding and the reduce-scatter to the last micro-batch), plus one unit's 16-bit
    gradients as they are computed."""
    spec = StudySpec.from_dict(small_moe_study(axes={"dp_shard": [1, 2, 4]}))
    space = Space(spec)
    base = space.canonical(space.make(tp=1, pp=2, ep=2, cp=1, mbs=1))
    lp = layer_params(LayerShape.from_config(spec, base))
    n = spec.model.num_layers // 2
    dense = n * lp.dense + output_params(spec, 1, 2)
    expert = n * lp.expert
    unit = max(lp.dense + lp.expert, output_params(spec, 1, 2))
    c = base.replace(dp_shard=4).derive(spec.world, spec.workload.global_batch_size)
    assert space.check(c) == []
    st = estimate_memory(spec, c).stages[1]
    share = dense / 4 + expert / 2
    assert st.breakdown["weights_gib"] == pytest.approx(2 * (share + dense + expert) / GIB)
    assert st.breakdown["gradients_gib"] == pytest.approx((4 * (share + dense + expert) + 2 * unit) / GIB)
    assert st.breakdown["optimizer_gib"] == pytest.approx(12 * share / GIB)
