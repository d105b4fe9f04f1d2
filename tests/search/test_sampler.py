import subprocess
import sys
import time
import zlib
from pathlib import Path

import optuna
import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.record.storage import open_study
from primus_optuna.run.base import RunFailure
from primus_optuna.run.objective import make_objective
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.search.sampler import PrimusSampler
from tests.conftest import ROOT, small_moe_study

optuna.logging.set_verbosity(optuna.logging.WARNING)
WORKER = Path(__file__).with_name("worker.py")
State = optuna.trial.TrialState


SHORT = {
    "sweep_order": ["mbs", "recompute", "moe_dispatcher"],
    "sweep_trials": 7,
    "axes": {"recompute": ["none", "selective:moe", "full"]},
}  # a 7-point sweep keeps the storage tests short


@pytest.fixture
def spec():
    return StudySpec.from_dict(small_moe_study())


@pytest.fixture
def short():
    return StudySpec.from_dict(small_moe_study(**SHORT))


def _run(spec, url, n):
    handle = open_study(spec, storage=url, pruner=MemoryPrefilterPruner(), heartbeat_interval=None)
    handle.study.sampler = PrimusSampler(spec)
    handle.study.optimize(make_objective(spec, runs_dir=handle.runs_dir), n_trials=n, catch=(RunFailure,))
    return handle.study


def _keys(study, states=None):
    return [t.user_attrs["config_key"] for t in study.get_trials(deepcopy=False, states=states)]


def _no_repeats(study):
    done = _keys(study, (State.COMPLETE,))
    assert len(done) == len(set(done))


def test_plain_optuna_study_sweeps_then_falls_back(spec):
    sampler = PrimusSampler(spec)
    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(make_objective(spec), n_trials=len(sampler.plan) + 4)
    trials = study.trials
    plan = sampler.plan
    for t, p in zip(trials, plan, strict=False):
        assert t.user_attrs["phase"] == "sweep" and t.user_attrs["config_key"] == p.config.key()
        assert t.user_attrs["sweep_index"] == p.index and t.user_attrs["rationale"] == p.rationale
    tail = trials[len(plan) :]
    assert [t.user_attrs["phase"] for t in tail] == ["fallback"] * 4
    for t in trials:
        assert {"proposer", "rationale", "estimate_tokens_per_s_per_gpu", "memory_peak_gib"} <= set(
            t.user_attrs
        )
    assert all(t.state == State.COMPLETE for t in tail)  # the fallback only proposes feasible configurations
    _no_repeats(study)
    assert len(set(_keys(study))) == len(trials)


def test_resume_on_reopened_storage_continues_the_same_sequence(short, tmp_path):
    spec = short
    assert len(PrimusSampler(spec).plan) == 7
    full = _run(spec, f"sqlite:///{tmp_path / 'full.db'}", 14)
    url = f"sqlite:///{tmp_path / 'parts.db'}"
    _run(spec, url, 4)  # inside the sweep
    _run(spec, url, 6)  # across the end of the sweep
    resumed = _run(spec, url, 4)  # fallback
    assert _keys(resumed) == _keys(full)
    _no_repeats(resumed)


def test_killed_process_resumes_with_nothing_repeated(short, tmp_path, write_study):
    spec = short
    study_file = write_study(small_moe_study(**SHORT))
    full = _run(spec, f"sqlite:///{tmp_path / 'full.db'}", 10)
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(study_file), url, "10", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -9, proc.stderr
    study = optuna.load_study(study_name=spec.name, storage=url)
    running = study.get_trials(states=(State.RUNNING,))
    assert len(running) == 1
    killed_at = running[0].number
    time.sleep(2.2)  # past the grace period: the next optimize fails the stale trial and retries it
    handle = open_study(
        spec, storage=url, pruner=MemoryPrefilterPruner(), heartbeat_interval=1, grace_period=1
    )
    handle.study.sampler = PrimusSampler(spec)
    handle.study.optimize(make_objective(spec, runs_dir=handle.runs_dir), n_trials=10 - killed_at)
    trials = handle.study.trials
    assert trials[killed_at].state == State.FAIL
    retry = trials[killed_at + 1]
    assert retry.system_attrs.get("failed_trial") == killed_at and retry.state == State.COMPLETE
    ok = [t.user_attrs["config_key"] for t in trials if t.state != State.FAIL]
    assert ok == _keys(full)
    _no_repeats(handle.study)


def test_two_processes_on_one_sqlite_study_never_run_a_configuration_twice(short, tmp_path, write_study):
    spec = short
    study_file = write_study(small_moe_study(**SHORT))
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    open_study(spec, storage=url)  # create once so the two workers only load it
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(study_file), url, "10", "0"], cwd=ROOT, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
    study = optuna.load_study(study_name=spec.name, storage=url)
    assert len(study.trials) == 20
    assert not study.get_trials(states=(State.FAIL,))  # no live trial failed as stale and run again
    _no_repeats(study)
    sweep = [t.user_attrs["sweep_index"] for t in study.trials if t.user_attrs.get("phase") == "sweep"]
    assert len(sweep) == len(set(sweep))


def test_threads_never_run_a_configuration_twice(spec):
    study = optuna.create_study(
        direction="maximize", sampler=PrimusSampler(spec), pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(make_objective(spec), n_trials=30, n_jobs=3)
    _no_repeats(study)


def test_pareto_study_returns_a_front():
    spec = StudySpec.from_dict(small_moe_study(objective=["tokens_per_s_per_gpu", "peak_memory_gib"]))
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=PrimusSampler(spec))
    study.optimize(make_objective(spec), n_trials=30)
    front = study.best_trials
    assert front
    for a in front:
        assert len(a.values) == 2
        for b in study.trials:
            if b.state == State.COMPLETE:
                assert not (
                    b.values[0] >= a.values[0] and b.values[1] <= a.values[1] and b.values != a.values
                )
    pruned = [t for t in study.trials if t.state == State.PRUNED]
    assert all(
        str(t.user_attrs["prune_reason"]).split(":")[0] in ("memory", "illegal", "duplicate") for t in pruned
    )
    assert not [t for t in study.trials if t.state == State.FAIL]


def test_exhausted_space_stops_the_study_without_placeholder_trials():
    """Issue 23 item 9: when nothing is left, ``is_exhausted()`` says so and ``optimize`` stops; a trial asked
    anyway (ask/tell, a plain objective) is pruned with the reason and gets no random parameters."""
    spec = StudySpec.from_dict(
        small_moe_study(axes={"tp": [1], "cp": [1], "ep": [4], "mbs": [1], "recompute": ["none", "full"]})
    )
    feasible = [c for c in Space(spec).configs() if estimate_memory(spec, c).fits]
    sampler = PrimusSampler(spec)
    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    assert not sampler.is_exhausted(study)
    n = len(Space(spec).configs()) + 3
    study.optimize(make_objective(spec), n_trials=n)
    done = [t.user_attrs["config_key"] for t in study.trials if t.state == State.COMPLETE]
    assert sorted(done) == sorted(c.key() for c in feasible)  # each feasible configuration exactly once
    assert len(study.trials) < n and sampler.is_exhausted(study)
    assert all(t.params for t in study.trials) and not [t for t in study.trials if t.state == State.FAIL]
    # ask/tell past the end: a plain suggest is pruned with the reason, never a random configuration
    trial = study.ask()
    with pytest.raises(optuna.TrialPruned, match="exhausted"):
        trial.suggest_categorical("tp", [1, 2])
    study.tell(trial, state=State.PRUNED)
    last = study.trials[-1]
    assert not last.params and last.user_attrs["prune_reason"].startswith("exhausted: ")


class _MeasuresEverything:
    """A cluster on which every configuration runs (at the estimate), so nothing fails for memory."""

    kind = "fake"

    def __init__(self, spec):
        from primus_optuna.run.analytical import AnalyticalRunner

        self.inner = AnalyticalRunner(spec)
        self.spec = spec

    def run(self, config, context):
        from primus_optuna.physics.throughput import estimate_throughput
        from primus_optuna.run.base import Measurement

        est = estimate_throughput(self.spec, config)
        return Measurement(est.tokens_per_s_per_gpu, est.step_time_s, "measured")


def test_memory_pruned_configs_come_back_when_the_memory_calibration_says_they_fit():
    spec = StudySpec.from_dict(small_moe_study())
    sampler = PrimusSampler(spec)
    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    objective = make_objective(spec, _MeasuresEverything(spec))
    # the sweep repairs its points to fit: configurations the model rejects come from elsewhere (a user's queue)
    space = sampler.space
    for c in [c for c in space.configs() if not estimate_memory(spec, c).fits][:3]:
        study.enqueue_trial(c.to_params())
    study.optimize(objective, n_trials=len(sampler.plan) + 3)
    from primus_optuna.physics.memory_calibration import MemoryCalibration
    from primus_optuna.search.proposers.base import counts_as_tried as _counts_as_tried

    pruned = [
        t
        for t in study.trials
        if t.state == optuna.trial.TrialState.PRUNED and t.user_attrs["prune_reason"].startswith("memory")
    ]
    assert pruned and all(_counts_as_tried(t, MemoryCalibration()) for t in pruned)
    # measured runs showed peaks at 30% of the model: the memory-pruned sweep points are untried again
    assert not any(_counts_as_tried(t, MemoryCalibration(scale=0.3)) for t in pruned)
    for _ in range(3):  # measured runs whose peaks came in at 30% of the model: the calibration follows
        study.add_trial(
            optuna.trial.create_trial(
                value=1.0, user_attrs={"memory_peak_gib": 100.0, "measured_peak_memory_gib": 30.0}
            )
        )
    before = len(study.trials)
    study.optimize(objective, n_trials=10)
    after = [t for t in study.trials[before:] if t.state == optuna.trial.TrialState.COMPLETE]
    # and the search now runs configurations that only the calibration admits
    assert any(t.user_attrs["memory_peak_gib"] > t.user_attrs["memory_usable_gib"] for t in after)


def test_a_killed_sampling_does_not_hold_back_the_fallback_forever(tmp_path):
    import sqlalchemy as sa

    spec = StudySpec.from_dict(small_moe_study())
    url = f"sqlite:///{tmp_path / 'k.db'}"
    sampler = PrimusSampler(spec, exploration=0.0)
    study = optuna.create_study(
        storage=url, direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(make_objective(spec), n_trials=len(sampler.plan))
    # a trial left RUNNING without params ten minutes ago (its process died while sampling), no heartbeat
    stale = study._storage.create_new_trial(study._study_id)
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(
            sa.text("UPDATE trials SET datetime_start = datetime('now', '-10 minutes') WHERE trial_id = :i"),
            {"i": stale},
        )
    engine.dispose()
    study.optimize(make_objective(spec), n_trials=2)
    picks = [t.user_attrs.get("rationale", "") for t in study.trials[-2:]]
    assert all("untried feasible configurations" in r for r in picks), picks  # both from the fallback


def test_fallback_never_repeats_a_configuration_on_a_study_whose_layers_do_not_divide_evenly():
    # DeepSeek-V3 (61 layers over 16 chunks): the space once held full:4 next to full for the same run; the
    # fallback proposed full:4, suggest_config canonicalised it to the measured full, and the next trial
    # proposed it again (4-23 of 30 trials repeated in scripts/bench_search.py, the search stalled)
    from primus_optuna.physics.throughput import estimate_throughput
    from primus_optuna.search.suggest import suggest_config

    spec = StudySpec.from_yaml(ROOT / "studies/deepseek-v3-mi355x-fp8.yaml")
    space = Space(spec)

    def objective(trial):  # a plain objective: a cluster 0.7-1.3x the model, deterministic per configuration
        config = suggest_config(trial, spec, space)
        if trial.should_prune():
            raise optuna.TrialPruned()
        wobble = 0.7 + 0.6 * (zlib.crc32(config.key().encode()) % 1000) / 1000
        return estimate_throughput(spec, config).tokens_per_s_per_gpu * wobble

    study = optuna.create_study(
        direction="maximize", sampler=PrimusSampler(spec, seed=2), pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(objective, n_trials=20)
    keys = [space.canonical(space.make(**t.params)).key() for t in study.trials]
    assert len(keys) == 20 and len(set(keys)) == len(keys)


def test_an_interrupt_while_the_sampler_decides_fails_the_trial(spec, monkeypatch):
    # Ctrl-C lands in study.ask() (the sampler's decision) more often than anywhere else on the analytical
    # runner; Optuna only fails a trial interrupted in the objective, so the sampler must (else it stays RUNNING)
    sampler = PrimusSampler(spec)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(make_objective(spec), n_trials=1)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sampler, "_decide", interrupted)
    with pytest.raises(KeyboardInterrupt):
        study.optimize(make_objective(spec), n_trials=1)
    last = study.trials[-1]
    assert last.state == State.FAIL and last.user_attrs["failure_reason"] == "interrupted"
    assert last.user_attrs["phase"] == "interrupted" and not last.params
    monkeypatch.undo()
    study.optimize(make_objective(spec), n_trials=1)  # the next trial decides afresh
    assert study.trials[-1].state == State.COMPLETE
    assert study.trials[-1].user_attrs["config_key"] != study.trials[0].user_attrs["config_key"]


def test_an_interrupt_while_a_trial_is_recorded_stops_the_study_after_it(spec, monkeypatch):
    # after_trial runs inside Optuna's tell, where optuna 5.0's _run_trial turns a KeyboardInterrupt into an
    # UnboundLocalError and leaves the trial RUNNING: the sampler lets the trial be recorded and stops instead
    sampler = PrimusSampler(spec)
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sampler, "is_exhausted", interrupted)
    study.optimize(make_objective(spec), n_trials=5)
    assert [t.state for t in study.trials] == [State.COMPLETE]
