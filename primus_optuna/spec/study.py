"""The study file: :class:`StudySpec` and its sections, loaded from YAML or a dict.

Unknown keys are rejected everywhere; every error names the field and the fix and surfaces as one
:class:`~primus_optuna.errors.SpecError`.

Example::

    spec = StudySpec.from_yaml("studies/mixtral-8x22b-mi355x-fp8.yaml")
    spec.world, spec.model.num_experts  # (64, 8)
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from ..errors import SpecError
from ..redaction import MASK, looks_secret, redact_data
from .axes import AXES, BOOL_AXES, CHOICES, INT_AXES, REGISTRY  # noqa: F401 (re-exported)
from .hardware import GPU_CATALOG, GPUS_PER_NODE, GPUSpec, gpu_key, with_overrides
from .layout import PipelineSpec
from .model import MODEL_CATALOG, ModelSpec
from .network import NetworkSpec, network_field
from .optimizer import OPTIMIZER_DTYPE_FIELDS, PRECISION_AWARE_FIELDS  # noqa: F401 (re-exported)
from .profile import HardwareProfile, load_profile, profile_from_data
from .strict import StrictIntModel

RECOMPUTE = CHOICES["recompute"]
"""The plain recompute words; the axis also takes ``selective:<modules>`` and ``full:N``
(:mod:`primus_optuna.spec.recompute`)."""
MOE_RECOMPUTE = (
    "none",
    "selective:moe_act",
    "selective:moe_act+layernorm",
    "selective:moe",
    "full:1",
    "full:2",
    "full:4",
    "full",
)
"""Default recompute candidates of an MoE model, in decreasing memory order (illegal ``full:N`` drop out)."""
DENSE_RECOMPUTE = ("none", "selective", "selective:mlp", "full:1", "full:2", "full")
"""Default recompute candidates of a dense model, in decreasing memory order."""
DISPATCHERS = CHOICES["moe_dispatcher"]
SCHEDULES = CHOICES["pp_schedule"]


def check_choice(axis: str, value: Any) -> Any:
    """``value`` validated for a categorical axis, in canonical form; a :class:`SpecError` (a ``ValueError``)
    names the field and the allowed values."""
    canonical = REGISTRY[axis].canonical
    if canonical is not None:
        return canonical(value)
    if axis in BOOL_AXES:
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            value = value.strip().lower() == "true"
        if not isinstance(value, bool):
            raise SpecError(f"{axis}: {value!r} is not allowed; allowed values: true, false")
        return value
    if value not in CHOICES[axis]:
        alias = DISPATCHER_ALIASES.get(str(value).lower()) if axis == "moe_dispatcher" else None
        hint = (
            f"; for {alias} use deepep (priced as DeepEP, exported as the flex dispatcher)" if alias else ""
        )
        raise SpecError(
            f"{axis}: {value!r} is not allowed; allowed values: {', '.join(map(str, CHOICES[axis]))}{hint}"
        )
    return value


DISPATCHER_ALIASES = {"flex": "flex", "hybridep": "HybridEP", "turbo": "Primus-Turbo's DeepEP"}
"""Dispatcher names from Megatron-Bridge / Primus recipes (lower case) that the ``moe_dispatcher`` axis calls
``deepep``: it is priced as DeepEP and exported as Megatron's flex dispatcher with its DeepEP backend (Primus:
Turbo's DeepEP)."""


OBJECTIVES = ("tokens_per_s_per_gpu", "peak_memory_gib")
RUNNER_KINDS = ("analytical", "profile", "command", "local", "primus", "megatron", "torchtitan", "slurm")


def _unknown(kind: str, name: str, known: list[str]) -> ValueError:
    close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.4)  # catalog names are lower case
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(f"unknown {kind} {name!r}{hint} (known: {', '.join(known)})")


class _Strict(StrictIntModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ClusterSpec(_Strict):
    """``cluster``: the GPU (catalog name, catalog name plus overrides, or inline), nodes and GPUs per node (a node
    is what the network model prices at intra-node bandwidth: a GB200/GB300 NVLink domain), GPUs per host."""

    gpu: GPUSpec
    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(default=GPUS_PER_NODE, gt=0)
    gpus_per_host: int | None = Field(default=None, gt=0, validate_default=True)
    """GPUs per host (one operating system: a server, a GB200/GB300 compute tray); launches start one process
    group per host. Default: the GPU's own (4 on GB200/GB300, ``GPUSpec.gpus_per_host``), else the node's.
    The network model keeps the node (the NVLink domain): a node of 64 GB200 GPUs is 16 hosts of 4."""
    network: NetworkSpec | None = None
    """the cluster's measured collectives (:mod:`.network`): a nccl-tests log or CSV path, or a list of them,
    relative to the study file; read at load time (None: the catalog's collective model)"""

    @field_validator("network", mode="before")
    @classmethod
    def _read_network(cls, v: Any, info: ValidationInfo) -> Any:
        try:
            return network_field(v, (info.context or {}).get("base_dir", "."))
        except SpecError as exc:
            raise ValueError(str(exc).removeprefix("cluster.network: ")) from None

    @model_validator(mode="after")
    def _network_scope(self) -> ClusterSpec:
        if self.network is not None:
            wide = max((r[2] for r in self.network.rows), default=0)
            if wide > self.gpus_per_node:
                raise ValueError(
                    f"network: measured with {wide} ranks per node but cluster.gpus_per_node is "
                    f"{self.gpus_per_node}; give measurements of this cluster (or fix gpus_per_node)"
                )
        return self

    profile: HardwareProfile | None = None
    """the node's hardware profile (``primus-optuna calibrate``): a path relative to the study file, read when
    the study is loaded (its content, not its path, is the study's: it enters the space hash); the physics
    prices GEMMs, attention and memory-bound kernels from its tables instead of the catalog's constants"""

    @field_validator("profile", mode="before")
    @classmethod
    def _load_profile(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str | Path):
            path = Path(v)
            if not path.is_absolute():
                path = Path((info.context or {}).get("base_dir", ".")) / path
            try:
                return load_profile(path)
            except SpecError as exc:
                raise ValueError(str(exc)) from None
        if isinstance(v, dict):
            try:
                return profile_from_data(v, "the profile")
            except SpecError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("gpu", mode="before")
    @classmethod
    def _resolve_gpu(cls, v: Any) -> Any:
        if isinstance(v, str):
            if gpu_key(v) not in GPU_CATALOG:
                raise _unknown("GPU", v, sorted(GPU_CATALOG))
            return GPU_CATALOG[gpu_key(v)]
        if isinstance(v, dict) and "catalog" in v:
            name = v["catalog"]
            if gpu_key(str(name)) not in GPU_CATALOG:
                raise _unknown("GPU", str(name), sorted(GPU_CATALOG))
            overrides = {k: val for k, val in v.items() if k != "catalog"}
            return with_overrides(GPU_CATALOG[gpu_key(str(name))], overrides)
        return v

    @field_validator("gpus_per_host")
    @classmethod
    def _host_divides_node(cls, v: int | None, info: ValidationInfo) -> int | None:
        gpu, per_node = info.data.get("gpu"), info.data.get("gpus_per_node")
        if not isinstance(gpu, GPUSpec) or per_node is None:
            return v  # their own errors are reported
        per_host = _gpus_per_host(v, gpu, per_node)
        if per_node % per_host:
            given = "" if v is not None else f" (the {gpu.name} default)"
            raise ValueError(
                f"{per_host} GPUs per host{given} do not divide cluster.gpus_per_node ({per_node}): a node (NVLink "
                f"domain) is whole hosts; set gpus_per_node to a multiple of {per_host} or gpus_per_host to a "
                f"divisor of {per_node}"
            )
        return v

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def host_gpus(self) -> int:
        """GPUs per host of the launch (``gpus_per_host`` resolved; a divisor of ``gpus_per_node``)."""
        return _gpus_per_host(self.gpus_per_host, self.gpu, self.gpus_per_node)

    @property
    def hosts(self) -> int:
        """Hosts the launch starts on: one torchrun (one launch) per host."""
        return self.world // self.host_gpus

    def warnings(self) -> list[str]:
        """What is legal but probably not meant: more GPUs per node than the GPU's intra-node fabric joins
        (the model prices every GPU of a node at its NVLink/xGMI bandwidth); a hardware profile measured on a
        CPU standing in for an AMD/NVIDIA GPU."""
        out = self._fabric_warnings()
        prof, g = self.profile, self.gpu
        if prof is not None and prof.device.kind == "cpu" and g.vendor in ("amd", "nvidia"):
            out.append(
                f"cluster.profile: measured on {prof.device.name}, not on the cluster's {g.name}: every compute term is "
                f"priced at that CPU's speed; run `primus-optuna calibrate` on one of its nodes, or remove the key"
            )
        return out

    def _fabric_warnings(self) -> list[str]:
        g, n = self.gpu, self.gpus_per_node
        if g.topology == "mesh":
            domain, what = g.intra_node_links + 1, f"a full mesh of {g.intra_node_links} links per GPU"
        elif gpu_key(g.name) in NVLINK_DOMAIN:
            domain, what = NVLINK_DOMAIN[gpu_key(g.name)], "its NVLink domain"
        else:
            return []
        if n <= domain:
            return []
        return [
            f"cluster.gpus_per_node: {n} {g.name} GPUs per node, but {what} joins at most {domain}; every GPU of a "
            f"node is priced at intra-node bandwidth, so write the cluster as nodes of {domain} "
            f"(e.g. nodes: {max(1, self.world // domain)}, gpus_per_node: {domain})"
        ]


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """``FILE:LINE:COL: not valid YAML: problem (context)`` on one line, where PyYAML marks the place."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:
        return f"{path}: not valid YAML: {' '.join(str(exc).split())}"
    context = getattr(exc, "context", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}"
    return (
        f"{where}: not valid YAML: {problem}"
        + (f" ({context})" if context else "")
        + "; fix the syntax there"
    )


def _gpus_per_host(given: int | None, gpu: GPUSpec, gpus_per_node: int) -> int:
    """``cluster.gpus_per_host``, else the GPU's (at most the node's GPUs), else the node's."""
    if given is not None:
        return given
    if gpu.gpus_per_host is not None:
        return min(gpu.gpus_per_host, gpus_per_node)
    return gpus_per_node


NVLINK_DOMAIN = {
    "a100-80gb": 8,
    "h100": 8,
    "h200": 8,
    "b200": 8,
    "b300": 8,
    "gb200": 72,
    "gb300": 72,
}
"""GPUs one NVSwitch fabric joins: an HGX/DGX board (8; NVIDIA DGX A100/H100/H200/B200/B300 user guides) or a
GB200/GB300 NVL72 rack (72; NVIDIA GB200 NVL72 datasheet)"""


MAX_SEQ_LENGTH = 2**24
"""16,777,216 tokens: above the longest context any model was published with (10M tokens, Llama 4 Scout, Meta
2025); a longer one is a typo (an exponent), and the estimates' token counts stay exact in float64"""
MAX_GLOBAL_BATCH = 2**24
"""sequences per optimizer step: above any published recipe (DeepSeek-V3: 15,360; MegaScale: 12,288) by three
orders of magnitude; a larger one is a typo"""


class WorkloadSpec(_Strict):
    """``workload``: what one optimizer step processes."""

    seq_length: int = Field(gt=0, le=MAX_SEQ_LENGTH)
    global_batch_size: int = Field(gt=0, le=MAX_GLOBAL_BATCH)
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    distributed_optimizer: bool = True
    flash_attention: bool = True
    """fused (flash) attention; false = unfused attention with the s² scores in HBM (time and memory)"""
    overlap_grad_reduce: bool = True
    """DP gradient reduce(-scatter) overlapped with backward and, with the distributed optimizer, parameter
    all-gather with forward (Megatron's ``--overlap-grad-reduce``/``--overlap-param-gather``; Megatron's
    default is off, Primus's and Megatron-Bridge's recipes turn them on); false = both after the pipeline"""
    tp_comm_overlap: bool = False
    """TransformerEngine userbuffers TP communication overlap (``--tp-comm-overlap``)"""
    sequence_parallel: bool = True
    """Megatron's ``--sequence-parallel`` with TP > 1 (Primus's default: ``primus/configs/models/megatron/
    language_model.yaml@fd1eeabb``:166; Megatron's own default is off, ``model_parallel_config.py@d98e8a64``:94):
    norms, dropout and residual adds run on ``tokens / tp`` and TP communicates by all-gather/reduce-scatter.
    False: they run on all tokens on every TP rank, activations outside the TP-split GEMMs are not divided by
    tp, and each block all-reduces its output (forward) and its input gradient (backward) (Korthikanti et al.
    2022, §4.2, Table 2)"""
    te_op_fuser: bool = False
    """Megatron's ``--use-transformer-engine-op-fuser`` (TransformerConfig ``use_transformer_engine_op_fuser``,
    ``megatron/core/transformer/transformer_config.py@d98e8a64``:525-527; the flag is generated from that field,
    which the exclusions do not name, ``megatron/training/arguments.py@d98e8a64``:2279-2374), launched with
    ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``: each MoE layer's experts run as Transformer Engine's fused grouped MLP
    (FC1, activation and FC2 of all local experts as one op chain, the FC2 bias scaled inside it;
    ``megatron/core/transformer/moe/experts.py@d98e8a64``:382-456, 623-636), priced without the per-expert
    grouped-GEMM cost and bias loop where TE takes its fused kernel (Blackwell, MXFP8;
    ``physics.fused_mlp.fused_grouped_mlp``), as without the flag elsewhere. Megatron asserts the path is
    supported when the flag is on (experts.py:286-290): an MoE model (a dense MLP takes TEFusedMLP instead, not
    modelled: refused here) with TE GroupedLinear experts (the export adds ``moe_grouped_gemm``), expert TP 1
    (the export always writes ``expert_tensor_parallel_size: 1``), a gated SiLU / quick-GELU activation
    (``model.swiglu``: refused without it), the router probabilities applied after the experts, no
    expert_fc1/moe_act offload, Transformer Engine 2.14 or newer (one with ``scale_bias`` when the experts have
    biases). NVIDIA only: not in the Megatron-LM that Primus pins (d3528a21), so AMD studies, Primus exports and
    the zero-bubble schedules refuse it."""
    moe_sync_free: bool = False
    """Primus's sync-free MoE (``turbo_sync_free_moe_stage`` >= 2): the DeepEP path does not wait on the host
    for token counts (the all-to-all dispatcher always does, once per dispatch in forward)"""
    gradient_accumulation_fusion: bool = True
    """weight gradients accumulated into the fp32 main grad by the wgrad GEMM (Megatron's default); off adds
    a main-grad add per weight and step, and Primus's zero-bubble schedules fall back to plain 1F1B"""
    grad_reduce_in_fp32: bool = True
    """fp32 main gradients (4 bytes; Megatron's default). Every published Megatron-Bridge recipe sets it
    false: 2-byte gradients, halving the gradient buffer and the gradient reduce-scatter."""
    fp8_param_gather: bool = False
    """FP8 model parameters (TE ``fp8_model_init``): GEMM weights held in FP8 with no separate BF16 copy, and
    the distributed optimizer all-gathers FP8 (1 byte); master weights stay fp32. FP8 precision only."""
    fp8_dot_product_attention: bool = False
    """Transformer Engine's FP8 dot-product attention (Megatron-Core ``TransformerConfig.fp8_dot_product_attention``,
    ``transformer_config.py@d98e8a64``:640, handed to TE's recipe as ``fp8_dpa`` under the delayed, tensorwise
    and MXFP8 recipes, ``fp8_utils.py@d98e8a64``:770-787 and ``extensions/transformer_engine.py@d98e8a64``:3350): Q, K, V and the attention output in FP8, priced from
    cuDNN's FP8 kernels (``FamilyConstants.fp8_attention``). Megatron-Bridge recipes set it; Megatron-LM's
    command line has no flag for it (``arguments.py@d98e8a64``:2333) and Primus's Megatron backend drops keys
    Megatron's parser lacks (``argument_builder.py@fd1eeabb``:152-154), so exports refuse it. FP8 precision, not
    the blockwise recipe (which ignores it)."""
    fp8_output_proj: bool = False
    """The output layer (LM head) in MXFP8 (Megatron-Core ``TransformerConfig.fp8_output_proj``,
    ``transformer_config.py@d98e8a64``:635, which builds it as ``TELMHeadColumnParallelLinear`` under the FP8
    context, ``extensions/transformer_engine.py@d98e8a64``:1785-1900; Megatron-LM's ``--fp8-output-proj`` is
    generated from that field, ``arguments.py@d98e8a64``:2279-2374 do not exclude it): its three GEMMs at the FP8
    rate, its input and its logits' gradient cast to MXFP8. Megatron requires FP8 and the MXFP8 recipe
    (``transformer_config.py@d98e8a64``:1569-1575). Megatron-Bridge's 26.06 recipes set it. Not in the Megatron-LM
    that Primus pins (d3528a21): Primus exports refuse it. Memory is estimated as without it (the BF16 input
    copy, one hidden-wide tensor per micro-batch on the last stage, where TE keeps an FP8 one)."""
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = "delayed"
    """Transformer Engine FP8 recipe (Megatron ``--fp8-recipe``, default delayed scaling). Under delayed
    scaling Megatron rejects the ``moe_act`` and ``layernorm`` recompute modules."""
    precision_aware_optimizer: bool = False
    """Megatron-Core's ``--use-precision-aware-optimizer``: TransformerEngine's FusedAdam keeps the master
    weights and Adam moments in the dtypes below (``megatron/core/optimizer/optimizer_config.py``). Megatron
    requires the distributed optimizer and Adam (``megatron/core/optimizer/__init__.py``)."""
    main_params_dtype: Literal["fp32", "fp16"] = "fp32"
    """``--main-params-dtype``: the optimizer's master weights (precision-aware optimizer only)."""
    main_grads_dtype: Literal["fp32", "bf16"] = "fp32"
    """``--main-grads-dtype``: bf16 main grads are the 2-byte gradient buffer, which this file spells
    ``grad_reduce_in_fp32: false`` (set both; precision-aware optimizer only)."""
    exp_avg_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = "fp32"
    """``--exp-avg-dtype``: Adam's first moment as stored between steps (precision-aware optimizer only)."""
    exp_avg_sq_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = "fp32"
    """``--exp-avg-sq-dtype``: Adam's second moment as stored between steps (precision-aware optimizer
    only)."""

    @model_validator(mode="after")
    def _fp8_options(self) -> WorkloadSpec:
        if self.fp8_param_gather and self.precision != "fp8":
            raise ValueError("fp8_param_gather needs precision fp8; remove it or set precision: fp8")
        if self.fp8_dot_product_attention and self.precision != "fp8":
            raise ValueError("fp8_dot_product_attention needs precision fp8; remove it or set precision: fp8")
        if self.fp8_dot_product_attention and not self.flash_attention:
            raise ValueError(
                "fp8_dot_product_attention runs TE's fused attention kernel and flash_attention is false; set "
                "flash_attention: true or remove fp8_dot_product_attention"
            )
        if self.fp8_output_proj and (self.precision != "fp8" or self.fp8_recipe != "mxfp8"):
            # Megatron: transformer_config.py@d98e8a64:1569-1575
            raise ValueError(
                "fp8_output_proj needs precision fp8 with fp8_recipe mxfp8 (Megatron raises otherwise); set "
                "both or remove fp8_output_proj"
            )
        if self.fp8_dot_product_attention and self.fp8_recipe == "blockwise":
            # Megatron builds Float8BlockScaling without fp8_dpa (fp8_utils.py@d98e8a64:782-785)
            raise ValueError(
                "fp8_dot_product_attention has no effect under fp8_recipe blockwise (Megatron builds that recipe "
                "without fp8_dpa); use fp8_recipe mxfp8, tensorwise or delayed, or remove it"
            )
        return self

    @model_validator(mode="after")
    def _optimizer_dtypes(self) -> WorkloadSpec:
        # Megatron: OptimizerConfig.__post_init__ asserts every dtype is fp32 without the precision-aware
        # optimizer; get_megatron_optimizer raises without the distributed optimizer; arguments.py asserts
        # fp32 main grads when gradients accumulate in fp32
        lowered = [f"{k}: {getattr(self, k)}" for k in OPTIMIZER_DTYPE_FIELDS if getattr(self, k) != "fp32"]
        if lowered and not self.precision_aware_optimizer:
            raise ValueError(
                f"{', '.join(lowered)} needs precision_aware_optimizer: true (Megatron keeps every optimizer "
                "dtype fp32 without --use-precision-aware-optimizer); set it or use fp32"
            )
        if self.precision_aware_optimizer and not self.distributed_optimizer:
            raise ValueError(
                "precision_aware_optimizer needs distributed_optimizer: true (Megatron: "
                "--use-precision-aware-optimizer only supported with distributed optimizer); set it or remove "
                "precision_aware_optimizer"
            )
        if self.main_grads_dtype == "bf16" and self.grad_reduce_in_fp32:
            raise ValueError(
                "main_grads_dtype: bf16 needs grad_reduce_in_fp32: false (bf16 main grads are the 2-byte "
                "gradient buffer; Megatron asserts fp32 main grads when accumulating in fp32)"
            )
        return self


HASHED_WHEN_CHANGED = (
    *PRECISION_AWARE_FIELDS,
    "sequence_parallel",
    "te_op_fuser",
    "fp8_dot_product_attention",
    "fp8_output_proj",
)
"""workload fields that enter the space hash only when they differ from their default (study files written
before they existed keep their hash)"""


class _Baseline(_Strict):
    @field_validator(*(a for a in AXES if REGISTRY[a].canonical is not None), check_fields=False)
    @classmethod
    def _canonical(cls, v: Any, info: ValidationInfo) -> Any:
        return REGISTRY[info.field_name].canonical(v)  # type: ignore[index,misc]


def _baseline_field(name: str) -> tuple[Any, Any]:
    a = REGISTRY[name]
    if a.kind == "int":
        return int, Field(default=a.default, gt=0)
    if a.kind == "bool" or a.canonical is not None:
        return a.python_type, a.default
    return Literal[a.choices], a.default  # type: ignore[valid-type]


BaselineSpec = create_model(  # type: ignore[call-overload]
    "BaselineSpec",
    __base__=_Baseline,
    __module__=__name__,
    __doc__="A configuration written in a study file; omitted axes take Megatron's defaults.",
    **{a: _baseline_field(a) for a in AXES},
)


class EarlyStopSpec(_Strict):
    """``search.early_stop``: when a launching runner stops a slow job (the rule:
    :class:`~primus_optuna.search.early_stop.ThroughputPruner`). Not part of the space hash."""

    enabled: bool = Field(default=True, description="stop slow launches (launching runners only)")
    min_iters: int = Field(default=3, ge=2, description="steady-state iterations before a job is judged")
    margin: float = Field(default=0.05, ge=0.0, lt=1.0, description="allowed shortfall against the best")
    z: float = Field(default=2.0, ge=0.0, description="standard errors of the running median given as slack")


class SearchSpec(_Strict):
    """``search``: objective, memory margin, baseline, axis restrictions and budget."""

    objective: str | list[str] = "tokens_per_s_per_gpu"
    memory_safety_margin: float = Field(default=0.10, ge=0.0, lt=1.0)
    baseline: BaselineSpec = Field(default_factory=BaselineSpec)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    sweep_order: list[str] | None = None
    n_trials: int = Field(default=30, gt=0)
    sweep_trials: int | None = Field(default=None, ge=1)
    """trials the one-axis sweep may use (centre included); default: 15% of ``n_trials``"""
    start: Literal["auto", "baseline", "model"] = "auto"
    """the sweep's centre (its first trial): ``baseline`` the study's baseline (or the nearest configuration
    that fits), ``model`` the model's best estimate, ``auto`` the model's best when its estimated gain over the
    baseline lies beyond the error band of a ratio of two estimates (see :func:`~primus_optuna.search.sweep.
    model_start`), else the baseline"""
    seed: int = 0
    max_tp: int | None = Field(default=None, gt=0)
    early_stop: EarlyStopSpec = Field(default_factory=EarlyStopSpec)

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str | list[str]) -> str | list[str]:
        names = [v] if isinstance(v, str) else v
        if not names or names[0] != "tokens_per_s_per_gpu":
            raise ValueError("the first objective must be 'tokens_per_s_per_gpu'")
        for n in names:
            if n not in OBJECTIVES:
                raise _unknown("objective", n, list(OBJECTIVES))
        if len(set(names)) != len(names):
            raise ValueError("objectives are listed twice")
        return v

    @field_validator("axes")
    @classmethod
    def _axes(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for axis, values in v.items():
            if axis not in AXES:
                raise _unknown("axis", axis, list(AXES))
            if not values:
                raise ValueError(f"axes.{axis} is empty; list at least one value or remove the key")
            if axis in INT_AXES:
                if any(isinstance(x, bool) or not isinstance(x, int) or x <= 0 for x in values):
                    raise ValueError(f"axes.{axis} must be positive integers, got {values}")
            elif axis in BOOL_AXES:
                if any(not isinstance(x, bool) for x in values):
                    raise ValueError(f"axes.{axis} must be true/false, got {values}")
            elif REGISTRY[axis].canonical is not None:
                values = [REGISTRY[axis].canonical(x) for x in values]  # type: ignore[misc]
            else:
                for x in values:
                    if x not in CHOICES[axis]:
                        raise _unknown(f"{axis} value", str(x), list(CHOICES[axis]))
            out[axis] = list(dict.fromkeys(values))
        return out

    @field_validator("sweep_order")
    @classmethod
    def _order(cls, v: list[str] | None) -> list[str] | None:
        for axis in v or []:
            if axis not in AXES:
                raise _unknown("axis in sweep_order", axis, list(AXES))
        return v

    @property
    def objectives(self) -> list[str]:
        return [self.objective] if isinstance(self.objective, str) else list(self.objective)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


LOCAL_PROMPT_TOKENS = 3000
"""a small local model's prompt budget: with llm.max_tokens (1 K) it fits a 4 K context"""
HOSTED_AGENT_PROMPT_TOKENS = 16000
"""a hosted model's agent call: room for every tool result of llm.max_tool_calls"""


DEFAULT_TEMPERATURE = 0.7
"""``llm.temperature`` when unset, but in rank mode: 0 there, so a choice among the shortlist is the model's most
likely one, the same each run (at 0.7 a weak model's choice is a draw: docs/benchmarks.md, the planner section)"""


class LLMSpec(_Strict):
    """``llm``: the planner's model as a LiteLLM string. Keys come from the environment, never the file."""

    model: str | None = None
    api_base: str | None = None
    api_key_env: str | None = Field(default=None, description="name of the env var holding the key")
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description=f"sampling temperature; null: 0 in rank mode (a choice, made the same way each run), {DEFAULT_TEMPERATURE} else",
    )
    max_tokens: int = Field(
        default=1000, gt=0, description="answer tokens per LM request (a ranked list of a few candidates)"
    )
    max_calls: int = Field(default=8, ge=0, description="planner calls per study, reserved before each")
    max_cost_usd: float | None = Field(default=None, ge=0, description="no call starts once this is spent")
    timeout_s: float = Field(default=120.0, gt=0, description="wall-clock limit of one planner call")
    num_retries: int = Field(
        default=2, ge=0, description="retries of HTTP 5xx/429 (none with an api_base: a local server)"
    )
    proposals_per_round: int = Field(default=4, gt=0)
    mode: Literal["auto", "agent", "oneshot", "rank"] = Field(
        default="auto",
        description="agent: tool calls before proposing; oneshot: one answer; rank: the model chooses and "
        "justifies among the fallback's best candidates (never worse than them); auto: rank for a server on "
        "this machine (api_base on localhost), agent when LiteLLM knows the model calls tools, else oneshot",
    )
    max_tool_calls: int = Field(default=8, ge=0, description="tool calls per agent call")
    max_prompt_tokens: int | None = Field(
        default=None,
        ge=500,
        description="prompt budget: the one-shot context is compacted to fit (top trials cut to 2, legal values "
        "and sweep effects dropped, then the ranking cut), an agent's tools stop answering once their results would pass it; default "
        f"{LOCAL_PROMPT_TOKENS} with an api_base or in one-shot mode, {HOSTED_AGENT_PROMPT_TOKENS} for a "
        "hosted agent",
    )
    max_unparseable: int = Field(
        default=3, ge=1, description="unparseable answers in a row after which the planner stops"
    )
    response_format: Literal["auto", "json_schema", "json_object", "none"] = Field(
        default="auto",
        description="structured output from the legal values: json_schema (OpenAI, vLLM, llama.cpp, "
        "Ollama), json_object (llama-cpp-python), none; auto = json_schema",
    )
    fold_system_prompt: bool = Field(
        default=False, description="send the system message inside the user message (templates that drop it)"
    )
    stream: bool | None = Field(
        default=None,
        description="stream answers, so a request abandoned at llm.timeout_s stops generating on the server; "
        "default: on with an api_base (a local server), off otherwise",
    )
    cache: bool | None = Field(
        default=None,
        description="keep answers in DSPy's cache next to the storage, so a rerun replays them (only answers "
        "that parsed are kept); default: on for a hosted provider, off with an api_base (a local server)",
    )

    def prompt_budget(self, *, local: bool, agent: bool) -> int:
        """``max_prompt_tokens``, or its default for a local server / one-shot call vs a hosted agent."""
        if self.max_prompt_tokens is not None:
            return self.max_prompt_tokens
        return HOSTED_AGENT_PROMPT_TOKENS if agent and not local else LOCAL_PROMPT_TOKENS

    @model_validator(mode="before")
    @classmethod
    def _no_keys(cls, v: Any) -> Any:
        if isinstance(v, dict) and any(k in v for k in ("api_key", "key", "token")):
            raise ValueError(
                "API keys are never written in a study file; export the key in an environment variable (e.g. OPENAI_API_KEY) and, if its "
                "name is unusual, set llm.api_key_env to that variable's name"
            )
        return v


class RunnerSpec(_Strict):
    """``runner``: which runner measures a configuration, and its options."""

    kind: str = "analytical"
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in RUNNER_KINDS:
            raise _unknown("runner kind", v, list(RUNNER_KINDS))
        return v


TOKEN_SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def token_count(value: str | float) -> float:
    """A token count written as a number or with a K, M, B (or G), T, P suffix (powers of 1000): ``1T``,
    ``300B``, ``1.5e12``, ``2_000M``. Raises :class:`ValueError` for anything else or a count not above 0."""
    text = str(value).strip()
    m = re.fullmatch(r"([0-9][0-9_]*(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([kmbgtp]?)", text, re.IGNORECASE)
    count = float(m.group(1).replace("_", "")) * TOKEN_SUFFIXES[m.group(2).lower()] if m else 0.0
    if not m or not (count > 0 and math.isfinite(count)):
        raise ValueError(
            f"{text!r} is not a token count; write a number with an optional K, M, B or T suffix "
            "(e.g. 1T, 300B, 1.5e12)"
        )
    return count


class CapacitySpec(_Strict):
    """``capacity``: the targets of a capacity plan (``primus-optuna capacity``, whose options override them, and
    the report's capacity section): GPU counts, GPU types (catalog names; default the study's), tokens to train,
    days to train them in, prices per GPU-hour by type and the batch mode (docs/capacity.md)."""

    gpus: list[int] = Field(min_length=1)
    gpu: list[str] = Field(default_factory=list)
    tokens: float | None = None
    days: float | None = Field(default=None, gt=0)
    prices: dict[str, float] = Field(default_factory=dict)
    batch: Literal["fixed", "per-gpu"] = "fixed"

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, v: Any) -> Any:
        return v if v is None else token_count(v)

    @model_validator(mode="after")
    def _deadline(self) -> CapacitySpec:
        if self.days is not None and self.tokens is None:
            raise ValueError("days needs a token target; add capacity.tokens (e.g. tokens: 1T)")
        return self


class StudySpec(_Strict):
    """A whole study file. Build with :meth:`from_yaml` or :meth:`from_dict`."""

    name: str = Field(min_length=1)
    model: ModelSpec
    cluster: ClusterSpec
    workload: WorkloadSpec
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    llm: LLMSpec = Field(default_factory=LLMSpec)
    runner: RunnerSpec = Field(default_factory=RunnerSpec)
    storage: str | None = None
    capacity: CapacitySpec | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if "/" in v or "\\" in v:  # the default storage, artifacts and report are files named after it
            raise ValueError(
                f"{v!r} holds a path separator; name the study without '/' or '\\' (e.g. "
                f"{v.replace('/', '-').replace(chr(92), '-')!r})"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _primus_yaml(cls, data: Any, info: ValidationInfo) -> Any:
        """``model: {primus_yaml: path}``: model, baseline and missing workload keys from a Primus YAML."""
        if isinstance(data, dict) and isinstance(data.get("model"), dict) and "primus_yaml" in data["model"]:
            from .primus_import import expand_primus_study

            try:
                return expand_primus_study(data, (info.context or {}).get("base_dir", "."))
            except SpecError as exc:
                raise ValueError(str(exc)) from None
        return data

    @field_validator("model", mode="before")
    @classmethod
    def _resolve_model(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, dict):
            return v
        if "catalog" in v:
            name = v["catalog"]
            if name not in MODEL_CATALOG:
                raise _unknown("model", str(name), sorted(MODEL_CATALOG))
            overrides = {k: val for k, val in v.items() if k != "catalog"}
            return {**MODEL_CATALOG[name].model_dump(), **overrides}
        if "hf_config" in v:
            base = Path((info.context or {}).get("base_dir", "."))
            path = Path(v["hf_config"])
            if not path.is_absolute():
                path = base / path
            overrides = {k: val for k, val in v.items() if k != "hf_config"}
            try:
                return ModelSpec.from_hf_config(path, **overrides).model_dump()
            except SpecError as exc:
                raise ValueError(str(exc).removeprefix("model.hf_config: ")) from None
        for (
            key
        ) in v:  # a misspelt catalog/hf_config would otherwise read as an inline model missing its sizes
            near = difflib.get_close_matches(str(key), ("catalog", "hf_config"), n=1, cutoff=0.7)
            if near and key not in ModelSpec.model_fields:
                raise ValueError(f"unknown key {key!r}; did you mean {near[0]!r}?")
        return v

    @model_validator(mode="after")
    def _cross(self) -> StudySpec:
        gpu = self.cluster.gpu
        if self.workload.precision == "fp8" and gpu.fp8_tflops is None:
            raise ValueError(
                f"workload.precision is fp8 but {gpu.name} has no FP8 peak; use bf16 or set cluster.gpu.fp8_tflops"
            )
        reason = te_op_fuser_reason(self)
        if reason:
            raise ValueError(reason)
        try:
            self.pipeline.check_model(self.model)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        if self.search.max_tp is not None and self.search.max_tp > self.world:
            raise ValueError(
                f"search.max_tp={self.search.max_tp} exceeds the {self.world} GPUs of the cluster"
            )
        return self

    # --- derived -------------------------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.cluster.world

    @property
    def max_tp(self) -> int:
        return self.search.max_tp or self.cluster.gpus_per_node

    @property
    def tokens_per_step(self) -> int:
        return self.workload.seq_length * self.workload.global_batch_size

    # --- loading -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, source: str = "study", base_dir: str | Path = "."
    ) -> StudySpec:
        """Validate a study given as a dict (what the YAML file holds)."""
        if not isinstance(data, dict):
            raise SpecError(
                f"{source}: a study must be a mapping with name, model, cluster, workload sections"
            )
        try:
            return cls.model_validate(data, context={"base_dir": str(base_dir)})
        except ValidationError as exc:
            raise SpecError(format_validation_error(exc, source, cls)) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> StudySpec:
        """Load and validate a study file."""
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"study file {str(p)!r} not found; pass the path of a YAML study (see studies/)")
        try:
            data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (safe)
        except UnicodeDecodeError as exc:
            raise SpecError(
                f"{p}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); save the study file as UTF-8"
            ) from None
        except OSError as exc:
            raise SpecError(f"{p}: cannot read the study file ({exc.strerror or exc})") from None
        except _DuplicateKey as exc:
            raise SpecError(f"{p}: {exc}") from None
        except yaml.YAMLError as exc:
            raise SpecError(_yaml_error(p, exc)) from None
        return cls.from_dict(data, source=str(p), base_dir=p.parent)

    def to_dict(self) -> dict[str, Any]:
        """A plain-data form (resolved catalogs) that :meth:`from_dict` accepts again."""
        return self.model_dump(mode="json")

    def to_public_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` safe to store and share: URL passwords masked everywhere (``storage``,
        ``llm.api_base``, runner options), secret-looking ``runner.options.env`` values and any secret of the
        environment redacted (string values only; numbers and keys stay)."""
        data = self.to_dict()
        env = data["runner"]["options"].get("env")
        if isinstance(env, dict):
            data["runner"]["options"]["env"] = {k: (MASK if looks_secret(k) else v) for k, v in env.items()}
        return redact_data(data)


class _DuplicateKey(yaml.YAMLError):
    """A study file names one key twice in the same mapping (plain YAML keeps the last silently)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key repeated in one mapping: ``tp: [1, 2]`` then ``tp: [4]`` is
    a mistake to report, not a silent override."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in seen:
                raise _DuplicateKey(
                    f"line {line}: key {key!r} appears twice in the same section (first on line {seen[key]}); "
                    "keep one of them"
                )
            if isinstance(key, str | int | float | bool):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def te_op_fuser_reason(spec: StudySpec) -> str | None:
    """Why ``workload.te_op_fuser`` cannot be on for ``spec`` (None when it is off or can be): the conditions
    under which Megatron's TEGroupedMLP takes the fused grouped-MLP path
    (``megatron/core/transformer/moe/experts.py@d98e8a64``:382-456, asserted at 286-290) that a study decides."""
    if not spec.workload.te_op_fuser:
        return None
    m = spec.model
    if not m.is_moe:
        # Megatron runs a dense MLP through TEFusedMLP with the flag (gpt_layer_specs.py@d98e8a64:536-541);
        # that path is not modelled here
        return (
            "workload.te_op_fuser models the MoE experts' fused grouped MLP and this model is dense (its "
            "TEFusedMLP path is not modelled); set workload.te_op_fuser: false"
        )
    if not m.swiglu:
        # experts.py@d98e8a64:415-428: a gated SiLU / quick-GELU, or squared ReLU with
        # use_fused_weighted_squared_relu; a plain (GELU) MLP is refused and Megatron's assertion fails
        return (
            "workload.te_op_fuser needs a gated (SwiGLU) expert MLP: Megatron's fused grouped MLP supports "
            "SwiGLU / quick-GEGLU (or weighted squared ReLU), not this model's GELU MLP "
            "(experts.py@d98e8a64:415-428); set model.swiglu: true or workload.te_op_fuser: false"
        )
    if spec.cluster.gpu.vendor == "amd":
        return (
            "workload.te_op_fuser (--use-transformer-engine-op-fuser with the CuTe-DSL fused grouped MLP) is "
            "not in the Megatron-LM that Primus pins (d3528a21), which AMD GPUs run; set "
            "workload.te_op_fuser: false"
        )
    return None


_BOUNDS = {
    "greater_than": (">", "above"),
    "greater_than_equal": (">=", "of at least"),
    "less_than": ("<", "below"),
    "less_than_equal": ("<=", "of at most"),
}
"""pydantic's numeric-bound error types: the comparison and the wording of the fix"""


def _section_keys(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The keys the section at ``path`` of ``model`` accepts (names and aliases); [] where it is not a model."""
    for part in path:
        field = model.model_fields.get(str(part)) if isinstance(part, str) else None
        if field is None:
            return []
        todo, model = [field.annotation], None
        while todo and model is None:
            t = todo.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                model = t
            todo.extend(get_args(t))
        if model is None:
            return []
    return [a for n, f in model.model_fields.items() for a in (n, f.alias) if a]


def _nearest_keys(key: str, keys: list[str]) -> list[str]:
    """The accepted keys nearest a misspelt one: the closest, and a second as close to within 0.1."""
    scored = sorted(((difflib.SequenceMatcher(None, key, k).ratio(), k) for k in set(keys)), reverse=True)
    best = scored[0][0] if scored else 0.0
    return [k for r, k in scored[:2] if r >= 0.7 and r >= best - 0.1]


def format_validation_error(exc: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """One message, one line per problem, each naming the field path and what to do (for an unknown key of
    ``model``, the nearest key it accepts)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            keys = _section_keys(model, err["loc"][:-1]) if model is not None else []
            near = _nearest_keys(str(err["loc"][-1]), keys)
            hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
            msg = f"unknown key; {hint}remove it or check its spelling against the study-file reference in docs/study-file.md"
        elif err["type"] == "missing":
            msg = "required; add it"
        elif err["type"] in ("literal_error", "enum"):
            msg = f"{msg}, got {err.get('input')!r}"
        elif err["type"] in _BOUNDS:
            op, word = _BOUNDS[err["type"]]
            bound = next(iter((err.get("ctx") or {}).values()), "?")
            msg = f"must be {op} {bound}, got {err.get('input')!r}; set a value {word} {bound}"
        lines.append(f"{loc}: {msg}")
    head = f"{source}: invalid study file"
    return head + ("\n  " + "\n  ".join(lines) if len(lines) > 1 else f": {lines[0]}")
