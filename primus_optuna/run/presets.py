"""Launch presets for the command runner: ``primus``, ``megatron``, ``slurm`` and ``local``.

- ``primus``: writes a Primus experiment overlay (``modules.pre_trainer.overrides`` with Megatron names,
  merged into the user's experiment YAML when ``experiment`` is given) and runs the user's launch command with
  it (default ``bash examples/run_pretrain.sh`` with ``EXP={overlay}``, run in ``primus_path``).
- ``megatron``: ``torchrun ... pretrain_gpt.py`` with Megatron-LM arguments (mock data, NullTokenizer).
- ``slurm``: wraps any other preset with ``srun`` or ``sbatch --wait`` through a node script in the trial's
  directory (the only place a shell runs: every argv element is ``shlex.quote``-d; the rendezvous address
  ``$MASTER_ADDR:$MASTER_PORT`` is the one expansion, computed from ``$SLURM_JOB_NODELIST``).
- ``local``: ``python -m primus_optuna.workloads.gpt`` through torchrun on this machine, one process per GPU
  of the study's world (``nodes × gpus_per_node``).

Every option is validated by a pydantic model; mistakes surface as :class:`SpecError` naming the option.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import SpecError
from ..space import TrainingConfig
from ..space.megatron_args import megatron_overrides
from ..spec import AXES, StudySpec
from .base import LaunchFailure, RunContext
from .command import CommandRunner, Launch, Wrap

PRESETS = ("command", "primus", "megatron", "local", "slurm")
RDZV_SENTINEL = "__PRIMUS_OPTUNA_RDZV__"
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


class PrimusOptions(_Opts):
    """``runner.kind: primus``."""

    primus_path: str | None = Field(default=None, description="Primus checkout; the launch runs there")
    experiment: str | None = Field(default=None, description="experiment YAML the overlay is merged into")
    model: str | None = Field(default=None, description="Primus model YAML name when no experiment is given")
    launch: list[str] = Field(default_factory=lambda: ["bash", "examples/run_pretrain.sh"])
    overlay_env: str | None = Field(default="EXP", description="env var that receives the overlay path")
    train_iters: int = Field(default=10, gt=0)
    overrides: dict[str, Any] = Field(default_factory=dict, description="fixed extra Megatron overrides")


class MegatronOptions(_Opts):
    """``runner.kind: megatron``."""

    megatron_path: str = Field(description="Megatron-LM checkout holding pretrain_gpt.py")
    torchrun: list[str] = Field(default_factory=lambda: ["torchrun"])
    rdzv_endpoint: str | None = Field(default=None, description="host:port for multi-node rendezvous")
    train_iters: int = Field(default=10, gt=0)
    extra_args: list[str] = Field(default_factory=list, description="literal extra arguments")

    @field_validator("rdzv_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z0-9.-]+:[0-9]+$", v):
            raise ValueError("rdzv_endpoint must be host:port")
        return v


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

    preset: Literal["command", "primus", "megatron", "local"]
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
def primus_overrides(spec: StudySpec, config: TrainingConfig) -> dict[str, Any]:
    """The Megatron-named overrides Primus needs for ``config`` (validated, canonical).

    One mapping serves the exporter and the runners: :func:`primus_optuna.space.megatron_args.megatron_overrides`.
    """
    return megatron_overrides(spec, config)


def primus_overlay(
    spec: StudySpec,
    config: TrainingConfig,
    *,
    experiment: dict[str, Any] | None = None,
    model: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An experiment document: ``experiment`` (or a minimal one) with the trial's overrides merged in."""
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(experiment)) if experiment else {}
    modules = doc.setdefault("modules", {})
    trainer = modules.setdefault("pre_trainer", {})
    trainer.setdefault("framework", "megatron")
    trainer.setdefault("config", "pre_trainer.yaml")
    if model and "model" not in trainer:
        trainer["model"] = model
    overrides = trainer.get("overrides") or {}
    overrides.update(extra or {})
    overrides.update(primus_overrides(spec, config))
    trainer["overrides"] = overrides
    return doc


def _primus_prepare(spec: StudySpec, opts: PrimusOptions) -> Any:
    experiment: dict[str, Any] | None = None
    if opts.experiment:
        path = Path(opts.experiment)
        if not path.is_file():
            raise SpecError(f"runner.options.experiment: {str(path)!r} not found")
        experiment = yaml.safe_load(path.read_text()) or {}
    extra = {"train_iters": opts.train_iters, "log_interval": 1, **opts.overrides}

    def prepare(config: TrainingConfig, context: RunContext, values: dict[str, str]) -> dict[str, str]:
        doc = primus_overlay(spec, config, experiment=experiment, model=opts.model, extra=extra)
        path = context.workdir / OVERLAY_NAME
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return {"overlay": str(path.resolve())}

    return prepare


# --- Megatron arguments -----------------------------------------------------------------------------------------
PRIMUS_ONLY = (
    "use_turbo_deepep",
    "turbo_sync_free_moe_stage",
    "enable_primus_turbo",
    "patch_zero_bubble",
    "enable_zero_bubble",
    "zero_bubble_v_schedule",
    "zero_bubble_v_schedule_mem_setup",
)
"""Primus switches upstream Megatron-LM does not know (its argument parser would refuse them)."""


def megatron_args(spec: StudySpec, config: TrainingConfig, train_iters: int) -> list[str]:
    """``pretrain_gpt.py`` arguments: the model from the study, the parallel layout from ``config``."""
    if config.pp_schedule in ("zb1p", "zbv"):
        raise LaunchFailure(
            f"pp_schedule={config.pp_schedule} (zero bubble) is not in upstream Megatron-LM; use the primus "
            "runner or restrict search.axes.pp_schedule"
        )
    m, w = spec.model, spec.workload
    a = [
        "--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
        "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads),
        "--kv-channels", str(m.head_dim), "--max-position-embeddings", str(w.seq_length),
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(m.vocab_size), "--mock-data",
        "--normalization", m.normalization, "--position-embedding-type", m.position_embedding_type,
        "--train-iters", str(train_iters), "--log-interval", "1", "--log-throughput", "--eval-iters", "0",
        "--lr", "1e-4", "--disable-bias-linear",
    ]  # fmt: skip
    if m.query_groups != m.num_attention_heads:
        a += ["--group-query-attention", "--num-query-groups", str(m.query_groups)]
    if m.swiglu:
        a.append("--swiglu")
    if m.untie_embeddings_and_output_weights:
        a.append("--untie-embeddings-and-output-weights")
    if m.is_moe:
        a += ["--num-experts", str(m.experts), "--moe-router-topk", str(m.moe_router_topk)]
        a += ["--moe-ffn-hidden-size", str(m.expert_ffn), "--moe-grouped-gemm"]
    for name, value in primus_overrides(spec, config).items():
        if name in PRIMUS_ONLY or value is None or value is False:
            continue
        flag = "--" + ("fp8_format" if name == "fp8" else name).replace("_", "-")
        if isinstance(value, list):  # nargs="*" (``--recompute-modules moe_act layernorm``)
            a += [flag, *(str(v) for v in value)]
        else:
            a += [flag] if value is True else [flag, str(value)]
    return a


def _megatron_wrap(spec: StudySpec, opts: MegatronOptions) -> Wrap:
    script = str(Path(opts.megatron_path) / "pretrain_gpt.py")

    def wrap(launch: Launch, values: dict[str, str], context: RunContext) -> Launch:
        run = [*opts.torchrun, "--nnodes", values["nodes"], "--nproc-per-node", values["gpus_per_node"]]
        if spec.cluster.nodes > 1:
            run += ["--rdzv-backend", "c10d", "--rdzv-endpoint", opts.rdzv_endpoint or RDZV_SENTINEL]
        config = TrainingConfig.from_params({a: values[a] for a in AXES})
        argv = [*run, script, *megatron_args(spec, config, opts.train_iters), *opts.extra_args]
        return Launch(argv=argv, env=launch.env, extra_logs=launch.extra_logs)

    return wrap


# --- Slurm --------------------------------------------------------------------------------------------------------
def _slurm_wrap(spec: StudySpec, opts: SlurmOptions, timeout_s: float) -> Wrap:
    minutes = max(1, math.ceil(timeout_s / 60))

    def wrap(launch: Launch, values: dict[str, str], context: RunContext) -> Launch:
        words = [
            '"${MASTER_ADDR}:${MASTER_PORT}"' if w == RDZV_SENTINEL else shlex.quote(w) for w in launch.argv
        ]
        exports = [f"export {k}={shlex.quote(v)}" for k, v in launch.env.items()]
        node = context.workdir / "node.sh"
        node.write_text(
            "#!/bin/bash\n# written by primus-optuna: the job of one trial on one node\nset -euo pipefail\n"
            'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
            f'export MASTER_PORT="${{MASTER_PORT:-{opts.master_port}}}"\n'
            + "".join(e + "\n" for e in exports)
            + "exec "
            + " ".join(words)
            + "\n"
        )
        node.chmod(0o755)
        common = [f"--nodes={spec.cluster.nodes}", "--ntasks-per-node=1", f"--time={minutes}"]
        common += [f"--job-name=primus-optuna-{values['trial'] or 'run'}", *opts.slurm_args]
        if opts.mode == "srun":
            return Launch(argv=["srun", *common, "bash", str(node)], env=launch.env)
        batch = context.workdir / "batch.sh"
        batch.write_text(f"#!/bin/bash\nexec srun --ntasks-per-node=1 bash {shlex.quote(str(node))}\n")
        out = context.workdir / "slurm.out"
        argv = ["sbatch", "--wait", f"--output={out}", *common, str(batch)]
        return Launch(argv=argv, env=launch.env, extra_logs=[out])

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
    """A :class:`CommandRunner` for ``kind`` in :data:`PRESETS`, its options validated."""
    options = dict(options or {})
    if kind == "slurm":
        sopts: SlurmOptions = validate_options(SlurmOptions, options, kind)
        inner = {k: v for k, v in options.items() if k not in SlurmOptions.model_fields}
        runner = build_command_runner(spec, sopts.preset, inner)
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
        env = dict(p.env)
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
            prepare=_primus_prepare(spec, p),
            extra_fields=("overlay",),
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
            wrap=[_megatron_wrap(spec, mo)],
        )
    if kind == "local":
        lo: LocalOptions = validate_options(LocalOptions, options, kind)
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
