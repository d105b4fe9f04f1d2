"""FLOPs and GEMM shapes of one transformer layer as one GPU sees it, and Narayanan's model-FLOPs formula.

Counting conventions (a multiply-add = 2 FLOPs):

- attention projections with GQA: QKV ``2·T·h·(a + 2g)·d``, output ``2·T·a·d·h``;
- causal flash attention: ``QKᵀ`` and ``PV`` each ``2·T·s·a·d`` for the full square, halved by the causal mask
  (flash attention skips the masked blocks); its backward costs 2.5× the forward (FlashAttention-2, Dao 2023:
  five GEMMs in backward vs two in forward, the score matrix is recomputed);
- MLP: SwiGLU has three ``h×ffn`` matrices, GeLU two;
- MoE: router ``2·T·h·E`` plus top-k experts ``k·`` (an expert MLP) per token;
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


def layer_gemms(model: ModelSpec, seq: int, mbs: int, tp: int, cp: int, ep: int) -> LayerGemms:
    """Per-rank forward GEMMs of one layer (see the module docstring for the slicing)."""
    h, d = model.hidden_size, model.head_dim
    a, g = model.num_attention_heads / tp, model.query_groups / tp
    tokens = mbs * seq / cp
    attention = (Gemm(tokens, (a + 2 * g) * d, h), Gemm(tokens, h, a * d))
    fc1 = 2 if model.swiglu else 1
    if model.is_moe:
        e, k, fe = model.experts, model.moe_router_topk, model.expert_ffn
        local_tokens = tokens / tp
        local_experts = e / ep
        per_expert = local_tokens * k * ep / e
        mlp: tuple[Gemm, ...] = (
            Gemm(local_tokens, e, h),
            Gemm(per_expert, fc1 * fe, h, local_experts),
            Gemm(per_expert, h, fe, local_experts),
        )
    else:
        f = model.ffn_hidden_size / tp
        mlp = (Gemm(tokens, fc1 * f, h), Gemm(tokens, h, f))
    # causal: half of the s x s square; load-balanced CP gives each rank 1/cp of the causal work
    core = 2.0 * 2.0 * mbs * seq * seq * a * d * 0.5 / cp
    return LayerGemms(attention, mlp, model.is_moe, core)


def logits_gemm(model: ModelSpec, seq: int, mbs: int, tp: int, cp: int) -> Gemm:
    """The output layer (vocab-parallel) on the last stage."""
    return Gemm(mbs * seq / cp, model.vocab_size / tp, model.hidden_size)


def model_flops_per_token(model: ModelSpec, seq: int) -> float:
    """Training FLOPs per token without recompute (3× forward; causal attention), for MFU."""
    g = layer_gemms(model, seq, 1, 1, 1, 1)
    per_layer = sum(x.flops for x in g.attention + g.mlp) * 3 + g.core_attention_flops * 3
    logits = logits_gemm(model, seq, 1, 1, 1).flops * 3
    return (per_layer * model.num_layers + logits) / seq


def narayanan_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Model FLOPs per iteration with full recompute, Narayanan et al. 2021 (eq. 3):
    ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``."""
    h = hidden
    return 96.0 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))
