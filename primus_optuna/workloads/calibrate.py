"""``calibrate``: measure this node with the installed torch and return its hardware profile
(:class:`~primus_optuna.spec.profile.HardwareProfile`), which a study names in ``cluster.profile``.

The sections share the time budget (collectives first, 25% with their processes' start-up; then GEMMs 30%,
grouped GEMMs 8%, attention 22%, memory-bound kernels 10%, the allocator's reserve 5% on GPUs, of what is left);
each measures its shapes ends first, so that a short
budget still spans their range (:func:`~primus_optuna.workloads.microbench.spread`). The shapes are the
study's own when one is given (every GEMM of a layer and the output layer at each tp and mbs candidate, the
MoE experts' grouped GEMMs, attention at the sequence each cp candidate leaves and around it), else a default
grid per device. On CPU every rank (process) runs the same measurements at once, as the ranks of a training
share the cores, caches and memory bandwidth; a GPU is measured alone. Torch is imported when measuring starts (through :mod:`primus_optuna.workloads.microbench`).

Example::

    profile = calibrate(device="cpu", budget_s=10)
    profile.save("cpu-node.yaml")
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ..errors import SpecError
from ..physics.flops import layer_gemms, logits_gemm
from ..physics.measured import fit_tables
from ..physics.shapes import LayerShape
from ..space import Space
from ..spec.profile import HardwareProfile
from ..spec.study import StudySpec

SHARES = {
    "collectives": 0.25,
    "gemm": 0.30,
    "grouped_gemm": 0.08,
    "attention": 0.22,
    "memory": 0.10,
    "allocator": 0.05,
}
"""each section's share of the budget (the collectives' process start-up included)"""
STARTUP_S = {"cpu": 1.0, "cuda": 10.0}
"""what the collectives' processes take to start (forked on CPU, spawned on GPUs), kept out of their share"""
COLLECTIVE_SIZES = {"cpu": [2**k for k in range(10, 23, 3)], "cuda": [2**k for k in range(12, 31, 2)]}
"""message bytes per rank (CPU: 1 KiB - 4 MiB; GPU: 4 KiB - 1 GiB, as nccl-tests' -b 4K -e 1G -f 4)"""
MEMORY_ELEMENTS = {"cpu": [2**k for k in range(12, 23, 2)], "cuda": [2**k for k in range(16, 29, 2)]}

Progress = Callable[[str, float], None]
"""``progress(section, fraction of the budget spent)``"""


def _default_gemms(device: str) -> list[tuple[int, int, int]]:
    if device == "cpu":
        ms, nks = (64, 256, 1024), ((128, 128), (512, 128), (128, 512), (512, 512), (1024, 1024))
    else:
        ms = (512, 2048, 8192, 16384)
        nks = ((1024, 1024), (4096, 4096), (8192, 8192), (14336, 4096), (4096, 14336))
    return [(m, n, k) for m in ms for n, k in nks]


def _default_attention(device: str) -> list[tuple[int, int, int, int]]:
    if device == "cpu":
        return [(s, d, 4, 1) for s in (64, 128, 256, 512) for d in (32, 64)]
    return [(s, d, 16, 1) for s in (512, 1024, 2048, 4096, 8192) for d in (64, 128)]


def study_shapes(
    spec: StudySpec,
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
    """The study's GEMMs (m, n, k) with their backward layouts, grouped GEMMs (tokens per expert, n, k, local
    experts) and attention calls (seq, head_dim, heads, batch) at its tp, mbs, cp and ep candidates (at most
    three of each)."""
    cand = Space(spec).candidates
    md, seq = spec.model, spec.workload.seq_length

    def few(axis: str) -> list[int]:
        vals = sorted(set(cand[axis]))
        return vals if len(vals) <= 3 else [vals[0], vals[len(vals) // 2], vals[-1]]

    gemms: set[tuple[int, int, int]] = set()
    grouped: set[tuple[int, int, int, int]] = set()
    for tp in few("tp"):
        for mbs in few("mbs"):
            for ep in few("ep") if md.is_moe else [1]:
                g = layer_gemms(md, seq, mbs, tp, 1, ep)
                for x in (*g.attention, *g.shared, logits_gemm(md, seq, mbs, tp, 1)):
                    gemms.add((max(1, round(x.m)), max(1, round(x.n)), max(1, round(x.k))))
                if g.grouped:
                    router, *experts = g.mlp
                    gemms.add((max(1, round(router.m)), max(1, round(router.n)), round(router.k)))
                    for x in experts:
                        grouped.add((max(1, round(x.m)), round(x.n), round(x.k), max(1, round(x.count))))
                else:
                    for x in g.mlp:
                        gemms.add((max(1, round(x.m)), round(x.n), round(x.k)))
    # backward runs each GEMM twice more at the same work: dgrad [m, n] x [n, k] and wgrad [k, m] x [m, n]
    gemms |= {(m, k, n) for m, n, k in gemms} | {(k, n, m) for m, n, k in gemms}
    heads = md.num_attention_heads
    attention: set[tuple[int, int, int, int]] = set()
    for cp in few("cp"):
        s = seq // cp
        for span in (s // 4, s // 2, s, 2 * s):
            if span >= 16:
                attention.add((span, md.head_dim, max(1, heads // min(few("tp"))), 1))
    return sorted(gemms), sorted(grouped), sorted(attention)


def device_info(device: str, count: int, threads: int | None) -> dict[str, Any]:
    """What ran the measurements: the device, how many, the software versions torch reports."""
    import torch

    info: dict[str, Any] = {
        "kind": device,
        "count": count,
        "threads": threads,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    if device == "cuda":
        info["name"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
        info["hip"] = getattr(torch.version, "hip", None)
        info["cudnn"] = torch.backends.cudnn.version()
        try:
            info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError, TypeError):
            info["nccl"] = None
    else:
        info["name"] = f"cpu ({threads} threads per process)"
    return info


def check_request(device: str, budget_s: float, devices: int | None) -> None:
    """Refuse a bad request before anything is measured (one :class:`SpecError` naming the option)."""
    if device not in ("cpu", "cuda"):
        raise SpecError(f"--device {device!r}: choose cpu or cuda")
    if not budget_s > 0 or math.isinf(budget_s):
        raise SpecError(f"--budget-s {budget_s!r}: give a positive number of seconds (e.g. 300)")
    if devices is not None and devices < 1:
        raise SpecError(f"--devices {devices}: give at least 1")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SpecError("--device cuda: torch sees no GPU on this machine; use --device cpu")
        if devices is not None and devices > torch.cuda.device_count():
            raise SpecError(f"--devices {devices}: this node has {torch.cuda.device_count()} GPUs")


def calibrate(
    device: str = "cuda",
    budget_s: float = 300.0,
    study: StudySpec | None = None,
    devices: int | None = None,
    progress: Progress | None = None,
) -> HardwareProfile:
    """Measure this node and return its hardware profile (nothing is written: :meth:`HardwareProfile.save`).

    ``devices``: GPUs to run the collectives among (default: all), or on CPU the processes (default 2), each
    with ``cores / processes`` torch threads as the ``local`` runner gives its ranks."""
    check_request(device, budget_s, devices)
    import torch

    from ..workloads import microbench as mb

    t_start = time.perf_counter()
    end = t_start + budget_s
    say = progress or (lambda section, fraction: None)
    count = devices or (torch.cuda.device_count() if device == "cuda" else 2)
    threads = max(1, (os.cpu_count() or 1) // count) if device == "cpu" else None
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    compute = "bf16" if device == "cuda" else "fp32"
    if study is not None:
        gemms, grouped, attention = study_shapes(study)
        head_dim: int | None = study.model.head_dim
    else:
        gemms, grouped, attention = _default_gemms(device), [], _default_attention(device)
        head_dim = None
        grouped = [(m // 8, n, k, 8) for m, n, k in gemms if m >= 256][:6]
    extra = ["fp8"] if device == "cuda" and torch.cuda.get_device_capability(0) >= (8, 9) else ["bf16"]
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        # first: on CPU the ranks are forked, before this process has run a parallel region
        say("collectives", 0.0)
        share = max(0.5, SHARES["collectives"] * budget_s - STARTUP_S[device])
        collectives = mb.bench_collectives(count, device, COLLECTIVE_SIZES[device], share, threads=threads)
        args = (mb, dev, compute, extra, gemms, grouped, attention, device, t_start, end)
        # CPU: the ranks share the cores, caches and memory bandwidth, so every rank runs the same benchmarks at
        # once (forked siblings) and this process's timings are kept; a GPU is measured alone
        siblings = _start_siblings(count - 1, args, study) if device == "cpu" else []
        try:
            data = _measure(*args, say, study)
        except BaseException:  # interrupted (Ctrl-C): the siblings' results are not wanted
            for proc in siblings:
                proc.terminate()
            raise
        finally:
            for proc in siblings:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.terminate()
        data["collectives"] = collectives
    finally:
        torch.set_num_threads(old_threads)
    say("done", 1.0)
    data.update(
        schema_version=1,
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        device=device_info(device, count, threads),
        compute_dtype=compute,
        budget_s=budget_s,
        elapsed_s=time.perf_counter() - t_start,
    )
    data["fitted"] = fit_tables(data, compute, head_dim)
    return HardwareProfile.model_validate(data)


def _start_siblings(n: int, args: tuple[Any, ...], study: StudySpec | None) -> list[Any]:
    """``n`` forked processes running the same measurements as this one (their results dropped)."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("fork")
    procs = [ctx.Process(target=_sibling, args=(*args, _quiet, study), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    return procs


def _sibling(*args: Any) -> None:
    """A forked sibling's :func:`_measure`; a Ctrl-C (sent to the whole process group) ends it quietly, the
    parent saying that the calibration was interrupted."""
    try:
        _measure(*args)
    except KeyboardInterrupt:
        pass


def _quiet(section: str, fraction: float) -> None:
    """A sibling's progress: none."""


def _measure(
    mb: Any,
    dev: Any,
    compute: str,
    extra: list[str],
    gemms: list[tuple[int, int, int]],
    grouped: list[tuple[int, int, int, int]],
    attention: list[tuple[int, int, int, int]],
    device: str,
    t_start: float,
    end: float,
    say: Progress,
    study: StudySpec | None,
) -> dict[str, Any]:
    """Every section but the collectives, each until its share of the budget is spent."""
    budget = end - t_start
    clock = time.perf_counter()
    rest = max(end - clock, 0.0) / sum(v for k, v in SHARES.items() if k != "collectives")
    out: dict[str, Any] = {}

    def until(section: str) -> float:
        nonlocal clock
        say(section, (time.perf_counter() - t_start) / budget)
        clock += SHARES[section] * rest
        return min(clock, end)

    start = clock
    stop = until("gemm")
    split = start + (stop - start) * 0.7
    out["gemm"] = mb.bench_gemm(gemms, compute, dev, split)
    out["gemm"] += mb.bench_gemm(gemms, extra[0], dev, stop)
    out["gemm"] += mb.bench_grouped_gemm(grouped, compute, dev, until("grouped_gemm"))
    out["attention"] = mb.bench_attention(attention, compute, dev, until("attention"))
    start = time.perf_counter()
    stop = until("memory")
    out["memory"] = mb.bench_memory(MEMORY_ELEMENTS[device], compute, dev, start + 0.9 * (stop - start))
    out["op_overhead_us"] = mb.op_overhead(compute, dev, stop) * 1e6
    shape = _allocator_shape(study)
    stop = until("allocator")
    out["allocator"] = (
        mb.allocator_reserve(shape, compute, dev)
        if time.perf_counter() < stop or device == "cpu"
        else {"applicable": False, "reason": "time budget spent before it was measured"}
    )
    return out


def _allocator_shape(study: StudySpec | None) -> LayerShape:
    """A representative layer: the study's baseline layer at a quarter of its sequence, else a 4096-wide one."""
    if study is not None:
        space = Space(study)
        return LayerShape.from_config(study, space.baseline, scale=0.25)
    return LayerShape(hidden=4096, heads=32, groups=8, head_dim=128, ffn=14336, seq=2048, mbs=1)


__all__ = [
    "COLLECTIVE_SIZES",
    "SHARES",
    "calibrate",
    "check_request",
    "device_info",
    "fit_tables",
    "study_shapes",
]
