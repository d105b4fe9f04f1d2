"""Torch microbenchmarks of one node for the hardware profile (``primus-optuna calibrate``): GEMMs (plain, FP8
through ``torch._scaled_mm``, grouped), causal SDPA forward and backward, memory-bound kernels, the framework's own
cost per kernel (a tiny transformer layer), the caching
allocator's reserve on a transformer layer, and collectives among the local devices through torch.distributed.

Every function takes a ``deadline`` (``time.perf_counter()`` value) and measures the items it is given in rounds
until it passes (:func:`measure_rounds`: the first item always), returning plain dicts (the fields of :mod:`primus_optuna.spec.profile`'s points); an item that the
device or the build cannot run is skipped (collectives: recorded with the reason).

Example::

    deadline = time.perf_counter() + 5
    bench_gemm([(256, 256, 256)], "fp32", torch.device("cpu"), deadline)
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..physics.flops import ATTN_BWD_FACTOR
from ..physics.shapes import LayerShape
from ..physics.throughput import KERNELS_DENSE
from ..spec.network import COLLECTIVES, bus_factor
from .layer import build_layer, make_input

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ELT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


ROUNDS = 5
"""at most this many rounds over a table's items (the median of each item's rounds is kept)"""


def time_call(fn: Callable[[], Any], device: torch.device, target_s: float, blocks: int = 3) -> float:
    """Seconds per call of ``fn``: one warm-up call, then ``blocks`` blocks of calls sized to ``target_s /
    blocks`` each; the median block's mean."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = max(time.perf_counter() - t0, 1e-7)
    reps = int(min(200, max(1, target_s / blocks / first)))
    times = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def measure_rounds(
    fns: Sequence[Callable[[], Any]], device: torch.device, deadline: float, first: int = 1
) -> list[float | None]:
    """Seconds per call of each of ``fns``: rounds over all of them in turn (at most :data:`ROUNDS`) until the
    deadline, the median of each one's rounds, so that a load that comes and goes on a shared machine weighs
    on every item alike (None: never reached; the first round of the first ``first`` items always runs)."""
    samples: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for r in range(ROUNDS):
        for i, fn in enumerate(fns):
            if (r or i >= first) and time.perf_counter() >= deadline:
                return [statistics.median(x) if x else None for x in samples]
            left = (n - i) + (ROUNDS - 1 - r) * n
            samples[i].append(time_call(fn, device, _target(deadline, left), blocks=1))
    return [statistics.median(x) if x else None for x in samples]


def spread(items: Sequence[Any]) -> list[Any]:
    """``items`` (sorted by size) reordered so that any prefix covers their range: ends first, then midpoints
    (a budget that runs out still leaves a curve from the smallest to the largest)."""
    n = len(items)
    if n <= 2:
        return list(items)
    order = [0, n - 1]
    seen = set(order)
    step = n - 1
    while len(order) < n:
        step = max(1, step // 2)
        for i in range(step, n - 1, step):
            if i not in seen:
                seen.add(i)
                order.append(i)
    return [items[i] for i in order]


def _target(deadline: float, left: int) -> float:
    return max(0.002, min(0.5, (deadline - time.perf_counter()) / max(1, left) / 2))


def bench_gemm(
    shapes: Sequence[tuple[int, int, int]], dtype: str, device: torch.device, deadline: float
) -> list[dict[str, Any]]:
    """Plain GEMMs ``[m, k] x [k, n]`` in ``dtype`` (``fp8``: ``torch._scaled_mm`` with unit scales, BF16 out)."""
    items, fns = [], []
    for m, n, k in spread(sorted(shapes, key=lambda s: s[0] * s[1] * s[2])):
        try:
            fn = _gemm_fn(m, n, k, dtype, device)
            fn()
        except (RuntimeError, TypeError, NotImplementedError):
            continue  # this device or build cannot run the kernel (e.g. fp8 before Hopper/MI300)
        items.append((m, n, k))
        fns.append(fn)
    kernel = "_scaled_mm" if dtype == "fp8" else "matmul"
    times = measure_rounds(fns, device, deadline)
    return [_gemm_point(dtype, m, n, k, 1, t, kernel) for (m, n, k), t in zip(items, times, strict=True) if t]


def _gemm_point(dtype: str, m: int, n: int, k: int, count: int, sec: float, kernel: str) -> dict[str, Any]:
    flops = 2.0 * m * n * k * count
    return {
        "dtype": dtype,
        "m": m,
        "n": n,
        "k": k,
        "count": count,
        "seconds": sec,
        "tflops": flops / sec / 1e12,
        "kernel": kernel,
    }


def _gemm_fn(m: int, n: int, k: int, dtype: str, device: torch.device) -> Callable[[], Any]:
    if dtype == "fp8":
        if not hasattr(torch, "_scaled_mm") or device.type != "cuda":
            raise NotImplementedError("fp8 GEMMs need torch._scaled_mm on a GPU")
        f8 = torch.float8_e4m3fn
        a = torch.randn(m, k, device=device).to(f8)
        b = torch.randn(n, k, device=device).to(f8).t()  # column-major, as _scaled_mm requires
        one = torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    dt = TORCH_DTYPES[dtype]
    a = torch.randn(m, k, device=device, dtype=dt)
    b = torch.randn(k, n, device=device, dtype=dt)
    return lambda: torch.matmul(a, b)


def bench_grouped_gemm(
    shapes: Sequence[tuple[int, int, int, int]], dtype: str, device: torch.device, deadline: float
) -> list[dict[str, Any]]:
    """Grouped GEMMs of ``count`` experts, ``m`` tokens each, ``[m, k] x [k, n]``: ``torch._grouped_mm`` where
    the build has it on this device, else a batched GEMM (``torch.bmm``: equal groups in one kernel)."""
    dt = TORCH_DTYPES[dtype]
    items = spread(sorted(shapes, key=lambda s: s[0] * s[1] * s[2] * s[3]))
    fns = [_grouped_fn(m, n, k, count, dt, device) for m, n, k, count in items]
    times = measure_rounds([fn for fn, _ in fns], device, deadline)
    return [
        _gemm_point(dtype, m, n, k, count, t, kernel)
        for (m, n, k, count), (_, kernel), t in zip(items, fns, times, strict=True)
        if t
    ]


def _grouped_fn(
    m: int, n: int, k: int, count: int, dt: torch.dtype, device: torch.device
) -> tuple[Callable[[], Any], str]:
    a = torch.randn(count, m, k, device=device, dtype=dt)
    b = torch.randn(count, k, n, device=device, dtype=dt)
    if device.type == "cuda" and hasattr(torch, "_grouped_mm"):
        flat = a.reshape(count * m, k)
        offs = torch.arange(m, count * m + 1, m, device=device, dtype=torch.int32)
        bt = b.transpose(-2, -1).contiguous().transpose(-2, -1)
        try:
            torch._grouped_mm(flat, bt, offs=offs)
            return (lambda: torch._grouped_mm(flat, bt, offs=offs)), "_grouped_mm"
        except (RuntimeError, TypeError, NotImplementedError):
            pass
    return (lambda: torch.bmm(a, b)), "bmm"


def bench_attention(
    shapes: Sequence[tuple[int, int, int, int]], dtype: str, device: torch.device, deadline: float
) -> list[dict[str, Any]]:
    """Causal ``scaled_dot_product_attention`` of (seq, head_dim, heads, batch), forward and forward+backward;
    rates in the physics' FLOP count (forward 2·b·h·s²·d for the causal half, backward
    :data:`~primus_optuna.physics.flops.ATTN_BWD_FACTOR` times that)."""
    dt = TORCH_DTYPES[dtype]
    items, fns = [], []
    for seq, d, heads, batch in spread(sorted(shapes, key=lambda s: s[0] * s[0] * s[1] * s[2] * s[3])):
        try:
            fwd, fwd_bwd = _attention_fns(seq, d, heads, batch, dt, device)
            fwd_bwd()
        except (RuntimeError, NotImplementedError):
            continue
        items.append((seq, d, heads, batch))
        fns += [fwd, fwd_bwd]
    times = measure_rounds(fns, device, deadline, first=2)  # a forward and its forward + backward
    out = []
    for j, (seq, d, heads, batch) in enumerate(items):
        t_f, t_fb = times[2 * j], times[2 * j + 1]
        if not t_f or not t_fb:
            continue
        t_b = max(t_fb - t_f, t_f * 0.1)
        flops = 2.0 * batch * heads * seq * seq * d
        out.append(
            {
                "seq": seq,
                "head_dim": d,
                "heads": heads,
                "batch": batch,
                "dtype": dtype,
                "fwd_s": t_f,
                "bwd_s": t_b,
                "fwd_tflops": flops / t_f / 1e12,
                "bwd_tflops": flops * ATTN_BWD_FACTOR / t_b / 1e12,
            }
        )
    return out


def _attention_fns(
    seq: int, d: int, heads: int, batch: int, dt: torch.dtype, device: torch.device
) -> tuple[Callable[[], Any], Callable[[], Any]]:
    q, k, v = (
        torch.randn(batch, heads, seq, d, device=device, dtype=dt, requires_grad=True) for _ in range(3)
    )
    grad = torch.randn(batch, heads, seq, d, device=device, dtype=dt)

    def fwd() -> torch.Tensor:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd() -> None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), grad)

    return fwd, fwd_bwd


def bench_memory(
    sizes: Sequence[int], dtype: str, device: torch.device, deadline: float
) -> list[dict[str, Any]]:
    """Copies, adds and RMSNorms of ``sizes`` elements (rows of 1024) in ``dtype``: bytes read + written."""
    dt = TORCH_DTYPES[dtype]
    elt = ELT_BYTES[dtype]
    calls = [
        (name, nbytes, fn)
        for n in spread(sorted(sizes))
        for name, (fn, nbytes) in _memory_fns(n, elt, dt, device).items()
    ]
    times = measure_rounds([fn for _, _, fn in calls], device, deadline)
    return [
        {"kernel": name, "bytes": nbytes, "seconds": t, "gbs": nbytes / t / 1e9, "dtype": dtype}
        for (name, nbytes, _), t in zip(calls, times, strict=True)
        if t
    ]


def _memory_fns(
    n: int, elt: int, dt: torch.dtype, device: torch.device
) -> dict[str, tuple[Callable[[], Any], int]]:
    """Per kernel: one call and the bytes it reads and writes."""
    x = torch.randn(n // 1024, 1024, device=device, dtype=dt)
    y = torch.empty_like(x)
    w = torch.ones(1024, device=device, dtype=dt)
    return {
        "copy": (lambda: y.copy_(x), 2 * n * elt),
        "add": (lambda: torch.add(x, x, out=y), 3 * n * elt),
        "rmsnorm": (lambda: F.rms_norm(x, (1024,), w), 2 * n * elt),
    }


TINY_LAYER = LayerShape(hidden=64, heads=2, groups=2, head_dim=32, ffn=128, seq=16, mbs=1)
"""a transformer layer whose arithmetic is negligible: its forward and backward time is the framework's own"""


def op_overhead(dtype: str, device: torch.device, deadline: float) -> float:
    """Seconds per kernel of the framework's own work: the forward and backward of :data:`TINY_LAYER` (this
    package's eager transformer layer: norms, projections, SDPA, SwiGLU MLP, residuals, as custom autograd
    functions) over the kernels the step-time model counts in a dense layer's forward and backward
    (3 × (4 GEMMs + attention + :data:`~primus_optuna.physics.throughput.KERNELS_DENSE`))."""
    dt = TORCH_DTYPES[dtype]
    layer = build_layer(TINY_LAYER, dtype=dt, device=device)
    x = make_input(TINY_LAYER, dtype=dt, device=device)

    def step() -> None:
        layer(x).float().sum().backward()

    t = measure_rounds([step], device, deadline)[0]
    return (t or 0.0) / (3 * (4 + 1 + KERNELS_DENSE))


def allocator_reserve(shape: LayerShape, dtype: str, device: torch.device, steps: int = 3) -> dict[str, Any]:
    """``max_memory_reserved`` against ``max_memory_allocated`` over a few forward + backward passes of one
    transformer layer of ``shape`` (GPU only: torch's caching allocator is CUDA's)."""
    if device.type != "cuda":
        return {
            "applicable": False,
            "reason": "CPU: no caching device allocator (torch.cuda.max_memory_reserved)",
        }
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    layer = build_layer(shape, dtype=TORCH_DTYPES[dtype], device=device)
    for _ in range(steps):
        x = make_input(shape, dtype=TORCH_DTYPES[dtype], device=device)
        layer(x).float().sum().backward()
        layer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    alloc = torch.cuda.max_memory_allocated(device) / 2**30
    reserved = torch.cuda.max_memory_reserved(device) / 2**30
    del layer
    torch.cuda.empty_cache()
    return {
        "applicable": True,
        "allocated_gib": alloc,
        "reserved_gib": reserved,
        "reserve_fraction": (reserved - alloc) / reserved if reserved > 0 else 0.0,
    }


# --- collectives -----------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _op_fn(
    op: str, nbytes: int, rank: int, world: int, device: torch.device, group: Any = None
) -> Callable[[], Any]:
    """One call of collective ``op`` moving ``nbytes`` per rank as nccl-tests counts them, among ``group``
    (default: every rank); ``rank`` and ``world`` are the group's."""
    n = max(world, nbytes // 4 // world * world)
    t = torch.ones(n, dtype=torch.float32, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(t, group=group)
    if op == "all_gather":
        parts = [torch.empty(n // world, dtype=t.dtype, device=device) for _ in range(world)]
        return lambda: dist.all_gather(parts, t[: n // world], group=group)
    if op == "reduce_scatter":
        out = torch.empty(n // world, dtype=t.dtype, device=device)
        parts = list(t.chunk(world))
        return lambda: dist.reduce_scatter(out, parts, group=group)
    if op == "all_to_all":
        out = torch.empty_like(t)
        return lambda: dist.all_to_all_single(out, t, group=group)
    if op == "send_recv":  # the group's ranks 0 and 1 exchange (a ping-pong: the time is half the round trip)
        peer = [dist.get_global_rank(group, r) if group is not None else r for r in (0, 1)]

        def pingpong() -> None:
            if rank == 0:
                dist.send(t, peer[1])
                dist.recv(t, peer[1])
            elif rank == 1:
                dist.recv(t, peer[0])
                dist.send(t, peer[0])

        return pingpong
    raise ValueError(op)


def measure_collectives(
    ops: Sequence[str],
    sizes: Sequence[int],
    device: torch.device,
    backend: str,
    deadline: float,
    group: Any = None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every rank of ``group`` (default: all) times each of ``ops`` over message ``sizes`` until the
    ``deadline`` (all stop at the same point): the points (bus bandwidth with nccl-tests' factors,
    :func:`~primus_optuna.spec.network.bus_factor`) and, per op not measured, why."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    points: list[dict[str, Any]] = []
    unsupported: dict[str, str] = {}
    for op in ops:
        for nbytes in sizes:
            flag = torch.tensor([float(time.perf_counter() < deadline)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)  # every rank stops at the same point
            if flag.item() == 0:
                unsupported.setdefault(op, "time budget spent before it was measured")
                break
            try:
                fn = _op_fn(op, nbytes, rank, world, device, group)
                sec = _timed_collective(fn, device, group)
            except (RuntimeError, ValueError) as exc:  # the backend lacks it (gloo: reduce_scatter)
                unsupported[op] = f"{backend}: {str(exc).splitlines()[0][:160]}"
                dist.barrier(group=group)
                break
            if op == "send_recv":
                sec /= 2
            algbw = nbytes / sec / 1e9
            ranks = 2 if op == "send_recv" else world
            points.append(
                {
                    "op": op,
                    "ranks": ranks,
                    "bytes": nbytes,
                    "seconds": sec,
                    "algbw_gbs": algbw,
                    "busbw_gbs": algbw * bus_factor(op, ranks),
                }
            )
    return points, unsupported


def _collective_worker(rank: int, world: int, port: int, args: dict[str, Any], result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args["threads"]:
        torch.set_num_threads(args["threads"])
    if args["device"] == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args["backend"], rank=rank, world_size=world)
    deadline = time.perf_counter() + args["budget_s"]
    try:
        points, unsupported = measure_collectives(
            args["ops"], args["sizes"], device, args["backend"], deadline
        )
        if rank == 0:
            Path(result).write_text(json.dumps({"points": points, "unsupported": unsupported}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _timed_collective(fn: Callable[[], Any], device: torch.device, group: Any = None, reps: int = 5) -> float:
    """Median seconds of ``reps`` calls of a collective (each after a barrier), the slowest rank's."""
    fn()
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def bench_collectives(
    world: int,
    device: str,
    sizes: Sequence[int],
    budget_s: float,
    ops: Sequence[str] = COLLECTIVES,
    threads: int | None = None,
) -> dict[str, Any]:
    """Collectives among ``world`` local processes (one per GPU: NCCL/RCCL; CPU: gloo) over message ``sizes``
    in bytes, spawned with torch.multiprocessing; what the backend refuses is recorded as unsupported."""
    backend = "nccl" if device == "cuda" else "gloo"
    if world < 2:
        return {
            "backend": backend,
            "ranks": world,
            "points": [],
            "unsupported": {op: "one device: no collective to measure" for op in ops},
        }
    args = {
        "backend": backend,
        "device": device,
        "sizes": sorted(sizes),
        "ops": list(ops),
        "threads": threads,
        "budget_s": budget_s,
    }
    with tempfile.TemporaryDirectory(prefix="primus-calibrate-") as tmp:
        result = str(Path(tmp) / "collectives.json")
        # CPU: forked ranks (no second torch import; the caller has not run a parallel region yet); GPUs: spawned
        # (CUDA cannot be used in a forked child)
        torch.multiprocessing.start_processes(
            _collective_worker,
            args=(world, _free_port(), args, result),
            nprocs=world,
            join=True,
            start_method="fork" if device == "cpu" else "spawn",
        )
        data = json.loads(Path(result).read_text())
    return {"backend": backend, "ranks": world, **data}


__all__ = [
    "allocator_reserve",
    "bench_attention",
    "bench_collectives",
    "bench_gemm",
    "bench_grouped_gemm",
    "bench_memory",
    "measure_collectives",
    "measure_rounds",
    "op_overhead",
    "spread",
    "time_call",
]
