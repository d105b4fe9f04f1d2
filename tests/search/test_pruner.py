"""MemoryPrefilterPruner and prune_if_infeasible on real in-memory Optuna studies."""

import re

import optuna
import pytest

from primus_optuna.physics import estimate_memory
from primus_optuna.physics.memory_calibration import MemoryCalibration
from primus_optuna.search import MemoryPrefilterPruner, config_from_params, prune_if_infeasible
from primus_optuna.search.pruner import memory_attrs
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from tests.conftest import small_moe_study

optuna.logging.set_verbosity(optuna.logging.WARNING)
REASON = re.compile(r"^memory: \d+\.\d GiB on stage \d+ > \d+\.\d GiB usable$")


@pytest.fixture(scope="module")
def setup() -> tuple[StudySpec, Space, list]:
    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    configs = space.configs()
    fits = [c for c in configs if estimate_memory(spec, c).fits]
    not_fits = [c for c in configs if not estimate_memory(spec, c).fits]
    assert fits and not_fits
    return spec, space, fits[::7][:12] + not_fits[::7][:12]


def suggest_all(trial: optuna.Trial, space: Space) -> None:
    for axis, values in space.legal_values().items():
        trial.suggest_categorical(axis, values)


class Recorder(optuna.pruners.BasePruner):
    def __init__(self) -> None:
        self.calls = 0

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        self.calls += 1
        return True


def test_prunes_exactly_the_configs_that_do_not_fit(setup: tuple) -> None:
    spec, space, chosen = setup
    study = optuna.create_study(direction="maximize", pruner=MemoryPrefilterPruner(spec=spec))
    for c in chosen:
        study.enqueue_trial(c.to_params())

    def objective(trial: optuna.Trial) -> float:
        suggest_all(trial, space)
        if trial.should_prune():
            raise optuna.TrialPruned()
        return 1.0

    study.optimize(objective, n_trials=len(chosen))
    for t in study.trials:
        est = estimate_memory(spec, config_from_params(space, t.params))
        pruned = t.state == optuna.trial.TrialState.PRUNED
        assert pruned == (not est.fits)
        assert t.user_attrs["memory_peak_gib"] == pytest.approx(est.peak_gib, abs=1e-3)
        assert t.user_attrs["memory_usable_gib"] == pytest.approx(est.usable_gib, abs=1e-3)
        assert t.user_attrs["memory_peak_stage"] == est.peak_stage
        if pruned:
            assert REASON.match(t.user_attrs["prune_reason"])
        else:
            assert "prune_reason" not in t.user_attrs


def test_later_calls_delegate_to_wrapped_pruner_and_spec_from_study_attr(setup: tuple) -> None:
    spec, space, chosen = setup
    fitting = next(c for c in chosen if estimate_memory(spec, c).fits)
    wrapped = Recorder()
    study = optuna.create_study(direction="maximize", pruner=MemoryPrefilterPruner(wrapped=wrapped))
    study.set_user_attr("primus_spec", spec.to_dict())
    study.enqueue_trial(fitting.to_params())
    seen: list[bool] = []

    def objective(trial: optuna.Trial) -> float:
        suggest_all(trial, space)
        seen.append(trial.should_prune())  # before report: memory check (fits -> False)
        trial.report(1.0, step=0)
        seen.append(trial.should_prune())  # after report: the wrapped pruner decides (True)
        return 1.0

    study.optimize(objective, n_trials=1)
    assert seen == [False, True]
    assert wrapped.calls == 1
    assert "memory_peak_gib" in study.trials[0].user_attrs


def test_params_from_another_sampler_with_missing_axes_use_the_baseline(setup: tuple) -> None:
    spec, space, _ = setup
    c = config_from_params(space, {"mbs": 2, "recompute": "full", "unrelated": 3})
    assert (c.mbs, c.recompute) == (2, "full")
    assert (c.tp, c.pp, c.ep) == (space.baseline.tp, space.baseline.pp, space.baseline.ep)
    assert c.dp and c.num_microbatches


def test_multi_objective_helper(setup: tuple) -> None:
    spec, space, chosen = setup
    study = optuna.create_study(directions=["maximize", "minimize"])
    for c in chosen:
        study.enqueue_trial(c.to_params())

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        suggest_all(trial, space)
        est = prune_if_infeasible(trial, spec)
        return 1.0, est.peak_gib

    study.optimize(objective, n_trials=len(chosen))
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.FAIL not in states
    for t in study.trials:
        est = estimate_memory(spec, config_from_params(space, t.params))
        assert (t.state == optuna.trial.TrialState.PRUNED) == (not est.fits)
        assert t.user_attrs["memory_peak_stage"] == est.peak_stage
        if not est.fits:
            assert t.user_attrs["prune_reason"] == est.reason()


def measured_peak(estimated: float, measured: float) -> optuna.trial.FrozenTrial:
    """A completed trial (of another objective's params) that measured a peak against an estimate."""
    return optuna.trial.create_trial(
        value=1.0,
        user_attrs={"memory_peak_gib": estimated, "measured_peak_memory_gib": measured, "source": "measured"},
    )


def test_the_study_memory_calibration_decides(setup) -> None:
    """A study whose measured peaks came in at half the model (three measured trials: the calibration is
    derived from them) lets an estimated-infeasible configuration through, and a pessimistic one prunes a
    fitting configuration."""
    spec, space, _ = setup
    configs = space.configs()
    over = next(
        c
        for c in configs
        if 1.0 < estimate_memory(spec, c).peak_gib / estimate_memory(spec, c).usable_gib < 1.8
    )
    fit = next(
        c
        for c in configs
        if 0.6 < estimate_memory(spec, c).peak_gib / estimate_memory(spec, c).usable_gib < 1.0
    )
    for scale, config, pruned in ((0.5, over, False), (2.0, fit, True)):
        study = optuna.create_study(direction="maximize", pruner=MemoryPrefilterPruner(spec=spec))
        for _ in range(3):
            study.add_trial(measured_peak(100.0, 100.0 * scale))
        study.enqueue_trial(config.to_params())

        def objective(trial: optuna.Trial) -> float:
            suggest_all(trial, space)
            if trial.should_prune():
                raise optuna.TrialPruned()
            return 1.0

        study.optimize(objective, n_trials=1)
        t = study.trials[-1]
        assert (t.state == optuna.trial.TrialState.PRUNED) is pruned
        est = estimate_memory(spec, config)
        assert t.user_attrs["memory_peak_gib"] == pytest.approx(est.peak_gib, abs=1e-3)
        assert t.user_attrs["memory_peak_calibrated_gib"] == pytest.approx(est.peak_gib * scale, abs=1e-3)
        if pruned:
            assert "calibrated ×2.00 from 3 measured peaks" in t.user_attrs["prune_reason"]


def test_acts_at_the_first_should_prune_even_after_report(setup: tuple) -> None:
    """The usual custom objective reports a step, then asks: a config that does not fit is pruned there,
    before anything else runs; one that fits goes on, and later calls go to the wrapped pruner."""
    spec, space, chosen = setup
    fitting = next(c for c in chosen if estimate_memory(spec, c).fits)
    too_big = next(c for c in chosen if not estimate_memory(spec, c).fits)
    wrapped = Recorder()
    study = optuna.create_study(
        direction="maximize", pruner=MemoryPrefilterPruner(wrapped=wrapped, spec=spec)
    )
    study.enqueue_trial(too_big.to_params())
    study.enqueue_trial(fitting.to_params())
    launched: list[int] = []

    def objective(trial: optuna.Trial) -> float:
        suggest_all(trial, space)
        trial.report(0.0, step=0)  # e.g. a warm-up value reported before the first check
        if trial.should_prune():
            raise optuna.TrialPruned()
        launched.append(trial.number)
        return 1.0

    wrapped_prunes = {"on": False}
    wrapped.prune = lambda study, trial: wrapped_prunes["on"]  # type: ignore[method-assign]
    study.optimize(objective, n_trials=2)
    t0, t1 = study.trials
    assert t0.state == optuna.trial.TrialState.PRUNED and REASON.match(t0.user_attrs["prune_reason"])
    assert t1.state == optuna.trial.TrialState.COMPLETE and launched == [1]


def test_the_learned_reserve_prunes_what_fits_allocated_but_not_reserved(setup) -> None:
    """Three measured runs whose reserved peak (Megatron's ``max reserved``) lay R GiB above the allocated one:
    a configuration whose allocated estimate fits the usable memory but whose reserved estimate (+R) exceeds
    the device is pruned, and the reason says so; without the reserved peaks it runs."""
    spec, space, _ = setup
    config = next(
        c
        for c in space.configs()
        if 0.8 < estimate_memory(spec, c).peak_gib / estimate_memory(spec, c).usable_gib < 1.0
    )
    est = estimate_memory(spec, config)
    reserve = est.capacity_gib - est.peak_gib + 2.0  # the allocated estimate fits, +reserve does not
    for with_reserve, pruned in ((False, False), (True, True)):
        study = optuna.create_study(direction="maximize", pruner=MemoryPrefilterPruner(spec=spec))
        for _ in range(3):
            t = measured_peak(100.0, 100.0)
            if with_reserve:
                t.user_attrs["measured_reserved_memory_gib"] = 100.0 + reserve
            study.add_trial(t)
        study.enqueue_trial(config.to_params())

        def objective(trial: optuna.Trial) -> float:
            suggest_all(trial, space)
            if trial.should_prune():
                raise optuna.TrialPruned()
            return 1.0

        study.optimize(objective, n_trials=1)
        last = study.trials[-1]
        assert (last.state == optuna.trial.TrialState.PRUNED) is pruned
        if pruned:
            assert last.user_attrs["memory_peak_calibrated_gib"] == pytest.approx(est.peak_gib, abs=1e-3)
            assert last.user_attrs["memory_reserved_calibrated_gib"] == pytest.approx(
                est.peak_gib + reserve, abs=1e-3
            )
            assert "reserved" in last.user_attrs["prune_reason"]
            assert "from 3 reserved peaks" in last.user_attrs["prune_reason"]


class _OomThenMeasure:
    """A launching runner stand-in: the configurations in ``oom`` run out of memory, the others are measured."""

    kind = "fake"
    launches_jobs = False

    def __init__(self, spec: StudySpec, oom: set) -> None:
        self.spec, self.oom = spec, oom

    def run(self, config, context):
        from primus_optuna.physics.throughput import estimate_throughput
        from primus_optuna.run.base import Measurement, OutOfMemory

        if config in self.oom:
            raise OutOfMemory("HIP out of memory")
        est = estimate_throughput(self.spec, config)
        return Measurement(est.tokens_per_s_per_gpu, est.step_time_s, "measured")


def test_a_configuration_as_large_as_one_that_ran_out_of_memory_is_not_launched(setup: tuple) -> None:
    """Issue 39 item 9: an out-of-memory run estimated well under the device (its bound is no evidence about
    the memory model, so the scale stays 1) still closes every configuration estimated at least as large,
    unless a measured run at least as large completed; smaller ones still launch."""
    from primus_optuna.run.base import RunFailure
    from primus_optuna.run.objective import make_objective
    from primus_optuna.search.calibrations import study_calibrations
    from primus_optuna.search.sampler import PrimusSampler

    spec, space, _ = setup
    fits = sorted(
        (c for c in space.configs() if estimate_memory(spec, c).fits),
        key=lambda c: estimate_memory(spec, c).peak_gib,
    )
    hbm = spec.cluster.gpu.hbm_gib
    small = [c for c in fits if estimate_memory(spec, c).peak_gib < hbm / 1.5]
    oom, smaller, larger = small[len(small) // 2], small[0], fits[-1]
    peak = {c: estimate_memory(spec, c).peak_gib for c in (oom, smaller, larger)}
    assert peak[smaller] < peak[oom] < peak[larger]

    def run(*configs, measured_larger: bool = False) -> list[optuna.trial.FrozenTrial]:
        study = optuna.create_study(
            direction="maximize", sampler=PrimusSampler(spec), pruner=MemoryPrefilterPruner(spec=spec)
        )
        if measured_larger:  # a run estimated at least as large completed with a measurement
            params = larger.to_params()
            study.add_trial(
                optuna.trial.create_trial(
                    params=params,
                    distributions={
                        a: optuna.distributions.CategoricalDistribution(v)
                        for a, v in space.legal_values().items()
                        if a in params
                    },
                    value=1.0,
                    user_attrs={"memory_peak_gib": peak[larger], "source": "measured"},
                )
            )
        for c in configs:
            study.enqueue_trial(c.to_params())
        study.optimize(
            make_objective(spec, _OomThenMeasure(spec, {oom})), n_trials=len(configs), catch=(RunFailure,)
        )
        assert study_calibrations(study, spec).memory.scale == 1.0  # the OOM's bound is no evidence here
        return study.trials[-len(configs) :]

    first, big, little = run(oom, larger, smaller)
    assert first.user_attrs["failure_reason"] == "oom"
    assert big.state == optuna.trial.TrialState.PRUNED and "source" not in big.user_attrs
    assert (
        big.user_attrs["prune_reason"].startswith("memory: estimated")
        and "ran out of memory" in big.user_attrs["prune_reason"]
    )
    assert little.state == optuna.trial.TrialState.COMPLETE
    # a measurement says otherwise: the larger configuration completed before, so a like one launches
    one_larger = next(c for c in reversed(fits[:-1]) if estimate_memory(spec, c).peak_gib > peak[oom])
    _, again = run(oom, one_larger, measured_larger=True)
    assert again.state == optuna.trial.TrialState.COMPLETE


def past_the_margin(spec: StudySpec, space: Space):
    """A configuration whose estimated peak lies between the usable memory and the device's capacity."""
    for c in space.configs():
        est = estimate_memory(spec, c)
        if est.usable_gib < est.peak_gib < est.capacity_gib - 1.0:
            return c
    raise AssertionError("no configuration past the safety margin")


def test_a_learned_reserve_admits_past_the_safety_margin_and_says_why_it_refuses(setup) -> None:
    """With a learned reserve the reserved estimate against the device decides: a configuration whose peak lies
    between the usable memory and the capacity runs when peak + reserve fits (the margin is not stacked on
    the reserve), and a refusal names the reserved estimate, not the usable memory."""
    spec, space, _ = setup
    config = past_the_margin(spec, space)
    est = estimate_memory(spec, config)
    gap = est.capacity_gib - est.peak_gib
    fits, attrs = memory_attrs(est, MemoryCalibration(reserve_gib=gap / 2, n_reserve=3))
    assert fits and "prune_reason" not in attrs
    fits, attrs = memory_attrs(est, MemoryCalibration(reserve_gib=gap * 2, n_reserve=3))
    assert not fits and "reserved" in attrs["prune_reason"] and "usable" not in attrs["prune_reason"]


def test_prune_if_infeasible_constrains_on_the_reserved_estimate_once_a_reserve_is_learned(setup) -> None:
    """The trial constraint follows the gate: with a learned reserve it is reserved estimate − capacity, so a
    configuration past the usable memory that the gate admits is feasible for constrained samplers too."""
    spec, space, _ = setup
    config = past_the_margin(spec, space)
    est = estimate_memory(spec, config)
    reserve = (est.capacity_gib - est.peak_gib) / 2
    study = optuna.create_study(direction="maximize")
    for _ in range(3):
        t = measured_peak(100.0, 100.0)
        t.user_attrs["measured_reserved_memory_gib"] = 100.0 + reserve
        study.add_trial(t)
    study.enqueue_trial(config.to_params())

    def objective(trial: optuna.Trial) -> float:
        suggest_all(trial, space)
        prune_if_infeasible(trial, spec)
        return 1.0

    study.optimize(objective, n_trials=1)
    last = study.trials[-1]
    assert last.state == optuna.trial.TrialState.COMPLETE
    constraint = study._storage.get_trial_system_attrs(last._trial_id)["constraints:memory_gib"]
    assert constraint == pytest.approx(est.peak_gib + reserve - est.capacity_gib, abs=1e-2)
