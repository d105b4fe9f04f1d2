"""Step time and tokens/s/GPU of a configuration, with a breakdown: :func:`estimate_throughput`.

The step is built bottom-up (each piece's source is in the module it comes from):

1. per layer and micro-batch on one rank (:mod:`.flops`): linear-layer GEMMs at an achievable fraction of
   peak that falls for small GEMM dimensions and for MoE grouped GEMMs with few tokens per local expert
   (roofline: never faster than HBM allows); causal flash attention at its own efficiency and always at
   BF16 peak (FP8 speeds up the linear layers only); memory-bound "other" kernels (norms, residuals,
   activation, rotary, MoE permutation) at HBM bandwidth, plus a fixed cost per kernel;
2. communication inside a layer (:mod:`.comm`): TP with sequence parallelism = all-gather + reduce-scatter
   per block in forward and again in backward (exposed: Megatron's default has no TP overlap); CP =
   ring exchange of K/V (and dK/dV in backward), hidden under the core attention up to ``cp_overlap``;
   EP = dispatch + combine all-to-all per MoE layer and pass, exposed for ``alltoall`` (plus a host sync),
   DeepEP's bandwidths and partial overlap with expert compute for ``deepep``;
3. passes: F = forward; B = input gradient (linear dgrad + attention backward + ``recompute``: the forward
   of exactly what the recompute value drops, :func:`recompute_seconds`); W = weight gradient (linear wgrad);
4. the pipeline (:mod:`.pipeline`): a simulation of the schedule over ``m`` micro-batches with blocking
   point-to-point sends between stages gives the busiest stage's work and the bubble;
5. after the pipeline: data-parallel gradient reduce-scatter (all-reduce without the distributed optimizer)
   overlapped with the last micro-batch's backward and parameter all-gather overlapped with the first
   forward, except a tail (``dp_tail``); the optimizer step is HBM-bound (Adam on fp32 master weights).

The breakdown holds exposed time only and sums to the step time. All efficiency constants come from one
table per GPU family (:mod:`.calibration`).

Example::

    est = estimate_throughput(spec, space.baseline)
    est.tokens_per_s_per_gpu, est.breakdown_s["pipeline_bubble"]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..spec.recompute import parse_recompute
from ..spec.study import StudySpec
from .calibration import BREAKDOWN_TERMS, Calibration, FamilyConstants, family_constants
from .comm import Group, Topology
from .flops import ATTN_BWD_FACTOR, Gemm, layer_gemms, logits_gemm, model_flops_per_token
from .pipeline import pipeline_timing
from .shapes import LayerShape, embedding_params, layer_params, output_params
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
TILE = 128
"""MoE grouped GEMMs pad each expert's tokens to whole tiles (assumption: 128-row tiles)"""
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "step_time_s": self.step_time_s,
            "mfu": self.mfu,
            "breakdown_s": dict(self.breakdown_s),
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
    cp_f: float
    cp_b: float
    ep_f: float
    ep_b: float
    expert_f: float  # expert GEMM time (what DeepEP overlaps with)


@dataclass(frozen=True, slots=True)
class _Axes:
    tp: int
    cp: int
    ep: int
    mbs: int


class _Context:
    """Study-level constants and memo tables (valid for one spec object)."""

    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec
        m, w, gpu = spec.model, spec.workload, spec.cluster.gpu
        self.model = m
        self.k: FamilyConstants = family_constants(gpu)
        self.topo = Topology(gpu, spec.cluster.gpus_per_node, self.k.coll_eff, self.k.a2a_eff)
        self.seq = w.seq_length
        self.gbs = w.global_batch_size
        self.world = spec.world
        self.fp8 = w.precision == "fp8"
        self.grad_bytes = GRAD_REDUCE_BYTES if w.grad_reduce_in_fp32 else ACT
        self.gather_bytes = 1 if self.fp8 and w.fp8_param_gather else PARAM_GATHER_BYTES
        self.bf16_rate = gpu.bf16_tflops * 1e12 * self.k.gemm_eff_bf16
        fp8_rate = gpu.peak_tflops("fp8") * 1e12 * self.k.gemm_eff_fp8 if self.fp8 else 0.0
        self.lin_rate = max(self.bf16_rate, fp8_rate)  # FP8 never slower than BF16
        self.lin_bytes = 1 if self.fp8 else ACT
        self.attn_rate = gpu.bf16_tflops * 1e12 * self.k.attn_eff
        self.hbm = gpu.hbm_bw_tbs * 1e12 * self.k.hbm_eff
        self.kernel_s = self.k.kernel_us * 1e-6
        self.peak = gpu.peak_tflops(w.precision) * 1e12
        self.tokens_per_step = spec.tokens_per_step
        self.model_flops_step = model_flops_per_token(m, self.seq) * self.tokens_per_step
        self.rope = m.position_embedding_type == "rope"
        self.dropout = m.normalization == "LayerNorm" and m.position_embedding_type == "learned_absolute"
        self.layers: dict[tuple[int, int, int, int, str], _Layer] = {}
        self.logits: dict[tuple[int, int, int], tuple[float, float, float]] = {}
        self.params: dict[tuple[int, int, int, int], tuple[float, float]] = {}

    # --- compute ----------------------------------------------------------------------------------------------
    def gemm(self, g: Gemm, linear: bool = True, grouped: bool = False) -> float:
        """Time of one forward GEMM (or one of its two backward GEMMs, same size)."""
        if g.count <= 0 or g.m <= 0:
            return 0.0
        m = math.ceil(g.m / TILE) * TILE if grouped else g.m
        d = min(m, g.n, g.k)
        eff = d / (d + self.k.gemm_dim_half)
        if grouped:
            eff *= self.k.grouped_gemm_eff
        rate = (self.lin_rate if linear else self.bf16_rate) * eff
        elt = self.lin_bytes if linear else ACT
        t_flops = 2.0 * m * g.n * g.k * g.count / rate
        t_mem = (g.m * g.k + g.k * g.n + g.m * g.n) * elt * g.count / self.hbm
        return max(t_flops, t_mem) + self.kernel_s

    def layer(self, tp: int, cp: int, ep: int, mbs: int, dispatcher: str) -> _Layer:
        key = (tp, cp, ep, mbs, dispatcher)
        lay = self.layers.get(key)
        if lay is not None:
            return lay
        md, k, topo = self.model, self.k, self.topo
        g = layer_gemms(md, self.seq, mbs, tp, cp, ep)
        attn_lin = sum(self.gemm(x) for x in g.attention)
        if g.grouped:
            router, *experts = g.mlp
            expert_f = sum(self.gemm(x, grouped=True) for x in experts)
            mlp_lin = self.gemm(router, linear=False) + expert_f
        else:
            expert_f = 0.0
            mlp_lin = sum(self.gemm(x) for x in g.mlp)
        if k.flash_attention:
            core_f = g.core_attention_flops / self.attn_rate + self.kernel_s
            core_b = g.core_attention_flops * ATTN_BWD_FACTOR / self.attn_rate + self.kernel_s
        else:
            # full s x s score GEMMs (masked, not skipped) at GEMM efficiency, plus the softmax over
            # materialised scores: write scores, read+write probabilities, dropout mask, read by P·V (~10 B
            # per score in forward, twice that in backward)
            scores = mbs * (self.seq / cp) * self.seq * md.num_attention_heads / tp
            gemm_t = 2 * g.core_attention_flops / self.bf16_rate
            mem_t = 10 * scores / self.hbm
            core_f = gemm_t + mem_t + 3 * self.kernel_s
            core_b = 2 * gemm_t + 2 * mem_t + 4 * self.kernel_s
        # memory-bound kernels, forward (bytes on this rank)
        h, d = md.hidden_size, md.head_dim
        tokens = mbs * self.seq / cp
        local = tokens / tp
        a, kv = md.num_attention_heads / tp, md.query_groups / tp
        nbytes = 20 * local * h * ACT / 2  # 2 norms (read+write) + 2 residual adds (2 reads, 1 write)
        if self.rope:
            nbytes += 2 * tokens * (a + kv) * d * ACT
        if self.dropout:
            nbytes += 2 * local * h * (2 * ACT + 1)
        if md.is_moe:
            copies = local * md.moe_router_topk
            fe = md.expert_ffn
            nbytes += 3 * copies * fe * ACT * (1 if md.swiglu else 2 / 3)  # activation
            nbytes += 4 * copies * h * ACT  # permute + unpermute (read + write)
            nbytes += 2 * local * md.experts * 4  # router softmax / top-k (fp32)
            kernels = KERNELS_MOE
        else:
            nbytes += 3 * tokens * md.ffn_hidden_size / tp * ACT * (1 if md.swiglu else 2 / 3)
            kernels = KERNELS_DENSE
        other_f = nbytes / self.hbm + kernels * self.kernel_s
        # TP (sequence parallel): all-gather + reduce-scatter per block; MoE blocks (etp = 1) need none
        full = tokens * h * ACT
        blocks = 1 if md.is_moe else 2
        tp_grp = Group(tp, 1)
        tp_one = blocks * (topo.all_gather(full, tp_grp) + topo.reduce_scatter(full, tp_grp))
        tp_f = tp_b = tp_one * (1.0 - k.tp_overlap)
        # CP: ring exchange of this rank's K/V chunk (cp - 1 steps); backward also moves dK/dV
        cp_f = cp_b = 0.0
        if cp > 1:
            cp_grp = Group(cp, tp)
            step = topo.p2p(tokens * 2 * kv * d * ACT, cp_grp)
            lat = (cp - 1) * (topo.intra_lat if topo.intra(cp_grp) else topo.inter_lat)
            cp_f = max(lat, (cp - 1) * step - k.cp_overlap * core_f)
            cp_b = max(lat, 2 * (cp - 1) * step - k.cp_overlap * core_b)
        # EP: dispatch + combine all-to-all per MoE layer and pass
        ep_f = ep_b = 0.0
        if md.is_moe:
            ep_grp = Group(ep, 1)
            sent = local * md.moe_router_topk * h * ACT
            sync = k.moe_sync_us * 1e-6
            a2a = 2 * topo.all_to_all(sent, ep_grp) + sync
            if dispatcher == "deepep":
                raw = 2 * topo.all_to_all(sent, ep_grp, k.deepep_intra_eff, k.deepep_inter_eff)
                hidden = min(k.deepep_overlap * raw, expert_f)
                ep_f = min(a2a, raw - hidden)
                ep_b = min(a2a, raw - min(k.deepep_overlap * raw, 2 * expert_f))
            else:
                ep_f = ep_b = a2a
        lay = _Layer(attn_lin, core_f, core_b, mlp_lin, other_f, tp_f, tp_b, cp_f, cp_b, ep_f, ep_b, expert_f)
        self.layers[key] = lay
        return lay

    def logits_times(self, tp: int, cp: int, mbs: int) -> tuple[float, float, float]:
        """(F, B, W) of the output layer + cross entropy on the last stage (bf16 GEMM)."""
        key = (tp, cp, mbs)
        r = self.logits.get(key)
        if r is None:
            g = logits_gemm(self.model, self.seq, mbs, tp, cp)
            t = self.gemm(g, linear=False)
            ce = g.m * g.n * (ACT + 4 + 4) / self.hbm + 4 * self.kernel_s  # vocab-parallel cross entropy
            r = self.logits[key] = (t + ce, t + ce, t)
        return r

    def stage_params(self, tp: int, pp: int, ep: int, vpp_layers: int) -> tuple[float, float]:
        """(dense, expert) parameters of the busiest stage on one rank."""
        key = (tp, pp, ep, vpp_layers)
        r = self.params.get(key)
        if r is None:
            lp = layer_params(LayerShape.from_config(self.spec, _Axes(tp, 1, ep, 1)))
            ends = max(embedding_params(self.spec, tp), output_params(self.spec, tp, pp))
            if pp == 1:
                ends = embedding_params(self.spec, tp) + output_params(self.spec, tp, pp)
            r = self.params[key] = (vpp_layers * lp.dense + ends, vpp_layers * lp.expert)
        return r


_context = per_spec(_Context)


def recompute_seconds(
    ctx: _Context, lay: _Layer, recompute: str, tp: int, cp: int, mbs: int, per_chunk: float
) -> float:
    """Forward time re-run in backward per layer and micro-batch: exactly what ``recompute`` drops.

    ``full``: the whole layer forward (with its TP/CP/EP communication); ``full:N``: that, for N of each
    chunk's ``per_chunk`` layers; selective modules: ``core_attn`` the flash attention forward, ``moe_act``
    the expert activation (memory-bound: read 2F, write F per routed copy), ``layernorm`` the pre-MLP norm,
    ``mlp`` the dense MLP (GEMMs, activation, its TP all-gather), ``moe`` the whole MoE block: router,
    experts, activation, permutation and both expert all-to-alls. ``shared_experts``/``mla_up_proj`` add
    nothing until the layer model has those parts.
    """
    r = parse_recompute(recompute)
    if r.granularity == "none":
        return 0.0
    if r.is_full:
        f_layer = lay.attn_lin + lay.mlp_lin + lay.core_f + lay.other_f + lay.tp_f + lay.cp_f + lay.ep_f
        return f_layer * (min(r.num_layers, per_chunk) / per_chunk if r.num_layers else 1.0)
    md = ctx.model
    tokens = mbs * ctx.seq / cp
    local = tokens / tp
    h = md.hidden_size
    rec = 0.0
    if r.has("core_attn"):
        rec += lay.core_f
    if md.is_moe:
        copies = local * md.moe_router_topk
        act = 3 * copies * md.expert_ffn * ACT / ctx.hbm + ctx.kernel_s
        if r.has("moe"):
            permute = (4 * copies * h * ACT + 2 * local * md.experts * 4) / ctx.hbm + 4 * ctx.kernel_s
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
    Layers that do not divide evenly over pipeline stages are placed ``ceil(L / (pp·v))`` per chunk on the
    busiest stage (Megatron's uneven first/last stage split leaves the middle stages full).
    """
    ctx = _context(spec)
    tp, pp, ep, cp, mbs = config.tp, config.pp, config.ep, config.cp, config.mbs
    schedule = config.pp_schedule if pp > 1 else "1f1b"
    vpp = 2 if schedule == "zbv" else (config.vpp if schedule == "interleaved" else 1)
    dp = config.dp or max(1, ctx.world // (tp * cp * pp))
    m = config.num_microbatches or max(1, ctx.gbs // (mbs * dp))
    k, topo = ctx.k, ctx.topo
    md = ctx.model
    dispatcher = config.moe_dispatcher if md.is_moe else "alltoall"
    lay = ctx.layer(tp, cp, ep, mbs, dispatcher)
    zb = schedule in ("zb1p", "zbv")
    recompute = "none" if zb else config.recompute

    # one layer, one micro-batch: passes
    lin = lay.attn_lin + lay.mlp_lin
    f_layer = lin + lay.core_f + lay.other_f + lay.tp_f + lay.cp_f + lay.ep_f
    rec = recompute_seconds(ctx, lay, recompute, tp, cp, mbs, md.num_layers / (pp * vpp))
    b_layer = lin + lay.core_b + 2 * lay.other_f + lay.tp_b + lay.cp_b + lay.ep_b + rec
    w_layer = lin
    per_chunk = math.ceil(md.num_layers / (pp * vpp))
    n_stage = per_chunk * vpp
    lf, lb, lw = ctx.logits_times(tp, cp, mbs)

    # pipeline
    msg = mbs * ctx.seq / cp * md.hidden_size / tp * ACT
    c = topo.p2p(msg, Group(pp, tp * cp * dp)) if pp > 1 else 0.0
    if zb:
        timing = pipeline_timing(
            schedule, pp, vpp, m, per_chunk * f_layer, per_chunk * b_layer, per_chunk * w_layer, c, lf, lb, lw
        )
    else:
        timing = pipeline_timing(
            schedule,
            pp,
            vpp,
            m,
            per_chunk * f_layer,
            per_chunk * (b_layer + w_layer),
            0.0,
            c,
            lf,
            lb + lw,
            0.0,
        )

    # data parallelism (per step, after the pipeline) and the optimizer
    dense, expert = ctx.stage_params(tp, pp, ep, n_stage)
    dp_grp = Group(dp * cp, tp)
    edp = max(1, (tp * cp * dp) // ep)
    edp_grp = Group(edp, ep)
    if spec.workload.distributed_optimizer:
        rs = topo.reduce_scatter(dense * ctx.grad_bytes, dp_grp) + topo.reduce_scatter(
            expert * ctx.grad_bytes, edp_grp
        )
        ag = topo.all_gather(dense * ctx.gather_bytes, dp_grp) + topo.all_gather(
            expert * ctx.gather_bytes, edp_grp
        )
        local = dense / (dp * cp) + expert / edp
    else:
        rs = topo.all_reduce(dense * ctx.grad_bytes, dp_grp) + topo.all_reduce(
            expert * ctx.grad_bytes, edp_grp
        )
        ag = 0.0
        local = dense + expert
    bwd_window = n_stage * (b_layer + w_layer)
    fwd_window = n_stage * f_layer
    dp_exposed = max(k.dp_tail * rs, rs - bwd_window) + max(k.dp_tail * ag, ag - fwd_window)
    optimizer = local * ADAM_BYTES_PER_PARAM / ctx.hbm + 30 * ctx.kernel_s

    # breakdown of the busiest stage: m micro-batches of its layers + output layer, sends, bubble
    nm = m * n_stage
    bd = {
        "compute_attention": nm * (3 * lay.attn_lin + lay.core_f + lay.core_b),
        "compute_mlp": nm * 3 * lay.mlp_lin,
        "compute_other": nm * 3 * lay.other_f + m * (lf + lb + lw),
        "recompute": nm * rec,
        "pipeline_bubble": timing.bubble,
        "tp_comm": nm * (lay.tp_f + lay.tp_b),
        "cp_comm": nm * (lay.cp_f + lay.cp_b),
        "ep_comm": nm * (lay.ep_f + lay.ep_b),
        "pp_comm": m * timing.sends_per_microbatch * c,
        "dp_comm": dp_exposed,
        "optimizer": optimizer,
    }
    if calibration is not None and not calibration.is_identity:
        bd = calibration.apply(bd)
    step = sum(bd.values())
    tps = ctx.tokens_per_step / step / ctx.world
    mfu = ctx.model_flops_step / (step * ctx.world * ctx.peak)
    return ThroughputEstimate(step, tps, mfu, {t: bd[t] for t in BREAKDOWN_TERMS})


# --- presentation (for the ``estimate`` command) ------------------------------------------------------------
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
    "format_throughput",
    "throughput_section",
]
