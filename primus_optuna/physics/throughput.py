"""Step time and tokens/s/GPU of a configuration, with a breakdown: :func:`estimate_throughput`.

The step is built bottom-up (each piece's source is in the module it comes from):

1. per layer and micro-batch on one rank (:mod:`.flops`, :mod:`.gemm_efficiency`): linear-layer GEMMs on
   the family's per-shape curve (roofline x an achievable fraction growing with M·N·K; MoE grouped GEMMs
   sized by the whole group's work (every local expert's tokens padded to tiles), with the family's grouped
   multiplier when a rank holds several experts and a fixed cost per local expert; FP8 at the
   family's measured FP8/BF16 speed-up); attention fused (flash, its own curve, FP8 attention at the family's FP8
   kernel rates with ``workload.fp8_dot_product_attention``; TE's 2·cp − 1 half-size
   kernels and output corrections under CP) unless ``workload.flash_attention`` is false (full s x s score
   GEMMs plus softmax traffic); memory-bound "other" kernels (norms, residuals, activation, rotary, MoE
   permutation, FP8 casts) at HBM bandwidth plus a fixed cost per kernel; and a host floor: a pass never
   runs faster than the host issues its kernels (fitted on the vTrain A100 runs);
2. communication inside a layer (:mod:`.comm`): TP with sequence parallelism as TransformerEngine runs it
   (forward all-gather, FP8 under FP8, and reduce-scatter; backward the synchronous grad all-gather, the
   input re-gather hidden under dgrad and the reduce-scatter hidden under wgrad unless zero-bubble defers
   wgrad; ``workload.tp_comm_overlap`` hides the rest under the adjacent GEMMs; without
   ``workload.sequence_parallel`` each block all-reduces its output in forward, exposed, and its input gradient
   in backward under the weight-gradient GEMM, and norms/residuals run on all tokens); CP = ring exchange of K/V
   hidden under the core attention up to ``cp_overlap``; EP = dispatch + combine per MoE layer and pass,
   all-to-all or DeepEP (de-duplicated bytes per destination rank/node, its own bandwidths), never hidden
   under the same micro-batch's experts, plus the host sync in forward (DeepEP: unless
   ``workload.moe_sync_free``); ``ep_overlap`` hides one micro-batch's dispatch/combine under another's
   compute in the steady state, never more than that compute. Every hidden collective still costs the
   family's ``overlap_interference`` fraction of its hidden time;
3. passes: F = forward; B = input gradient (linear dgrad + attention backward + ``recompute``: the forward
   of exactly what the recompute value drops, :func:`recompute_seconds`); W = weight gradient (linear wgrad);
4. the pipeline (:mod:`.pipeline`): a simulation of the schedule over ``m`` micro-batches gives the busiest
   stage's work and the bubble; sends block the sender in 1F1B/zero-bubble and are asynchronous in the
   interleaved schedule (Megatron's ``overlap_p2p_comm``); Primus's zero-bubble schedules fall back to 1F1B
   without ``gradient_accumulation_fusion``;
5. after the pipeline: data-parallel gradient reduce-scatter (all-reduce without the distributed optimizer)
   and parameter all-gather, overlapped with the last backward / first forward except a tail (``dp_tail``)
   when ``workload.overlap_grad_reduce`` (not under zero-bubble: Primus turns the overlap off), else fully
   exposed; the optimizer step is HBM-bound (Adam on fp32 master weights; under fp16 also the loss-scale
   unscale/inf check and the fp16 → fp32 grad cast); without gradient-accumulation fusion each micro-batch
   adds its 16-bit grads into the main grads.

The breakdown holds exposed time only and sums to the step time. All efficiency constants come from one
table per GPU family (:mod:`.calibration`).

Example::

    est = estimate_throughput(spec, space.baseline)
    est.tokens_per_s_per_gpu, est.breakdown_s["pipeline_bubble"]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ..spec.axes import AXES
from ..spec.recompute import parse_recompute
from ..spec.study import StudySpec
from .calibration import BREAKDOWN_TERMS, Calibration, FamilyConstants, family_constants
from .comm import Group, Topology
from .flops import (
    Gemm,
    LayerGemms,
    attention_mix,
    causal_pairs,
    layer_gemms,
    logits_gemm,
    mla_up_gemms,
    model_flops_per_token,
    window_pairs,
)
from .fused_mlp import TE_FUSED_GROUPED_MLP, eager_glu_clamp, fused_grouped_mlp
from .gemm_efficiency import ATTN_REFERENCE_HEAD_DIM, flash_attention_seconds, gemm_seconds
from .layer_mix import StageMix, chunk_counts, even_fallback, rank_layer_params, stage_mixes
from .measured import ProfileTerms, profile_constants
from .network import study_topology
from .pipeline import ChunkMix, chunk_mix, chunks_per_stage, mixed_pipeline_timing, step_lower_bound
from .shapes import embedding_params, output_params
from .spec_cache import per_spec

ACT = 2
"""bf16 activation bytes (communication and memory-bound kernels)"""
GRAD_REDUCE_BYTES = 4
"""Megatron reduces the fp32 main grads (``grad_reduce_in_fp32``, the default; 2 bytes without it)"""
PARAM_GATHER_BYTES = 2
"""the distributed optimizer all-gathers bf16 parameters (FP8 GEMM weights: 1 byte with ``fp8_param_gather``,
counted as 1 byte for every parameter: the GEMM weights are nearly all of them)"""
ADAM_BYTES_PER_PARAM = 36
"""Adam step traffic per local parameter: read+write fp32 master, exp_avg, exp_avg_sq (24), read the fp32 grad
(4), write the bf16 param (2), grad-norm/zeroing passes (~6)"""
FP16_UNSCALE_BYTES = 8
"""fp16 loss scaling, per local parameter: the in-place unscale and inf/NaN check of the fp32 main grads (read
4, write 4; Megatron ``Float16OptimizerWithFloat16Params.step`` →
``_unscale_main_grads_and_check_for_nan``, ``megatron/optimizer/optimizer.py@db6892a9``:254-293); bf16 and
fp8 runs have no grad scaler"""
FP16_GRAD_COPY_BYTES = 6
"""fp16 main grads (``grad_reduce_in_fp32`` off): the optimizer first casts them to fp32 (read 2, write 4;
``_copy_model_grads_to_main_grads``, ``main_grad.float()``, same file:479-498; a no-op on fp32 main grads)"""
UNFUSED_FWD_BYTES = 13
UNFUSED_BWD_BYTES = 19
"""HBM bytes per attention score without flash attention, forward and backward (see ``_Context.layer``)"""
EAGER_CLAMP_PASSES = 8
"""extra HBM passes over one routed copy's expert width (elements of ``expert_ffn``), forward, of a clamped GLU
(``model.activation_func_clamp_value``, GPT-OSS): before its fused activation Megatron clamps the two halves
of the fc1 output in eager PyTorch and concatenates them (``x_glu.clamp``, ``x_linear.clamp``, ``torch.cat``:
``megatron/core/fusions/fused_bias_geglu.py@d98e8a64``:424-432, called from ``moe/experts.py@d98e8a64``
:974-981): read and write each half (4) and read and write both (4). Backward as the other memory-bound
kernels here (twice forward). TE's fused grouped MLP clamps inside its kernel (``experts.py@d98e8a64``
:545-562): none there."""
EXPERT_BIAS_BYTES = 28
"""HBM bytes per routed copy and hidden element, forward, of the experts' output bias, which Megatron's
TEGroupedMLP adds outside the grouped GEMM, one local expert at a time (``linear_fc2`` with ``skip_bias_add``,
then ``_apply_bias``: ``torch.cat([t + b * p ...]).to(dtype)``, ``megatron/core/transformer/moe/
experts.py@d3528a21``:249-266, unchanged at d98e8a64 outside the TE op-fuser path): ``b·p`` written in fp32
(4), ``t + b·p`` reads bf16 and fp32 and writes fp32 (10), the concatenation copies it (8), the cast back to
bf16 (6); two kernels per local expert plus two. Backward (the autograd of the same ops, about 36 bytes)
is counted by backward's 2x of the memory-bound kernels"""


def expert_act_bytes(model: Any, copies: float, eager_clamp: bool) -> float:
    """HBM bytes of the experts' activation forward for ``copies`` routed copies: read 2F, write F for a GLU
    (F = ``expert_ffn``; a plain activation reads and writes F: 2/3 of that), plus the clamped GLU's eager
    passes (:data:`EAGER_CLAMP_PASSES`). What a ``moe_act`` recompute re-runs."""
    passes = 3 * (1 if model.swiglu else 2 / 3) + (EAGER_CLAMP_PASSES if eager_clamp else 0)
    return passes * copies * model.expert_ffn * ACT


def permute_bytes(model: Any, copies: float, local: float) -> float:
    """HBM bytes of the MoE permutation and unpermutation (read + write of each routed copy) and the router's
    fp32 softmax / top-k over ``local`` tokens, forward."""
    return 4 * copies * model.hidden_size * ACT + 2 * local * model.experts * 4


def rank_tokens(tokens: float, tp: int, sequence_parallel: bool) -> float:
    """Tokens a TP rank's norms, residuals and routing see: ``1/tp`` of them under sequence parallelism, all
    of them without it."""
    return tokens / tp if tp > 1 and sequence_parallel else tokens


CURRENT_SCALING_AMAX_BYTES = ACT
"""FP8 current (per-tensor) scaling reads each tensor it casts once more, for its amax, before the cast
(TransformerEngine ``transformer_engine/pytorch/csrc/quantizer.cpp``, ``Float8CurrentScalingQuantizer::
quantize_impl``: ``nvte_compute_amax_with_config``, then ``nvte_compute_scale_from_amax``, then
``nvte_quantize_v2``); delayed scaling takes the scale from the amax history and MXFP8 computes its block
scales in the casting pass"""
UNFUSED_ROPE_PASSES = 12
"""HBM passes over Q and K (one read or one write of each element) of Megatron's unfused RoPE in forward, where the
fused TE kernel makes 2 (``rope_utils.py@d98e8a64``:143-147, taken when mscale != 1, :351-356): ``t * cos``
(2), ``_rotate_half``'s negation of one half and concatenation (1 + 2), ``* sin`` (2), the sum (3) and the
concatenation with the pass-through part (2); backward's are counted by the memory-bound kernels' usual 2x"""
UNFUSED_ROPE_KERNELS = 12
"""kernels of the unfused RoPE in forward: those six for Q and for K"""
KERNELS_DENSE = 20
KERNELS_MOE = 35
"""kernels per layer forward outside the GEMMs/attention (norms, residuals, rotary, activation, casts;
MoE adds routing, permutation, unpermutation); backward launches twice as many (assumption)"""


@dataclass(frozen=True, slots=True)
class ThroughputEstimate:
    """The estimate of one configuration."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    """model FLOPs (no recompute) / (step time · world · dense peak of the workload's precision)"""
    breakdown_s: dict[str, float]
    """exposed seconds per step, keys :data:`~primus_optuna.physics.calibration.BREAKDOWN_TERMS`"""
    busiest_stage: int = 0
    """the stage with the most work, whose terms ``breakdown_s`` holds"""
    microbatches: int = 1
    class_work: tuple[float, ...] = ()
    stage_class: tuple[int, ...] = ()
    """micro-batches per step, per class of alike stages its work per micro-batch, and each stage's class
    (:attr:`stage_work_s`)"""

    @property
    def stage_work_s(self) -> tuple[float, ...]:
        """Per pipeline stage, its work in the pipeline per step (its layers' and output layers' passes for
        every micro-batch, and its blocking sends; uncalibrated): a layout is balanced when these are alike."""
        m = self.microbatches
        return tuple([m * self.class_work[i] for i in self.stage_class])

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "step_time_s": self.step_time_s,
            "mfu": self.mfu,
            "breakdown_s": dict(self.breakdown_s),
            "stage_work_s": list(self.stage_work_s),
            "busiest_stage": self.busiest_stage,
        }


@dataclass(frozen=True, slots=True)
class _Layer:
    """Per layer and micro-batch on one rank (seconds)."""

    attn_lin: float  # QKV + output projection, forward
    core_f: float  # flash attention forward
    core_b: float  # flash attention backward
    mlp_lin: float  # MLP / router + experts, forward
    other_f: float  # memory-bound kernels + launches, forward
    tp_f: float
    tp_b: float
    tp_b_zb: float  # backward TP exposure when the weight gradient is deferred (zero-bubble)
    cp_f: float
    cp_b: float
    ep_f: float
    ep_b: float
    expert_f: float  # expert grouped-GEMM time, forward
    host_f: float  # wait for the host beyond the GPU's work, forward
    host_b: float  # and backward


class _Context:
    """Study-level constants and memo tables (valid for one spec object)."""

    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec
        m, w, gpu = spec.model, spec.workload, spec.cluster.gpu
        self.model = m
        self.k: FamilyConstants = family_constants(gpu)
        self.measured: ProfileTerms | None = None
        if spec.cluster.profile is not None:
            # the one place a hardware profile enters: its measured GEMM, attention and memory-bound curves in
            # place of the family's constants (physics.measured)
            head_width = (m.head_dim + (m.v_head_dim if m.multi_latent_attention else m.head_dim)) / 2
            self.measured = profile_constants(
                self.k, spec.cluster.profile, gpu.bf16_tflops * 1e12, head_width
            )
            self.k = self.measured.constants
        self.topo: Topology = study_topology(spec, self.k)  # with cluster.network's measurements
        self.seq = w.seq_length
        self.gbs = w.global_batch_size
        self.world = spec.world
        self.fp8 = w.precision == "fp8"
        self.grad_bytes = GRAD_REDUCE_BYTES if w.grad_reduce_in_fp32 else ACT
        # optimizer traffic per local parameter (Adam, plus fp16 loss scaling and the fp16 -> fp32 grad cast)
        self.opt_bytes = ADAM_BYTES_PER_PARAM
        if w.precision == "fp16":
            self.opt_bytes += FP16_UNSCALE_BYTES + (0 if w.grad_reduce_in_fp32 else FP16_GRAD_COPY_BYTES)
        self.gather_bytes = 1 if self.fp8 and w.fp8_param_gather else PARAM_GATHER_BYTES
        self.bf16_peak = gpu.bf16_tflops * 1e12
        # FP8 linear GEMMs: the family's measured FP8/BF16 speed-up at the same shape, never slower than BF16
        self.lin_peak = self.bf16_peak * (max(1.0, self.k.fp8_gemm_speedup) if self.fp8 else 1.0)
        self.lin_bytes = 1 if self.fp8 else ACT
        # the output layer in MXFP8 (workload.fp8_output_proj; the spec refuses it outside FP8 + MXFP8)
        self.fp8_output_proj = self.fp8 and w.fp8_output_proj
        # FP8 cast of a GEMM input per element: read bf16, write fp8; current (per-tensor) scaling first reads
        # the tensor once more for its amax (CURRENT_SCALING_AMAX_BYTES)
        self.cast_bytes = ACT + 1 + (CURRENT_SCALING_AMAX_BYTES if w.fp8_recipe == "tensorwise" else 0)
        self.flash = w.flash_attention
        # a GPU's fused flash kernel (cuDNN, CK/aiter): its rate per FLOP at this model's head width (q/k and v
        # widths averaged: MLA's differ); a vendor "other" device (a CPU core) runs no such kernel
        v_dim = self.v_dim = m.v_head_dim if m.multi_latent_attention else m.head_dim
        self.cp_a2a = m.cp_comm_type == "a2a"
        # the model's kinds of attention layer (share, key-query pairs) and their mean pairs, once per study
        self.attn_mix = attention_mix(m, self.seq)
        self.mean_pairs = causal_pairs(m, self.seq)
        self.full_pairs = window_pairs(self.seq)
        # FP8 dot-product attention at the family's FP8 kernel rates (BF16's without kernel data)
        self.fp8_attn = self.k.fp8_attention if w.fp8_dot_product_attention else None
        self.fp8_recipe = w.fp8_recipe
        self.attn_rates = self.fp8_attn.rates(w.fp8_recipe) if self.fp8_attn is not None else (1.0, 1.0)
        # (a head width at or above the reference: factor 1; a measured profile's curve is at the model's width)
        gpu_kernel = gpu.vendor in ("nvidia", "amd") and self.measured is None
        self.attn_head_width = (m.head_dim + v_dim) / 2 if gpu_kernel else float(ATTN_REFERENCE_HEAD_DIM)
        self.hbm = gpu.hbm_bw_tbs * 1e12 * self.k.hbm_eff
        self.kernel_s = self.k.kernel_us * 1e-6
        if self.measured is not None and self.measured.hbm_bytes_per_s is not None:
            self.hbm = self.measured.hbm_bytes_per_s
            self.kernel_s = self.measured.kernel_s or 0.0
        self.host_s = self.k.host_kernel_us * 1e-6
        self.peak = gpu.peak_tflops(w.precision) * 1e12
        self.tokens_per_step = spec.tokens_per_step
        self.model_flops_step = model_flops_per_token(m, self.seq) * self.tokens_per_step
        self.rope = m.position_embedding_type == "rope"
        # forward HBM passes over Q and K, and extra kernels, of applying RoPE: TE's fused kernel, or Megatron's
        # unfused code where the model's mscale is not 1 (UNFUSED_ROPE_PASSES)
        self.rope_passes, self.rope_kernels = (
            (UNFUSED_ROPE_PASSES, UNFUSED_ROPE_KERNELS) if m.rope_unfused else (2 if self.rope else 0, 0)
        )
        self.dropout = m.normalization == "LayerNorm" and m.position_embedding_type == "learned_absolute"
        self.layers: dict[tuple[int, int, int, int, str], _Layer] = {}
        self.logits: dict[tuple[int, int, int], tuple[float, float, float]] = {}
        self.mixes: dict[tuple[int, int, str], list[StageMix]] = {}
        self.pipelines: dict[tuple[int, int, str], tuple[ChunkMix, float]] = {}
        self.params: dict[tuple[Any, ...], tuple[float, float]] = {}
        self.mixed_kinds = m.is_moe and m.num_dense_layers > 0
        self.dp_coll: dict[tuple[int, ...], tuple[float, float, float]] = {}
        self.fsdp: dict[tuple[int, ...], tuple[tuple[float, float], ...]] = {}
        # memo tables of estimate_throughput: per layout, per (layout, recompute), per p2p message, per (layout, dp)
        self.layouts: dict[tuple[Any, ...], _LayoutTerms] = {}
        self.shapes: dict[tuple[Any, ...], _ShapeTerms] = {}
        self.recs: dict[tuple[Any, ...], tuple[tuple[float, ...], tuple[float, ...]]] = {}
        self.rec_most: dict[tuple[Any, ...], tuple[float, ...]] = {}
        self.p2p: dict[tuple[int, ...], float] = {}
        self.stage_terms: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.gaf = w.gradient_accumulation_fusion
        self.is_moe = m.is_moe
        self.overlap_grad_reduce = w.overlap_grad_reduce
        self.sp = w.sequence_parallel
        # the experts' MLP as TE's fused grouped MLP (workload.te_op_fuser where TE takes the fused kernel)
        fused = fused_grouped_mlp(spec)
        self.expert_us = self.k.grouped_expert_us * (TE_FUSED_GROUPED_MLP.expert_fixed_cost if fused else 1.0)
        self.bias_loop = m.linear_bias and (TE_FUSED_GROUPED_MLP.bias_loop or not fused)
        self.eager_clamp = eager_glu_clamp(spec)

    # --- compute ----------------------------------------------------------------------------------------------
    def gemm(self, g: Gemm, linear: bool = True, grouped: bool = False) -> float:
        """Time of one forward GEMM (or one of its two backward GEMMs, same size)."""
        if g.count <= 0 or g.m <= 0:
            return 0.0
        peak = self.lin_peak if linear else self.bf16_peak
        if grouped and g.count > 1:  # several local experts in one grouped kernel
            peak *= self.k.grouped_gemm_eff
        elt = self.lin_bytes if linear else ACT
        t = gemm_seconds(
            self.k.gemm,
            g.m,
            g.n,
            g.k,
            g.count,
            peak_flops=peak,
            hbm_bytes_per_s=self.hbm,
            elt_bytes=elt,
            grouped=grouped,
        )
        if grouped:
            t += g.count * self.expert_us * 1e-6
        return t + self.kernel_s

    def layer(self, tp: int, cp: int, ep: int, mbs: int, dispatcher: str, moe: bool = True) -> _Layer:
        """One layer of the given kind (``moe=False``: a dense layer of an MoE model, ``moe_layer_freq``):
        its linear GEMMs, core attention, memory-bound kernels, TP/CP/EP communication and host floor."""
        key = (tp, cp, ep, mbs, dispatcher, moe)
        lay = self.layers.get(key)
        if lay is not None:
            return lay
        g = layer_gemms(self.model, self.seq, mbs, tp, cp, ep, moe=moe)
        attn_lin, mlp_lin, expert_f = self._linear(g)
        if self.flash:
            core_f, core_b = self._flash_attention(g, tp, cp, mbs)
        else:
            core_f, core_b = self._unfused_attention(tp, cp, mbs)
        other_f, kernels = self._memory_bound(g, tp, cp, mbs)
        tp_f, tp_b, tp_b_zb, blocks = self._tp_comm(g, tp, cp, mbs)
        # host issue floor: a pass never runs faster than the host issues its kernels (backward: twice as many)
        n_kernels = (
            len(g.attention)
            + len(g.mlp)
            + len(g.shared)
            + (1 if self.flash else 3)
            + kernels
            + 2 * blocks * (tp > 1)
        )
        host_f = max(0.0, n_kernels * self.host_s - (attn_lin + mlp_lin + core_f + other_f + tp_f))
        host_b = max(
            0.0, 2 * n_kernels * self.host_s - (2 * (attn_lin + mlp_lin) + core_b + 2 * other_f + tp_b)
        )
        cp_f, cp_b = self._cp_comm(tp, cp, mbs, core_f, core_b)
        ep_f, ep_b = self._ep_comm(tp, cp, ep, mbs, dispatcher) if g.grouped else (0.0, 0.0)
        lay = _Layer(
            attn_lin,
            core_f,
            core_b,
            mlp_lin,
            other_f,
            tp_f,
            tp_b,
            tp_b_zb,
            cp_f,
            cp_b,
            ep_f,
            ep_b,
            expert_f,
            host_f,
            host_b,
        )
        self.layers[key] = lay
        return lay

    def _linear(self, g: LayerGemms) -> tuple[float, float, float]:
        """Forward seconds of the layer's linear GEMMs: (attention projections, MLP or router + experts + shared
        experts, the experts' grouped GEMMs alone)."""
        attn_lin = sum(self.gemm(x) for x in g.attention)
        if g.grouped:
            router, *experts = g.mlp
            expert_f = sum(self.gemm(x, grouped=True) for x in experts)
            mlp_lin = self.gemm(router, linear=False) + expert_f
        else:
            expert_f = 0.0
            mlp_lin = sum(self.gemm(x) for x in g.mlp)
        mlp_lin += sum(self.gemm(x) for x in g.shared)  # shared experts: a TP-split dense MLP
        return attn_lin, mlp_lin, expert_f

    def _flash_attention(self, g: LayerGemms, tp: int, cp: int, mbs: int) -> tuple[float, float]:
        """(forward, backward) seconds of fused flash attention at the family's attention curve, indexed by the
        keys each query sees (per kind of layer: full causal, sliding window).

        Context parallelism as TransformerEngine runs it (ModelSpec.cp_comm_type): the p2p ring (load-balanced:
        the sequence cut in 2·cp chunks) runs 2·cp − 1 kernels per pass over at most seq/(2·cp) keys per query
        each (the slowest rank's steps: one chunk of keys for all its queries), each followed by an output/LSE
        correction (read and write the fp32 partial output and the LSE); a2a runs one kernel over the whole
        sequence for heads/cp."""
        md, k = self.model, self.k
        heads_per_mbs = md.num_attention_heads / tp
        a2a = cp > 1 and self.cp_a2a
        n_kern = 1 if a2a else 2 * cp - 1
        correction = 0.0
        if cp > 1 and not a2a:
            out_elems = mbs * (self.seq / cp) * heads_per_mbs * md.head_dim
            correction = (cp - 1) * (3 * out_elems * 4 / self.hbm + self.kernel_s)
        fixed = n_kern * self.kernel_s + correction
        width = self.attn_head_width
        core_f = core_b = fixed
        rate_f, rate_b = self.attn_rates
        for share, pairs in self.attn_mix:
            # FP8 attention's backward may visit more pairs than the mask keeps (Fp8AttentionRates)
            pairs_b = self.fp8_attn.backward_pairs(pairs, self.full_pairs) if self.fp8_attn else pairs
            for bwd, p in ((False, pairs), (True, pairs_b)):
                fl = share * g.core_attention_flops * p / self.mean_pairs
                span = p / self.seq if a2a else min(p / self.seq, self.seq / (2 * cp))
                t = flash_attention_seconds(
                    k.attention_bwd if bwd and k.attention_bwd is not None else k.attention,
                    fl,
                    self.bf16_peak * (rate_b if bwd else rate_f),
                    width,
                    span=span,
                    backward=bwd,
                    bwd_rate=k.attention_bwd_rate,
                )
                if bwd:
                    core_b += t
                else:
                    core_f += t
        return core_f, core_b

    def _unfused_attention(self, tp: int, cp: int, mbs: int) -> tuple[float, float]:
        """(forward, backward) seconds of unfused attention: the full s x s score GEMMs QK^T and PV (masked, not
        skipped), batched over heads, at the GEMM curve, plus the traffic over the materialised 16-bit scores
        (Megatron's ParallelAttention, megatron/model/transformer.py@488f8c02:319-372): forward baddbmm writes
        the scores (2 B), the fused scale-mask-softmax reads and writes them (4), the dropout reads and writes
        them and writes its 1-byte mask (5), P·V reads them (2): 13 B per score; backward: dP written (2), P
        read for dV (2), dropout backward (5), softmax backward (read the output and the grad, write: 6), dS
        read for dQ and dK (4): 19 B."""
        heads = mbs * (self.model.num_attention_heads / tp)
        sq = self.seq / cp
        score_gemm = Gemm(sq, self.seq, self.model.head_dim, heads)
        gemm_t = 2 * self.gemm(score_gemm, linear=False)
        scores = heads * sq * self.seq
        core_f = gemm_t + UNFUSED_FWD_BYTES * scores / self.hbm + 4 * self.kernel_s
        core_b = 2 * gemm_t + UNFUSED_BWD_BYTES * scores / self.hbm + 5 * self.kernel_s
        return core_f, core_b

    def _memory_bound(self, g: LayerGemms, tp: int, cp: int, mbs: int) -> tuple[float, int]:
        """Forward seconds of the layer's memory-bound kernels (norms, residuals, rotary, dropout, activation,
        MoE routing and permutation, FP8 casts) at HBM bandwidth plus a fixed cost per kernel, and how many
        kernels they are."""
        md = self.model
        d = md.head_dim
        h = md.hidden_size
        tokens = mbs * self.seq / cp
        local = rank_tokens(tokens, tp, self.sp)
        a, kv = md.num_attention_heads / tp, md.query_groups / tp
        nbytes = 20 * local * h * ACT / 2  # 2 norms (read+write) + 2 residual adds (2 reads, 1 write)
        nbytes += self.rope_passes * tokens * (a + kv) * d * ACT
        # Q, K and V elements per token as core attention sees them (MLA: Q and K qk + rope wide, V v wide)
        qkv_elems = (
            a * (2 * (md.qk_head_dim + md.qk_pos_emb_head_dim) + self.v_dim)
            if md.multi_latent_attention
            else (a + 2 * kv) * d
        )
        if self.dropout:
            nbytes += 2 * local * h * (2 * ACT + 1)
        if g.grouped:
            copies = local * md.moe_router_topk
            nbytes += expert_act_bytes(md, copies, self.eager_clamp)
            nbytes += permute_bytes(md, copies, local)
            kernels = KERNELS_MOE + (3 if self.eager_clamp else 0)  # the clamp's two clamps and the cat
            if self.bias_loop:  # the experts' output bias, per local expert (EXPERT_BIAS_BYTES)
                nbytes += EXPERT_BIAS_BYTES * copies * h
                kernels += 2 * round(g.mlp[1].count) + 2
            if g.shared:
                nbytes += 3 * tokens * md.shared_expert_ffn / tp * ACT * (1 if md.swiglu else 2 / 3)
        else:
            nbytes += 3 * tokens * md.ffn_hidden_size / tp * ACT * (1 if md.swiglu else 2 / 3)
            kernels = KERNELS_DENSE
        if self.fp8:
            # TransformerEngine casts each linear layer's input to FP8 (read bf16, write fp8, amax) in forward;
            # backward casts and transposes the output gradient (counted by backward's 2x of these kernels)
            lin_inputs = list(g.attention + g.mlp[(1 if g.grouped else 0) :] + g.shared)
            nbytes += sum(x.m * x.k * x.count * self.cast_bytes for x in lin_inputs)
            kernels += len(lin_inputs)
        if self.fp8_attn is not None:
            # FP8 attention's inputs outside the kernel (cuDNN's FP8 kernels take FP8 Q, K, V: the SDPA benchmark
            # times the kernel alone): Q, K, V cast to FP8, under MXFP8 both a row-wise and a column-wise copy
            # for backward (TE combine_and_quantize, dot_product_attention/utils.py@d0067d0d:3014-3111); under
            # delayed scaling the FP8 output read back to BF16 (current scaling and MXFP8 kernels write BF16;
            # backends.py@d0067d0d:1502-1561). Backward's dO cast: backward's 2x of these kernels
            recipe = self.fp8_recipe
            o_bytes = a * self.v_dim * (1 + ACT) if recipe == "delayed" else 0.0
            nbytes += tokens * (qkv_elems * (self.cast_bytes + (1 if recipe == "mxfp8" else 0)) + o_bytes)
            kernels += 2 if o_bytes else 1
        kernels += self.rope_kernels
        return nbytes / self.hbm + kernels * self.kernel_s, kernels

    def _tp_comm(self, g: LayerGemms, tp: int, cp: int, mbs: int) -> tuple[float, float, float, int]:
        """Exposed TP communication (forward, backward, backward with the weight gradient deferred) and the
        number of TP blocks, with sequence parallelism as TransformerEngine runs it, per block (attention; MLP
        unless MoE with etp = 1): forward all-gather of the norm output (FP8 under FP8) before the
        column-parallel GEMM and reduce-scatter after the row-parallel one; backward the synchronous all-gather
        of the output grad (row-parallel dgrad), the input re-gather for the column-parallel wgrad (hidden
        under its dgrad) and the dgrad reduce-scatter (hidden under its wgrad, exposed when wgrad is deferred:
        zero-bubble). tp_comm_overlap (userbuffers) hides the others under their adjacent GEMMs. Hidden time
        still costs the interference fraction."""
        k, topo = self.k, self.topo
        tokens = mbs * self.seq / cp
        sp = tp > 1 and self.sp
        full = tokens * self.model.hidden_size * ACT
        tp_grp = Group(tp, 1)
        keep = 1.0 - k.overlap_interference
        ag = topo.all_gather(full, tp_grp)
        ag_in = topo.all_gather(full * self.lin_bytes / ACT, tp_grp)
        rs = topo.reduce_scatter(full, tp_grp)
        # blocks: attention (MLA: first and last projection), the dense MLP, or an MoE layer's shared experts
        mlp_block = g.shared if g.grouped else g.mlp
        cols = [self.gemm(g.attention[0])] + ([self.gemm(mlp_block[0])] if mlp_block else [])
        rows = [self.gemm(g.attention[-1])] + ([self.gemm(mlp_block[1])] if mlp_block else [])
        tp_f = tp_b = tp_b_zb = 0.0
        uo = (
            self.spec.workload.tp_comm_overlap and sp
        )  # Megatron: --tp-comm-overlap needs sequence parallelism
        ar = 0.0 if sp else topo.all_reduce(full, tp_grp)
        for col, row in zip(cols, rows, strict=True):
            if not sp:
                # Megatron without sequence parallelism (Korthikanti 2022 §4.2): the row-parallel output is
                # all-reduced in forward (exposed); the column-parallel input gradient is all-reduced in
                # backward, asynchronously under its weight-gradient GEMM (Megatron's async grad all-reduce;
                # exposed when wgrad is deferred)
                tp_f += ar
                tp_b += ar - keep * min(ar, col)
                tp_b_zb += ar
                continue
            if uo:
                tp_f += ag_in - keep * min(ag_in, col) + rs - keep * min(rs, row)
                grad_ag = ag - keep * min(ag, row)
            else:
                tp_f += ag_in + rs
                grad_ag = ag
            regather = ag_in - keep * min(ag_in, col)
            tp_b += grad_ag + regather + rs - keep * min(rs, col)
            tp_b_zb += grad_ag + regather + rs
        tp_f *= 1.0 - k.tp_overlap
        tp_b *= 1.0 - k.tp_overlap
        tp_b_zb *= 1.0 - k.tp_overlap
        return tp_f, tp_b, tp_b_zb, len(cols)

    def _cp_comm(self, tp: int, cp: int, mbs: int, core_f: float, core_b: float) -> tuple[float, float]:
        """Exposed CP communication (forward, backward): ring exchange of this rank's K/V chunk (cp - 1 steps),
        backward also moves dK/dV, hidden under the core attention up to ``cp_overlap``. a2a (TE
        AttnFuncWithCPAndQKVOA2A, context_parallel.py@d0067d0d:4170-4923): all-to-alls of Q, K, V before the
        kernel and of O after it, of dO and of dQ, dK, dV in backward, none hidden."""
        if cp <= 1:
            return 0.0, 0.0
        md, topo = self.model, self.topo
        d = md.head_dim
        tokens = mbs * self.seq / cp
        a, kv = md.num_attention_heads / tp, md.query_groups / tp
        cp_grp = Group(cp, tp)
        if self.cp_a2a:
            qkv = tokens * (a + 2 * kv) * d * ACT
            o = tokens * a * self.v_dim * ACT
            cp_f = topo.all_to_all(qkv, cp_grp) + topo.all_to_all(o, cp_grp)
            cp_b = topo.all_to_all(o, cp_grp) + topo.all_to_all(qkv, cp_grp)
            return cp_f, cp_b
        step = topo.p2p(tokens * 2 * kv * d * ACT, cp_grp)
        lat = (cp - 1) * (topo.intra_lat if topo.intra(cp_grp) else topo.inter_lat)
        cp_f = max(lat, (cp - 1) * step - self.k.cp_overlap * core_f)
        cp_b = max(lat, 2 * (cp - 1) * step - self.k.cp_overlap * core_b)
        return cp_f, cp_b

    def _ep_comm(self, tp: int, cp: int, ep: int, mbs: int, dispatcher: str) -> tuple[float, float]:
        """Exposed EP communication of an MoE layer (forward, backward): dispatch + combine per pass, all-to-all
        or DeepEP; the compute stream waits for them (no overlap with the same micro-batch's experts: only
        ``ep_overlap`` hides them, behind another micro-batch), and the host waits for the token counts once
        per dispatch, forward only."""
        md, k, topo = self.model, self.k, self.topo
        local = rank_tokens(mbs * self.seq / cp, tp, self.sp)
        h = md.hidden_size
        ep_grp = Group(ep, 1)
        sync = k.moe_sync_us * 1e-6
        if dispatcher == "deepep":
            one = topo.deepep_dispatch(
                local,
                h * ACT,
                md.moe_router_topk,
                md.experts,
                ep_grp,
                k.deepep_intra_eff,
                k.deepep_inter_eff,
                md.moe_router_num_groups,
                md.moe_router_group_topk,
            )
            sync_f = 0.0 if self.spec.workload.moe_sync_free else sync
        else:
            one = topo.all_to_all(local * md.moe_router_topk * h * ACT, ep_grp)
            sync_f = sync
        return 2 * one + sync_f, 2 * one

    def logits_times(self, tp: int, cp: int, mbs: int) -> tuple[float, float, float]:
        """(F, B, W) of the output layer + cross entropy on the last stage (BF16 GEMMs; MXFP8 with
        ``workload.fp8_output_proj``)."""
        key = (tp, cp, mbs)
        r = self.logits.get(key)
        if r is None:
            g = logits_gemm(self.model, self.seq, mbs, tp, cp)
            t = self.gemm(g, linear=self.fp8_output_proj)
            cast_f = cast_b = 0.0
            if self.fp8_output_proj:
                # TE's Linear under the MXFP8 recipe (TELMHeadColumnParallelLinear): forward casts its input,
                # backward the logits' gradient, row-wise for dgrad and column-wise for wgrad (read BF16, write
                # two FP8 copies), each a memory-bound kernel
                cast_f = g.m * g.k * self.cast_bytes / self.hbm + self.kernel_s
                cast_b = g.m * g.n * (self.cast_bytes + 1) / self.hbm + self.kernel_s
            ce = g.m * g.n * (ACT + 4 + 4) / self.hbm + 4 * self.kernel_s  # vocab-parallel cross entropy
            # sequence parallelism: the final norm output is all-gathered before the output layer, and its
            # input gradient reduce-scattered in backward; without it the input gradient is all-reduced in
            # backward, under the output layer's weight-gradient GEMM
            full = g.m * self.model.hidden_size * ACT
            if tp > 1 and self.sp:
                sp_f = sp_b = self.topo.all_gather(full, Group(tp, 1))
            elif tp > 1:
                ar = self.topo.all_reduce(full, Group(tp, 1))
                sp_f, sp_b = 0.0, ar - (1.0 - self.k.overlap_interference) * min(ar, t)
            else:
                sp_f = sp_b = 0.0
            r = self.logits[key] = (t + ce + sp_f + cast_f, t + ce + sp_b + cast_b, t)
        return r

    def mix(self, pp: int, vpp: int, schedule: str) -> list[StageMix]:
        """Per stage the dense/MoE/MTP layers it holds (the study's pipeline layout)."""
        key = (pp, vpp, schedule)
        mx = self.mixes.get(key)
        if mx is None:
            md = self.model
            mx = stage_mixes(md, self.spec.pipeline, pp, vpp, schedule) or even_fallback(
                md, pp, vpp, schedule, ceil=True
            )
            self.mixes[key] = mx
        return mx

    def pipeline(self, pp: int, vpp: int, schedule: str) -> tuple[ChunkMix, float]:
        """The chunks' mix of kinds (:func:`.layer_mix.chunk_counts`: the model's own layers, an MoE model's dense
        layers if it has any, output layers) and the decoder + MTP layers per chunk, averaged over the chunks."""
        key = (pp, vpp, schedule)
        r = self.pipelines.get(key)
        if r is None:
            counts = chunk_counts(self.model, self.spec.pipeline, pp, vpp, schedule)
            if not self.mixed_kinds:
                counts = tuple((main, heads) for main, _, heads in counts)
            per_chunk = sum(sum(row[:-1]) for row in counts) / len(counts)
            r = self.pipelines[key] = (chunk_mix(schedule, pp, vpp, counts), per_chunk)
        return r

    def stage_params(self, tp: int, pp: int, ep: int, mx: StageMix) -> tuple[float, float]:
        """(dense, expert) parameters on one rank of a stage holding ``mx``."""
        key = (tp, pp, ep, mx)
        r = self.params.get(key)
        if r is not None:
            return r
        md = self.model
        lm, ld = rank_layer_params(md, tp, ep, True), rank_layer_params(md, tp, ep, False)
        n_moe = mx.moe + mx.mtp
        ends = (embedding_params(self.spec, tp) if mx.embedding else 0) + (
            output_params(self.spec, tp, pp) if mx.loss else 0
        )
        r = self.params[key] = (
            n_moe * lm.dense + mx.dense * ld.dense + ends,
            n_moe * lm.expert + mx.dense * ld.expert,
        )
        return r

    def dp_collectives(
        self, tp: int, pp: int, ep: int, cp: int, dp: int, mx: StageMix, shard: int = 1
    ) -> tuple[float, float, float]:
        """(gradient reduce, parameter gather, local parameters) of one step on the busiest stage ``mx``; under
        FSDP over ``shard`` ranks the per-layer collectives are :func:`fsdp_layer_collectives` and what is
        left after the pipeline is HSDP's all-reduce of the gradient shards over the dp/shard replicas."""
        key = (tp, pp, ep, cp, dp, mx) if shard == 1 else (tp, pp, ep, cp, dp, mx, shard)
        r = self.dp_coll.get(key)
        if r is not None:
            return r
        topo = self.topo
        dense, expert = self.stage_params(tp, pp, ep, mx)
        dp_grp = Group(dp * cp, tp)
        edp = max(1, (tp * cp * dp) // ep)
        edp_grp = Group(edp, ep)
        if shard > 1:
            eshard = max(1, (tp * cp * shard) // ep)
            replicas = Group(max(1, dp // shard), tp * cp * shard)
            rs = topo.all_reduce(dense / (shard * cp) * self.grad_bytes, replicas, True) + topo.all_reduce(
                expert / eshard * self.grad_bytes, replicas, True
            )
            r = self.dp_coll[key] = (
                rs if replicas.size > 1 else 0.0,
                0.0,
                dense / (shard * cp) + expert / eshard,
            )
            return r
        if self.spec.workload.distributed_optimizer:
            rs = topo.reduce_scatter(dense * self.grad_bytes, dp_grp, True) + topo.reduce_scatter(
                expert * self.grad_bytes, edp_grp, True
            )
            ag = topo.all_gather(dense * self.gather_bytes, dp_grp, True) + topo.all_gather(
                expert * self.gather_bytes, edp_grp, True
            )
            local = dense / (dp * cp) + expert / edp
        else:
            rs = topo.all_reduce(dense * self.grad_bytes, dp_grp, True) + topo.all_reduce(
                expert * self.grad_bytes, edp_grp, True
            )
            ag = 0.0
            local = dense + expert
        r = self.dp_coll[key] = (rs, ag, local)
        return r


_context = per_spec(_Context)


def fsdp_layer_collectives(
    ctx: _Context, tp: int, pp: int, cp: int, ep: int, shard: int
) -> tuple[tuple[float, float], ...]:
    """FSDP over ``shard`` ranks: per kind of layer, then the output layer, (parameter all-gather, gradient
    reduce-scatter) seconds of one micro-batch. Dense parameters are sharded over shard·cp ranks (inner tp),
    expert parameters over shard·cp·tp/ep (inner ep): TorchTitan's ``fsdp`` and ``efsdp`` meshes
    (torchtitan/distributed/parallel_dims.py@b5bcd76c:280-281, 380). Gathered in 16-bit (FP8 with
    ``fp8_param_gather``), reduced in the main-grad dtype, across nodes by the comm model."""
    key = (tp, pp, cp, ep, shard)
    r = ctx.fsdp.get(key)
    if r is not None:
        return r
    topo, md = ctx.topo, ctx.model
    dense_grp = Group(shard * cp, tp)
    expert_grp = Group(max(1, (tp * cp * shard) // ep), ep)

    def pair(dense: float, expert: float) -> tuple[float, float]:
        ag = topo.all_gather(dense * ctx.gather_bytes, dense_grp, True)
        rs = topo.reduce_scatter(dense * ctx.grad_bytes, dense_grp, True)
        if expert:
            ag += topo.all_gather(expert * ctx.gather_bytes, expert_grp, True)
            rs += topo.reduce_scatter(expert * ctx.grad_bytes, expert_grp, True)
        return ag, rs

    kinds = (True, False) if ctx.mixed_kinds else (ctx.is_moe,)
    rows = [pair(p.dense, p.expert) for p in (rank_layer_params(md, tp, ep, moe) for moe in kinds)]
    rows.append(pair(output_params(ctx.spec, tp, pp), 0))
    r = ctx.fsdp[key] = tuple(rows)
    return r


def _fsdp_exposed(
    ctx: _Context,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    shard: int,
    f_pass: list[float],
    b_pass: list[float],
    keep: float,
) -> list[float]:
    """FSDP's per-layer collectives (per kind, then the output layer): the gather for the next unit is
    prefetched under this one's compute (forward and backward), the gradient reduce-scatter runs under the
    backward too; what the compute cannot hide is exposed, and the hidden part costs the interference fraction.
    Returns the exposed seconds per unit (forward + backward) of each micro-batch without pipeline parallelism,
    where they are added to each pass; with pp > 1 of the step, once: the stage stays unsharded between
    micro-batches and reduce-scatters after the last (TorchTitan turns reshard-after-forward off with PP,
    torchtitan/distributed/fsdp.py@b5bcd76c:129-131; torch's pipeline stage reduces on the last micro-batch
    only, torch/distributed/pipelining/stage.py@2.13.0:844-847)."""
    extra = []
    for j, (ag, rs) in enumerate(fsdp_layer_collectives(ctx, tp, pp, cp, ep, shard)):
        if pp > 1:  # one gather (the forward's, backward kept unsharded) and one reduce-scatter per step
            extra.append(ag + rs - keep * min(ag + rs, f_pass[j] + b_pass[j]))
            continue
        f = ag - keep * min(ag, f_pass[j])
        b = ag + rs - keep * min(ag + rs, b_pass[j])
        f_pass[j] += f
        b_pass[j] += b
        extra.append(f + b)
    return extra


def recompute_seconds(
    ctx: _Context, lay: _Layer, recompute: str, tp: int, cp: int, mbs: int, per_chunk: float
) -> float:
    """Forward time re-run in backward per layer and micro-batch: exactly what ``recompute`` drops.

    ``full``: the whole layer forward (with its TP/CP/EP communication); ``full:N``: that, for N of each
    chunk's ``per_chunk`` layers; selective modules: ``core_attn`` the flash attention forward, ``moe_act``
    the expert activation (memory-bound: read 2F, write F per routed copy), ``layernorm`` the pre-MLP norm,
    ``mlp`` the dense MLP (GEMMs, activation, its TP all-gather), ``moe`` the whole MoE block: router,
    experts, activation, permutation and both expert all-to-alls. ``shared_experts``/``mla_up_proj``: see
    :func:`_mla_shared_recompute_seconds`.
    """
    r = parse_recompute(recompute)
    if r.granularity == "none":
        return 0.0
    if r.is_full:
        f_layer = lay.attn_lin + lay.mlp_lin + lay.core_f + lay.other_f + lay.tp_f + lay.cp_f + lay.ep_f
        return f_layer * (min(r.num_layers, per_chunk) / per_chunk if r.num_layers else 1.0)
    md = ctx.model
    tokens = mbs * ctx.seq / cp
    local = rank_tokens(tokens, tp, ctx.sp)
    h = md.hidden_size
    rec = 0.0
    if r.has("core_attn"):
        rec += lay.core_f
    if md.is_moe:
        copies = local * md.moe_router_topk
        # the clamp is inside the recomputed function
        act = expert_act_bytes(md, copies, ctx.eager_clamp) / ctx.hbm + ctx.kernel_s
        if r.has("moe"):
            permute = permute_bytes(md, copies, local) / ctx.hbm + 4 * ctx.kernel_s
            rec += lay.mlp_lin + act + permute + lay.ep_f
        elif r.has("moe_act"):
            rec += act
    elif r.has("mlp"):
        act = 3 * tokens * md.ffn_hidden_size / tp * ACT / ctx.hbm + ctx.kernel_s
        rec += lay.mlp_lin + act + lay.tp_f / 2  # the MLP block's sequence-parallel all-gather
    if r.has("layernorm"):
        rec += 4 * local * h * ACT / ctx.hbm + ctx.kernel_s
    return rec


def estimate_throughput(
    spec: StudySpec, config: Any, calibration: Calibration | None = None
) -> ThroughputEstimate:
    """Step time, tokens/s/GPU, MFU and the exposed-time breakdown of ``config`` under ``spec``.

    The config should be legal (:meth:`Space.check`); ``dp``/``num_microbatches`` are derived when missing.
    Each model chunk holds the layers the study's pipeline layout gives it (MoE, dense and MTP layers and the
    output layers, timed by kind), and the pipeline is simulated with each chunk's own durations
    (:func:`.pipeline.mixed_pipeline_timing`); the breakdown is the busiest stage's. A split the layout does not
    allow is estimated with ``ceil(L / (pp·v))`` layers per chunk.
    """
    return _estimate(_context(spec), config, calibration)


def estimate_throughput_all(
    spec: StudySpec, configs: list[Any], calibration: Calibration | None = None
) -> list[ThroughputEstimate]:
    """:func:`estimate_throughput` of each configuration (the same estimates; for ranking whole spaces)."""
    ctx = _context(spec)
    return [_estimate(ctx, c, calibration) for c in configs]


_LAYOUT = attrgetter(*(a for a in AXES if a not in ("recompute", "ep_overlap")), "dp", "num_microbatches")


def layout_of(config: Any) -> tuple[Any, ...]:
    """The axes that :func:`throughput_bound` needs configurations to share (all but the recompute value and
    ``ep_overlap``), with dp and the micro-batch count."""
    return _LAYOUT(config)


def throughput_bound(spec: StudySpec, configs: Sequence[Any], bubble: bool = True) -> float:
    """An upper bound on the uncalibrated :func:`estimate_throughput` ``tokens_per_s_per_gpu`` of every one of
    ``configs`` (alike in :func:`layout_of`; their recompute values and ``ep_overlap`` may differ), at a
    fraction of an estimate's cost: the step is at least the pipeline's
    (:func:`~.pipeline.step_lower_bound`, with the pass durations of the fastest and the slowest of them) and
    what follows it (:func:`_after_pipeline_least`), the gradient additions being non-negative. For finding
    the best of a space without estimating every configuration (:func:`~.plan.best_fitting`).

    ``bubble=False``: a looser bound, cheaper, of every configuration of the first one's layout (whatever its
    recompute value and ``ep_overlap``): the pipeline's busy time with the passes at their fastest."""
    ctx = _context(spec)
    _, pp, _, _, lkey, dp, m, zb, lo, _ = _layout(ctx, configs[0])
    sh = lo.shape
    w = sh.w_pass if zb else sh.no_w
    c = _send_seconds(ctx, lkey[0], lkey[3], lkey[4], pp, dp)
    if not bubble:  # recomputing re-runs a non-negative time; ep_overlap hides at most what it does with it
        f_lo, b_lo = sh.f_pass, sh.b_pass_zb if zb else sh.b_pass
        if ctx.is_moe:
            (f0, b0), (f1, b1) = _ep_exposed(ctx, sh, m, pp, False), _ep_exposed(ctx, sh, m, pp, True)
            f_lo = (f_lo[0] + min(f0, f1), *f_lo[1:])
            b_lo = (b_lo[0] + min(b0, b1), *b_lo[1:])
        step = step_lower_bound(lo.mix, m, (f_lo, b_lo, w), None, c)
        return ctx.tokens_per_step / step / ctx.world if step > 0 else math.inf
    b_least, b_most = _b_range(ctx, lkey, lo, {"none" if zb else x.recompute for x in configs}, zb)
    b_lo, b_hi = list(b_least), list(b_most)
    f_lo, f_hi = list(sh.f_pass), list(sh.f_pass)
    if ctx.is_moe:
        ep = [
            _ep_exposed(ctx, sh, m, pp, o) for o in {bool(getattr(x, "ep_overlap", False)) for x in configs}
        ]
        f_lo[0] += min(e[0] for e in ep)
        f_hi[0] += max(e[0] for e in ep)
        b_lo[0] += min(e[1] for e in ep)
        b_hi[0] += max(e[1] for e in ep)
    step = step_lower_bound(lo.mix, m, (f_lo, b_lo, w), (f_hi, b_hi, w), c)
    # FSDP's per-layer collectives only add to the passes (non-negative): left out, the bound stays below
    step += _after_pipeline_least(ctx, lkey, lo, dp, zb, getattr(configs[0], "dp_shard", 1))
    return ctx.tokens_per_step / step / ctx.world if step > 0 else math.inf


def _layout(ctx: _Context, config: Any) -> tuple[Any, ...]:
    """(tp, pp, cp, mbs, layout key, dp, m, zero-bubble, layout terms, recompute value run) of ``config``."""
    tp, pp, ep, cp, mbs = config.tp, config.pp, config.ep, config.cp, config.mbs
    schedule = config.pp_schedule if pp > 1 else "1f1b"
    if schedule in ("zb1p", "zbv") and not ctx.gaf:
        schedule = "1f1b"  # Primus: zero-bubble needs gradient_accumulation_fusion, else plain 1F1B runs
    vpp = chunks_per_stage(schedule, config.vpp)
    dp = config.dp or max(1, ctx.world // (tp * cp * pp))
    m = config.num_microbatches or max(1, ctx.gbs // (mbs * dp))
    dispatcher = config.moe_dispatcher if ctx.is_moe else "alltoall"
    zb = schedule in ("zb1p", "zbv")
    lkey = (tp, pp, ep, cp, mbs, vpp, schedule, dispatcher)
    lo = ctx.layouts.get(lkey)
    if lo is None:
        lo = ctx.layouts[lkey] = _layout_terms(ctx, tp, pp, ep, cp, mbs, vpp, schedule, dispatcher)
    return tp, pp, cp, mbs, lkey, dp, m, zb, lo, "none" if zb else config.recompute


def _passes(ctx: _Context, config: Any) -> tuple[Any, ...]:
    """(tp, pp, cp, mbs, layout key, dp, m, zero-bubble, layout terms, recompute seconds per kind, B passes
    with them) of ``config``: what :func:`_estimate` and :func:`throughput_bound` share."""
    tp, pp, cp, mbs, lkey, dp, m, zb, lo, recompute = _layout(ctx, config)
    recs, b_rec = _recomputed(ctx, lkey, lo, recompute, zb)
    return tp, pp, cp, mbs, lkey, dp, m, zb, lo, recs, b_rec


def _recomputed(
    ctx: _Context, lkey: tuple[Any, ...], lo: _LayoutTerms, recompute: str, zb: bool
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(recompute seconds per kind, B passes with them) of a layout under a recompute value (memoised)."""
    # one layer of each kind (the model's own, an MoE model's dense layers), then the output layer, one
    # micro-batch: F, B (with what the recompute value re-runs) and W passes
    rkey = (lkey, recompute)
    hit = ctx.recs.get(rkey)
    if hit is None:
        sh = lo.shape
        recs = _recompute_per_kind(ctx, sh, recompute, lkey[0], lkey[3], lkey[4], lo.per_chunk)
        # the B passes with what the recompute value re-runs (the output layer re-runs nothing)
        base = sh.b_pass_zb if zb else sh.b_pass
        hit = ctx.recs[rkey] = (recs, (*(b + r for b, r in zip(base, recs, strict=False)), base[-1]))
    return hit


def _recompute_per_kind(
    ctx: _Context, sh: _ShapeTerms, recompute: str, tp: int, cp: int, mbs: int, per_chunk: float
) -> tuple[float, ...]:
    """Per kind of layer, the seconds ``recompute`` re-runs per layer and micro-batch."""
    return tuple(
        recompute_seconds(ctx, x.lay, recompute, tp, cp, mbs, per_chunk)
        + _mla_shared_recompute_seconds(ctx, recompute, tp, cp, mbs, x.moe)
        for x in sh.kinds
    )


def _b_range(
    ctx: _Context, lkey: tuple[Any, ...], lo: _LayoutTerms, recomputes: set[str], zb: bool
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The least and the most each B pass of a layout lasts under any of the recompute values: without
    recomputing, and with the most any of them re-runs (``full:N`` re-runs at most what ``full`` does; memoised
    per shape)."""
    if len(recomputes) == 1:
        b_rec = _recomputed(ctx, lkey, lo, next(iter(recomputes)), zb)[1]
        return b_rec, b_rec
    sh = lo.shape
    values = frozenset("full" if parse_recompute(r).is_full else r for r in recomputes)
    key = (lkey[0], lkey[3], lkey[2], lkey[4], lkey[7], values)
    most = ctx.rec_most.get(key)
    if most is None:
        recs = [_recompute_per_kind(ctx, sh, r, lkey[0], lkey[3], lkey[4], 1.0) for r in values]
        most = ctx.rec_most[key] = tuple(max(col) for col in zip(*recs, strict=True))
    base = sh.b_pass_zb if zb else sh.b_pass
    return base, (*(b + r for b, r in zip(base, most, strict=False)), base[-1])


def _ep_exposed(ctx: _Context, sh: _ShapeTerms, m: int, pp: int, overlap: bool) -> tuple[float, float]:
    """The exposed expert-parallel dispatch/combine of one MoE layer and micro-batch, forward and backward."""
    x = sh.kinds[0]  # the model's own kind (the first) holds the MoE layers
    lay = x.lay
    ep_f, ep_b = lay.ep_f, lay.ep_b
    if overlap:
        # Megatron's --overlap-moe-expert-parallel-comm: in the steady state one micro-batch's forward runs
        # with another's backward, so the forward's dispatch/combine hides under the backward's compute and
        # vice versa, never more than that compute, and the hidden part still costs the interference
        # fraction
        keep = 1.0 - ctx.k.overlap_interference
        steady = max(0, m - (pp if pp > 1 else 1)) / m
        comp_f = x.lin + lay.core_f + lay.other_f
        comp_b = 2 * x.lin + lay.core_b + 2 * lay.other_f
        ep_f -= steady * keep * min(ep_f, comp_b)
        ep_b -= steady * keep * min(ep_b, comp_f)
    return ep_f, ep_b


def _send_seconds(ctx: _Context, tp: int, cp: int, mbs: int, pp: int, dp: int) -> float:
    """One pipeline send of a micro-batch's activations (memoised)."""
    ckey = (tp, cp, mbs, pp, dp)
    c = ctx.p2p.get(ckey)
    if c is None:
        msg = mbs * ctx.seq / cp * ctx.model.hidden_size / tp * ACT
        c = ctx.p2p[ckey] = ctx.topo.p2p(msg, Group(pp, tp * cp * dp)) if pp > 1 else 0.0
    return c


def _estimate(ctx: _Context, config: Any, calibration: Calibration | None) -> ThroughputEstimate:
    tp, pp, cp, mbs, lkey, dp, m, zb, lo, recs, b_rec = _passes(ctx, config)
    k = ctx.k
    is_moe = ctx.is_moe
    keep = 1.0 - k.overlap_interference
    sh = lo.shape
    f_pass = list(sh.f_pass)
    b_pass = list(b_rec)
    ep_step = 0.0  # exposed dispatch/combine of one MoE layer and micro-batch
    if is_moe:  # the model's own kind (the first) holds the MoE layers
        ep_f, ep_b = _ep_exposed(ctx, sh, m, pp, getattr(config, "ep_overlap", False))
        f_pass[0] += ep_f
        b_pass[0] += ep_b
        ep_step = ep_f + ep_b

    shard = getattr(config, "dp_shard", 1)
    fsdp = _fsdp_exposed(ctx, tp, pp, cp, config.ep, shard, f_pass, b_pass, keep) if shard > 1 else None

    # pipeline
    c = _send_seconds(ctx, tp, cp, mbs, pp, dp)
    timing = mixed_pipeline_timing(lo.mix, m, f_pass, b_pass, sh.w_pass if zb else sh.no_w, c)
    s = timing.stage
    klass = lo.mix.stage_class[s]
    # the busiest stage: its layers of each kind (then its output layers), its data-parallel collectives and
    # optimizer step (after the pipeline), and its compute terms per micro-batch
    st = _class_terms(ctx, lkey, lo, klass, dp, zb, shard)
    counts, dense, expert, rs, ag, optimizer, attention, mlp, other, tp_t, cp_t = st
    # Primus's zero-bubble schedules run with the DP grad-reduce/param-gather overlap off (asserted with the
    # distributed optimizer): the whole reduce-scatter and all-gather are exposed
    if ctx.overlap_grad_reduce and not zb:
        # hidden under the last micro-batch's backward / first forward (the stage's layers), less the
        # interference fraction
        bwd_window = fwd_window = 0.0
        for j in range(len(sh.kinds)):  # (W inside B: not zero-bubble)
            bwd_window += counts[j] * b_pass[j]
            fwd_window += counts[j] * f_pass[j]
        dp_exposed = rs - keep * min((1 - k.dp_tail) * rs, bwd_window)
        dp_exposed += ag - keep * min((1 - k.dp_tail) * ag, fwd_window)
    else:  # Megatron's default: the reduce after the last backward, the gather before the first forward
        dp_exposed = rs + ag
    grad_add = 0.0
    if not ctx.gaf:
        # the wgrad GEMM writes a 16-bit grad that a hook adds into the main grad (read it, read and write the
        # main grad: fp32, or fp16/bf16 without grad_reduce_in_fp32), per micro-batch (Megatron before
        # gradient accumulation fusion: ``param.main_grad.add_(param.grad.data)``,
        # ``megatron/model/distributed.py@488f8c02``:174)
        grad_add = m * (dense + expert) * (ACT + 2 * ctx.grad_bytes) / ctx.hbm

    # breakdown of the busiest stage: m micro-batches of its layers and output layers, sends, bubble (keys in
    # the order of BREAKDOWN_TERMS)
    rec_t = 0.0
    for j, rec in enumerate(recs):
        rec_t += counts[j] * rec
    bd = {
        "compute_attention": m * attention,
        "compute_mlp": m * mlp,
        "compute_other": m * other + grad_add,
        "recompute": m * rec_t,
        "pipeline_bubble": timing.bubble,
        "tp_comm": m * tp_t,
        "cp_comm": m * cp_t,
        "ep_comm": m * counts[0] * ep_step,
        "pp_comm": m * timing.sends_per_microbatch * c + timing.transfers,
        "dp_comm": dp_exposed
        + ((m if pp == 1 else 1) * sum(n * e for n, e in zip(counts, fsdp, strict=True)) if fsdp else 0.0),
        "optimizer": optimizer,
    }
    calibrated = calibration is not None and not calibration.is_identity
    if calibrated:
        bd = calibration.apply(bd)
    step = sum(bd.values())
    if calibrated:
        bd = {t: bd[t] for t in BREAKDOWN_TERMS}
    tps = ctx.tokens_per_step / step / ctx.world
    mfu = ctx.model_flops_step / (step * ctx.world * ctx.peak)
    return ThroughputEstimate(step, tps, mfu, bd, s, m, timing.class_work, timing.stage_class)


def _class_terms(
    ctx: _Context, lkey: tuple[Any, ...], lo: _LayoutTerms, klass: int, dp: int, zb: bool, shard: int = 1
) -> tuple[Any, ...]:
    """:func:`_stage_terms` of the first stage of class ``klass`` (memoised)."""
    skey = (lkey, dp, klass) if shard == 1 else (lkey, dp, klass, shard)
    st = ctx.stage_terms.get(skey)
    if st is None:
        st = ctx.stage_terms[skey] = _stage_terms(ctx, lo, lo.mix.class_stage[klass], klass, dp, zb, shard)
    return st


def _after_pipeline_least(
    ctx: _Context, lkey: tuple[Any, ...], lo: _LayoutTerms, dp: int, zb: bool, shard: int = 1
) -> float:
    """At least the step's time after the pipeline whichever stage is the busiest: its exposed data-parallel
    collectives (at most ``1 - dp_tail`` of each hidden) and its optimizer step, as :func:`_estimate` adds them."""
    keep = 1.0 - ctx.k.overlap_interference
    least = math.inf
    for klass in range(len(lo.mix.classes)):
        rs, ag, optimizer = _class_terms(ctx, lkey, lo, klass, dp, zb, shard)[3:6]
        if ctx.overlap_grad_reduce and not zb:
            dp_least = (rs - keep * ((1 - ctx.k.dp_tail) * rs)) + (ag - keep * ((1 - ctx.k.dp_tail) * ag))
        else:
            dp_least = rs + ag
        least = min(least, dp_least + optimizer)
    return max(0.0, least)


def _stage_terms(
    ctx: _Context, lo: _LayoutTerms, s: int, klass: int, dp: int, zb: bool, shard: int = 1
) -> tuple[Any, ...]:
    """Of stage ``s`` (class ``klass``) of a layout: its counts of each kind, (dense, expert) parameters,
    gradient reduce and parameter gather, optimizer step, and per micro-batch its compute_attention,
    compute_mlp, compute_other (output layers included), tp_comm and cp_comm."""
    counts = lo.mix.classes[klass][0]
    mx = lo.mixes[s]
    tp, pp, ep, cp = lo.parallel
    dense, expert = ctx.stage_params(tp, pp, ep, mx)
    rs, ag, local = ctx.dp_collectives(tp, pp, ep, cp, dp, mx, shard)
    optimizer = local * ctx.opt_bytes / ctx.hbm + 30 * ctx.kernel_s
    attention = mlp = other = tp_t = cp_t = 0.0
    for n, x in zip(counts, lo.shape.kinds, strict=False):
        lay = x.lay
        attention += n * (3 * lay.attn_lin + lay.core_f + lay.core_b)
        mlp += n * 3 * lay.mlp_lin
        other += n * (3 * lay.other_f + lay.host_f + lay.host_b)
        tp_t += n * (lay.tp_f + (lay.tp_b_zb if zb else lay.tp_b))
        cp_t += n * (lay.cp_f + lay.cp_b)
    other += counts[-1] * lo.shape.logits_sum
    return (counts, dense, expert, rs, ag, optimizer, attention, mlp, other, tp_t, cp_t)


@dataclass(frozen=True, slots=True)
class _KindTerms:
    """One kind of layer (the model's own, or an MoE model's dense layers) at one per-GPU shape."""

    lay: _Layer
    moe: bool
    lin: float  # attn_lin + mlp_lin


@dataclass(frozen=True, slots=True)
class _ShapeTerms:
    """What :func:`estimate_throughput` needs of one per-GPU shape (tp, cp, ep, mbs, dispatcher), whatever the
    pipeline: per kind of layer and then the output layer, its passes before the configuration's recompute and
    expert-parallel exposure."""

    kinds: tuple[_KindTerms, ...]
    f_pass: tuple[float, ...]
    """lin + core_f + other_f + host_f + tp_f + cp_f per kind, then the output layer's F"""
    b_pass: tuple[float, ...]
    """lin + core_b + 2·other_f + host_b + tp_b + cp_b per kind, then the output layer's B, and W inside B
    (1F1B, interleaved)"""
    b_pass_zb: tuple[float, ...]
    """the same with tp_b_zb and without W (zero-bubble: the weight gradient deferred)"""
    w_pass: tuple[float, ...]
    """lin per kind, then the output layer's W (zero-bubble)"""
    no_w: tuple[float, ...]
    """zeros (W inside B)"""
    logits_sum: float


@dataclass(frozen=True, slots=True)
class _LayoutTerms:
    """One layout (tp, pp, ep, cp, mbs, vpp, schedule, dispatcher): its shape's terms and its pipeline."""

    shape: _ShapeTerms
    mix: ChunkMix
    mixes: list[StageMix]
    per_chunk: float
    """decoder + MTP layers per chunk, averaged over the chunks (``full:N`` recomputes N of them)"""
    parallel: tuple[int, int, int, int]
    """(tp, pp, ep, cp)"""


def _shape_terms(ctx: _Context, tp: int, cp: int, ep: int, mbs: int, dispatcher: str) -> _ShapeTerms:
    lays = [(ctx.layer(tp, cp, ep, mbs, dispatcher, True), ctx.is_moe)]
    if ctx.mixed_kinds:
        lays.append((ctx.layer(tp, cp, ep, mbs, dispatcher, False), False))
    kinds = tuple(_KindTerms(lay, moe, lay.attn_lin + lay.mlp_lin) for lay, moe in lays)
    lf, lb, lw = ctx.logits_times(tp, cp, mbs)
    f, b, b_zb, w = [], [], [], []
    for x in kinds:
        lay = x.lay
        f.append(x.lin + lay.core_f + lay.other_f + lay.host_f + lay.tp_f + lay.cp_f)
        back = x.lin + lay.core_b + 2 * lay.other_f + lay.host_b + lay.cp_b
        b.append(back + lay.tp_b + x.lin)
        b_zb.append(back + lay.tp_b_zb)
        w.append(x.lin)
    return _ShapeTerms(
        kinds=kinds,
        f_pass=(*f, lf),
        b_pass=(*b, lb + lw),
        b_pass_zb=(*b_zb, lb),
        w_pass=(*w, lw),
        no_w=(0.0,) * (len(kinds) + 1),
        logits_sum=lf + lb + lw,
    )


def _layout_terms(
    ctx: _Context, tp: int, pp: int, ep: int, cp: int, mbs: int, vpp: int, schedule: str, dispatcher: str
) -> _LayoutTerms:
    key = (tp, cp, ep, mbs, dispatcher)
    shape = ctx.shapes.get(key)
    if shape is None:
        shape = ctx.shapes[key] = _shape_terms(ctx, tp, cp, ep, mbs, dispatcher)
    mix, per_chunk = ctx.pipeline(pp, vpp, schedule)
    return _LayoutTerms(shape, mix, ctx.mix(pp, vpp, schedule), per_chunk, (tp, pp, ep, cp))


def _mla_shared_recompute_seconds(
    ctx: _Context, recompute: str, tp: int, cp: int, mbs: int, moe: bool
) -> float:
    """Per layer of a kind (``moe``: the MoE layers): the forward re-run by the ``mla_up_proj`` (MLA's
    up-projection GEMMs) and ``shared_experts`` (the shared experts' GEMMs and activation, MoE layers only)
    modules."""
    r = parse_recompute(recompute)
    if r.granularity != "selective":
        return 0.0
    md = ctx.model
    tokens = mbs * ctx.seq / cp
    rec = 0.0
    if r.has("mla_up_proj") and md.multi_latent_attention:
        rec += sum(ctx.gemm(g) for g in mla_up_gemms(md, tokens, tp))
    if r.has("shared_experts") and md.shared_expert_ffn and moe and md.is_moe:
        shared = layer_gemms(md, ctx.seq, mbs, tp, cp, 1, moe=True).shared
        act = 3 * tokens * md.shared_expert_ffn / tp * ACT / ctx.hbm + ctx.kernel_s
        rec += sum(ctx.gemm(g) for g in shared) + act
    return rec


# --- presentation (for the ``estimate`` command) ------------------------------------------------------------
def measured_sources(spec: StudySpec) -> dict[str, str]:
    """Which step-time terms a study's hardware profile (``cluster.profile``) prices, and from what (empty: every
    constant is the catalog's)."""
    measured = _context(spec).measured
    return dict(measured.sources) if measured is not None else {}


def throughput_section(est: ThroughputEstimate) -> dict[str, Any]:
    """The ``"throughput"`` section of ``estimate --json``."""
    return est.to_dict()


def format_throughput(est: ThroughputEstimate, indent: str = "  ", header: bool = True) -> str:
    """Human-readable step-time breakdown (largest terms first, zero terms omitted)."""
    lines = (
        [
            f"throughput {est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, step {est.step_time_s:.3f} s, "
            f"MFU {est.mfu * 100:.1f}%"
        ]
        if header
        else []
    )
    items = sorted(est.breakdown_s.items(), key=lambda kv: -kv[1])
    for name, sec in items:
        if sec <= 0:
            continue
        share = sec / est.step_time_s * 100 if est.step_time_s else 0.0
        lines.append(f"{indent}{name:<18} {sec:9.3f} s  {share:5.1f}%")
    return "\n".join(lines)


__all__ = [
    "ThroughputEstimate",
    "estimate_throughput",
    "estimate_throughput_all",
    "format_throughput",
    "measured_sources",
    "throughput_section",
]
