"""Per-GPU shapes of one configuration: parameter counts, pipeline-stage layouts, micro-batches in flight and
the per-layer activation bytes that Megatron keeps for backward.

Pure Python (no torch): the memory model evaluates these for every configuration of a study, and the torch
layer of :mod:`primus_optuna.workloads.layer` is built from the same :class:`LayerShape`, so the analytical
per-layer activation function and the real execution can be compared byte for byte.

Megatron-Core conventions assumed throughout (shared/reference/models.md):

- tensor parallelism (TP = t) splits attention heads, KV groups and FFN widths; with sequence parallelism
  (``workload.sequence_parallel``, the default) everything outside the TP-split GEMMs (norms, dropout,
  residual) holds ``tokens / t``, without it all tokens (Korthikanti et al. 2022, Table 2: ``10 + 24/t``);
- context parallelism (CP = c) divides the sequence: each rank holds ``seq / c`` tokens;
- experts are split by expert parallelism only (``expert_tensor_parallel_size = 1``): an expert is never TP
  split, and each rank computes the ``tokens_local · top-k`` token copies it receives (balanced routing);
- GPT-3-style models (LayerNorm + learned absolute positions) use Megatron's argument defaults: linear biases
  and dropout 0.1 (Korthikanti et al. 2022 count the dropout masks); Llama/Mixtral/Qwen-style models
  (RMSNorm, RoPE) are trained without biases or dropout, as their recipes set. If :class:`ModelSpec` gains
  ``add_bias_linear`` / ``hidden_dropout`` fields, those are used instead of this rule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..spec.recompute import Recompute, parse_recompute
from ..spec.study import StudySpec
from .fused_mlp import eager_glu_clamp

ACT_BYTES = 2
"""bf16/fp16 activation element (Megatron mixed precision)."""
FP32 = 4
MXFP8_BLOCK = 32
"""elements per MXFP8 scale (one E8M0 byte per 32 values along the scaled dimension)"""
INDEX_BYTES = 8
"""int64 routing indices (torch.topk / argsort return int64)."""


def gpt_style(model: Any) -> bool:
    """True for GPT-3-style models (LayerNorm + learned positions): Megatron defaults of bias and dropout."""
    return model.normalization == "LayerNorm" and model.position_embedding_type == "learned_absolute"


def has_bias(model: Any) -> bool:
    """Linear biases (Megatron ``--add-bias-linear``, default on; Llama-style recipes disable it)."""
    explicit = getattr(model, "add_bias_linear", None)
    return bool(explicit) if explicit is not None else gpt_style(model)


def dropout_rate(model: Any) -> float:
    """Hidden dropout (Megatron default 0.1 for GPT; 0 in Llama/Mixtral/Qwen recipes)."""
    explicit = getattr(model, "hidden_dropout", None)
    return float(explicit) if explicit is not None else (0.1 if gpt_style(model) else 0.0)


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One transformer layer as one GPU sees it (already sliced by tp/cp/ep).

    ``seq`` is the sequence length on this CP rank (``seq_length / cp``); the attention and the TP-split
    GEMMs see ``seq · mbs`` tokens, the sequence-parallel parts ``seq · mbs / tp``.

    Example::

        shape = LayerShape.from_config(spec, config)
        layer_activation_bytes(shape, "selective")
    """

    hidden: int
    heads: int
    """attention heads on this rank (heads / tp)"""
    groups: int
    """KV groups on this rank (query_groups / tp)"""
    head_dim: int
    ffn: int
    """dense MLP width on this rank (ffn / tp); unused by an MoE layer"""
    seq: int
    mbs: int
    tp: int = 1
    """sequence-parallel divisor of the non-GEMM parts (1 = no sequence parallelism)"""
    moe: bool = False
    experts: int = 1
    """experts of the model (router width)"""
    local_experts: int = 1
    """experts on this rank (experts / ep)"""
    topk: int = 1
    expert_ffn: int = 0
    swiglu: bool = True
    glu_clamp: bool = False
    """a clamped GLU outside TE's fused grouped MLP (``model.activation_func_clamp_value``, GPT-OSS; the eager
    clamp that ``physics.throughput.EAGER_CLAMP_PASSES`` prices): the experts keep the clamped, concatenated
    copy of fc1's output for the GLU's backward as well as fc1's output for the clamps' (:func:`moe_terms`)"""
    layernorm: bool = False
    """LayerNorm (mean + rstd statistics) instead of RMSNorm (rstd only)"""
    bias: bool = False
    dropout: float = 0.0
    fp8: bool = False
    """FP8 GEMMs: Transformer Engine saves the FP8 copy (1 byte) of each GEMM input for backward"""
    flash: bool = True
    """fused (flash) attention; False keeps the s² softmax output (and dropout mask/output) per head"""
    fp8_attention: str = ""
    """FP8 dot-product attention's recipe (``workload.fp8_recipe`` with ``workload.fp8_dot_product_attention``;
    "" = BF16 attention): what TE's FP8 attention saves for backward (:func:`attention_terms`)"""

    @property
    def tokens(self) -> int:
        """Tokens seen by attention and the TP-split GEMMs (seq · mbs)."""
        return self.seq * self.mbs

    @property
    def local_tokens(self) -> int:
        """Tokens of the sequence-parallel parts (norms, dropout, residual, MoE routing)."""
        return self.seq * self.mbs // self.tp

    @classmethod
    def from_config(cls, spec: StudySpec, config: Any, scale: float = 1.0) -> LayerShape:
        """The per-GPU shape of one layer of ``spec`` under ``config``; ``scale`` < 1 shortens the sequence
        (per-token costs stay the same, which is what a quick profile needs)."""
        m = spec.model
        seq = max(2 * config.tp, int(spec.workload.seq_length // config.cp * scale))
        seq -= seq % config.tp
        return cls(
            hidden=m.hidden_size,
            heads=m.num_attention_heads // config.tp,
            groups=m.query_groups // config.tp,
            head_dim=m.head_dim,
            ffn=m.ffn_hidden_size // config.tp,
            seq=seq,
            mbs=config.mbs,
            tp=config.tp if spec.workload.sequence_parallel else 1,
            moe=m.is_moe,
            experts=m.experts,
            local_experts=m.experts // config.ep if m.is_moe else 1,
            topk=m.moe_router_topk if m.is_moe else 1,
            expert_ffn=m.expert_ffn if m.is_moe else 0,
            swiglu=m.swiglu,
            glu_clamp=eager_glu_clamp(spec),
            layernorm=m.normalization == "LayerNorm",
            bias=has_bias(m),
            dropout=dropout_rate(m),
            fp8=spec.workload.precision == "fp8",
            flash=spec.workload.flash_attention,
            fp8_attention=spec.workload.fp8_recipe if spec.workload.fp8_dot_product_attention else "",
        )

    def replace(self, **changes: Any) -> LayerShape:
        return dataclasses.replace(self, **changes)


# --- parameters ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LayerParams:
    """Parameters of one layer on one GPU: dense (TP-split or replicated; sharded by the distributed
    optimizer over dp·cp) and expert (EP-split; sharded over the expert-data-parallel group)."""

    dense: int
    expert: int
    gemm: int
    """the GEMM weights among them (dense and expert): the ones FP8 keeps extra copies of"""

    @property
    def total(self) -> int:
        return self.dense + self.expert


def layer_params(shape: LayerShape) -> LayerParams:
    """Per-GPU parameters of one layer. Norm weights (and LayerNorm biases) are replicated across TP."""
    h, d = shape.hidden, shape.head_dim
    qkv_out = (shape.heads + 2 * shape.groups) * d
    attn_gemm = h * qkv_out + shape.heads * d * h
    norm = (2 if shape.layernorm else 1) * h
    dense = attn_gemm + 2 * norm
    if shape.bias:
        dense += qkv_out + h  # column-parallel bias split, row-parallel bias replicated
    gemm = attn_gemm
    fc1_mult = 2 if shape.swiglu else 1
    expert = 0
    if shape.moe:
        dense += shape.experts * h  # router weight [experts, hidden], replicated
        expert = shape.local_experts * (fc1_mult + 1) * h * shape.expert_ffn
        gemm += expert
    else:
        mlp = (fc1_mult + 1) * h * shape.ffn
        dense += mlp
        gemm += mlp
        if shape.bias:
            dense += fc1_mult * shape.ffn + h
    return LayerParams(dense=dense, expert=expert, gemm=gemm)


def embedding_params(spec: StudySpec, tp: int) -> int:
    """Input embedding on one GPU: vocab-parallel word embedding (+ replicated learned positions)."""
    m = spec.model
    n = m.vocab_size * m.hidden_size // tp
    if m.position_embedding_type == "learned_absolute":
        n += spec.workload.seq_length * m.hidden_size
    return n


def output_params(spec: StudySpec, tp: int, pp: int) -> int:
    """Output side on one GPU: final norm plus the vocab-parallel output layer. With tied embeddings and
    pp > 1 Megatron keeps a copy of the word embedding on the last stage; with pp = 1 it is shared."""
    m = spec.model
    norm = (2 if m.normalization == "LayerNorm" else 1) * m.hidden_size
    if m.untie_embeddings_and_output_weights or pp > 1:
        return norm + m.vocab_size * m.hidden_size // tp
    return norm


# --- pipeline layout ---------------------------------------------------------------------------------------
def stage_chunks(pp: int, vpp: int, schedule: str) -> list[tuple[int, ...]]:
    """The model chunks (0 … pp·vpp−1, in layer order) each pipeline stage holds.

    Megatron's interleaved schedule gives stage i the chunks i, i+pp, i+2pp, …; ZB-V (Qi et al. 2024) places
    its two chunks in a V: stage i holds chunk i and chunk 2pp−1−i, so stage 0 holds the first and the last
    chunk (the embedding and the output layer).
    """
    if schedule == "zbv":
        return [(i, 2 * pp - 1 - i) for i in range(pp)]
    return [tuple(i + j * pp for j in range(vpp)) for i in range(pp)]


def stage_ends(pp: int, vpp: int, schedule: str) -> list[tuple[bool, bool]]:
    """(holds the embedding, holds the output layer) per stage."""
    last = pp * vpp - 1
    return [(0 in ch, last in ch) for ch in stage_chunks(pp, vpp, schedule)]


def chunks_in_flight(pp: int, vpp: int, m: int, schedule: str, stage: int, extra_chunk: bool = False) -> int:
    """Model-chunk micro-batches whose activations stage ``stage`` holds at its peak.

    - pp = 1: one (gradient accumulation runs micro-batches one after another);
    - 1F1B and ZB-H1 (``zb1p``, same activation memory as 1F1B, Qi et al. 2024): ``min(pp − i, m)``;
    - interleaved (Megatron ``forward_backward_pipelining_with_interleaving``): warm-up
      ``2(pp − i − 1) + (vpp − 1)·pp`` forwards plus the one of the first steady-state step, capped at
      ``m·vpp``; for stage 0 this is Korthikanti's factor ``1 + (pp − 1)/(pp·vpp)``; ``extra_chunk``: one
      more with EP all-to-all overlap (``overlap_moe_expert_parallel_comm`` runs a forward chunk beside a
      backward one);
    - ZB-V: every stage peaks at 1F1B's first-stage memory, ``pp`` micro-batches of its whole share
      (= ``2·pp`` chunk micro-batches), capped at ``2m`` (Qi et al. 2024, §4).
    """
    if pp == 1:
        return vpp
    if schedule == "interleaved":
        return min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1 + int(extra_chunk), m * vpp)
    if schedule == "zbv":
        return min(2 * pp, 2 * m)
    return min(pp - stage, m)


def layers_in_flight(
    layers: int, pp: int, vpp: int, m: int, schedule: str, stage: int, extra_chunk: bool = False
) -> float:
    """(layer, micro-batch) activation sets held by ``stage`` at its peak."""
    per_chunk = layers / (pp * vpp)
    if pp == 1:
        return float(layers)
    return chunks_in_flight(pp, vpp, m, schedule, stage, extra_chunk) * per_chunk


# --- activations -------------------------------------------------------------------------------------------
def attention_terms(shape: LayerShape) -> dict[str, int]:
    """What the attention block of one layer keeps for backward (one micro-batch, no recompute), bytes.

    ``T`` = tokens of attention and the TP-split GEMMs, ``Tl`` = T / tp (sequence-parallel parts), ``b`` = 2:

    - ``norm1_input``: the layer input ``Tl·h·b`` (input norm fused into the QKV GEMM, TE LayerNormLinear)
      plus its fp32 statistics (rstd; LayerNorm also the mean);
    - ``qkv_input``: the norm output = QKV GEMM input, kept sequence-split and re-gathered in backward
      (Megatron SP); FP8: TE keeps the 1-byte FP8 cast instead;
    - ``qkv``: Q, K, V after RoPE, K and V sized by the KV groups (GQA);
    - ``core_out``: the flash/fused attention output O, shared with the projection GEMM (counted once; FP8
      adds the projection's 1-byte FP8 copy);
    - FP8 attention (``fp8_attention``): TE saves its FP8 Q, K, V instead (``dot_product_attention/
      backends.py@d0067d0d``:1580-1589): 1 byte per element under per-tensor scaling, a row-wise and a
      column-wise MXFP8 copy with their 1-in-32 scales under MXFP8 (``combine_and_quantize`` for backward,
      ``utils.py@d0067d0d``:3014-3111); and O in FP8 under delayed scaling (BF16 under current scaling, TE's
      default ``NVTE_DPA_FP8CS_O_in_F16=1``, backends.py:210, and under MXFP8);
    - ``softmax_lse``: fp32 softmax statistics per head and token;
    - ``attn_dropout_mask``: 1 byte per element when ``hidden_dropout`` > 0 (GPT-style models);
    - ``attn_scores`` (``workload.flash_attention: false`` only): unfused attention keeps the s² softmax
      output (2 bytes per score) and with dropout its mask (1) and output (2): Korthikanti's 5as²b.
    """
    h = shape.hidden
    T, Tl = shape.tokens, shape.local_tokens
    a, g, d = shape.heads, shape.groups, shape.head_dim
    gemm_in = 1 if shape.fp8 else ACT_BYTES
    stats = (2 if shape.layernorm else 1) * FP32 * Tl
    qkv_b: float = ACT_BYTES
    out_b = ACT_BYTES
    if shape.fp8_attention == "mxfp8":
        qkv_b = 2 * (1 + 1 / MXFP8_BLOCK)
    elif shape.fp8_attention:
        qkv_b = 1
        out_b = 1 if shape.fp8_attention == "delayed" else ACT_BYTES
    t = {
        "norm1_input": ACT_BYTES * Tl * h + stats,
        "qkv_input": gemm_in * Tl * h,
        "qkv": int(qkv_b * T * (a + 2 * g) * d),
        "core_out": (out_b + (1 if shape.fp8 else 0)) * T * a * d,
        "softmax_lse": FP32 * T * a,
        "attn_dropout_mask": Tl * h if shape.dropout > 0 else 0,
    }
    if not shape.flash:
        t["attn_scores"] = (2 + (3 if shape.dropout > 0 else 0)) * shape.mbs * a * shape.seq * shape.seq
    return t


def dense_mlp_terms(shape: LayerShape) -> dict[str, int]:
    """A dense layer's pre-MLP norm and MLP: ``norm2_input`` (+ fp32 statistics), ``mlp_input`` (norm output
    = fc1 input, FP8: its 1-byte cast), ``fc1_out`` (the activation's input, 2·ffn wide for SwiGLU),
    ``act_out`` (fc2 input, FP8: its cast) and ``mlp_dropout_mask``."""
    h, f = shape.hidden, shape.ffn
    T, Tl = shape.tokens, shape.local_tokens
    gemm_in = 1 if shape.fp8 else ACT_BYTES
    stats = (2 if shape.layernorm else 1) * FP32 * Tl
    return {
        "norm2_input": ACT_BYTES * Tl * h + stats,
        "mlp_input": gemm_in * Tl * h,
        "fc1_out": ACT_BYTES * T * (2 if shape.swiglu else 1) * f,
        "act_out": gemm_in * T * f,
        "mlp_dropout_mask": Tl * h if shape.dropout > 0 else 0,
    }


def moe_terms(shape: LayerShape) -> dict[str, int]:
    """An MoE layer's pre-MLP norm, router and routed experts (shared/reference/megatron-memory.md).

    ``K = Tl·k`` routed token copies reach this rank's experts (balanced routing, expert TP 1; independent of
    EP). Kept: ``norm2_input``; ``router_input`` (the norm output, bf16: router GEMM input and permutation
    source); ``router_state`` (fp32 logits and scores, ~16·Tl·E bytes); ``routing_indices`` (permutation
    maps, ~12·K); ``expert_input`` (fc1 input = the K permuted copies, FP8: 1 byte); ``expert_fc1_out``
    (SwiGLU input, bf16 also under FP8); ``expert_glu_clamped`` (a clamped GLU's clamped copy of it: GPT-OSS's
    quick-GeGLU clamps both halves and concatenates them in eager PyTorch, the clamps keep fc1's output for
    their backward and the fused GLU function saves the concatenation, ``megatron/core/fusions/
    fused_bias_geglu.py@d98e8a64``:327, 424-432); ``expert_act_out`` (fc2 input, FP8: 1 byte). Nothing for the
    all-to-alls, the expert output, the un-permute or the residual adds: Megatron-Core ≥ 0.13 applies the
    routing probabilities inside the fused SwiGLU (``weighted_bias_swiglu_impl``).
    """
    h, fe, k = shape.hidden, shape.expert_ffn, shape.topk
    Tl = shape.local_tokens
    gemm_in = 1 if shape.fp8 else ACT_BYTES
    stats = (2 if shape.layernorm else 1) * FP32 * Tl
    copies = Tl * k
    return {
        "norm2_input": ACT_BYTES * Tl * h + stats,
        "router_input": ACT_BYTES * Tl * h,
        "router_state": 4 * FP32 * Tl * shape.experts,
        "routing_indices": 12 * copies,
        "expert_input": gemm_in * copies * h,
        "expert_fc1_out": ACT_BYTES * copies * (2 if shape.swiglu else 1) * fe,
        "expert_glu_clamped": ACT_BYTES * copies * 2 * fe if shape.glu_clamp else 0,
        "expert_act_out": gemm_in * copies * fe,
        "mlp_dropout_mask": Tl * h if shape.dropout > 0 else 0,
    }


def layer_activation_terms(shape: LayerShape) -> dict[str, int]:
    """Bytes one layer keeps for backward for one micro-batch with no recompute, term by term: the
    attention block (:func:`attention_terms`) and the MLP block (:func:`moe_terms` or
    :func:`dense_mlp_terms`). Residual adds and bias-dropout-add with p = 0 keep nothing.

    GPT-style models (LayerNorm, GeLU, dropout 0.1) reproduce Korthikanti et al. 2022, Table 2 with flash
    attention (no s² term).
    """
    return {**attention_terms(shape), **(moe_terms(shape) if shape.moe else dense_mlp_terms(shape))}


RECOMPUTE_DROPS: dict[str, tuple[str, ...]] = {
    "core_attn": ("softmax_lse", "attn_scores"),
    "moe_act": ("expert_act_out", "expert_glu_clamped"),
    "layernorm": ("router_input",),
    "mlp": ("fc1_out", "act_out"),
    "moe": (
        "router_state",
        "routing_indices",
        "expert_input",
        "expert_fc1_out",
        "expert_glu_clamped",
        "expert_act_out",
    ),
    "shared_experts": ("shared_fc1_out", "shared_act_out"),
    "mla_up_proj": ("mla_q_up", "mla_kv_up"),
}
"""Terms each selective recompute module removes (Megatron-Core ``recompute_modules``; terms a layer does
not have are skipped): ``core_attn`` with flash attention only the softmax statistics; ``moe_act`` the fc2
input (the activation is rerun before fc2's backward); ``layernorm`` the pre-MLP norm output (MoE: the router
input; the input norm is fused into the QKV GEMM and untouched); ``mlp`` / ``moe`` checkpoint the dense MLP /
the whole MoE block, which then keep their input only; ``shared_experts`` and ``mla_up_proj`` the shared
experts' and MLA up-projections' internals."""


def layer_activation_bytes(shape: LayerShape, recompute: str | Recompute = "none") -> int:
    """Bytes one layer keeps for backward for one micro-batch under ``recompute``.

    ``none``: every term of :func:`layer_activation_terms`; ``selective[:modules]``: the terms of
    :data:`RECOMPUTE_DROPS` removed (``mlp`` keeps the MLP's bf16 input, ``moe`` + ``layernorm`` also drops
    the MoE block's input); ``full`` / ``full:N`` (a recomputed layer): only the layer input (2·Tl·h). For
    ``full:N`` the caller mixes recomputed and plain layers per chunk (:func:`chunk_activation_bytes`).
    """
    r = parse_recompute(recompute) if isinstance(recompute, str) else recompute
    if r.is_full:
        return ACT_BYTES * shape.local_tokens * shape.hidden
    return kept_bytes(layer_activation_terms(shape), shape, r)


def kept_bytes(terms: dict[str, int], shape: LayerShape, r: Recompute) -> int:
    """The bytes of ``terms`` a layer keeps under the selective modules of ``r`` (:data:`RECOMPUTE_DROPS`)."""
    terms = dict(terms)
    for module in r.modules:
        for name in RECOMPUTE_DROPS[module]:
            terms.pop(name, None)
    if r.has("mlp") and "mlp_input" in terms:
        terms["mlp_input"] = ACT_BYTES * shape.local_tokens * shape.hidden  # checkpoint input, bf16
    return sum(terms.values())


def chunk_activation_bytes(shape: LayerShape, recompute: str | Recompute, layers: float) -> float:
    """Bytes one virtual pipeline chunk of ``layers`` layers keeps for one micro-batch: ``full:N``
    recomputes the first N layers of the chunk (method block), which keep their input only."""
    r = parse_recompute(recompute) if isinstance(recompute, str) else recompute
    plain = layer_activation_bytes(shape, r if not r.is_full else Recompute("none"))
    if not r.is_full:
        return layers * plain
    n = min(float(r.num_layers), layers) if r.num_layers else layers
    return n * layer_activation_bytes(shape, r) + (layers - n) * plain
