"""Per-GPU memory of a configuration, stage by stage: :func:`estimate_memory`.

Pure Python and fast (every legal configuration of a study in well under a second): the quantities that
depend only on the study are computed once per spec (:func:`_context`), sub-results that depend on a few axes
are memoised there, and the per-configuration path is a handful of multiplications per pipeline stage.

What is counted (breakdown keys, GiB per GPU):

- ``weights_gib``: the bf16/fp16 parameters (2 bytes) plus, under FP8, Transformer Engine's cached FP8 copy of
  every GEMM weight and its transpose (+2 bytes per GEMM parameter; embeddings, norms, router and output
  layer stay in bf16); with ``workload.fp8_param_gather`` the GEMM weights are FP8 only (2 bytes with the
  transpose, no bf16 copy).
- ``gradients_gib``: Megatron's main-grad buffer, 4 bytes per parameter with ``grad_reduce_in_fp32`` (the
  default; Korthikanti et al.'s 18 bytes/parameter for fp16 in Fig. 1 imply it), 2 without. The distributed
  optimizer reduce-scatters into this buffer; it is not sharded.
- ``optimizer_gib``: fp32 master weights (4) + Adam moments (4 + 4) = 12 bytes per parameter, divided by
  the distributed optimizer's shard group: dp·cp for dense parameters, the expert-data-parallel group
  world/(pp·ep) for expert parameters (Megatron ``docs/distrib_optimizer.md``: 6 + 12/d bytes/param). With
  ``workload.precision_aware_optimizer`` the master weights and moments take the workload's
  ``main_params_dtype``/``exp_avg_dtype``/``exp_avg_sq_dtype`` (:func:`optimizer_bytes_per_param`).
- ``activations_gib``: what the micro-batches in flight keep for backward: chunk micro-batches in flight
  (:func:`~primus_optuna.physics.shapes.chunks_in_flight`) × the stage's average chunk under the
  configuration's recompute, per tensor as in shared/reference/megatron-memory.md and per layer kind
  (:func:`~primus_optuna.physics.layer_mix.kind_activation_bytes`: dense or MoE, MLA, shared experts; MTP
  layers add their norms and ``eh_proj`` input); with ``full``/``full:N`` the recomputed layers keep their
  inputs and one layer is rebuilt during backward (its activations are added once); the stage holding the
  loss adds the output layer's logits (bf16 GEMM output + the fp32 copy the vocab-parallel cross entropy
  keeps), once more per MTP layer.
- parameters per stage follow the study's pipeline layout (:mod:`primus_optuna.spec.layout`): each stage's
  dense, MoE and MTP layers (:func:`~primus_optuna.physics.layer_mix.rank_layer_params`), the embedding on the
  stage holding it and the output layer on the stage holding the loss.
- ``comm_buffers_gib``: NCCL/RCCL communicator buffers, :data:`CCL_GIB_PER_GROUP` per parallel group with
  more than one rank, plus :data:`CCL_BASE_GIB`.
- ``dispatcher_buffers_gib``: DeepEP's NVLink (and, when the EP group spans nodes, RDMA) buffers.
- ``overhead_gib``: device context and library workspaces (:data:`CONTEXT_GIB`) plus allocator
  fragmentation (:data:`FRAGMENTATION` of everything allocated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import add
from typing import Any

from ..spec.hardware import GIB
from ..spec.recompute import Recompute, parse_recompute
from ..spec.study import StudySpec, WorkloadSpec
from .layer_mix import (
    StageMix,
    even_fallback,
    kind_activation_bytes,
    mtp_extra_activation,
    mtp_extra_params,
    rank_layer_params,
    stage_mixes,
)
from .shapes import (
    ACT_BYTES,
    FP32,
    LayerShape,
    chunks_in_flight,
    embedding_params,
    output_params,
)
from .spec_cache import MAX_SPECS, per_spec

# --- documented constants ------------------------------------------------------------------------------------
FSDP_UNITS_IN_FLIGHT = 2
"""FSDP2 gathers one unit (a layer, the embedding, the output layer) ahead of the one computing (implicit
forward prefetch, explicit backward prefetch of the next unit: torch ``fully_shard``,
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@2.13.0:795-833), so two units are unsharded at a
time; measured so on a gloo group by tests/physics/test_fsdp_memory.py."""
WEIGHT_BYTES = 2
"""bf16/fp16 model weights."""
FP8_EXTRA_WEIGHT_BYTES = 2
"""Transformer Engine keeps an FP8 copy of each GEMM weight and of its transpose (1 + 1 byte), cached across
micro-batches (TE ``is_first_microbatch`` weight caching)."""
FP8_PARAM_BYTES = 2
"""With ``fp8_param_gather`` (TE ``fp8_model_init``) a GEMM weight is an FP8 tensor (1 byte) plus its FP8
transpose (1 byte) and no bf16 copy; the fp32 master stays in the optimizer."""
GRAD_BYTES = 4
"""fp32 main-grad buffer (Megatron DDP, ``grad_reduce_in_fp32``, Megatron's default)."""
GRAD_BYTES_BF16 = 2
"""bf16 main grads (``grad_reduce_in_fp32: false``, as every published Megatron-Bridge recipe sets)."""
OPTIMIZER_BYTES = 12
"""fp32 master copy + Adam exp_avg + exp_avg_sq."""
STATE_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
"""Bytes per element of an optimizer state under Megatron's precision-aware optimizer: TransformerEngine's
FusedAdam allocates each state in its dtype (``fp8`` is a uint8 Float8Tensor with one fp32 scale per tensor,
negligible); Megatron ``megatron/core/optimizer/__init__.py`` passes ``exp_avg_dtype``/``exp_avg_sq_dtype``/
``master_weight_dtype`` to it."""
MASTER_REMAINDER_BYTES = 2
"""TE FusedAdam ``store_param_remainders`` (Megatron ``OptimizerConfig`` default True, TE >= 2.1; no
Megatron-LM argument turns it off): with bf16 parameters and fp32 master weights held by FusedAdam, only the
16 trailing bits of each fp32 master are stored (int16); the bf16 parameter supplies the rest."""


def optimizer_bytes_per_param(w: WorkloadSpec) -> int:
    """Bytes of optimizer state per parameter before sharding: master weight + exp_avg + exp_avg_sq.

    Without the precision-aware optimizer: 4 + 4 + 4. With it the moments take their dtypes, and the master
    weight is ``main_params_dtype``; an fp32 master held by TE's FusedAdam over bf16 parameters is stored as
    16-bit remainders. FusedAdam holds the master unless an FP8 recipe other than delayed scaling is used with
    fp32 master weights (then Megatron keeps the fp32 master itself: ``use_precision_aware_optimizer_no_fp8_or_
    ds_fp8`` in ``megatron/core/optimizer/optimizer_config.py``, ``shard_main_param`` in
    ``distrib_optimizer.py``); the parameters are bf16 under bf16 precision and under FP8 without
    ``fp8_param_gather``."""
    if not w.precision_aware_optimizer:
        return OPTIMIZER_BYTES
    moments = STATE_DTYPE_BYTES[w.exp_avg_dtype] + STATE_DTYPE_BYTES[w.exp_avg_sq_dtype]
    if w.main_params_dtype != "fp32":
        return STATE_DTYPE_BYTES[w.main_params_dtype] + moments
    fp8 = w.precision == "fp8"
    te_holds_master = not fp8 or w.fp8_recipe == "delayed"
    bf16_params = w.precision == "bf16" or (fp8 and not w.fp8_param_gather)
    master = MASTER_REMAINDER_BYTES if te_holds_master and bf16_params else STATE_DTYPE_BYTES["fp32"]
    return master + moments


CCL_BASE_GIB = 0.25
"""NCCL/RCCL bootstrap, proxy and the global/embedding communicators."""
CCL_GIB_PER_GROUP = 0.25
"""NCCL_BUFFSIZE (4 MiB) per channel and peer connection, times the 16-32 channels NCCL/RCCL open on 8-GPU
nodes for ring + tree: ~128-256 MiB per communicator (NCCL environment docs); the upper value is taken."""
DEEPEP_NVL_GIB = 1.0
"""DeepEP intranode (NVLink/xGMI) buffer per rank at hidden 7168: the order of DeepEP's ``Buffer`` size hints
(``get_nvl_buffer_size_hint``) used by Megatron's ``get_buffer``; scaled linearly with hidden bytes."""
DEEPEP_RDMA_GIB = 2.0
"""DeepEP internode RDMA buffer per rank at hidden 7168 when the EP group spans nodes (same source)."""
DEEPEP_REF_HIDDEN = 7168
CONTEXT_GIB = 1.0
"""CUDA/HIP context, cuBLAS/hipBLASLt and TE workspaces, kernels of the loaded libraries: typically
0.5-1 GiB per process; not visible to ``torch.cuda.max_memory_allocated`` but taken from HBM."""
FRAGMENTATION = 0.05
"""PyTorch caching allocator: reserved exceeds allocated by a few percent for training steady state."""

BREAKDOWN_KEYS: tuple[str, ...] = (
    "weights_gib",
    "gradients_gib",
    "optimizer_gib",
    "activations_gib",
    "comm_buffers_gib",
    "dispatcher_buffers_gib",
    "overhead_gib",
)


@dataclass(frozen=True, slots=True)
class StageMemory:
    """One pipeline stage's per-GPU memory."""

    stage: int
    total_gib: float
    breakdown: dict[str, float]
    params: int = 0
    """parameters this GPU holds (all, including embedding/output)"""
    layer_params: int = 0
    """of which transformer-layer parameters"""

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "total_gib": round(self.total_gib, 3),
            "breakdown": {k: round(v, 3) for k, v in self.breakdown.items()},
        }


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Per-stage memory of one configuration and whether it fits."""

    stages: list[StageMemory]
    capacity_gib: float
    usable_gib: float
    recompute: str = "none"
    """the recompute in force (canonical value); the activations follow it"""
    peak_gib: float = field(init=False)
    peak_stage: int = field(init=False)

    def __post_init__(self) -> None:
        peak = self.stages[0]
        for st in self.stages:
            if st.total_gib > peak.total_gib:
                peak = st
        object.__setattr__(self, "peak_gib", peak.total_gib)
        object.__setattr__(self, "peak_stage", peak.stage)

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.usable_gib

    def reason(self) -> str:
        """E.g. ``memory: 301.2 GiB on stage 3 > 259.2 GiB usable``."""
        op = ">" if not self.fits else "<="
        return f"memory: {self.peak_gib:.1f} GiB on stage {self.peak_stage} {op} {self.usable_gib:.1f} GiB usable"

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_gib": round(self.peak_gib, 3),
            "usable_gib": round(self.usable_gib, 3),
            "capacity_gib": round(self.capacity_gib, 3),
            "fits": self.fits,
            "peak_stage": self.peak_stage,
            "recompute": self.recompute,
            "stages": [s.to_dict() for s in self.stages],
        }


# --- per-spec context ------------------------------------------------------------------------------------------
_TABLES: dict[tuple[Any, ...], tuple[dict[Any, Any], ...]] = {}
"""the memo tables of :class:`_Context`, by :func:`peaks_key`"""


class _Context:
    """Study-level constants and memo tables (valid for one spec object)."""

    def __init__(self, spec: StudySpec) -> None:
        m, w = spec.model, spec.workload
        self.spec = spec
        self.layers = m.num_layers
        self.world = spec.world
        self.gpn = spec.cluster.gpus_per_node
        self.hidden = m.hidden_size
        self.vocab = m.vocab_size
        self.seq = w.seq_length
        self.fp8 = w.precision == "fp8"
        self.fp8_param_gather = self.fp8 and w.fp8_param_gather
        self.grad_bytes = GRAD_BYTES if w.grad_reduce_in_fp32 else GRAD_BYTES_BF16
        self.dist_opt = w.distributed_optimizer
        self.optimizer_bytes = optimizer_bytes_per_param(w)
        self.layernorm = m.normalization == "LayerNorm"
        self.is_moe = m.is_moe
        self.capacity_gib = spec.cluster.gpu.hbm_gib
        self.usable_gib = self.capacity_gib * (1.0 - spec.search.memory_safety_margin)
        self.model = m
        self.pipeline = spec.pipeline
        self.last_moe = m.moe_layer_flags[-1]
        self.shapes: dict[tuple[int, int, int, int], LayerShape] = {}
        self.acts: dict[tuple[int, int, int, str], _Acts] = {}
        self.mixes: dict[tuple[int, int, str], list[StageMix]] = {}
        self.stage_acts: dict[tuple[Any, ...], tuple[float, ...]] = {}
        self.params: dict[tuple[int, int, int, int, str], list[tuple[int, int, int, int]]] = {}
        self.static: dict[
            tuple[Any, ...], list[tuple[float, float, float, float, float, int, int, bool]]
        ] = {}
        self.static_sums: dict[tuple[Any, ...], tuple[list[float], float, float]] = {}
        # the memo tables read nothing of the GPU: studies alike but for it (capacity planning) share them
        if len(_TABLES) > MAX_SPECS:
            _TABLES.clear()
        tables = (
            self.shapes,
            self.acts,
            self.mixes,
            self.stage_acts,
            self.params,
            self.static,
            self.static_sums,
        )
        (self.shapes, self.acts, self.mixes, self.stage_acts, self.params, self.static, self.static_sums) = (
            _TABLES.setdefault(peaks_key(spec), tables)
        )

    def shape(self, tp: int, cp: int, ep: int, mbs: int) -> LayerShape:
        key = (tp, cp, ep, mbs)
        s = self.shapes.get(key)
        if s is None:
            cfg = _Axes(tp=tp, cp=cp, ep=ep, mbs=mbs)
            s = self.shapes[key] = LayerShape.from_config(self.spec, cfg)
        return s

    def mix(self, pp: int, vpp: int, schedule: str) -> list[StageMix]:
        """Per stage the dense/MoE/MTP layers it holds (the study's pipeline layout)."""
        key = (pp, vpp, "zbv" if schedule == "zbv" else "")
        mx = self.mixes.get(key)
        if mx is None:
            mx = stage_mixes(self.model, self.pipeline, pp, vpp, schedule) or even_fallback(
                self.model, pp, vpp, schedule
            )
            self.mixes[key] = mx
        return mx

    def activations(self, tp: int, cp: int, mbs: int, recompute: str) -> _Acts:
        """Bytes for one micro-batch per layer kind (MoE / dense / MTP): a layer not fully recomputed (under
        the selective part of ``recompute``), one with no recompute; a fully recomputed layer (its input);
        logits + final norm of the stage holding the loss."""
        key = (tp, cp, mbs, recompute)
        a = self.acts.get(key)
        if a is None:
            s = self.shape(tp, cp, 1, mbs)
            d = s.replace(moe=False)
            tokens = s.tokens
            stats = (2 if self.layernorm else 1) * FP32 * s.local_tokens
            # bf16 logits from the output GEMM + the fp32 copy the vocab-parallel cross entropy keeps,
            # for the one micro-batch whose loss is being computed; final norm input + output-layer input.
            out = (
                (ACT_BYTES + FP32) * tokens * self.vocab / tp
                + 2 * ACT_BYTES * s.local_tokens * s.hidden
                + stats
            )
            r = parse_recompute(recompute)
            plain = r if not r.is_full else _NONE
            m = self.model
            extra = float(mtp_extra_activation(s))
            last = s if self.last_moe else d
            a = self.acts[key] = _Acts(
                plain_moe=float(kind_activation_bytes(m, s, plain)),
                plain_dense=float(kind_activation_bytes(m, d, plain)),
                plain_mtp=float(kind_activation_bytes(m, last, plain)) + extra,
                one_moe=float(kind_activation_bytes(m, s, _NONE)),
                one_dense=float(kind_activation_bytes(m, d, _NONE)),
                one_mtp=float(kind_activation_bytes(m, last, _NONE)) + extra,
                inp=float(kind_activation_bytes(m, s, _FULL)),
                logits=float(out),
            )
        return a

    def stage_activations(
        self,
        tp: int,
        cp: int,
        mbs: int,
        recompute: str,
        pp: int,
        vpp: int,
        schedule: str,
        m: int,
        extra: bool,
    ) -> tuple[float, ...]:
        """Activation GiB per pipeline stage (memoised: independent of ep and the dispatcher). Each stage
        averages its chunk over the layers it holds (uneven layouts, dense-first and MTP layers)."""
        key = (tp, cp, mbs, recompute, pp, vpp, schedule, m, extra)
        acts = self.stage_acts.get(key)
        if acts is not None:
            return acts
        r = parse_recompute(recompute)
        a = self.activations(tp, cp, mbs, recompute)
        out = []
        for i, mx in enumerate(self.mix(pp, vpp, schedule)):
            layers = mx.decoder + mx.mtp
            per_chunk = layers / mx.chunks
            plain = (
                (mx.moe * a.plain_moe + mx.dense * a.plain_dense + mx.mtp * a.plain_mtp) / layers
                if layers
                else 0.0
            )
            # full:N: the first N layers of every virtual chunk keep their input only (method block); full: all
            n_rec = (min(float(r.num_layers), per_chunk) if r.num_layers else per_chunk) if r.is_full else 0.0
            chunk = n_rec * a.inp + (per_chunk - n_rec) * plain
            # backward rebuilds one recomputed layer at a time (the heaviest kind on this stage); the recomputed
            # layers are the first of the chunk, so by then the backward has freed the plain layers after them:
            # the rebuild raises the peak only by what it exceeds their activations (full: all of it)
            ones = [o for n, o in ((mx.moe, a.one_moe), (mx.dense, a.one_dense), (mx.mtp, a.one_mtp)) if n]
            rebuilt = max(ones, default=a.inp) - a.inp
            transient = max(0.0, rebuilt - (per_chunk - n_rec) * plain) if n_rec else 0.0
            # pp = 1: Megatron's combined 1F1B (ep_overlap) runs micro-batch i+1's forward with i's backward
            chunks = chunks_in_flight(pp, vpp, m, schedule, i, extra) if pp > 1 else (2 if extra else 1)
            logits = a.logits * (1 + mx.mtp) if mx.loss else 0.0  # MTP layers compute their own logits
            out.append((chunks * chunk + transient + logits) / GIB)
        acts = self.stage_acts[key] = tuple(out)
        return acts

    def stage_params(
        self, tp: int, pp: int, ep: int, vpp: int, schedule: str
    ) -> list[tuple[int, int, int, int]]:
        """Per stage: (dense params, expert params, FP8-copied GEMM params, layer params)."""
        key = (tp, pp, ep, vpp, "zbv" if schedule == "zbv" else "")
        rows = self.params.get(key)
        if rows is None:
            m = self.model
            lm = rank_layer_params(m, tp, ep, True)
            ld = rank_layer_params(m, tp, ep, False)
            lt = lm if self.last_moe else ld
            extra = mtp_extra_params(m, tp)
            emb = embedding_params(self.spec, tp)
            out = output_params(self.spec, tp, pp)
            rows = []
            for mx in self.mix(pp, vpp, schedule):
                layers_dense = mx.moe * lm.dense + mx.dense * ld.dense + mx.mtp * (lt.dense + extra)
                expert = mx.moe * lm.expert + mx.mtp * lt.expert
                gemm = mx.moe * lm.gemm + mx.dense * ld.gemm + mx.mtp * lt.gemm
                dense = layers_dense + (emb if mx.embedding else 0) + (out if mx.loss else 0)
                rows.append((dense, expert, gemm, layers_dense + expert))
            self.params[key] = rows
        return rows


@dataclass(frozen=True, slots=True)
class _Acts:
    """Per-micro-batch activation bytes by layer kind (see :meth:`_Context.activations`)."""

    plain_moe: float
    plain_dense: float
    plain_mtp: float
    one_moe: float
    one_dense: float
    one_mtp: float
    inp: float
    logits: float


@dataclass(frozen=True, slots=True)
class _Axes:
    tp: int
    cp: int
    ep: int
    mbs: int


_context = per_spec(_Context)
_NONE = Recompute("none")
_FULL = Recompute("full")


# --- the estimate ---------------------------------------------------------------------------------------------
def _static_key(
    tp: int, pp: int, ep: int, cp: int, vpp: int, schedule: str, deepep: bool, dp_shard: int
) -> tuple[Any, ...]:
    """The memo key of the layout-only terms (a study that does not search ``dp_shard`` keeps its keys)."""
    layout = (tp, pp, ep, cp, vpp, schedule, deepep)
    return layout if dp_shard == 1 else (*layout, dp_shard)


def _static(
    ctx: _Context,
    tp: int,
    pp: int,
    ep: int,
    cp: int,
    vpp: int,
    schedule: str,
    deepep: bool,
    dp_shard: int = 1,
) -> list[tuple[float, float, float, float, float, int, int, bool]]:
    """Per stage: weights, gradients, optimizer, comm buffers, dispatcher buffers (GiB), params, layer
    params, holds the output layer. Memoised: it depends on the layout axes only."""
    key = _static_key(tp, pp, ep, cp, vpp, schedule, deepep, dp_shard)
    rows = ctx.static.get(key)
    if rows is not None:
        return rows
    if dp_shard > 1:
        rows = ctx.static[key] = _fsdp_static(ctx, tp, pp, ep, cp, vpp, schedule, deepep, dp_shard)
        return rows
    dp = max(1, ctx.world // (tp * cp * pp))
    dense_shard = dp * cp if ctx.dist_opt else 1
    expert_shard = max(1, ctx.world // (pp * ep)) if ctx.dist_opt else 1
    # FP8 GEMM weights: bf16 + cached FP8 copy and transpose, or FP8 params (+ transpose) only
    fp8_extra = (
        (FP8_PARAM_BYTES - WEIGHT_BYTES if ctx.fp8_param_gather else FP8_EXTRA_WEIGHT_BYTES) if ctx.fp8 else 0
    )
    groups = sum(
        1 for size in (tp, cp, dp * cp, pp, ep, ctx.world // (pp * ep) if ctx.is_moe else 1) if size > 1
    )
    comm = CCL_BASE_GIB + CCL_GIB_PER_GROUP * groups
    disp = 0.0
    if ctx.is_moe and deepep:
        scale = ctx.hidden / DEEPEP_REF_HIDDEN
        disp = DEEPEP_NVL_GIB * scale + (DEEPEP_RDMA_GIB * scale if ep > ctx.gpn else 0.0)
    rows = []
    for (dense, expert, gemm, lparams), mx in zip(
        ctx.stage_params(tp, pp, ep, vpp, schedule), ctx.mix(pp, vpp, schedule), strict=True
    ):
        has_out = mx.loss
        params = dense + expert
        rows.append(
            (
                (WEIGHT_BYTES * params + fp8_extra * gemm) / GIB,
                ctx.grad_bytes * params / GIB,
                ctx.optimizer_bytes * (dense / dense_shard + expert / expert_shard) / GIB,
                comm,
                disp,
                params,
                lparams,
                has_out,
            )
        )
    ctx.static[key] = rows
    return rows


def _fsdp_static(
    ctx: _Context, tp: int, pp: int, ep: int, cp: int, vpp: int, schedule: str, deepep: bool, dp_shard: int
) -> list[tuple[float, float, float, float, float, int, int, bool]]:
    """:func:`_static` under FSDP (ZeRO-3) over ``dp_shard`` ranks of the data-parallel group.

    Parameters, gradients and optimizer state are sharded over the FSDP group: dense parameters over
    dp_shard·cp ranks, expert parameters over dp_shard·cp·tp/ep (TorchTitan's ``fsdp`` and ``efsdp`` meshes,
    torchtitan/distributed/parallel_dims.py@b5bcd76c:280-281, 380); HSDP replicates them over dp/dp_shard.
    Without pipeline parallelism each layer is gathered when used and resharded after forward (FSDP2's
    ``reshard_after_forward``), so the unsharded working set is :data:`FSDP_UNITS_IN_FLIGHT` units (the one
    computing and the one prefetched) of the largest unit the stage holds in 16-bit parameters, plus one
    unit's 16-bit gradients (autograd's, in the parameter dtype) and one unit's reduce-scatter input in the
    reduce dtype (``grad_bytes``), which FSDP2 holds across layers (torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py@2.13.0:596-606, 687-696).

    With pipeline parallelism the stage stays gathered: TorchTitan does not reshard after forward when PP is
    on (torchtitan/distributed/fsdp.py@b5bcd76c:129-131) and torch's pipeline stage turns off resharding after
    backward and the gradient reduce-scatter for every micro-batch but the last
    (torch/distributed/pipelining/stage.py@2.13.0:844-847), so the stage's 16-bit parameters and its
    unsharded gradients, accumulated in the reduce dtype (``_fsdp_param.py@2.13.0:800-821``), are held all
    step, plus one unit's 16-bit gradients as they are computed. The 16-bit shard next to the fp32 master is
    Megatron's (Megatron-FSDP's model-weight buffer; bf16 modules under its torch FSDP2 path): FSDP2 with
    TorchTitan's ``MixedPrecisionPolicy`` keeps fp32 shards that are the master, 2 bytes per sharded
    parameter fewer (16 against 18). Both measured on a gloo group by
    tests/physics/test_fsdp_memory.py. (Megatron-FSDP is priced the same way; its pipeline path is not
    checked here.)"""
    rows = _static(ctx, tp, pp, ep, cp, vpp, schedule, deepep)
    dense_shard = dp_shard * cp
    expert_shard = max(1, dp_shard * cp * tp // ep)
    m = ctx.model
    layer = max(
        rank_layer_params(m, tp, ep, moe).total for moe in ((True, False) if ctx.is_moe else (False,))
    )
    emb, out = embedding_params(ctx.spec, tp), output_params(ctx.spec, tp, pp)
    dp = max(1, ctx.world // (tp * cp * pp))
    extra_groups = CCL_GIB_PER_GROUP * (1 if 1 < dp_shard < dp else 0)  # HSDP: the shard and replica groups
    fsdp_rows = []
    for (dense, expert, _gemm, _), mx, (weights, _g, _o, comm, disp, params, lparams, has_out) in zip(
        ctx.stage_params(tp, pp, ep, vpp, schedule), ctx.mix(pp, vpp, schedule), rows, strict=True
    ):
        share = dense / dense_shard + expert / expert_shard
        unit = max(layer, emb if mx.embedding else 0, out if mx.loss else 0)
        if pp > 1:  # the stage stays gathered and accumulates unsharded gradients
            gathered, grads = params, ctx.grad_bytes * params + WEIGHT_BYTES * unit
        else:
            gathered, grads = FSDP_UNITS_IN_FLIGHT * unit, (WEIGHT_BYTES + ctx.grad_bytes) * unit
        fsdp_rows.append(
            (
                weights * share / params + WEIGHT_BYTES * gathered / GIB,
                (ctx.grad_bytes * share + grads) / GIB,
                ctx.optimizer_bytes * share / GIB,
                comm + extra_groups,
                disp,
                params,
                lparams,
                has_out,
            )
        )
    return fsdp_rows


def estimate_memory(spec: StudySpec, config: Any) -> MemoryEstimate:
    """Per-stage per-GPU memory of ``config`` (a :class:`~primus_optuna.space.TrainingConfig`).

    ``dp`` and ``num_microbatches`` are derived from the study when the config does not carry them. The
    config should be legal (see :meth:`Space.check`); an illegal one is estimated as far as the divisions
    allow (layers per stage round down).
    """
    ctx = _context(spec)
    tp, pp, ep, cp, mbs = config.tp, config.pp, config.ep, config.cp, config.mbs
    schedule = config.pp_schedule if pp > 1 else "1f1b"
    vpp = config.vpp if schedule in ("interleaved", "zbv") else 1
    dp = config.dp or max(1, ctx.world // (tp * cp * pp))
    m = config.num_microbatches or max(1, spec.workload.global_batch_size // (mbs * dp))
    extra_chunk = bool(getattr(config, "ep_overlap", False))
    acts = ctx.stage_activations(tp, cp, mbs, config.recompute, pp, vpp, schedule, m, extra_chunk)
    rows = _static(
        ctx, tp, pp, ep, cp, vpp, schedule, config.moe_dispatcher == "deepep", getattr(config, "dp_shard", 1)
    )
    stages: list[StageMemory] = []
    for i, (weights, grads, optim, comm, disp, params, lparams, _) in enumerate(rows):
        act = acts[i]
        allocated = weights + grads + optim + act
        overhead = CONTEXT_GIB + FRAGMENTATION * allocated
        breakdown = {
            "weights_gib": weights,
            "gradients_gib": grads,
            "optimizer_gib": optim,
            "activations_gib": act,
            "comm_buffers_gib": comm,
            "dispatcher_buffers_gib": disp,
            "overhead_gib": overhead,
        }
        stages.append(StageMemory(i, allocated + comm + disp + overhead, breakdown, params, lparams))
    return MemoryEstimate(
        stages=stages, capacity_gib=ctx.capacity_gib, usable_gib=ctx.usable_gib, recompute=config.recompute
    )


def _static_sums(
    ctx: _Context,
    tp: int,
    pp: int,
    ep: int,
    cp: int,
    vpp: int,
    schedule: str,
    deepep: bool,
    dp_shard: int = 1,
) -> tuple[list[float], float, float]:
    """(weights + gradients + optimizer per stage, comm buffers, dispatcher buffers), memoised."""
    key = _static_key(tp, pp, ep, cp, vpp, schedule, deepep, dp_shard)
    sums = ctx.static_sums.get(key)
    if sums is None:
        rows = _static(ctx, tp, pp, ep, cp, vpp, schedule, deepep, dp_shard)
        comm, disp = rows[0][3], rows[0][4]  # the same on every stage
        sums = ctx.static_sums[key] = ([w + g + o for w, g, o, *_ in rows], comm, disp)
    return sums


def peak_memory_gib(spec: StudySpec, config: Any) -> tuple[float, float]:
    """``(peak_gib, usable_gib)``: :func:`estimate_memory`'s peak without the per-stage breakdown (the same
    float: see :func:`peak_memory_all`)."""
    peaks, usable = peak_memory_all(spec, [config])
    return peaks[0], usable


def usable_gib(spec: StudySpec) -> float:
    """The memory a configuration may use (GiB): the GPU's, less ``search.memory_safety_margin``."""
    return _context(spec).usable_gib


def peaks_key(spec: StudySpec) -> tuple[Any, ...]:
    """What :func:`peak_memory_all`'s peaks read of a study: two studies with equal keys give the same peaks of
    the same configurations (the GPU is read for its memory size only, which sets the usable figure alone)."""
    return (
        spec.model.model_dump_json(),
        spec.workload.model_dump_json(),
        spec.pipeline.model_dump_json(),
        spec.world,
        spec.cluster.gpus_per_node,
    )


def peak_memory_all(spec: StudySpec, configs: list[Any]) -> tuple[list[float], float]:
    """The peak GiB of every configuration (as :func:`estimate_memory` gives it) and the usable GiB, for
    ranking whole spaces (:func:`~primus_optuna.physics.plan.plan_space`).

    A stage's total, ``allocated + comm + disp + (CONTEXT_GIB + FRAGMENTATION · allocated)`` with ``comm`` and
    ``disp`` the same on every stage, is non-decreasing in ``allocated`` (each step is a correctly rounded
    addition, or multiplication by a positive constant), so the stage with the most allocated memory has the
    peak total, to the last bit: one total per configuration instead of one per stage."""
    ctx = _context(spec)
    world, gbs = ctx.world, spec.workload.global_batch_size
    stage_acts, static_sums = ctx.stage_acts, ctx.static_sums
    peaks: list[float] = []
    for config in configs:
        tp, pp, ep, cp, mbs = config.tp, config.pp, config.ep, config.cp, config.mbs
        schedule = config.pp_schedule if pp > 1 else "1f1b"
        vpp = config.vpp if schedule in ("interleaved", "zbv") else 1
        dp = config.dp or max(1, world // (tp * cp * pp))
        m = config.num_microbatches or max(1, gbs // (mbs * dp))
        extra_chunk = bool(getattr(config, "ep_overlap", False))
        recompute = config.recompute
        acts = stage_acts.get((tp, cp, mbs, recompute, pp, vpp, schedule, m, extra_chunk))
        if acts is None:
            acts = ctx.stage_activations(tp, cp, mbs, recompute, pp, vpp, schedule, m, extra_chunk)
        deepep = config.moe_dispatcher == "deepep"
        shard = getattr(config, "dp_shard", 1)
        sums = static_sums.get(_static_key(tp, pp, ep, cp, vpp, schedule, deepep, shard))
        if sums is None:
            sums = _static_sums(ctx, tp, pp, ep, cp, vpp, schedule, deepep, shard)
        bases, comm, disp = sums
        allocated = max(map(add, bases, acts))  # weights + grads + optim + act, busiest stage
        peaks.append(allocated + comm + disp + (CONTEXT_GIB + FRAGMENTATION * allocated))
    return peaks, ctx.usable_gib
