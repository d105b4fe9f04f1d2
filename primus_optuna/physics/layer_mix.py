"""Layer kinds of one model and their mix on each pipeline stage: dense and MoE layers (``moe_layer_freq``),
MTP layers, multi-latent attention and shared experts, placed by the study's pipeline layout.

Small functions that the memory and step-time models call on top of their per-layer account:

- :func:`rank_layer_params`: one layer's parameters on one GPU for each kind (MLA's down-projections and
  latent norms are replicated across TP; shared experts are TP-split like a dense MLP);
- :func:`mla_activation_terms` / :func:`shared_expert_activation_terms`: the tensors MLA and the shared
  experts keep for backward, and what the ``mla_up_proj`` / ``shared_experts`` recompute modules drop;
- :func:`stage_mixes`: per physical stage, its chunks' dense/MoE/MTP layer counts and whether it holds the
  embedding / loss.

Megatron-Core conventions as in :mod:`primus_optuna.physics.shapes` (TP splits heads and FFN widths, sequence
parallelism when tp > 1, experts EP-split with ``expert_tensor_parallel_size = 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.layout import Chunk, PipelineSpec, chunks_or_reason
from ..spec.model import ModelSpec
from ..spec.recompute import Recompute, parse_recompute
from .shapes import ACT_BYTES, FP32, LayerParams, LayerShape, kept_bytes, layer_activation_terms, stage_chunks


# --- parameters ------------------------------------------------------------------------------------------
def rank_layer_params(model: ModelSpec, tp: int, ep: int, moe: bool) -> LayerParams:
    """Per-GPU parameters of one dense (``moe=False``) or MoE layer, with MLA, shared experts, biases and
    sinks; ``gemm`` counts the GEMM weights (the ones FP8 keeps extra copies of)."""
    h, a = model.hidden_size, model.num_attention_heads
    norm = h * (2 if model.normalization == "LayerNorm" else 1)
    bias = model.linear_bias
    fc1 = 2 if model.swiglu else 1
    if model.multi_latent_attention:
        qk, rope, v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        ql, kvl = model.q_lora_rank or 0, model.kv_lora_rank
        down = h * ql + h * (kvl + rope)  # replicated across TP
        up = (ql * a * (qk + rope) if ql else h * a * (qk + rope)) + kvl * a * (qk + v)
        attn_gemm = down + (up + a * v * h) // tp
        dense = attn_gemm + ql + kvl  # latent norms, replicated
    else:
        d, g = model.head_dim, model.query_groups
        qkv_out = (a + 2 * g) * d
        attn_gemm = (h * qkv_out + a * d * h) // tp
        dense = attn_gemm
        if bias or model.add_qkv_bias:
            dense += qkv_out // tp
    if bias:
        dense += h
    if model.softmax_type == "learnable":
        dense += a // tp
    dense += 2 * norm
    gemm = attn_gemm
    expert = 0
    if moe and model.is_moe:
        e = model.experts
        dense += e * h + (e if bias else 0)  # router, replicated
        one = (fc1 + 1) * h * model.expert_ffn
        expert = (e // ep) * (one + ((fc1 * model.expert_ffn + h) if bias else 0))
        gemm += (e // ep) * one
        if model.shared_expert_ffn:
            sh = (fc1 + 1) * h * model.shared_expert_ffn // tp
            dense += sh + (h if model.moe_shared_expert_gate else 0)
            gemm += sh
    else:
        mlp = (fc1 + 1) * h * model.ffn_hidden_size // tp
        dense += mlp + ((fc1 * model.ffn_hidden_size // tp + h) if bias else 0)
        gemm += mlp
    return LayerParams(dense=dense, expert=expert, gemm=gemm)


def mtp_extra_params(model: ModelSpec, tp: int) -> int:
    """Per-GPU parameters an MTP layer adds to its transformer layer: enorm, hnorm, final norm and the
    ``eh_proj`` (2h → h, column-parallel)."""
    h = model.hidden_size
    return 3 * h + 2 * h * h // tp


# --- activations -------------------------------------------------------------------------------------------
def mla_activation_terms(model: ModelSpec, shape: LayerShape) -> dict[str, int]:
    """Bytes MLA keeps for backward for one micro-batch (no recompute), replacing the GQA terms ``qkv``/
    ``core_out``/``softmax_lse`` of the per-tensor account (the norm output feeding the down-projections
    stays ``qkv_input``).

    Kept: the query latent (``q_down`` output = q-norm input, its fp32 rstd, the norm output = ``q_up``
    input), the KV latent (``kv_down`` output with the RoPE key part, rstd, norm output = ``kv_up`` input),
    Q (``mla_q_up``: ``nope + rope`` per head, after RoPE), K and V (``mla_kv_up``), the attention output
    and its log-sum-exp. The down-projections run on all ``T`` tokens of the rank (replicated across TP);
    heads are TP-split. The ``mla_up_proj`` recompute module drops ``mla_q_up``/``mla_kv_up``: Q, K, V are
    rebuilt from the latents in backward (Megatron ``--recompute-modules mla_up_proj``); ``core_attn`` drops
    the softmax statistics (:data:`~primus_optuna.physics.shapes.RECOMPUTE_DROPS`).
    """
    T, a = shape.tokens, shape.heads
    gemm_in = 1 if shape.fp8 else ACT_BYTES
    qk, rope, v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    ql, kvl = model.q_lora_rank or 0, model.kv_lora_rank
    return {
        "mla_q_latent": (ACT_BYTES * T * ql + FP32 * T + gemm_in * T * ql) if ql else 0,
        "mla_kv_latent": ACT_BYTES * T * (kvl + rope) + FP32 * T + gemm_in * T * kvl,
        "mla_q_up": ACT_BYTES * T * a * (qk + rope),
        "mla_kv_up": ACT_BYTES * T * a * ((qk + rope) + v),
        "core_out": (ACT_BYTES + (1 if shape.fp8 else 0)) * T * a * v,
        "softmax_lse": FP32 * T * a,
    }


def shared_expert_activation_terms(model: ModelSpec, shape: LayerShape) -> dict[str, int]:
    """Bytes the shared experts (a TP-split dense MLP on every token) keep for backward: FP8 copy of the
    input (bf16 shares the router's input tensor), fc1 output, activation output. The ``shared_experts``
    recompute module drops ``shared_fc1_out``/``shared_act_out``."""
    if not shape.moe or not model.shared_expert_ffn:
        return {}
    fs = model.shared_expert_ffn // shape.tp
    fc1 = 2 if shape.swiglu else 1
    gemm_in = 1 if shape.fp8 else ACT_BYTES
    return {
        "shared_input_fp8": shape.local_tokens * shape.hidden if shape.fp8 else 0,
        "shared_fc1_out": ACT_BYTES * shape.tokens * fc1 * fs,
        "shared_act_out": gemm_in * shape.tokens * fs,
    }


def kind_activation_terms(model: ModelSpec, shape: LayerShape) -> dict[str, int]:
    """The per-tensor account of one layer of ``shape``'s kind (dense or MoE) with no recompute:
    :func:`~primus_optuna.physics.shapes.layer_activation_terms` with MLA's tensors in place of GQA's and the
    shared experts added."""
    terms = layer_activation_terms(shape)
    if model.multi_latent_attention:
        terms.pop("qkv", None)
        terms.update(mla_activation_terms(model, shape))
    terms.update(shared_expert_activation_terms(model, shape))
    return terms


def kind_activation_bytes(model: ModelSpec, shape: LayerShape, recompute: str | Recompute = "none") -> int:
    """Bytes one layer of ``shape``'s kind keeps for one micro-batch under ``recompute``: a fully recomputed
    layer its input only; else :func:`kind_activation_terms` less what the selective modules drop."""
    r = parse_recompute(recompute) if isinstance(recompute, str) else recompute
    if r.is_full:
        return ACT_BYTES * shape.local_tokens * shape.hidden
    return kept_bytes(kind_activation_terms(model, shape), shape, r)


def mtp_extra_activation(shape: LayerShape) -> int:
    """What an MTP layer keeps beyond its transformer layer: the two norm inputs (hidden state and next
    token's embedding) and the ``eh_proj`` input (the concatenated 2h)."""
    gemm_in = 1 if shape.fp8 else ACT_BYTES
    return 2 * (ACT_BYTES * shape.local_tokens * shape.hidden + FP32 * shape.local_tokens) + (
        gemm_in * shape.local_tokens * 2 * shape.hidden
    )


# --- stages ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageMix:
    """The layers one physical pipeline stage holds (all its chunks together)."""

    dense: int
    moe: int
    mtp: int
    embedding: bool
    loss: bool
    chunks: int

    @property
    def decoder(self) -> int:
        return self.dense + self.moe


def stage_mixes(
    model: ModelSpec, pipeline: PipelineSpec, pp: int, vpp: int, schedule: str
) -> list[StageMix] | None:
    """Per physical stage its layer mix (None when the layers cannot be split this way)."""
    v = 2 if schedule == "zbv" else vpp
    chunks, _ = chunks_or_reason(model, pipeline, pp, v)
    if chunks is None:
        return None
    out = []
    for held in stage_chunks(pp, v, schedule):
        cs: list[Chunk] = [chunks[k] for k in held]
        out.append(
            StageMix(
                dense=sum(c.dense for c in cs),
                moe=sum(c.moe for c in cs),
                mtp=sum(c.mtp for c in cs),
                embedding=any(c.embedding for c in cs),
                loss=any(c.loss for c in cs),
                chunks=len(cs),
            )
        )
    return out


def even_fallback(model: ModelSpec, pp: int, vpp: int, schedule: str, ceil: bool = False) -> list[StageMix]:
    """Layers rounded down (``ceil``: up, the busiest stage of Megatron's uneven split) per chunk, for a split
    the layout does not allow (estimated as far as the divisions allow)."""
    v = 2 if schedule == "zbv" else vpp
    n = -(-model.num_layers // (pp * v)) if ceil else model.num_layers // (pp * v)
    share = model.num_moe_layers / model.num_layers
    out = []
    for held in stage_chunks(pp, v, schedule):
        layers = n * len(held)
        moe = round(layers * share)
        last = pp * v - 1
        out.append(StageMix(layers - moe, moe, 0, 0 in held, last in held, len(held)))
    return out


def chunk_counts(
    model: ModelSpec, pipeline: PipelineSpec, pp: int, vpp: int, schedule: str
) -> tuple[tuple[float, float, float], ...]:
    """Per model chunk (virtual stage, model order) the work the step-time model times apart: (layers of the
    model's own kind: MoE layers, or every layer of a dense model, MTP layers included; the dense layers of an
    MoE model; output layers: the model's and one per MTP layer, on the chunk holding the loss). A split the
    layout does not allow: each stage's :func:`even_fallback` mix (rounded up) spread evenly over its chunks."""
    v = 2 if schedule == "zbv" else vpp
    heads = 1.0 + (model.mtp_num_layers or 0)
    chunks, _ = chunks_or_reason(model, pipeline, pp, v)
    if chunks is not None:
        if model.is_moe:
            return tuple((c.moe + c.mtp, c.dense, heads * c.loss) for c in chunks)
        return tuple((c.decoder + c.mtp, 0, heads * c.loss) for c in chunks)
    out: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * (pp * v)
    for held, mx in zip(
        stage_chunks(pp, v, schedule), even_fallback(model, pp, vpp, schedule, ceil=True), strict=True
    ):
        n = len(held)
        main, dense = (mx.moe / n, mx.dense / n) if model.is_moe else (mx.decoder / n, 0.0)
        for k in held:
            out[k] = (main, dense, heads if k == pp * v - 1 else 0.0)
    return tuple(out)
