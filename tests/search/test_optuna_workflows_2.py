"""Issue 39, part 2 of the Optuna workflows: PrimusSampler under PartialFixedSampler, enqueue_trial without or
with axes, a reopened study with an edited study file, Optuna's logging, an objective that never asks for the
configuration, and threads with a slow planner. One test per item (numbered as in the issue); each failed on the
code before the issue. Optuna's own behaviour (optuna 5.1.0, the installed version) is the expected one; the
source line is cited in each test."""

from __future__ import annotations

import logging
import threading
import warnings

import optuna
import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.errors import SpecError
from primus_optuna.run.objective import make_objective
from primus_optuna.search.configs import trial_config
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.search.sampler import PrimusSampler
from primus_optuna.search.state import CONFIG, PROPOSAL
from tests.conftest import small_moe_study

State = optuna.trial.TrialState


@pytest.fixture(scope="module")
def spec() -> StudySpec:
    return StudySpec.from_dict(small_moe_study())


@pytest.fixture(autouse=True)
def _verbosity():
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(before)


def _study(spec, sampler, **kw):
    return optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec), **kw
    )


def _partial_fixed(fixed, base):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.PartialFixedSampler(fixed, base)


def _other_tp(spec) -> int:
    """A legal tp that is not the baseline's (the sweep centre cannot run it)."""
    space = Space(spec)
    return next(v for v in space.legal_values()["tp"] if v != space.baseline.tp)


def test_1_primus_sampler_inside_partial_fixed_sampler_decides_with_the_fixed_axis(spec):
    """PartialFixedSampler serves the fixed axis itself and never asks the base sampler for it (optuna 5.1.0
    optuna/samplers/_partial_fixed.py:94-112): PrimusSampler decides with it, each trial a new configuration."""
    tp = _other_tp(spec)
    study = _study(spec, _partial_fixed({"tp": tp}, PrimusSampler(spec, seed=0)))
    study.optimize(make_objective(spec), n_trials=6)
    space = Space(spec)
    configs = [trial_config(space, t) for t in study.trials]
    assert all(c is not None and c.tp == tp for c in configs)
    assert all(t.params["tp"] == tp for t in study.trials)
    assert len(set(configs)) == len(configs)  # no sweep point re-decided, nothing pruned as a duplicate
    assert not [t for t in study.trials if str(t.user_attrs.get("prune_reason", "")).startswith("duplicate")]
    assert all(t.system_attrs[PROPOSAL]["config"]["tp"] == tp for t in study.trials)


def test_1_the_nearest_legal_mapping_never_moves_an_axis_fixed_by_partial_fixed_sampler(spec):
    """TPE inside PartialFixedSampler: the fixed value is what Optuna records (optuna 5.1.0
    optuna/samplers/_partial_fixed.py:100-112), so the configuration run keeps it."""
    tp = _other_tp(spec)
    sampler = _partial_fixed({"tp": tp}, optuna.samplers.TPESampler(seed=3))
    study = _study(spec, sampler)
    study.optimize(make_objective(spec), n_trials=12)
    space = Space(spec)
    mapped = [t for t in study.trials if "primus:mapped" in t.system_attrs]
    assert mapped  # the illegal suggestions were mapped ...
    assert all(
        trial_config(space, t).tp == tp for t in study.trials if trial_config(space, t)
    )  # ... keeping tp


def test_2_an_enqueue_without_axes_records_the_samplers_decision(spec):
    """``enqueue_trial({"lr": ...})`` fixes only ``lr`` (optuna 5.1.0 optuna/trial/_trial.py:613-614): the
    axes are the sampler's to decide, its decision recorded as for any trial (the sweep's centre first)."""
    sampler = PrimusSampler(spec, seed=0)
    study = _study(spec, sampler)
    study.enqueue_trial({"lr": 1e-3})
    run = make_objective(spec)

    def objective(trial):
        trial.suggest_float("lr", 1e-4, 1e-2, log=True)
        return run(trial)

    study.optimize(objective, n_trials=2)
    first, second = study.trials
    assert first.params["lr"] == 1e-3
    assert first.system_attrs[PROPOSAL]["phase"] == "sweep"
    assert trial_config(Space(spec), first) == sampler.plan[0].config
    assert first.user_attrs["phase"] == "sweep" and first.user_attrs["sweep_index"] == 0
    assert trial_config(Space(spec), second) == sampler.plan[1].config


def test_3_a_partial_enqueue_keeps_optunas_fixed_params_so_skip_if_exists_works(spec):
    """``skip_if_exists`` compares the new params with each trial's ``fixed_params`` (optuna 5.1.0
    optuna/study/study.py:1095-1120): the sampler's completion must not rewrite them."""
    tp = _other_tp(spec)
    study = _study(spec, PrimusSampler(spec, seed=0))
    study.enqueue_trial({"tp": tp}, skip_if_exists=True)
    study.optimize(make_objective(spec), n_trials=1)
    study.enqueue_trial({"tp": tp}, skip_if_exists=True)
    assert len(study.trials) == 1
    t = study.trials[0]
    assert t.system_attrs["fixed_params"] == {"tp": tp}
    config = trial_config(Space(spec), t)
    assert config.tp == tp and t.params == config.to_params()  # the other axes from the recorded decision


def _illegal_full(spec) -> dict:
    """A full configuration of legal values that breaks a coupling rule (tp*pp*cp does not divide the world)."""
    space = Space(spec)
    legal = space.legal_values()
    base = space.baseline.to_params()
    for tp in legal["tp"]:
        for pp in legal["pp"]:
            params = {**base, "tp": tp, "pp": pp}
            if space.check(space.canonical(type(space.baseline).from_params(params))):
                return params
    raise AssertionError("no illegal combination of legal values")


def test_4_an_enqueued_illegal_configuration_is_refused_with_a_warning_not_replaced(spec, caplog):
    """Optuna warns about a fixed value outside its distribution instead of running another (optuna 5.1.0
    optuna/trial/_trial.py:633-646); a full configuration Megatron refuses is refused with its reason."""
    params = _illegal_full(spec)
    study = _study(spec, PrimusSampler(spec, seed=0))
    study.enqueue_trial(params)
    with caplog.at_level("WARNING", logger="optuna"):
        study.optimize(make_objective(spec), n_trials=1)
    t = study.trials[0]
    assert t.state == State.PRUNED
    reason = t.user_attrs["prune_reason"]
    assert reason.startswith("illegal: ") and "refused" in reason
    assert CONFIG not in t.system_attrs and "config_key" not in t.user_attrs  # nothing else ran
    warned = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(warned) == 1 and warned[0].name.startswith("optuna.")


def test_5_reopening_a_study_with_an_edited_study_file_is_refused_by_the_sampler(spec, tmp_path):
    """As ``primus-optuna run`` refuses it (record.storage.open_study): the sweep would restart and two
    workloads would mix in one objective."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = _study(spec, PrimusSampler(spec, seed=0), storage=url, study_name="s")
    study.optimize(make_objective(spec), n_trials=1)
    edited = StudySpec.from_dict(
        {**small_moe_study(), "workload": {"seq_length": 8192, "global_batch_size": 32, "precision": "bf16"}}
    )
    again = optuna.load_study(study_name="s", storage=url, sampler=PrimusSampler(edited, seed=0))
    with pytest.raises(SpecError, match="different search space.*workload.seq_length: 4096 -> 8192"):
        again.optimize(make_objective(edited), n_trials=2)
    trials = again.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [State.COMPLETE, State.FAIL]
    assert trials[-1].user_attrs["failure_reason"] == "spec_changed"
    # the same study file resumes
    same = optuna.load_study(study_name="s", storage=url, sampler=PrimusSampler(spec, seed=0))
    same.optimize(make_objective(spec), n_trials=1)
    assert same.trials[-1].state == State.COMPLETE


def test_6_the_samplers_warnings_go_through_optuna_logging_once(spec, recwarn):
    """``optuna.logging.set_verbosity`` sets the level of Optuna's library root logger, which holds the one
    handler and does not propagate (optuna 5.1.0 optuna/logging.py:56-66, 146-166): the sampler's warnings are
    its children's, so the verbosity silences them and they print once."""
    tp = _other_tp(spec)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]

    def run() -> list[str]:
        records.clear()
        study = _study(spec, PrimusSampler(spec, seed=0))
        study.enqueue_trial({"tp": tp})
        study.optimize(make_objective(spec), n_trials=1)
        return [r.getMessage() for r in records if "nearest configuration" in r.getMessage()]

    optuna.logging.get_logger("optuna").addHandler(handler)
    try:
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        assert run() == []
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        assert len(run()) == 1
    finally:
        optuna.logging.get_logger("optuna").removeHandler(handler)
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]  # not a second channel


def test_7_an_objective_that_never_asks_for_the_configuration_is_warned_and_records_no_decision(spec, caplog):
    sampler = PrimusSampler(spec, seed=0)
    study = _study(spec, sampler)
    with caplog.at_level("WARNING", logger="optuna"):
        study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=3)
    warned = [r for r in caplog.records if "suggest_config" in r.getMessage()]
    assert len(warned) == 1
    for t in study.trials:
        assert t.state == State.COMPLETE
        assert not {"config_key", "memory_peak_gib", "phase", "sweep_index"} & set(t.user_attrs)
        assert trial_config(Space(spec), t) is None  # the sweep point was not used up
    # the sampler's next objective that asks runs the sweep's centre, not a later point
    study.optimize(make_objective(spec), n_trials=1)
    assert trial_config(Space(spec), study.trials[-1]) == sampler.plan[0].config
    assert study.trials[-1].user_attrs["config_key"] == sampler.plan[0].config.key()


def test_13_after_trial_never_waits_for_another_threads_decision(spec):
    """Optuna calls ``after_trial`` inside tell, after the trial's heartbeat thread stopped (optuna 5.1.0
    optuna/study/_optimize.py:208-228): waiting there for a planner call held under the decision lock let a
    stale-trial check of another thread fail the finished trial (UpdateFinishedTrialError)."""
    sampler = PrimusSampler(spec, seed=0)
    study = _study(spec, sampler)
    trial = study.ask()
    frozen = study._storage.get_trial(trial._trial_id)
    fresh = PrimusSampler(spec, seed=0)  # its sweep design not computed yet
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def slow_decision():
        with fresh._lock:  # what a planner call in before_trial holds
            held.set()
            release.wait(10)

    holder = threading.Thread(target=slow_decision)
    holder.start()
    held.wait(5)
    teller = threading.Thread(
        target=lambda: (fresh.after_trial(study, frozen, State.COMPLETE, [1.0]), done.set())
    )
    teller.start()
    finished = done.wait(5)
    release.set()
    holder.join()
    teller.join()
    assert finished
