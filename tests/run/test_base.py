"""How a trial's value is named for a user, by the runner's ``source``."""

from __future__ import annotations

from primus_optuna.run.base import value_kind


def test_value_kind_names_estimates_projections_and_measurements():
    assert value_kind("analytical") == "estimated"
    assert value_kind("profiled") == "projected"  # a single-device profile extrapolated: not a measurement
    assert value_kind("measured") == "measured"
    assert value_kind(None) is None
