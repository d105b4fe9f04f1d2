"""Ranking fidelity of the step-time model against measurements: what a search needs is the *order*.

For groups of configurations a search compares (one model, one global batch), :func:`ranking_fidelity`
gives each group's Spearman rank correlation between estimated and measured throughput, whether the model's
top 3 of the group holds a configuration within 3% of the measured best, the mean absolute error of the
iteration time *without* any scale, and the median relative error after one global scale (the
geometric-mean ratio measured/estimated over all rows given).

Example::

    rep = ranking_fidelity({"gpt-1b/gbs16": [(est_tps, measured_tps), ...]}, min_rows=10)
    rep.min_spearman, rep.median_rel_error
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass


def _ranks(x: Sequence[float]) -> list[float]:
    """Ranks (0-based) with ties averaged, as Spearman's rho needs."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for t in range(i, j + 1):
            r[order[t]] = (i + j) / 2
        i = j + 1
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation of ``a`` and ``b`` (nan when either is constant or shorter than 2)."""
    if len(a) != len(b):
        raise ValueError(f"spearman: lengths differ ({len(a)} vs {len(b)})")
    if len(a) < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((p - ma) * (q - mb) for p, q in zip(ra, rb, strict=True))
    va = sum((p - ma) ** 2 for p in ra)
    vb = sum((q - mb) ** 2 for q in rb)
    if va == 0 or vb == 0:
        return float("nan")
    return cov / math.sqrt(va * vb)


@dataclass(frozen=True, slots=True)
class FidelityReport:
    """Per-group Spearman and the error after one global scale."""

    spearman: dict[Hashable, float]
    """groups with at least ``min_rows`` rows"""
    rows: dict[Hashable, int]
    scale: float
    """measured / estimated throughput, geometric mean over all rows"""
    median_rel_error: float
    """median |scale · estimate − measured| / measured over all rows"""
    mean_abs_error: float = float("nan")
    """mean |estimated − measured| / measured iteration time over all rows, no scale"""
    top3: dict[Hashable, bool] | None = None
    """per group (with ``min_rows``): the model's 3 fastest hold one within 3% of the measured best"""

    @property
    def min_spearman(self) -> float:
        return min(self.spearman.values()) if self.spearman else float("nan")

    @property
    def median_spearman(self) -> float:
        return statistics.median(self.spearman.values()) if self.spearman else float("nan")

    @property
    def top3_groups(self) -> int:
        """groups whose model top 3 holds a configuration within 3% of the measured best"""
        return sum(self.top3.values()) if self.top3 else 0


def top3_holds_best(rows: Sequence[tuple[float, float]], within: float = 0.03, top: int = 3) -> bool:
    """Whether the ``top`` rows the estimate ranks fastest hold one within ``within`` of the measured best
    (rows: ``(estimated, measured)`` throughput)."""
    best = max(m for _, m in rows)
    ranked = sorted(rows, key=lambda r: -r[0])[:top]
    return any(m >= (1 - within) * best for _, m in ranked)


def ranking_fidelity(
    groups: Mapping[Hashable, Sequence[tuple[float, float]]], min_rows: int = 10, scale: float | None = None
) -> FidelityReport:
    """``groups``: ``{key: [(estimated, measured) throughput, ...]}``. ``scale``: a global scale fitted
    elsewhere (e.g. on the fitting half); default: fitted on these rows."""
    pairs = [(e, m) for rows in groups.values() for e, m in rows if e > 0 and m > 0]
    if not pairs:
        raise ValueError("ranking_fidelity: no positive (estimated, measured) pairs")
    s = math.exp(statistics.fmean(math.log(m / e) for e, m in pairs)) if scale is None else scale
    err = statistics.median(abs(s * e - m) / m for e, m in pairs)
    # iteration time ∝ 1 / throughput: |t_est − t_meas| / t_meas = |m / e − 1|
    mae = statistics.fmean(abs(m / e - 1) for e, m in pairs)
    big = {k: rows for k, rows in groups.items() if len(rows) >= min_rows}
    rho = {k: spearman([e for e, _ in rows], [m for _, m in rows]) for k, rows in big.items()}
    top3 = {k: top3_holds_best(rows) for k, rows in big.items()}
    return FidelityReport(rho, {k: len(v) for k, v in groups.items()}, s, err, mae, top3)


__all__ = ["FidelityReport", "ranking_fidelity", "spearman", "top3_holds_best"]
