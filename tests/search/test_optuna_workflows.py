"""Issue 23: PrimusSampler and the pruners under the Optuna workflows users rely on. One test per reproduced
item (numbered as in the issue); each failed on the code before the issue."""

from __future__ import annotations

import pickle
import threading
import warnings

import optuna
import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.run.base import Measurement, OutOfMemory, RunFailure
from primus_optuna.run.objective import make_objective
from primus_optuna.search.early_stop import ThroughputPruner
from primus_optuna.search.fallback import rng_for
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.search.sampler import PrimusSampler
from primus_optuna.search.suggest import suggest_config
from tests.conftest import small_moe_study

optuna.logging.set_verbosity(optuna.logging.WARNING)
State = optuna.trial.TrialState


@pytest.fixture(scope="module")
def spec() -> StudySpec:
    return StudySpec.from_dict(small_moe_study())


def study_calibrations(*args, **kwargs):
    from primus_optuna.search.calibrations import study_calibrations as derive

    return derive(*args, **kwargs)


PROPOSAL = (
    "primus:proposal"  # primus_optuna.search.state.PROPOSAL (literal: the tests also run on older code)
)
MEMORY_CHECK = "primus:memory_check"


def _study(spec, sampler=None, pruner=None, **kw):
    return optuna.create_study(
        direction="maximize",
        sampler=sampler or PrimusSampler(spec),
        pruner=pruner if pruner is not None else MemoryPrefilterPruner(spec=spec),
        **kw,
    )


def _configs(study, spec):
    try:
        from primus_optuna.search.configs import trial_config
    except ImportError:  # the code before issue 23
        from primus_optuna.search.sampler import trial_config

    space = Space(spec)
    return [trial_config(space, t) for t in study.get_trials(deepcopy=False)]


def test_1_a_retry_of_a_worker_killed_while_choosing_runs_the_decision(spec, tmp_path):
    """A worker killed after the decision (e.g. in a long planner call, before any parameter): the heartbeat
    retry runs the same sweep point, not a random configuration; one killed before deciding decides afresh."""
    sampler = PrimusSampler(spec)
    study = _study(spec, sampler, storage=f"sqlite:///{tmp_path / 'k.db'}")
    trial = study.ask()  # the sampler decided in before_trial: the baseline, recorded at once
    frozen = study._storage.get_trial(trial._trial_id)
    assert frozen.system_attrs[PROPOSAL]["key"] == sampler.plan[0].config.key() and not frozen.params
    study._storage.set_trial_state_values(trial._trial_id, State.FAIL)  # what fail_stale_trials does
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2)(
            study, study._storage.get_trial(trial._trial_id)
        )
    study.optimize(make_objective(spec), n_trials=3)
    retry, after, third = study.trials[1:4]
    assert retry.system_attrs["failed_trial"] == 0 and retry.state == State.COMPLETE
    assert retry.user_attrs["config_key"] == sampler.plan[0].config.key()  # the baseline is measured
    assert [after.user_attrs["sweep_index"], third.user_attrs["sweep_index"]] == [1, 2]


def test_2_added_trials_cover_their_points_instead_of_shifting_the_sweep(spec):
    sampler = PrimusSampler(spec)
    plan = [p.config for p in sampler.plan]
    space = sampler.space
    others = [c for c in space.configs() if c not in plan and estimate_memory(spec, c).fits][:2]
    study = _study(spec, sampler)
    for value, c in ((1000.0, others[0]), (900.0, others[1]), (800.0, plan[1])):
        study.add_trial(
            optuna.trial.create_trial(
                params=c.to_params(),
                distributions={
                    a: optuna.distributions.CategoricalDistribution(space.candidates[a])
                    for a in space.searched_axes
                },
                value=value,
            )
        )
    study.optimize(make_objective(spec), n_trials=len(plan) - 1)
    ran = _configs(study, spec)[3:]
    assert ran == [plan[0], *plan[2:]]  # the baseline first, the measured point not again, none skipped


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
def test_3_budget_reservations_are_never_overrun_by_concurrent_workers(spec, storage, tmp_path):
    """The planner's llm.max_calls: one reservation before each call, exact with eight workers."""
    from primus_optuna.search import reserve_call, state
    from primus_optuna.search.llm_budget import llm_accounting

    url = None if storage == "memory" else f"sqlite:///{tmp_path / 'b.db'}"
    study = optuna.create_study(storage=url)
    granted: list[int] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        if reserve_call(study, 2):
            granted.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 2 and llm_accounting(study)["calls"] == 2
    assert not reserve_call(study, 2)  # spent: a later worker makes no call
    assert not hasattr(state, "reserve")  # one budget implementation: llm_budget's


def test_4_a_warm_start_keeps_the_studys_own_out_of_memory_runs(spec):
    from primus_optuna.search.warm_start import WarmStart, apply_warm_start

    study = _study(spec)
    space = Space(spec)
    near = [
        c
        for c in space.configs()
        if 0.85 < estimate_memory(spec, c).peak_gib / estimate_memory(spec, c).usable_gib < 1.0
    ]
    config = near[0]
    objective = make_objective(spec, _Failing(spec, OutOfMemory("HIP out of memory")))
    study.enqueue_trial(config.to_params())
    study.optimize(objective, n_trials=1, catch=(RunFailure,))
    before = study_calibrations(study, spec).memory
    assert before.n_oom == 1 and before.scale > 1.0
    apply_warm_start(study, spec, WarmStart(sources=["earlier.db"], memory_ratios=[1.0, 1.0]))
    after = study_calibrations(study, spec).memory
    assert after.scale >= before.scale and after.n_oom == 1 and after.n_trials == 2
    # and the configuration that ran out of memory is refused again
    assert not sampler_validates(spec, study, config)


def sampler_validates(spec, study, config) -> bool:
    return (
        PrimusSampler(spec).validate(config.to_params(), set(), study_calibrations(study, spec).memory)[0]
        is not None
    )


def test_5_the_memory_gate_decides_on_the_suggested_configuration_and_composes(spec):
    space = Space(spec)
    over = next(c for c in space.configs() if not estimate_memory(spec, c).fits)
    # an early should_prune() (before suggest_config) decides nothing and records nothing
    study = _study(spec, optuna.samplers.RandomSampler(seed=0))
    early: list[bool] = []

    def objective(trial):
        early.append(trial.should_prune())
        early.append("memory_peak_gib" in trial.study._storage.get_trial(trial._trial_id).user_attrs)
        config = suggest_config(trial, spec, space)
        if trial.should_prune():
            raise optuna.TrialPruned()
        return float(config.tp)

    study.enqueue_trial(over.to_params())
    study.optimize(objective, n_trials=1)
    t = study.trials[0]
    assert t.state == State.PRUNED and t.user_attrs["memory_peak_gib"] == pytest.approx(
        estimate_memory(spec, over).peak_gib, abs=1e-3
    )
    assert t.system_attrs[MEMORY_CHECK]["key"] == over.key()
    # wrapped in PatientPruner (which never calls it before a report), the gate still decides before launch
    launched: list[str] = []

    def objective2(trial):
        config = suggest_config(trial, spec, space)
        if trial.should_prune():
            raise optuna.TrialPruned()
        launched.append(config.key())
        return 1.0

    for outer in (
        optuna.pruners.PatientPruner(MemoryPrefilterPruner(spec=spec), patience=1),
        optuna.pruners.PatientPruner(
            MemoryPrefilterPruner(spec=spec, wrapped=optuna.pruners.MedianPruner()), patience=2
        ),
    ):
        study = _study(spec, optuna.samplers.RandomSampler(seed=0), pruner=outer)
        study.enqueue_trial(over.to_params())
        study.optimize(objective2, n_trials=1)
        assert study.trials[0].state == State.PRUNED and not launched
        assert study.trials[0].user_attrs["prune_reason"].startswith("memory: ")


def test_6_the_throughput_pruner_honours_the_study_direction():
    def verdict(direction: str, best: float, running: list[float]) -> bool:
        study = optuna.create_study(direction=direction, pruner=ThroughputPruner(min_iters=3))
        study.add_trial(optuna.trial.create_trial(value=best, user_attrs={"source": "measured"}))
        trial = study.ask()
        for i, v in enumerate(running):
            trial.report(v, i)
        return trial.should_prune()

    assert verdict("maximize", 100.0, [50.0, 50.0, 50.0])  # slower than the best: stopped
    assert not verdict("minimize", 100.0, [50.0, 50.0, 50.0])  # a step time better than the best: runs on
    assert verdict("minimize", 100.0, [200.0, 200.0, 200.0])  # twice the best step time: stopped
    assert not verdict("maximize", 100.0, [200.0, 201.0, 199.0])


class _Failing:
    """Fails the first ``n`` runs with ``exc``, then measures at the estimate."""

    kind = "fake"
    launches_jobs = False

    def __init__(self, spec, exc, n: int = 1) -> None:
        self.spec, self.exc, self.n, self.calls = spec, exc, n, 0

    def run(self, config, context):
        from primus_optuna.physics.throughput import estimate_throughput

        self.calls += 1
        if self.calls <= self.n:
            raise self.exc
        est = estimate_throughput(self.spec, config)
        return Measurement(est.tokens_per_s_per_gpu, est.step_time_s, "measured")


def test_7_a_failed_point_is_retried_once_the_baseline_included(spec):
    from primus_optuna.run.base import LaunchFailure

    sampler = PrimusSampler(spec)
    study = _study(spec, sampler)
    study.optimize(
        make_objective(spec, _Failing(spec, LaunchFailure("node lost"))), n_trials=3, catch=(RunFailure,)
    )
    first, retry, nxt = study.trials[:3]
    base = sampler.plan[0].config.key()
    assert first.state == State.FAIL and first.user_attrs["config_key"] == base
    assert retry.user_attrs["config_key"] == base and retry.user_attrs["retry_of"] == 0
    assert retry.user_attrs["sweep_axis"] == "baseline" and retry.state == State.COMPLETE
    # the search goes on from the measured baseline (by value since issue 41: a sweep point or the model's pick)
    assert nxt.user_attrs["config_key"] != base and nxt.user_attrs["phase"] in ("sweep", "fallback")
    # a point that fails twice is not tried a third time
    study2 = _study(spec, PrimusSampler(spec))
    study2.optimize(
        make_objective(spec, _Failing(spec, LaunchFailure("node lost"), n=2)), n_trials=3, catch=(RunFailure,)
    )
    keys = [t.user_attrs["config_key"] for t in study2.trials]
    assert keys.count(base) == 2 and keys[2] != base
    # the centre gave no value: the sweep's order is value-driven (a sweep point or the model's own pick)
    assert study2.trials[2].user_attrs["phase"] in ("sweep", "fallback")


def test_8_a_partial_enqueue_is_completed_with_the_nearest_fitting_configuration_and_a_warning(spec, caplog):
    space = Space(spec)
    tp = max(v for v in space.legal_values()["tp"])
    study = _study(spec)
    study.enqueue_trial({"tp": tp})
    with caplog.at_level("WARNING", logger="optuna"):
        study.optimize(make_objective(spec), n_trials=1)
    assert [r.getMessage() for r in caplog.records if "completed" in r.getMessage()]
    t = study.trials[0]
    config = _configs(study, spec)[0]
    assert config.tp == tp and config in space and estimate_memory(spec, config).fits
    assert t.state == State.COMPLETE and t.user_attrs["phase"] == "enqueued"
    again = _study(spec)
    again.enqueue_trial({"tp": tp})
    again.optimize(make_objective(spec), n_trials=1)
    assert _configs(again, spec)[0] == config  # deterministic, not random


def test_10_foreign_parameters_and_distributions_are_served_not_crashed(spec):
    sampler = PrimusSampler(spec, seed=3)
    study = _study(spec, sampler)

    def objective(trial):
        tp = trial.suggest_int("tp", 1, 64)  # an axis asked with another distribution
        lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)  # not an axis
        odd = trial.suggest_categorical("pp", [99])  # a distribution without the decision's value
        return tp * lr + odd

    study.optimize(objective, n_trials=3)
    assert all(t.state == State.COMPLETE for t in study.trials)
    for t in study.trials:
        assert t.params["tp"] == t.system_attrs[PROPOSAL]["config"]["tp"] and t.params["pp"] == 99
        assert 1e-4 <= t.params["lr"] <= 1e-2


def test_11_the_sampler_the_pruners_and_their_study_pickle(spec):
    from primus_optuna.search.early_stop import study_pruner

    sampler = PrimusSampler(spec)
    pruner = MemoryPrefilterPruner(spec=spec, wrapped=ThroughputPruner())
    study = _study(spec, sampler, pruner)
    study.optimize(make_objective(spec), n_trials=2)
    clone = pickle.loads(pickle.dumps(study))
    clone.optimize(make_objective(spec), n_trials=2)
    assert [t.user_attrs["sweep_index"] for t in clone.trials] == [0, 1, 2, 3]
    for obj in (sampler, pruner, study_pruner(spec, launches_jobs=True), ThroughputPruner()):
        assert type(pickle.loads(pickle.dumps(obj))) is type(obj)


def test_12_seeds_none_negative_and_parameter_names_are_independent(spec):
    study = _study(spec, PrimusSampler(spec, seed=None))
    study.optimize(make_objective(spec), n_trials=2)
    assert all(t.state == State.COMPLETE for t in study.trials)
    assert rng_for(7, 3).random() != rng_for(-7, 3).random()
    values: list[tuple[float, float]] = []

    def objective(trial):
        suggest_config(trial, spec)
        values.append((trial.suggest_float("x1", 0, 1), trial.suggest_float("y0", 0, 1)))
        return 1.0

    _study(spec, PrimusSampler(spec, seed=1), pruner=optuna.pruners.NopPruner()).optimize(
        objective, n_trials=4
    )
    assert all(x != y for x, y in values)
    s = PrimusSampler(spec, seed=5)
    s.reseed_rng()  # Optuna calls it per worker thread: reseeds the independent sampler


class _Slow:
    """Measures at the estimate after a short wait (threads overlap, as jobs do)."""

    kind = "fake"
    launches_jobs = False

    def __init__(self, spec) -> None:
        self.spec = spec

    def run(self, config, context):
        import time

        from primus_optuna.physics.throughput import estimate_throughput

        time.sleep(0.05)
        est = estimate_throughput(self.spec, config)
        return Measurement(est.tokens_per_s_per_gpu, est.step_time_s, "measured")


def test_13_threads_never_collide(spec):
    sampler = PrimusSampler(spec)
    study = _study(spec, sampler)
    study.optimize(make_objective(spec, _Slow(spec)), n_trials=32, n_jobs=8)
    reasons = [str(t.user_attrs.get("prune_reason", "")) for t in study.trials]
    assert not [r for r in reasons if r.startswith("duplicate")]
    sweep = [t.user_attrs["sweep_index"] for t in study.trials if t.user_attrs.get("phase") == "sweep"]
    assert sorted(sweep) == list(range(len(sampler.plan)))
    keys = [t.user_attrs["config_key"] for t in study.trials]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("how", ["sampler", "objective"])
def test_14_a_python_api_study_is_a_full_citizen(spec, how, tmp_path):
    """The README's recipe (no open_study): the report, export, --warm-start and the dashboard note work."""
    from primus_optuna.record.dashboard import refresh_study_note
    from primus_optuna.record.export import export_config, select_trial, study_spec, trial_config
    from primus_optuna.record.report import record_of
    from primus_optuna.search.warm_start import earlier_spec

    sampler = PrimusSampler(spec) if how == "sampler" else optuna.samplers.TPESampler(seed=0)
    study = optuna.create_study(
        direction="maximize",
        sampler=sampler,
        pruner=MemoryPrefilterPruner(spec=spec),
        storage=f"sqlite:///{tmp_path / 'py.db'}",
        study_name="py",
    )
    study.optimize(make_objective(spec), n_trials=3)
    assert study_spec(study).to_public_dict() == spec.to_public_dict()
    assert earlier_spec("py.db", study).model == spec.model
    rec = record_of(study)
    assert len(rec.trials) == 3
    best = select_trial(study)
    assert export_config(spec, trial_config(best, spec), "megatron")
    assert spec.model.name in refresh_study_note(study)


def test_22_6_a_plain_objectives_pruned_trials_teach_the_learner(spec):
    """Issue 22 item 6: a trial a user's MedianPruner stopped is a partial measurement (the median of its
    intermediate values), so the model-guided phase stops proposing configurations like it."""
    from primus_optuna.search.learner import observations, trial_measurement

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    for i, v in enumerate([10.0, 30.0, 20.0]):
        trial.report(v, i)
    study.tell(trial, state=State.PRUNED)
    assert trial_measurement(study.trials[0]) == 20.0
    ours = optuna.trial.create_trial(
        state=State.PRUNED, user_attrs={"prune_reason": "memory: ..."}, intermediate_values={0: 5.0}
    )
    assert trial_measurement(ours) is None  # pruned before launch: nothing measured
    space = Space(spec)
    c = space.configs()[0]
    t = optuna.trial.create_trial(
        state=State.PRUNED,
        params=c.to_params(),
        distributions={
            a: optuna.distributions.CategoricalDistribution(space.candidates[a]) for a in space.searched_axes
        },
        intermediate_values={0: 100.0, 1: 120.0},
    )
    assert [(o.config, o.measured) for o in observations(space, [t])] == [(c, 110.0)]


def test_22_6_an_interrupted_python_api_trial_is_re_run_on_resume(spec):
    class Interrupting:
        kind = "fake"
        launches_jobs = False

        def __init__(self) -> None:
            self.calls = 0

        def run(self, config, context):
            from primus_optuna.physics.throughput import estimate_throughput

            self.calls += 1
            if self.calls == 2:
                raise KeyboardInterrupt
            est = estimate_throughput(spec, config)
            return Measurement(est.tokens_per_s_per_gpu, est.step_time_s, "measured")

    runner = Interrupting()
    sampler = PrimusSampler(spec)
    study = _study(spec, sampler)
    with pytest.raises(KeyboardInterrupt):
        study.optimize(make_objective(spec, runner), n_trials=5)
    assert (
        study.trials[1].state == State.FAIL and study.trials[1].user_attrs["failure_reason"] == "interrupted"
    )
    study.optimize(make_objective(spec, runner), n_trials=1)  # resume
    rerun = study.trials[2]
    assert (
        rerun.user_attrs["retry_of"] == 1
        and rerun.user_attrs["config_key"] == study.trials[1].user_attrs["config_key"]
    )
    assert rerun.state == State.COMPLETE
