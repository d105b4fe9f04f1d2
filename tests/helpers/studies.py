"""A shipped study's own analytical run, for the framework checks (tests/mcore, tests/titan)."""

from __future__ import annotations

from typing import Any

from primus_optuna.spec import StudySpec


def analytical_run(spec: StudySpec) -> tuple[Any, list[Any]]:
    """The study's analytical run (``search.n_trials`` trials, in memory, no LLM): the study and the
    configurations of its trials that reached the axes. The spec's runner stays as given (its framework's rules
    apply); the objective is the analytical estimate."""
    import optuna

    from primus_optuna import PrimusSampler, make_objective, store_spec, study_pruner
    from primus_optuna.record.export import trial_config

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize",
        sampler=PrimusSampler(spec, seed=spec.search.seed or 0),
        pruner=study_pruner(spec, launches_jobs=False),
    )
    store_spec(study, spec)
    study.optimize(make_objective(spec), n_trials=spec.search.n_trials)
    trials = [t for t in study.get_trials(deepcopy=False) if "tp" in t.params]
    return study, [trial_config(t, spec) for t in trials]
