"""The step-time model's efficiency from a measured hardware profile (``cluster.profile``) instead of the
catalog's family constants: one place (:func:`profile_constants`) turns a profile's tables into the curves the
physics prices GEMMs, attention and memory-bound kernels with.

- GEMMs: the measured rate (FLOP/s) of the profile's compute dtype, interpolated linearly in log(work) between
  measured points (work = ``M·N·K·count`` multiply-adds, the unit of :class:`.gemm_efficiency.EfficiencyCurve`);
  beyond the table the fitted saturating curve ``peak · w / (w + half)``, scaled to meet the table's end point.
  The fraction is taken of the study's BF16 peak, so ``peak · fraction`` is the measured rate whatever peak the
  study declares. FP8: the median measured FP8 / compute-dtype rate at the same shapes replaces the family's
  FP8 speed-up; grouped GEMMs: the median grouped / plain rate at the same work replaces the grouped multiplier
  (and the per-expert cost, which the measured grouped kernels include).
- Attention (torch SDPA, causal): forward and backward rates by keys per query, interpolated as GEMMs are and
  between the two measured head widths that bracket the model's (nearest outside), so the head-width factor is
  the measurement's; backward has its own curve.
- Memory-bound kernels: the fitted ``bytes / bandwidth + kernel_us`` of copies, adds and norms gives the HBM
  rate and the fixed cost per kernel.

Torch-free; built once per spec (the physics' per-spec context).

Example::

    fit_saturating([1e6, 1e8, 1e10], [1e12, 3e13, 6e13])   # (peak FLOP/s, half-work, mean |rel. error|)
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..spec.profile import HardwareProfile, SaturatingFit
from .calibration import FamilyConstants


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of ``y = a + b·x`` by least squares in relative error (weights 1/y²)."""
    sw = sx = sy = sxx = sxy = 0.0
    for x, y in points:
        w = 1.0 / (y * y)
        sw += w
        sx += w * x
        sy += w * y
        sxx += w * x * x
        sxy += w * x * y
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det if det > 0 else 0.0
    return (sy - slope * sx) / sw, slope


def fit_saturating(sizes: Sequence[float], rates: Sequence[float]) -> tuple[float, float, float]:
    """Fit ``rate = peak · size / (size + half)`` (``1/rate = 1/peak + (half/peak)/size``: a line in
    ``1/size``, least squares in relative error); returns (peak, half, mean absolute relative error). One point:
    that rate, half 0."""
    pts = [(s, r) for s, r in zip(sizes, rates, strict=True) if s > 0 and r > 0]
    if not pts:
        raise ValueError("no positive points to fit")
    a, b = _line([(1.0 / s, 1.0 / r) for s, r in pts]) if len(pts) > 1 else (1.0 / pts[0][1], 0.0)
    if b < 0:  # the rate falls with the size: the best constant
        b = 0.0
        a = 1.0 / statistics.median(r for _, r in pts)
    if a <= 0:  # no saturation seen (the rate still grows at the largest size): the best constant
        a, b = 1.0 / statistics.median(r for _, r in pts), 0.0
    peak, half = 1.0 / a, b / a
    mape = statistics.fmean(abs(peak * s / (s + half) / r - 1.0) for s, r in pts)
    return peak, half, mape


def fit_memory(nbytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float, float]:
    """Fit ``seconds = bytes / bandwidth + fixed`` (least squares in relative error); returns (bytes/s, fixed
    seconds, mean absolute relative error)."""
    pts = [(b, t) for b, t in zip(nbytes, seconds, strict=True) if b > 0 and t > 0]
    if not pts:
        raise ValueError("no positive points to fit")
    fixed, slope = _line(pts)
    if slope <= 0 or fixed < 0:  # no line with a positive rate and cost: the mean rate, no fixed cost
        fixed, slope = 0.0, statistics.fmean(t / x for x, t in pts)
    mape = statistics.fmean(abs((x * slope + fixed) / t - 1.0) for x, t in pts)
    return 1.0 / slope, fixed, mape


def _table(points: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """log(size) and rate, sorted; the shapes of one size (a GEMM's forward, input-gradient and weight-gradient
    layouts) at their harmonic-mean rate: the rate of running each of them once, as a layer's passes do."""
    by: dict[float, list[float]] = {}
    for s, r in points:
        by.setdefault(s, []).append(r)
    xs = sorted(by)
    return [math.log(x) for x in xs], [statistics.harmonic_mean(by[x]) for x in xs]


class MeasuredCurve:
    """A measured rate table as an :class:`~.gemm_efficiency.EfficiencyCurve`: ``fraction(size)`` is the
    interpolated rate over ``peak_flops``; beyond the table, the fitted saturating curve scaled to meet the
    table's end."""

    __slots__ = ("_hi", "_lo", "fitted_to", "half", "lx", "peak", "peak_flops", "ys")

    def __init__(
        self,
        points: Sequence[tuple[float, float]],
        peak_flops: float,
        fitted_to: str,
        fit: tuple[float, float] | None = None,
    ) -> None:
        if not points:
            raise ValueError("a measured curve needs at least one point")
        self.lx, self.ys = _table(points)
        if fit is None:
            fit = fit_saturating([math.exp(x) for x in self.lx], self.ys)[:2]
        self.peak, self.half = fit
        self.peak_flops = peak_flops
        self.fitted_to = fitted_to
        self._lo = self.ys[0] / self._fitted(math.exp(self.lx[0]))
        self._hi = self.ys[-1] / self._fitted(math.exp(self.lx[-1]))

    def _fitted(self, size: float) -> float:
        return self.peak * size / (size + self.half)

    def rate(self, size: float) -> float:
        """Measured FLOP/s of a kernel of ``size``."""
        if size <= 0:
            return self.ys[-1]
        x = math.log(size)
        lx, ys = self.lx, self.ys
        if x <= lx[0]:
            return self._fitted(size) * self._lo
        if x >= lx[-1]:
            return self._fitted(size) * self._hi
        i = bisect.bisect_right(lx, x)
        t = (x - lx[i - 1]) / (lx[i] - lx[i - 1])
        return ys[i - 1] + t * (ys[i] - ys[i - 1])

    def fraction(self, size: float) -> float:
        return self.rate(size) / self.peak_flops


@dataclass(frozen=True, slots=True)
class ProfileTerms:
    """What a hardware profile changes in the step-time model (see :func:`profile_constants`)."""

    constants: FamilyConstants
    hbm_bytes_per_s: float | None
    """memory-bound kernels' rate (None: the catalog's HBM bandwidth × the family's fraction)"""
    kernel_s: float | None
    """fixed cost per memory-bound kernel (None: the family's)"""
    sources: dict[str, str]
    """per term (gemm, attention, memory, fp8, grouped): what priced it"""


def _fit_of(fit: SaturatingFit | None) -> tuple[float, float] | None:
    return None if fit is None else (fit.peak_tflops * 1e12, fit.half)


def _attention_points(
    profile: HardwareProfile, dtype: str, width: float, bwd: bool
) -> list[tuple[float, float]]:
    """(keys per query, FLOP/s) at head width ``width``: interpolated between the two measured widths that
    bracket it (the nearest outside them)."""
    pts = [p for p in profile.attention if p.dtype == dtype] or list(profile.attention)
    widths = sorted({p.head_dim for p in pts})
    if not widths:
        return []
    lo = max((w for w in widths if w <= width), default=widths[0])
    hi = min((w for w in widths if w >= width), default=widths[-1])
    pick = {lo, hi}
    tables = {
        w: MeasuredCurve(
            [(p.span, (p.bwd_tflops if bwd else p.fwd_tflops) * 1e12) for p in pts if p.head_dim == w],
            1.0,
            "",
        )
        for w in pick
    }
    spans = sorted({p.span for p in pts if p.head_dim in pick})
    t = 0.0 if hi == lo else (width - lo) / (hi - lo)
    return [(s, (1 - t) * tables[lo].rate(s) + t * tables[hi].rate(s)) for s in spans]


def _median_ratio(num: dict[tuple[int, ...], float], den: dict[tuple[int, ...], float]) -> float | None:
    common = [num[key] / den[key] for key in num if key in den and den[key] > 0]
    return statistics.median(common) if common else None


def profile_constants(
    k: FamilyConstants, profile: HardwareProfile, bf16_peak: float, head_width: float
) -> ProfileTerms:
    """The family constants ``k`` with the profile's measured curves in place of the catalog's, for a study of
    BF16 peak ``bf16_peak`` FLOP/s whose attention heads are ``head_width`` wide."""
    dtype = profile.compute_dtype
    sources: dict[str, str] = {}
    changes: dict[str, Any] = {}
    plain = profile.gemm_points(dtype)
    if plain:
        curve = MeasuredCurve(
            [(p.work, p.tflops * 1e12) for p in plain],
            bf16_peak,
            f"hardware profile: {len(plain)} {dtype} GEMMs on {profile.device.name}",
            _fit_of(profile.fitted.gemm.get(dtype)),
        )
        changes["gemm"] = curve
        sources["gemm"] = curve.fitted_to
        by_shape = {(p.m, p.n, p.k): p.tflops for p in plain}
        fp8 = _median_ratio({(p.m, p.n, p.k): p.tflops for p in profile.gemm_points("fp8")}, by_shape)
        if fp8 is not None:
            changes["fp8_gemm_speedup"] = fp8
            sources["fp8"] = f"hardware profile: measured FP8 / {dtype} GEMM rate {fp8:.2f}"
        grouped = profile.gemm_points(dtype, grouped=True)
        if grouped:
            ratios = [p.tflops * 1e12 / curve.rate(p.work) for p in grouped]
            changes["grouped_gemm_eff"] = statistics.median(ratios)
            changes["grouped_expert_us"] = 0.0
            sources["grouped"] = (
                f"hardware profile: {len(grouped)} grouped GEMMs, rate × {changes['grouped_gemm_eff']:.2f}"
            )
    fwd = _attention_points(profile, dtype, head_width, bwd=False)
    if fwd:
        bwd = _attention_points(profile, dtype, head_width, bwd=True)
        what = f"hardware profile: SDPA at head width {head_width:g}, {len(fwd)} sequence lengths"
        changes["attention"] = MeasuredCurve(fwd, bf16_peak, what)
        changes["attention_bwd"] = MeasuredCurve(bwd, bf16_peak, what + " (backward)")
        changes["attention_bwd_rate"] = 1.0
        sources["attention"] = what
    hbm = kernel = None
    if profile.fitted.memory is not None:
        mem = profile.fitted.memory
        # the physics counts 16-bit activations; a device that runs them in fp32 moves twice those bytes
        elt = {"fp32": 4, "bf16": 2, "fp16": 2}[profile.memory[0].dtype if profile.memory else "bf16"]
        hbm, kernel = mem.bandwidth_gbs * 1e9 * 2 / elt, mem.kernel_us * 1e-6
        sources["memory"] = (
            f"hardware profile: memory-bound kernels {mem.bandwidth_gbs:,.0f} GB/s + {mem.kernel_us:.1f} µs per kernel"
        )
    if profile.device.kind == "cpu" and profile.op_overhead_us:
        # one thread issues and runs every kernel: the framework's per-kernel cost adds to each kernel's
        kernel = max(kernel or 0.0, profile.op_overhead_us * 1e-6)
        sources["kernels"] = f"hardware profile: {kernel * 1e6:.1f} µs per kernel (a tiny layer's fixed cost)"
    return ProfileTerms(replace(k, **changes), hbm, kernel, sources)


def _fit(points: list[tuple[float, float]]) -> dict[str, Any] | None:
    """A :class:`~primus_optuna.spec.profile.SaturatingFit` document of (size, FLOP/s) points."""
    if not points:
        return None
    peak, half, mape = fit_saturating([s for s, _ in points], [r for _, r in points])
    return {"peak_tflops": peak / 1e12, "half": half, "mape": mape, "points": len(points)}


def fit_tables(profile: dict[str, Any], compute_dtype: str, head_dim: int | None) -> dict[str, Any]:
    """The saturating curves of the measured tables (GEMMs per dtype, grouped GEMMs, attention at one head
    width over keys per query) and the memory-bound kernels' bandwidth and fixed cost."""
    out: dict[str, Any] = {"gemm": {}, "grouped_gemm": {}}
    for p in profile["gemm"]:
        key = "grouped_gemm" if p["count"] > 1 else "gemm"
        out[key].setdefault(p["dtype"], []).append(
            (p["m"] * p["n"] * p["k"] * p["count"], p["tflops"] * 1e12)
        )
    for key in ("gemm", "grouped_gemm"):
        out[key] = {dt: _fit(pts) for dt, pts in out[key].items()}
    att = [p for p in profile["attention"] if p["dtype"] == compute_dtype]
    widths = sorted({p["head_dim"] for p in att})
    if widths:
        width = (
            head_dim
            if head_dim in widths
            else max(widths, key=lambda w: sum(p["head_dim"] == w for p in att))
        )
        att = [p for p in att if p["head_dim"] == width]
        out["attention_fwd"] = _fit([(p["seq"] / 2, p["fwd_tflops"] * 1e12) for p in att])
        out["attention_bwd"] = _fit([(p["seq"] / 2, p["bwd_tflops"] * 1e12) for p in att])
    if profile["memory"]:
        bw, fixed, mape = fit_memory(
            [p["bytes"] for p in profile["memory"]], [p["seconds"] for p in profile["memory"]]
        )
        out["memory"] = {
            "bandwidth_gbs": bw / 1e9,
            "kernel_us": fixed * 1e6,
            "mape": mape,
            "points": len(profile["memory"]),
        }
    return out


__all__ = ["MeasuredCurve", "ProfileTerms", "fit_memory", "fit_saturating", "fit_tables", "profile_constants"]
