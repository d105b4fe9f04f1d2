"""Pipeline schedule simulation: textbook bubbles, monotonicity, steady state, p2p cost."""

import pytest

from primus_optuna.physics.pipeline import (
    M_CAP_PER_STAGE,
    bubble_fraction,
    chunk_mix,
    mixed_pipeline_timing,
    pipeline_timing,
    simulate,
    simulate_chunks,
    stage_of,
)


def bubble(schedule: str, p: int, v: int, m: int, f: float, b: float, w: float, c: float = 0.0) -> float:
    span, busy, _ = simulate(schedule, p, v, m, f, b, w, c)
    return span - max(busy)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("m", [8, 16, 32])
def test_1f1b_bubble_is_p_minus_1_times_f_plus_b(p: int, m: int) -> None:
    # Narayanan et al. 2021: (p-1)(F+B) with W fused into B
    assert bubble("1f1b", p, 1, m, 1.0, 2.0, 0.0) == pytest.approx((p - 1) * 3.0)


@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_divides_by_v(v: int) -> None:
    p, m = 4, 16
    assert bubble("interleaved", p, v, m, 1.0 / v, 2.0 / v, 0.0) == pytest.approx((p - 1) * 3.0 / v)


def test_zero_bubble_h1_matches_qi_et_al() -> None:
    # ZB-H1 bubble (p-1)(F+B-W) when F = B = W (Qi et al. 2024)
    p, m = 4, 16
    assert bubble("zb1p", p, 1, m, 1.0, 1.0, 1.0) == pytest.approx((p - 1) * 1.0)


def test_schedules_order_at_equal_passes() -> None:
    p, m = 4, 16
    one = bubble("1f1b", p, 1, m, 1.0, 2.0, 0.0)
    zb1 = bubble("zb1p", p, 1, m, 1.0, 1.0, 1.0)
    zbv = bubble("zbv", p, 2, m, 0.5, 0.5, 0.5)
    assert zbv < zb1 < one


@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("interleaved", 2), ("zb1p", 1), ("zbv", 2)])
def test_bubble_fraction_falls_as_m_grows(schedule: str, v: int) -> None:
    p = 4
    fracs = [bubble_fraction(schedule, p, v, m, 1.0 / v, 1.3 / v, 0.7 / v, 0.02) for m in (4, 8, 16, 32, 64)]
    assert all(a > b for a, b in zip(fracs, fracs[1:], strict=False)), fracs


@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("interleaved", 2), ("zb1p", 1), ("zbv", 2)])
def test_capped_simulation_predicts_long_pipelines_within_1pct(schedule: str, v: int) -> None:
    # pipeline_timing simulates at most M_CAP_PER_STAGE * p micro-batches and reuses that bubble for more
    p = 4
    m = 4 * M_CAP_PER_STAGE * p
    f, b, w, c = 1.0 / v, 1.3 / v, 0.9 / v, 0.05
    zb = schedule in ("zb1p", "zbv")
    exact, _, _ = simulate(schedule, p, v, m, f, b, w, c)
    est = pipeline_timing(schedule, p, v, m, f, b if zb else b + w, w if zb else 0.0, c)
    assert est.step == pytest.approx(exact, rel=0.01)


def test_p2p_blocks_the_sender_in_1f1b() -> None:
    free = pipeline_timing("1f1b", 4, 1, 16, 1.0, 2.0, 0.0, 0.0)
    paid = pipeline_timing("1f1b", 4, 1, 16, 1.0, 2.0, 0.0, 0.1)
    assert paid.step > free.step
    assert paid.sends_per_microbatch == 2  # a middle stage sends forward and backward


def test_interleaved_p2p_is_asynchronous() -> None:
    # Megatron-Core schedules.py (forward_backward_pipelining_with_interleaving): with virtual stages
    # overlap_p2p_comm is on by default and sends/receives are posted asynchronously (isend/irecv waited on
    # before the receiver's next use): the transfer delays the receiver, it does not occupy the sender
    free = pipeline_timing("interleaved", 4, 2, 16, 0.5, 1.0, 0.0, 0.0)
    paid = pipeline_timing("interleaved", 4, 2, 16, 0.5, 1.0, 0.0, 0.1)
    assert paid.sends_per_microbatch == 0
    assert paid.busy == pytest.approx(free.busy)  # no stage's work grows
    assert free.step < paid.step  # the critical path still waits for some transfers
    assert paid.transfers == pytest.approx(paid.step - free.step, rel=0.05)
    # and high VPP is no longer penalised by its v-fold traffic: VPP 4 beats VPP 2 with the same sends
    v4 = pipeline_timing("interleaved", 4, 4, 16, 0.25, 0.5, 0.0, 0.1)
    assert v4.step < paid.step


def test_zbv_turn_needs_no_transfer() -> None:
    # V placement: chunks p-1 and p sit on the last stage, chunks 0 and 2p-1 on stage 0
    p = 4
    assert stage_of("zbv", p, p - 1) == stage_of("zbv", p, p) == p - 1
    assert stage_of("zbv", p, 0) == stage_of("zbv", p, 2 * p - 1) == 0


def test_no_pipeline_is_m_passes() -> None:
    t = pipeline_timing("1f1b", 1, 1, 8, 1.0, 2.0, 0.5, 0.3, f_last=0.2)
    assert t.step == pytest.approx(8 * 3.7) and t.bubble == 0.0


def test_timing_scales_with_pass_durations() -> None:
    a = pipeline_timing("interleaved", 4, 2, 16, 1.0, 2.0, 0.0, 0.05)
    b = pipeline_timing("interleaved", 4, 2, 16, 10.0, 20.0, 0.0, 0.5)
    assert b.step == pytest.approx(10 * a.step, rel=1e-6)


def test_heavier_last_stage_sets_the_pace() -> None:
    base = pipeline_timing("1f1b", 4, 1, 32, 1.0, 2.0, 0.0, 0.0)
    heavy = pipeline_timing("1f1b", 4, 1, 32, 1.0, 2.0, 0.0, 0.0, f_last=0.5, b_last=0.5)
    assert heavy.step >= base.step + 32 * 1.0 - 1e-9


def _chunk_durations(counts: tuple, per_kind: tuple) -> list[float]:
    return [sum(n * d for n, d in zip(row, per_kind, strict=True)) for row in counts]


@pytest.mark.parametrize(
    ("schedule", "pp", "v"),
    [("1f1b", 4, 1), ("interleaved", 4, 2), ("zb1p", 4, 1), ("zbv", 4, 2), ("1f1b", 8, 1)],
)
def test_mixed_timing_matches_the_exact_simulation_of_uneven_chunks(schedule: str, pp: int, v: int) -> None:
    """Chunks of different work (a dense-first chunk, a light chunk holding the loss): the memoised timing is
    the exact per-chunk simulation within the 1/50 quantisation, for the simulated and for longer pipelines."""
    nv = pp * v
    # kinds: an MoE layer, a dense layer, the output layer; chunk 0: 3 dense + 1 MoE, the last: 1 MoE + head
    counts = ((1.0, 3.0, 0.0),) + ((4.0, 0.0, 0.0),) * (nv - 2) + ((1.0, 0.0, 2.0),)
    f, b, w, c = (0.31, 0.17, 0.45), (0.52, 0.29, 0.61), (0.2, 0.1, 0.3), 0.03
    zb = schedule in ("zb1p", "zbv")
    mix = chunk_mix(schedule, pp, v, counts)
    for m in (3 * pp, 8 * pp):
        got = mixed_pipeline_timing(mix, m, f, b, w, c)
        exact, busy, _, _ = simulate_chunks(
            schedule,
            pp,
            v,
            m,
            _chunk_durations(counts, f),
            _chunk_durations(counts, b),
            _chunk_durations(counts, w),
            c,
        )
        assert got.step == pytest.approx(exact, rel=0.01 if zb else 0.005), m
        assert got.busy == pytest.approx(max(busy))
        assert busy[got.stage] == pytest.approx(max(busy))


def test_the_stage_with_most_work_sets_the_pace_not_the_one_holding_the_loss() -> None:
    """A last stage of one layer and the output layer is lighter than the middle stages' four layers: the
    steady state is the middle stages', and the step is not the four-layer chunk plus the output layer that
    timing every chunk as the busiest one's would give."""
    pp, m = 8, 64
    layer, head = (1.0, 2.0, 0.0), (1.5, 3.0, 0.0)  # f, b, w per layer / per output layer
    counts = ((4.0, 0.0),) * (pp - 1) + ((1.0, 1.0),)
    t = mixed_pipeline_timing(
        chunk_mix("1f1b", pp, 1, counts), m, (layer[0], head[0]), (layer[1], head[1]), (0.0, 0.0), 0.0
    )
    assert t.stage < pp - 1
    assert t.busy == pytest.approx(m * 4 * 3.0)
    padded = pipeline_timing("1f1b", pp, 1, m, 4 * layer[0], 4 * layer[1], 0.0, 0.0, head[0], head[1])
    assert t.step < padded.step - m * 3.0


def test_uniform_pipeline_timing_is_the_mixed_one_with_alike_chunks() -> None:
    nv = 4 * 3
    counts = ((1.0, 0.0),) * (nv - 1) + ((1.0, 1.0),)
    a = pipeline_timing("interleaved", 4, 3, 24, 0.5, 1.1, 0.0, 0.02, 0.3, 0.4)
    b = mixed_pipeline_timing(
        chunk_mix("interleaved", 4, 3, counts), 24, (0.5, 0.3), (1.1, 0.4), (0.0, 0.0), 0.02
    )
    assert a == b


def test_chunk_mix_refuses_counts_that_do_not_match_the_chunks() -> None:
    with pytest.raises(ValueError, match="3 chunk counts for 8 chunks"):
        chunk_mix("interleaved", 4, 2, ((1.0,),) * 3)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zb1p", "zbv"])
def test_step_lower_bound_is_below_every_step_in_its_range(schedule: str) -> None:
    """:func:`step_lower_bound` of a range of pass durations is at most the step of any durations in it (random
    mixes of kinds, uneven chunks, sends), and beats the busy time where the bubble is large."""
    import random

    from primus_optuna.physics.pipeline import chunk_mix, mixed_pipeline_timing, n_virtual, step_lower_bound

    rng = random.Random(schedule)
    zb = schedule in ("zb1p", "zbv")
    gained = 0
    for _ in range(300):
        pp = rng.choice([2, 3, 4, 8])
        v = 2 if schedule == "zbv" else (rng.choice([2, 3, 4]) if schedule == "interleaved" else 1)
        nv = n_virtual(schedule, pp, v)
        kinds = rng.choice([1, 2])
        counts = tuple(
            (*(float(rng.choice([1, 2, 3, 3])) for _ in range(kinds)), 1.0 if k == nv - 1 else 0.0)
            for k in range(nv)
        )
        mix = chunk_mix(schedule, pp, v, counts)
        m = rng.choice([1, 2, 3, 4, 8, 16]) * (pp if schedule == "interleaved" else 1)
        f_lo = [rng.uniform(0.2, 2.0) for _ in range(kinds + 1)]
        b_lo = [x * rng.uniform(1.0, 3.0) for x in f_lo]
        w_lo = [x * rng.uniform(0.5, 1.2) if zb else 0.0 for x in f_lo]
        widen = [rng.choice([0.0, 0.0, rng.uniform(0.0, 0.6)]) for _ in range(3)]
        hi = tuple([x * (1 + g) for x in d] for d, g in zip((f_lo, b_lo, w_lo), widen, strict=True))
        c = rng.choice([0.0, rng.uniform(0.0, 0.3)])
        bound = step_lower_bound(mix, m, (f_lo, b_lo, w_lo), hi, c)
        for _ in range(3):  # durations inside the range
            t = [
                [lo_ + rng.random() * (h - lo_) for lo_, h in zip(d, dh, strict=True)]
                for d, dh in zip((f_lo, b_lo, w_lo), hi, strict=True)
            ]
            step = mixed_pipeline_timing(mix, m, *t, c).step
            assert bound <= step * (1 + 1e-12), (schedule, pp, v, m, counts)
        gained += bound > mixed_pipeline_timing(mix, m, f_lo, b_lo, w_lo, c).busy * (1 + 1e-9)
    assert gained > 30  # the fill (and drain) count
