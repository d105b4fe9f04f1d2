"""The microbenchmarks' budget rules (workloads/microbench.py)."""

from __future__ import annotations

import time

import torch

from primus_optuna.workloads.microbench import ROUNDS, bench_collectives, measure_rounds, spread


def test_spread_puts_the_ends_first_then_midpoints() -> None:
    order = spread(list(range(9)))
    assert order[:3] == [0, 8, 4] and sorted(order) == list(range(9))
    assert spread([1, 2]) == [1, 2]


def test_measure_rounds_keeps_the_first_item_when_the_budget_is_spent() -> None:
    calls = {"a": 0, "b": 0}

    def fn(name: str):
        def call() -> None:
            calls[name] += 1

        return call

    cpu = torch.device("cpu")
    times = measure_rounds([fn("a"), fn("b")], cpu, deadline=time.perf_counter() - 1)
    assert times[0] is not None and times[0] > 0 and times[1] is None and calls["b"] == 0
    times = measure_rounds([fn("a"), fn("b")], cpu, deadline=time.perf_counter() + 0.2)
    assert all(t is not None and t > 0 for t in times)


def test_one_device_has_no_collective_and_says_why() -> None:
    out = bench_collectives(1, "cpu", [1024], 1.0)
    assert out["points"] == [] and set(out["unsupported"]) == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "send_recv",
    }
    assert ROUNDS >= 3
