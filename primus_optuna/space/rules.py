"""Megatron-Core legality rules, each returning a human reason or ``None``.

Every rule names the axes it reads, so :class:`~primus_optuna.space.Space` can apply it as soon as those axes
are fixed during enumeration (that is what makes whole-space enumeration fast) and :func:`check` can apply all
of them to one configuration. Sources: Megatron-Core argument validation and parallel_state (see
shared/reference/models.md), the constructors and launch code of Megatron-Core and Primus (docs/design.md,
"Rules from framework constructors", lists what was read and where each refusal is encoded); zero-bubble rules
from Primus and Qi et al. 2024.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..spec.layout import PipelineSpec, chunks_or_reason, stage_reason
from ..spec.model import ModelSpec
from ..spec.recompute import parse_recompute
from ..spec.study import StudySpec
from .torchtitan_args import (
    PIPELINE_REASON,
    dispatcher_reason,
    recompute_reason,
    schedule_reason,
    uses_torchtitan,
)


def model_features(model: ModelSpec) -> tuple[bool, bool, int]:
    """(multi-latent attention, shared experts, dense layers of an MoE model) of a model spec
    (``multi_latent_attention``, ``moe_shared_expert_intermediate_size``, ``moe_layer_freq``)."""
    dense = model.num_dense_layers if model.is_moe else 0
    return model.multi_latent_attention, bool(model.shared_expert_ffn), dense


@dataclass(frozen=True, slots=True)
class Facts:
    """The numbers of a study that the rules read, precomputed once."""

    world: int
    max_tp: int
    layers: int
    heads: int
    kv_groups: int
    ffn: int
    expert_ffn: int
    experts: int
    is_moe: bool
    seq: int
    gbs: int
    mla: bool = False
    shared_experts: bool = False
    dense_layers: int = 0
    """dense (non-MoE) layers of an MoE model (e.g. DeepSeek's first_k_dense_replace)"""
    fp8_delayed: bool = False
    """FP8 training with delayed scaling (Megatron's default FP8 recipe)"""
    moe_sync_free: bool = False
    """Primus's sync-free MoE (workload.moe_sync_free, stage 2 with DeepEP)"""
    grad_acc_fusion: bool = True
    """workload.gradient_accumulation_fusion"""
    shared_ffn: int = 0
    """total shared-expert width (TP splits it)"""
    sequence_parallel: bool = True
    """workload.sequence_parallel (Megatron's --sequence-parallel when tp > 1)"""
    tp_comm_overlap: bool = False
    """workload.tp_comm_overlap (Megatron's --tp-comm-overlap, written when tp > 1)"""
    te_op_fuser: bool = False
    """workload.te_op_fuser (Megatron-LM's --use-transformer-engine-op-fuser, not in Primus's pin)"""
    cp_a2a: bool = False
    """the model runs context parallelism as TE's a2a (ModelSpec.cp_comm_type: attention sinks, windows)"""
    upstream_megatron: bool = False
    """the study's runner launches upstream Megatron-LM (``runner.kind: megatron``, or Slurm's megatron
    preset), which has no zero-bubble schedule"""
    torchtitan: bool = False
    """the study's runner launches TorchTitan (``runner.kind: torchtitan``, or Slurm's torchtitan preset): its
    rules (``titan_*``) apply"""
    model: ModelSpec | None = field(default=None, compare=False)
    pipeline: PipelineSpec = field(default_factory=PipelineSpec, compare=False)
    memo: dict[tuple[int, int], str | None] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, spec: StudySpec) -> Facts:
        m = spec.model
        mla, shared, dense = model_features(m)
        w = spec.workload
        return cls(
            mla=mla,
            shared_experts=shared,
            dense_layers=dense,
            fp8_delayed=w.precision == "fp8" and w.fp8_recipe == "delayed",
            moe_sync_free=w.moe_sync_free,
            grad_acc_fusion=w.gradient_accumulation_fusion,
            world=spec.world,
            max_tp=spec.max_tp,
            layers=m.num_layers,
            heads=m.num_attention_heads,
            kv_groups=m.query_groups,
            ffn=m.ffn_hidden_size,
            expert_ffn=m.expert_ffn,
            experts=m.experts,
            is_moe=m.is_moe,
            seq=spec.workload.seq_length,
            gbs=spec.workload.global_batch_size,
            model=m,
            pipeline=spec.pipeline,
            shared_ffn=m.shared_expert_ffn,
            sequence_parallel=w.sequence_parallel,
            tp_comm_overlap=w.tp_comm_overlap,
            te_op_fuser=w.te_op_fuser,
            cp_a2a=m.cp_comm_type == "a2a",
            upstream_megatron=spec.runner.kind == "megatron"
            or (spec.runner.kind == "slurm" and spec.runner.options.get("preset") == "megatron"),
            torchtitan=uses_torchtitan(spec),
        )


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    axes: tuple[str, ...]
    """axes read; ``dp`` stands for (tp, cp, pp) and ``m`` for (tp, cp, pp, mbs)"""
    text: str
    fn: Callable[[Facts, Any], str | None]


def _dp(f: Facts, c: Any) -> int:
    inner = c.tp * c.cp * c.pp
    return f.world // inner if f.world % inner == 0 else 0


def _world(f: Facts, c: Any) -> str | None:
    inner = c.tp * c.cp * c.pp
    if f.world % inner:
        return f"tp·cp·pp = {c.tp}·{c.cp}·{c.pp} = {inner} does not divide the {f.world} GPUs (world = tp·cp·pp·dp)"
    return None


def _tp_max(f: Facts, c: Any) -> str | None:
    if c.tp > f.max_tp:
        return f"tp={c.tp} exceeds max_tp={f.max_tp} (tensor parallelism stays inside a node; raise search.max_tp to allow it)"
    return None


def _tp_heads(f: Facts, c: Any) -> str | None:
    if f.heads % c.tp:
        return f"tp={c.tp} does not divide the {f.heads} attention heads"
    return None


def _tp_kv(f: Facts, c: Any) -> str | None:
    if not f.mla and f.kv_groups % c.tp:
        return f"tp={c.tp} does not divide the {f.kv_groups} KV groups (num_query_groups)"
    return None


def _tp_ffn(f: Facts, c: Any) -> str | None:
    if f.ffn % c.tp:
        return f"tp={c.tp} does not divide ffn_hidden_size={f.ffn}"
    if f.is_moe and f.expert_ffn % c.tp:
        return f"tp={c.tp} does not divide moe_ffn_hidden_size={f.expert_ffn}"
    if f.shared_ffn % c.tp:
        return f"tp={c.tp} does not divide moe_shared_expert_intermediate_size={f.shared_ffn}"
    return None


def _seq_cp(f: Facts, c: Any) -> str | None:
    if c.cp > 1 and f.seq % (2 * c.cp):
        return f"seq_length={f.seq} is not divisible by 2·cp={2 * c.cp} (load-balanced causal context split)"
    return None


def _cp_a2a_heads(f: Facts, c: Any) -> str | None:
    # TE's a2a context parallelism scatters each rank's heads over the CP group: it asserts that cp divides the
    # query heads and the KV heads of a TP rank (dot_product_attention/context_parallel.py@d0067d0d:4246-4249)
    if c.cp == 1 or not f.cp_a2a:
        return None
    heads, kv = f.heads // c.tp, f.kv_groups // c.tp
    if heads % c.cp or kv % c.cp:
        return (
            f"cp={c.cp} does not divide the {heads} attention heads and {kv} KV heads of a TP rank (tp={c.tp}): "
            "this model's attention (sinks or sliding windows) runs context parallelism as TransformerEngine's "
            "a2a, which splits the heads over cp"
        )
    return None


def _seq_tp(f: Facts, c: Any) -> str | None:
    if c.tp > 1 and f.seq % (c.tp * c.cp):
        return (
            f"seq_length={f.seq} is not divisible by tp·cp={c.tp * c.cp} (sequence parallelism splits each "
            "context-parallel chunk over tp)"
        )
    return None


def _moe_tp_sp(f: Facts, c: Any) -> str | None:
    # megatron/core/transformer/moe/moe_layer.py@d98e8a64:636-640 raises in training
    if f.is_moe and c.tp > 1 and not f.sequence_parallel:
        return (
            f"tp={c.tp} on an MoE model needs sequence parallelism (Megatron-Core's MoE layer raises without it); "
            "set workload.sequence_parallel: true or use tp=1"
        )
    return None


def _tp_comm_overlap_sp(f: Facts, c: Any) -> str | None:
    # Megatron-LM validate_args: --tp-comm-overlap asserts sequence parallelism
    # (megatron/training/arguments.py@d98e8a64:1441-1442, @d3528a21:1153-1154); the export writes it when tp > 1
    if c.tp > 1 and f.tp_comm_overlap and not f.sequence_parallel:
        return (
            f"tp={c.tp} with workload.tp_comm_overlap needs sequence parallelism (Megatron-LM asserts "
            "'Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled', "
            "arguments.py@d98e8a64:1442); set workload.sequence_parallel: true, tp_comm_overlap: false, or use tp=1"
        )
    return None


def _pp_layers(f: Facts, c: Any) -> str | None:
    if f.model is None:
        return f"pp={c.pp} does not divide the {f.layers} layers" if f.layers % c.pp else None
    return stage_reason(f.model, f.pipeline, c.pp)


def _pp1(f: Facts, c: Any) -> str | None:
    if c.pp == 1 and (c.vpp != 1 or c.pp_schedule != "1f1b"):
        return f"pp=1 has no pipeline: vpp must be 1 and pp_schedule 1f1b (got vpp={c.vpp}, {c.pp_schedule})"
    return None


def _vpp_layers(f: Facts, c: Any) -> str | None:
    if f.model is None:
        if c.vpp > 1 and f.layers % (c.pp * c.vpp):
            return f"vpp={c.vpp} needs the {f.layers} layers divisible by pp·vpp={c.pp * c.vpp}"
        return None
    if c.pp == 1:
        return None  # rule pp1_no_pipeline covers vpp > 1 without a pipeline
    key = (c.pp, c.vpp)
    if key not in f.memo:
        # a pp that cannot split the layers at all is rule pp_layers' to report, once
        blocked = stage_reason(f.model, f.pipeline, c.pp) is not None
        f.memo[key] = None if blocked else chunks_or_reason(f.model, f.pipeline, c.pp, c.vpp)[1]
    return f.memo[key]


def _schedule_vpp(f: Facts, c: Any) -> str | None:
    s, v = c.pp_schedule, c.vpp
    if s in ("1f1b", "zb1p") and v != 1:
        return f"pp_schedule={s} needs vpp=1 (got vpp={v}); use interleaved or zbv for virtual stages"
    if s == "interleaved" and v == 1:
        return "pp_schedule=interleaved needs vpp>1 (with vpp=1 it is 1f1b)"
    if s == "zbv" and v != 2:
        return f"pp_schedule=zbv needs exactly vpp=2 (got vpp={v})"
    return None


def _mb_whole(f: Facts, c: Any) -> str | None:
    dp = _dp(f, c)
    if dp and f.gbs % (c.mbs * dp):
        return f"global_batch_size={f.gbs} is not divisible by mbs·dp={c.mbs}·{dp}={c.mbs * dp}"
    return None


def _mb_pp(f: Facts, c: Any) -> str | None:
    dp = _dp(f, c)
    if not dp or f.gbs % (c.mbs * dp):
        return None
    m = f.gbs // (c.mbs * dp)
    # 1F1B caps its warm-up at the micro-batches there are (Megatron-Core
    # pipeline_parallel/schedules.py@d98e8a64:2277-2278; Primus's zero-bubble 1F1B
    # zerobubble/scheduler/basic1f1b.py@fd1eeabb:19): it runs with fewer than pp, idle stages and all.
    # Interleaved refuses it (schedules.py@d98e8a64:1160-1168); the zero-bubble schedules keep the rule
    # because this project's schedule models of them assume a full pipeline. torch's Schedule1F1B, which
    # TorchTitan runs, refuses it (torch/distributed/pipelining/schedules.py@2.13.0:1020-1024).
    if c.pp > 1 and m < c.pp and (c.pp_schedule != "1f1b" or f.torchtitan):
        return f"{m} micro-batches per step < pp={c.pp}: {c.pp_schedule} cannot fill the pipeline (lower mbs or pp)"
    return None


def _mb_interleaved(f: Facts, c: Any) -> str | None:
    dp = _dp(f, c)
    if c.pp_schedule != "interleaved" or not dp or f.gbs % (c.mbs * dp):
        return None
    m = f.gbs // (c.mbs * dp)
    if m % c.pp:
        return f"the interleaved schedule needs micro-batches ({m}) to be a multiple of pp={c.pp}"
    return None


def _ep_moe(f: Facts, c: Any) -> str | None:
    if c.ep > 1 and not f.is_moe:
        return f"ep={c.ep} needs an MoE model (this model is dense; use ep=1)"
    return None


def _ep_experts(f: Facts, c: Any) -> str | None:
    if f.is_moe and f.experts % c.ep:
        return f"ep={c.ep} does not divide the {f.experts} experts"
    return None


def _ep_fold(f: Facts, c: Any) -> str | None:
    if c.ep > 1 and (f.world % c.pp or (f.world // c.pp) % c.ep):
        return (
            f"ep={c.ep} does not divide world/pp={f.world}/{c.pp} (expert parallelism folds into the non-pipeline "
            "ranks, expert_tensor_parallel_size=1)"
        )
    return None


def _deepep_moe(f: Facts, c: Any) -> str | None:
    if c.moe_dispatcher == "deepep" and not f.is_moe:
        return "moe_dispatcher=deepep applies to MoE layers only (this model is dense; use alltoall)"
    return None


EXPORTED_EXPERT_TP = 1
"""The expert tensor-parallel size every export writes (``expert_tensor_parallel_size: 1``,
:func:`~primus_optuna.space.megatron_args.megatron_overrides`): the MoE layer's "tp" group is this one, not tp
(``pg_collection.expt_tp``, megatron/core/transformer/moe/token_dispatcher.py@d98e8a64:86,89)."""


def _deepep_ep(f: Facts, c: Any) -> str | None:
    # the flex dispatcher's communication group is expert-TP x EP and it refuses a group of one:
    # megatron/core/transformer/moe/token_dispatcher.py@d98e8a64:1836 (DeepEP; NCCL EP :1854), @d3528a21:1359
    # (every flex backend, Primus's pin), megatron-core 0.16.1 token_dispatcher.py:1346; Primus-Turbo's DeepEP
    # dispatcher that Primus substitutes raises the same (primus/backends/megatron/core/extensions/
    # primus_turbo.py@fd1eeabb:2320-2321)
    if f.is_moe and c.moe_dispatcher == "deepep" and EXPORTED_EXPERT_TP * c.ep <= 1:
        return (
            f"moe_dispatcher=deepep needs ep > 1: Megatron-Core's flex dispatcher asserts expert-TP x EP > 1 "
            f"(token_dispatcher.py@d98e8a64:1836, 'DeepEP dispatcher requires TPxEP > 1'), and the export's "
            f"expert_tensor_parallel_size is {EXPORTED_EXPERT_TP} whatever tp is (got tp={c.tp}, ep={c.ep}); "
            "use ep > 1 or moe_dispatcher=alltoall"
        )
    return None


def _zb_recompute(f: Facts, c: Any) -> str | None:
    if c.pp_schedule in ("zb1p", "zbv") and c.recompute != "none":
        return f"pp_schedule={c.pp_schedule} (zero bubble) is incompatible with recompute={c.recompute}; use recompute=none"
    return None


def _zb_pipeline(f: Facts, c: Any) -> str | None:
    # Primus's zero-bubble schedules split the layers evenly themselves: zbv asserts layers divisible by pp
    # with an even count per stage (primus/backends/megatron/core/pipeline_parallel/zerobubble/zbpp_utils.py
    # @fd1eeabb:149-160, it sets num_layers_per_virtual_pipeline_stage itself, which Megatron allows only
    # without a layout, megatron/training/arguments.py@d98e8a64:928-939), and the zb scheduler's
    # communication order assumes no layout (zerobubble/scheduler/communication.py@fd1eeabb:288-292)
    if c.pp_schedule not in ("zb1p", "zbv") or f.pipeline.is_default:
        return None
    what = (
        "pipeline.layout" if f.pipeline.layout is not None else "an uneven pipeline split (pipeline section)"
    )
    return (
        f"pp_schedule={c.pp_schedule} (Primus zero bubble) splits the layers evenly itself and cannot run "
        f"{what}; use 1f1b/interleaved or remove the pipeline section"
    )


def _zb_requirements(f: Facts, c: Any) -> str | None:
    # Primus zero bubble requires gradient_accumulation_fusion: true (zerobubble/README.md@fd1eeabb:14-20)
    if c.pp_schedule in ("zb1p", "zbv") and not f.grad_acc_fusion:
        return (
            f"pp_schedule={c.pp_schedule} (Primus zero bubble) needs gradient accumulation fusion; set "
            "workload.gradient_accumulation_fusion: true or use 1f1b/interleaved"
        )
    return None


def _zb_upstream(f: Facts, c: Any) -> str | None:
    # the zero-bubble schedules are Primus patches: upstream Megatron-LM's parser has no zero-bubble argument
    # (no "zero_bubble" in megatron/training/arguments.py@d98e8a64; Primus adds enable_zero_bubble,
    # primus/backends/megatron/core/pipeline_parallel/zerobubble/README.md@fd1eeabb)
    if c.pp_schedule in ("zb1p", "zbv") and f.upstream_megatron:
        return (
            f"pp_schedule={c.pp_schedule} (Primus zero bubble) does not exist in upstream Megatron-LM, which the "
            "megatron runner launches; use runner.kind: primus, or 1f1b/interleaved"
        )
    return None


def _zb_op_fuser(f: Facts, c: Any) -> str | None:
    # the zero-bubble schedules exist only in Primus, whose pinned Megatron-LM has no
    # use_transformer_engine_op_fuser (transformer_config.py@d3528a21; upstream @d98e8a64:525-527)
    if c.pp_schedule in ("zb1p", "zbv") and f.te_op_fuser:
        return (
            f"pp_schedule={c.pp_schedule} (Primus zero bubble) cannot run workload.te_op_fuser (the Megatron-LM "
            "that Primus pins has no TE op fuser); use 1f1b/interleaved or workload.te_op_fuser: false"
        )
    return None


def _sync_free_tp(f: Facts, c: Any) -> str | None:
    # sync-free MoE stage 2 auto-enables Primus-Turbo's grouped GEMM
    # (primus/backends/megatron/patches/args/rocm_arg_validation.py@fd1eeabb:55-61,199-206), whose layers
    # assert tensor parallel size 1 (primus/backends/megatron/core/extensions/primus_turbo.py@fd1eeabb:2024)
    if f.is_moe and f.moe_sync_free and c.moe_dispatcher == "deepep" and c.tp > 1:
        return (
            f"workload.moe_sync_free (Primus sync-free MoE, stage 2) runs Primus-Turbo's grouped GEMM, which needs "
            f"tp=1 (got tp={c.tp}); use tp=1, alltoall, or moe_sync_free: false"
        )
    return None


def _ep_overlap(f: Facts, c: Any) -> str | None:
    # Megatron-Core TransformerConfig.__post_init__ (overlap_moe_expert_parallel_comm): expert parallelism,
    # a virtual pipeline when pp > 1, no full recompute (alltoall and flex dispatchers both allowed)
    if not getattr(c, "ep_overlap", False):
        return None
    if not f.is_moe or c.ep <= 1:
        return "ep_overlap needs an MoE model with ep > 1 (Megatron: expert model parallelism)"
    if c.pp > 1 and c.pp_schedule != "interleaved":
        return (
            f"ep_overlap with pp={c.pp} needs pp_schedule=interleaved (Megatron: a virtual pipeline); "
            "use interleaved or ep_overlap=false"
        )
    mtp = (f.model.mtp_num_layers or 0) if f.model is not None else 0
    # MTP: at most one layer (transformer_config.py@d98e8a64:3042-3046), and, in Megatron-Core 0.16 and Primus's
    # pin, a pipeline (transformer_config.py@d3528a21:2065-2071: 'Pipeline model parallel size must be larger
    # than 1 when enabling overlap_moe_expert_parallel_comm with MTP layer'; lifted on Megatron-LM main)
    if mtp > 1:
        return (
            f"ep_overlap with mtp_num_layers={mtp} is refused by Megatron (at most one MTP layer); "
            "use ep_overlap=false or one MTP layer"
        )
    if mtp == 1 and c.pp <= 1:
        return (
            "ep_overlap with an MTP layer needs pp > 1 (Megatron-Core 0.16 and Primus's Megatron refuse pp=1); "
            "use pp >= 2 or ep_overlap=false"
        )
    r = parse_recompute(c.recompute)
    if r.is_full:
        return (
            f"ep_overlap is incompatible with recompute={c.recompute} (Megatron: no full recompute, no recompute "
            "method/num_layers); use selective/none or ep_overlap=false"
        )
    if r.has("moe"):
        return (
            f"ep_overlap is incompatible with recompute={c.recompute} (Megatron: no 'moe' in recompute_modules); "
            "use selective:moe_act or ep_overlap=false"
        )
    return None


def _recompute_modules(f: Facts, c: Any) -> str | None:
    r = parse_recompute(c.recompute)
    if not r.modules:
        return None
    if not f.is_moe and (r.has("moe") or r.has("moe_act")):
        return f"recompute={c.recompute}: this model is dense, it has no MoE layers to recompute (use mlp)"
    if f.is_moe and not f.dense_layers and r.has("mlp"):
        return f"recompute={c.recompute}: every layer of this model is MoE, it has no dense MLP (use moe or moe_act)"
    if r.has("mla_up_proj") and not f.mla:
        return f"recompute={c.recompute}: mla_up_proj needs multi-latent attention (this model has none)"
    if r.has("shared_experts") and not f.shared_experts:
        return f"recompute={c.recompute}: this model has no shared experts"
    return None


def _recompute_fp8(f: Facts, c: Any) -> str | None:
    r = parse_recompute(c.recompute)
    if f.fp8_delayed and (r.has("moe_act") or r.has("layernorm")):
        return (
            f"recompute={c.recompute}: moe_act and layernorm recompute are rejected with FP8 delayed scaling "
            "(Transformer Engine cannot keep their original input); use workload.fp8_recipe tensorwise/mxfp8"
        )
    return None


def layers_per_chunk(layers: int, pp: int, vpp: int) -> int:
    """The transformer layers of a virtual pipeline chunk, rounded up: ``full:N`` recomputes every layer (it is
    ``full``) when ``N`` reaches it. With a layout or first/last-stage split that leaves chunks uneven, this is
    the mean chunk rounded up, as the step-time and memory models count it (``layers / chunks``); the one
    definition :meth:`Space.canonical` and rule ``recompute_layers`` share, so that the space never holds
    both ``full:N`` and ``full`` for one physical configuration."""
    chunks = pp * (vpp if pp > 1 else 1)
    return -(-layers // chunks)


def _recompute_layers(f: Facts, c: Any) -> str | None:
    r = parse_recompute(c.recompute)
    if not r.num_layers:
        return None
    per_chunk = layers_per_chunk(f.layers, c.pp, c.vpp)
    if r.num_layers >= per_chunk:
        return (
            f"recompute={c.recompute} needs N < the {per_chunk} layers of each virtual pipeline chunk "
            f"(pp·vpp = {c.pp}·{c.vpp}); N = all of them is recompute=full"
        )
    return None


_P = ("tp", "cp", "pp")


def _fsdp_dp(f: Facts, c: Any) -> str | None:
    # TorchTitan: dp_replicate · dp_shard · cp · tp · pp = world (torchtitan/distributed/parallel_dims.py@
    # b5bcd76c:182-185); Megatron-FSDP's HSDP: the DP group splits into whole replicas
    # (megatron/core/parallel_state.py@d98e8a64:924)
    if c.dp_shard > 1:
        dp = _dp(f, c)
        if dp and dp % c.dp_shard:
            return (
                f"dp_shard={c.dp_shard} does not divide dp={dp} (dp_replicate = dp / dp_shard); pick a divisor "
                "of dp, or dp_shard=1 for the distributed optimizer"
            )
    return None


def _fsdp_ep(f: Facts, c: Any) -> str | None:
    # TorchTitan shards experts over dp_shard·cp·tp / ep ranks (efsdp):
    # torchtitan/distributed/parallel_dims.py@b5bcd76c:187-191
    if c.dp_shard > 1 and c.ep > 1 and (c.dp_shard * c.cp * c.tp) % c.ep:
        return (
            f"ep={c.ep} does not divide dp_shard·cp·tp = {c.dp_shard}·{c.cp}·{c.tp} (FSDP shards the experts "
            "over the rest); raise dp_shard or lower ep"
        )
    return None


RULES: tuple[Rule, ...] = (
    Rule("tp_max", ("tp",), "tp ≤ max_tp", _tp_max),
    Rule("tp_heads", ("tp",), "tp divides the attention heads", _tp_heads),
    Rule("tp_kv_groups", ("tp",), "tp divides the KV groups", _tp_kv),
    Rule("tp_ffn", ("tp",), "tp divides the FFN widths", _tp_ffn),
    Rule("seq_cp", ("cp",), "seq_length divisible by 2·cp", _seq_cp),
    Rule(
        "cp_a2a_heads",
        ("tp", "cp"),
        "a2a context parallelism (attention sinks, sliding windows): cp divides a TP rank's heads and KV heads",
        _cp_a2a_heads,
    ),
    Rule("seq_tp", ("tp", "cp"), "seq_length divisible by tp·cp when tp>1 (sequence parallel)", _seq_tp),
    Rule("moe_tp_sp", ("tp",), "MoE with tp>1 needs sequence parallelism", _moe_tp_sp),
    Rule(
        "tp_comm_overlap_sp",
        ("tp",),
        "TP communication overlap with tp>1 needs sequence parallelism",
        _tp_comm_overlap_sp,
    ),
    Rule("world", _P, "tp·cp·pp divides the world size", _world),
    Rule("pp_layers", ("pp",), "pp divides the layers (or pipeline.layout / first-last split)", _pp_layers),
    Rule("ep_moe", ("ep",), "ep>1 only for MoE models", _ep_moe),
    Rule("ep_experts", ("ep",), "ep divides the experts", _ep_experts),
    Rule("ep_fold", ("pp", "ep"), "ep divides world/pp", _ep_fold),
    Rule(
        "vpp_layers",
        ("pp", "vpp"),
        "layers divide over pp·vpp chunks (pipeline.layout fixes pp·vpp)",
        _vpp_layers,
    ),
    Rule(
        "schedule_vpp",
        ("vpp", "pp_schedule"),
        "1f1b/zb1p need vpp=1, interleaved vpp>1, zbv vpp=2",
        _schedule_vpp,
    ),
    Rule("pp1_no_pipeline", ("pp", "vpp", "pp_schedule"), "pp=1 means vpp=1 and 1f1b", _pp1),
    Rule("mb_whole", (*_P, "mbs"), "GBS divisible by mbs·dp", _mb_whole),
    Rule("mb_ge_pp", (*_P, "mbs", "pp_schedule"), "micro-batches ≥ pp (not for 1f1b)", _mb_pp),
    Rule(
        "mb_interleaved",
        (*_P, "mbs", "pp_schedule"),
        "interleaved needs micro-batches a multiple of pp",
        _mb_interleaved,
    ),
    Rule(
        "zb_recompute",
        ("pp_schedule", "recompute"),
        "zero-bubble schedules need recompute=none",
        _zb_recompute,
    ),
    Rule("deepep_moe", ("moe_dispatcher",), "deepep only for MoE models", _deepep_moe),
    Rule(
        "deepep_ep",
        ("ep", "moe_dispatcher"),
        "deepep (the flex dispatcher) needs expert-TP·ep > 1, i.e. ep > 1 with the exported expert TP of 1",
        _deepep_ep,
    ),
    Rule(
        "zb_pipeline",
        ("pp_schedule",),
        "zero-bubble schedules need an even split (no pipeline.layout or first/last-stage split)",
        _zb_pipeline,
    ),
    Rule(
        "zb_requirements",
        ("pp_schedule",),
        "zero-bubble schedules need gradient accumulation fusion",
        _zb_requirements,
    ),
    Rule(
        "zb_upstream",
        ("pp_schedule",),
        "zero-bubble schedules need Primus (not the megatron runner's upstream Megatron-LM)",
        _zb_upstream,
    ),
    Rule(
        "zb_op_fuser",
        ("pp_schedule",),
        "zero-bubble schedules (Primus) cannot run the TE op fuser",
        _zb_op_fuser,
    ),
    Rule(
        "sync_free_tp",
        ("tp", "moe_dispatcher"),
        "sync-free MoE (DeepEP) needs tp=1",
        _sync_free_tp,
    ),
    Rule(
        "ep_overlap",
        ("ep", "pp", "pp_schedule", "recompute", "ep_overlap"),
        "ep_overlap needs ep>1, interleaved when pp>1, no full recompute, pp>1 with an MTP layer",
        _ep_overlap,
    ),
    Rule(
        "recompute_modules",
        ("recompute",),
        "selective recompute modules exist in the model",
        _recompute_modules,
    ),
    Rule(
        "recompute_fp8",
        ("recompute",),
        "no moe_act/layernorm recompute with FP8 delayed scaling",
        _recompute_fp8,
    ),
    Rule(
        "recompute_layers",
        ("pp", "vpp", "recompute"),
        "full:N needs N < layers per virtual pipeline chunk",
        _recompute_layers,
    ),
)
RULES += (
    Rule("fsdp_dp", (*_P, "dp_shard"), "dp_shard divides dp (dp_replicate = dp / dp_shard)", _fsdp_dp),
    Rule("fsdp_ep", (*_P, "ep", "dp_shard"), "with dp_shard > 1, ep divides dp_shard·cp·tp", _fsdp_ep),
)


# --- TorchTitan (a study whose runner launches it; torchtitan==0.3.0 wheel, space/torchtitan_args.py) ------------
def _titan_schedule(f: Facts, c: Any) -> str | None:
    return schedule_reason(c.pp_schedule) if f.torchtitan else None


def _titan_recompute(f: Facts, c: Any) -> str | None:
    return recompute_reason(c.recompute) if f.torchtitan else None


def _titan_dispatcher(f: Facts, c: Any) -> str | None:
    return dispatcher_reason(c.moe_dispatcher, c.ep_overlap) if f.torchtitan else None


def _titan_pipeline(f: Facts, c: Any) -> str | None:
    return PIPELINE_REASON if f.torchtitan and c.pp > 1 and not f.pipeline.is_default else None


def _titan_ddp(f: Facts, c: Any) -> str | None:
    # TorchTitan has no ZeRO-1: dp_shard = 1 with dp_replicate > 1 is DDP, everything replicated
    # (torchtitan/config/configs.py@0.3.0:113-122), which the estimate does not price as dp_shard = 1
    dp = _dp(f, c)
    if f.torchtitan and c.dp_shard == 1 and dp > 1:
        return (
            f"dp_shard=1 with dp={dp}: TorchTitan runs DDP (no distributed optimizer, configs.py@0.3.0:113-122); "
            "shard over dp (dp_shard > 1: FSDP, or HSDP with dp / dp_shard replicas)"
        )
    return None


def _titan_ep(f: Facts, c: Any) -> str | None:
    # TorchTitan's sparse mesh: efsdp = dp_shard·cp·tp / ep ranks shard the experts
    # (torchtitan/distributed/parallel_dims.py@0.3.0:277-279, 401), with or without FSDP
    if f.torchtitan and c.ep > 1 and (c.dp_shard * c.cp * c.tp) % c.ep:
        return (
            f"ep={c.ep} does not divide dp_shard·cp·tp = {c.dp_shard}·{c.cp}·{c.tp} (TorchTitan's expert mesh, "
            "parallel_dims.py@0.3.0:279); raise dp_shard or lower ep"
        )
    return None


def _titan_seq(f: Facts, c: Any) -> str | None:
    # the trainer: seq_len divisible by tp (sequence parallel) times 2·cp (cp > 1) (torchtitan/trainer.py@0.3.0:
    # 306-315)
    divisor = (c.tp if f.sequence_parallel else 1) * (2 * c.cp if c.cp > 1 else 1)
    if f.torchtitan and f.seq % divisor:
        return (
            f"seq_length={f.seq} is not divisible by {divisor} (tp·2·cp, TorchTitan's trainer.py@0.3.0:306-315); "
            "lower tp or cp"
        )
    return None


RULES += (
    Rule("titan_seq", ("tp", "cp"), "TorchTitan: seq_length divisible by tp·2·cp", _titan_seq),
    Rule(
        "titan_schedule",
        ("pp_schedule",),
        "TorchTitan: no single-stage zero-bubble schedule",
        _titan_schedule,
    ),
    Rule(
        "titan_recompute",
        ("recompute",),
        "TorchTitan: recompute is none, selective or full",
        _titan_recompute,
    ),
    Rule(
        "titan_dispatcher",
        ("moe_dispatcher", "ep_overlap"),
        "TorchTitan: alltoall dispatch, no EP overlap",
        _titan_dispatcher,
    ),
    Rule("titan_pipeline", ("pp",), "TorchTitan: an even pipeline split", _titan_pipeline),
    Rule("titan_ddp", (*_P, "dp_shard"), "TorchTitan: dp_shard > 1 when dp > 1 (no ZeRO-1)", _titan_ddp),
    Rule("titan_ep", (*_P, "ep", "dp_shard"), "TorchTitan: ep divides dp_shard·cp·tp", _titan_ep),
)
RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}


def check(facts: Facts, config: Any) -> list[str]:
    """Every violated rule's reason (empty = legal)."""
    return [r for r in (rule.fn(facts, config) for rule in RULES) if r]
