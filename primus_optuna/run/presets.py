"""Launch presets for the command runner: ``primus``, ``megatron``, ``slurm`` and ``local``.

- ``primus``: writes a Primus experiment (``modules.pre_trainer.overrides`` with Megatron names, merged into
  the user's experiment YAML when ``experiment`` is given, a complete one otherwise) and runs the user's launch
  command with it (default ``bash examples/run_pretrain.sh`` with ``EXP={overlay}``, run in ``primus_path``;
  ``NNODES``/``NODE_RANK``/``GPUS_PER_NODE``/``MASTER_ADDR``/``MASTER_PORT`` in its environment).
- ``megatron``: ``torchrun ... pretrain_gpt.py`` with Megatron-LM arguments (mock data, NullTokenizer), one
  torchrun per host with a static rendezvous (``--node-rank``, ``--master-addr``, ``--master-port``).
- a launch is per host (``cluster.gpus_per_host`` GPUs; a GB200/GB300 node, the NVLink domain, is several): one
  torchrun per host, ``--nnodes``/``NNODES`` = the hosts, ``--nproc-per-node``/``GPUS_PER_NODE`` = a host's GPUs.
- multi-host without Slurm (``primus``, ``megatron``): ``hosts`` lists the hosts, the launch starts on each
  over ``ssh`` from a script in the trial's directory (which must be on a file system every host sees).
- ``slurm``: wraps any other preset with ``srun`` or ``sbatch --wait`` through a node script in the trial's
  directory (every argv element is ``shlex.quote``-d; the node rank ``$SLURM_NODEID`` and the rendezvous
  ``$MASTER_ADDR``/``$MASTER_PORT`` are the only expansions, computed from ``$SLURM_JOB_NODELIST``); it asks
  for one task and the GPUs of each host (``--nodes`` = hosts, ``--ntasks-per-node=1``, ``--gpus-per-node`` =
  a host's GPUs), follows the job's log while it runs and ``scancel``-s the job when the
  trial is stopped.
- ``torchtitan``: ``torchrun ... -m torchtitan.train`` with TorchTitan 0.3's arguments
  (:func:`~primus_optuna.space.torchtitan_args.titan_args`: ``--module``/``--config`` and the overrides) plus the
  run's own (``--training.steps``, ``--metrics.log_freq 1``, no checkpoint, validation or profiling), one
  torchrun per host as the megatron preset; its log is TorchTitan's ``step: ... tps: ...`` line
  (:mod:`primus_optuna.run.logparse`).
- ``local``: ``python -m primus_optuna.workloads.gpt`` through torchrun on this machine, one process per GPU
  of the study's world (``nodes × gpus_per_node``).

Every option is validated by a pydantic model; mistakes surface as :class:`SpecError` naming the option.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import SpecError
from ..space import Space, TrainingConfig
from ..space.megatron_args import (
    PRIMUS_ONLY,
    ROCM_ONLY,
    ZERO_BUBBLE,
    launch_env,
    megatron_flags,
    megatron_overrides,
    model_arguments,
    runs_turbo,
)
from ..space.torchtitan_args import titan_args, titan_target
from ..spec import AXES, StudySpec
from ..spec.primus_env import resolve_primus_env
from .base import LaunchFailure, RunContext
from .command import CommandRunner, Launch, Wrap, render

PRESETS = ("command", "primus", "megatron", "torchtitan", "local", "slurm")
OVERLAY_NAME = "primus_overlay.yaml"


# --- options -------------------------------------------------------------------------------------------------
class _Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=3600.0, gt=0, description="kill the job's process group after this")
    warmup_iters: int = Field(default=2, ge=0, description="logged iterations <= this are warm-up")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment (templates allowed)")


class CommandOptions(_Opts):
    """``runner.kind: command``."""

    argv: list[str] = Field(min_length=1, description="argv template, e.g. [bash, train.sh, --tp, '{tp}']")
    cwd: str | None = None


class NodesOptions(_Opts):
    """Where a multi-node launch runs without Slurm."""

    hosts: list[str] = Field(
        default_factory=list,
        description="one name per host (cluster.gpus_per_host GPUs each), the master first; needed for more than one",
    )
    master_port: int = Field(default=29500, gt=0, lt=65536)
    ssh: list[str] = Field(
        default_factory=lambda: ["ssh", "-tt", "-o", "BatchMode=yes"],
        description="how a node's launch is started on its host (-tt: it ends when the connection does)",
    )

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for h in v:
            if not re.match(r"^[A-Za-z0-9._-]+$", h):
                raise ValueError(f"{h!r} is not a host name")
        return v


class PrimusOptions(NodesOptions):
    """``runner.kind: primus``."""

    primus_path: str | None = Field(default=None, description="Primus checkout; the launch runs there")
    experiment: str | None = Field(default=None, description="experiment YAML the overlay is merged into")
    model: str | None = Field(
        default=None,
        description="Primus model YAML name when no experiment is given (default: the catalog's)",
    )
    launch: list[str] = Field(default_factory=lambda: ["bash", "examples/run_pretrain.sh"])
    overlay_env: str | None = Field(default="EXP", description="env var that receives the overlay path")
    train_iters: int = Field(default=10, gt=0)
    overrides: dict[str, Any] = Field(default_factory=dict, description="fixed extra Megatron overrides")


class MegatronOptions(NodesOptions):
    """``runner.kind: megatron``."""

    megatron_path: str = Field(description="Megatron-LM checkout holding pretrain_gpt.py")
    torchrun: list[str] = Field(default_factory=lambda: ["torchrun"])
    train_iters: int = Field(default=10, gt=0)
    extra_args: list[str] = Field(default_factory=list, description="literal extra arguments")


class TorchTitanOptions(NodesOptions):
    """``runner.kind: torchtitan``."""

    module: str | None = Field(
        default=None, description="TorchTitan --module (default: by the study's model)"
    )
    config: str | None = Field(
        default=None, description="its registry function (default: by model and precision)"
    )
    compile: bool | None = Field(
        default=None, description="--compile.enable (default: the registry function's)"
    )
    cwd: str | None = Field(default=None, description="where to launch (the registry's relative asset paths)")
    torchrun: list[str] = Field(default_factory=lambda: ["torchrun"])
    train_iters: int = Field(default=10, gt=0)
    extra_args: list[str] = Field(
        default_factory=list,
        description="literal extra --section.key arguments (e.g. --hf_assets_path /data/x)",
    )


class LocalOptions(_Opts):
    """``runner.kind: local``."""

    timeout_s: float = Field(default=600.0, gt=0)
    train_iters: int = Field(default=5, ge=3, description="iterations per trial (>= 3: two are warm-up)")
    threads_per_proc: int | None = Field(default=None, gt=0, description="OMP threads; default cores / procs")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0


class SlurmOptions(BaseModel):
    """``runner.kind: slurm``: ``preset`` plus that preset's options."""

    model_config = ConfigDict(extra="allow")

    preset: Literal["command", "primus", "megatron", "torchtitan", "local"]
    mode: Literal["srun", "sbatch"] = "srun"
    slurm_args: list[str] = Field(default_factory=list, description="e.g. [--partition=gpu, --account=abc]")
    master_port: int = Field(default=29500, gt=0, lt=65536)


def validate_options(model: type[BaseModel], options: dict[str, Any], kind: str) -> Any:
    """``options`` validated by ``model``; errors become one :class:`SpecError` naming each option."""
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(options)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                known = ", ".join(model.model_fields)
                msg = f"unknown option for runner kind {kind!r} (options: {known})"
            elif err["type"] == "missing":
                msg = "required; add it"
            lines.append(f"runner.options.{loc}: {msg}")
        raise SpecError("\n".join(lines)) from None


# --- Primus overlay --------------------------------------------------------------------------------------------
PRIMUS_MODELS: dict[str, str] = {
    "deepseek-v3": "deepseek_v3.yaml",
    "mixtral-8x7b": "mixtral_8x7B_v0.1.yaml",
    "mixtral-8x22b": "mixtral_8x22B_v0.1.yaml",
    "llama3.1-8b": "llama3.1_8B.yaml",
    "llama3.1-70b": "llama3.1_70B.yaml",
    "llama3.1-405b": "llama3.1_405B.yaml",
    "qwen3-235b-a22b": "qwen3_235B_A22B.yaml",
    "deepseek-v2-lite": "deepseek_v2_lite.yaml",
    "deepseek-v2": "deepseek_v2.yaml",
    "kimi-k2": "kimi_k2.yaml",
    "gpt-oss-20b": "gpt_oss_20B.yaml",
    "gpt-oss-120b": "gpt_oss_120B.yaml",
    "qwen3-30b-a3b": "qwen3_30B_A3B.yaml",
}
"""Primus's model YAML for a catalog model (``primus/configs/models/megatron/*.yaml``@fd1eeabb)."""
EXPERIMENT_HEADER: dict[str, str] = {
    "work_group": "${PRIMUS_TEAM:amd}",
    "user_name": "${PRIMUS_USER:root}",
    "exp_name": "${PRIMUS_EXP_NAME:primus-optuna}",
    "workspace": "${PRIMUS_WORKSPACE:./output}",
}
"""The top-level keys every Primus experiment has, as AMD's MI355X examples write them
(``examples/megatron/configs/MI355X/qwen3_30B_A3B-FP8-pretrain.yaml``@fd1eeabb:1-4)."""
ARCHITECTURE_KEYS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
)
"""Experiment overrides that must agree with the study's model (the estimate is of the study's model)."""


def primus_overrides(spec: StudySpec, config: TrainingConfig) -> dict[str, Any]:
    """The Megatron-named overrides Primus needs for ``config``: :func:`megatron_overrides` with the Primus
    switches, plus what the estimate assumes about the rest of a Primus run (:func:`pinned_overrides`)."""
    return {**pinned_overrides(spec, config), **megatron_overrides(spec, config, primus=True)}


def pinned_overrides(spec: StudySpec, config: TrainingConfig) -> dict[str, Any]:
    """Keys of a Primus experiment the estimate assumes, whatever the user's experiment says: no FSDP (the
    memory model is the distributed optimizer's), no ``recompute_layer_ids`` (the recompute axis is Megatron's
    granularity/method), no shared-expert overlap with DeepEP or EP overlap (Primus-Turbo's DeepEP asserts it,
    ``patches/args/rocm_arg_validation.py``@fd1eeabb:221-224), at most 32 DeepEP CUs at ep >= 16 (the same
    file, 228-233), and the per-rank ROCm memory report that the
    log parser reads as the peak (``patches/training_log/print_rank_last_patches.py``@fd1eeabb:283-316); the
    last two on AMD GPUs only (:func:`~primus_optuna.space.megatron_args.runs_turbo`: Turbo's DeepEP and
    ``rocm-smi`` are ROCm's; elsewhere a Primus run reports no peak memory)."""
    out: dict[str, Any] = {
        "use_torch_fsdp2": False,
        "use_megatron_fsdp": False,
        "use_custom_fsdp": False,
        "recompute_layer_ids": None,
    }
    if runs_turbo(spec):  # rocm-smi: AMD GPUs only
        out["use_rocm_mem_info"] = True
    if spec.model.is_moe and (config.moe_dispatcher == "deepep" or config.ep_overlap):
        out["moe_shared_expert_overlap"] = False
    if config.moe_dispatcher == "deepep" and config.ep >= 16 and runs_turbo(spec):
        # Primus-Turbo's internode DeepEP: "Set turbo_deepep_num_cu<=32 when using ep_size >= 16"
        # (rocm_arg_validation.py@fd1eeabb:228-233); AMD's DeepSeek-V3 example sets 80 for its EP 8
        out["turbo_deepep_num_cu"] = 32
    return out


def primus_overlay(
    spec: StudySpec,
    config: TrainingConfig,
    *,
    experiment: dict[str, Any] | None = None,
    model: str | None = None,
    extra: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An experiment document: ``experiment`` with the trial's overrides merged in, or (without one) a complete
    Primus experiment for the study's model (``model``: Primus's model YAML name; default from the catalog).

    The experiment's ``${NAME:default}`` values are read as Primus's loader will resolve them in ``environ``
    (the launch's environment; default this process's: :func:`~primus_optuna.spec.primus_env.resolve_primus_env`)
    and written back as they are, for Primus to resolve. Raises :class:`SpecError` naming the key when
    ``experiment`` contradicts the configuration, or is not a pretraining experiment."""
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(experiment)) if experiment else {}
    if not experiment:
        doc.update(EXPERIMENT_HEADER)
    modules = doc.setdefault("modules", {})
    _refuse_other_trainers(modules)
    trainer = modules.setdefault("pre_trainer", {})
    trainer.setdefault("framework", "megatron")
    trainer.setdefault("config", "pre_trainer.yaml")
    if "model" not in trainer:
        name = model or PRIMUS_MODELS.get(spec.model.name)
        if name is None:
            raise SpecError(
                f"runner.options.model: Primus needs a model YAML for {spec.model.name!r} (its "
                "primus/configs/models/megatron/ name, e.g. deepseek_v3.yaml); set runner.options.model, or "
                "runner.options.experiment to an experiment that names one"
            )
        trainer["model"] = name
    overrides = dict(trainer.get("overrides") or {})
    if not runs_turbo(spec):
        # what only runs on ROCm is dropped (an AMD example merged into an NVIDIA study): Primus's defaults,
        # all off, apply (primus_turbo.yaml@fd1eeabb:3-81, primus_megatron_module.yaml@fd1eeabb:46)
        overrides = {k: v for k, v in overrides.items() if k not in ROCM_ONLY}
    _refuse_contradictions(spec, resolve_primus_env(overrides, environ, where=OVERRIDES_AT))
    overrides.update(extra or {})
    overrides.update(primus_overrides(spec, config))
    # Megatron asserts max_position_embeddings >= seq_length (learned positions) and needs it set at all
    # (megatron/training/arguments.py@d3528a21:1068); AMD's examples set it with seq_length, as a template
    # (examples/megatron/configs/MI355X/qwen3_30B_A3B-FP8-pretrain.yaml@fd1eeabb:28-29): its resolved value
    # is compared, and a large enough template is left for Primus to resolve
    if _whole_number(overrides, "max_position_embeddings", environ) < spec.workload.seq_length:
        overrides["max_position_embeddings"] = spec.workload.seq_length
    trainer["overrides"] = overrides
    return doc


OVERRIDES_AT = "runner.options.experiment: modules.pre_trainer.overrides"
"""Where an experiment's override is named in an error."""


def _refuse_other_trainers(modules: dict[str, Any]) -> None:
    """An experiment without ``modules.pre_trainer`` runs something else (AMD's fine-tuning examples write
    ``post_trainer`` with ``sft_trainer.yaml``, ``examples/megatron/configs/MI355X/qwen3_30B_A3B-BF16-sft-packed
    .yaml``@fd1eeabb): the overlay would add a second trainer beside it."""
    if modules and "pre_trainer" not in modules:
        raise SpecError(
            f"runner.options.experiment: it has no modules.pre_trainer (it runs {', '.join(map(str, modules))}); "
            "primus-optuna measures pretraining steps: give a pretraining experiment (AMD's *-pretrain.yaml "
            "examples) or none"
        )


def _whole_number(overrides: dict[str, Any], key: str, environ: Mapping[str, str] | None) -> int:
    """``overrides[key]`` as Primus will read it (0 when absent or null); :class:`SpecError` when not a whole
    number."""
    value = resolve_primus_env(overrides.get(key), environ, where=f"{OVERRIDES_AT}.{key}")
    if value is None:
        return 0
    if type(value) is not int:
        raise SpecError(f"{OVERRIDES_AT}.{key}: {overrides[key]!r} is not a whole number; write one")
    return value


def _refuse_contradictions(spec: StudySpec, overrides: dict[str, Any]) -> None:
    ours = model_arguments(spec)
    for key in ARCHITECTURE_KEYS:
        if overrides.get(key) is not None and key in ours and overrides[key] != ours[key]:
            raise SpecError(
                f"runner.options.experiment: its overrides set {key}: {overrides[key]!r} but the study's model "
                f"has {ours[key]!r}; remove {key} from the experiment or change the study's model"
            )


def _primus_prepare(spec: StudySpec, opts: PrimusOptions, env: dict[str, str]) -> Any:
    """The hook writing each trial's overlay; ``env``: the launch's environment besides this process's."""
    experiment: dict[str, Any] | None = None
    if opts.experiment:
        path = Path(opts.experiment)
        if not path.is_file():
            raise SpecError(f"runner.options.experiment: {str(path)!r} not found")
        experiment = yaml.safe_load(path.read_text()) or {}
    extra = {"train_iters": opts.train_iters, "log_interval": 1, **opts.overrides}
    # refuse a missing model, a contradicting experiment or one Primus cannot load in the launch's environment
    # when the runner is built, not at the first trial
    environ = {**os.environ, **env}
    doc = primus_overlay(
        spec, Space(spec).baseline, experiment=experiment, model=opts.model, extra=extra, environ=environ
    )
    resolve_primus_env(doc, environ, where="runner.options.experiment: ")

    def prepare(config: TrainingConfig, context: RunContext, values: dict[str, str]) -> dict[str, str]:
        path = context.workdir / OVERLAY_NAME
        launch = {**os.environ, **{k: render(v, {**values, "overlay": str(path)}) for k, v in env.items()}}
        doc = primus_overlay(
            spec, config, experiment=experiment, model=opts.model, extra=extra, environ=launch
        )
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return {"overlay": str(path.resolve())}

    return prepare


SINGLE_NODE_LAUNCHES = ("run_pretrain.sh", "run_local_pretrain.sh")
"""Primus launch scripts that start one node (``examples/run_pretrain.sh``@fd1eeabb:71-75 reads the node
layout from the environment); ``run_slurm_pretrain.sh`` starts every node itself."""


def _places_nodes(opts: PrimusOptions) -> bool:
    return not any(Path(w).name in SINGLE_NODE_LAUNCHES for w in opts.launch)


def primus_env(spec: StudySpec) -> dict[str, str]:
    """The environment of a Primus launch: the node layout ``examples/run_pretrain.sh``@fd1eeabb:71-75 reads,
    in hosts: its "node" is one torchrun (``--nnodes "${NNODES}" --nproc_per_node "${GPUS_PER_NODE}"``,
    run_pretrain.sh@fd1eeabb:447-449), so ``NNODES`` is the study's hosts and ``GPUS_PER_NODE`` the GPUs of one
    (``cluster.gpus_per_host``; ``NODE_RANK``/``MASTER_*`` resolved per host, see :func:`resolve_node`) and, for
    MXFP8,
    ``NVTE_ROCM_ENABLE_MXFP8=1``, without which Primus refuses the recipe on ROCm
    (``patches/args/rocm_arg_validation.py``@fd1eeabb:175-178)."""
    env = {"NNODES": str(spec.cluster.hosts), "GPUS_PER_NODE": str(spec.cluster.host_gpus)}
    env.update(NODE_RANK=NODE_RANK, MASTER_ADDR=MASTER_ADDR, MASTER_PORT=MASTER_PORT)
    w = spec.workload
    if w.precision == "fp8" and w.fp8_recipe == "mxfp8":
        env["NVTE_ROCM_ENABLE_MXFP8"] = "1"
    return env


# --- Megatron arguments -----------------------------------------------------------------------------------------
def megatron_args(spec: StudySpec, config: TrainingConfig, train_iters: int) -> list[str]:
    """``pretrain_gpt.py`` arguments: the model from the study, the parallel layout from ``config`` (upstream
    Megatron-LM's arguments only)."""
    if config.pp_schedule in ZERO_BUBBLE:
        raise LaunchFailure(
            f"pp_schedule={config.pp_schedule} (zero bubble) is not in upstream Megatron-LM; use the primus "
            "runner or restrict search.axes.pp_schedule"
        )
    run = {
        "tokenizer_type": "NullTokenizer", "mock_data": True, "train_iters": train_iters, "log_interval": 1,
        "log_throughput": True, "eval_iters": 0, "lr": 1e-4,
    }  # fmt: skip
    values = {**model_arguments(spec), **run, **megatron_overrides(spec, config, primus=False)}
    return megatron_flags(values, skip=PRIMUS_ONLY)


def megatron_env(spec: StudySpec, config: TrainingConfig) -> dict[str, str]:
    """``CUDA_DEVICE_MAX_CONNECTIONS=1`` where Megatron-LM requires it: tp > 1 or cp > 1, unless the EP-overlap
    path (which wants more connections) is on (``megatron/training/arguments.py``@d98e8a64:1451-1479) or
    FSDP (``dp_shard`` > 1: arguments.py@d98e8a64:1048, 1166 assert it is not 1); plus the workload's own (:func:`launch_env`:
    ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`` with ``workload.te_op_fuser``)."""
    env = launch_env(spec)
    if (config.tp > 1 or config.cp > 1) and not config.ep_overlap and config.dp_shard == 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return env


def _megatron_preflight(opts: MegatronOptions, *, local: bool) -> None:
    """The checkout must hold ``pretrain_gpt.py`` (a shared file system under Slurm or ``hosts``, as for
    ``primus_path``); a launch on this host needs ``torchrun`` on ``PATH``. Otherwise every trial would fail
    to launch the same way."""
    script = Path(opts.megatron_path).expanduser() / "pretrain_gpt.py"
    if not script.is_file():
        raise SpecError(
            f"runner.options.megatron_path: {opts.megatron_path!r} has no pretrain_gpt.py; give the path of a "
            "Megatron-LM checkout"
        )
    if local and shutil.which(opts.torchrun[0]) is None:
        raise SpecError(
            f"runner.options.torchrun: {opts.torchrun[0]!r} is not on PATH; install PyTorch in this environment "
            "or give the launcher's full path (e.g. [/opt/venv/bin/torchrun])"
        )


def _megatron_wrap(spec: StudySpec, opts: MegatronOptions) -> Wrap:
    script = str(Path(opts.megatron_path) / "pretrain_gpt.py")

    def wrap(launch: Launch, values: dict[str, str], context: RunContext) -> Launch:
        # static rendezvous, one torchrun per host (torchrun's "node"): its rank and master resolved per host
        run = [*opts.torchrun, "--nnodes", values["hosts"], "--nproc-per-node", values["gpus_per_host"]]
        run += ["--node-rank", NODE_RANK, "--master-addr", MASTER_ADDR, "--master-port", MASTER_PORT]
        config = TrainingConfig.from_params({a: values[a] for a in AXES if a in values})
        argv = [*run, script, *megatron_args(spec, config, opts.train_iters), *opts.extra_args]
        env = {**megatron_env(spec, config), **launch.env}
        return Launch(argv=argv, env=env, extra_logs=launch.extra_logs)

    return wrap


# --- TorchTitan ------------------------------------------------------------------------------------------------------
TITAN_RUN_ARGS = ("--metrics.log_freq", "1", "--checkpoint.no-enable", "--validator.no-enable")
"""A measurement's own TorchTitan arguments: every step logged (``components/metrics.py@0.3.0:279, 362-363``),
no checkpoint (``components/checkpointer/base.py@0.3.0:226``) and no validation (``components/validate.py
@0.3.0:74``); ``--profiler.no-enable-profiling`` (``tools/profiler.py@0.3.0:123``) is added too."""


def torchtitan_args(spec: StudySpec, config: TrainingConfig, opts: TorchTitanOptions) -> list[str]:
    """``torchtitan.train``'s arguments: the export's (:func:`~primus_optuna.space.torchtitan_args.titan_args`)
    with the run's steps and :data:`TITAN_RUN_ARGS` and ``extra_args`` before the activation-checkpointing
    subcommand, which tyro reads last; :class:`LaunchFailure` for a configuration TorchTitan cannot run."""
    try:
        args = titan_args(spec, config)
    except SpecError as exc:
        raise LaunchFailure(str(exc)) from None
    run = ["--training.steps", str(opts.train_iters), *TITAN_RUN_ARGS, "--profiler.no-enable-profiling"]
    return [*args[:-1], *run, *opts.extra_args, args[-1]]


def _torchtitan_wrap(spec: StudySpec, opts: TorchTitanOptions) -> Wrap:
    def wrap(launch: Launch, values: dict[str, str], context: RunContext) -> Launch:
        run = [*opts.torchrun, "--nnodes", values["hosts"], "--nproc-per-node", values["gpus_per_host"]]
        run += ["--node-rank", NODE_RANK, "--master-addr", MASTER_ADDR, "--master-port", MASTER_PORT]
        config = TrainingConfig.from_params({a: values[a] for a in AXES if a in values})
        argv = [*run, "-m", "torchtitan.train", *torchtitan_args(spec, config, opts)]
        return Launch(argv=argv, env=dict(launch.env), extra_logs=launch.extra_logs)

    return wrap


def _torchtitan_preflight(spec: StudySpec, opts: TorchTitanOptions, *, local: bool) -> None:
    """The study must have a TorchTitan job (:func:`~primus_optuna.space.torchtitan_args.titan_target`: a model
    and precision TorchTitan runs, or ``module``/``config``), and a launch on this host needs ``torchrun``."""
    titan_target(spec)
    if opts.cwd and not Path(opts.cwd).expanduser().is_dir():
        raise SpecError(f"runner.options.cwd: {opts.cwd!r} is not a directory")
    if local and shutil.which(opts.torchrun[0]) is None:
        raise SpecError(
            f"runner.options.torchrun: {opts.torchrun[0]!r} is not on PATH; install PyTorch and torchtitan in this "
            "environment or give the launcher's full path (e.g. [/opt/venv/bin/torchrun])"
        )


# --- nodes ---------------------------------------------------------------------------------------------------------
NODE_RANK = "__PRIMUS_OPTUNA_NODE_RANK__"
MASTER_ADDR = "__PRIMUS_OPTUNA_MASTER_ADDR__"
MASTER_PORT = "__PRIMUS_OPTUNA_MASTER_PORT__"
"""Per-node values in a preset's argv/env, resolved by :func:`resolve_node` (no Slurm) or the Slurm node
script (``$SLURM_NODEID``, the first host of ``$SLURM_JOB_NODELIST``); never passed on as they are."""


def resolve_node(
    words: list[str], env: dict[str, str], rank: int, addr: str, port: int
) -> tuple[list[str], dict[str, str]]:
    """``words`` and ``env`` with the per-node values of node ``rank`` filled in."""
    table = {NODE_RANK: str(rank), MASTER_ADDR: addr, MASTER_PORT: str(port)}

    def sub(w: str) -> str:
        for k, v in table.items():
            w = w.replace(k, v)
        return w

    return [sub(w) for w in words], {k: sub(v) for k, v in env.items()}


def _nodes_wrap(spec: StudySpec, opts: NodesOptions, cwd: str | None, *, places_nodes: bool = False) -> Wrap:
    """Without Slurm: one host runs the launch itself; several run it once per host of ``hosts`` over ssh
    (host rank = position in the list, master = the first host), from a script in the trial's directory that
    waits for all and stops all when stopped. A host is ``cluster.gpus_per_host`` GPUs: a node of a GB200
    rack (its NVLink domain) is several. ``places_nodes``: the launch starts the other hosts itself
    (Primus's ``examples/run_slurm_pretrain.sh``@fd1eeabb:47-68 sets ``NODE_RANK``/``MASTER_ADDR`` per host
    from ``NNODES``), so without ``hosts`` it is run once, without a rank or master."""
    n_hosts = spec.cluster.hosts
    layout = _hosts_layout(spec)
    if n_hosts > 1 and opts.hosts and len(opts.hosts) != n_hosts:
        raise SpecError(
            f"runner.options.hosts: the study runs on {layout} but {len(opts.hosts)} hosts are given; "
            f"give {n_hosts} (host 0, the master, first)"
        )
    if n_hosts > 1 and not opts.hosts and not places_nodes:
        raise SpecError(
            f"runner.options.hosts: the study runs on {layout}; give their {n_hosts} host names (host 0, the "
            "master, first), or run under Slurm (runner.kind: slurm)"
        )

    def wrap(launch: Launch, values: dict[str, str], context: RunContext) -> Launch:
        if n_hosts == 1 or not opts.hosts:
            env = launch.env
            if n_hosts > 1:  # the launch places the hosts: no rank or master from us
                env = {k: v for k, v in env.items() if v not in (NODE_RANK, MASTER_ADDR)}
            argv, env = resolve_node(launch.argv, env, 0, "127.0.0.1", opts.master_port)
            return Launch(argv=argv, env=env, extra_logs=launch.extra_logs, follow_log=launch.follow_log)
        lines = [
            "#!/bin/bash",
            "# written by primus-optuna: the trial's launch on each host (runner.options.hosts)",
            "set -u",
            "pids=()",
            'stop() { kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 143; }',
            "trap stop TERM INT HUP",
        ]
        for rank, host in enumerate(opts.hosts):
            argv, env = resolve_node(launch.argv, launch.env, rank, opts.hosts[0], opts.master_port)
            remote = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
            remote = (f"cd {shlex.quote(cwd)} && " if cwd else "") + remote + "exec " + shlex.join(argv)
            lines.append(f"{shlex.join([*opts.ssh, host, remote])} &")
            lines.append("pids+=($!)")
        lines += ["rc=0", 'for p in "${pids[@]}"; do wait "$p" || rc=$?; done', 'exit "$rc"']
        script = context.workdir / "nodes.sh"
        script.write_text("\n".join(lines) + "\n")
        script.chmod(0o755)
        return Launch(argv=["bash", str(script)], env={}, extra_logs=launch.extra_logs)

    return wrap


def _hosts_layout(spec: StudySpec) -> str:
    """``8 nodes`` or, where a node spans several hosts, ``32 hosts (2 nodes of 64 GPUs, 4 GPUs per host)``."""
    c = spec.cluster
    if c.host_gpus == c.gpus_per_node:
        return f"{c.nodes} nodes"
    return f"{c.hosts} hosts ({c.nodes} nodes of {c.gpus_per_node} GPUs, {c.host_gpus} GPUs per host)"


# --- Slurm --------------------------------------------------------------------------------------------------------
def slurm_job_name(values: dict[str, str], context: RunContext) -> str:
    """A job name unique to the trial's directory, so that ``scancel --name`` cancels this job only."""
    digest = hashlib.sha1(str(context.workdir.resolve()).encode()).hexdigest()[:10]
    return f"primus-optuna-{values['trial'] or 'run'}-{digest}"


def _slurm_wrap(spec: StudySpec, opts: SlurmOptions, timeout_s: float) -> Wrap:
    """One task per host (Slurm's node: ``cluster.gpus_per_host`` GPUs), each running the inner preset's
    launch (one torchrun per host); the ``local`` preset runs the whole world on one host."""
    minutes = max(1, math.ceil(timeout_s / 60))
    c = spec.cluster
    hosts, gpus = (1, c.world) if opts.preset == "local" else (c.hosts, c.host_gpus)
    expand = {
        NODE_RANK: '"${SLURM_NODEID}"',
        MASTER_ADDR: '"${MASTER_ADDR}"',
        MASTER_PORT: '"${MASTER_PORT}"',
    }

    def word(w: str) -> str:
        return expand.get(w) or shlex.quote(w)

    def wrap(launch: Launch, values: dict[str, str], context: RunContext) -> Launch:
        exports = [f"export {k}={word(v)}" for k, v in launch.env.items()]
        node = context.workdir / "node.sh"
        node.write_text(
            "#!/bin/bash\n# written by primus-optuna: the job of one trial on one node\nset -euo pipefail\n"
            'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
            f'export MASTER_PORT="${{MASTER_PORT:-{opts.master_port}}}"\n'
            + "".join(e + "\n" for e in exports)
            + "exec "
            + " ".join(word(w) for w in launch.argv)
            + "\n"
        )
        node.chmod(0o755)
        name = slurm_job_name(values, context)
        plain = {k: v for k, v in launch.env.items() if v not in expand}  # srun's own environment
        common = [f"--nodes={hosts}", "--ntasks-per-node=1", f"--time={minutes}"]
        common += [f"--gpus-per-node={gpus}", f"--job-name={name}", *opts.slurm_args]
        cancel = ["scancel", f"--name={name}"]
        if opts.mode == "srun":
            return Launch(argv=["srun", *common, "bash", str(node)], env=plain, cancel=cancel)
        batch = context.workdir / "batch.sh"
        batch.write_text(f"#!/bin/bash\nexec srun --ntasks-per-node=1 bash {shlex.quote(str(node))}\n")
        out = context.workdir / "slurm.out"
        argv = ["sbatch", "--wait", f"--output={out}", *common, str(batch)]
        # the job writes its log to slurm.out: that is the file followed while it runs (early stopping)
        return Launch(argv=argv, env=plain, extra_logs=[out], follow_log=out, cancel=cancel)

    return wrap


# --- building runners -----------------------------------------------------------------------------------------------
def local_argv(spec: StudySpec, opts: LocalOptions) -> list[str]:
    """The ``local`` preset's argv template (torchrun + the workload; model sizes from the study)."""
    m = spec.model
    argv = [
        "{python}", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", "{world}", "-m", "primus_optuna.workloads.gpt",
        "--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
        "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads),
        "--num-query-groups", str(m.query_groups), "--vocab-size", str(m.vocab_size),
        "--seq-length", "{seq_length}", "--global-batch-size", "{global_batch_size}",
        "--micro-batch-size", "{mbs}", "--recompute", "{recompute}",
        "--tensor-model-parallel-size", "{tp}", "--pipeline-model-parallel-size", "{pp}",
        "--expert-model-parallel-size", "{ep}", "--context-parallel-size", "{cp}",
        "--train-iters", str(opts.train_iters), "--log-interval", "1", "--device", opts.device,
        "--seed", str(opts.seed), "--report-json", "{workdir}/workload_report.json",
    ]  # fmt: skip
    if m.is_moe:
        argv += ["--num-experts", str(m.experts), "--moe-router-topk", str(m.moe_router_topk)]
        argv += ["--moe-ffn-hidden-size", str(m.expert_ffn)]
    if not m.swiglu:
        argv.append("--no-swiglu")
    return argv


def build_command_runner(spec: StudySpec, kind: str, options: dict[str, Any] | None = None) -> CommandRunner:
    """A :class:`CommandRunner` for ``kind`` in :data:`PRESETS`, its options validated.

    ``repeats`` (every kind, default 1) is how many times the objective measures each configuration (the
    median counts, the spread is recorded); it is set on the runner as ``runner.repeats``."""
    options = dict(options or {})
    repeats = options.pop("repeats", 1)
    if type(repeats) is not int or repeats < 1:
        raise SpecError(f"runner.options.repeats: give a whole number >= 1 (got {repeats!r})")
    runner = _build_command_runner(spec, kind, options)
    runner.repeats = repeats
    return runner


def _build_command_runner(
    spec: StudySpec, kind: str, options: dict[str, Any], *, under_slurm: bool = False
) -> CommandRunner:
    if kind == "slurm":
        sopts: SlurmOptions = validate_options(SlurmOptions, options, kind)
        inner = {k: v for k, v in options.items() if k not in SlurmOptions.model_fields}
        for name in ("hosts", "ssh"):
            if name in inner:
                raise SpecError(
                    f"runner.options.{name}: Slurm places the nodes itself; remove {name} under runner.kind slurm"
                )
        runner = _build_command_runner(spec, sopts.preset, inner, under_slurm=True)
        runner.wrap.append(_slurm_wrap(spec, sopts, runner.timeout_s))
        runner.kind = "slurm"
        return runner
    if kind == "command":
        c: CommandOptions = validate_options(CommandOptions, options, kind)
        return CommandRunner(
            spec, c.argv, env=c.env, timeout_s=c.timeout_s, warmup_iters=c.warmup_iters, cwd=c.cwd, kind=kind
        )
    if kind == "primus":
        p: PrimusOptions = validate_options(PrimusOptions, options, kind)
        env = {**primus_env(spec), **p.env}
        if p.overlay_env:
            env[p.overlay_env] = "{overlay}"
        if p.primus_path and not Path(p.primus_path).is_dir():
            raise SpecError(f"runner.options.primus_path: {p.primus_path!r} is not a directory")
        return CommandRunner(
            spec,
            p.launch,
            env=env,
            timeout_s=p.timeout_s,
            warmup_iters=p.warmup_iters,
            cwd=p.primus_path,
            kind=kind,
            prepare=_primus_prepare(spec, p, env),
            extra_fields=("overlay",),
            wrap=[] if under_slurm else [_nodes_wrap(spec, p, p.primus_path, places_nodes=_places_nodes(p))],
        )
    if kind == "megatron":
        mo: MegatronOptions = validate_options(MegatronOptions, options, kind)
        return CommandRunner(
            spec,
            ["megatron"],  # replaced by the wrap below
            env=mo.env,
            timeout_s=mo.timeout_s,
            warmup_iters=mo.warmup_iters,
            kind=kind,
            wrap=[_megatron_wrap(spec, mo), *([] if under_slurm else [_nodes_wrap(spec, mo, None)])],
            preflight=lambda: _megatron_preflight(mo, local=not under_slurm and not mo.hosts),
        )
    if kind == "torchtitan":
        to: TorchTitanOptions = validate_options(TorchTitanOptions, options, kind)
        return CommandRunner(
            spec,
            ["torchtitan"],  # replaced by the wrap below
            env=to.env,
            timeout_s=to.timeout_s,
            warmup_iters=to.warmup_iters,
            cwd=to.cwd,
            kind=kind,
            wrap=[_torchtitan_wrap(spec, to), *([] if under_slurm else [_nodes_wrap(spec, to, to.cwd)])],
            preflight=lambda: _torchtitan_preflight(spec, to, local=not under_slurm and not to.hosts),
        )
    if kind == "local":
        lo: LocalOptions = validate_options(LocalOptions, options, kind)
        if lo.device == "cuda" and spec.world > spec.cluster.host_gpus:
            # one process per GPU of the world on this host (torchrun --standalone --nnodes 1), each on its own
            # cuda:LOCAL_RANK (workloads/gpt.py): a host holds cluster.gpus_per_host of them
            raise SpecError(
                f"runner.options.device: cuda starts the study's {spec.world} GPU processes on this host, which "
                f"holds {spec.cluster.host_gpus} (cluster.gpus_per_host); use device: cpu, or a launch preset "
                "(megatron, primus, slurm) for several hosts"
            )
        threads = lo.threads_per_proc or max(1, (os.cpu_count() or 1) // spec.world)
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **lo.env}
        return CommandRunner(
            spec,
            local_argv(spec, lo),
            env=env,
            timeout_s=lo.timeout_s,
            warmup_iters=lo.warmup_iters,
            kind=kind,
        )
    raise SpecError(f"unknown command preset {kind!r}; choose one of {', '.join(PRESETS)}")


# --- a torch module on every host of the study's cluster -----------------------------------------------------------
def module_launch(
    spec: StudySpec,
    kind: str,
    options: dict[str, Any],
    module: list[str],
    workdir: Path,
    env: dict[str, str],
    timeout_s: float,
) -> Launch:
    """``python -m MODULE ...`` (``module``: the words after ``-m``) run by torchrun on every host of the study's
    cluster through its runner's placement: Slurm (``srun``/``sbatch`` over the node script of
    :func:`_slurm_wrap`) or ``hosts`` over ssh (:func:`_nodes_wrap`), one torchrun per host of
    ``cluster.gpus_per_host`` ranks, the static rendezvous as a trial's; the megatron preset's ``torchrun``,
    else this Python's ``torch.distributed.run``. ``workdir`` (the node scripts) must be on a file system every
    host sees. :class:`SpecError` naming the option when the runner places no hosts."""
    import sys

    options = {k: v for k, v in options.items() if k != "repeats"}
    c = spec.cluster
    if kind == "slurm":
        sopts: SlurmOptions = validate_options(SlurmOptions, options, kind)
        inner = {k: v for k, v in options.items() if k not in SlurmOptions.model_fields}
        torchrun = _torchrun(sopts.preset, inner, sys.executable)
        # the probe spans the study's hosts whatever the inner preset (``local`` would run one host)
        wrap = _slurm_wrap(spec, sopts.model_copy(update={"preset": "command"}), timeout_s)
    elif kind in ("megatron", "primus", "torchtitan"):
        nopts: NodesOptions = validate_options(NodesOptions, _node_fields(options), kind)
        if not nopts.hosts or c.hosts < 2:
            raise SpecError(
                f"runner.options.hosts: the study's runner ({kind}) names no hosts to measure between (cluster: "
                f"{_hosts_layout(spec)}); list the hosts (host 0 first) and set cluster.nodes to cover them, run "
                "under Slurm (runner.kind: slurm), or measure this machine's processes with --local-ranks N"
            )
        torchrun = _torchrun(kind, options, sys.executable)
        wrap = _nodes_wrap(spec, nopts, os.getcwd())
    else:
        raise SpecError(
            f"runner.kind: {kind!r} runs on this machine; calibrate --network measures between hosts placed by "
            "runner.kind slurm, or megatron/primus with runner.options.hosts (or use --local-ranks N here)"
        )
    argv = [*torchrun, "--nnodes", str(c.hosts), "--nproc-per-node", str(c.host_gpus)]
    argv += [
        "--node-rank",
        NODE_RANK,
        "--master-addr",
        MASTER_ADDR,
        "--master-port",
        MASTER_PORT,
        "-m",
        *module,
    ]
    return wrap(Launch(argv=argv, env=env), {"trial": "netprobe"}, RunContext(spec=spec, workdir=workdir))


def _node_fields(options: dict[str, Any]) -> dict[str, Any]:
    """The placement options (:class:`NodesOptions`) of a megatron/primus runner's options."""
    return {k: v for k, v in options.items() if k in NodesOptions.model_fields}


def _torchrun(preset: str, options: dict[str, Any], python: str) -> list[str]:
    """The launcher of one host: the megatron or torchtitan preset's ``torchrun`` option, else
    ``python -m torch.distributed.run``."""
    given = options.get("torchrun") if preset in ("megatron", "torchtitan") else None
    if isinstance(given, list) and given and all(isinstance(w, str) for w in given):
        return list(given)
    return [python, "-m", "torch.distributed.run"]
