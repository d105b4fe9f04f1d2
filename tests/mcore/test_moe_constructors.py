"""The CI framework check one level below the config classes: the rules that live in constructors and launch code.

- Every legal configuration of every shipped study (the whole space, not only the trials a run reaches),
  exported as Megatron arguments, meets :data:`CONSTRUCTOR_CHECKS`: each restates one assertion of
  Megatron-LM, Megatron-Core or Primus on those arguments, with its path@commit:line. Cheap predicates over
  the arguments; nothing is built.
- For a sample of each MoE study's legal configurations (one per expert-parallel size and dispatcher),
  Megatron-Core's own ``MoELayer`` (router, token dispatcher, ``TEGroupedMLP`` experts, shared experts) is built
  on torch's fake process group from the exported arguments, with TE's linear layers and DeepEP's kernels stood
  in for (:func:`tests.mcore.cpu_shims.moe_constructors`), so an assertion in any of their constructors fails
  the test. tests/mcore/test_exported_configs.py builds the same layer from every exported trial.

Installed: megatron-core 0.16.1 (core_v0.16.1); its lines are cited where they differ from Megatron-LM d98e8a64
(upstream main) and d3528a21 (the commit Primus fd1eeabb pins, third_party/Megatron-LM).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from primus_optuna.record.export import export_config
from primus_optuna.space import Space
from primus_optuna.space.megatron_args import megatron_overrides, model_arguments
from primus_optuna.spec import StudySpec
from tests.conftest import STUDIES

megatron = pytest.importorskip(
    "megatron.core", reason="megatron-core is not installed (pip install -e .[dev])"
)
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.megatron

STUDY_FILES = sorted(STUDIES.glob("*.yaml"))

PARSER_DEFAULTS: dict[str, Any] = {
    "bias_dropout_fusion": True,  # --no-bias-dropout-fusion, store_false (arguments.py@d98e8a64:2899-2901)
    "overlap_p2p_comm": True,  # --no-overlap-p2p-communication, store_false (arguments.py@d98e8a64:3118-3120)
    "moe_router_dtype": None,
    "tp_comm_overlap": False,
    "use_turbo_deepep": False,
    "turbo_sync_free_moe_stage": 0,
}
"""Megatron-LM's (and Primus's) value of each argument the checks read that an export may leave out."""


def launch_arguments(spec: StudySpec, config: Any, model: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a launch of ``config`` hands the framework: the export's values over the model's architecture
    (``model``: :func:`model_arguments` of ``spec``, computed once per study) over the parser's defaults, with the
    world size and micro-batch count the launch derives."""
    model = model_arguments(spec) if model is None else model
    args = {**PARSER_DEFAULTS, **model, **megatron_overrides(spec, config)}
    args.update(world_size=spec.world, num_microbatches=config.num_microbatches)
    return args


def _flex_tp_ep(a: dict[str, Any]) -> str | None:
    if a.get("moe_token_dispatcher_type") != "flex":
        return None
    if a["expert_tensor_parallel_size"] * a["expert_model_parallel_size"] <= 1:
        return "flex dispatcher with expert-TP x EP = 1"
    return None


def _turbo_deepep_tp_ep(a: dict[str, Any]) -> str | None:
    if a["use_turbo_deepep"] and a["expert_tensor_parallel_size"] * a["expert_model_parallel_size"] <= 1:
        return "Primus-Turbo DeepEP with expert-TP x EP = 1"
    return None


def _experts_ep(a: dict[str, Any]) -> str | None:
    if a.get("num_experts") and a["num_experts"] % a["expert_model_parallel_size"]:
        return "experts not divisible by EP"
    return None


def _moe_tp_sp(a: dict[str, Any]) -> str | None:
    if a.get("num_experts") and a["tensor_model_parallel_size"] > 1 and not a["sequence_parallel"]:
        return "MoE with TP > 1 without sequence parallelism"
    return None


def _grouped_mlp_bias(a: dict[str, Any]) -> str | None:
    if (
        a.get("num_experts")
        and a.get("moe_grouped_gemm")
        and a["add_bias_linear"]
        and a["bias_dropout_fusion"]
    ):
        return "TEGroupedMLP with linear biases and bias-dropout fusion"
    return None


def _tp_comm_overlap_sp(a: dict[str, Any]) -> str | None:
    if a["tp_comm_overlap"] and not (a["tensor_model_parallel_size"] > 1 and a["sequence_parallel"]):
        return "--tp-comm-overlap without sequence parallelism"
    return None


def _world(a: dict[str, Any]) -> str | None:
    dense = a["tensor_model_parallel_size"] * a["pipeline_model_parallel_size"] * a["context_parallel_size"]
    expert = (
        a.get("expert_tensor_parallel_size", a["tensor_model_parallel_size"])
        * a["expert_model_parallel_size"]
        * a["pipeline_model_parallel_size"]
    )
    if a["world_size"] % dense or a["world_size"] % expert:
        return f"world {a['world_size']} not divisible by tp*pp*cp={dense} or etp*ep*pp={expert}"
    return None


def _virtual_pipeline(a: dict[str, Any]) -> str | None:
    vpp = a.get("num_virtual_stages_per_pipeline_rank") or 1
    pp, m = a["pipeline_model_parallel_size"], a["num_microbatches"]
    if vpp == 1 and not a.get("pipeline_model_parallel_layout"):
        return None
    if pp <= (1 if a["overlap_p2p_comm"] else 2):
        return f"virtual pipeline with pp={pp}"
    # microbatch_group_size_per_vp_stage defaults to pp (model_parallel_config.py@d98e8a64:567-568)
    if m < pp or (0 < m % pp < pp):
        return f"interleaved schedule with {m} micro-batches over pp={pp}"
    return None


def _seq_cp(a: dict[str, Any]) -> str | None:
    cp = a["context_parallel_size"]
    if cp > 1 and a["seq_length"] % (2 * cp):
        return f"seq_length {a['seq_length']} not a multiple of 2*cp"
    return None


def _turbo_deepep_fp32(a: dict[str, Any]) -> str | None:
    if a["use_turbo_deepep"] and a["moe_router_dtype"] != "fp32":
        return "Primus-Turbo DeepEP without fp32 router probabilities"
    return None


def _sync_free_grouped_gemm(a: dict[str, Any]) -> str | None:
    if a["turbo_sync_free_moe_stage"] > 1 and not (
        a.get("use_turbo_grouped_gemm") and a.get("enable_primus_turbo")
    ):
        return "sync-free MoE stage 2 without Primus-Turbo's grouped GEMM"
    return None


CONSTRUCTOR_CHECKS: tuple[tuple[str, str, Callable[[dict[str, Any]], str | None]], ...] = (
    (
        "flex dispatcher: expert-TP x EP > 1 (rule deepep_ep)",
        "megatron/core/transformer/moe/token_dispatcher.py@d98e8a64:1836 (its tp is expt_tp, :86,89); "
        "@d3528a21:1359; megatron-core 0.16.1 token_dispatcher.py:1346",
        _flex_tp_ep,
    ),
    (
        "Primus-Turbo DeepEP dispatcher: expert-TP x EP > 1 (rule deepep_ep)",
        "primus/backends/megatron/core/extensions/primus_turbo.py@fd1eeabb:2320-2321",
        _turbo_deepep_tp_ep,
    ),
    (
        "MoE layer: EP divides the experts (rule ep_experts)",
        "megatron/core/transformer/moe/moe_layer.py@d98e8a64:186",
        _experts_ep,
    ),
    (
        "MoE layer in training: TP > 1 needs sequence parallelism (rule moe_tp_sp)",
        "megatron/core/transformer/moe/moe_layer.py@d98e8a64:636-640",
        _moe_tp_sp,
    ),
    (
        "TEGroupedMLP: no bias-dropout fusion with linear biases (export: --no-bias-dropout-fusion)",
        "megatron/core/transformer/moe/experts.py@d98e8a64:205-207; @d3528a21:171-173; 0.16.1 experts.py:529-531",
        _grouped_mlp_bias,
    ),
    (
        "validate_args: --tp-comm-overlap needs sequence parallelism (rule tp_comm_overlap_sp)",
        "megatron/training/arguments.py@d98e8a64:1441-1442; @d3528a21:1153-1154",
        _tp_comm_overlap_sp,
    ),
    (
        "initialize_model_parallel: tp*pp*cp and etp*ep*pp divide the world (rules world, ep_fold)",
        "megatron/core/parallel_state.py@d98e8a64:822-823, 877-884",
        _world,
    ),
    (
        "virtual pipeline: pp > 1 (> 2 without p2p overlap); micro-batches >= pp and a multiple of it "
        "(rules pp1_no_pipeline, mb_ge_pp, mb_interleaved)",
        "megatron/core/parallel_state.py@d98e8a64:827-831; megatron/training/arguments.py@d98e8a64:1000-1009; "
        "megatron/core/pipeline_parallel/schedules.py@d98e8a64:1160-1180",
        _virtual_pipeline,
    ),
    (
        "validate_args: seq_length a multiple of 2*cp (rule seq_cp)",
        "megatron/training/arguments.py@d98e8a64:1335-1338",
        _seq_cp,
    ),
    (
        "Primus-Turbo DeepEP: fp32 router probabilities (export: moe_router_dtype fp32)",
        "primus/backends/megatron/patches/args/rocm_arg_validation.py@fd1eeabb:225-227",
        _turbo_deepep_fp32,
    ),
    (
        "Primus sync-free MoE stage 2: Primus-Turbo's grouped GEMM (export: use_turbo_grouped_gemm)",
        "primus/backends/megatron/patches/args/rocm_arg_validation.py@fd1eeabb:199-206",
        _sync_free_grouped_gemm,
    ),
)
"""(what, source, check on a launch's arguments -> reason or None), each restating one framework assertion."""


@pytest.fixture(scope="module")
def spaces() -> list[Space]:
    return [Space(StudySpec.from_yaml(p)) for p in STUDY_FILES]


def test_every_legal_configuration_meets_the_constructor_checks(spaces: list[Space]) -> None:
    failures: dict[str, list[str]] = {}
    checked = 0
    for space in spaces:
        spec, model = space.spec, model_arguments(space.spec)
        for config in space.configs():
            args = launch_arguments(spec, config, model)
            checked += 1
            for what, source, check in CONSTRUCTOR_CHECKS:
                why = check(args)
                if why:
                    failures.setdefault(f"{what} [{source}]", []).append(f"{spec.name} {config.key()}: {why}")
    assert checked > 100_000  # the whole space of every shipped study
    assert not failures, "\n".join(
        f"{k}: {len(v)} legal configurations, e.g. {v[:2]}" for k, v in failures.items()
    )


def test_the_checks_catch_what_the_frameworks_refuse(spaces: list[Space]) -> None:
    """Each check rejects the arguments its framework refuses (a check that never fires checks nothing)."""
    flagship = next(s for s in spaces if s.spec.name.startswith("mixtral"))
    ok = launch_arguments(flagship.spec, flagship.baseline)
    broken = {
        _flex_tp_ep: {"moe_token_dispatcher_type": "flex", "expert_model_parallel_size": 1},
        _turbo_deepep_tp_ep: {"use_turbo_deepep": True, "expert_model_parallel_size": 1},
        _experts_ep: {"expert_model_parallel_size": 3},
        _moe_tp_sp: {"tensor_model_parallel_size": 2, "sequence_parallel": False},
        _grouped_mlp_bias: {"add_bias_linear": True, "bias_dropout_fusion": True},
        _tp_comm_overlap_sp: {"tp_comm_overlap": True, "sequence_parallel": False},
        _world: {"pipeline_model_parallel_size": 3},
        _virtual_pipeline: {"num_microbatches": 6},
        _seq_cp: {"context_parallel_size": 3},
        _turbo_deepep_fp32: {"use_turbo_deepep": True, "moe_router_dtype": None},
        _sync_free_grouped_gemm: {"turbo_sync_free_moe_stage": 2, "use_turbo_grouped_gemm": False},
    }
    assert set(broken) == {check for *_, check in CONSTRUCTOR_CHECKS}
    for check, change in broken.items():
        assert check(ok) is None, check.__name__
        assert check({**ok, **change}), check.__name__


# --- Megatron-Core's MoE layer, built ---------------------------------------------------------------------------
def build_moe_layer(spec: StudySpec, args: dict[str, Any], config: Any) -> Any:
    """Megatron-Core's ``MoELayer`` for the exported ``args`` (TransformerConfig ``config``) on the fake process
    group of the study's world, its parallel state set up and torn down around it; raises what its constructors
    raise."""
    from megatron.core import parallel_state as ps

    from tests.mcore.test_exported_configs import _moe_layer, model_parallel

    model_parallel(spec.world, args)
    try:
        return _moe_layer(config)
    finally:
        ps.destroy_model_parallel()


def _exported(spec: StudySpec, config: Any) -> tuple[dict[str, Any], Any]:
    from tests.mcore.test_exported_configs import _args, transformer_config

    args = _args(spec, json.loads(export_config(spec, config, "json"))["megatron"])
    return args, transformer_config(args)


@pytest.fixture(scope="module")
def megatron_moe_cpu() -> Any:
    import warnings

    import megatron.core.utils as mu
    from packaging.version import Version

    from tests.mcore.test_exported_configs import TE_VERSION

    warnings.filterwarnings("ignore", module="megatron")
    saved = mu._te_version
    mu._te_version = Version(TE_VERSION)
    yield
    mu._te_version = saved
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_sample_of_every_moe_studys_space_builds_the_moe_layer(
    spaces: list[Space], megatron_moe_cpu
) -> None:
    """One legal configuration per (ep, dispatcher) of each MoE study builds Megatron-Core's MoE layer with the
    dispatcher its export names (``MoEFlexTokenDispatcher`` for deepep, ``MoEAlltoAllTokenDispatcher``)."""
    from megatron.core.transformer.moe.token_dispatcher import (
        MoEAlltoAllTokenDispatcher,
        MoEFlexTokenDispatcher,
    )

    failures, built = [], 0
    for space in spaces:
        if not space.spec.model.is_moe:
            continue
        sample: dict[tuple[int, str], Any] = {}
        for c in space.configs():
            sample.setdefault((c.ep, c.moe_dispatcher), c)
        for (ep, dispatcher), c in sorted(sample.items()):
            try:
                layer = build_moe_layer(space.spec, *_exported(space.spec, c))
                kind = MoEFlexTokenDispatcher if dispatcher == "deepep" else MoEAlltoAllTokenDispatcher
                assert (
                    type(layer.token_dispatcher) is kind
                    and layer.num_local_experts == space.spec.model.experts // ep
                )
                built += 1
            except Exception as exc:  # collect all, report all
                failures.append(f"{space.spec.name} {c.key()}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)
    assert built >= 20


def test_the_built_layer_refuses_what_megatron_refuses(spaces: list[Space], megatron_moe_cpu) -> None:
    """The build is the framework's own check: DeepEP at expert-TP x EP = 1 (token_dispatcher.py, 0.16.1:1346)
    and GPT-OSS's biased experts with Megatron-LM's default bias-dropout fusion (experts.py, 0.16.1:529-531)
    fail it, as on a cluster."""
    flagship = next(s for s in spaces if s.spec.name.startswith("mixtral"))
    one = flagship.make(tp=1, pp=4, vpp=2, ep=1, mbs=1, moe_dispatcher="deepep", pp_schedule="interleaved")
    with pytest.raises(AssertionError, match="TPxEP > 1"):
        build_moe_layer(flagship.spec, *_exported(flagship.spec, one))
    oss = next(s for s in spaces if s.spec.name.startswith("gpt-oss"))
    args, _ = _exported(oss.spec, oss.baseline)
    from tests.mcore.test_exported_configs import transformer_config

    fused = {**args, "bias_dropout_fusion": True}
    with pytest.raises(AssertionError, match="bias_dropout_fusion is not supported in TEGroupedMLP"):
        build_moe_layer(oss.spec, fused, transformer_config(fused))
