import math

import numpy as np
import optuna
import pytest

from primus_optuna import Space, StudySpec, TrainingConfig
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.search.fallback import (
    AxisValueFactors,
    ModelGuidedProposer,
    calibration_from_trials,
    corrected_tps,
)
from primus_optuna.spec.study import AXES
from tests.conftest import small_moe_study


@pytest.fixture
def spec():
    return StudySpec.from_dict(small_moe_study())


def _feasible(spec, space):
    return [c for c in space.configs() if estimate_memory(spec, c).fits]


def test_best_untried_feasible_by_estimate(spec):
    space = Space(spec)
    prop = ModelGuidedProposer(spec, space, exploration=0.0)
    feasible = _feasible(spec, space)
    ranked = sorted(feasible, key=lambda c: -estimate_throughput(spec, c).tokens_per_s_per_gpu)
    config, why = prop.propose([], index=5, exclude=set())
    assert estimate_throughput(spec, config).tokens_per_s_per_gpu == pytest.approx(
        estimate_throughput(spec, ranked[0]).tokens_per_s_per_gpu
    )
    assert "model-guided best" in why and "uncalibrated" in why
    second, _ = prop.propose([], index=6, exclude={config})
    assert second != config and estimate_memory(spec, second).fits and not space.check(second)


def test_the_rationale_calls_its_figures_estimates(spec):
    """The memory figure of a model-guided pick is an estimate: the rationale says so (and the calibrated value
    beside it when the study has a memory calibration), so a user never reads it as a measured peak."""
    space = Space(spec)
    prop = ModelGuidedProposer(spec, space, exploration=0.0)
    config, why = prop.propose([], index=0, exclude=set())
    peak = estimate_memory(spec, config).peak_gib
    assert why.endswith(f"estimated peak {peak:.1f} GiB") and "model estimate " in why
    config, why = prop.propose([], index=0, exclude=set(), memory_scale=0.5)
    peak = estimate_memory(spec, config).peak_gib
    assert why.endswith(f"estimated peak {peak:.1f} GiB (calibrated ×0.50: {peak * 0.5:.1f} GiB)")


def test_exploration_is_a_pure_function_of_seed_and_trial_number(spec):
    space = Space(spec)
    a = ModelGuidedProposer(spec, space, seed=3, exploration=1.0)
    b = ModelGuidedProposer(spec, space, seed=3, exploration=1.0)
    picks_a = [a.propose([], index=n, exclude=set())[0] for n in range(8)]
    picks_b = [b.propose([], index=n, exclude=set())[0] for n in reversed(range(8))][::-1]
    assert picks_a == picks_b
    assert len(set(picks_a)) > 1


def test_exhausted_space_returns_none():
    spec = StudySpec.from_dict(
        small_moe_study(axes={"tp": [1], "pp": [2], "ep": [4], "cp": [1], "mbs": [1], "recompute": ["none"]})
    )
    space = Space(spec)
    prop = ModelGuidedProposer(spec, space)
    tried = set(space.configs())
    assert prop.propose([], index=0, exclude=tried) is None


def test_calibration_from_measured_trials_corrects_the_ranking_values(spec):
    space = Space(spec)
    feasible = _feasible(spec, space)[:3]
    trials = []
    for c in feasible:
        est = estimate_throughput(spec, c).tokens_per_s_per_gpu
        trials.append(
            optuna.trial.create_trial(
                params=c.to_params(),
                distributions={
                    a: optuna.distributions.CategoricalDistribution(space.candidates[a])
                    for a in c.to_params()
                },
                value=est / 2,
                user_attrs={"source": "measured", "measured_tokens_per_s_per_gpu": est / 2},
            )
        )
    cal = calibration_from_trials(spec, space, trials)
    assert not cal.is_identity
    est = estimate_throughput(spec, feasible[0])
    assert corrected_tps(est, cal) == pytest.approx(est.tokens_per_s_per_gpu / 2, rel=1e-6)
    # analytical trials never calibrate
    analytical = [
        optuna.trial.create_trial(params={}, distributions={}, value=1.0, user_attrs={"source": "analytical"})
    ]
    assert calibration_from_trials(spec, space, analytical).is_identity


def _measured_trial(space, config, measured):
    return optuna.trial.create_trial(
        params=config.to_params(),
        distributions={
            a: optuna.distributions.CategoricalDistribution(space.candidates[a]) for a in config.to_params()
        },
        value=measured,
        user_attrs={"source": "measured", "measured_tokens_per_s_per_gpu": measured},
    )


def test_axis_value_factors_carry_a_measured_penalty_to_untried_configs(spec):
    """A cluster where every configuration with the raw model's favourite micro-batch size runs at half the
    model's speed: after a few measurements the fallback expects untried ones with that mbs to be slow too,
    so its pick no longer has it."""
    space = Space(spec)
    prop = ModelGuidedProposer(spec, space, exploration=0.0)
    feasible = _feasible(spec, space)
    raw_best, _ = prop.propose([], index=0, exclude=set())
    bad = raw_best.mbs
    other = next(c.mbs for c in feasible if c.mbs != bad)
    penalty = {bad: 0.5}
    measured = [c for c in feasible if c.mbs == bad and c != raw_best][:4] + [
        c for c in feasible if c.mbs == other
    ][:4]
    trials = [
        _measured_trial(space, c, estimate_throughput(spec, c).tokens_per_s_per_gpu * penalty.get(c.mbs, 1.0))
        for c in measured
    ]
    factors = AxisValueFactors.fit(space, [(c, math.log(penalty.get(c.mbs, 1.0))) for c in measured])
    idx = AxisValueFactors.feature_index(space)
    assert factors.beta[idx[("mbs", bad)]] - factors.beta[idx[("mbs", other)]] < -0.3  # log(0.5), shrunk
    config, why = prop.propose(trials, index=1, exclude=set(measured))
    assert "learned from 8 measured trials" in why
    # the raw model's favourite among these untried configurations has mbs=bad; the corrected pick does not
    assert raw_best not in measured
    assert config.mbs != bad


def test_axis_value_factors_need_a_few_measurements(spec):
    space = Space(spec)
    c = _feasible(spec, space)[0]
    assert AxisValueFactors.fit(space, [(c, -0.5), (c, -0.5)]).is_identity


def test_memory_calibration_widens_or_narrows_the_feasible_pool(spec):
    """With the study's memory calibration at 0.5 (measured peaks half the model's), configurations the model
    alone rejects become candidates; at 2.0 fewer remain."""
    space = Space(spec)
    prop = ModelGuidedProposer(spec, space, exploration=0.0)
    n_model = len(prop.rows())
    assert len(prop.rows(0.5)) > n_model > len(prop.rows(2.0))
    widened = {r.config for r in prop.rows(0.5)} - {r.config for r in prop.rows()}
    assert widened and all(not estimate_memory(spec, c).fits for c in widened)
    config, why = prop.propose([], index=0, exclude=set(), memory_scale=0.5)
    assert f"of {len(prop.rows(0.5))} untried feasible configurations" in why


def _plain_trial(space, config, value, **attrs):
    """A completed trial as a plain Optuna objective leaves it: params and a value, no measurement attrs."""
    return optuna.trial.create_trial(
        params=config.to_params(),
        distributions={
            a: optuna.distributions.CategoricalDistribution(space.candidates[a]) for a in config.to_params()
        },
        value=value,
        user_attrs=attrs,
    )


def test_a_plain_objectives_values_move_the_fallbacks_ranking(spec):
    """Issue 15: a trial's value is the measurement. A cluster where deepep runs at 60% of the model: after a
    few plain trials (no source / measured attrs) the fallback stops proposing deepep configurations."""
    space = Space(spec)
    prop = ModelGuidedProposer(spec, space, exploration=0.0)
    raw_best, _ = prop.propose([], index=0, exclude=set())
    assert raw_best.moe_dispatcher == "deepep"  # the model likes DeepEP on this study

    def cluster(c):
        return estimate_throughput(spec, c).tokens_per_s_per_gpu * (
            0.6 if c.moe_dispatcher == "deepep" else 1.0
        )

    feasible = _feasible(spec, space)
    measured = [c for c in feasible if c.moe_dispatcher == "deepep"][:3] + [
        c for c in feasible if c.moe_dispatcher == "alltoall"
    ][:3]
    plain = [_plain_trial(space, c, cluster(c)) for c in measured]
    assert all(not t.user_attrs for t in plain)
    config, why = prop.propose(plain, index=1, exclude=set(measured))
    assert config.moe_dispatcher == "alltoall" and "learned from 6 measured trials" in why
    ranking = prop.ranking(plain, k=10, exclude=set(measured))
    assert all(r.config.moe_dispatcher == "alltoall" for r in ranking[:3])
    # the same values marked analytical teach nothing
    analytical = [_plain_trial(space, c, cluster(c), source="analytical") for c in measured]
    again, why = prop.propose(analytical, index=1, exclude=set(measured))
    assert again.moe_dispatcher == "deepep" and "nothing measured yet" in why


def test_prior_observations_from_an_earlier_study_teach_the_fallback(spec):
    """The warm-start entry point: (config, measured) pairs from elsewhere, learned with a larger noise."""
    from primus_optuna.search.learner import prior_observations

    space = Space(spec)
    feasible = _feasible(spec, space)
    pairs = [
        (
            c.to_params(),
            estimate_throughput(spec, c).tokens_per_s_per_gpu * (0.6 if c.moe_dispatcher == "deepep" else 1),
        )
        for c in feasible[:40:5]
    ]
    prior = prior_observations(space, pairs)
    assert len(prior) == len(pairs) and all(o.prior for o in prior)
    prop = ModelGuidedProposer(spec, space, exploration=0.0, prior=prior)
    config, why = prop.propose([], index=0, exclude=set())
    assert config.moe_dispatcher == "alltoall" and f"0 measured trials and {len(prior)} prior ones" in why


def _one_axis_apart(feasible: list[TrainingConfig]) -> tuple[TrainingConfig, TrainingConfig, str]:
    """Two feasible configurations that differ in one axis only (a one-axis sweep point and its centre)."""
    centre, point = next(
        (c, d)
        for c in feasible[:200]
        for d in feasible
        if sum(getattr(c, a) != getattr(d, a) for a in AXES) == 1
    )
    return centre, point, next(a for a in AXES if getattr(centre, a) != getattr(point, a))


def test_the_residual_model_is_least_certain_where_nothing_was_measured(spec):
    """The GP on log(measured / estimate): it reproduces a measured residual, carries a one-axis effect to
    untried configurations with that value, and is more certain of a measured configuration than of a new one."""
    from primus_optuna.search.learner import ResidualModel

    space = Space(spec)
    feasible = _feasible(spec, space)
    model = ResidualModel(space, feasible)
    centre, point, axis = _one_axis_apart(feasible)
    obs = [centre, point]
    y = [0.0, -0.3]
    post = model.fit(obs, y)
    mean, sd = post.predict()
    i0, i1 = feasible.index(obs[0]), feasible.index(obs[1])
    assert mean[i0] == pytest.approx(0.0, abs=0.05) and mean[i1] == pytest.approx(-0.3, abs=0.05)
    far = max(range(len(feasible)), key=lambda i: sd[i])
    assert sd[far] > 3 * max(sd[i0], sd[i1])
    # an untried configuration with the penalised axis value inherits part of the penalty
    other = max(
        (i for i, c in enumerate(feasible) if getattr(c, axis) == getattr(point, axis) and c not in obs),
        key=lambda i: sum(getattr(feasible[i], a) == getattr(point, a) for a in AXES),
    )
    assert mean[other] < -0.05


def test_the_first_measurements_count_as_noisier_until_the_hyperparameters_are_learned(spec):
    """Below ``MIN_FOR_HYPERPARAMETERS`` observations a measurement's noise is ``EARLY_NOISE``: the posterior keeps
    that much doubt about a measured configuration and carries less of one surprise to its neighbours; from then
    on the measurement noise is ``NOISE``."""
    from primus_optuna.search.learner import EARLY_NOISE, MIN_FOR_HYPERPARAMETERS, NOISE, ResidualModel

    space = Space(spec)
    feasible = _feasible(spec, space)
    model = ResidualModel(space, feasible)
    centre, point, _ = _one_axis_apart(feasible)
    _, sd = model.fit([centre, point], [0.0, -0.3]).predict()
    assert EARLY_NOISE * 0.8 < sd[feasible.index(point)] < EARLY_NOISE
    many = [c for c in feasible if c not in (centre, point)][: MIN_FOR_HYPERPARAMETERS - 2]
    _, sd = model.fit([centre, point, *many], [0.0, -0.3] + [0.0] * len(many)).predict()
    assert sd[feasible.index(point)] < 1.5 * NOISE


def test_relevance_weighs_what_a_measured_axis_effect_teaches_about_untried_configurations(spec):
    """``relevance`` scales each axis's per-value effect: the same measured one-axis penalty carries further to
    untried configurations with that value when the axis is believed to matter more."""
    from primus_optuna.search.learner import ResidualModel

    space = Space(spec)
    feasible = _feasible(spec, space)
    centre, point, axis = _one_axis_apart(feasible)
    others = [
        i
        for i, c in enumerate(feasible)
        if getattr(c, axis) == getattr(point, axis) and c not in (centre, point)
    ]
    assert others

    def penalty(weight: float) -> float:
        model = ResidualModel(space, feasible, {axis: weight})
        mean, _ = model.fit([centre, point], [0.0, -0.3]).predict()
        return float(np.mean(mean[others]))

    assert penalty(10.0) < penalty(1.0) < penalty(0.1) < 0.0
    assert ResidualModel(space, feasible, {axis: 1.0}).weights is not None
    assert np.allclose(ResidualModel(space, feasible, {axis: 1.0}).weights, 1.0)
    with pytest.raises(ValueError, match="positive weight"):
        ResidualModel(space, feasible, {a: 0.0 for a in AXES})
