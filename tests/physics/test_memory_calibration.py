import pytest

from primus_optuna import Space, StudySpec, estimate_memory
from primus_optuna.physics.memory_calibration import COMPARABLE, MAX_OOM_BOUND, MemoryCalibration
from tests.conftest import small_moe_study


def test_identity_and_round_trip():
    assert MemoryCalibration().is_identity and MemoryCalibration.fit([]).is_identity
    cal = MemoryCalibration.fit([0.8, 0.7, 0.9], [])
    assert cal.scale == pytest.approx(0.8) and cal.n_trials == 3
    assert MemoryCalibration.from_dict(cal.to_dict()) == cal


def test_an_out_of_memory_run_is_a_lower_bound():
    # runs measured at 0.7-0.8 of the model, but one config estimated at 250 GiB ran out of a 288 GiB device
    cal = MemoryCalibration.fit([0.7, 0.8], [288 / 250])
    assert cal.scale == pytest.approx(288 / 250) and cal.n_oom == 1
    assert "1 out-of-memory run" in cal.describe()


def test_incomparable_measurements_are_discarded_not_clamped():
    # host RSS against HBM (0.01) or a peak far above the device (50x): no evidence about the model
    assert MemoryCalibration.fit([0.01]).is_identity and MemoryCalibration.fit([50.0]).is_identity
    assert MemoryCalibration.fit([0.01, 0.8, 0.9]).scale == pytest.approx(0.85) and COMPARABLE[0] <= 0.85
    # an OOM of a configuration estimated at under 2/3 of the device does not close the space
    assert MemoryCalibration.fit([0.8], [MAX_OOM_BOUND * 1.5]).scale == 0.8


def test_apply_compares_the_calibrated_peak_with_usable_memory():
    spec = StudySpec.from_dict(small_moe_study())
    est = next(estimate_memory(spec, c) for c in Space(spec).configs() if not estimate_memory(spec, c).fits)
    factor = est.usable_gib / est.peak_gib * 0.99  # just enough to fit
    peak, fits = MemoryCalibration(scale=factor).apply(est)
    assert fits and peak == pytest.approx(est.peak_gib * factor)
    assert not MemoryCalibration(scale=1.0).apply(est)[1]


def test_the_reserve_is_learned_from_reserved_peaks_and_gates_against_capacity():
    cal = MemoryCalibration.fit([1.0, 1.0, 1.0], [], reserves=[3.0, 5.0, 4.0])
    assert cal.reserve_gib == pytest.approx(4.0) and cal.n_reserve == 3 and not cal.is_identity
    assert MemoryCalibration.from_dict(cal.to_dict()) == cal
    # a stored calibration of before keeps reading as it was
    assert MemoryCalibration.from_dict({"scale": 0.9, "n_trials": 2, "n_oom": 0}) == MemoryCalibration(
        0.9, 2, 0
    )
    spec = StudySpec.from_dict(small_moe_study())
    est = next(estimate_memory(spec, c) for c in Space(spec).configs() if estimate_memory(spec, c).fits)
    near = est.capacity_gib - est.peak_gib
    assert MemoryCalibration.fit([1.0], [], [near - 0.5]).apply(est)[1]
    assert not MemoryCalibration.fit([1.0], [], [near + 0.5]).apply(est)[1]
    assert MemoryCalibration.fit([1.0], [], [near + 0.5]).reserved(est) == pytest.approx(
        est.capacity_gib + 0.5
    )


def test_with_a_reserve_an_out_of_memory_run_bounds_the_allocated_peak_below_capacity_minus_reserve():
    # a 100 GiB device, a 10 GiB reserve: a run estimated at 95 GiB ran out, so its allocated ratio was at
    # least (100 - 10) / 95, not 100 / 95; the gate then refuses it again through the reserved check
    cal = MemoryCalibration.fit([0.8], [100 / 95], [10.0], capacity_gib=100.0)
    assert cal.scale == pytest.approx(90 / 95)
    assert cal.scale * 95 + cal.reserve_gib == pytest.approx(100.0)
    spec = StudySpec.from_dict(small_moe_study())
    est = next(estimate_memory(spec, c) for c in Space(spec).configs() if estimate_memory(spec, c).fits)
    ran_out = MemoryCalibration.fit([0.8], [est.capacity_gib / est.peak_gib], [10.0], est.capacity_gib)
    assert not ran_out.apply(est)[1]  # the configuration that ran out stays out
    assert MemoryCalibration.fit([0.8], [100 / 95]).scale == pytest.approx(100 / 95)  # without: as before


def test_a_learned_reserve_replaces_the_safety_margin_rather_than_stacking_on_it():
    # a calibrated peak between the usable memory (capacity less the margin) and the capacity: refused on the
    # margin alone; with a measured reserve the reserved estimate against the capacity decides
    spec = StudySpec.from_dict(small_moe_study())
    est = next(estimate_memory(spec, c) for c in Space(spec).configs() if estimate_memory(spec, c).fits)
    scale = (est.usable_gib + est.capacity_gib) / 2 / est.peak_gib
    gap = est.capacity_gib - est.peak_gib * scale
    assert not MemoryCalibration(scale=scale).apply(est)[1]
    assert MemoryCalibration(scale=scale, reserve_gib=gap * 0.5, n_reserve=1).apply(est)[1]
    assert not MemoryCalibration(scale=scale, reserve_gib=gap * 1.5, n_reserve=1).apply(est)[1]
