"""The pipeline simulation's 1F1B and interleaved pass order is Megatron-Core's: on every stage, the
warm-up count from ``get_pp_rank_microbatches`` and the (micro-batch, chunk) of every forward and backward
from ``get_schedule_table``, walked as ``forward_backward_pipelining_with_interleaving`` /
``..._without_interleaving`` walk them (warm-up forwards, then forward ``W + k`` and backward ``k``, then the
remaining backwards); megatron-core from PyPI (the dev extra's pin)."""

from __future__ import annotations

import types

import pytest

from primus_optuna.physics.pipeline import static_sequences

schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")


def _comm(pp: int, rank: int, vpp: int | None) -> types.SimpleNamespace:
    """What ``get_pp_rank_microbatches`` reads of a P2PCommunicator."""
    group = types.SimpleNamespace(size=lambda: pp, rank=lambda: rank)
    return types.SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)


def _megatron_order(pp: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """(pass, global chunk, micro-batch) in the order Megatron runs them on ``rank``."""
    if v > 1:
        _, _, warm, _ = schedules.get_pp_rank_microbatches(m, v, pp, p2p_communicator=_comm(pp, rank, v))
        table = schedules.get_schedule_table(m, v, pp)
    else:
        warm = min(pp - rank - 1, m)  # forward_backward_pipelining_without_interleaving
        table = [(i, 0) for i in range(m)]

    def fwd(j: int) -> tuple[str, int, int]:
        mb, ck = table[j]
        return ("F", ck * pp + rank, mb)

    def bwd(j: int) -> tuple[str, int, int]:
        mb, ck = table[j]
        return ("B", (v - 1 - ck) * pp + rank, mb)  # get_model_chunk_id(forward=False)

    total = len(table)
    order = [fwd(j) for j in range(warm)]
    for k in range(total - warm):
        order += [fwd(warm + k), bwd(k)]
    return order + [bwd(j) for j in range(total - warm, total)]


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("v", [1, 2, 3, 7])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_static_order_is_megatrons(pp: int, v: int, groups: int) -> None:
    m = pp * groups if v > 1 else pp * groups + 1  # interleaving needs m a multiple of pp; 1F1B does not
    schedule = "interleaved" if v > 1 else "1f1b"
    nvm = pp * v * m
    seqs = static_sequences(schedule, pp, v, m)
    for rank in range(pp):
        ours = [
            ("F", op // m, op % m) if op < nvm else ("B", (op - nvm) // m, (op - nvm) % m)
            for op in seqs[rank]
        ]
        assert ours == _megatron_order(pp, v, m, rank), (pp, v, m, rank)
