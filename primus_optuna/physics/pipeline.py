"""Pipeline schedules as a small discrete-event simulation: 1F1B, interleaved 1F1B, ZB-H1 (``zb1p``), ZB-V.

Each physical stage runs forward (F), input-gradient (B) and weight-gradient (W) passes of its model chunks
for ``m`` micro-batches. A pass may start when its stage is free and its input has arrived:
``F(k, i)`` needs ``F(k−1, i)``; ``B(k, i)`` needs ``B(k+1, i)`` (the last chunk's B needs its own F, which
computes the loss). Sending an activation/gradient to another stage is blocking in Megatron's 1F1B (and the
zero-bubble schedules), so its cost ``c`` is added to the sending pass; in the interleaved schedule
Megatron runs the send/receive asynchronously (``overlap_p2p_comm``, on by default with virtual stages), so
the transfer delays the receiver's dependency by ``c`` and does not occupy the sender (interleaving's ``v×``
extra traffic then costs only where it lies on the critical path).

1F1B and interleaved 1F1B run in Megatron-Core's fixed order (:func:`static_sequences`: warm-up forwards,
then one forward and one backward, then the remaining backwards; a stage whose next pass's input has not
arrived waits), W fused into B. The zero-bubble schedules pick their next pass greedily: a ready B first,
else a ready F if fewer than ``cap`` chunk-micro-batches are in flight, else a pending W. The caps are the
schedules' activation-memory limits:

- ZB-H1: ``p − s`` micro-batches on stage ``s``, 1F1B's (Narayanan et al. 2021; Qi et al. 2024: ZB-H1 has
  1F1B's memory and fills the cool-down bubble with deferred W passes);
- ZB-V: two chunks placed in a V (stage ``s`` holds chunks ``s`` and ``2p−1−s``, so the turn at the last stage
  needs no transfer), ``2p`` chunk-micro-batches per stage (1F1B's peak, Qi et al. 2024 §4).

Chunks may hold different work (:class:`ChunkMix`: a pipeline layout's dense-first layers, a light chunk
holding MTP and the loss, an ``account_for_*_in_pipeline_split`` stage with one layer fewer): each chunk's
passes last as long as the layers and output layers it holds (:func:`mixed_pipeline_timing`), and the busiest
stage is the one with the most work. The result is the step time; the *bubble* is the step time minus the
busiest stage's work. Simulations are memoised on the schedule, ``p``, ``v``, the chunks' mix, a capped ``m``
(the bubble no longer changes once the pipeline has reached its steady state, checked in the tests) and the
pass durations normalised and rounded to 1/50 of the mean chunk's work.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache, reduce
from operator import add
from typing import Any, NamedTuple

M_CAP_PER_STAGE = 3
"""simulate at most ``3·p`` micro-batches (a multiple of p): the bubble is constant beyond (tested)"""
_RES = 50.0


class PipelineTiming(NamedTuple):
    """Times of one step's pipeline part (same unit as the inputs; a named tuple: one is built per estimate)."""

    step: float
    busy: float
    """work of the busiest stage (compute + blocking sends)"""
    bubble: float
    """step − busy"""
    sends_per_microbatch: int
    """blocking sends of the busiest stage per micro-batch"""
    transfers: float = 0.0
    """asynchronous transfers (interleaved) on the critical path, taken out of ``bubble``"""
    stage: int = 0
    """the busiest stage (the one whose work ``busy`` is)"""
    class_work: tuple[float, ...] = ()
    """per class of alike stages (:attr:`ChunkMix.classes`), a stage's work per micro-batch (its chunks' passes
    and blocking sends)"""
    stage_class: tuple[int, ...] = ()
    """per stage, its class"""

    @property
    def stage_work(self) -> tuple[float, ...]:
        """Per stage, its work per micro-batch."""
        return tuple([self.class_work[i] for i in self.stage_class])


def chunks_per_stage(schedule: str, vpp: int) -> int:
    """Model chunks each stage holds under ``schedule``: ZB-V's two (a V), interleaved's ``vpp``, else one."""
    return 2 if schedule == "zbv" else (vpp if schedule == "interleaved" else 1)


def n_virtual(schedule: str, pp: int, vpp: int) -> int:
    return 2 * pp if schedule == "zbv" else pp * vpp


def stage_of(schedule: str, pp: int, k: int) -> int:
    """Physical stage of virtual stage (chunk) ``k``."""
    if schedule == "zbv":
        return k if k < pp else 2 * pp - 1 - k
    return k % pp


def _cap(schedule: str, pp: int, vpp: int, m: int, s: int) -> int:
    """Zero-bubble schedules: the chunk-micro-batches stage ``s`` may hold in flight."""
    if schedule == "zbv":
        return 2 * min(pp, m)
    return min(pp - s, m)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a simulation needs that depends only on (schedule, p, v, m), built once per shape (read-only)."""

    nv: int
    last: int
    nvm: int
    st: list[int]
    chunks: list[list[int]]
    f_orders: list[list[list[int]]]
    b_orders: list[list[list[int]]]
    f_len: list[list[int]]
    b_len: list[list[int]]
    chunk_of: list[int]
    dep_of: list[int]
    queue_of: list[int]
    caps: list[int]
    qcap: list[list[int]]
    feeds: list[set[int]]
    wakes: list[frozenset[int]]
    """per stage: the stages that wait for its passes (``s in feeds[w]``)"""
    remaining: tuple[int, ...]
    f_op: list[int]
    """single-queue schedules: every stage's forward queue end to end (flat pass numbers), each followed by a
    sentinel; ``f_dep`` the finish-time slot each waits for, ``f_start`` where each stage's queue starts"""
    f_dep: list[int]
    f_start: list[int]
    b_op: list[int]
    b_dep: list[int]
    b_start: list[int]
    dep_slot: list[int]
    """per pass: the finish-time slot it waits for (the slot at 0 for the first chunk's forwards)"""
    stage_op: list[int]
    """per pass: its physical stage"""
    seqs: list[list[int]]
    """1F1B, interleaved: each stage's fixed pass order (:func:`static_sequences`; empty for zero-bubble)"""
    static: list[int]
    """1F1B, interleaved: every pass in an order that respects Megatron's fixed per-stage sequences and the
    passes' inputs (:func:`static_sequences`; empty for the zero-bubble schedules)"""
    steps: list[tuple[int, int, int]]
    """1F1B, interleaved: per pass of ``static``, (pass, the finish-time slot of its input, the finish-time slot
    of its stage's previous pass: the slot at 0 for a stage's first pass)"""
    prev_op: list[int]
    """1F1B, interleaved: per pass, its stage's previous pass in ``seqs`` (-1: the stage's first)"""


@lru_cache(maxsize=256)
def _shape(schedule: str, pp: int, v: int, m: int) -> _Shape:
    """Passes are numbered flat: forward ``F(k, i)`` is ``k·m + i``, backward ``B(k, i)`` is
    ``nv·m + k·m + i`` (one table of finish times for both)."""
    zb = schedule in ("zb1p", "zbv")
    zbv = schedule == "zbv"
    asynchronous = schedule == "interleaved"
    nv = n_virtual(schedule, pp, v)
    last = nv - 1
    st = [stage_of(schedule, pp, k) for k in range(nv)]
    chunks = [[k for k in range(nv) if st[k] == s] for s in range(pp)]
    nvm = nv * m
    # forward / backward queues per stage, as flat pass numbers: a fixed list (1F1B, ZB-H1, interleaved) or
    # per-chunk queues (ZB-V forwards; 1F1B, ZB-H1 and ZB-V backwards)
    f_orders: list[list[list[int]]] = []
    b_orders: list[list[list[int]]] = []
    for s in range(pp):
        ks = chunks[s]
        if zbv:
            f_orders.append([[k * m + i for i in range(m)] for k in ks])
        elif asynchronous:
            order = []
            for g0 in range(0, m, pp):
                size = min(pp, m - g0)
                for k in ks:
                    order.extend(k * m + g0 + j for j in range(size))
            f_orders.append([order])
        else:
            f_orders.append([[ks[0] * m + i for i in range(m)]])
        if asynchronous:  # Megatron: same groups of p micro-batches, chunks in reverse
            order = []
            for g0 in range(0, m, pp):
                size = min(pp, m - g0)
                for k in reversed(ks):
                    order.extend(nvm + k * m + g0 + j for j in range(size))
            b_orders.append([order])
        else:
            b_orders.append([[nvm + k * m + i for i in range(m)] for k in ks])
    seqs: list[list[int]] = []
    if not zb:  # Megatron's fixed order (static_sequences)
        for s in range(pp):
            warm = 2 * (pp - s - 1) + (v - 1) * pp if asynchronous else pp - s - 1
            seqs.append(_megatron_sequence(f_orders[s][0], [op for q in b_orders[s] for op in q], warm))
    # per pass: its chunk and the pass it waits for (-1: none)
    chunk_of = [k for k in range(nv) for _ in range(m)] * 2
    dep_of = [-1] * m + list(range(nvm - m)) + list(range(nvm + m, 2 * nvm)) + list(range(last * m, nvm))
    queue_of = [0] * nv
    if zbv:
        for s in range(pp):
            for qi, k in enumerate(chunks[s]):
                queue_of[k] = qi
    caps = [_cap(schedule, pp, v, m, s) for s in range(pp)]
    # ZB-V: the first chunk may not take every slot (its backward needs the second chunk's to run first)
    qcap = [[caps[s] - 1, caps[s]] if zbv else [caps[s]] for s in range(pp)]
    # stages whose passes a stage waits for (the neighbours of its chunks)
    feeds = [{st[j] for k in chunks[s] for j in (k - 1, k + 1) if 0 <= j < nv} for s in range(pp)]
    # single-queue schedules: a queue head's ready time is one lookup, with two extra finish-time slots, one
    # never set (a queue's end: never ready) and one at 0 (the first chunk's forward input)
    never, zero = 2 * nvm, 2 * nvm + 1
    f_op: list[int] = []
    f_dep: list[int] = []
    f_start: list[int] = []
    b_op: list[int] = []
    b_dep: list[int] = []
    b_start: list[int] = []
    if not zbv:
        for s in range(pp):
            f_start.append(len(f_op))
            f_op.extend(f_orders[s][0])
            f_op.append(-1)
            f_dep.extend(dep_of[op] if dep_of[op] >= 0 else zero for op in f_orders[s][0])
            f_dep.append(never)
            b_start.append(len(b_op))
            b_op.extend(b_orders[s][0])
            b_op.append(-1)
            b_dep.extend(dep_of[op] for op in b_orders[s][0])
            b_dep.append(never)
    static = _topological(seqs, dep_of, nvm) if seqs else []
    dep_slot = [j if j >= 0 else zero for j in dep_of]
    prev_op = [-1] * (2 * nvm)
    for seq in seqs:
        for i in range(1, len(seq)):
            prev_op[seq[i]] = seq[i - 1]
    return _Shape(
        nv=nv,
        last=last,
        nvm=nvm,
        st=st,
        chunks=chunks,
        f_orders=f_orders,
        b_orders=b_orders,
        f_len=[[len(q) for q in qs] for qs in f_orders],
        b_len=[[len(q) for q in qs] for qs in b_orders],
        chunk_of=chunk_of,
        dep_of=dep_of,
        queue_of=queue_of,
        caps=caps,
        qcap=qcap,
        feeds=feeds,
        wakes=[frozenset(w for w in range(pp) if s in feeds[w]) for s in range(pp)],
        remaining=tuple(len(chunks[s]) * m * (3 if zb else 2) for s in range(pp)),
        f_op=f_op,
        f_dep=f_dep,
        f_start=f_start,
        b_op=b_op,
        b_dep=b_dep,
        b_start=b_start,
        dep_slot=dep_slot,
        stage_op=[st[k] for k in chunk_of],
        seqs=seqs,
        static=static,
        steps=[(op, dep_slot[op], zero if prev_op[op] < 0 else prev_op[op]) for op in static],
        prev_op=prev_op,
    )


def static_sequences(schedule: str, pp: int, v: int, m: int) -> list[list[int]]:
    """Megatron-Core's pass order on every stage of 1F1B or interleaved 1F1B (flat pass numbers as in
    :func:`_shape`): ``W`` warm-up forwards, then one forward and one backward until the forwards run out,
    then the remaining backwards.

    ``W = min(p − s − 1, m)`` without interleaving; with it ``W = 2(p − s − 1) + (v − 1)·p`` capped at the
    stage's ``v·m`` chunk-micro-batches (``get_pp_rank_microbatches``,
    megatron/core/pipeline_parallel/schedules.py:954-977@d98e8a64). Forwards take micro-batches in groups of
    ``p`` per chunk, chunks ascending; backwards the same groups with the chunks descending
    (``get_schedule_table`` and ``get_model_chunk_id``, same file, 989-1016; the group is
    ``microbatch_group_size_per_vp_stage``, ``p`` by default). The order is fixed: a stage whose next pass's
    input has not arrived waits for it (the steady-state loop, same file, 1733-), even when another pass
    could run. Tested against megatron-core's own functions (tests/mcore/test_pipeline_order.py)."""
    return [list(seq) for seq in _shape(schedule, pp, v if schedule == "interleaved" else 1, m).seqs]


def _megatron_sequence(fwd: list[int], bwd: list[int], warm: int) -> list[int]:
    """One stage's order: ``warm`` forwards, forward/backward pairs, the remaining backwards."""
    warm = min(warm, len(fwd))
    steady = [op for k in range(len(fwd) - warm) for op in (fwd[warm + k], bwd[k])]
    return fwd[:warm] + steady + bwd[len(fwd) - warm :]


def _topological(seqs: list[list[int]], dep_of: list[int], nvm: int) -> list[int]:
    """The per-stage sequences merged into one order in which every pass comes after its stage's previous
    pass and after the pass it waits for (``dep_of``, -1: none); raises when the sequences deadlock."""
    done = [False] * (2 * nvm)
    at = [0] * len(seqs)
    order: list[int] = []
    progress = True
    while progress:
        progress = False
        for s, seq in enumerate(seqs):
            i = at[s]
            while i < len(seq) and (dep_of[seq[i]] < 0 or done[dep_of[seq[i]]]):
                done[seq[i]] = True
                order.append(seq[i])
                i += 1
            if i != at[s]:
                at[s] = i
                progress = True
    if len(order) != 2 * nvm:
        raise RuntimeError(f"pipeline schedule deadlocked: {len(order)} of {2 * nvm} passes ordered")
    return order


def simulate(
    schedule: str,
    pp: int,
    vpp: int,
    m: int,
    f: float,
    b: float,
    w: float,
    c: float,
    f_last: float = 0.0,
    b_last: float = 0.0,
    w_last: float = 0.0,
) -> tuple[float, list[float], list[int]]:
    """Run the schedule with every chunk alike; per-chunk durations ``f, b, w`` (``w`` is fused into B unless
    the schedule is zero-bubble), send cost ``c``, extra durations of the chunk holding the output layer.

    Returns (makespan, busy time per stage, blocking sends per stage and micro-batch). Same decisions, same
    floating-point operations in the same order as the straightforward simulations kept in
    ``tests/physics/pipeline_reference.py`` (tested equal): the fixed order (1F1B, interleaved) and the greedy
    event simulation (zero-bubble). :func:`simulate_chunks` takes a duration per chunk.
    """
    v = chunks_per_stage(schedule, vpp)
    nv = n_virtual(schedule, pp, v)
    fs, bs, ws = [f] * nv, [b] * nv, [w] * nv
    fs[-1], bs[-1], ws[-1] = f + f_last, b + b_last, w + w_last
    makespan, busy, sends, _ = simulate_chunks(schedule, pp, vpp, m, fs, bs, ws, c)
    return makespan, busy, sends


def simulate_chunks(
    schedule: str,
    pp: int,
    vpp: int,
    m: int,
    fs: list[float],
    bs: list[float],
    ws: list[float],
    c: float,
) -> tuple[float, list[float], list[int], tuple[list[int], list[int], list[int], int]]:
    """Run the schedule; per chunk (virtual stage, model order) its pass durations ``fs, bs, ws`` (``ws`` is
    fused into B unless the schedule is zero-bubble), send cost ``c``.

    Returns (makespan, busy time per stage, blocking sends per stage and micro-batch, critical path): the
    critical path as the number of its F, B and W passes of each chunk (a B pass counts as a W pass too when W
    is fused into B) and of the sends or transfers it waits for.

    Passes are numbered flat: forward ``F(k, i)`` is ``k·m + i``, backward ``B(k, i)`` is ``nv·m + k·m + i``
    (one table of finish times for both).
    """
    zb = schedule in ("zb1p", "zbv")
    zbv = schedule == "zbv"
    asynchronous = schedule == "interleaved"  # overlap_p2p_comm
    v = chunks_per_stage(schedule, vpp)
    if asynchronous and m % pp:
        # Megatron-Core refuses it: megatron/core/pipeline_parallel/schedules.py:1160-1180@d98e8a64
        raise ValueError(f"interleaved schedule needs micro-batches ({m}) a multiple of pp={pp}")
    sh = _shape(schedule, pp, v, m)
    dur_f, dur_b, dur_w, sends, delay_f, delay_b = _pass_durations(sh, pp, fs, bs, ws, c, zb, asynchronous)
    # per pass: the asynchronous transfer delay on its input, its duration
    delay_of = _per_pass(delay_f, delay_b, m)
    dur_of = _per_pass(dur_f, dur_b, m)
    if not zb:  # 1F1B, interleaved: Megatron's fixed order
        makespan, busy, path = _static(sh, pp, dur_of, delay_of, asynchronous)
        return makespan, busy, sends, path
    greedy = (_GreedyZBV if zbv else _GreedyZBH1)(sh, schedule, pp, vpp, m, dur_of, dur_w)
    makespan, busy, recs, end_op = greedy.run()
    return makespan, busy, sends, _greedy_critical_path(sh, recs, end_op)


def _pass_durations(
    sh: _Shape,
    pp: int,
    fs: list[float],
    bs: list[float],
    ws: list[float],
    c: float,
    zb: bool,
    asynchronous: bool,
) -> tuple[list[float], list[float], list[float], list[int], list[float], list[float]]:
    """Per chunk its F, B and W durations with the blocking sends they include (W inside B unless ``zb``), the
    blocking sends per stage and micro-batch, and per chunk the asynchronous transfer delay on its forward and
    backward input (interleaved)."""
    nv, last, st = sh.nv, sh.last, sh.st
    dur_f, dur_b, dur_w = [0.0] * nv, [0.0] * nv, [0.0] * nv
    sends = [0] * pp
    for k in range(nv):
        fk, bk, wk = fs[k], bs[k], ws[k]
        if not zb:
            bk, wk = bk + wk, 0.0
        if not asynchronous and k < last and st[k + 1] != st[k]:
            fk += c
            sends[st[k]] += 1
        if not asynchronous and k > 0 and st[k - 1] != st[k]:
            bk += c
            sends[st[k]] += 1
        dur_f[k], dur_b[k], dur_w[k] = fk, bk, wk
    delay_f = [c if asynchronous and k > 0 and st[k - 1] != st[k] else 0.0 for k in range(nv)]
    delay_b = [c if asynchronous and k < last and st[k + 1] != st[k] else 0.0 for k in range(nv)]
    return dur_f, dur_b, dur_w, sends, delay_f, delay_b


_Ran = tuple[float, int, int, int, float]
"""a pass run by the greedy simulation: (end, kind (0 F, 1 B, 2 W), chunk, its input's record or -1, the time
that input was ready)"""


class _Greedy:
    """The zero-bubble schedules' event simulation: each stage, once free, runs the pass its rule picks
    (:meth:`_pick`), else waits for the input it lacks; W passes are deferred at most ``p − 1`` per stage.
    Sends block in both schedules, so no transfer delays a pass's input."""

    def __init__(
        self, sh: _Shape, schedule: str, pp: int, vpp: int, m: int, dur_of: list[float], dur_w: list[float]
    ) -> None:
        self.sh, self.schedule, self.pp, self.vpp, self.m = sh, schedule, pp, vpp, m
        self.dur_of, self.dur_w = dur_of, dur_w
        # per pass its finish time and record, and two extra slots: one never set (the end of a queue: never
        # ready) and one at 0 (the first chunk's forward input)
        self.fin = [-1.0] * (2 * sh.nvm) + [-1.0, 0.0]
        self.ids = [-1] * (2 * sh.nvm + 2)
        # per pass run: its kind (0 F, 1 B, 2 W), chunk and binding predecessor (the critical path's links)
        self.recs: list[tuple[int, int, int]] = []
        self.last_op = [-1] * pp
        self.last_end = [0.0] * pp
        self.pend_w: list[list[int]] = [[] for _ in range(pp)]
        self.inflight_all = [0] * pp  # forwards whose B has not run
        self.busy = [0.0] * pp
        self.free = [0.0] * pp
        self.version = [0] * pp
        self.heap = [(0.0, s, s, 0) for s in range(pp)]
        self.seq = pp
        self.waiting: list[int] = []

    def run(self) -> tuple[float, list[float], list[tuple[int, int, int]], int]:
        """(makespan, busy time per stage, the passes' records, the record of the pass that ends last)."""
        remaining, free, version, heap = list(self.sh.remaining), self.free, self.version, self.heap
        recs = self.recs
        makespan, end_op = 0.0, -1
        while heap:
            t, _, s, ver = heapq.heappop(heap)
            if ver != version[s] or remaining[s] == 0:
                continue
            picked = self._pick(s, max(t, free[s]))
            if picked is None:
                continue
            end, kind, k, dep_id, dep_t = picked
            n_op = len(recs)
            bound = dep_id >= 0 and dep_t > self.last_end[s]
            recs.append((kind, k, dep_id if bound else self.last_op[s]))
            self.last_op[s], self.last_end[s] = n_op, end
            free[s] = end
            remaining[s] -= 1
            if end > makespan:
                makespan, end_op = end, n_op
            if remaining[s]:
                self.seq += 1
                heapq.heappush(heap, (end, self.seq, s, version[s]))
            self._wake(s)
        if any(remaining):
            raise RuntimeError(self._deadlock())
        return makespan, self.busy, recs, end_op

    def _deadlock(self) -> str:
        return f"pipeline simulation deadlocked ({self.schedule}, pp={self.pp}, vpp={self.vpp}, m={self.m})"

    def _wake(self, s: int) -> None:
        """Waiting stages that the pass just run on ``s`` may unblock are rescheduled (``s`` leaves the list)."""
        waiting = self.waiting
        if not waiting or (s not in waiting and self.sh.wakes[s].isdisjoint(waiting)):
            return
        still = []
        for w_ in waiting:
            if w_ != s and s in self.sh.feeds[w_]:
                self.version[w_] += 1
                self.seq += 1
                heapq.heappush(self.heap, (self.free[w_], self.seq, w_, self.version[w_]))
            elif w_ != s:
                still.append(w_)
        self.waiting = still

    def _block(self, s: int, t: float, nxt: float) -> None:
        """Stage ``s`` waits from ``t`` for an input ready at ``nxt`` (inf: one another stage has yet to run)."""
        self.free[s] = t
        self.waiting.append(s)
        if nxt < math.inf:
            self.seq += 1
            heapq.heappush(self.heap, (nxt, self.seq, s, self.version[s]))
        elif not self.heap:
            raise RuntimeError(self._deadlock())

    def _run_w(self, s: int, t: float) -> _Ran:
        k = self.pend_w[s].pop(0)
        d = self.dur_w[k]
        self.busy[s] += d
        return t + d, 2, k, -1, -1.0

    def _run(self, s: int, t: float, op: int, dep: int, dep_t: float) -> _Ran:
        """Run forward or backward pass ``op`` on ``s`` at ``t``; its input, pass ``dep``, was ready at ``dep_t``."""
        d = self.dur_of[op]
        end = t + d
        self.fin[op] = end
        self.ids[op] = len(self.recs)
        self.busy[s] += d
        k = self.sh.chunk_of[op]
        backward = op >= self.sh.nvm
        if backward:
            self.inflight_all[s] -= 1
            self.pend_w[s].append(k)
        else:
            self.inflight_all[s] += 1
        return end, int(backward), k, self.ids[dep] if dep >= 0 else -1, dep_t

    def _pick(self, s: int, t: float) -> _Ran | None:
        """Run the pass stage ``s`` takes at ``t`` or later: W when ``p − 1`` are deferred, else the ready pass
        the schedule's rule picks (:meth:`_ready`), else a deferred W, else the input it waits for once it is
        ready (before any other stage's event; else :meth:`_block` and ``None``)."""
        heap = self.heap
        while True:
            if len(self.pend_w[s]) > self.pp - 1:
                return self._run_w(s, t)
            ran = self._ready(s, t)
            if not isinstance(ran, float):
                return ran
            if self.pend_w[s]:
                return self._run_w(s, t)
            if ran < math.inf and (not heap or ran <= heap[0][0]):
                t = ran
                continue
            self._block(s, t, ran)
            return None

    def _ready(self, s: int, t: float) -> _Ran | float:
        """Run the forward or backward pass the schedule picks among those ready on ``s`` at ``t``, else the
        time the first of them gets ready (inf: an input another stage has yet to run)."""
        raise NotImplementedError


class _GreedyZBH1(_Greedy):
    """ZB-H1: one forward and one backward queue per stage; a ready B first, else a ready F while fewer than
    the stage's cap are in flight."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.f_at = list(self.sh.f_start)  # each stage's queue head, an index into f_op / f_dep
        self.b_at = list(self.sh.b_start)

    def _ready(self, s: int, t: float) -> _Ran | float:
        sh, fin, inf = self.sh, self.fin, math.inf
        bp = self.b_at[s]
        rb = fin[sh.b_dep[bp]]
        if rb < 0:
            rb = inf
        elif rb <= t:  # a ready backward first (the forward head is not needed)
            self.b_at[s] = bp + 1
            return self._run(s, t, sh.b_op[bp], sh.b_dep[bp], rb)
        rf = inf
        if self.inflight_all[s] < sh.caps[s]:
            fp = self.f_at[s]
            rf = fin[sh.f_dep[fp]]
            if rf < 0:
                rf = inf
            elif rf <= t:
                self.f_at[s] = fp + 1
                return self._run(s, t, sh.f_op[fp], sh.f_dep[fp], rf)
        return rb if rb < rf else rf


class _GreedyZBV(_Greedy):
    """ZB-V: per stage a forward and a backward queue of each of its two chunks. The earliest-ready forward
    (a tie: the later queue) runs when one is ready and the caps allow, even with a backward ready (Megatron's
    steady state: one forward, then one backward); else the earliest-ready backward (a tie: the earlier
    queue)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.f_ptr = [[0] * len(q) for q in self.sh.f_orders]
        self.b_ptr = [[0] * len(q) for q in self.sh.b_orders]
        self.inflight = [[0] * len(q) for q in self.sh.f_orders]  # per forward queue

    def _ready(self, s: int, t: float) -> _Ran | float:
        sh, fin, dep_of, inf = self.sh, self.fin, self.sh.dep_of, math.inf
        b_qs, b_p, b_n = sh.b_orders[s], self.b_ptr[s], sh.b_len[s]
        f_qs, f_p, f_n = sh.f_orders[s], self.f_ptr[s], sh.f_len[s]
        infl, qcap = self.inflight[s], sh.qcap[s]
        best_b = best_f = -1
        rb = rf = inf
        for qi, q in enumerate(b_qs):
            if b_p[qi] < b_n[qi] and 0 <= (ready := fin[dep_of[q[b_p[qi]]]]) < rb:
                rb, best_b = ready, qi
        if self.inflight_all[s] < sh.caps[s]:
            for qi, q in enumerate(f_qs):
                if f_p[qi] < f_n[qi] and infl[qi] < qcap[qi]:
                    j = dep_of[q[f_p[qi]]]
                    if 0 <= (ready := 0.0 if j < 0 else fin[j]) <= rf:
                        rf, best_f = ready, qi
        if best_f >= 0 and rf <= t:
            op = f_qs[best_f][f_p[best_f]]
            f_p[best_f] += 1
            infl[best_f] += 1
            return self._run(s, t, op, dep_of[op], rf)
        if best_b >= 0 and rb <= t:
            op = b_qs[best_b][b_p[best_b]]
            b_p[best_b] += 1
            infl[sh.queue_of[sh.chunk_of[op]]] -= 1
            return self._run(s, t, op, dep_of[op], rb)
        return rb if rb < rf else rf


def _greedy_critical_path(
    sh: _Shape,
    recs: list[tuple[int, int, int]],
    end_op: int,
) -> tuple[list[int], list[int], list[int], int]:
    """The critical path of a greedy (zero-bubble) simulation back from ``end_op``: its passes per chunk and
    kind and the blocking sends it waits for (as :func:`simulate_chunks` returns it)."""
    nv, last, st = sh.nv, sh.last, sh.st
    cf, cb, cw = [0] * nv, [0] * nv, [0] * nv
    cc = 0
    op = end_op
    while op >= 0:
        kind, k, pred = recs[op]
        if kind == 0:
            cf[k] += 1
            cc += k < last and st[k + 1] != st[k]
        elif kind == 1:
            cb[k] += 1
            cc += k > 0 and st[k - 1] != st[k]
        else:
            cw[k] += 1
        op = pred
    return cf, cb, cw, cc


def _per_pass(per_chunk_f: list[float], per_chunk_b: list[float], m: int) -> list[float]:
    """Per flat pass number: its chunk's forward value for the forwards, backward value for the backwards."""
    out: list[float] = []
    for x in per_chunk_f:
        out += [x] * m
    for x in per_chunk_b:
        out += [x] * m
    return out


def _static(
    sh: _Shape, pp: int, dur_of: list[float], delay_of: list[float], asynchronous: bool
) -> tuple[float, list[float], tuple[int, ...]]:
    """1F1B or interleaved: the passes in the shape's fixed order (:func:`static_sequences`), each starting
    at ``max(its stage's previous end, its input's finish + transfer delay)``.

    Returns (makespan, busy time per stage, the critical path as in :func:`simulate_chunks`: W fused into
    B). The critical path follows each pass's binding predecessor (its input when that arrives strictly
    after the stage is free, else the stage's previous pass) back from the first pass to end last. A stage's
    previous end is its previous pass's finish (``sh.steps``); busy time is each stage's durations added in its
    order (the same floating-point sums as adding them while simulating)."""
    nvm = sh.nvm
    real = 2 * nvm
    fin = [-1.0] * real
    fin.extend((-1.0, 0.0))  # slot 2·nv·m never set, slot 2·nv·m + 1 at 0 (the first chunk's input)
    pred = list(sh.prev_op)  # the binding predecessor: the stage's previous pass unless the input binds
    for op, j, q in sh.steps:
        t = fin[q]
        r = fin[j] + delay_of[op]
        if r > t:
            t = r
            if j < real:
                pred[op] = j
        fin[op] = t + dur_of[op]
    del fin[real:]
    busy = [reduce(add, map(dur_of.__getitem__, seq), 0.0) for seq in sh.seqs]
    makespan = max(fin)
    last, chunk_of, st, dep_slot = sh.last, sh.chunk_of, sh.st, sh.dep_slot
    nv = sh.nv
    cf, cb = [0] * nv, [0] * nv
    cc = 0
    op = fin.index(makespan)
    while op >= 0:
        k = chunk_of[op]
        # an asynchronous transfer binds when the input does (a transfer crosses stages: the input is never
        # the stage's previous pass then)
        cc += pred[op] == dep_slot[op] and delay_of[op] > 0
        if op < nvm:
            cf[k] += 1
            cc += not asynchronous and k < last and st[k + 1] != st[k]
        else:
            cb[k] += 1
            cc += not asynchronous and k > 0 and st[k - 1] != st[k]
        op = pred[op]
    return makespan, busy, (cf, cb, list(cb), cc)


@dataclass(frozen=True, eq=False)
class ChunkMix:
    """What each model chunk of one pipeline holds, as counts of a few *kinds* of work (a kind of decoder layer,
    the output layer): chunk ``k``'s forward lasts ``Σ_j counts[k][j]·f[j]`` (:func:`mixed_pipeline_timing`).
    Built by :func:`chunk_mix` (one object per distinct mix: simulations are memoised on it)."""

    schedule: str
    pp: int
    vpp: int
    counts: tuple[tuple[float, ...], ...]
    """per chunk (virtual stage, model order), per kind"""
    stage_sends: tuple[int, ...]
    """per physical stage, its blocking sends per micro-batch (none in the interleaved schedule)"""
    mean: tuple[float, ...]
    """per kind, the mean count per chunk (the quantisation unit is the mean chunk's work)"""
    res: tuple[float, ...]
    """per kind, the quantisation grid: a kind's duration is simulated on 1/res of the unit, so that a chunk
    holding its largest count of it is within 1/(2·_RES) of the unit"""
    rows: tuple[tuple[float, ...], ...]
    """the distinct chunk counts (most chunks are alike)"""
    row_of: tuple[int, ...]
    """per chunk, its index in ``rows``"""
    classes: tuple[tuple[tuple[float, ...], int], ...]
    """the distinct (counts per kind of a stage's chunks added, blocking sends per micro-batch) of the stages
    (most stages of a pipeline are alike)"""
    stage_class: tuple[int, ...]
    """per stage, its index in ``classes``"""
    class_stage: tuple[int, ...]
    """per class, its first stage"""


@lru_cache(maxsize=1024)
def chunk_mix(schedule: str, pp: int, vpp: int, counts: tuple[tuple[float, ...], ...]) -> ChunkMix:
    """The :class:`ChunkMix` of ``counts`` (per chunk, per kind) under ``schedule`` on ``pp`` stages."""
    v = chunks_per_stage(schedule, vpp)
    nv = n_virtual(schedule, pp, v)
    if len(counts) != nv:
        raise ValueError(f"{len(counts)} chunk counts for {nv} chunks ({schedule}, pp={pp}, vpp={v})")
    kinds = len(counts[0])
    st = [stage_of(schedule, pp, k) for k in range(nv)]
    stage_counts = [[0.0] * kinds for _ in range(pp)]
    sends = [0] * pp
    blocking = schedule != "interleaved"
    for k, row in enumerate(counts):
        for j in range(kinds):
            stage_counts[st[k]][j] += row[j]
        if blocking and pp > 1:
            sends[st[k]] += (k < nv - 1 and st[k + 1] != st[k]) + (k > 0 and st[k - 1] != st[k])
    mean = tuple(sum(row[j] for row in counts) / nv for j in range(kinds))
    res = tuple(_RES * max(1.0, max(row[j] for row in counts)) for j in range(kinds))
    per_stage = [(tuple(r), n) for r, n in zip(stage_counts, sends, strict=True)]
    classes = list(dict.fromkeys(per_stage))
    rows = list(dict.fromkeys(counts))
    return ChunkMix(
        schedule,
        pp,
        v,
        counts,
        tuple(sends),
        mean,
        res,
        tuple(rows),
        tuple(rows.index(r) for r in counts),
        tuple(classes),
        tuple(classes.index(x) for x in per_stage),
        tuple(per_stage.index(x) for x in classes),
    )


def quantised_chunks(
    mix: ChunkMix, qf: tuple[int, ...], qb: tuple[int, ...], qw: tuple[int, ...]
) -> tuple[list[float], list[float], list[float]]:
    """Per chunk its (F, B, W) durations in units of the mean chunk's work from the quantised per-kind ones."""
    kinds = range(len(mix.res))
    out = []
    for q in (qf, qb, qw):
        r = [q[j] / mix.res[j] for j in kinds]
        per_row = [sum(n[j] * r[j] for j in kinds) for n in mix.rows]
        out.append([per_row[i] for i in mix.row_of])
    return out[0], out[1], out[2]


@lru_cache(maxsize=65536)
def _normalised(
    mix: ChunkMix, key: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """The critical path of ``mix`` at quantised durations (``key``: micro-batches, the send, then each kind's
    F, B and W on the grid of :attr:`ChunkMix.res`), as counts per kind of F, B and W work and of sends:
    (cf, cb, cw, cc)."""
    kinds = range(len(mix.res))
    m, qc = key[0], key[1]
    fs, bs, ws = quantised_chunks(mix, key[2::3], key[3::3], key[4::3])
    _, _, _, (cf, cb, cw, cc) = simulate_chunks(mix.schedule, mix.pp, mix.vpp, m, fs, bs, ws, qc / _RES)
    rows, row_of = mix.rows, mix.row_of

    def per_kind(per_chunk: list[int]) -> tuple[int, ...]:
        per_row = [0] * len(rows)
        for k, x in enumerate(per_chunk):
            if x:
                per_row[row_of[k]] += x
        return tuple(sum(x * row[j] for x, row in zip(per_row, rows, strict=True)) for j in kinds)

    return per_kind(cf), per_kind(cb), per_kind(cw), cc


def mixed_pipeline_timing(
    mix: ChunkMix,
    m: int,
    f: Sequence[float],
    b: Sequence[float],
    w: Sequence[float],
    c: float,
) -> PipelineTiming:
    """Step time of the pipeline part for chunks holding different work, from a memoised simulation.

    ``f, b, w``: per kind of :class:`ChunkMix`, the pass durations of one unit and micro-batch (seconds; ``w``
    is run inside B unless the schedule is zero-bubble: pass it added to ``b`` and zero there, so that alike
    configurations share simulations); ``c``: one send. The simulation runs on durations quantised to a grid of
    the mean chunk's work and at most ``M_CAP_PER_STAGE·p`` micro-batches; its critical path is re-evaluated
    with the exact durations (so the result is monotone in them), and the bubble beyond the busiest stage's
    work stays as simulated for more micro-batches (steady state). The busiest stage is the one with the most
    work per micro-batch (its chunks and blocking sends)."""
    kr = range(len(f))
    unit_k = [f[j] + b[j] + w[j] for j in kr]
    work_c = []
    for n, sends in mix.classes:
        x = sends * c
        for j in kr:
            x += n[j] * unit_k[j]
        work_c.append(x)
    per_mb = max(work_c)
    s = mix.class_stage[work_c.index(per_mb)]
    if mix.pp == 1:
        return PipelineTiming(m * per_mb, m * per_mb, 0.0, 0, 0.0, s, tuple(work_c), mix.stage_class)
    unit = 2 * c
    mean = mix.mean
    for j in kr:
        unit += mean[j] * unit_k[j]
    if unit <= 0:
        return PipelineTiming(0.0, 0.0, 0.0, 0, 0.0, s, tuple(work_c), mix.stage_class)
    ms = min(m, M_CAP_PER_STAGE * mix.pp)
    res = mix.res
    inv = 1.0 / unit
    key = [ms, round(c * _RES * inv)]  # the simulation's key: m, then the send and each kind's F, B, W
    for j in kr:
        g = res[j] * inv
        key += (round(f[j] * g), round(b[j] * g), round(w[j] * g))
    cf, cb, cw, cc = _normalised(mix, tuple(key))
    span = cc * c
    for j in kr:
        span += cf[j] * f[j] + cb[j] * b[j] + cw[j] * w[j]
    bubble = max(0.0, span - ms * per_mb)
    transfers = 0.0
    if mix.schedule == "interleaved":  # asynchronous sends: what of them the critical path waits for
        transfers = min(bubble, cc * c)
    busy = m * per_mb
    return PipelineTiming(
        busy + bubble,
        busy,
        bubble - transfers,
        mix.stage_sends[s],
        transfers,
        s,
        tuple(work_c),
        mix.stage_class,
    )


def pipeline_timing(
    schedule: str,
    pp: int,
    vpp: int,
    m: int,
    f: float,
    b: float,
    w: float,
    c: float,
    f_last: float = 0.0,
    b_last: float = 0.0,
    w_last: float = 0.0,
) -> PipelineTiming:
    """:func:`mixed_pipeline_timing` with every chunk alike: ``f, b, w`` per chunk and micro-batch, ``c`` one
    blocking send, ``*_last`` the extra durations of the chunk holding the output layer. With ``pp = 1`` it is
    ``m`` passes."""
    v = chunks_per_stage(schedule, vpp)
    nv = n_virtual(schedule, pp, v)
    counts = ((1.0, 0.0),) * (nv - 1) + ((1.0, 1.0),)
    if schedule not in ("zb1p", "zbv"):  # W inside B
        b, b_last, w, w_last = b + w, b_last + w_last, 0.0, 0.0
    return mixed_pipeline_timing(
        chunk_mix(schedule, pp, v, counts), m, (f, f_last), (b, b_last), (w, w_last), c
    )


def bubble_fraction(
    schedule: str, pp: int, vpp: int, m: int, f: float, b: float, w: float, c: float
) -> float:
    """Bubble / step time (uniform stages)."""
    t = pipeline_timing(schedule, pp, vpp, m, f, b, w, c)
    return t.bubble / t.step if t.step else 0.0


@dataclass(frozen=True, slots=True)
class _BoundTerms:
    """What :func:`step_lower_bound` needs of one :class:`ChunkMix`, built once per mix: its distinct passes,
    and per stage class the path through one of its stages."""

    passes: tuple[tuple[int, tuple[float, ...], int], ...]
    """(F 0 / B 1 / W 2, per kind count, blocking sends in it and asynchronous transfers into it)"""
    paths: tuple[tuple[tuple[float, ...], tuple[float, ...], int, int, int], ...]
    """per stage class, of its last stage ``s``: the forward counts per kind of the chunks before ``s`` (the
    head), the backward counts of the same chunks (the tail: 1F1B and interleaved only), the sends and
    transfers on head and tail, the class, and the sends and transfers of one micro-batch of the stage's
    passes"""


@lru_cache(maxsize=4096)
def _bound_terms(mix: ChunkMix) -> _BoundTerms:
    schedule, pp, nv = mix.schedule, mix.pp, len(mix.counts)
    asynchronous, zb = schedule == "interleaved", schedule in ("zb1p", "zbv")
    st = [stage_of(schedule, pp, k) for k in range(nv)]
    kinds = range(len(mix.res))

    def cross(k: int, j: int) -> int:
        return int(0 <= j < nv and st[j] != st[k])

    # per chunk, the sends in (blocking) or transfers into (asynchronous) its F and B passes
    f_link = [cross(k, k - 1) if asynchronous else cross(k, k + 1) for k in range(nv)]
    b_link = [cross(k, k + 1) if asynchronous else cross(k, k - 1) for k in range(nv)]
    passes = {(0, mix.counts[k], f_link[k]) for k in range(nv)}
    passes |= {(1, mix.counts[k], b_link[k]) for k in range(nv)}
    if zb:
        passes |= {(2, mix.counts[k], 0) for k in range(nv)}
    stage_links = [0] * pp
    for k in range(nv):
        stage_links[st[k]] += f_link[k] + b_link[k]
    last_of = {mix.stage_class[s]: s for s in range(pp)}
    paths = []
    for klass, s in sorted(last_of.items()):
        # stage s's first pass is F(s, 0): the head runs micro-batch 0's forwards on the chunks before it
        head = tuple(sum(mix.counts[k][j] for k in range(s)) for j in kinds)
        links = sum(f_link[k] for k in range(1, s + 1)) if asynchronous else sum(f_link[:s])
        tail = (0.0,) * len(head)
        if not zb:  # its last pass is B(s, m-1): that micro-batch's backwards on the chunks before follow
            tail = head
            links += sum(b_link[:s])
        paths.append((head, tail, links, klass, stage_links[s]))
    return _BoundTerms(tuple(sorted(passes)), tuple(paths))


def _rounding(lo: float, hi: float, grid: float, unit_lo: float, unit_hi: float) -> tuple[float, float]:
    """The most that rounding ``x`` to a multiple of ``unit/grid`` (as the simulation's key does) adds to it and
    takes from it, over ``x`` in ``[lo, hi]`` and ``unit`` in ``[unit_lo, unit_hi]`` (seconds)."""
    if unit_lo <= 0.0:
        return math.inf, math.inf
    step = unit_hi / grid
    a, b = lo * grid / unit_hi, hi * grid / unit_lo
    k = math.floor(a + 0.5)
    if b >= k + 0.5 - 1e-9 or a <= k - 0.5 + 1e-9:  # a half step (ties round to even) may lie between
        return 0.5 * step, 0.5 * step
    return max(0.0, k - a) * step, max(0.0, b - k) * step


def step_lower_bound(
    mix: ChunkMix,
    m: int,
    lo: tuple[Sequence[float], Sequence[float], Sequence[float]],
    hi: tuple[Sequence[float], Sequence[float], Sequence[float]] | None,
    c: float,
) -> float:
    """A lower bound on :func:`mixed_pipeline_timing`'s ``step`` for every set of pass durations between ``lo``
    and ``hi`` (per kind ``(f, b, w)``, componentwise; ``c`` one send), at the cost of a few sums (``hi`` None:
    the busy time of ``lo`` only).

    The step is ``max(m·busy, span + (m − ms)·busy)``, ``span`` being the simulated critical path ``P`` re-timed
    with the exact durations. ``P`` is a longest path of the simulation's pass graph at the quantised durations,
    so there it is at least as long as the path that runs micro-batch 0's forwards up to stage ``s``, every
    pass of stage ``s`` in its order, and (1F1B, interleaved, whose stage ``s`` ends with the backward of the
    last micro-batch) that micro-batch's backwards from stage ``s`` down: the pipeline's fill and drain. The
    quantisation (:func:`_rounding`) lengthens each pass by at most ``ρ`` times its quantised duration (the
    most it adds over the least it leaves), so ``P`` re-timed keeps at least ``1 − ρ`` of its quantised length,
    and the path above loses at most what rounding takes from its passes."""
    f_lo, b_lo, w_lo = lo
    kr = range(len(f_lo))
    work = []
    for n, sends in mix.classes:
        x = sends * c
        for j in kr:
            x += n[j] * (f_lo[j] + b_lo[j] + w_lo[j])
        work.append(x)
    per_mb = max(work)
    busy = m * per_mb
    if mix.pp == 1 or hi is None:
        return busy
    f_hi, b_hi, w_hi = hi
    unit_lo = unit_hi = 2 * c
    for j in kr:
        unit_lo += mix.mean[j] * (f_lo[j] + b_lo[j] + w_lo[j])
        unit_hi += mix.mean[j] * (f_hi[j] + b_hi[j] + w_hi[j])
    res = mix.res
    rounding = [
        [_rounding(lo_[j], hi_[j], res[j], unit_lo, unit_hi) for j in kr]
        for lo_, hi_ in ((f_lo, f_hi), (b_lo, b_hi), (w_lo, w_hi))
    ]
    up_c, down_c = _rounding(c, c, _RES, unit_lo, unit_hi)
    terms = _bound_terms(mix)
    durations = (f_lo, b_lo, w_lo)
    in_pass = mix.schedule != "interleaved"  # blocking sends are part of their pass; transfers are not
    rho = 0.0
    for kind, n, links in terms.passes:
        d, r = durations[kind], rounding[kind]
        # its duration, and what rounding adds to it (with the transfer into it, asynchronous) or takes from it
        x, down = (links * c, links * down_c) if in_pass else (0.0, 0.0)
        up = links * up_c
        for j in kr:
            x += n[j] * d[j]
            up += n[j] * r[j][0]
            down += n[j] * r[j][1]
        if up <= 0.0:
            continue
        if x <= down:
            return busy  # it may quantise to nothing: no bound on the re-timing's loss
        rho = max(rho, up / (x - down))
    if rho >= 1.0:
        return busy
    ms = min(m, M_CAP_PER_STAGE * mix.pp)
    longest = 0.0
    for head, tail, links, klass, stage_links in terms.paths:
        n = mix.classes[klass][0]
        x = links * (c - down_c) + ms * (work[klass] - stage_links * down_c)
        for j in kr:
            x += head[j] * (f_lo[j] - rounding[0][j][1]) + tail[j] * (b_lo[j] - rounding[1][j][1])
            x -= ms * n[j] * (rounding[0][j][1] + rounding[1][j][1] + rounding[2][j][1])
        longest = max(longest, x)
    return max(busy, (1.0 - rho) * longest + (m - ms) * per_mb)
