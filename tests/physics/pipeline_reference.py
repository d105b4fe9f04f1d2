"""Straightforward pipeline-schedule simulations that :func:`primus_optuna.physics.pipeline.simulate` must
reproduce exactly (makespan, busy times, sends and the critical-path coefficients):
:func:`simulate_reference`, the greedy event simulation as it was before its speed-up (kept verbatim; the
reference for the zero-bubble schedules, and the greedy variant 1F1B and interleaved were simulated with
before they followed Megatron's fixed order), and :func:`static_reference`, Megatron's fixed order."""

from __future__ import annotations

import heapq

from primus_optuna.physics.pipeline import _cap as _zb_cap
from primus_optuna.physics.pipeline import n_virtual, stage_of


def _cap(schedule: str, pp: int, vpp: int, m: int, s: int) -> int:
    """In-flight caps; interleaved: Megatron's warm-up + 1 (the library no longer simulates it greedily)."""
    if schedule == "interleaved":
        return min(2 * (pp - s - 1) + (vpp - 1) * pp + 1, m * vpp)
    return _zb_cap(schedule, pp, vpp, m, s)


def simulate_reference(
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
    per_chunk: tuple[list[float], list[float], list[float]] | None = None,
) -> tuple[float, list[float], list[int]]:
    """Run the schedule; per-chunk durations ``f, b, w`` (``w`` is fused into B unless the schedule is
    zero-bubble), send cost ``c``, extra durations of the chunk holding the output layer; ``per_chunk``: each
    chunk's own (F, B, W) durations instead.

    Returns (makespan, busy time per stage, blocking sends per stage and micro-batch).
    """
    zb = schedule in ("zb1p", "zbv")
    asynchronous = schedule == "interleaved"  # overlap_p2p_comm
    v = 2 if schedule == "zbv" else (vpp if schedule == "interleaved" else 1)
    nv = n_virtual(schedule, pp, v)
    last = nv - 1
    st = [stage_of(schedule, pp, k) for k in range(nv)]
    dur_f, dur_b, dur_w = [0.0] * nv, [0.0] * nv, [0.0] * nv
    sends = [0] * pp
    for k in range(nv):
        fk, bk, wk = (f + f_last, b + b_last, w + w_last) if k == last else (f, b, w)
        if per_chunk is not None:
            fk, bk, wk = per_chunk[0][k], per_chunk[1][k], per_chunk[2][k]
        if not zb:
            bk, wk = bk + wk, 0.0
        if not asynchronous and k < last and st[k + 1] != st[k]:
            fk += c
            sends[st[k]] += 1
        if not asynchronous and k > 0 and st[k - 1] != st[k]:
            bk += c
            sends[st[k]] += 1
        dur_f[k], dur_b[k], dur_w[k] = fk, bk, wk
    chunks = [[k for k in range(nv) if st[k] == s] for s in range(pp)]
    # forward order per stage: a fixed list (1F1B, ZB-H1, interleaved) or per-chunk queues (ZB-V)
    f_orders: list[list[list[tuple[int, int]]]] = []
    for s in range(pp):
        ks = chunks[s]
        if schedule == "zbv":
            f_orders.append([[(k, i) for i in range(m)] for k in ks])
        elif schedule == "interleaved":
            order = []
            for g0 in range(0, m, pp):
                size = min(pp, m - g0)
                for k in ks:
                    order.extend((k, g0 + j) for j in range(size))
            f_orders.append([order])
        else:
            f_orders.append([[(ks[0], i) for i in range(m)]])
    b_orders: list[list[list[tuple[int, int]]]] = []
    for s in range(pp):
        ks = chunks[s]
        if schedule == "interleaved":  # Megatron: same groups of p micro-batches, chunks in reverse
            order = []
            for g0 in range(0, m, pp):
                size = min(pp, m - g0)
                for k in reversed(ks):
                    order.extend((k, g0 + j) for j in range(size))
            b_orders.append([order])
        else:
            b_orders.append([[(k, i) for i in range(m)] for k in ks])
    # asynchronous transfers: arrival delay of chunk k's input from the previous chunk (F) / next chunk (B)
    delay_f = [c if asynchronous and k > 0 and st[k - 1] != st[k] else 0.0 for k in range(nv)]
    delay_b = [c if asynchronous and k < last and st[k + 1] != st[k] else 0.0 for k in range(nv)]
    fin_f = [[-1.0] * m for _ in range(nv)]
    fin_b = [[-1.0] * m for _ in range(nv)]
    id_f = [[-1] * m for _ in range(nv)]
    id_b = [[-1] * m for _ in range(nv)]
    # critical-path bookkeeping: per op its kind (0 F, 1 B, 2 W), chunk and binding predecessor
    op_kind: list[int] = []
    op_chunk: list[int] = []
    op_pred: list[int] = []
    op_delay: list[int] = []  # 1 when the binding predecessor is an asynchronous transfer
    last_op = [-1] * pp
    last_end = [0.0] * pp
    end_op = -1
    f_ptr = [[0] * len(q) for q in f_orders]
    b_ptr = [[0] * len(q) for q in b_orders]
    pend_w: list[list[int]] = [[] for _ in range(pp)]
    # in flight = forwards whose B has not run, per forward queue; W passes deferred at most wmax per stage
    inflight = [[0] * len(q) for q in f_orders]
    queue_of = {k: (qi if schedule == "zbv" else 0) for s in range(pp) for qi, k in enumerate(chunks[s])}
    caps = [_cap(schedule, pp, v, m, s) for s in range(pp)]
    # ZB-V: the first chunk may not take every slot (its backward needs the second chunk's to run first)
    qcap = [[caps[s] - 1, caps[s]] if schedule == "zbv" else [caps[s]] for s in range(pp)]
    f_first = schedule in ("interleaved", "zbv")  # Megatron's steady state: one forward, then one backward
    wmax = [pp - 1] * pp
    remaining = [len(chunks[s]) * m * (3 if zb else 2) for s in range(pp)]
    # stages whose passes a stage waits for (the neighbours of its chunks)
    feeds = [{st[j] for k in chunks[s] for j in (k - 1, k + 1) if 0 <= j < nv} for s in range(pp)]
    busy = [0.0] * pp
    free = [0.0] * pp
    version = [0] * pp
    heap = [(0.0, s, s, 0) for s in range(pp)]
    seq = pp
    waiting: list[int] = []
    makespan = 0.0
    inf = float("inf")
    while heap:
        t, _, s, ver = heapq.heappop(heap)
        if ver != version[s] or remaining[s] == 0:
            continue
        t = max(t, free[s])
        end = -1.0
        while True:
            best_b = best_f = -1
            rb = rf = inf
            for qi, q in enumerate(b_orders[s]):
                p_ = b_ptr[s][qi]
                if p_ < len(q):
                    k, i = q[p_]
                    dep = fin_f[k][i] if k == last else fin_b[k + 1][i]
                    if dep >= 0:
                        dep += delay_b[k]
                    if dep >= 0 and fin_f[k][i] >= 0 and dep < rb:
                        rb, best_b = dep, qi
            if len(pend_w[s]) <= wmax[s]:
                for qi, q in enumerate(f_orders[s]):
                    p_ = f_ptr[s][qi]
                    if p_ < len(q) and sum(inflight[s]) < caps[s] and inflight[s][qi] < qcap[s][qi]:
                        k, i = q[p_]
                        dep = 0.0 if k == 0 else fin_f[k - 1][i]
                        if dep >= 0:
                            dep += delay_f[k]
                        if dep >= 0 and (dep < rf or (dep == rf and schedule == "zbv")):
                            rf, best_f = dep, qi
            if len(pend_w[s]) > wmax[s]:
                k = pend_w[s].pop(0)
                end = t + dur_w[k]
                busy[s] += dur_w[k]
                kind, dep_id, dep_t = 2, -1, -1.0
                break
            run_b = best_b >= 0 and rb <= t
            run_f = best_f >= 0 and rf <= t
            if run_b and run_f and f_first:
                run_b = False
            if run_b:
                k, i = b_orders[s][best_b][b_ptr[s][best_b]]
                b_ptr[s][best_b] += 1
                end = t + dur_b[k]
                fin_b[k][i] = end
                id_b[k][i] = len(op_kind)
                busy[s] += dur_b[k]
                kind, dep_t = 1, rb
                dep_id = id_f[k][i] if k == last else id_b[k + 1][i]
                inflight[s][queue_of[k]] -= 1
                if zb:
                    pend_w[s].append(k)
                break
            if run_f:
                k, i = f_orders[s][best_f][f_ptr[s][best_f]]
                f_ptr[s][best_f] += 1
                end = t + dur_f[k]
                fin_f[k][i] = end
                id_f[k][i] = len(op_kind)
                busy[s] += dur_f[k]
                kind, dep_t = 0, rf
                dep_id = id_f[k - 1][i] if k > 0 else -1
                inflight[s][best_f] += 1
                break
            if pend_w[s]:
                k = pend_w[s].pop(0)
                end = t + dur_w[k]
                busy[s] += dur_w[k]
                kind, dep_id, dep_t = 2, -1, -1.0
                break
            nxt = min(rb, rf)
            if nxt < inf and (not heap or nxt <= heap[0][0]):
                t = nxt
                continue
            break
        if end < 0:  # blocked: wait for a dependency (or for another stage to produce one)
            free[s] = t
            waiting.append(s)
            if nxt < inf:
                seq += 1
                heapq.heappush(heap, (nxt, seq, s, version[s]))
            elif not heap:
                raise RuntimeError(f"pipeline simulation deadlocked ({schedule}, pp={pp}, vpp={vpp}, m={m})")
            continue
        op_kind.append(kind)
        op_chunk.append(k)
        bound = dep_id >= 0 and dep_t > last_end[s]
        op_pred.append(dep_id if bound else last_op[s])
        if kind == 0:
            op_delay.append(int(bound and delay_f[k] > 0))
        elif kind == 1:
            op_delay.append(int(bound and delay_b[k] > 0))
        else:
            op_delay.append(0)
        last_op[s], last_end[s] = len(op_kind) - 1, end
        free[s] = end
        remaining[s] -= 1
        if end > makespan:
            makespan, end_op = end, len(op_kind) - 1
        if remaining[s]:
            seq += 1
            heapq.heappush(heap, (end, seq, s, version[s]))
        if waiting:
            still = []
            for w_ in waiting:
                if w_ != s and s in feeds[w_]:
                    version[w_] += 1
                    seq += 1
                    heapq.heappush(heap, (free[w_], seq, w_, version[w_]))
                elif w_ != s:
                    still.append(w_)
            waiting = still
    if any(remaining):
        raise RuntimeError(f"pipeline simulation deadlocked ({schedule}, pp={pp}, vpp={vpp}, m={m})")
    # coefficients of (f, b, w, c, f_last, b_last, w_last) along the critical path
    coef = [0] * 7
    op = end_op
    while op >= 0:
        kind, k = op_kind[op], op_chunk[op]
        is_last = k == last
        coef[3] += op_delay[op]
        if kind == 0:
            coef[0] += 1
            coef[4] += is_last
            coef[3] += not asynchronous and k < last and st[k + 1] != st[k]
        elif kind == 1:
            coef[1] += 1
            coef[5] += is_last
            coef[3] += not asynchronous and k > 0 and st[k - 1] != st[k]
            if not zb:
                coef[2] += 1
                coef[6] += is_last
        else:
            coef[2] += 1
            coef[6] += is_last
        op = op_pred[op]
    return makespan, busy, sends, tuple(coef)


def static_reference(
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
    per_chunk: tuple[list[float], list[float], list[float]] | None = None,
) -> tuple[float, list[float], list[int], tuple[int, ...]]:
    """1F1B / interleaved in Megatron's fixed per-stage order, written straightforwardly: each stage's list
    of (kind, chunk, micro-batch) from Megatron's warm-up count and schedule table, then rounds over the
    stages running every head whose input is done, until all have run. Returns (makespan, busy per stage,
    sends per stage and micro-batch, critical-path coefficients of (f, b, w, c, f_last, b_last, w_last));
    ``per_chunk``: each chunk's own (F, B, W) durations instead of ``f, b, w`` and the last chunk's extras."""
    interleaved = schedule == "interleaved"
    v = vpp if interleaved else 1
    nv = pp * v
    last = nv - 1
    dur = {}
    sends = [0] * pp
    for k in range(nv):
        s = k % pp
        fk, bk = (f + f_last, (b + b_last) + (w + w_last)) if k == last else (f, b + w)
        if per_chunk is not None:
            fk, bk = per_chunk[0][k], per_chunk[1][k] + per_chunk[2][k]
        if not interleaved and pp > 1 and k < last:
            fk += c
            sends[s] += 1
        if not interleaved and pp > 1 and k > 0:
            bk += c
            sends[s] += 1
        dur[(0, k)], dur[(1, k)] = fk, bk
    # Megatron's virtual micro-batch id -> (micro-batch, chunk on the stage): groups of pp, chunks ascending
    table = [(g + j, ck) for g in range(0, m, pp) for ck in range(v) for j in range(min(pp, m - g))]
    if not interleaved:
        table = [(i, 0) for i in range(m)]
    lists = []
    for s in range(pp):
        total = len(table)
        warm = min(2 * (pp - s - 1) + (v - 1) * pp if interleaved else pp - s - 1, total)
        fw = [(0, ck * pp + s, i) for i, ck in table]
        bw = [(1, (v - 1 - ck) * pp + s, i) for i, ck in table]
        seq = fw[:warm]
        for k in range(total - warm):
            seq += [fw[warm + k], bw[k]]
        lists.append(seq + bw[total - warm :])
    fin: dict[tuple[int, int, int], float] = {}
    pred: dict[tuple[int, int, int], tuple[int, int, int] | None] = {}
    via: dict[tuple[int, int, int], int] = {}
    busy = [0.0] * pp
    prev: list[tuple[int, int, int] | None] = [None] * pp
    at = [0] * pp
    while any(at[s] < len(lists[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            while at[s] < len(lists[s]):
                op = lists[s][at[s]]
                kind, k, i = op
                if kind == 0:
                    dep = (0, k - 1, i) if k > 0 else None
                    delay = c if interleaved and k > 0 else 0.0
                else:
                    dep = (1, k + 1, i) if k < last else (0, k, i)
                    delay = c if interleaved and k < last else 0.0
                if dep is not None and dep not in fin:
                    break
                t = fin[prev[s]] if prev[s] is not None else 0.0
                r = (fin[dep] if dep is not None else 0.0) + delay
                if dep is not None and r > t:
                    t, pred[op], via[op] = r, dep, int(delay > 0)
                else:
                    t, pred[op], via[op] = max(t, r), prev[s], 0
                fin[op] = t + dur[(kind, k)]
                busy[s] += dur[(kind, k)]
                prev[s] = op
                at[s] += 1
                moved = True
        assert moved, "deadlock"
    makespan = max(fin.values())
    # the first pass (forwards before backwards, chunk, micro-batch) to end last
    end = min((op for op, t in fin.items() if t == makespan), key=lambda o: (o[0], o[1], o[2]))
    coef = [0] * 7
    node: tuple[int, int, int] | None = end
    while node is not None:
        kind, k, _ = node
        coef[3] += via[node]
        if kind == 0:
            coef[0] += 1
            coef[4] += k == last
            coef[3] += not interleaved and k < last
        else:
            coef[1] += 1
            coef[2] += 1
            coef[3] += not interleaved and k > 0
            coef[5] += k == last
            coef[6] += k == last
        node = pred[node]
    return makespan, busy, sends, tuple(coef)
