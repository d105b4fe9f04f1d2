"""The optimised :func:`simulate` reproduces the straightforward simulations exactly (makespan, busy times,
sends and critical-path coefficients): Megatron's fixed order for 1F1B and interleaved, the greedy event
simulation for the zero-bubble schedules, including the ties that quantised durations make common (durations
on the 1/50 grid that :func:`pipeline_timing` simulates)."""

from __future__ import annotations

import random

import pytest

from primus_optuna.physics import pipeline
from tests.physics.pipeline_reference import simulate_reference, static_reference


def _cases(seed: int, n: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sch = rng.choice(["1f1b", "interleaved", "zb1p", "zbv"])
        pp = rng.choice([2, 3, 4, 8])
        vpp = rng.choice([2, 3, 4, 7]) if sch == "interleaved" else (2 if sch == "zbv" else 1)
        # interleaving needs m a multiple of pp (Megatron refuses others)
        m = pp * rng.randint(1, 3) if sch == "interleaved" else rng.randint(1, 3 * pp)
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


def _uniform(*args) -> tuple:
    """:func:`pipeline.simulate` and its critical path as the reference counts it: coefficients of (f, b, w, c,
    f_last, b_last, w_last), from :func:`pipeline.simulate_chunks` with every chunk alike but the last."""
    sch, pp, vpp, m, f, b, w, c, fl, bl, wl = args
    nv = pipeline.n_virtual(sch, pp, 2 if sch == "zbv" else (vpp if sch == "interleaved" else 1))
    fs, bs, ws = [f] * nv, [b] * nv, [w] * nv
    fs[-1], bs[-1], ws[-1] = f + fl, b + bl, w + wl
    _, _, _, (cf, cb, cw, cc) = pipeline.simulate_chunks(sch, pp, vpp, m, fs, bs, ws, c)
    makespan, busy, sends = pipeline.simulate(*args)
    return makespan, busy, sends, (sum(cf), sum(cb), sum(cw), cc, cf[-1], cb[-1], cw[-1])


def _reference(*args: object, **kwargs: object) -> tuple:
    if args[0] in ("1f1b", "interleaved"):
        return static_reference(*args, **kwargs)
    return simulate_reference(*args, **kwargs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simulate_equals_reference(seed: int) -> None:
    for args in _cases(seed, 80):
        assert _uniform(*args) == _reference(*args), args


def test_simulate_equals_reference_on_large_pipelines() -> None:
    for args in (
        ("interleaved", 8, 7, 24, 0.2, 0.56, 0.0, 0.02, 0.04, 0.1, 0.0),
        ("1f1b", 16, 1, 48, 0.3, 0.6, 0.0, 0.04, 0.1, 0.2, 0.0),
        ("zb1p", 16, 1, 48, 0.3, 0.3, 0.3, 0.04, 0.1, 0.1, 0.1),
        ("zbv", 8, 2, 24, 0.3, 0.3, 0.3, 0.02, 0.1, 0.1, 0.1),
    ):
        assert _uniform(*args) == _reference(*args), args


def test_interleaved_refuses_micro_batches_not_a_multiple_of_pp() -> None:
    with pytest.raises(ValueError, match="multiple of pp=4"):
        pipeline.simulate("interleaved", 4, 2, 6, 1.0, 2.0, 0.0, 0.1)


def test_fixed_order_and_greedy_agree_at_uniform_stages() -> None:
    """With every chunk alike the greedy choice is Megatron's order: the textbook bubbles either way."""
    for sch, pp, vpp, m in (
        ("1f1b", 4, 1, 12),
        ("1f1b", 8, 1, 24),
        ("interleaved", 4, 2, 12),
        ("interleaved", 8, 7, 24),
    ):
        args = (sch, pp, vpp, m, 0.3, 0.6, 0.0, 0.02)
        assert pipeline.simulate(*args)[0] == pytest.approx(simulate_reference(*args)[0], rel=1e-12), args


@pytest.mark.parametrize("seed", [0, 1])
def test_simulate_chunks_equals_reference_with_a_duration_per_chunk(seed: int) -> None:
    """Chunks of different durations (uneven layouts): the same makespan, busy times and sends as the
    reference given those durations, and the critical path it reports adds up to the makespan."""
    rng = random.Random(seed)
    for args in _cases(seed + 10, 60):
        sch, pp, vpp, m, *_ = args
        c = args[7]
        v = 2 if sch == "zbv" else (vpp if sch == "interleaved" else 1)
        nv = pp * v
        zb = sch in ("zb1p", "zbv")
        fs = [rng.randint(1, 30) / 50 for _ in range(nv)]
        bs = [rng.randint(1, 30) / 50 for _ in range(nv)]
        ws = [rng.randint(1, 30) / 50 if zb else 0.0 for _ in range(nv)]
        makespan, busy, sends, (cf, cb, cw, cc) = pipeline.simulate_chunks(sch, pp, vpp, m, fs, bs, ws, c)
        ref = _reference(*args[:8], per_chunk=(fs, bs, ws))
        assert (makespan, busy, sends) == tuple(ref[:3]), args
        path = sum(n * d for n, d in zip(cf + cb + cw, fs + bs + ws, strict=True)) + cc * c
        assert path == pytest.approx(makespan), args
