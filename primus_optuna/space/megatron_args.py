"""Megatron/Primus argument names of a configuration, both ways.

:func:`megatron_overrides` is the one mapping from a :class:`TrainingConfig` to Megatron-LM/Primus arguments
(underscore names), used by the exporter and by the launch presets; :func:`config_from_megatron` is its
inverse (through :func:`primus_optuna.spec.primus_import.baseline_from_megatron`, which the Primus importer
uses for baselines).
"""

from __future__ import annotations

from typing import Any

from ..spec import StudySpec
from ..spec.primus_import import baseline_from_megatron
from ..spec.recompute import parse_recompute
from ..spec.study import OPTIMIZER_DTYPE_FIELDS
from .config import TrainingConfig


def megatron_overrides(spec: StudySpec, config: TrainingConfig) -> dict[str, Any]:
    """The Megatron/Primus arguments (underscore names) that select ``config`` for ``spec``'s workload."""
    c = config
    out: dict[str, Any] = {
        "tensor_model_parallel_size": c.tp,
        "pipeline_model_parallel_size": c.pp,
        "expert_model_parallel_size": c.ep,
        "context_parallel_size": c.cp,
        "num_virtual_stages_per_pipeline_rank": c.vpp if c.vpp > 1 else None,
        "sequence_parallel": c.tp > 1 and spec.workload.sequence_parallel,
        "micro_batch_size": c.mbs,
        "global_batch_size": spec.workload.global_batch_size,
        "seq_length": spec.workload.seq_length,
        "use_distributed_optimizer": spec.workload.distributed_optimizer,
    }
    out.update(pipeline_overrides(spec, c.pp, c.vpp))
    # none / selective (+ recompute_modules) / full (uniform, 1) / full:N (block, N per virtual chunk)
    out.update(parse_recompute(c.recompute).megatron_args())
    if spec.model.is_moe:
        deepep = c.moe_dispatcher == "deepep"
        out.update(
            moe_token_dispatcher_type="flex" if deepep else "alltoall",
            moe_enable_deepep=deepep,
            use_turbo_deepep=deepep,
        )
        if deepep:
            out.update(enable_primus_turbo=True, moe_router_dtype="fp32")
            if (
                spec.workload.moe_sync_free
            ):  # Primus: stage 2 removes the router, DeepEP and grouped-MLP syncs
                out["turbo_sync_free_moe_stage"] = 2
        if c.ep_overlap:  # Megatron: --overlap-moe-expert-parallel-comm with --delay-wgrad-compute
            out.update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    zb = c.pp_schedule in ("zb1p", "zbv")
    out.update(patch_zero_bubble=zb, enable_zero_bubble=zb, zero_bubble_v_schedule=c.pp_schedule == "zbv")
    if c.pp_schedule == "zbv":
        out["zero_bubble_v_schedule_mem_setup"] = "zb"
    w = spec.workload
    # DP overlap as the workload says, except under zero-bubble (required off by Primus's zero-bubble pipeline,
    # Primus docs: zero-bubble required args); param-gather overlap only with the distributed optimizer
    overlap = w.overlap_grad_reduce and not zb
    out.update(overlap_grad_reduce=overlap, overlap_param_gather=overlap and w.distributed_optimizer)
    if w.tp_comm_overlap and c.tp > 1:
        out["tp_comm_overlap"] = True
    precision = spec.workload.precision
    out.update(bf16=precision in ("bf16", "fp8"), fp16=precision == "fp16")
    out["fp8"] = "hybrid" if precision == "fp8" else None
    w = spec.workload
    # Megatron-LM accumulates and reduces bf16 gradients in fp32 unless --grad-reduce-in-bf16 is given
    # (megatron/training/arguments.py); Megatron-Bridge calls the same switch grad_reduce_in_fp32=False
    out["grad_reduce_in_bf16"] = True if not w.grad_reduce_in_fp32 else None
    out["fp8_param_gather"] = True if precision == "fp8" and w.fp8_param_gather else None
    # Megatron-Core's precision-aware optimizer (megatron/training/arguments.py: --use-precision-aware-optimizer,
    # --main-params-dtype, --main-grads-dtype, --exp-avg-dtype, --exp-avg-sq-dtype; fp32 defaults)
    pao = w.precision_aware_optimizer
    out["use_precision_aware_optimizer"] = True if pao else None
    for name in OPTIMIZER_DTYPE_FIELDS:
        out[name] = getattr(w, name) if pao else None
    return out


def pipeline_overrides(spec: StudySpec, pp: int, vpp: int) -> dict[str, Any]:
    """The study's ``pipeline`` section as Megatron arguments for a ``pp``×``vpp`` layout (none when pp = 1 or
    the section is empty); :func:`~primus_optuna.spec.primus_import.pipeline_from_megatron` reads them back."""
    p = spec.pipeline
    if pp == 1 or p.is_default:
        return {}
    if p.layout is not None:
        # the layout fixes pp·vpp; the legality rules refuse any other pp·vpp
        return {"pipeline_model_parallel_layout": p.layout}
    out: dict[str, Any] = {}
    if p.decoder_first_pipeline_num_layers is not None:
        out["decoder_first_pipeline_num_layers"] = p.decoder_first_pipeline_num_layers
    if p.decoder_last_pipeline_num_layers is not None:
        out["decoder_last_pipeline_num_layers"] = p.decoder_last_pipeline_num_layers
    if p.account_for_embedding_in_pipeline_split:
        out["account_for_embedding_in_pipeline_split"] = True
    if p.account_for_loss_in_pipeline_split:
        out["account_for_loss_in_pipeline_split"] = True
    return out


def config_from_megatron(values: dict[str, Any], spec: StudySpec | None = None) -> TrainingConfig:
    """The :class:`TrainingConfig` a dict of Megatron/Primus arguments selects (absent ones: Megatron defaults);
    derived for ``spec``'s cluster and batch when given."""
    config = TrainingConfig.from_params(baseline_from_megatron(values))
    return config.derive(spec.world, spec.workload.global_batch_size) if spec is not None else config
