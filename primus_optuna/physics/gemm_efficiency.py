"""Per-shape compute efficiency: a roofline times an achievable fraction that grows with the GEMM's size.

A GEMM ``[M, K] x [K, N]`` of ``w = M·N·K`` multiply-adds runs at ``peak · fraction(w)`` with

    fraction(w) = peak_fraction · w / (w + half_size)

(small GEMMs cannot fill the GPU's compute units: fewer output tiles than SMs/CUs, a fixed prologue and
epilogue), and never faster than HBM allows (reading both operands and writing the result once). One
:class:`EfficiencyCurve` per GPU family and kernel kind (linear-layer GEMMs, attention) lives in the family
table of :mod:`.calibration` with the data that fitted it. Flash attention's curve is indexed by its span, the
keys each query attends to on average (one kernel's inner loop), not by its total work: cuDNN's kernels with a
128-token window run at the same fraction of peak at 2k and 16k tokens although their work grows 8-fold
(tests/data/cudnn-sdpa.csv, scripts/check_attention.py), while at full causal span the fraction grows with the
sequence as the Llama rows show. A grid with fewer query tiles than SMs is not modelled (training shapes have
enough heads × tiles).

The interface is shape-based so that any layer (dense, MoE, MLA, shared experts) plugs in: pass the GEMM's
``M, N, K`` and ``count``. A batched GEMM (``count`` independent problems in one kernel, e.g. attention
scores per head) fills the GPU with its total work ``w·count``; so does a grouped MoE GEMM (``grouped=True``:
``M`` = tokens per local expert, padded to whole tiles): a grouped kernel (CUTLASS grouped GEMM, TE
GroupedLinear, hipBLASLt grouped GEMM) schedules the output tiles of all local experts over the device at
once, so its efficiency follows the group's total work, not one expert's.

Example::

    curve = EfficiencyCurve(peak_fraction=0.8, half_size=2e8, fitted_to="...")
    gemm_seconds(curve, 8192, 4096, 4096, peak_flops=312e12, hbm_bytes_per_s=1.6e12, elt_bytes=2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .flops import ATTN_BWD_FACTOR

TILE = 128
"""grouped GEMMs pad each expert's tokens to whole tiles (assumption: 128-row tiles, CUTLASS/hipBLASLt)"""


ATTN_SCORE_COST = 124.0
"""non-matmul work of flash attention per score (online softmax: max, exp, rescale), in head-dim units of the
matmul work per score (which grows with the head width ``d``): the kernel's rate per FLOP goes as
``d / (d + ATTN_SCORE_COST)``. Fitted to cuDNN's BF16 flash-attention forward on H100 SXM5 at 4k tokens,
408 TFLOP/s at head dim 64 vs 609 at 128 (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608, forward-speed
figures); the same ratio is assumed for backward and for the other vendors' kernels."""

ATTN_REFERENCE_HEAD_DIM = 128
"""head width the attention curves of :mod:`.calibration` were fitted on (every fitting row has 128-wide heads,
MLA's 192/128 included); wider heads are not credited (cuDNN at head dim 256 is no faster per FLOP than at 128
in the same paper: register-bound)"""


def flash_attention_seconds(
    curve: EfficiencyCurve,
    fwd_flops: float,
    peak_flops: float,
    head_width: float,
    *,
    span: float,
    backward: bool = False,
    bwd_rate: float = 1.0,
) -> float:
    """Seconds of fused flash attention doing ``fwd_flops`` forward FLOPs whose queries attend to ``span`` keys
    on average (fixed costs apart): the curve's fraction of ``peak_flops`` at that span, times the head-width
    factor; ``backward``: :data:`.flops.ATTN_BWD_FACTOR` times the FLOPs at ``bwd_rate`` times that rate."""
    rate = peak_flops * curve.fraction(span) * attention_width_factor(head_width)
    if backward:
        return fwd_flops * ATTN_BWD_FACTOR / (rate * bwd_rate)
    return fwd_flops / rate


def attention_width_factor(head_width: float) -> float:
    """Flash-attention rate per FLOP at heads ``head_width`` wide (the mean of the q/k and v widths) relative to
    the :data:`ATTN_REFERENCE_HEAD_DIM`-wide heads the curves were fitted on: 1 for 128 and wider, 0.67 at 64."""
    ref = ATTN_REFERENCE_HEAD_DIM
    if head_width >= ref:
        return 1.0
    return head_width * (ref + ATTN_SCORE_COST) / (ref * (head_width + ATTN_SCORE_COST))


@dataclass(frozen=True, slots=True)
class EfficiencyCurve:
    """Achievable fraction of a roofline peak as a function of one kernel's size (GEMMs: its multiply-adds;
    flash attention: the keys per query)."""

    peak_fraction: float
    """fraction of the datasheet peak reached by the largest, well-shaped problems"""
    half_size: float
    """size at which half of ``peak_fraction`` is reached (GEMMs: multiply-adds ``M·N·K``; attention: keys per
    query)"""
    fitted_to: str = ""
    """the data (or assumption) these two constants come from"""

    def fraction(self, size: float) -> float:
        """Achievable fraction of peak for a kernel of ``size`` (the curve's unit)."""
        if size <= 0:
            return self.peak_fraction
        return self.peak_fraction * size / (size + self.half_size)


def gemm_seconds(
    curve: EfficiencyCurve,
    m: float,
    n: float,
    k: float,
    count: float = 1.0,
    *,
    peak_flops: float,
    hbm_bytes_per_s: float,
    elt_bytes: float,
    grouped: bool = False,
) -> float:
    """Seconds of ``count`` GEMMs ``[m, k] x [k, n]`` (one kernel): the roofline of FLOPs at the curve's
    achievable fraction and of HBM traffic. ``grouped``: a MoE grouped GEMM, ``m`` = tokens per local expert
    (padded to :data:`TILE` rows), sized by the whole group's work."""
    if count <= 0 or m <= 0:
        return 0.0
    if grouped:
        mp = math.ceil(m / TILE) * TILE
        work = mp * n * k * count
        flops = 2.0 * work
    else:
        work = m * n * k * count
        flops = 2.0 * work
    t_flops = flops / (peak_flops * curve.fraction(work))
    t_mem = (m * k + k * n + m * n) * elt_bytes * count / hbm_bytes_per_s
    return max(t_flops, t_mem)


def layer_gemm_seconds(
    shape: Any,
    gemm: EfficiencyCurve,
    attention: EfficiencyCurve,
    peak_flops: float,
    attention_bwd_rate: float = 1.0,
) -> float:
    """Forward + backward seconds of one layer's GEMMs and causal attention at ``shape`` (a
    :class:`~primus_optuna.physics.shapes.LayerShape`) on the curves, compute-bound part only: what scales a
    timing of a smaller shape to the full one (the profile runner)."""
    t, h, d = shape.tokens, shape.hidden, shape.head_dim
    a, g = shape.heads, shape.groups
    fc1 = 2 if shape.swiglu else 1
    gemms = [(t, (a + 2 * g) * d, h, 1.0, False), (t, h, a * d, 1.0, False)]
    if shape.moe:
        per_expert = shape.local_tokens * shape.topk / max(1, shape.local_experts)
        gemms.append((shape.local_tokens, shape.experts, h, 1.0, False))
        gemms.append((per_expert, fc1 * shape.expert_ffn, h, float(shape.local_experts), True))
        gemms.append((per_expert, h, shape.expert_ffn, float(shape.local_experts), True))
    else:
        gemms += [(t, fc1 * shape.ffn, h, 1.0, False), (t, h, shape.ffn, 1.0, False)]
    total = 0.0
    for m, n, k, count, grouped in gemms:
        total += 3 * gemm_seconds(
            gemm,
            m,
            n,
            k,
            count,
            peak_flops=peak_flops,
            hbm_bytes_per_s=math.inf,
            elt_bytes=0,
            grouped=grouped,
        )
    core = 2.0 * 2.0 * shape.mbs * shape.seq * shape.seq * a * d * 0.5  # causal QKᵀ and PV
    span = shape.seq / 2  # keys per query of a causal mask
    total += flash_attention_seconds(attention, core, peak_flops, d, span=span)
    total += flash_attention_seconds(
        attention, core, peak_flops, d, span=span, backward=True, bwd_rate=attention_bwd_rate
    )
    return total


__all__ = [
    "ATTN_REFERENCE_HEAD_DIM",
    "ATTN_SCORE_COST",
    "TILE",
    "EfficiencyCurve",
    "attention_width_factor",
    "flash_attention_seconds",
    "gemm_seconds",
    "layer_gemm_seconds",
]
