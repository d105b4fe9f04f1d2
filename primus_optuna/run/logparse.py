"""Parse training logs (Megatron-LM, AMD Primus, TorchTitan) into a steady-state throughput.

Formats (shared/reference/log-formats.md)::

    Megatron:   iteration 10/ 50 | ... | elapsed time per iteration (ms): 36250.1 | ... | global batch size: 128
    Primus:     ... elapsed time per iteration (ms): 36250.1/36120.4 | ... |
                tokens/s/GPU inst/harmonic mean: 3616.2/3620.8 | ... | hip mem usage/free/total/usage_ratio: 240.12GB/...
    older Primus / TorchTitan / Megatron-Bridge:  tokens per GPU (tokens/s/GPU): X[/Y]
    TorchTitan: step: 10 loss: ... memory: 45.20GiB(56.3%) tps: 8,123 ...  |  memory usage/free/total: ...GiB

Per logged iteration the *instantaneous* value (the first of ``X/Y``) is read; the first logged iterations
(warm-up: compilation, allocator growth, NCCL set-up) are dropped and the rest averaged robustly (median).
When a line prints no tokens/s/GPU it is derived: ``seq_length × global_batch / (elapsed_ms / 1000) / world``.
Primus prints memory with ``/1024**3`` but labels it ``GB``: it is read as GiB. The peak is the maximum over
ranks: Primus's ``rocm max mem usage`` (its own all-reduce over ranks), Megatron's ``report_memory`` lines of
every rank that prints them; Primus's ``hip mem usage`` (one rank's memory in use) is not a peak. The reserved
peak (Megatron's ``max reserved``, TorchTitan's ``memory:``) is kept beside it (``peak_reserved_gib``).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1B\[[0-?]*[ -/]*[@-~]")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"

_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)")
_TITAN_STEP = re.compile(r"\bstep:\s*(\d+)\b")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM)
_TOKENS = (
    re.compile(r"tokens/s/GPU inst/harmonic mean:\s*" + _NUM),
    re.compile(r"tokens per GPU \(tokens/s/GPU\):\s*" + _NUM),
    re.compile(r"\btokens/s/GPU:\s*" + _NUM),
    re.compile(r"\btps:\s*" + _NUM),
)
_TFLOPS = re.compile(r"(?:throughput|compute) per GPU \(TFLOP/s/GPU\):\s*" + _NUM)
_GBS = re.compile(r"global batch size:\s*(\d+)")
# Peak memory, as GiB (Primus/TorchTitan print /1024**3; Megatron's "memory (MB)" is MiB). Each pattern's
# first group is the rank when the line names one.
_MEM_GIB = (
    # Primus: the maximum over all ranks, with the rank that holds it (use_rocm_mem_info;
    # primus/backends/megatron/patches/training_log/print_rank_last_patches.py@fd1eeabb:283-316)
    re.compile(r"(?:rank-(\d+) )?rocm max mem usage/usage_ratio:\s*" + _NUM + r"\s*Gi?B"),
    re.compile(r"()\bmemory:\s*" + _NUM + r"\s*GiB"),  # TorchTitan's peak
    re.compile(r"()peak memory \(GiB\):\s*" + _NUM),  # primus_optuna.workloads.gpt (max over ranks)
)
# Megatron-LM report_memory: printed by every rank that is data-parallel rank 0
# (megatron/training/utils/common_utils.py@d98e8a64:313-334), "[Rank N] (after k iterations) memory (MB) | ...
# | max allocated: X | ...": the peak is the maximum over those ranks
_MEM_MIB = re.compile(r"(?:\[Rank (\d+)\].*)?memory \(MB\).*?max allocated:\s*" + _NUM)
# The reserved peak (the caching allocator's, which the device must hold): Megatron's "max reserved" in the same
# report_memory line (torch.cuda.max_memory_reserved, common_utils.py@d98e8a64:322-325); TorchTitan's
# "memory: X GiB" is its max reserved (reserved_bytes.all.peak, torchtitan/components/metrics.py@b5bcd76c
# :68-70, printed at :531), read as the peak above too, so its reserve over the allocated peak reads as 0
_RESERVED_MIB = re.compile(r"(?:\[Rank (\d+)\].*)?memory \(MB\).*?max reserved:\s*" + _NUM)
_RESERVED_GIB = re.compile(r"()\bmemory:\s*" + _NUM + r"\s*GiB")
# Not a peak: Primus's "hip mem usage" is the printing (last) rank's memory in use at that moment
# (print_rank_last_patches.py@fd1eeabb:259-270); TorchTitan's "memory usage/free/total" likewise.

OOM_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError"),
    re.compile(r"\b(?:CUDA|HIP) out of memory", re.IGNORECASE),
    re.compile(r"RuntimeError:.*out of memory", re.IGNORECASE),
    re.compile(
        r"(?:NCCL|RCCL).*(?:out of memory|Failed to (?:CUDA|HIP) ?(?:malloc|calloc)|ncclSystemError.*alloc)"
    ),
    re.compile(r"hipErrorOutOfMemory|cudaErrorMemoryAllocation"),
)


def _f(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class IterationRecord:
    """One logged iteration (instantaneous values)."""

    iteration: int
    target: int | None = None
    """the run's last iteration when the line says ``iteration i/ N``"""
    elapsed_ms: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    global_batch_size: int | None = None
    memory_gib: float | None = None


@dataclass
class ParsedLog:
    """What a log says: its iterations, the steady-state averages, peak memory and whether it ran out of memory."""

    records: list[IterationRecord] = field(default_factory=list)
    steady: list[IterationRecord] = field(default_factory=list)
    tokens_per_s_per_gpu: float | None = None
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    peak_memory_gib: float | None = None
    """the largest peak any rank reported (None when the log reports no peak)"""
    peak_memory_by_rank: dict[int, float] = field(default_factory=dict)
    """each rank's largest reported peak, for lines that name their rank"""
    peak_reserved_gib: float | None = None
    """the largest reserved peak (the allocator's, allocated plus its cache) any rank reported, where the
    framework prints one (None otherwise)"""
    oom_line: str | None = None

    @property
    def oom(self) -> bool:
        return self.oom_line is not None

    @property
    def completed(self) -> bool:
        """The log reached its last iteration (``iteration N/ N``)."""
        last = self.records[-1] if self.records else None
        return last is not None and last.target is not None and last.iteration >= last.target

    def to_dict(self) -> dict[str, Any]:
        return {
            "iterations_logged": len(self.records),
            "iterations_averaged": [r.iteration for r in self.steady],
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "step_time_s": self.step_time_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "peak_memory_gib": self.peak_memory_gib,
            "peak_memory_by_rank": {str(k): v for k, v in sorted(self.peak_memory_by_rank.items())},
            "peak_reserved_gib": self.peak_reserved_gib,
            "oom": self.oom,
        }


def _parse_line(line: str) -> IterationRecord | None:
    m = _ITER.search(line)
    if m is None:
        m = _TITAN_STEP.search(line)
        if m is None:
            return None
    rec = IterationRecord(iteration=int(m.group(1)), target=int(m.group(2)) if m.re is _ITER else None)
    if e := _ELAPSED.search(line):
        rec.elapsed_ms = _f(e.group(1))
    for pat in _TOKENS:
        if t := pat.search(line):
            rec.tokens_per_s_per_gpu = _f(t.group(1))
            break
    if t := _TFLOPS.search(line):
        rec.tflops_per_gpu = _f(t.group(1))
    if g := _GBS.search(line):
        rec.global_batch_size = int(g.group(1))
    if rec.elapsed_ms is None and rec.tokens_per_s_per_gpu is None:
        return None
    return rec


def parse_line(raw: str) -> IterationRecord | None:
    """One log line as an :class:`IterationRecord` (``None`` when it reports no iteration timing)."""
    return _parse_line(_ANSI.sub("", raw))


def _memory(line: str) -> tuple[int | None, float] | None:
    """(rank or None, peak GiB) a line reports."""
    for pat in _MEM_GIB:
        if m := pat.search(line):
            return (int(m.group(1)) if m.group(1) else None), _f(m.group(2))
    if m := _MEM_MIB.search(line):
        return (int(m.group(1)) if m.group(1) else None), _f(m.group(2)) / 1024
    return None


def _reserved(line: str) -> float | None:
    """The reserved peak (GiB) a line reports."""
    if m := _RESERVED_MIB.search(line):
        return _f(m.group(2)) / 1024
    if m := _RESERVED_GIB.search(line):
        return _f(m.group(2))
    return None


def robust_mean(values: list[float]) -> float:
    """The median (robust to stragglers, checkpoint stalls and GC pauses)."""
    return float(statistics.median(values))


def parse_log(
    text: str,
    *,
    seq_length: int | None = None,
    world_size: int | None = None,
    global_batch_size: int | None = None,
    warmup_iters: int = 2,
) -> ParsedLog:
    """Parse a whole log.

    Records whose iteration number is ``<= warmup_iters`` are dropped, and so is the first logged record
    (it averages over the warm-up when ``log_interval > 1``), as long as at least one record stays.
    """
    out = ParsedLog()
    peak: float | None = None
    by_iter: dict[int, IterationRecord] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        if out.oom_line is None and any(p.search(line) for p in OOM_PATTERNS):
            out.oom_line = line.strip()[:500]
        found = _memory(line)
        mem = None
        if found is not None:
            rank, mem = found
            peak = mem if peak is None else max(peak, mem)
            if rank is not None:
                out.peak_memory_by_rank[rank] = max(mem, out.peak_memory_by_rank.get(rank, 0.0))
        if (reserved := _reserved(line)) is not None:
            out.peak_reserved_gib = max(reserved, out.peak_reserved_gib or 0.0)
        rec = _parse_line(line)
        if rec is None:
            continue
        rec.memory_gib = mem
        by_iter[rec.iteration] = rec  # several ranks may print the same iteration: keep the last
    out.records = [by_iter[k] for k in sorted(by_iter)]
    out.peak_memory_gib = peak
    if not out.records:
        return out
    steady = [r for r in out.records[1:] if r.iteration > warmup_iters] or out.records[-1:]
    out.steady = steady
    times = [r.elapsed_ms for r in steady if r.elapsed_ms is not None]
    if times:
        out.step_time_s = robust_mean(times) / 1000.0
    tokens = [r.tokens_per_s_per_gpu for r in steady if r.tokens_per_s_per_gpu is not None]
    if tokens:
        out.tokens_per_s_per_gpu = robust_mean(tokens)
    elif out.step_time_s and seq_length and world_size:
        gbs = next((r.global_batch_size for r in steady if r.global_batch_size), None) or global_batch_size
        if gbs:
            out.tokens_per_s_per_gpu = seq_length * gbs / out.step_time_s / world_size
    if (
        out.step_time_s is None
        and out.tokens_per_s_per_gpu
        and seq_length
        and world_size
        and global_batch_size
    ):
        out.step_time_s = seq_length * global_batch_size / out.tokens_per_s_per_gpu / world_size
    tfl = [r.tflops_per_gpu for r in steady if r.tflops_per_gpu is not None]
    if tfl:
        out.tflops_per_gpu = robust_mean(tfl)
    return out


def tail(text: str, lines: int = 40, max_chars: int = 4000) -> str:
    """The last ``lines`` lines of a log, at most ``max_chars`` characters."""
    out = "\n".join(text.splitlines()[-lines:])
    return out[-max_chars:]
