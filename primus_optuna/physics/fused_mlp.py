"""Transformer Engine's fused grouped MLP (``workload.te_op_fuser``): where it runs and what it changes in an
MoE layer's experts (the step time in :mod:`.throughput`, what the experts keep in :mod:`.shapes`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.study import StudySpec
from .calibration import gpu_family


@dataclass(frozen=True, slots=True)
class FusedGroupedMLP:
    """What ``workload.te_op_fuser`` (Transformer Engine's fused grouped MLP) changes in an MoE layer's expert
    MLP; the rest of it (grouped-GEMM FLOPs at the family's grouped rate, activation traffic, FP8 casts) is
    priced as without it. TE's kernel does apply the GLU and quantise FC2's input in FC1's epilogue
    (``grouped_mlp.py@d0067d0d``:1550-1551, 1626-1644), but pricing that (no activation pass, no FC2 input
    cast) made the published fused-MLP rows 4-6 points faster than measured (held-back MoE MAE 9.3% -> 10.3%,
    10.1% after a refit; 2026-12-05): the fused path costs something the model lacks, which the unfused
    traffic stands in for."""

    expert_fixed_cost: float
    """fraction kept of the family's fixed cost per local expert and grouped GEMM (``grouped_expert_us``)"""
    bias_loop: bool
    """whether the experts' output bias is still added one local expert at a time (:data:`.throughput.EXPERT_BIAS_BYTES`
    and its two kernels per local expert)"""


TE_FUSED_GROUPED_MLP = FusedGroupedMLP(expert_fixed_cost=0.0, bias_loop=False)
"""The modelling choice for ``workload.te_op_fuser`` where Transformer Engine runs its CuTe-DSL fused grouped
MLP (:func:`fused_grouped_mlp`): Megatron's TEGroupedMLP hands FC1, the scaled activation and FC2 of all local
experts to one TE op chain (``megatron/core/transformer/moe/experts.py@d98e8a64``:382-456, built at 458-656)
and TE replaces the triple with one fused op over the whole group whose cuDNN grouped-GEMM kernels take the
per-expert biases packed (``transformer_engine/pytorch/ops/fused/grouped_mlp.py@d0067d0d``:352-363,
816-898, 1355-1356, 1602); the FC2 bias is scaled by the router probabilities inside the op (``scale_bias``,
experts.py:623-636) instead of ``_apply_bias``'s per-expert loop (experts.py:344-380). So the fixed cost per
local expert of each grouped GEMM and the bias loop are dropped (assumption: the fused kernel's per-expert
set-up is negligible against its tiles; nothing fitted, no constant refitted)."""
FUSED_GROUPED_MLP_FAMILIES = ("blackwell", "blackwell_ultra")
"""GPU families on which TE takes the fused kernel: compute capability 10 only (B200/GB200 10.0, B300/GB300 10.3)
(``grouped_mlp.py@d0067d0d``:944-955)."""
FUSED_GROUPED_MLP_DIM = 64
"""FC1 and FC2 in/out features must be multiples of it for the fused kernel (``grouped_mlp.py@d0067d0d``:
783-806); otherwise TE runs the ops unfused."""


def fused_grouped_mlp(spec: StudySpec) -> bool:
    """Whether ``spec``'s experts run as TE's CuTe-DSL fused grouped MLP: ``workload.te_op_fuser`` on an MoE
    model, a Blackwell GPU, MXFP8 (TE fuses only block-scaled recipes, ``grouped_mlp.py@d0067d0d``:842; the
    study has no NVFP4) and widths that are multiples of :data:`FUSED_GROUPED_MLP_DIM`. Elsewhere the op
    fuser's unfused TE ops are priced as TEGroupedMLP (assumption)."""
    w, m = spec.workload, spec.model
    return (
        w.te_op_fuser
        and m.is_moe
        and gpu_family(spec.cluster.gpu) in FUSED_GROUPED_MLP_FAMILIES
        and w.precision == "fp8"
        and w.fp8_recipe == "mxfp8"
        and m.hidden_size % FUSED_GROUPED_MLP_DIM == 0
        and m.expert_ffn % FUSED_GROUPED_MLP_DIM == 0
    )


def eager_glu_clamp(spec: StudySpec) -> bool:
    """Whether ``spec``'s experts clamp their GLU input in eager PyTorch (``model.activation_func_clamp_value``
    on a gated MoE, GPT-OSS: ``megatron/core/fusions/fused_bias_geglu.py@d98e8a64``:424-432) rather than
    inside TE's fused grouped MLP: its extra HBM passes (:mod:`.throughput`) and its clamped copy kept for
    backward (:mod:`.shapes`)."""
    m = spec.model
    return m.is_moe and m.swiglu and m.activation_func_clamp_value is not None and not fused_grouped_mlp(spec)


__all__ = [
    "eager_glu_clamp",
    "FUSED_GROUPED_MLP_DIM",
    "FUSED_GROUPED_MLP_FAMILIES",
    "TE_FUSED_GROUPED_MLP",
    "FusedGroupedMLP",
    "fused_grouped_mlp",
]
