"""The optimised :func:`simulate` reproduces the straightforward simulation exactly (makespan, busy times,
sends and critical-path coefficients), on every schedule, including the ties that quantised durations make
common (durations on the 1/50 grid that :func:`pipeline_timing` simulates)."""

from __future__ import annotations

import random

import pytest

from primus_optuna.physics import pipeline
from tests.physics.pipeline_reference import simulate_reference


def _cases(seed: int, n: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sch = rng.choice(["1f1b", "interleaved", "zb1p", "zbv"])
        pp = rng.choice([2, 3, 4, 8])
        vpp = rng.choice([2, 3, 4, 7]) if sch == "interleaved" else (2 if sch == "zbv" else 1)
        m = rng.randint(1, 3 * pp)
        zb = sch in ("zb1p", "zbv")

        def q() -> float:
            return rng.randint(0, 30) / 50

        out.append(
            (
                sch,
                pp,
                vpp,
                m,
                q(),
                q(),
                q() if zb else 0.0,
                rng.randint(0, 5) / 50,
                q(),
                q(),
                q() if zb else 0.0,
            )
        )
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simulate_equals_reference(seed: int) -> None:
    for args in _cases(seed, 80):
        makespan, busy, sends = pipeline.simulate(*args)
        assert (makespan, busy, sends, pipeline.CRITICAL[0]) == simulate_reference(*args), args


def test_simulate_equals_reference_on_large_pipelines() -> None:
    for args in (
        ("interleaved", 8, 7, 24, 0.2, 0.56, 0.0, 0.02, 0.04, 0.1, 0.0),
        ("1f1b", 16, 1, 48, 0.3, 0.6, 0.0, 0.04, 0.1, 0.2, 0.0),
        ("zb1p", 16, 1, 48, 0.3, 0.3, 0.3, 0.04, 0.1, 0.1, 0.1),
        ("zbv", 8, 2, 24, 0.3, 0.3, 0.3, 0.02, 0.1, 0.1, 0.1),
    ):
        makespan, busy, sends = pipeline.simulate(*args)
        assert (makespan, busy, sends, pipeline.CRITICAL[0]) == simulate_reference(*args), args


@pytest.mark.parametrize("seed", [0, 1])
def test_replayed_simulations_equal_reference(seed: int) -> None:
    """1F1B and interleaved simulations of one shape in a row, as a plan makes them (durations near one
    another, ties common): those answered by replaying the shape's previous order still equal the reference,
    and the replay is taken."""
    rng = random.Random(seed)
    before = pipeline.REPLAYED[0]
    pipeline._shape.cache_clear()
    for sch, pp, vpp, m in (
        ("1f1b", 4, 1, 12),
        ("1f1b", 8, 1, 24),
        ("interleaved", 2, 4, 6),
        ("interleaved", 4, 2, 12),
    ):
        for _ in range(25):
            f, b = rng.choice([0.2, 0.22, 0.24, 0.3]), rng.choice([0.4, 0.44, 0.56, 0.6])
            c, fl, bl = (
                rng.choice([0.0, 0.02, 0.04, 0.06]),
                rng.choice([0.0, 0.02, 0.06]),
                rng.choice([0.0, 0.04, 0.1]),
            )
            args = (sch, pp, vpp, m, f, b, 0.0, c, fl, bl, 0.0)
            makespan, busy, sends = pipeline.simulate(*args)
            assert (makespan, busy, sends, pipeline.CRITICAL[0]) == simulate_reference(*args), args
    assert pipeline.REPLAYED[0] - before > 30
