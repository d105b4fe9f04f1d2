"""Calibration from measured trials: communication per collective term where the trials identify it."""

from __future__ import annotations

import pytest

from primus_optuna.physics.calibration import TERM_GROUPS, Calibration, fit_columns
from primus_optuna.physics.throughput import estimate_throughput
from tests.physics.test_throughput import FLAG, FLAG_SPACE, sample

COMM = TERM_GROUPS["communication"]


def _pairs(ests, truth: dict[str, float]):
    """(estimate, measured tokens/s/GPU) where each term of ``truth`` is that many times slower."""
    out = []
    for e in ests:
        true_step = e.step_time_s + sum(e.breakdown_s[t] * (f - 1) for t, f in truth.items())
        out.append((e, e.tokens_per_s_per_gpu * e.step_time_s / true_step))
    return out


def _rows(pairs):
    return [(dict(e.breakdown_s), e.step_time_s * e.tokens_per_s_per_gpu / m) for e, m in pairs]


def test_a_slow_all_to_all_is_told_apart_from_the_other_collectives():
    ests = [estimate_throughput(FLAG, c) for c in sample(FLAG_SPACE, 40, seed=2)]
    pairs = _pairs(ests, {"ep_comm": 3.0})
    assert "ep_comm" in fit_columns(_rows(pairs))
    cal = Calibration.fit(pairs, ridge=1e-4)
    assert cal.factor("ep_comm") > 2.4
    assert cal.factor("tp_comm") == pytest.approx(1.0, abs=0.15)
    assert cal.factor("compute_mlp") == pytest.approx(1.0, abs=0.05)


def test_without_variation_communication_stays_pooled():
    # one configuration measured eight times: every term's share is the same, nothing tells them apart
    one = estimate_throughput(FLAG, sample(FLAG_SPACE, 1, seed=3)[0])
    pairs = _pairs([one] * 8, {"ep_comm": 2.0})
    assert set(fit_columns(_rows(pairs))) == {"compute", "pipeline_bubble", "communication"}
    cal = Calibration.fit(pairs)
    assert len({cal.factor(t) for t in COMM}) == 1
    # and too few trials per multiplier: pooled too
    few = [estimate_throughput(FLAG, c) for c in sample(FLAG_SPACE, 5, seed=4)]
    assert "communication" in fit_columns(_rows(_pairs(few, {"ep_comm": 3.0})))
    assert not set(COMM) & set(fit_columns(_rows(_pairs(few, {"ep_comm": 3.0}))))
