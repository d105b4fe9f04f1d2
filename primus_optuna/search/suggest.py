"""Turn an Optuna trial into a :class:`TrainingConfig`, with any sampler; the one trial→configuration converter.

Every axis is one categorical parameter named like the axis (``tp pp ep cp vpp mbs recompute moe_dispatcher
pp_schedule ep_overlap``) whose choices are the study's *legal values* of that axis (the candidate values that
appear in at least one legal configuration), so TPE, GP, Random or :class:`PrimusSampler` can all drive the
same study.

What a plain sampler can and cannot know: it sees ten independent categorical axes. It cannot know Megatron's
coupling rules (``tp·cp·pp`` divides the world, the layers divide into ``pp·vpp`` chunks, ``ep`` divides the
experts and the data-parallel ranks, the global batch divides into micro-batches, ...), so most raw
combinations break one. :func:`suggest_config` therefore maps an illegal suggestion to the *nearest legal
configuration* (fewest axes moved, then the smallest steps in the candidate lists; deterministic), records the
mapping (trial system attr ``primus:mapped``, user attr ``suggested_config_key``) and runs that configuration
(system attr ``primus:config``): the sampler learns the value of ``f(nearest_legal(x))``, and TPE/GP/Random
comparisons are fair. Pass ``map_illegal=False`` to prune an illegal combination instead (``prune_reason =
"illegal: ..."``). Memory is not a coupling rule: whether a configuration fits is the memory gate's decision.

Example::

    def objective(trial):
        config = suggest_config(trial, spec)
        ...
"""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution

from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import AXES
from .attrs import PRUNE_REASON
from .configs import (
    complete_config,
    config_from_params,
    fixed_axes,
    legal_config,
    nearest_legal,
    trial_config,
)
from .logs import get_logger
from .pruner import gate_now
from .state import CONFIG, EXHAUSTED, MAPPED, set_trial_state, system_attrs

log = get_logger(__name__)

__all__ = [
    "axis_distributions",
    "complete_config",
    "config_from_params",
    "legal_config",
    "nearest_legal",
    "recorded_distributions",
    "suggest_config",
    "trial_config",
]


def axis_distributions(space: Space) -> dict[str, CategoricalDistribution]:
    """One fixed categorical distribution per axis over its legal values (the same in every trial, as Optuna
    requires)."""
    legal = space.legal_values()
    return {a: CategoricalDistribution(list(legal[a] or space.candidates[a])) for a in space.searched_axes}


def recorded_distributions(study: optuna.Study) -> dict[str, CategoricalDistribution]:
    """The axis distributions the study's trials already use (Optuna's storages require one set of choices per
    parameter name in a study, so a study recorded with other choices, e.g. before the legal values were used,
    keeps its own)."""
    out: dict[str, CategoricalDistribution] = {}
    for t in study._storage.get_all_trials(study._study_id, deepcopy=False):
        for a in AXES:
            d = t.distributions.get(a)
            if a not in out and isinstance(d, CategoricalDistribution):
                out[a] = d
        if len(out) == len(AXES):
            break
    return out


def suggest_config(
    trial: optuna.Trial, spec: StudySpec, space: Space | None = None, *, map_illegal: bool = True
) -> TrainingConfig:
    """Suggest every axis the study searches over its legal values and return the configuration the trial runs.

    An illegal combination is mapped to the nearest legal configuration (see the module docstring), or, with
    ``map_illegal=False``, pruned with ``prune_reason = "illegal: <rules>"``. Records user attr ``config_key``
    and system attr ``primus:config``. A trial for which :class:`PrimusSampler` had nothing left is pruned
    (``exhausted: ...``) before any parameter is suggested.
    """
    space = space or Space(spec)
    sa = system_attrs(trial)
    if sa.get(EXHAUSTED):
        reason = str(sa[EXHAUSTED])
        trial.set_user_attr(PRUNE_REASON, reason)
        raise optuna.TrialPruned(reason)
    dists = {**axis_distributions(space), **recorded_distributions(trial.study)}
    params = {a: trial.suggest_categorical(a, list(dists[a].choices)) for a in space.searched_axes}
    suggested = space.canonical(TrainingConfig.from_params(params))
    config, reason = legal_config(space, suggested)
    if config is None:
        fixed = fixed_axes(trial.study, trial)
        given = set(space.searched_axes) <= set(fixed)
        if given:
            # every axis given (enqueued, or fixed by a PartialFixedSampler): refused, not replaced by another
            # configuration (Optuna warns about a fixed value outside its distribution: optuna 5.1.0
            # optuna/trial/_trial.py:633-646)
            reason = f"{reason} (the configuration {suggested.key()} was given as is: refused, not replaced)"
            log.warning("trial %d: %s", trial.number, reason)
        if not map_illegal or given:
            trial.set_user_attr(PRUNE_REASON, reason)
            raise optuna.TrialPruned(reason)
        # the axes a PartialFixedSampler or enqueue_trial fixed never move
        config = nearest_legal(space, suggested, fixed=tuple(a for a in AXES if a in fixed))
        if config is None:
            trial.set_user_attr(PRUNE_REASON, reason)
            raise optuna.TrialPruned(reason)
        moves = sum(getattr(config, a) != getattr(suggested, a) for a in AXES)
        set_trial_state(
            trial.study, trial, MAPPED, {"from": suggested.to_params(), "moves": moves, "why": reason}
        )
        trial.set_user_attr("suggested_config_key", suggested.key())
    if sa.get(CONFIG) != config.to_params():
        set_trial_state(trial.study, trial, CONFIG, config.to_params())
    if trial.user_attrs.get("config_key") != config.key():  # PrimusSampler has usually written it already
        trial.set_user_attr("config_key", config.key())
    gate_now(trial, spec, config)  # a memory gate nested under another pruner decides here, before launch
    return config
