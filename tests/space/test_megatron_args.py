"""The values the exports hand to Megatron-LM and Primus: rules that live in Megatron-LM's
``megatron/training/arguments.py`` or in Primus (not in Megatron-Core's config classes, which
tests/mcore/test_exported_configs.py builds), each naming its source line."""

from __future__ import annotations

import pytest
import yaml

from primus_optuna import Space, SpecError, StudySpec
from primus_optuna.record.export import export_config, megatron_args
from primus_optuna.space.megatron_args import PRIMUS_ONLY, ROCM_ONLY, megatron_flags, megatron_overrides
from tests.conftest import FLAGSHIP, STUDIES

NONE_IS_OFF = {
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "recompute_layer_ids",
    "fp8",
    "num_virtual_stages_per_pipeline_rank",
}
"""Keys whose Megatron default is None ("off"): the only ones an overlay may write as null."""


def _spec(path=FLAGSHIP, **workload) -> StudySpec:
    data = StudySpec.from_yaml(path).to_dict()
    data["workload"] = {**data["workload"], **workload}
    return StudySpec.from_dict(data)


def _overlay(spec: StudySpec, config) -> dict:
    return yaml.safe_load(export_config(spec, config, "primus"))["modules"]["pre_trainer"]["overrides"]


def _sample(space: Space) -> list:
    configs = space.configs()
    return configs[:: max(1, len(configs) // 60)]


@pytest.mark.parametrize("study", sorted(p.name for p in STUDIES.glob("*.yaml")))
def test_no_null_for_a_key_whose_megatron_default_is_not_none(study: str) -> None:
    """Primus's argument builder passes a None through over Megatron's default
    (primus/backends/megatron/argument_builder.py@fd1eeabb:137,193); the pinned Megatron then fails
    ``dtype_map[None]`` for the optimizer dtypes (megatron/training/arguments.py@d3528a21 validate_args maps them
    like arguments.py@d98e8a64:1077-1086, the optimizer asserting torch dtypes) and a None
    ``grad_reduce_in_bf16`` silently keeps fp32 reduction (arguments.py@d98e8a64:1213-1217)."""
    spec = StudySpec.from_yaml(STUDIES / study)
    space = Space(spec)
    for c in _sample(space):
        o = _overlay(spec, c)
        nulls = {k for k, v in o.items() if v is None}
        assert nulls <= NONE_IS_OFF, (c.key(), nulls - NONE_IS_OFF)
        for k in ("main_params_dtype", "main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            assert o[k] in ("fp32", "bf16", "fp16", "fp8"), (k, o[k])
        for k in ("grad_reduce_in_bf16", "fp8_param_gather", "use_precision_aware_optimizer"):
            assert isinstance(o[k], bool), (k, o[k])


def test_null_clears_an_experiments_value() -> None:
    from primus_optuna.run.presets import primus_overlay

    spec = StudySpec.from_yaml(FLAGSHIP)
    c = Space(spec).make(tp=1, pp=4, vpp=1, ep=8, mbs=1, recompute="none", pp_schedule="1f1b")
    exp = {"modules": {"pre_trainer": {"model": "m.yaml", "overrides": {
        "recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 2,
        "num_virtual_stages_per_pipeline_rank": 4, "recompute_layer_ids": [0, 1],
    }}}}  # fmt: skip
    o = primus_overlay(spec, c, experiment=exp)["modules"]["pre_trainer"]["overrides"]
    for k in ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_layer_ids"):
        assert k in o and o[k] is None, k
    assert o["num_virtual_stages_per_pipeline_rank"] is None


def test_a_layout_leaves_out_the_virtual_stages() -> None:
    """At most one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank and
    --pipeline-model-parallel-layout (megatron/training/arguments.py@d98e8a64:928-939); the layout fixes vpp
    (arguments.py@d98e8a64:941-952)."""
    spec = StudySpec.from_yaml(STUDIES / "deepseek-v3-mi355x-fp8.yaml")
    c = Space(spec).baseline
    assert c.vpp == 2
    argv = megatron_args(spec, c, upstream=True)
    assert "--pipeline-model-parallel-layout" in argv
    assert "--num-virtual-stages-per-pipeline-rank" not in argv
    o = _overlay(spec, c)
    assert o["pipeline_model_parallel_layout"] == spec.pipeline.layout
    assert o["num_virtual_stages_per_pipeline_rank"] is None
    from primus_optuna.record.export import parse_export

    for fmt in ("primus", "megatron", "json", "env"):
        assert parse_export(export_config(spec, c, fmt), fmt, spec) == c, fmt


def test_expert_tensor_parallel_is_1_for_every_moe_model() -> None:
    """Megatron defaults expert TP to TP (arguments.py@d98e8a64:587-588); the estimate's experts are not
    split over TP."""
    for path in sorted(STUDIES.glob("*.yaml")):
        spec = StudySpec.from_yaml(path)
        for c in _sample(Space(spec)):
            o = megatron_overrides(spec, c)
            if spec.model.is_moe:
                assert o["expert_tensor_parallel_size"] == 1, (path.name, c.key())
            else:
                assert "expert_tensor_parallel_size" not in o


def test_fp8_recipe_and_mxfp8_parameter_all_gather() -> None:
    """Megatron's default FP8 recipe is delayed scaling (megatron/core/transformer/transformer_config.py
    @d98e8a64:594-596); MXFP8 parameters without --reuse-grad-buf-for-mxfp8-param-ag take a separate buffer
    (megatron/core/optimizer/optimizer_config.py@d98e8a64:416-424)."""
    v3 = StudySpec.from_yaml(STUDIES / "deepseek-v3-mi355x-fp8.yaml")  # mxfp8 + fp8_param_gather
    c = Space(v3).baseline
    argv = megatron_args(v3, c, upstream=True)
    assert argv[argv.index("--fp8-recipe") + 1] == "mxfp8"
    assert "--reuse-grad-buf-for-mxfp8-param-ag" in argv and "--fp8-param-gather" in argv
    mixtral = StudySpec.from_yaml(FLAGSHIP)
    a = megatron_args(mixtral, Space(mixtral).baseline, upstream=True)
    assert a[a.index("--fp8-recipe") + 1] == "delayed" and "--reuse-grad-buf-for-mxfp8-param-ag" not in a
    no_pg = _spec(STUDIES / "deepseek-v3-mi355x-fp8.yaml", fp8_param_gather=False)
    assert "--reuse-grad-buf-for-mxfp8-param-ag" not in megatron_args(no_pg, c, upstream=True)
    bf16 = StudySpec.from_yaml(STUDIES / "qwen3-30b-a3b-h200-bf16.yaml")
    assert "--fp8-recipe" not in megatron_args(bf16, Space(bf16).baseline)


def test_ep_overlap_in_a_primus_overlay_clears_cuda_graph_scope() -> None:
    """Primus's trainer_base.yaml@fd1eeabb:432 sets cuda_graph_scope to the string "full"; with
    delay_wgrad_compute the pinned Megatron tests ``CudaGraphScope.attn in args.cuda_graph_scope``
    (megatron/training/arguments.py@d3528a21:1460) before it normalises "full" (arguments.py@d3528a21:1520)."""
    spec = StudySpec.from_yaml(FLAGSHIP)
    c = Space(spec).make(tp=1, pp=4, vpp=2, ep=8, mbs=1, pp_schedule="interleaved", ep_overlap=True)
    o = _overlay(spec, c)
    assert o["overlap_moe_expert_parallel_comm"] and o["delay_wgrad_compute"]
    assert o["cuda_graph_scope"] == []
    off = _overlay(spec, c.replace(ep_overlap=False))
    assert off["delay_wgrad_compute"] is False and "cuda_graph_scope" not in off
    assert "--cuda-graph-scope" not in megatron_args(spec, c)  # upstream's default is already []


def test_zero_bubble_overlay_carries_primus_requirements() -> None:
    """Primus's zero-bubble README lists overlap off, no persistent layer norm, no attention mask from the data
    loader and gradient accumulation fusion (primus/backends/megatron/core/pipeline_parallel/zerobubble/
    README.md@fd1eeabb:14-20); its enable_zero_bubble defaults to true (zero_bubble.yaml@fd1eeabb:39)."""
    spec = StudySpec.from_yaml(FLAGSHIP)
    space = Space(spec)
    for schedule, vpp in (("zb1p", 1), ("zbv", 2)):
        c = space.make(tp=1, pp=4, vpp=vpp, ep=8, mbs=1, recompute="none", pp_schedule=schedule)
        assert space.check(c) == []
        o = _overlay(spec, c)
        assert o["patch_zero_bubble"] and o["enable_zero_bubble"]
        assert o["create_attention_mask_in_dataloader"] is False and o["no_persist_layer_norm"] is True
        assert o["gradient_accumulation_fusion"] is True
        assert o["overlap_grad_reduce"] is False and o["overlap_param_gather"] is False
        argv = megatron_args(spec, c)
        assert "--no-create-attention-mask-in-dataloader" in argv and "--no-persist-layer-norm" in argv
    plain = _overlay(spec, space.baseline)
    assert plain["enable_zero_bubble"] is False and "create_attention_mask_in_dataloader" not in plain


def test_sync_free_moe_stage_2_writes_turbo_grouped_gemm() -> None:
    """Stage 2 needs Primus-Turbo's grouped GEMM (primus/backends/megatron/patches/args/
    rocm_arg_validation.py@fd1eeabb:199-206)."""
    spec = _spec(moe_sync_free=True)
    c = Space(spec).make(tp=1, pp=4, vpp=2, ep=8, mbs=1, pp_schedule="interleaved", moe_dispatcher="deepep")
    o = _overlay(spec, c)
    assert o["turbo_sync_free_moe_stage"] == 2 and o["use_turbo_grouped_gemm"] is True
    assert o["enable_primus_turbo"] is True and o["use_turbo_deepep"] is True
    a2a = _overlay(spec, c.replace(moe_dispatcher="alltoall"))
    assert a2a["turbo_sync_free_moe_stage"] == 0 and "use_turbo_grouped_gemm" not in a2a


def test_deepep_spelling_for_upstream_and_for_primus() -> None:
    """Both Megatron-LM versions select DeepEP with --moe-flex-dispatcher-backend deepep
    (megatron/core/transformer/transformer_config.py@d98e8a64:898, @d3528a21:747; --moe-enable-deepep is
    deprecated, @d98e8a64:1743-1752); Primus-Turbo's DeepEP dispatcher asserts moe_enable_deepep
    (primus/backends/megatron/core/extensions/primus_turbo.py@fd1eeabb:2323) and fp32 router probabilities
    (patches/args/rocm_arg_validation.py@fd1eeabb:225-227)."""
    spec = StudySpec.from_yaml(FLAGSHIP)
    c = Space(spec).make(moe_dispatcher="deepep")
    up = megatron_args(spec, c, upstream=True)
    pairs = {up[i]: up[i + 1] for i in range(len(up) - 1)}
    assert (
        pairs["--moe-token-dispatcher-type"] == "flex" and pairs["--moe-flex-dispatcher-backend"] == "deepep"
    )
    assert pairs["--moe-router-dtype"] == "fp32" and "--moe-enable-deepep" not in up
    o = _overlay(spec, c)
    assert o["moe_enable_deepep"] and o["use_turbo_deepep"] and o["moe_router_dtype"] == "fp32"


def test_an_nvidia_export_has_no_primus_flags_without_being_asked() -> None:
    """Primus-only switches only for Primus runs or AMD GPUs; an NVIDIA study's `--format megatron` is upstream
    Megatron-LM's as it is."""
    spec = StudySpec.from_yaml(STUDIES / "gpt-oss-120b-h100-bf16.yaml")
    space = Space(spec)
    flags = {"--" + k.replace("_", "-") for k in PRIMUS_ONLY}
    for c in _sample(space) + [space.make(moe_dispatcher="deepep")]:
        text = export_config(spec, c, "megatron")
        assert "Primus-only" not in text and not flags & set(text.split()), c.key()
        assert text == export_config(spec, c, "megatron", upstream=True)
        assert not set(PRIMUS_ONLY) & set(megatron_overrides(spec, c))
        overlay = _overlay(spec, c)  # the overlay is Primus's, without what only ROCm runs
        assert "enable_zero_bubble" in overlay and not set(ROCM_ONLY) & set(overlay)
    amd = StudySpec.from_yaml(FLAGSHIP)
    assert "--use-turbo-deepep" in export_config(amd, Space(amd).make(moe_dispatcher="deepep"), "megatron")


def _fuser_spec(**workload) -> StudySpec:
    data = StudySpec.from_yaml(FLAGSHIP).to_dict()  # Mixtral 8x22B (SwiGLU experts), FP8
    data["cluster"] = {**data["cluster"], "gpu": "b200"}
    data["workload"] = {**data["workload"], **workload}
    return StudySpec.from_dict(data)


def test_te_op_fuser_is_exported_as_megatrons_flag_with_grouped_gemm() -> None:
    """workload.te_op_fuser = --use-transformer-engine-op-fuser (megatron/training/arguments.py@d98e8a64:
    2279-2374 generates it from transformer_config.py@d98e8a64:525-527) with --moe-grouped-gemm, which the
    fused path needs (TE GroupedLinear experts, moe/experts.py@d98e8a64:404-408); off, neither is written."""
    on, off = _fuser_spec(te_op_fuser=True), _fuser_spec()
    c = Space(on).baseline
    args = megatron_args(on, c)
    assert "--use-transformer-engine-op-fuser" in args and "--moe-grouped-gemm" in args
    assert megatron_overrides(on, c)["use_transformer_engine_op_fuser"] is True
    assert "--use-transformer-engine-op-fuser" not in megatron_args(off, c)
    assert "use_transformer_engine_op_fuser" not in megatron_overrides(off, c)


def test_te_op_fuser_launch_environment_is_exported() -> None:
    """Megatron refuses the fused grouped MLP of a gated expert MLP without NVTE_CUTEDSL_FUSED_GROUPED_MLP
    (moe/experts.py@d98e8a64:450-455, asserted at 286-290): the env export writes it, the megatron export
    names it."""
    on, off = _fuser_spec(te_op_fuser=True), _fuser_spec()
    c = Space(on).baseline
    assert "export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1\n" in export_config(on, c, "env")
    assert "# launch environment: NVTE_CUTEDSL_FUSED_GROUPED_MLP=1\n" in export_config(on, c, "megatron")
    assert "NVTE_CUTEDSL" not in export_config(off, c, "env") + export_config(off, c, "megatron")


def test_te_op_fuser_refuses_a_primus_export() -> None:
    """The Megatron-LM that Primus pins (d3528a21) has no use_transformer_engine_op_fuser: the Primus overlay
    (and any Primus-flavoured argument list) raises naming the field instead of dropping it."""
    on = _fuser_spec(te_op_fuser=True)
    c = Space(on).baseline
    for export in (
        lambda: export_config(on, c, "primus"),
        lambda: megatron_overrides(on, c, primus=True),
    ):
        with pytest.raises(SpecError) as e:
            export()
        assert "workload.te_op_fuser" in str(e.value) and "d3528a21" in str(e.value)
    assert export_config(_fuser_spec(), c, "primus")  # off, the overlay is written


def test_te_op_fuser_round_trips_through_the_importer() -> None:
    """The exported arguments read back as the workload (spec/primus_import.py:workload_from_megatron)."""
    from primus_optuna.spec.primus_import import workload_from_megatron

    on, off = _fuser_spec(te_op_fuser=True), _fuser_spec()
    c = Space(on).baseline
    assert workload_from_megatron(megatron_overrides(on, c))["te_op_fuser"] is True
    assert "te_op_fuser" not in workload_from_megatron(megatron_overrides(off, c))
    # as a command line parses it (a bare flag) and as YAML writes it
    assert workload_from_megatron({"use_transformer_engine_op_fuser": "true"})["te_op_fuser"] is True
    assert "te_op_fuser" not in workload_from_megatron({"use_transformer_engine_op_fuser": False})


def test_cp_comm_type_a2a_for_attention_sinks_and_windows() -> None:
    """GPT-OSS (sinks, 128-token windows) with cp > 1 exports Megatron-LM's --cp-comm-type a2a
    (arguments.py@d98e8a64:3221) and Primus's cp_comm_type (language_model.yaml@fd1eeabb:152): TransformerEngine
    runs that attention under context parallelism only so (Megatron-Bridge's GPT-OSS recipes set it,
    gpt_oss/h100/gpt_oss.py@067f987d:69-70). Without CP, or for a model the p2p ring runs, nothing is written."""
    oss = StudySpec.from_yaml(STUDIES / "gpt-oss-120b-h100-bf16.yaml")
    c = Space(oss).make(tp=1, pp=4, vpp=1, ep=8, cp=2, mbs=1, recompute="none", pp_schedule="1f1b")
    args = megatron_args(oss, c)
    assert args[args.index("--cp-comm-type") + 1] == "a2a"
    overlay = yaml.safe_load(export_config(oss, c, "primus"))["modules"]["pre_trainer"]["overrides"]
    assert overlay["cp_comm_type"] == "a2a" and overlay["context_parallel_size"] == 2
    assert "cp_comm_type" not in megatron_overrides(oss, c.replace(cp=1))
    flag = StudySpec.from_yaml(FLAGSHIP)
    fc = Space(flag).make(tp=1, pp=4, vpp=2, ep=8, cp=2, mbs=1, recompute="none", pp_schedule="interleaved")
    assert "cp_comm_type" not in megatron_overrides(flag, fc)


def test_fp8_dot_product_attention_refuses_every_framework_export() -> None:
    """No Megatron-LM flag sets TransformerConfig.fp8_dot_product_attention (arguments.py@d98e8a64:2333 lists it
    among the fields without one) and Primus's Megatron backend drops keys Megatron's parser lacks
    (argument_builder.py@fd1eeabb:152-154): the overlay, the arguments and the JSON raise naming the field
    rather than dropping it; the env export (the axes only) is still written."""
    on = _fuser_spec(fp8_recipe="mxfp8", fp8_dot_product_attention=True)
    c = Space(on).baseline
    for fmt in ("primus", "megatron", "json"):
        with pytest.raises(SpecError) as e:
            export_config(on, c, fmt)
        text = str(e.value)
        assert "workload.fp8_dot_product_attention" in text and "fp8_dot_product_attention: false" in text
    assert "PRIMUS_TP" in export_config(on, c, "env")
    off = _fuser_spec(fp8_recipe="mxfp8")
    assert "fp8_dot_product_attention" not in export_config(off, c, "primus")


def test_fp8_output_proj_is_exported_as_megatrons_flag_refused_by_primus_and_read_back() -> None:
    """workload.fp8_output_proj = --fp8-output-proj (megatron/training/arguments.py@d98e8a64:2279-2374 generates
    it from transformer_config.py@d98e8a64:635); off, nothing is written. The Megatron-LM that Primus pins
    (d3528a21) has no fp8_output_proj: a Primus export raises naming the field. The exported arguments read back
    as the workload."""
    from primus_optuna.spec.primus_import import workload_from_megatron

    on, off = _fuser_spec(fp8_recipe="mxfp8", fp8_output_proj=True), _fuser_spec(fp8_recipe="mxfp8")
    c = Space(on).baseline
    assert "--fp8-output-proj" in megatron_args(on, c)
    assert megatron_overrides(on, c)["fp8_output_proj"] is True
    assert "--fp8-output-proj" not in megatron_args(off, c)
    assert "fp8_output_proj" not in megatron_overrides(off, c)
    for export in (lambda: export_config(on, c, "primus"), lambda: megatron_overrides(on, c, primus=True)):
        with pytest.raises(SpecError) as e:
            export()
        assert "workload.fp8_output_proj" in str(e.value) and "d3528a21" in str(e.value)
    assert workload_from_megatron(megatron_overrides(on, c))["fp8_output_proj"] is True
    assert "fp8_output_proj" not in workload_from_megatron(megatron_overrides(off, c))


def test_an_moe_model_with_biases_turns_bias_dropout_fusion_off() -> None:
    """TEGroupedMLP asserts no bias-dropout fusion when the linear layers have biases
    (megatron/core/transformer/moe/experts.py@d98e8a64:205-207, @d3528a21:171-173), which Megatron-LM's parser
    turns on by default (arguments.py@d98e8a64:2899-2901): GPT-OSS (biases) exports --no-bias-dropout-fusion,
    Mixtral (none) leaves the default."""
    oss = StudySpec.from_yaml(STUDIES / "gpt-oss-120b-h100-bf16.yaml")
    values = megatron_overrides(oss, Space(oss).baseline)
    assert oss.model.linear_bias and values["bias_dropout_fusion"] is False
    assert "--no-bias-dropout-fusion" in megatron_flags(values)
    mixtral = StudySpec.from_yaml(FLAGSHIP)
    assert "bias_dropout_fusion" not in megatron_overrides(mixtral, Space(mixtral).baseline)


def test_deepep_and_ep_overlap_turn_the_shared_expert_overlap_off() -> None:
    """Primus's DeepSeek model files turn moe_shared_expert_overlap on
    (primus/configs/models/megatron/deepseek_v3_base.yaml@fd1eeabb:50), which Primus-Turbo's DeepEP
    (primus/backends/megatron/patches/args/rocm_arg_validation.py@fd1eeabb:221-224) and the EP overlap
    (megatron/core/transformer/transformer_config.py@d98e8a64:3038-3040) refuse: the Primus overlay of a DeepEP or
    EP-overlap trial turns it off; an all-to-all trial without EP overlap leaves the user's value alone."""
    spec = StudySpec.from_yaml(STUDIES / "deepseek-v3-mi355x-fp8.yaml")
    space = Space(spec)
    base = space.baseline  # deepep, interleaved
    for config in (base, base.replace(moe_dispatcher="alltoall", ep_overlap=True)):
        overlay = yaml.safe_load(export_config(spec, config, "primus"))["modules"]["pre_trainer"]["overrides"]
        assert overlay["moe_shared_expert_overlap"] is False
    plain = base.replace(moe_dispatcher="alltoall", ep_overlap=False)
    assert "moe_shared_expert_overlap" not in megatron_overrides(spec, plain)
    assert "--moe-shared-expert-overlap" not in megatron_flags(megatron_overrides(spec, base))


def test_dp_shard_exports_megatron_fsdp_with_hsdp_replicas_and_no_single_connection() -> None:
    from primus_optuna.run.presets import megatron_env

    spec = StudySpec.from_dict(
        {
            "name": "fsdp",
            "model": {"catalog": "llama3.1-8b"},
            "cluster": {"gpu": "h100", "nodes": 2, "gpus_per_node": 8},
            "workload": {"seq_length": 4096, "global_batch_size": 64, "precision": "bf16"},
            "search": {"baseline": {"tp": 2}, "axes": {"dp_shard": [1, 4, 8]}},
        }
    )
    space = Space(spec)
    zero1 = space.canonical(space.make(tp=2))
    hsdp = space.canonical(space.make(tp=2, dp_shard=4))  # dp 8: 2 replicas of 4 shards
    assert space.check(hsdp) == [] and hsdp.dp == 8
    assert "use_megatron_fsdp" not in megatron_overrides(spec, zero1)
    out = megatron_overrides(spec, hsdp)
    # Megatron-LM arguments.py@d98e8a64:1168 (fsdp_dtensor), 3190 (strategy); mcore_fsdp_adapter.py:346 (HSDP)
    assert out["use_megatron_fsdp"] is True and out["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert out["ckpt_format"] == "fsdp_dtensor" and out["num_distributed_optimizer_instances"] == 2
    assert (
        megatron_overrides(spec, space.canonical(space.make(tp=2, dp_shard=8)))[
            "num_distributed_optimizer_instances"
        ]
        == 1
    )
    # arguments.py@d98e8a64:1048, 1166: FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS is not 1
    assert megatron_env(spec, zero1)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in megatron_env(spec, hsdp)
    flags = export_config(spec, hsdp, "megatron")
    assert "--use-megatron-fsdp" in flags and "--ckpt-format fsdp_dtensor" in flags
