"""The report agrees with the measurements: measured peak first, calibrated sensitivity, GPU-hours not
counted twice, an executive summary first, TFLOP/s and the MFU denominator named, pruned trials not at 0."""

from __future__ import annotations

import dataclasses

import pytest

from primus_optuna.record.report import load_record, render
from primus_optuna.record.report.analysis import gpu_hours_saved, mfu_denominator, tflops_per_gpu
from tests.helpers.recorded_study import make_study


@pytest.fixture
def rec(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    make_study(url)
    return load_record(url, "small")


def test_summary_opens_the_report_and_names_the_mfu_peak(rec):
    md = render(rec).markdown()
    first = md.split("## ")[1]
    assert first.startswith("1. Executive summary")
    assert "**Best configuration**: trial 5" in first and "measured): +15.6%" in first
    assert (
        "9 trials — 6 complete, 2 pruned, 1 failed; 7 launched (1 of them failed, 0 stopped early)" in first
    )
    assert "GPU-hours" in first
    name, peak = mfu_denominator(rec)
    assert (name, peak) == ("BF16", 989)  # a bf16 study on H200
    tf = tflops_per_gpu(rec, 5200.0)
    assert f"{tf:,.0f} TFLOP/s/GPU, MFU {tf / peak:.1%} of the dense BF16 peak 989 TFLOP/s" in md


def test_measured_peak_memory_is_the_result_with_the_estimate_beside_it(rec):
    best = rec.best
    best.attrs["measured_peak_memory_gib"] = 97.25
    md = render(rec).markdown()
    assert "peak memory 97.25 GiB measured (estimate 100.00 GiB)" in md


def test_peak_memory_cells_say_estimated_or_measured(rec):
    """No bare memory figure in a table: a trial's peak is ``X measured`` or ``X est.``; the pruned and the
    sensitivity tables, estimates throughout, say so in their header."""
    best = rec.best
    best.attrs["measured_peak_memory_gib"] = 97.25
    md = render(rec).markdown()
    trials = md.split("All trials", 1)[1]
    rows = [r for r in trials.splitlines() if r.startswith("| ") and r[2:3].isdigit()]
    assert rows and all(" measured |" in r or " est. |" in r or "| - |" in r for r in rows), rows
    assert any("| 97.25 measured |" in r for r in rows)
    assert md.count("| est. peak GiB |") == 2  # pruned before launch, sensitivity


def test_sensitivity_uses_the_study_calibration_and_says_so(rec):
    from primus_optuna.physics.calibration import Calibration
    from primus_optuna.record.report.analysis import sensitivity

    plain, _ = sensitivity(rec, rec.best.config)
    cal = Calibration(multipliers={"compute": 1.5}, scale=0.8, n_trials=6)
    calibrated, _ = sensitivity(rec, rec.best.config, cal)
    assert [r.get("tokens") for r in plain] != [r.get("tokens") for r in calibrated]
    rec.user_attrs["calibration"] = cal.to_dict()
    md = render(rec).markdown()
    assert "estimated with the study's calibration" in md
    rec.user_attrs.pop("calibration")
    assert "±1 candidate step from the best, analytical)" in render(rec).markdown()


def test_reoffered_configuration_is_not_counted_as_gpu_hours_not_spent(rec):
    hours, counted = gpu_hours_saved(rec)
    assert counted == 1 and hours > 0
    pruned = next(
        t
        for t in rec.trials
        if t.state == "PRUNED"
        and t.attr(
            "prune_reason",
        ).startswith("memory")
    )
    # the memory calibration later showed it fits and it was launched: nothing was saved
    rec.trials.append(dataclasses.replace(pruned, number=99, state="COMPLETE", values=[4000.0]))
    assert gpu_hours_saved(rec) == (0.0, 0)


def test_repeated_measurements_show_their_spread(rec):
    best = rec.best
    best.attrs.update(measured_repeats=[5100.0, 5200.0, 5350.0], measured_spread=0.048)
    md = render(rec).markdown()
    assert "Measured 3 times (5100.0, 5200.0, 5350.0 tokens/s/GPU): the value is the median" in md
    assert "spread (max − min) / median +4.8%" in md
