import optuna
import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.run.objective import make_objective
from primus_optuna.search.suggest import axis_distributions, suggest_config
from primus_optuna.spec.study import AXES
from tests.conftest import small_dense_study, small_moe_study

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def spec():
    return StudySpec.from_dict(small_moe_study())


def test_every_axis_is_a_fixed_categorical_over_its_legal_values_and_illegal_ones_are_pruned_on_request(spec):
    space = Space(spec)
    seen: list[object] = []

    def objective(trial):
        config = suggest_config(trial, spec, space, map_illegal=False)
        seen.append(config)
        return 1.0

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(objective, n_trials=40)
    dists = axis_distributions(space)
    legal = space.legal_values()
    for t in study.trials:
        assert set(t.distributions) == set(space.searched_axes) == set(AXES) - {"dp_shard"}
        assert all(t.distributions[a] == dists[a] for a in space.searched_axes)
        assert all(list(dists[a].choices) == legal[a] for a in space.searched_axes)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "a random sample of this product has illegal points"
    assert all(t.user_attrs["prune_reason"].startswith("illegal: ") for t in pruned)
    assert all(not space.check(c) and c == space.canonical(c) for c in seen)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == len(seen) and all("config_key" in t.user_attrs for t in done)


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_plain_samplers_land_a_legal_configuration_in_every_trial(spec, name):
    """Issue 23 item 15: with the raw candidates 92-97% of TPE/Random trials were illegal; an illegal
    suggestion now runs the nearest legal configuration, recorded on the trial."""
    from primus_optuna.search.configs import trial_config
    from primus_optuna.search.state import CONFIG, MAPPED

    space = Space(spec)
    sampler = (
        optuna.samplers.RandomSampler(seed=3) if name == "random" else optuna.samplers.TPESampler(seed=3)
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    ran = []

    def objective(trial):
        config = suggest_config(trial, spec, space)
        ran.append(config)
        return float(config.tp * config.mbs)

    study.optimize(objective, n_trials=30)
    assert len(ran) == 30 and all(c in space for c in ran)  # every trial legal and within the candidates
    mapped = [t for t in study.trials if MAPPED in t.system_attrs]
    assert mapped, "some raw suggestions were illegal"
    for t in study.trials:
        assert trial_config(space, t) == ran[t.number]
        assert t.system_attrs[CONFIG] == ran[t.number].to_params()
        assert t.user_attrs["config_key"] == ran[t.number].key()
    for t in mapped:
        suggested = space.canonical(space.make(**t.params))
        assert space.check(suggested) or suggested not in space
        assert t.user_attrs["suggested_config_key"] == suggested.key()
        assert t.system_attrs[MAPPED]["moves"] >= 1


@pytest.mark.parametrize(
    "sampler", [optuna.samplers.TPESampler(seed=0), optuna.samplers.RandomSampler(seed=0)]
)
def test_make_objective_works_with_stock_samplers(sampler):
    # a narrower product (tp, cp, pp restricted) so that 20 random points surely include legal ones
    spec = StudySpec.from_dict(small_moe_study(axes={"tp": [1, 2], "cp": [1], "pp": [1, 2]}))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(make_objective(spec, runs_dir=None), n_trials=20)
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.FAIL not in states
    assert optuna.trial.TrialState.COMPLETE in states
    best = study.best_trial
    assert best.user_attrs["source"] == "analytical" and best.value > 0


def test_an_optional_axis_is_suggested_only_when_the_study_searches_it():
    spec = StudySpec.from_dict(small_dense_study(axes={"dp_shard": [1, 2, 4]}))
    space = Space(spec)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen: list[object] = []
    study.optimize(lambda t: seen.append(suggest_config(t, spec, space)) or 1.0, n_trials=12)
    assert all("dp_shard" in t.params for t in study.trials)
    assert {c.dp_shard for c in seen} > {1}
