"""The search axes, one declaration each: the only place their names are listed.

Everything that enumerates axes derives from :data:`REGISTRY`: the study file's ``search.axes`` and
``search.baseline`` (:mod:`primus_optuna.spec.study`), :class:`~primus_optuna.space.config.TrainingConfig`
(fields, ``key()``, ``str()``), the space's enumeration order and default candidates, ``suggest_config``'s
distributions, the planner's candidate schema, the exports' names and the launch checks. Adding an axis is one
:class:`Axis` here plus its physics (:mod:`primus_optuna.physics`) and its rules
(:mod:`primus_optuna.space.rules`).

An ``optional`` axis (added after studies were written) is left out of a configuration's key, of the space hash
and of the planner's answer while it holds its default: studies that do not search it keep their identity.

Example::

    AXES            # ('tp', 'pp', 'ep', 'cp', 'vpp', 'mbs', 'recompute', 'moe_dispatcher', ...)
    REGISTRY["tp"].megatron   # '--tensor-model-parallel-size'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .recompute import parse_recompute

Kind = Literal["int", "choice", "bool"]


@dataclass(frozen=True, slots=True)
class Axis:
    """One search axis."""

    name: str
    kind: Kind
    default: Any
    label: str
    """report label: ``TP`` (int axes print ``TP4``), ``recompute`` (choice axes print ``recompute=full``)"""
    describe: str
    """what the axis means, for the planner and ``space``"""
    env: str
    """the ``env`` export's variable"""
    enum_rank: int
    """position in the space's depth-first enumeration (the axes that prune most come first)"""
    text_rank: int
    """position in ``str(config)``"""
    choices: tuple[Any, ...] = ()
    """allowed values of a choice or bool axis (``recompute``: the plain words; it also takes modules and N)"""
    candidates: Callable[[Any], list[Any]] | None = None
    """default candidate values from the space's facts (:class:`~primus_optuna.space.rules.Facts`); the
    first axes' rules live in :meth:`~primus_optuna.space.space.Space._default_candidates`, else the choices"""
    canonical: Callable[[Any], Any] | None = None
    """a choice value in canonical form (``selective:core_attn`` → ``selective``)"""
    megatron: str | None = None
    """Megatron-LM argument (arguments.py@d98e8a64)"""
    primus: str | None = None
    """Primus ``modules.pre_trainer.overrides`` key"""
    torchtitan: str | None = None
    """TorchTitan 0.3 ``--section.key`` override, where it has one (space/torchtitan_args.py maps the values)"""
    optional: bool = False
    """added after studies were written: in the key, hash and planner answer only when not the default"""
    planner_required: bool = False
    """the planner's answer must give it (no default in the candidate schema)"""

    def key_part(self, value: Any) -> str:
        """This axis's piece of ``TrainingConfig.key()`` (empty for an optional axis at its default)."""
        if self.optional and value == self.default:
            return ""
        if self.kind == "int":
            return f"{self.name.replace('_', '')}{value}"
        if self.kind == "bool":
            return self.name.replace("_", "") if value else ""
        return str(value)

    def text_part(self, value: Any) -> str:
        """This axis's piece of ``str(config)`` (empty for an optional axis at its default)."""
        if self.optional and value == self.default:
            return ""
        if self.kind == "int":
            return f"{self.label}{value}"
        if self.kind == "bool":
            return self.label if value else ""
        return f"{self.label}={value}"

    @property
    def python_type(self) -> type:
        return {"int": int, "bool": bool, "choice": str}[self.kind]


def _recompute(value: Any) -> str:
    return parse_recompute(value).value


AXIS_LIST: tuple[Axis, ...] = (
    Axis(
        "tp",
        "int",
        1,
        "TP",
        "tensor parallel size (divides the attention heads; within a node)",
        "PRIMUS_TP",
        enum_rank=0,
        text_rank=0,
        megatron="--tensor-model-parallel-size",
        primus="tensor_model_parallel_size",
        torchtitan="parallelism.tensor_parallel_degree",
        planner_required=True,
    ),
    Axis(
        "pp",
        "int",
        1,
        "PP",
        "pipeline parallel size (stages)",
        "PRIMUS_PP",
        enum_rank=2,
        text_rank=1,
        megatron="--pipeline-model-parallel-size",
        primus="pipeline_model_parallel_size",
        torchtitan="parallelism.pipeline_parallel_degree",
        planner_required=True,
    ),
    Axis(
        "ep",
        "int",
        1,
        "EP",
        "expert parallel size (MoE only; divides the experts)",
        "PRIMUS_EP",
        enum_rank=3,
        text_rank=3,
        megatron="--expert-model-parallel-size",
        primus="expert_model_parallel_size",
        torchtitan="parallelism.expert_parallel_degree",
    ),
    Axis(
        "cp",
        "int",
        1,
        "CP",
        "context parallel size (splits the sequence)",
        "PRIMUS_CP",
        enum_rank=1,
        text_rank=4,
        megatron="--context-parallel-size",
        primus="context_parallel_size",
        torchtitan="parallelism.context_parallel_degree",
    ),
    Axis(
        "vpp",
        "int",
        1,
        "VPP",
        "virtual pipeline stages per rank (interleaved / zbv schedules)",
        "PRIMUS_VPP",
        enum_rank=4,
        text_rank=2,
        megatron="--num-virtual-stages-per-pipeline-rank",
        primus="num_virtual_stages_per_pipeline_rank",
    ),
    Axis(
        "mbs",
        "int",
        1,
        "MBS",
        "micro-batch size (sequences per micro-batch)",
        "PRIMUS_MBS",
        enum_rank=6,
        text_rank=5,
        megatron="--micro-batch-size",
        primus="micro_batch_size",
        torchtitan="parallelism.pipeline_parallel_microbatch_size",
    ),
    Axis(
        "recompute",
        "choice",
        "none",
        "recompute",
        "activation recomputation: none, selective[:modules], full (every layer) or full:N",
        "PRIMUS_RECOMPUTE",
        enum_rank=7,
        text_rank=6,
        choices=("none", "selective", "full"),
        canonical=_recompute,
        megatron="--recompute-granularity",
        primus="recompute_granularity",
        torchtitan="activation-checkpoint",  # a subcommand: activation-checkpoint:{none,selective,full},
    ),
    Axis(
        "moe_dispatcher",
        "choice",
        "alltoall",
        "dispatcher",
        "MoE token dispatcher: alltoall or deepep",
        "PRIMUS_MOE_DISPATCHER",
        enum_rank=8,
        text_rank=7,
        choices=("alltoall", "deepep"),
        megatron="--moe-token-dispatcher-type",
        primus="moe_token_dispatcher_type",
    ),
    Axis(
        "pp_schedule",
        "choice",
        "1f1b",
        "schedule",
        "pipeline schedule: 1f1b, interleaved (vpp>1), zb1p or zbv (zero bubble, Primus)",
        "PRIMUS_PP_SCHEDULE",
        enum_rank=5,
        text_rank=8,
        choices=("1f1b", "interleaved", "zb1p", "zbv"),
        torchtitan="parallelism.pipeline_parallel_schedule",
    ),
    Axis(
        "ep_overlap",
        "bool",
        False,
        "ep_overlap",
        "overlap the MoE all-to-all with compute (Megatron's 1F1B A2A overlap; MoE only)",
        "PRIMUS_EP_OVERLAP",
        enum_rank=9,
        text_rank=9,
        choices=(False, True),
        megatron="--overlap-moe-expert-parallel-comm",
        primus="overlap_moe_expert_parallel_comm",
    ),
    Axis(
        "dp_shard",
        "int",
        1,
        "FSDP",
        "ranks of the data-parallel group that shard parameters, gradients and optimizer state (FSDP2 / "
        "Megatron-FSDP, ZeRO-3; dp_replicate = dp / dp_shard replicas: HSDP); 1 = the distributed optimizer "
        "(ZeRO-1: optimizer state sharded over dp, parameters and gradients replicated)",
        "PRIMUS_DP_SHARD",
        enum_rank=10,
        text_rank=10,
        candidates=lambda facts: [1],
        # Megatron-LM / Primus take no sharding degree: --use-megatron-fsdp with dp / dp_shard distributed-
        # optimizer instances (space.megatron_args.fsdp_overrides)
        torchtitan="parallelism.data_parallel_shard_degree",
        optional=True,
    ),
)
"""Every axis, in the order of the configuration's fields (Optuna parameters are suggested in this order)."""

REGISTRY: dict[str, Axis] = {a.name: a for a in AXIS_LIST}
AXES: tuple[str, ...] = tuple(REGISTRY)
INT_AXES: tuple[str, ...] = tuple(a.name for a in AXIS_LIST if a.kind == "int")
BOOL_AXES: tuple[str, ...] = tuple(a.name for a in AXIS_LIST if a.kind == "bool")
CHOICES: dict[str, tuple[Any, ...]] = {a.name: a.choices for a in AXIS_LIST if a.kind != "int"}
DEFAULTS: dict[str, Any] = {a.name: a.default for a in AXIS_LIST}
ENUM_ORDER: tuple[str, ...] = tuple(a.name for a in sorted(AXIS_LIST, key=lambda a: a.enum_rank))
"""the space's enumeration order (the axes that prune most come first)"""
TEXT_ORDER: tuple[str, ...] = tuple(a.name for a in sorted(AXIS_LIST, key=lambda a: a.text_rank))
OPTIONAL_AXES: tuple[str, ...] = tuple(a.name for a in AXIS_LIST if a.optional)


def unused_optional(axis: str, values: Any) -> bool:
    """Whether ``axis`` is optional and ``values`` (one value, or the candidate list) is only its default: a study
    that does not search it (left out of the space hash and the planner's answer)."""
    a = REGISTRY[axis]
    return a.optional and (values == a.default or values == [a.default] or values == (a.default,))


def without_unused_optional(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (axis → value or candidates) without the optional axes a study does not search."""
    return {k: v for k, v in values.items() if k not in REGISTRY or not unused_optional(k, v)}
