"""Trial → configuration: the one converter (:func:`trial_config`) and the one legality check
(:func:`legal_config`: legal here *and* within the study's candidate values) of the search, plus the nearest
legal configuration (:func:`nearest_legal`).

Example::

    config = trial_config(space, frozen_trial)   # None while the trial has no configuration
    config, reason = legal_config(space, {"tp": 8, ...})
"""

from __future__ import annotations

import weakref
from typing import Any

from ..errors import SpecError
from ..space import Space, TrainingConfig
from ..spec.axes import DEFAULTS, OPTIONAL_AXES
from ..spec.study import AXES, BOOL_AXES
from .nearest import Nearest
from .state import CONFIG, FIXED_PARAMS, PROPOSAL, system_attrs

__all__ = [
    "complete_config",
    "config_from_params",
    "fixed_axes",
    "legal_config",
    "nearest_legal",
    "partial_fixed_axes",
    "trial_config",
]

_NEAREST: weakref.WeakKeyDictionary[Space, Any] = weakref.WeakKeyDictionary()


def complete_config(space: Space, params: dict[str, Any]) -> TrainingConfig | None:
    """The canonical configuration of a trial's params (``None`` unless all ten axes are present; a boolean
    axis missing from a trial recorded before it existed reads as false)."""
    if any(a not in params and a not in BOOL_AXES and a not in OPTIONAL_AXES for a in AXES):
        return None
    return space.canonical(TrainingConfig.from_params({a: params.get(a, DEFAULTS[a]) for a in AXES}))


def config_from_params(space: Space, params: dict[str, Any]) -> TrainingConfig:
    """The canonical, derived configuration of some axis params (other params are ignored; missing axes come
    from the study's baseline)."""
    axes = {k: v for k, v in params.items() if k in AXES}
    validated = TrainingConfig.from_params(axes)
    return space.canonical(space.baseline_raw.replace(**{k: getattr(validated, k) for k in axes}))


def trial_config(space: Space, trial: Any) -> TrainingConfig | None:
    """The configuration a trial runs, or is queued or claimed with (``None`` while it has none): the one
    converter every module uses. In order: what ``suggest_config`` recorded it runs (``primus:config``), its
    params when all ten axes are there, the sampler's decision (``primus:proposal``), its enqueued params."""
    sa = system_attrs(trial)
    try:
        if sa.get(CONFIG):
            return complete_config(space, sa[CONFIG])
        config = complete_config(space, trial.params)
        if config is not None:
            return config
        if isinstance(sa.get(PROPOSAL), dict) and sa[PROPOSAL].get("config"):
            return complete_config(space, sa[PROPOSAL]["config"])
        if sa.get(FIXED_PARAMS):
            return complete_config(space, sa[FIXED_PARAMS])
    except SpecError:
        return None
    return None


def legal_config(space: Space, config: TrainingConfig | dict[str, Any]) -> tuple[TrainingConfig | None, str]:
    """``(canonical configuration, "")`` when ``config`` is legal here and within the study's candidate values,
    else ``(None, reason)``: the one legality check of the search."""
    try:
        if isinstance(config, dict):
            config = TrainingConfig.from_params({a: config[a] for a in AXES if a in config})
        c = space.canonical(config)
    except (SpecError, KeyError, TypeError, ValueError) as exc:
        return None, f"invalid: {exc}"
    if c in space:
        return c, ""
    reasons = space.check(c)
    if reasons:
        return None, "illegal: " + "; ".join(reasons)
    outside = [a for a in AXES if getattr(c, a) not in space.candidates[a]]
    return None, "outside the study's axes: " + ", ".join(f"{a}={getattr(c, a)}" for a in outside)


def nearest_legal(space: Space, config: TrainingConfig, fixed: tuple[str, ...] = ()) -> TrainingConfig | None:
    """The legal configuration nearest to ``config`` keeping the ``fixed`` axes (``None`` when none is)."""
    nearest = _NEAREST.get(space)
    if nearest is None:
        nearest = _NEAREST[space] = Nearest(space)
    return nearest.nearest(config, lambda c: True, None, fixed=fixed)


def partial_fixed_axes(sampler: Any) -> dict[str, Any]:
    """The axes fixed by Optuna ``PartialFixedSampler`` wrappers of ``sampler`` (the outermost wins): their
    ``sample_independent`` returns the fixed value and never asks the base sampler (optuna 5.1.0
    optuna/samplers/_partial_fixed.py:94-112), so the base sampler must decide with them."""
    out: dict[str, Any] = {}
    while sampler is not None:
        fixed = getattr(sampler, "_fixed_params", None)
        if isinstance(fixed, dict):
            out.update({k: v for k, v in fixed.items() if k in AXES and k not in out})
        sampler = getattr(sampler, "_base_sampler", None)
    return out


def fixed_axes(study: Any, trial: Any) -> dict[str, Any]:
    """The axes a trial's sampler cannot choose: those a ``PartialFixedSampler`` fixes and those enqueued
    (``enqueue_trial``'s ``fixed_params`` come first: optuna 5.1.0 optuna/trial/_trial.py:613)."""
    out = partial_fixed_axes(getattr(study, "sampler", None))
    enqueued = system_attrs(trial).get(FIXED_PARAMS) or {}
    out.update({k: v for k, v in enqueued.items() if k in AXES})
    return out
