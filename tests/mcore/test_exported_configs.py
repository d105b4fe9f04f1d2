"""The CI framework check: every trial of every shipped study's 30-trial analytical run, exported, builds
Megatron-Core's own objects (megatron-core from PyPI, pinned in pyproject's dev extra).

For each exported configuration (the ``json`` export's ``megatron`` block, the study's default target, and the
Primus overlay's overrides) and the model's architecture arguments:

- ``TransformerConfig`` / ``MLATransformerConfig`` from the values, the way Megatron-LM's
  ``core_transformer_config_from_args`` does it (``megatron/training/argument_utils.py@d98e8a64:277-327``:
  every dataclass field taken from the argument of the same name, plus its translations), so its
  ``__post_init__`` validation runs on what the tool exports;
- ``OptimizerConfig`` (the dtype strings mapped as ``megatron/training/arguments.py@d98e8a64:1077-1086`` does)
  and ``DistributedDataParallelConfig``;
- ``parallel_state.initialize_model_parallel`` with the exported sizes on torch's fake process group of the
  study's world size, and the data-parallel size it derives equal to the trial's;
- for an MoE model, Megatron-Core's ``MoELayer`` on that parallel state (its router, the token dispatcher the
  export names, ``TEGroupedMLP`` experts and shared experts), so that an assertion in their constructors (the
  flex dispatcher's expert-TP x EP > 1, the grouped experts' bias-dropout fusion) fails the check, once per
  distinct export of a study (micro-batch size aside); tests/mcore/test_moe_constructors.py checks the rest of
  each study's space.

megatron-core 0.16.1 is Megatron-LM's tag ``core_v0.16.1`` (``55ac7082``, release branch ``core_r0.16.0``,
2026-03-16); the Megatron-LM checks that live only in ``megatron/training/arguments.py`` (not in the pip
package) and Primus's are tests of their own (tests/space/test_megatron_args.py,
tests/space/test_framework_rules.py). Transformer Engine is absent on CI: its version checks answer as for a
current TE (the clusters the exports are for have one); nothing else is stood in for.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import yaml

from primus_optuna.record.export import export_config
from primus_optuna.space.megatron_args import model_arguments
from primus_optuna.spec import StudySpec
from tests.conftest import STUDIES
from tests.helpers.studies import analytical_run
from tests.mcore import cpu_shims

megatron = pytest.importorskip(
    "megatron.core", reason="megatron-core is not installed (pip install -e .[dev])"
)
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.megatron

STUDY_FILES = sorted(STUDIES.glob("*.yaml"))


def _run_study(path: Path) -> tuple[StudySpec, list[Any]]:
    """The study's own analytical run (``search.n_trials`` trials, in memory, no LLM): its trial configs."""
    spec = StudySpec.from_yaml(path)
    spec = spec.model_copy(update={"runner": spec.runner.model_copy(update={"kind": "analytical"})})
    return spec, analytical_run(spec)[1]


@pytest.fixture(scope="module")
def exported() -> list[tuple[str, StudySpec, Any, str, dict[str, Any]]]:
    """(study, spec, config, format, exported Megatron values) for every trial of every shipped study."""
    out = []
    for path in STUDY_FILES:
        spec, configs = _run_study(path)
        assert len(configs) >= min(spec.search.n_trials, 10), path.name
        for c in configs:
            block = json.loads(export_config(spec, c, "json"))["megatron"]
            overlay = yaml.safe_load(export_config(spec, c, "primus"))["modules"]["pre_trainer"]["overrides"]
            out.append((spec.name, spec, c, "json", block))
            out.append((spec.name, spec, c, "primus", overlay))
    return out


# --- Megatron-LM's translation of arguments into Megatron-Core configs --------------------------------------------
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}
"""arguments.py@d98e8a64:1077-1079 without its None entry: an exported None would be a KeyError here, as it is
in the pinned Megatron's optimizer set-up."""


def _args(spec: StudySpec, values: dict[str, Any]) -> dict[str, Any]:
    """The exported values plus the architecture, with Megatron's argument defaults the translation reads."""
    args = {**model_arguments(spec), **values}
    args.setdefault("swiglu", False)
    args.setdefault("group_query_attention", False)
    # --no-bias-dropout-fusion is store_false (arguments.py@d98e8a64:2899-2901): TransformerConfig's own default
    # (False) is not what a launch gets
    args.setdefault("bias_dropout_fusion", True)
    args["params_dtype"] = (
        torch.bfloat16 if args.get("bf16") else torch.float16 if args.get("fp16") else torch.float32
    )
    return args


def transformer_config(args: dict[str, Any]) -> Any:
    """``core_transformer_config_from_args`` (argument_utils.py@d98e8a64:277-327) over a dict of arguments."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if args.get("multi_latent_attention") else TransformerConfig
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in args.items() if k in names}
    kw["persist_layer_norm"] = not args.get("no_persist_layer_norm", False)
    kw["deallocate_pipeline_outputs"] = True
    kw["pipeline_dtype"] = args["params_dtype"]
    kw["num_moe_experts"] = args.get("num_experts")
    kw["num_layers_in_first_pipeline_stage"] = args.get("decoder_first_pipeline_num_layers")
    kw["num_layers_in_last_pipeline_stage"] = args.get("decoder_last_pipeline_num_layers")
    kw["fp8_param"] = bool(args.get("fp8_param_gather"))
    if args["swiglu"]:
        kw["activation_func"] = torch.nn.functional.silu
        kw["gated_linear_unit"] = True
    kw["num_query_groups"] = args.get("num_query_groups") if args["group_query_attention"] else None
    # validate_args derives the virtual pipeline size (arguments.py@d98e8a64:941-977)
    kw["virtual_pipeline_model_parallel_size"] = virtual_stages(args)
    if "window_size" in kw:
        kw["window_size"] = tuple(kw["window_size"])
    # validate_args: expert TP defaults to TP (arguments.py@d98e8a64:587-588)
    if kw.get("expert_tensor_parallel_size") is None:
        kw["expert_tensor_parallel_size"] = args["tensor_model_parallel_size"]
    return cls(**kw)


def virtual_stages(args: dict[str, Any]) -> int | None:
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    pp = args["pipeline_model_parallel_size"]
    if args.get("pipeline_model_parallel_layout"):
        n = PipelineParallelLayerLayout.get_num_stages_from_str(args["pipeline_model_parallel_layout"]) // pp
    else:
        n = args.get("num_virtual_stages_per_pipeline_rank") or 1
    return n if n > 1 else None


def optimizer_config(args: dict[str, Any]) -> Any:
    from megatron.core.optimizer import OptimizerConfig

    names = {f.name for f in dataclasses.fields(OptimizerConfig)}
    kw = {k: v for k, v in args.items() if k in names}
    for name in ("main_params_dtype", "main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        kw[name] = DTYPES[args[name]]
    kw.update(optimizer="adam", lr=1e-4, params_dtype=args["params_dtype"])
    with patch.dict(sys.modules, _te_fused_adam()):
        return OptimizerConfig(**kw)


def _te_fused_adam() -> dict[str, types.ModuleType]:
    """Transformer Engine's ``FusedAdam``, for the signature check OptimizerConfig makes of it with the
    precision-aware optimizer (megatron/core/optimizer/optimizer_config.py of megatron-core 0.16.1: it needs
    ``master_weight_dtype``, ``exp_avg_dtype``, ``exp_avg_sq_dtype``, ``use_decoupled_grad``, which TE's
    FusedAdam takes since 2.1): a class with that signature, nothing else."""

    class FusedAdam:
        def __init__(
            self,
            params: Any = None,
            lr: float = 1e-3,
            *,
            master_weight_dtype: Any = None,
            exp_avg_dtype: Any = None,
            exp_avg_sq_dtype: Any = None,
            use_decoupled_grad: bool = False,
        ) -> None:
            pass

    mods = {n: types.ModuleType(n) for n in ("transformer_engine", "transformer_engine.pytorch")}
    opt = types.ModuleType("transformer_engine.pytorch.optimizers")
    opt.FusedAdam = FusedAdam  # type: ignore[attr-defined]
    return {**mods, "transformer_engine.pytorch.optimizers": opt}


def ddp_config(args: dict[str, Any]) -> Any:
    from megatron.core.distributed import DistributedDataParallelConfig

    names = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    kw = {k: v for k, v in args.items() if k in names}
    # bf16 gradients accumulate and reduce in fp32 unless --grad-reduce-in-bf16 (arguments.py@d98e8a64:1213-1217)
    kw["grad_reduce_in_fp32"] = not args["grad_reduce_in_bf16"]
    return DistributedDataParallelConfig(**kw)


TE_VERSION = "2.12.0"
"""The Transformer Engine version Megatron-Core's checks are answered with (TE is not on CI; the clusters have
one): the release megatron-core 0.16 is tested with."""


@pytest.fixture(scope="module")
def megatron_cpu() -> Any:
    import warnings

    import megatron.core.utils as mu
    from packaging.version import Version

    warnings.filterwarnings("ignore", module="megatron")
    saved = mu._te_version
    mu._te_version = Version(TE_VERSION)  # what get_te_version() caches when TE is installed
    yield mu
    mu._te_version = saved


def _fake_world(world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def model_parallel(world: int, args: dict[str, Any]) -> None:
    """``parallel_state.initialize_model_parallel`` with the exported sizes on the fake process group of
    ``world`` ranks (the caller destroys it)."""
    from megatron.core import parallel_state as ps

    _fake_world(world)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=args["tensor_model_parallel_size"],
        pipeline_model_parallel_size=args["pipeline_model_parallel_size"],
        virtual_pipeline_model_parallel_size=virtual_stages(args),
        context_parallel_size=args["context_parallel_size"],
        expert_model_parallel_size=args["expert_model_parallel_size"],
        expert_tensor_parallel_size=args.get("expert_tensor_parallel_size")
        or args["tensor_model_parallel_size"],
        create_gloo_process_groups=False,
    )


def test_every_exported_configuration_builds_megatron_cores_objects(exported, megatron_cpu) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    assert {name for name, *_ in exported} == {StudySpec.from_yaml(p).name for p in STUDY_FILES}
    failures: list[str] = []
    moe_built: set[tuple[str, str]] = set()
    try:
        for name, spec, config, fmt, values in exported:
            where = f"{name} {fmt} {config.key()}"
            args = _args(spec, values)
            try:
                cfg = transformer_config(args)
                optimizer_config(args)
                ddp_config(args)
                model_parallel(spec.world, args)
                try:
                    assert ps.get_data_parallel_world_size() == config.dp, "data-parallel size"
                    key = (name, json.dumps({k: v for k, v in values.items() if k != "micro_batch_size"}))
                    if spec.model.is_moe and key not in moe_built:
                        moe_built.add(key)
                        _moe_layer(cfg)
                finally:
                    ps.destroy_model_parallel()
            except Exception as exc:  # collect all, report all
                failures.append(f"{where}: {type(exc).__name__}: {exc}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert not failures, f"{len(failures)} of {len(exported)} exports refused:\n" + "\n".join(failures[:20])


def _upstream_field_export(field: str, **workload: Any) -> Any:
    """The TransformerConfig built from the flagship's export on B200 with ``workload`` set; skipped where the
    installed megatron-core predates ``field`` (0.16.1, core_v0.16.1 = 55ac7082, lacks the upstream-only ones):
    the dict-to-config translation above would silently drop the key, which is no check at all."""
    from megatron.core.transformer import TransformerConfig

    from primus_optuna.space import Space

    if field not in {f.name for f in dataclasses.fields(TransformerConfig)}:
        pytest.skip(
            f"megatron-core {megatron.__version__} has no TransformerConfig.{field} (added upstream after "
            "core_v0.16.1; Megatron-LM d98e8a64 has it)"
        )
    data = StudySpec.from_yaml(STUDIES / "mixtral-8x22b-mi355x-fp8.yaml").to_dict()
    data["cluster"] = {**data["cluster"], "gpu": "b200"}
    data["workload"] = {**data["workload"], **workload}
    spec = StudySpec.from_dict(data)
    values = json.loads(export_config(spec, Space(spec).baseline, "json"))["megatron"]
    return transformer_config(_args(spec, values))


def _moe_layer(config: Any) -> Any:
    """Megatron-Core's MoE layer (router, token dispatcher, experts, shared experts) on the parallel state set up,
    TE's linear layers and DeepEP's kernels stood in for (:func:`tests.mcore.cpu_shims.moe_constructors`)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    with cpu_shims.moe_constructors():
        return MoELayer(config, cpu_shims.moe_submodules(), layer_number=1)


def test_te_op_fuser_export_builds_a_transformer_config(megatron_cpu) -> None:
    """An exported ``workload.te_op_fuser`` reaches TransformerConfig's ``use_transformer_engine_op_fuser``
    (Megatron-LM transformer_config.py@d98e8a64:525-527), which with grouped GEMMs turns on the grouped-tensor
    experts (transformer_config.py@d98e8a64:1410-1411). Skipped where the installed megatron-core predates the
    field (:func:`_upstream_field_export`)."""
    cfg = _upstream_field_export("use_transformer_engine_op_fuser", te_op_fuser=True)
    assert cfg.use_transformer_engine_op_fuser is True
    if hasattr(cfg, "moe_use_grouped_tensor"):  # the grouped-tensor experts came with the field upstream
        assert cfg.moe_use_grouped_tensor is True


def test_fp8_output_proj_export_builds_a_transformer_config(megatron_cpu) -> None:
    """An exported ``workload.fp8_output_proj`` reaches TransformerConfig's ``fp8_output_proj`` (Megatron-LM
    transformer_config.py@d98e8a64:635), which accepts it with FP8 and the MXFP8 recipe (:1569-1575). Skipped
    where the installed megatron-core predates the field (:func:`_upstream_field_export`)."""
    cfg = _upstream_field_export("fp8_output_proj", fp8_recipe="mxfp8", fp8_output_proj=True)
    assert cfg.fp8_output_proj is True


def test_a2a_context_parallel_export_builds_megatron_cores_objects(megatron_cpu) -> None:
    """GPT-OSS with cp = 2 (a2a, ModelSpec.cp_comm_type) builds a TransformerConfig carrying cp_comm_type 'a2a'
    and a context-parallel group of 2 on the fake process group; the study's own 30-trial run need not reach a
    cp > 1 configuration, so this one is built directly."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from primus_optuna.space import Space

    spec = StudySpec.from_yaml(STUDIES / "gpt-oss-120b-h100-bf16.yaml")
    c = Space(spec).make(tp=1, pp=4, vpp=1, ep=8, cp=2, mbs=1, recompute="none", pp_schedule="1f1b")
    args = _args(spec, json.loads(export_config(spec, c, "json"))["megatron"])
    assert transformer_config(args).cp_comm_type == "a2a"
    try:
        _fake_world(spec.world)
        ps.initialize_model_parallel(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=4,
            context_parallel_size=args["context_parallel_size"],
            expert_model_parallel_size=8,
            create_gloo_process_groups=False,
        )
        try:
            assert ps.get_context_parallel_world_size() == 2 and ps.get_data_parallel_world_size() == c.dp
        finally:
            ps.destroy_model_parallel()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
