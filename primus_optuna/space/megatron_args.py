"""Megatron/Primus argument names of a configuration, both ways.

:func:`megatron_overrides` is the one mapping from a :class:`TrainingConfig` to Megatron-LM/Primus arguments
(underscore names, Megatron's ``dest`` names), used by the exporter and by the launch presets;
:func:`model_arguments` is the model's architecture in the same names, :func:`megatron_flags` renders either
as command-line flags, and :func:`config_from_megatron` is the inverse (through
:func:`primus_optuna.spec.primus_import.baseline_from_megatron`, which the Primus importer uses for baselines).

Values follow what the frameworks accept (sources: Megatron-LM ``d98e8a64`` = main and ``d3528a21`` = the
commit Primus pins; Primus ``fd1eeabb``):

- a key whose Megatron default is not None is never written as None: Primus's argument builder passes a
  None through on purpose (``primus/backends/megatron/argument_builder.py@fd1eeabb:137,193``) and the pinned
  Megatron then fails ``dtype_map[None]``-style lookups or, for a boolean, silently flips its meaning
  (``megatron/training/arguments.py@d98e8a64:1077-1086``); None is written only where it is Megatron's
  "off" (``recompute_*``, ``fp8``, ``num_virtual_stages_per_pipeline_rank``), so that it clears the value of
  a user's Primus experiment;
- Primus-only switches (:data:`PRIMUS_ONLY`: Primus-Turbo, the zero-bubble patches, Primus's YAML-default
  fixes) are written only for Primus (``primus=True``: the Primus overlay, or a study on AMD GPUs), and
  Primus-Turbo's (ROCm only, :data:`ROCM_ONLY`) only for AMD GPUs.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from ..spec import StudySpec
from ..spec.optimizer import OPTIMIZER_DTYPE_FIELDS
from ..spec.primus_import import baseline_from_megatron
from ..spec.recompute import parse_recompute
from .config import TrainingConfig
from .rules import EXPORTED_EXPERT_TP

PRIMUS_ONLY: tuple[str, ...] = (
    "use_turbo_deepep",
    "turbo_sync_free_moe_stage",
    "use_turbo_grouped_gemm",
    "enable_primus_turbo",
    "moe_enable_deepep",
    "patch_zero_bubble",
    "enable_zero_bubble",
    "zero_bubble_v_schedule",
    "zero_bubble_v_schedule_mem_setup",
    "cuda_graph_scope",
)
"""Keys written only for Primus: Primus's own switches (upstream Megatron-LM's parser refuses them), the
deprecated ``moe_enable_deepep`` that Primus-Turbo's DeepEP dispatcher still asserts
(``primus/backends/megatron/core/extensions/primus_turbo.py@fd1eeabb:2323``; upstream selects DeepEP with
``--moe-flex-dispatcher-backend deepep``, ``megatron/core/transformer/transformer_config.py@d98e8a64:1743-1752``),
and ``cuda_graph_scope: []``, which undoes Primus's string default (below)."""

TURBO_KEYS: tuple[str, ...] = (
    "enable_primus_turbo",
    "use_turbo_autotune",
    "turbo_gemm_backend",
    "turbo_grouped_gemm_backend",
    "mxfp4_gradient_stochastic_rounding",
    "use_turbo_attention",
    "use_sink_attention",
    "sink_sliding_window",
    "sink_window_even_layers_only",
    "enable_turbo_attention_float8",
    "use_turbo_gemm",
    "use_turbo_grouped_gemm",
    "turbo_grouped_gemm_without_padding",
    "use_turbo_fused_act_with_probs",
    "moe_use_fused_router_with_aux_score",
    "use_turbo_deepep",
    "turbo_deepep_num_cu",
    "turbo_deepep_use_comm_stream",
    "turbo_sync_free_moe_stage",
    "use_turbo_mega_moe",
    "turbo_mega_moe_precision",
    "use_turbo_rms_norm",
    "use_turbo_norm_te_linear",
)
"""Primus-Turbo's keys: those of ``primus/configs/modules/megatron/primus_turbo.yaml``@fd1eeabb:3-81, every one
off by default. Primus-Turbo is ROCm's ("High-performance ROCm operators", ``docs/02-user-guide/
primus-tools.md``@fd1eeabb:16; built for gfx942/gfx950, ``docs/01-getting-started/bare-metal-installation.md``
@fd1eeabb:337) and Primus's DeepEP dispatcher is Turbo's (``patches/turbo/moe_dispatcher_patches.py``
@fd1eeabb:19-31)."""
ROCM_ONLY: tuple[str, ...] = (*TURBO_KEYS, "moe_enable_deepep", "use_rocm_mem_info")
"""What a Primus overlay writes only on AMD GPUs (:func:`runs_turbo`): Primus-Turbo's keys, the deprecated
``moe_enable_deepep`` that only Turbo's DeepEP dispatcher asserts (upstream selects DeepEP with
``moe_flex_dispatcher_backend``), and ``use_rocm_mem_info``, which calls ``rocm-smi`` every iteration
(``primus/core/utils/rocm_mem_info.py``@fd1eeabb:18-26)."""

ZERO_BUBBLE = ("zb1p", "zbv")

NEGATED_FLAGS: dict[str, str] = {
    "add_bias_linear": "--disable-bias-linear",
    "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
    "create_attention_mask_in_dataloader": "--no-create-attention-mask-in-dataloader",
    "bias_dropout_fusion": "--no-bias-dropout-fusion",
}
"""Megatron ``store_false`` arguments (default True): False is written as their negative flag, True left out."""
FLAG_NAMES: dict[str, str] = {"fp8": "--fp8-format"}
"""Keys whose command-line flag is named differently (Primus ``fp8: hybrid`` = ``--fp8-format hybrid``)."""
PATTERN_ARGS = ("moe_layer_freq", "window_attn_skip_freq")
"""Per-layer 0/1 lists written as Megatron's list expression (``([0]*3+[1]*58)``)."""


TE_OP_FUSER_ENV: dict[str, str] = {"NVTE_CUTEDSL_FUSED_GROUPED_MLP": "1"}
"""Launch environment of ``workload.te_op_fuser``: without it Megatron's TEGroupedMLP refuses the fused path
for a gated (SwiGLU) expert MLP and its assertion fails (``megatron/core/transformer/moe/experts.py@d98e8a64``:
286-290, 450-455)."""


def launch_env(spec: StudySpec) -> dict[str, str]:
    """Environment variables a launch of ``spec``'s workload needs besides its arguments (the Megatron runner
    adds them, the ``env`` export writes them, the ``megatron`` export names them)."""
    return dict(TE_OP_FUSER_ENV) if spec.workload.te_op_fuser else {}


def uses_primus(spec: StudySpec) -> bool:
    """Whether a study's exports default to Primus (its GPUs are AMD's: Primus is the Megatron that runs
    there); an NVIDIA study exports what upstream Megatron-LM accepts."""
    return spec.cluster.gpu.vendor == "amd"


def runs_turbo(spec: StudySpec) -> bool:
    """Whether a Primus run of ``spec`` may use Primus-Turbo (:data:`TURBO_KEYS`): on AMD GPUs only."""
    return spec.cluster.gpu.vendor == "amd"


def export_refusal(spec: StudySpec, *, primus: bool) -> str | None:
    """Why ``spec``'s workload cannot be exported as Megatron-LM (``primus=False``) or Primus arguments (None
    when it can): the one check :func:`megatron_overrides` raises on and the run summary's suggestion reads."""
    w = spec.workload
    if w.te_op_fuser and primus:
        # absent from the Megatron-LM that Primus pins: no use_transformer_engine_op_fuser in
        # transformer_config.py@d3528a21 (upstream: transformer_config.py@d98e8a64:525-527)
        return (
            "workload.te_op_fuser: a Primus export cannot express --use-transformer-engine-op-fuser (the "
            "Megatron-LM that Primus pins, d3528a21, has no use_transformer_engine_op_fuser); export Megatron-LM "
            "arguments for an NVIDIA study (not zero bubble), or set workload.te_op_fuser: false"
        )
    if w.fp8_output_proj and primus:
        # absent from the Megatron-LM that Primus pins (no fp8_output_proj in transformer_config.py@d3528a21;
        # upstream transformer_config.py@d98e8a64:635)
        return (
            "workload.fp8_output_proj: a Primus export cannot express --fp8-output-proj (the Megatron-LM that "
            "Primus pins, d3528a21, has no fp8_output_proj); export Megatron-LM arguments for an NVIDIA study "
            "(not zero bubble), or set workload.fp8_output_proj: false"
        )
    if w.fp8_dot_product_attention:
        return (
            "workload.fp8_dot_product_attention: no Megatron-LM or Primus argument sets it (Megatron-LM's parser "
            "lists TransformerConfig.fp8_dot_product_attention among the fields without a flag, "
            "arguments.py@d98e8a64:2333, and Primus's Megatron backend drops keys that parser lacks, "
            "argument_builder.py@fd1eeabb:152-154); set model.fp8_dot_product_attention in a Megatron-Bridge "
            "recipe, or set workload.fp8_dot_product_attention: false to export"
        )
    return None


def megatron_overrides(
    spec: StudySpec, config: TrainingConfig, *, primus: bool | None = None
) -> dict[str, Any]:
    """The Megatron/Primus arguments (underscore names) that select ``config`` for ``spec``'s workload.

    ``primus`` (default: :func:`uses_primus`) adds the Primus-only keys (:data:`PRIMUS_ONLY`); a zero-bubble
    schedule exists only in Primus and always carries them."""
    c, w, m = config, spec.workload, spec.model
    zb = c.pp_schedule in ZERO_BUBBLE
    primus = (uses_primus(spec) if primus is None else primus) or zb
    reason = export_refusal(spec, primus=primus)
    if reason:
        raise SpecError(reason)
    layout = spec.pipeline.layout is not None and c.pp > 1
    out: dict[str, Any] = {
        "tensor_model_parallel_size": c.tp,
        "pipeline_model_parallel_size": c.pp,
        "expert_model_parallel_size": c.ep,
        "context_parallel_size": c.cp,
        # at most one of --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank /
        # --pipeline-model-parallel-layout (megatron/training/arguments.py@d98e8a64:928-939): a layout fixes
        # vpp itself (arguments.py@d98e8a64:941-952)
        "num_virtual_stages_per_pipeline_rank": c.vpp if c.vpp > 1 and not layout else None,
        "sequence_parallel": c.tp > 1 and spec.workload.sequence_parallel,
        "micro_batch_size": c.mbs,
        "global_batch_size": w.global_batch_size,
        "seq_length": w.seq_length,
        "use_distributed_optimizer": w.distributed_optimizer,
    }
    if c.cp > 1 and m.cp_comm_type != "p2p":
        # attention sinks / sliding windows: TE runs them under CP only as a2a (ModelSpec.cp_comm_type);
        # Megatron-LM --cp-comm-type (arguments.py@d98e8a64:3221, one value for every layer,
        # argument_utils.py@d98e8a64:343-344), Primus cp_comm_type (language_model.yaml@fd1eeabb:152)
        out["cp_comm_type"] = m.cp_comm_type
    out.update(pipeline_overrides(spec, c.pp, c.vpp))
    # none / selective (+ recompute_modules) / full (uniform, 1) / full:N (block, N per virtual chunk)
    out.update(parse_recompute(c.recompute).megatron_args())
    if m.is_moe:
        out.update(_moe_overrides(spec, c, primus))
    # Primus's zero-bubble pipeline: DP overlap off, no persistent layer norm, no attention mask from the
    # data loader, gradient accumulation fusion on (Primus
    # primus/backends/megatron/core/pipeline_parallel/zerobubble/README.md@fd1eeabb:14-20; rule
    # zb_requirements keeps zero bubble out of a workload without the fusion)
    overlap = w.overlap_grad_reduce and not zb
    out.update(overlap_grad_reduce=overlap, overlap_param_gather=overlap and w.distributed_optimizer)
    out["gradient_accumulation_fusion"] = w.gradient_accumulation_fusion
    if primus:
        # zero_bubble.yaml@fd1eeabb:39 defaults enable_zero_bubble to true: a Primus run writes it either way
        out.update(patch_zero_bubble=zb, enable_zero_bubble=zb, zero_bubble_v_schedule=c.pp_schedule == "zbv")
        if c.pp_schedule == "zbv":
            out["zero_bubble_v_schedule_mem_setup"] = "zb"
    if zb:
        out.update(create_attention_mask_in_dataloader=False, no_persist_layer_norm=True)
    if w.tp_comm_overlap and c.tp > 1:
        out["tp_comm_overlap"] = True
    out.update(_precision_overrides(spec))
    if c.dp_shard > 1:
        out.update(fsdp_overrides(spec, c))
    return out


def fsdp_overrides(spec: StudySpec, c: TrainingConfig) -> dict[str, Any]:
    """Megatron-FSDP (ZeRO-3) over ``dp_shard`` ranks: ``use_megatron_fsdp`` with parameters, gradients and
    optimizer state sharded (``optim_grads_params``, arguments.py@d98e8a64:3190; Primus trainer_base.yaml@
    fd1eeabb:187-189), the ``fsdp_dtensor`` checkpoint format it requires (arguments.py@d98e8a64:1168-1169),
    the distributed optimizer Megatron-FSDP v1 runs on (arguments.py@d98e8a64:1124-1136), and HSDP's
    dp/dp_shard replicas as distributed-optimizer instances (``enable_hsdp``: megatron/core/distributed/fsdp/
    mcore_fsdp_adapter.py@d98e8a64:346). The launch must not set ``CUDA_DEVICE_MAX_CONNECTIONS=1``
    (arguments.py@d98e8a64:1048, 1166: :func:`~primus_optuna.run.presets.megatron_env`)."""
    dp = c.dp or spec.world // (c.tp * c.cp * c.pp)
    return {
        "use_megatron_fsdp": True,
        "data_parallel_sharding_strategy": "optim_grads_params",
        "ckpt_format": "fsdp_dtensor",
        "use_distributed_optimizer": True,
        "num_distributed_optimizer_instances": max(1, dp // c.dp_shard),
    }


def _moe_overrides(spec: StudySpec, c: TrainingConfig, primus: bool) -> dict[str, Any]:
    w = spec.workload
    deepep = c.moe_dispatcher == "deepep"
    # the model assumes expert TP = 1; Megatron defaults it to TP (arguments.py@d98e8a64:587-588)
    out: dict[str, Any] = {
        "expert_tensor_parallel_size": EXPORTED_EXPERT_TP,
        "moe_token_dispatcher_type": "flex" if deepep else "alltoall",
    }
    if deepep:
        # the current spelling in both Megatron-LM versions (transformer_config.py@d98e8a64:898 and
        # @d3528a21:747; --moe-enable-deepep is deprecated there, @d98e8a64:1743-1752); DeepEP needs fp32
        # router probabilities (Primus: patches/args/rocm_arg_validation.py@fd1eeabb:225-227)
        out.update(moe_flex_dispatcher_backend="deepep", moe_router_dtype="fp32")
    if primus and runs_turbo(spec):  # elsewhere Primus runs upstream's DeepEP (the flex backend above)
        out.update(moe_enable_deepep=deepep, use_turbo_deepep=deepep)
        if deepep:  # Primus-Turbo's DeepEP; a user's other Turbo switches are left as they are
            out["enable_primus_turbo"] = True
        sync_free = deepep and w.moe_sync_free
        # stage 2 removes the router, DeepEP and grouped-MLP syncs and needs Primus-Turbo's grouped GEMM
        # (rocm_arg_validation.py@fd1eeabb:199-206), which runs at tp = 1 only (primus_turbo.py@fd1eeabb:2024)
        out["turbo_sync_free_moe_stage"] = 2 if sync_free else 0
        if sync_free:
            out["use_turbo_grouped_gemm"] = True
    if spec.model.linear_bias:
        # TEGroupedMLP (the experts of a TE model with grouped GEMMs) asserts no bias-dropout fusion when the
        # linear layers have biases (megatron/core/transformer/moe/experts.py@d98e8a64:205-207, @d3528a21:171-173),
        # and Megatron-LM's parser turns the fusion on by default (arguments.py@d98e8a64:2899-2901)
        out["bias_dropout_fusion"] = False
    if w.te_op_fuser:
        # TE's fused grouped MLP (workload.te_op_fuser): TEGroupedMLP takes it only with TE GroupedLinear
        # experts, i.e. grouped GEMMs (experts.py@d98e8a64:404-408); the launch environment adds
        # TE_OP_FUSER_ENV (launch_env)
        out.update(use_transformer_engine_op_fuser=True, moe_grouped_gemm=True)
    # Megatron: --overlap-moe-expert-parallel-comm with --delay-wgrad-compute
    out.update(overlap_moe_expert_parallel_comm=c.ep_overlap, delay_wgrad_compute=c.ep_overlap)
    if deepep or c.ep_overlap:
        # both refuse the shared-expert overlap that Primus's DeepSeek model files turn on
        # (primus/configs/models/megatron/deepseek_v3_base.yaml@fd1eeabb:50): Primus-Turbo's DeepEP
        # (patches/args/rocm_arg_validation.py@fd1eeabb:221-224) and the EP overlap
        # (transformer_config.py@d98e8a64:3038-3040); Megatron-LM's default is off (no flag)
        out["moe_shared_expert_overlap"] = False
    if c.ep_overlap and primus:
        # Primus's trainer_base.yaml@fd1eeabb:432 sets cuda_graph_scope to the string "full"; with
        # delay_wgrad_compute the pinned Megatron tests `CudaGraphScope.attn in args.cuda_graph_scope`
        # before normalising it (arguments.py@d3528a21:1460 vs 1520-1525) and crashes on the string
        out["cuda_graph_scope"] = []
    return out


def _precision_overrides(spec: StudySpec) -> dict[str, Any]:
    w = spec.workload
    fp8 = w.precision == "fp8"
    out: dict[str, Any] = {"bf16": w.precision in ("bf16", "fp8"), "fp16": w.precision == "fp16"}
    out["fp8"] = "hybrid" if fp8 else None
    if fp8:
        # Megatron's default recipe is delayed scaling (transformer_config.py@d98e8a64:594-596): the study's
        # recipe is stated, or an MXFP8 study would run (and be refused as) delayed scaling
        out["fp8_recipe"] = w.fp8_recipe
    # Megatron-LM accumulates and reduces bf16 gradients in fp32 unless --grad-reduce-in-bf16 is given
    # (arguments.py@d98e8a64:1213-1217); Megatron-Bridge calls the same switch grad_reduce_in_fp32=False
    out["grad_reduce_in_bf16"] = not w.grad_reduce_in_fp32
    out["fp8_param_gather"] = fp8 and w.fp8_param_gather
    if fp8 and w.fp8_output_proj:  # written only when on: the Megatron-LM Primus pins has no such argument
        out["fp8_output_proj"] = True
    if fp8 and w.fp8_param_gather and w.fp8_recipe == "mxfp8":
        # MXFP8 parameters all-gather through the gradient buffer; without it Megatron keeps a separate
        # buffer ("significant amount additional GPU memory", optimizer_config.py@d98e8a64:416-424)
        out["reuse_grad_buf_for_mxfp8_param_ag"] = True
    # Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer, --main-params-dtype,
    # --main-grads-dtype, --exp-avg-dtype, --exp-avg-sq-dtype; fp32 defaults, arguments.py@d98e8a64:1077-1086
    # maps them through dtype_map, where None is not a dtype the optimizer accepts)
    out["use_precision_aware_optimizer"] = w.precision_aware_optimizer
    for name in OPTIMIZER_DTYPE_FIELDS:
        out[name] = getattr(w, name) if w.precision_aware_optimizer else "fp32"
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


def model_arguments(spec: StudySpec) -> dict[str, Any]:
    """The model's architecture as Megatron arguments (``dest`` names, typed): what ``pretrain_gpt.py`` needs
    besides :func:`megatron_overrides` (MLA, shared experts, dense-first layers, MTP, GPT-OSS's windows)."""
    m, w = spec.model, spec.workload
    a: dict[str, Any] = {
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "kv_channels": m.head_dim,
        "max_position_embeddings": w.seq_length,
        "vocab_size": m.vocab_size,
        "normalization": m.normalization,
        "position_embedding_type": m.position_embedding_type,
        "add_bias_linear": m.linear_bias,
        "swiglu": m.swiglu,
        "untie_embeddings_and_output_weights": m.untie_embeddings_and_output_weights,
    }
    if m.query_groups != m.num_attention_heads:
        a.update(group_query_attention=True, num_query_groups=m.query_groups)
    if m.multi_latent_attention:
        a.update(multi_latent_attention=True, kv_lora_rank=m.kv_lora_rank, qk_head_dim=m.qk_head_dim)
        a.update(qk_pos_emb_head_dim=m.qk_pos_emb_head_dim, v_head_dim=m.v_head_dim)
        if m.q_lora_rank:
            a["q_lora_rank"] = m.q_lora_rank
    if m.is_moe:
        a.update(num_experts=m.experts, moe_router_topk=m.moe_router_topk, moe_ffn_hidden_size=m.expert_ffn)
        a["moe_grouped_gemm"] = True
        if m.shared_expert_ffn:
            a["moe_shared_expert_intermediate_size"] = m.shared_expert_ffn
        if m.num_dense_layers:
            a["moe_layer_freq"] = [int(f) for f in m.moe_layer_flags]
        if m.moe_router_num_groups:
            a.update(moe_router_num_groups=m.moe_router_num_groups)
            a["moe_router_group_topk"] = m.moe_router_group_topk or 1
    if m.mtp_num_layers:
        a["mtp_num_layers"] = m.mtp_num_layers
    if m.window_size is not None:
        a["window_size"] = (m.window_size, 0)  # Megatron tuple_type "left,right"
        skip = m.window_attn_skip_freq
        if skip is not None:
            a["window_attn_skip_freq"] = skip if isinstance(skip, int) else [int(bool(s)) for s in skip]
    if m.softmax_type != "vanilla":
        a["softmax_type"] = m.softmax_type
    if m.add_qkv_bias and not m.linear_bias:
        a["add_qkv_bias"] = True
    return a


def _pattern(flags: list[int]) -> str:
    """Megatron's list expression for a 0/1 per-layer pattern, runs compressed: ``([0]*3+[1]*58)``."""
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


def megatron_flags(values: dict[str, Any], *, skip: tuple[str, ...] = ()) -> list[str]:
    """Megatron-LM command-line arguments for ``values`` (booleans as bare flags, ``store_false`` ones as
    their negative flag, None and empty lists omitted: Megatron's defaults)."""
    argv: list[str] = []
    for name, value in values.items():
        if name in skip or value is None:
            continue
        if name in NEGATED_FLAGS:
            if value is False:
                argv.append(NEGATED_FLAGS[name])
            continue
        flag = FLAG_NAMES.get(name) or "--" + name.replace("_", "-")
        if value is False or (isinstance(value, list) and not value):
            continue
        if value is True:
            argv.append(flag)
        elif name in PATTERN_ARGS and isinstance(value, list):
            argv += [flag, _pattern(value)]
        elif isinstance(value, tuple):
            argv += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, list):  # nargs="*" arguments (``--recompute-modules moe_act layernorm``)
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def config_from_megatron(values: dict[str, Any], spec: StudySpec | None = None) -> TrainingConfig:
    """The :class:`TrainingConfig` a dict of Megatron/Primus arguments selects (absent ones: Megatron defaults);
    derived for ``spec``'s cluster and batch when given."""
    config = TrainingConfig.from_params(baseline_from_megatron(values))
    return config.derive(spec.world, spec.workload.global_batch_size) if spec is not None else config
