"""FLOPs and GEMM shapes of one transformer layer as one GPU sees it, and Narayanan's model-FLOPs formula.

Counting conventions (a multiply-add = 2 FLOPs):

- attention projections with GQA: QKV ``2·T·h·(a + 2g)·d``, output ``2·T·a·d·h``;
- causal flash attention: ``QKᵀ`` and ``PV`` each ``2·T·s·a·d`` for the full square, halved by the causal mask
  (flash attention skips the masked blocks); its backward costs 2.5× the forward (FlashAttention-2, Dao 2023:
  five GEMMs in backward vs two in forward, the score matrix is recomputed);
- MLP: SwiGLU has three ``h×ffn`` matrices, GeLU two;
- MoE: router ``2·T·h·E`` plus top-k experts ``k·`` (an expert MLP) per token, plus the shared experts (a
  TP-split dense MLP of width ``moe_shared_expert_intermediate_size`` on every token);
- multi-latent attention (MLA, DeepSeek-V2 §2.1): down-projections ``h→q_lora`` and ``h→kv_lora+rope``
  (replicated across TP), up-projections ``q_lora→a·(nope+rope)`` and ``kv_lora→a·(nope+v)`` (TP splits
  heads), output ``a·v→h``; core attention with q/k width ``nope+rope`` and v width ``v_head_dim``;
- sliding-window attention (GPT-OSS): a query attends to at most ``window_size`` keys, so the causal work is
  ``s·W − W²/2`` instead of ``s²/2`` key-query pairs; core attention is averaged over the model's pattern of
  full and windowed layers;
- dense-first layers (``moe_layer_freq``) use the dense MLP; MTP layers (``mtp_num_layers``) are one more
  transformer layer plus ``eh_proj`` (``2h→h``) and one more output layer each;
- logits ``2·T·h·V`` on the stage holding the output layer;
- a linear layer's backward is two GEMMs of its forward size: input gradient (B) and weight gradient (W).

All per-rank figures assume Megatron-Core slicing: TP splits heads, KV groups and FFN widths; CP splits the
sequence (load-balanced causal split: each rank does 1/cp of the causal work); experts are EP-split with
``expert_tensor_parallel_size = 1`` and each rank's tokens (``T/tp`` under sequence parallelism) are routed to
``k`` experts, balanced.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.model import ModelSpec

ATTN_BWD_FACTOR = 2.5
"""FlashAttention-2 backward / forward FLOPs (Dao 2023: 5 vs 2 matmuls)."""


@dataclass(frozen=True, slots=True)
class Gemm:
    """One GEMM ``[M, K] x [K, N]`` repeated ``count`` times (grouped GEMMs: count = local experts)."""

    m: float
    n: float
    k: float
    count: float = 1.0

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True, slots=True)
class LayerGemms:
    """Forward GEMMs of one layer on one rank for one micro-batch, and the core-attention FLOPs."""

    attention: tuple[Gemm, ...]
    """QKV and output projections"""
    mlp: tuple[Gemm, ...]
    """dense MLP, or router + grouped expert GEMMs"""
    grouped: bool
    """the MLP GEMMs are MoE grouped GEMMs"""
    core_attention_flops: float
    """forward FLOPs of causal flash attention on this rank"""
    shared: tuple[Gemm, ...] = ()
    """shared-expert GEMMs (TP-split dense MLP on every token) of an MoE layer"""


def window_pairs(seq: float, window: float | None = None) -> float:
    """Key-query pairs of one causal attention over ``seq`` tokens, each query seeing at most ``window`` keys
    (None: all before it)."""
    if window is None or window >= seq:
        return seq * seq / 2.0
    return seq * window - window * window / 2.0


def attention_mix(model: ModelSpec, seq: int) -> tuple[tuple[float, float], ...]:
    """The model's kinds of causal attention over ``seq`` tokens: (share of its layers, key-query pairs) for
    full layers and, where the model has them, sliding-window layers (at most ``window_size`` keys)."""
    full = window_pairs(seq)
    w = model.window_size
    if w is None or w >= seq:
        return ((1.0, full),)
    flags = model.full_attention_flags
    share = sum(flags) / len(flags)
    kinds = ((share, full), (1.0 - share, window_pairs(seq, w)))
    return tuple(k for k in kinds if k[0] > 0)


def causal_pairs(model: ModelSpec, seq: int) -> float:
    """Key-query pairs of causal attention over ``seq`` tokens, averaged over the model's layers."""
    return sum(share * pairs for share, pairs in attention_mix(model, seq))


def attention_gemms(model: ModelSpec, tokens: float, tp: int) -> tuple[Gemm, ...]:
    """Per-rank forward projections of one attention block (GQA or MLA) over ``tokens`` tokens."""
    h = model.hidden_size
    a = model.num_attention_heads / tp
    if model.multi_latent_attention:
        qk, rope, v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        ql, kvl = model.q_lora_rank, model.kv_lora_rank
        q = (
            (Gemm(tokens, ql, h), Gemm(tokens, a * (qk + rope), ql))
            if ql
            else (Gemm(tokens, a * (qk + rope), h),)
        )
        return (*q, Gemm(tokens, kvl + rope, h), Gemm(tokens, a * (qk + v), kvl), Gemm(tokens, h, a * v))
    d, g = model.head_dim, model.query_groups / tp
    return (Gemm(tokens, (a + 2 * g) * d, h), Gemm(tokens, h, a * d))


def mla_up_gemms(model: ModelSpec, tokens: float, tp: int) -> tuple[Gemm, ...]:
    """MLA's up-projections (query ``q_lora→a·(nope+rope)`` or the direct query projection, and
    ``kv_lora→a·(nope+v)``): what the ``mla_up_proj`` recompute module re-runs in backward."""
    g = attention_gemms(model, tokens, tp)
    return (g[1], g[3]) if model.q_lora_rank else (g[0], g[2])


def core_attention_flops(model: ModelSpec, seq: int, mbs: int, tp: int, cp: int) -> float:
    """Forward FLOPs of causal flash attention (QKᵀ and PV) on one rank, averaged over the layers."""
    a = model.num_attention_heads / tp
    if model.multi_latent_attention:
        width = model.head_dim + model.v_head_dim
    else:
        width = 2 * model.head_dim
    # load-balanced CP gives each rank 1/cp of the causal work
    return 2.0 * mbs * causal_pairs(model, seq) * a * width / cp


def layer_gemms(
    model: ModelSpec, seq: int, mbs: int, tp: int, cp: int, ep: int, moe: bool | None = None
) -> LayerGemms:
    """Per-rank forward GEMMs of one layer (see the module docstring for the slicing); ``moe=False`` gives a
    dense layer of an MoE model (``moe_layer_freq``), None the model's kind."""
    h = model.hidden_size
    tokens = mbs * seq / cp
    attention = attention_gemms(model, tokens, tp)
    fc1 = 2 if model.swiglu else 1
    shared: tuple[Gemm, ...] = ()
    is_moe = model.is_moe if moe is None else (moe and model.is_moe)
    if is_moe:
        e, k, fe = model.experts, model.moe_router_topk, model.expert_ffn
        local_tokens = tokens / tp
        local_experts = e / ep
        per_expert = local_tokens * k * ep / e
        mlp: tuple[Gemm, ...] = (
            Gemm(local_tokens, e, h),
            Gemm(per_expert, fc1 * fe, h, local_experts),
            Gemm(per_expert, h, fe, local_experts),
        )
        if model.shared_expert_ffn:
            fs = model.shared_expert_ffn / tp
            shared = (Gemm(tokens, fc1 * fs, h), Gemm(tokens, h, fs))
    else:
        f = model.ffn_hidden_size / tp
        mlp = (Gemm(tokens, fc1 * f, h), Gemm(tokens, h, f))
    core = core_attention_flops(model, seq, mbs, tp, cp)
    return LayerGemms(attention, mlp, is_moe, core, shared)


def logits_gemm(model: ModelSpec, seq: int, mbs: int, tp: int, cp: int) -> Gemm:
    """The output layer (vocab-parallel) on the last stage."""
    return Gemm(mbs * seq / cp, model.vocab_size / tp, model.hidden_size)


def layer_flops(g: LayerGemms) -> float:
    """Forward FLOPs of one layer (projections, MLP/experts, shared experts, core attention)."""
    return sum(x.flops for x in g.attention + g.mlp + g.shared) + g.core_attention_flops


def model_flops_per_token(model: ModelSpec, seq: int, mtp: bool = True) -> float:
    """Training FLOPs per token without recompute (3× forward; causal attention), for MFU: dense and MoE
    layers as ``moe_layer_freq`` places them, and (``mtp``) the MTP layers with their ``eh_proj`` and
    output layer."""
    moe = layer_flops(layer_gemms(model, seq, 1, 1, 1, 1, moe=True))
    dense = layer_flops(layer_gemms(model, seq, 1, 1, 1, 1, moe=False))
    logits = logits_gemm(model, seq, 1, 1, 1).flops
    fwd = model.num_moe_layers * moe + model.num_dense_layers * dense + logits
    if mtp and model.mtp_num_layers:
        last = moe if model.moe_layer_flags[-1] else dense
        eh_proj = 2.0 * seq * 2 * model.hidden_size * model.hidden_size
        fwd += model.mtp_num_layers * (last + eh_proj + logits)
    return 3 * fwd / seq


def narayanan_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Model FLOPs per iteration with full recompute, Narayanan et al. 2021 (eq. 3):
    ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``."""
    h = hidden
    return 96.0 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))
