"""Rank every legal configuration of a study by estimated throughput: :func:`plan_space`.

Each configuration gets the memory estimate (dropped when it does not fit the usable HBM) and the step-time
estimate; the survivors are ranked by tokens/s/GPU. Also reports the baseline's rank and the Pareto set of
throughput vs peak memory. Shared by the ``plan`` command, the sampler and the report.

Example::

    result = plan_space(spec, Space(spec), top=5)
    result.top[0].config, result.baseline_rank
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..space import Space, TrainingConfig
from ..spec.study import StudySpec
from .calibration import Calibration
from .memory import MemoryEstimate, estimate_memory, peak_memory_all, usable_gib
from .throughput import (
    ThroughputEstimate,
    estimate_throughput,
    estimate_throughput_all,
    layout_of,
    throughput_bound,
)


@dataclass(frozen=True, slots=True)
class PlanEntry:
    """One estimated configuration."""

    config: TrainingConfig
    throughput: ThroughputEstimate
    peak_gib: float
    fits: bool

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.throughput.tokens_per_s_per_gpu

    def to_dict(self, breakdown: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "config": self.config.to_params(),
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "peak_gib": self.peak_gib,
        }
        if breakdown:
            d["step_time_s"] = self.throughput.step_time_s
            d["mfu"] = self.throughput.mfu
            d["breakdown_s"] = dict(self.throughput.breakdown_s)
        return d


@dataclass
class PlanResult:
    """The ranking of a study's space."""

    legal_configs: int
    feasible_configs: int
    top: list[PlanEntry]
    baseline: PlanEntry | None
    baseline_rank: int | None
    """1-based rank among the feasible configurations; None when the baseline is illegal or does not fit"""
    baseline_throughput_rank: int | None
    """1 + feasible configurations estimated faster than the baseline (its place if memory were no limit)"""
    pareto: list[PlanEntry]
    """feasible configurations no other beats on both throughput (higher) and peak memory (lower)"""
    ranked: list[PlanEntry] = field(default_factory=list, repr=False)
    """every feasible configuration, best first"""

    def to_dict(self) -> dict[str, Any]:
        """The ``plan --json`` document."""
        base = None
        if self.baseline is not None:
            base = {
                "config": self.baseline.config.to_params(),
                "tokens_per_s_per_gpu": self.baseline.tokens_per_s_per_gpu,
                "rank": self.baseline_rank,
                "throughput_rank": self.baseline_throughput_rank,
                "peak_gib": self.baseline.peak_gib,
                "fits": self.baseline.fits,
            }
        return {
            "legal_configs": self.legal_configs,
            "feasible_configs": self.feasible_configs,
            "top": [e.to_dict() for e in self.top],
            "baseline": base,
            "pareto": [e.to_dict() for e in self.pareto],
        }


def pareto_front(entries: list[PlanEntry]) -> list[PlanEntry]:
    """Entries not dominated on (throughput ↑, peak memory ↓), by descending throughput."""
    out: list[PlanEntry] = []
    best_mem = float("inf")
    for e in sorted(entries, key=lambda x: (-x.tokens_per_s_per_gpu, x.peak_gib)):
        if e.peak_gib < best_mem:
            out.append(e)
            best_mem = e.peak_gib
    return out


def _pareto_of_ranked(ranked: list[PlanEntry]) -> list[PlanEntry]:
    """:func:`pareto_front` of entries already sorted by its key (skips the sort; same result)."""
    out: list[PlanEntry] = []
    best_mem = float("inf")
    for e in ranked:
        if e.peak_gib < best_mem:
            out.append(e)
            best_mem = e.peak_gib
    return out


def no_fit_message(
    spec: StudySpec, space: Space | None = None, configs: list[TrainingConfig] | None = None
) -> str | None:
    """``None`` when some legal configuration fits in memory (or there is none); otherwise why nothing does:
    the smallest estimated peak, its stage and configuration, the usable memory, and what to change.

    Stops at the first configuration that fits, so it is cheap for the usual study."""
    space = space or Space(spec)
    smallest: tuple[float, TrainingConfig, MemoryEstimate] | None = None
    for c in configs if configs is not None else space.configs():
        mem = estimate_memory(spec, c)
        if mem.fits:
            return None
        if smallest is None or mem.peak_gib < smallest[0]:
            smallest = (mem.peak_gib, c, mem)
    if smallest is None:
        return None
    _, config, mem = smallest
    margin = spec.search.memory_safety_margin
    hints = ["add GPUs (cluster.nodes)"]
    if "full" not in space.candidates["recompute"]:
        hints.append("allow recompute: full in search.axes")
    hints.append("allow larger tp/pp/ep/cp in search.axes or lower workload.seq_length")
    if margin > 0 and mem.peak_gib <= mem.capacity_gib:  # only when the whole device would hold it
        hints.append("lower search.memory_safety_margin")
    return (
        f"no configuration fits: the smallest peak is {mem.peak_gib:.1f} GiB on stage {mem.peak_stage} with "
        f"{config}; usable is {mem.usable_gib:.1f} GiB ({mem.capacity_gib:.1f} GiB per "
        f"{spec.cluster.gpu.name} x (1 - search.memory_safety_margin {margin:g})). To fix: "
        + ", ".join(hints)
    )


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: ranking a space allocates tens of thousands of acyclic objects
    (configurations, estimates, entries), and the collections they trigger scan every live object (0.1-0.2 s
    of a plan). Reference counting still frees everything; the collector's previous state is restored."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def plan_space(
    spec: StudySpec,
    space: Space | None = None,
    top: int = 10,
    calibration: Calibration | None = None,
) -> PlanResult:
    """Estimate every legal configuration, drop those that do not fit, rank the rest (best first)."""
    with gc_paused():
        return _plan_space(spec, space, top, calibration)


def _plan_space(
    spec: StudySpec, space: Space | None, top: int, calibration: Calibration | None
) -> PlanResult:
    space = space or Space(spec)
    configs = space.configs()
    peaks, usable = peak_memory_all(spec, configs)  # = estimate_memory(spec, c).peak_gib, without breakdowns
    fit = [i for i, peak in enumerate(peaks) if peak <= usable]
    ests = estimate_throughput_all(spec, [configs[i] for i in fit], calibration)
    entries = [PlanEntry(configs[i], est, peaks[i], True) for i, est in zip(fit, ests, strict=True)]
    keys = [(-est.tokens_per_s_per_gpu, peaks[i]) for i, est in zip(fit, ests, strict=True)]
    # best first; ties keep the space's order (a stable sort on the same key as pareto_front's)
    order = sorted(range(len(entries)), key=keys.__getitem__)
    feasible = [entries[i] for i in order]
    base_cfg = space.canonical(space.baseline)
    baseline: PlanEntry | None = None
    rank: int | None = None
    if not space.check(base_cfg):
        for i, e in enumerate(feasible):
            if e.config == base_cfg:
                baseline, rank = e, i + 1
                break
        if baseline is None:
            mem = estimate_memory(spec, base_cfg)
            baseline = PlanEntry(
                base_cfg, estimate_throughput(spec, base_cfg, calibration), mem.peak_gib, mem.fits
            )
    trank = None
    if baseline is not None:
        base_tps = baseline.tokens_per_s_per_gpu
        trank = 1 + sum(1 for k in keys if -k[0] > base_tps)
    return PlanResult(
        legal_configs=len(configs),
        feasible_configs=len(feasible),
        top=feasible[: max(0, top)],
        baseline=baseline,
        baseline_rank=rank,
        baseline_throughput_rank=trank,
        pareto=_pareto_of_ranked(feasible),
        ranked=feasible,
    )


BOUND_SLACK = 1e-9
"""relative slack on :func:`~.throughput.throughput_bound` (the step is summed in another order than the
bound's: a rounding must not stop the search early)"""


def best_fitting(
    spec: StudySpec, space: Space | None = None, peaks: list[float] | None = None
) -> tuple[PlanEntry | None, int, int]:
    """``plan_space(spec, space, top=1).top[0]`` (None when nothing fits), the legal and the fitting counts, with
    the step time estimated only for the configurations whose throughput bound beats the best found so far
    (uncalibrated; the same entry, ties broken alike: by peak memory, then the space's order).

    Best first: the fitting configurations are grouped by layout (:func:`~.throughput.layout_of`), each group
    bounded by the pipeline's busy time; the item of the highest bound is taken: a group's bound is tightened
    with the pipeline's fill and drain (:func:`~.throughput.throughput_bound`), a tight group's configurations
    are put back each with its own bound, a configuration is estimated; the search ends when no bound left
    reaches the best estimate. ``peaks``: :func:`~.memory.peak_memory_all`'s of the space when known."""
    with gc_paused():
        space = space or Space(spec)
        configs = space.configs()
        if peaks is None:
            peaks, usable = peak_memory_all(spec, configs)
        else:
            usable = usable_gib(spec)
        groups: dict[tuple[Any, ...], list[int]] = {}
        fitting = 0
        for i, (config, peak) in enumerate(zip(configs, peaks, strict=True)):
            if peak <= usable:
                key = layout_of(config)
                group = groups.get(key)
                if group is None:
                    groups[key] = [i]
                else:
                    group.append(i)
                fitting += 1
        # (-bound, tie, 0 busy-time bound of a group / 1 tight bound of a group / 2 a configuration's, what)
        heap: list[tuple[float, int, int, Any]] = [
            (-throughput_bound(spec, [configs[g[0]]], bubble=False), n, 0, g)
            for n, g in enumerate(groups.values())
        ]
        heapq.heapify(heap)
        tie = len(heap)
        best: tuple[tuple[float, float, int], PlanEntry] | None = None
        while heap and (best is None or -heap[0][0] * (1 + BOUND_SLACK) >= -best[0][0]):
            bound, n, level, what = heapq.heappop(heap)
            bound = -bound
            if level == 0:
                heapq.heappush(heap, (-throughput_bound(spec, [configs[i] for i in what]), n, 1, what))
            elif level == 1 and len(what) == 1:
                heapq.heappush(heap, (-bound, n, 2, what[0]))  # its own bound
            elif level == 1:
                for i in what:
                    tie += 1
                    heapq.heappush(heap, (-throughput_bound(spec, [configs[i]]), tie, 2, i))
            else:
                est = estimate_throughput(spec, configs[what])
                key = (-est.tokens_per_s_per_gpu, peaks[what], what)
                if best is None or key < best[0]:
                    best = (key, PlanEntry(configs[what], est, peaks[what], True))
        return (best[1] if best else None), len(configs), fitting
