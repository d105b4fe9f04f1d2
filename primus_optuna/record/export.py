"""Export a configuration in the format a launcher reads, and parse each format back.

Formats (``FORMATS``):

- ``primus``: a Primus experiment overlay (``modules.pre_trainer.overrides``) with Megatron argument names;
- ``megatron``: Megatron-LM command-line arguments, one per line with shell continuations (the zero-bubble
  and Primus-Turbo switches are Primus extensions);
- ``env``: ``export PRIMUS_TP=1`` lines for launch scripts (booleans as shell's ``true``/``false``);
- ``json``: the ten axes plus ``dp``/``num_microbatches`` and the Megatron overrides;
- ``torchtitan``: TorchTitan 0.3's ``--module``/``--config`` and ``--section.key`` overrides
  (:mod:`primus_optuna.space.torchtitan_args`), for ``torchrun -m torchtitan.train``; a configuration or
  workload TorchTitan cannot run (zero bubble 1P, DeepEP, ``full:N``, an FP8 recipe other than MXFP8, a model
  without a registry function) is refused with the reason;
- ``primus-torchtitan``: a Primus experiment for Primus's TorchTitan backend (``framework: torchtitan``, the
  pinned TorchTitan's JobConfig sections as overrides, :func:`~primus_optuna.space.torchtitan_args.
  primus_titan_overlay`).

Each parser returns the :class:`~primus_optuna.space.TrainingConfig` the text describes, so
``parse_export(export_config(spec, c, fmt), fmt, spec) == c`` for every format (the round-trip test; for
``torchtitan``, every configuration it does not refuse).

Megatron/Primus names: ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
``expert_model_parallel_size``, ``context_parallel_size``, ``num_virtual_stages_per_pipeline_rank``,
``micro_batch_size``, ``global_batch_size``, ``recompute_granularity/method/num_layers/modules`` (the
``recompute`` axis: none, selective[:modules], full = uniform 1, full:N = block N; Primus's
``recompute_layer_ids`` is read back too), ``grad_reduce_in_bf16``, ``fp8_param_gather``, the
precision-aware optimizer's ``use_precision_aware_optimizer``/``main_params_dtype``/``main_grads_dtype``/
``exp_avg_dtype``/``exp_avg_sq_dtype`` (workload settings: the study's importer reads them back),
``moe_token_dispatcher_type`` (DeepEP: ``flex`` + ``moe_enable_deepep`` and Primus-Turbo's
``use_turbo_deepep``), the zero-bubble switches of Primus (``patch_zero_bubble``, ``enable_zero_bubble``,
``zero_bubble_v_schedule``, ``zero_bubble_v_schedule_mem_setup``) and ``fp8: hybrid``.

Example::

    text = export_config(spec, config, "megatron")
    parse_export(text, "megatron", spec) == config  # True
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml

from ..errors import SpecError
from ..search.attrs import EXHAUSTED, MEMORY, PRUNE_REASON, reason_category
from ..space import TrainingConfig
from ..space.megatron_args import (
    PRIMUS_ONLY,
    ZERO_BUBBLE,
    config_from_megatron,
    launch_env,
    megatron_flags,
    megatron_overrides,
    uses_primus,
)
from ..space.torchtitan_args import (
    config_from_primus_titan,
    parse_titan_text,
    primus_titan_overlay,
    titan_caveats,
    to_titan_text,
)
from ..spec import StudySpec
from ..spec.axes import AXIS_LIST

FORMATS: tuple[str, ...] = ("primus", "megatron", "env", "json")
"""The formats every configuration has."""
TARGET_FORMATS: tuple[str, ...] = ("torchtitan", "primus-torchtitan")
"""Formats of a framework that runs part of the space (it refuses the rest, saying why)."""
EXPORT_FORMATS: tuple[str, ...] = FORMATS + TARGET_FORMATS

ENV_NAMES: dict[str, str] = {a.name: a.env for a in AXIS_LIST}
"""``env`` format: one variable per axis (plus ``PRIMUS_GBS``/``PRIMUS_DP``/``PRIMUS_SEQ_LENGTH``)."""


def _derive(config: TrainingConfig, spec: StudySpec | None) -> TrainingConfig:
    return config.derive(spec.world, spec.workload.global_batch_size) if spec is not None else config


# --- writers ------------------------------------------------------------------------------------------------


def to_primus_yaml(spec: StudySpec, config: TrainingConfig, header: str = "") -> str:
    """A Primus experiment overlay: ``modules.pre_trainer.overrides`` holds the Megatron arguments."""
    doc = {"modules": {"pre_trainer": {"overrides": megatron_overrides(spec, config, primus=True)}}}
    return _comment(header) + yaml.safe_dump(doc, sort_keys=False)


def megatron_args(
    spec: StudySpec, config: TrainingConfig, *, upstream: bool = False, primus_only: bool = True
) -> list[str]:
    """Megatron-LM command-line arguments (booleans as bare flags, unset arguments omitted).

    For a study on AMD GPUs (and any zero-bubble schedule, which only Primus runs) the Primus-only switches
    (:data:`~primus_optuna.space.megatron_args.PRIMUS_ONLY`) are included: Primus's Megatron backend accepts
    them, upstream Megatron-LM does not. An NVIDIA study's arguments are upstream Megatron-LM's without being
    asked. ``upstream=True`` leaves the Primus switches out (and refuses a zero-bubble schedule, which upstream
    cannot run); ``primus_only=False`` returns only the others."""
    if upstream and config.pp_schedule in ZERO_BUBBLE:
        raise SpecError(
            f"--upstream: pp_schedule={config.pp_schedule} (zero bubble) exists only in Primus; upstream "
            "Megatron-LM cannot run this configuration (export it without --upstream for Primus)"
        )
    primus = not upstream and (uses_primus(spec) or config.pp_schedule in ZERO_BUBBLE)
    values = megatron_overrides(spec, config, primus=primus)
    # a Primus switch that is off is its parser's default: no flag (the overlay writes it, to clear a value)
    values = {k: v for k, v in values.items() if v or k not in PRIMUS_ONLY}
    return megatron_flags(values, skip=() if primus_only else PRIMUS_ONLY)


def to_megatron(spec: StudySpec, config: TrainingConfig, header: str = "", upstream: bool = False) -> str:
    """:func:`megatron_args` one per line, joined with shell continuations; a comment names the Primus-only
    flags (left out with ``upstream``)."""
    args = megatron_args(spec, config, upstream=upstream)
    if not upstream:
        common = set(megatron_args(spec, config, primus_only=False))
        only = [a for a in args if a.startswith("--") and a not in common]
        if only:
            note = f"Primus-only flags (upstream Megatron-LM refuses them; --upstream leaves them out): {' '.join(only)}"
            header = f"{header}\n{note}" if header else note
    env = launch_env(spec)
    if env:
        note = "launch environment: " + " ".join(f"{k}={v}" for k, v in env.items())
        header = f"{header}\n{note}" if header else note
    lines: list[str] = []
    i = 0
    while i < len(args):
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        lines.append(" ".join([args[i], *(shlex.quote(v) for v in args[i + 1 : j])]))
        i = j
    return _comment(header) + " \\\n".join(lines) + "\n"


def to_env(spec: StudySpec, config: TrainingConfig, header: str = "") -> str:
    """``export NAME=value`` lines: the ten axes, derived DP, GBS and sequence length, and the environment the
    workload's launch needs (:func:`~primus_optuna.space.megatron_args.launch_env`)."""
    c = config.derive(spec.world, spec.workload.global_batch_size)
    pairs = [(ENV_NAMES[a], v) for a, v in c.to_params().items()]
    pairs += [
        ("PRIMUS_DP", c.dp),
        ("PRIMUS_GBS", spec.workload.global_batch_size),
        ("PRIMUS_SEQ_LENGTH", spec.workload.seq_length),
        *launch_env(spec).items(),
    ]
    return _comment(header) + "".join(f"export {k}={shlex.quote(_shell(v))}\n" for k, v in pairs)


def _shell(value: Any) -> str:
    """A value as a shell word: booleans as ``true``/``false`` (``if $PRIMUS_EP_OVERLAP; then``), not Python's
    ``True``."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def to_json(spec: StudySpec, config: TrainingConfig, extra: dict[str, Any] | None = None) -> str:
    """JSON: ``config`` (axes + derived), ``megatron`` (the overrides) and any ``extra`` fields."""
    c = config.derive(spec.world, spec.workload.global_batch_size)
    doc = {**(extra or {}), "config": c.to_dict(), "megatron": megatron_overrides(spec, c)}
    return json.dumps(doc, indent=2) + "\n"


def export_config(
    spec: StudySpec,
    config: TrainingConfig,
    fmt: str,
    *,
    header: str = "",
    extra: dict[str, Any] | None = None,
    upstream: bool = False,
) -> str:
    """``config`` as text in format ``fmt`` (one of :data:`FORMATS`); ``header`` becomes comment lines;
    ``upstream`` (megatron only) leaves out the Primus-only flags."""
    if upstream and fmt != "megatron":
        raise SpecError("--upstream applies to --format megatron only")
    if fmt == "primus":
        return to_primus_yaml(spec, config, header)
    if fmt == "megatron":
        return to_megatron(spec, config, header, upstream=upstream)
    if fmt == "env":
        return to_env(spec, config, header)
    if fmt == "json":
        return to_json(spec, config, {"comment": header, **(extra or {})} if header else extra)
    if fmt == "torchtitan":
        return to_titan_text(spec, config, header)
    if fmt == "primus-torchtitan":
        doc = primus_titan_overlay(spec, config)
        notes = "\n".join([*([header] if header else []), *titan_caveats(spec, config)])
        return _comment(notes) + yaml.safe_dump(doc, sort_keys=False)
    raise SpecError(f"--format: unknown format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")


def _comment(header: str) -> str:
    return "".join(f"# {line}\n" for line in header.splitlines()) if header else ""


# --- parsers ------------------------------------------------------------------------------------------------


def parse_primus_yaml(text: str, spec: StudySpec | None = None) -> TrainingConfig:
    """Parse a Primus overlay (nested ``modules.pre_trainer.overrides`` or a flat mapping)."""
    doc = yaml.safe_load(text) or {}
    if not isinstance(doc, dict):
        raise SpecError("primus overlay: expected a YAML mapping")
    overrides = (
        doc.get("modules", {}).get("pre_trainer", {}).get("overrides", doc) if "modules" in doc else doc
    )
    return config_from_megatron(overrides, spec)


def parse_megatron_args(text: str | list[str], spec: StudySpec | None = None) -> TrainingConfig:
    """Parse Megatron command-line arguments (a string with continuations, or an argv list)."""
    if isinstance(text, str):
        body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        argv = shlex.split(body.replace("\\\n", " "))
    else:
        argv = list(text)
    values: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            i += 1
            continue
        name = tok[2:].replace("-", "_")
        if "=" in name:
            name, value = name.split("=", 1)
            values[name] = value
            i += 1
            continue
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        rest = argv[i + 1 : j]
        values[name] = True if not rest else rest[0] if len(rest) == 1 else rest
        i = j
    return config_from_megatron(values, spec)


def parse_env(text: str, spec: StudySpec | None = None) -> TrainingConfig:
    """Parse ``export NAME=value`` lines written by :func:`to_env`."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        if "=" in line:
            k, v = line.split("=", 1)
            env[k.strip()] = shlex.split(v)[0] if v.strip() else ""
    params = {axis: env[name] for axis, name in ENV_NAMES.items() if name in env}
    return _derive(TrainingConfig.from_params(params), spec)


def parse_json(text: str, spec: StudySpec | None = None) -> TrainingConfig:
    """Parse the JSON written by :func:`to_json` (or a bare dict of axes)."""
    doc = json.loads(text)
    params = doc.get("config", doc) if isinstance(doc, dict) else None
    if not isinstance(params, dict):
        raise SpecError("json export: expected an object with a 'config' mapping")
    return _derive(TrainingConfig.from_params(params), spec)


PARSERS = {
    "primus": parse_primus_yaml,
    "megatron": parse_megatron_args,
    "env": parse_env,
    "json": parse_json,
    "torchtitan": parse_titan_text,
    "primus-torchtitan": lambda text, spec=None: config_from_primus_titan(yaml.safe_load(text) or {}, spec),
}


def parse_export(text: str, fmt: str, spec: StudySpec | None = None) -> TrainingConfig:
    """Inverse of :func:`export_config`."""
    if fmt not in PARSERS:
        raise SpecError(f"unknown format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    return PARSERS[fmt](text, spec)


# --- studies ------------------------------------------------------------------------------------------------


def study_spec(study: Any) -> StudySpec:
    """The :class:`StudySpec` a primus-optuna study stored (``primus:spec``, see
    :func:`~primus_optuna.search.state.stored_spec`)."""
    from ..search.state import stored_spec

    spec = stored_spec(study, required="export")
    assert spec is not None
    return spec


def trial_config(trial: Any, spec: StudySpec) -> TrainingConfig:
    """The configuration a trial ran (:func:`primus_optuna.search.configs.trial_config`), or a
    :class:`SpecError` when it has none."""
    from ..search.configs import trial_config as converted
    from ..space import Space

    config = converted(Space(spec), trial)
    if config is None:
        raise SpecError(
            f"trial {trial.number} does not have all ten axes as parameters: {sorted(trial.params)}"
        )
    return config


def select_trial(study: Any, number: int | None = None) -> Any:
    """Trial ``number``, or the best one (for a Pareto study: the highest tokens/s on the front)."""
    import optuna

    if number is not None:
        for t in study.get_trials(deepcopy=False):
            if t.number == number:
                if not t.params:
                    raise SpecError(f"--trial {number}: the trial has no parameters yet ({t.state.name})")
                return t
        raise SpecError(f"--trial {number}: study {study.study_name!r} has no trial with that number")
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        trials = study.get_trials(deepcopy=False)
        pruned_mem = [
            t for t in trials if reason_category(t.user_attrs.get(PRUNE_REASON)) in (MEMORY, EXHAUSTED)
        ]
        if trials and len(pruned_mem) == len(trials):
            raise SpecError(
                f"study {study.study_name!r} has no completed trial: every one of its {len(trials)} trials was "
                "pruned because nothing fits in memory (running longer will not help); see `primus-optuna space "
                "STUDY` for the smallest peak, then change the cluster, the axes or the memory margin"
            )
        raise SpecError(
            f"study {study.study_name!r} has no completed trial yet; pass --trial N (a trial with parameters) "
            "or run the study until a trial completes"
        )
    if len(study.directions) > 1:
        return max(study.best_trials, key=lambda t: t.values[0])
    return study.best_trial
