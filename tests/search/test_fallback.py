import math

import optuna
import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.search.fallback import (
    AxisValueFactors,
    ModelGuidedProposer,
    calibration_from_trials,
    corrected_tps,
)
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
    assert "per-axis-value factors" in why
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
