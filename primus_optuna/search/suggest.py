"""Turn an Optuna trial into a :class:`TrainingConfig`, with any sampler.

Every axis is one categorical parameter named like the axis (``tp pp ep cp vpp mbs recompute moe_dispatcher
pp_schedule ep_overlap``) whose choices are the study's candidate values, so TPE, Random or :class:`PrimusSampler` can all
drive the same study. An illegal combination is pruned with ``prune_reason = "illegal: ..."``.

Example::

    def objective(trial):
        config = suggest_config(trial, spec)
        ...
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution

from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import AXES, BOOL_AXES


def axis_distributions(space: Space) -> dict[str, CategoricalDistribution]:
    """One fixed categorical distribution per axis (the same in every trial, as Optuna requires)."""
    return {a: CategoricalDistribution(list(space.candidates[a])) for a in AXES}


def complete_config(space: Space, params: dict[str, Any]) -> TrainingConfig | None:
    """The canonical configuration of a trial's params (``None`` unless all ten axes are present; a boolean
    axis missing from a trial recorded before it existed reads as false)."""
    if any(a not in params and a not in BOOL_AXES for a in AXES):
        return None
    return space.canonical(TrainingConfig.from_params({a: params.get(a, False) for a in AXES}))


def suggest_config(trial: optuna.Trial, spec: StudySpec, space: Space | None = None) -> TrainingConfig:
    """Suggest all ten axes, canonicalise, and prune an illegal combination.

    Records user attr ``config_key``; an illegal combination records ``prune_reason`` = ``"illegal: <rules>"``
    and raises :class:`optuna.TrialPruned`.
    """
    space = space or Space(spec)
    params = {a: trial.suggest_categorical(a, list(space.candidates[a])) for a in AXES}
    if trial.user_attrs.get("phase") == "exhausted":  # PrimusSampler has nothing left to propose
        reason = str(trial.user_attrs.get("prune_reason", "exhausted"))
        raise optuna.TrialPruned(reason)
    config = space.canonical(TrainingConfig.from_params(params))
    if trial.user_attrs.get("config_key") != config.key():  # PrimusSampler has usually written it already
        trial.set_user_attr("config_key", config.key())
    reasons = space.check(config)
    if reasons:
        reason = "illegal: " + "; ".join(reasons)
        trial.set_user_attr("prune_reason", reason)
        raise optuna.TrialPruned(reason)
    return config
