"""TorchTitan 0.3 command-line arguments of a configuration, both ways.

TorchTitan 0.3 (``torchtitan==0.3.0`` on PyPI; cited as ``path@0.3.0:line`` of that wheel) takes a job as
``--module <model> --config <registry function>`` plus ``--section.key value`` overrides, which its
``ConfigManager`` parses with tyro over the registry function's ``Trainer.Config``
(``torchtitan/config/manager.py@0.3.0:34-46, 48-159``). It reads no TOML file: ``--job.config_file`` is gone
(no ``config_file`` in the wheel's ``torchtitan/config``), so there is no TOML form.

What maps (:func:`titan_args`):

- ``tp``, ``pp``, ``cp``, ``ep`` → ``parallelism.tensor_parallel_degree`` / ``pipeline_parallel_degree`` /
  ``context_parallel_degree`` / ``expert_parallel_degree`` (``torchtitan/config/configs.py@0.3.0:157, 174,
  232, 279``); ``dp_shard`` → ``data_parallel_shard_degree`` and ``dp / dp_shard`` →
  ``data_parallel_replicate_degree`` (configs.py@0.3.0:113-134: both > 1 is HSDP);
- the batch: ``training.global_batch_size`` = the workload's; without pipelining ``training.local_batch_size`` =
  ``mbs`` and TorchTitan accumulates ``global / (mbs · dp)`` micro-batches (``torchtitan/trainer.py@0.3.0:
  415-433``); with pipelining one step's micro-batches go through one pipeline flush, as Megatron's do:
  ``local_batch_size`` = ``global / dp`` split into ``pipeline_parallel_microbatch_size`` = ``mbs``
  (``torchtitan/distributed/pipeline_parallel.py@0.3.0:303-311``); ``training.seq_len`` = the workload's;
- ``pp_schedule`` → ``parallelism.pipeline_parallel_schedule`` (:data:`SCHEDULES`, torch's
  ``get_schedule_class`` names, ``torch/distributed/pipelining/schedules.py`` of torch 2.13:3628-3636);
  ``vpp`` → the stages per rank: TorchTitan derives ``ceil(layers / pipeline_parallel_layers_per_stage)``
  stages with the first/last-stage weights (pipeline_parallel.py@0.3.0:218-263), so the export sets
  ``layers / (pp · vpp)`` layers per stage and both weights to 0: the even split the estimate prices;
- ``recompute`` → the ``activation-checkpoint:{none,selective,full}`` subcommand (a tyro subcommand, last on
  the line: ``torchtitan/distributed/activation_checkpoint.py@0.3.0:332-337``);
- precision: bf16 is TorchTitan's mixed precision (``training.mixed_precision_param bfloat16``,
  configs.py@0.3.0:85); float8/MXFP8 are model converters chosen by the registry function (its ``model_spec``
  is off the command line, ``torchtitan/trainer.py@0.3.0:77``), so the workload's precision picks the
  function (:data:`TITAN_MODELS`);
- compile: ``--compile.enable`` / ``--no-compile.enable`` when ``runner.options.compile`` says (configs.py
  @0.3.0:292), else the registry function's setting.

What does not map (a :class:`SpecError` naming the fix, and rules in :mod:`primus_optuna.space.rules` for a
study whose runner is TorchTitan): ``zb1p`` (torch has no single-stage zero-bubble schedule),
``recompute=full:N`` (TorchTitan wraps every block, activation_checkpoint.py@0.3.0:152-163) and
``selective:<modules>`` (its selective AC is per-op and takes no module list, :185-287), ``moe_dispatcher=deepep``
and ``ep_overlap`` (the token dispatcher is the registry function's model), fp16 (configs.py@0.3.0:85), FP8
recipes other than MXFP8 (TorchTitan's float8 recipes are rowwise, ``components/quantization/float8.py@0.3.0:58``)
and a ``pipeline.layout`` or uneven first/last split. ``selective`` maps with a caveat: TorchTitan's per-op SAC
is not Megatron's core-attention recompute the estimate prices (:data:`CAVEATS`).

Example::

    titan_args(spec, config)
    # ['--module', 'llama3', '--config', 'llama3_70b', '--parallelism.data_parallel_shard_degree', '8', ...,
    #  'activation-checkpoint:full']
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..spec import StudySpec
from ..spec.axes import AXIS_LIST, REGISTRY
from ..spec.recompute import parse_recompute
from .config import TrainingConfig

TITAN_VERSION = "0.3.0"

DEGREE_AXES: tuple[str, ...] = tuple(
    a.name for a in AXIS_LIST if a.kind == "int" and (a.torchtitan or "").endswith("_degree")
)
"""The axes that are a TorchTitan parallel degree (``Axis.torchtitan``: ``parallelism.*_degree``)."""

SCHEDULES: dict[str, str] = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zbv": "ZBVZeroBubble"}
"""``pp_schedule`` → torch's schedule name (``get_schedule_class``, torch 2.13 schedules.py:3628-3636): 1F1B and
Interleaved1F1B are Megatron's 1F1B and interleaved 1F1B; ZBVZeroBubble is the V-shaped zero-bubble schedule of
two stages per rank (TorchTitan places "v" stages for it, pipeline_parallel.py@0.3.0:559-572). There is no
single-stage zero-bubble schedule (``zb1p``): InterleavedZeroBubble is looped over several stages per rank."""

AC_MODES: tuple[str, ...] = ("none", "selective", "full")
"""TorchTitan's activation-checkpointing subcommands that a recompute value maps to (the fourth,
``memory-budget``, is the compiler's partitioner: no axis value)."""

TITAN_MODELS: dict[str, tuple[str, dict[str, str]]] = {
    "llama3.1-8b": ("llama3", {"bf16": "llama3_8b", "mxfp8": "llama3_8b_mxfp8"}),
    "llama3.1-70b": ("llama3", {"bf16": "llama3_70b"}),
    "qwen3-30b-a3b": ("qwen3", {"bf16": "qwen3_30b_a3b"}),
    "deepseek-v2-lite": ("deepseek_v3", {"bf16": "deepseek_v3_16b"}),
    "deepseek-v3": ("deepseek_v3", {"bf16": "deepseek_v3_671b"}),
    "gpt-oss-20b": ("gpt_oss", {"bf16": "gpt_oss_20b"}),
    "gpt-oss-120b": ("gpt_oss", {"bf16": "gpt_oss_120b"}),
}
"""Catalog model → (TorchTitan module, registry function by precision): ``models/llama3/config_registry.py
@0.3.0:184`` (llama3_8b), 242 (llama3_8b_mxfp8: MXFP8 linears), 257 (llama3_70b);
``models/qwen3/config_registry.py@0.3.0:295``; ``models/deepseek_v3/config_registry.py@0.3.0:138`` (the 16B
flavour: DeepSeek-V2-Lite's 27 layers, width 2048, vocabulary 102400), 206; ``models/gpt_oss/config_registry.py
@0.3.0:70, 101``. The CI check (tests/titan) builds each and compares its layers, width and vocabulary with the
catalog's. The other FP8 functions are rowwise float8 (deepseek_v3_671b_float8, llama3_405b), a recipe the
workload cannot name."""

CAVEATS: dict[str, str] = {
    "selective": "recompute=selective maps to TorchTitan's per-op selective AC (it keeps matmul and collective "
    "outputs, recomputes the rest: activation_checkpoint.py@0.3.0:185-287), not Megatron's core-attention "
    "recompute the estimate priced",
}


@dataclass(frozen=True)
class TitanTarget:
    """The TorchTitan job a study's configurations are exported into: ``--module``/``--config`` and compile."""

    module: str
    config: str
    compile: bool | None = None
    """``--compile.enable`` (True/False) or the registry function's setting (None)"""


def titan_target(spec: StudySpec) -> TitanTarget:
    """The study's TorchTitan job: ``runner.options`` ``module``/``config``/``compile`` of a torchtitan runner
    (also under Slurm), else :data:`TITAN_MODELS` by model and precision; :class:`SpecError` when neither names
    one or the workload has no TorchTitan form."""
    opts = titan_options(spec)
    module, config = opts.get("module"), opts.get("config")
    w = spec.workload
    if w.precision == "fp16":
        raise SpecError(
            "workload.precision: fp16 has no TorchTitan form (training.mixed_precision_param is bfloat16 or "
            "float32, torchtitan/config/configs.py@0.3.0:85); use bf16"
        )
    key = "bf16" if w.precision == "bf16" else "mxfp8" if w.fp8_recipe == "mxfp8" else None
    if module is None or config is None:
        if key is None:
            raise SpecError(
                f"workload.fp8_recipe: {w.fp8_recipe} has no TorchTitan form (its float8 recipes are rowwise, "
                "components/quantization/float8.py@0.3.0:58, chosen by the registry function); use fp8_recipe "
                "mxfp8, precision bf16, or name a registry function in runner.options.module/config"
            )
        module_fns = TITAN_MODELS.get(spec.model.name)
        fn = module_fns[1].get(key) if module_fns else None
        if module_fns is None or fn is None:
            have = ", ".join(f"{m} ({'/'.join(f)})" for m, (_, f) in TITAN_MODELS.items())
            raise SpecError(
                f"model {spec.model.name!r} with {key}: TorchTitan 0.3 has no registry function for it (known: "
                f"{have}); set runner.kind: torchtitan with runner.options.module and runner.options.config to "
                "your own (a fully qualified module path works, torchtitan/config/manager.py@0.3.0:125-141)"
            )
        module, config = module or module_fns[0], config or fn
    compile_ = opts.get("compile")
    return TitanTarget(str(module), str(config), None if compile_ is None else bool(compile_))


def titan_options(spec: StudySpec) -> dict[str, Any]:
    """The runner options of a study whose runner launches TorchTitan (``runner.kind: torchtitan``, or Slurm's
    torchtitan preset); empty otherwise."""
    return dict(spec.runner.options) if uses_torchtitan(spec) else {}


def uses_torchtitan(spec: StudySpec) -> bool:
    """The study's runner launches TorchTitan: its rules (:mod:`primus_optuna.space.rules`) apply."""
    r = spec.runner
    return r.kind == "torchtitan" or (r.kind == "slurm" and r.options.get("preset") == "torchtitan")


def schedule_reason(pp_schedule: str) -> str | None:
    """Why a pipeline schedule has no TorchTitan form (None when it has one)."""
    if pp_schedule in SCHEDULES:
        return None
    return (
        f"pp_schedule={pp_schedule}: torch.distributed.pipelining has no single-stage zero-bubble schedule "
        "(get_schedule_class, torch 2.13 schedules.py:3628-3636; TorchTitan picks by that name, "
        "pipeline_parallel.py@0.3.0:205); use 1f1b, interleaved or zbv"
    )


def recompute_reason(recompute: str) -> str | None:
    """Why a recompute value has no TorchTitan activation-checkpointing mode (None when it has one)."""
    r = parse_recompute(recompute)
    if r.num_layers:
        return (
            f"recompute={recompute}: TorchTitan checkpoints every transformer block or none "
            "(activation_checkpoint.py@0.3.0:152-163); use full or none"
        )
    if r.granularity == "selective" and r.value != "selective":
        return (
            f"recompute={recompute}: TorchTitan's selective AC is per-op and takes no module list "
            "(activation_checkpoint.py@0.3.0:185-287); use selective, full or none"
        )
    return None


def dispatcher_reason(moe_dispatcher: str, ep_overlap: bool) -> str | None:
    """Why a token dispatcher or EP overlap has no TorchTitan argument (None when it needs none)."""
    if moe_dispatcher != "alltoall":
        return (
            f"moe_dispatcher={moe_dispatcher}: TorchTitan's token dispatcher is part of the registry function's "
            "model, off the command line (torchtitan/trainer.py@0.3.0:77); use alltoall"
        )
    if ep_overlap:
        return (
            "ep_overlap: Megatron's 1F1B all-to-all overlap has no TorchTitan argument; use ep_overlap false"
        )
    return None


PIPELINE_REASON = (
    "pipeline: a layout or first/last-stage split has no TorchTitan form here (its stages come from "
    "pipeline_parallel_layers_per_stage, pipeline_parallel.py@0.3.0:218-263); use the even split"
)


def titan_refusal(spec: StudySpec, config: TrainingConfig) -> str | None:
    """Why ``config`` has no TorchTitan form (None when it has one)."""
    if config.pp > 1 and not spec.pipeline.is_default:
        return PIPELINE_REASON
    return (
        (schedule_reason(config.pp_schedule) if config.pp > 1 else None)
        or recompute_reason(config.recompute)
        or dispatcher_reason(config.moe_dispatcher, config.ep_overlap)
    )


def titan_values(spec: StudySpec, config: TrainingConfig, compile_: bool | None = None) -> dict[str, Any]:
    """The ``--section.key`` overrides of ``config`` (dotted name → value) plus ``activation_checkpoint``
    (the subcommand's mode); ``compile_``: ``compile.enable`` (None: left out); :class:`SpecError` when it has
    no TorchTitan form."""
    reason = titan_refusal(spec, config)
    if reason:
        raise SpecError(f"--format torchtitan: {reason}")
    c = config.derive(spec.world, spec.workload.global_batch_size)
    gbs = spec.workload.global_batch_size
    local = gbs // c.dp if c.pp > 1 else c.mbs
    values: dict[str, Any] = {"parallelism.data_parallel_replicate_degree": c.dp // c.dp_shard}
    values.update({REGISTRY[a].torchtitan: getattr(c, a) for a in DEGREE_AXES})
    values |= {
        "training.local_batch_size": local,
        "training.global_batch_size": gbs,
        "training.seq_len": spec.workload.seq_length,
        "training.mixed_precision_param": "bfloat16",
    }
    if c.pp > 1:
        values["parallelism.pipeline_parallel_schedule"] = SCHEDULES[c.pp_schedule]
        values["parallelism.pipeline_parallel_microbatch_size"] = c.mbs
        values["parallelism.pipeline_parallel_layers_per_stage"] = spec.model.num_layers // (c.pp * c.vpp)
        values["parallelism.pipeline_parallel_first_stage_less_layers"] = 0
        values["parallelism.pipeline_parallel_last_stage_less_layers"] = 0
    if c.tp > 1 and not spec.workload.sequence_parallel:  # on by default (configs.py@0.3.0:160)
        values["parallelism.enable_sequence_parallel"] = False
    if c.pp > 1 or c.ep > 1:
        # CUDA graphs refuse pipelining and the default EP dispatchers (trainer.py@0.3.0:179-210)
        values["training.disable_cuda_graphs"] = True
    if compile_ is not None:
        values["compile.enable"] = compile_
    values["activation_checkpoint"] = parse_recompute(c.recompute).granularity
    return values


def titan_args(spec: StudySpec, config: TrainingConfig) -> list[str]:
    """TorchTitan 0.3's argv for ``config``: ``--module``/``--config``, the overrides (booleans as tyro's
    ``--x``/``--no-x`` flags) and the activation-checkpointing subcommand last (tyro reads no option after a
    subcommand)."""
    target = titan_target(spec)
    values = titan_values(spec, config, target.compile)
    argv = ["--module", target.module, "--config", target.config]
    for key, value in values.items():
        if key == "activation_checkpoint":
            continue
        if isinstance(value, bool):
            section, name = key.rsplit(".", 1)
            argv.append(f"--{key}" if value else f"--{section}.no-{name}")
        else:
            argv += [f"--{key}", str(value)]
    argv.append(f"activation-checkpoint:{values['activation_checkpoint']}")
    return argv


def titan_caveats(spec: StudySpec, config: TrainingConfig, target: TitanTarget | None = None) -> list[str]:
    """What the export maps but TorchTitan runs differently from what the estimate priced (``target``: the
    TorchTitan 0.3 job, whose compile setting is named)."""
    out = [CAVEATS[v] for v in (parse_recompute(config.recompute).value,) if v in CAVEATS]
    c = config.derive(spec.world, spec.workload.global_batch_size)
    if c.dp_shard == 1 and c.dp > 1:
        out.append(
            f"dp_shard=1: TorchTitan runs DDP over dp={c.dp} (parameters, gradients and optimizer state "
            "replicated, torchtitan/config/configs.py@0.3.0:113-122), not the distributed optimizer (ZeRO-1) the "
            "estimate priced; search dp_shard for FSDP/HSDP"
        )
    if target is not None and target.compile is None:
        out.append("compile: the registry function's setting (runner.options.compile sets it)")
    return out


def parse_titan_args(argv: list[str], spec: StudySpec | None = None) -> TrainingConfig:
    """The configuration a TorchTitan argv (:func:`titan_args`) describes (``vpp`` from the layers per stage,
    which needs ``spec``; without it, 2 for a multi-stage schedule as TorchTitan's default)."""
    values: dict[str, Any] = {}
    ac = "selective"  # Trainer.Config's default (trainer.py@0.3.0:108-110)
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("activation-checkpoint:"):
            ac = tok.split(":", 1)[1]
        elif tok.startswith("--") and "=" in tok:
            k, v = tok[2:].split("=", 1)
            values[k] = v
        elif tok.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or nxt.startswith("--") or nxt.startswith("activation-checkpoint:"):
                section, _, name = tok[2:].rpartition(".")
                values[f"{section}.{name.removeprefix('no-')}"] = not name.startswith("no-")
            else:
                values[tok[2:]] = nxt
                i += 1
        i += 1
    return config_from_titan(values, ac, spec)


def config_from_titan(values: dict[str, Any], ac: str, spec: StudySpec | None = None) -> TrainingConfig:
    """The configuration of TorchTitan's ``section.key`` values (dotted names) and activation-checkpointing
    mode: the inverse of :func:`titan_values`."""
    if ac not in AC_MODES:
        raise SpecError(
            f"torchtitan arguments: activation-checkpoint:{ac} is not one of {', '.join(AC_MODES)}"
        )

    def num(key: str, default: int = 1) -> int:
        return int(values.get(f"parallelism.{key}", default))

    pp = num("pipeline_parallel_degree")
    names = {v: k for k, v in SCHEDULES.items()}
    schedule = names.get(values.get("parallelism.pipeline_parallel_schedule", "1F1B"))
    if schedule is None:
        raise SpecError(
            f"torchtitan arguments: schedule {values['parallelism.pipeline_parallel_schedule']!r} is not one of "
            f"{', '.join(names)}"
        )
    vpp = 1
    if pp > 1 and schedule != "1f1b":
        per_stage = values.get("parallelism.pipeline_parallel_layers_per_stage")
        vpp = spec.model.num_layers // (pp * int(per_stage)) if spec and per_stage else 2
    mbs = num("pipeline_parallel_microbatch_size") if pp > 1 else int(values["training.local_batch_size"])
    params: dict[str, Any] = {a: num(REGISTRY[a].torchtitan.split(".", 1)[1]) for a in DEGREE_AXES}
    params["vpp"], params["mbs"], params["recompute"] = vpp, mbs, ac
    params["pp_schedule"] = schedule if pp > 1 else "1f1b"
    config = TrainingConfig.from_params(params)
    return config.derive(spec.world, spec.workload.global_batch_size) if spec is not None else config


def to_titan_text(spec: StudySpec, config: TrainingConfig, header: str = "") -> str:
    """:func:`titan_args` as a ``torchrun ... -m torchtitan.train`` continuation block, one option per line,
    preceded by comment lines (``header`` and the caveats)."""
    args = titan_args(spec, config)
    notes = [*([header] if header else []), *titan_caveats(spec, config, titan_target(spec))]
    notes.append(
        f"TorchTitan {TITAN_VERSION}: torchrun --nproc-per-node N -m torchtitan.train <these arguments>"
    )
    lines: list[str] = []
    i = 0
    while i < len(args):
        if (
            args[i].startswith("--")
            and i + 1 < len(args)
            and not args[i + 1].startswith(("--", "activation-"))
        ):
            lines.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(args[i])
            i += 1
    head = "".join(f"# {n}\n" for note in notes for n in note.splitlines())
    return head + " \\\n".join(lines) + "\n"


def parse_titan_text(text: str, spec: StudySpec | None = None) -> TrainingConfig:
    """Inverse of :func:`to_titan_text` (comment lines skipped, continuations joined)."""
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return parse_titan_args(shlex.split(body.replace("\\\n", " ")), spec)


# --- Primus's TorchTitan backend -------------------------------------------------------------------------------
PRIMUS_TITAN_MODELS: dict[str, str] = {
    "llama3.1-8b": "llama3.1_8B",
    "llama3.1-70b": "llama3.1_70B",
    "llama3.1-405b": "llama3.1_405B",
    "deepseek-v2-lite": "deepseek_v3_16b",
    "deepseek-v3": "deepseek_v3_671b",
    "gpt-oss-20b": "gpt_oss_20b",
    "gpt-oss-120b": "gpt_oss_120b",
}
"""Catalog model → Primus's TorchTitan model YAML (``primus/configs/models/torchtitan/<name>.yaml``@fd1eeabb; the
``-fp8`` one adds the ``quantize.linear.float8`` converter, e.g. ``llama3.1_70B-fp8.yaml``@fd1eeabb:9-11)."""
PRIMUS_TITAN_COMMIT = "73a0e697"
"""The TorchTitan Primus fd1eeabb pins (``third_party/torchtitan``): its ``JobConfig`` is what the overrides
merge into (``primus/backends/torchtitan/argument_builder.py@fd1eeabb:35-44, 81-103``)."""
NOT_IN_PRIMUS_TITAN = ("training.disable_cuda_graphs",)
"""TorchTitan 0.3 keys the pinned JobConfig lacks (``torchtitan/config/job_config.py@73a0e697:243-310``)."""


def primus_titan_overlay(spec: StudySpec, config: TrainingConfig) -> dict[str, Any]:
    """A Primus experiment for its TorchTitan backend: ``modules.pre_trainer`` with ``framework: torchtitan``,
    Primus's model YAML and ``overrides`` in the pinned JobConfig's sections (``parallelism``, ``training``,
    ``activation_checkpoint`` with ``selective_ac_option: op`` for the per-op selective mode,
    job_config.py@73a0e697:651-660, and ``quantize.linear.float8.recipe_name`` for FP8, :731-740), as AMD's
    examples write it (``examples/torchtitan/configs/MI300X/llama3.1_70B-FP8-pretrain.yaml``@fd1eeabb:6-45).
    :class:`SpecError` when the model has no Primus TorchTitan YAML or the precision no form there (FP8:
    tensorwise only; MXFP8 and delayed scaling are not its float8 recipes)."""
    name = PRIMUS_TITAN_MODELS.get(spec.model.name)
    w = spec.workload
    if name is None:
        raise SpecError(
            f"--format primus-torchtitan: model {spec.model.name!r} has no Primus TorchTitan YAML (known: "
            f"{', '.join(PRIMUS_TITAN_MODELS)}); use --format torchtitan or the Megatron backend (--format primus)"
        )
    if w.precision == "fp16" or (w.precision == "fp8" and w.fp8_recipe != "tensorwise"):
        what = "fp16" if w.precision == "fp16" else f"fp8_recipe {w.fp8_recipe}"
        raise SpecError(
            f"--format primus-torchtitan: {what} has no form in Primus's TorchTitan backend (mixed precision "
            "bfloat16/float32, float8 recipes tensorwise/rowwise: job_config.py@73a0e697:282, 738); use bf16 or "
            "fp8_recipe tensorwise"
        )
    values = titan_values(spec, config)
    mode = values.pop("activation_checkpoint")
    overrides: dict[str, Any] = {}
    for key, value in values.items():
        if key not in NOT_IN_PRIMUS_TITAN:
            section, name_ = key.split(".", 1)
            overrides.setdefault(section, {})[name_] = value
    overrides["activation_checkpoint"] = {
        "mode": mode,
        **({"selective_ac_option": "op"} if mode == "selective" else {}),
    }
    if w.precision == "fp8":
        overrides["quantize"] = {"linear": {"float8": {"recipe_name": "tensorwise"}}}
    trainer = {"framework": "torchtitan", "config": "pre_trainer.yaml"}
    trainer["model"] = f"{name}{'-fp8' if w.precision == 'fp8' else ''}.yaml"
    return {"modules": {"pre_trainer": {**trainer, "overrides": overrides}}}


def config_from_primus_titan(doc: dict[str, Any], spec: StudySpec | None = None) -> TrainingConfig:
    """The configuration of a Primus TorchTitan experiment (:func:`primus_titan_overlay`)."""
    overrides = (
        doc.get("modules", {}).get("pre_trainer", {}).get("overrides", {}) if "modules" in doc else doc
    )
    ac = dict(overrides.get("activation_checkpoint") or {})
    values = {
        f"{section}.{k}": v
        for section in ("parallelism", "training")
        for k, v in (overrides.get(section) or {}).items()
    }
    return config_from_titan(values, ac.get("mode", "selective"), spec)
