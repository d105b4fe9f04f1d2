""":class:`MemoryCalibration`: the memory model corrected by what measured runs showed.

A measured trial that reports its peak memory gives a ratio measured / estimated peak (kept when comparable,
:data:`COMPARABLE`); a trial that ran out of memory gives a lower bound (the device's capacity / its estimated
peak, kept up to :data:`MAX_OOM_BOUND`). The calibration's ``scale`` is the
median ratio, raised to every lower bound, so a configuration that ran out of memory stays out after refitting.
Whatever the bound, an out-of-memory run also closes every configuration estimated at least as large
(``oom_peak_gib``: the smallest estimated peak that ran out of memory), unless a run estimated at least as large
completed with a measurement (``measured_peak_gib``: the largest such estimate).
The memory prefilter compares ``scale × estimated peak`` with the usable memory, so the filter learns from the
cluster: a model that is pessimistic for a stack (e.g. MoE recipes with memory features the axes do not
describe, see docs/benchmarks.md) stops throwing away configurations once a few measurements came back.

The framework's *reserve*: PyTorch's caching allocator holds more than the tensors it has allocated (its
reserved peak, which the device must hold, printed by Megatron as ``max reserved`` and by TorchTitan as its
``memory:``). A run that reports both peaks gives a reserve sample (reserved − allocated, GiB); ``reserve_gib``
is their median, and with one the gate asks that the reserved estimate (calibrated peak + reserve) fit the
device's capacity, in place of the calibrated peak against the usable memory (the study's safety margin stood
in for the reserve until it was measured). Without reserve samples the gate is what it was.

Example::

    cal = MemoryCalibration.fit(ratios=[0.82, 0.79], oom_bounds=[])
    cal.apply(estimate)  # (calibrated peak GiB, fits)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .memory import MemoryEstimate

COMPARABLE = (0.25, 4.0)
"""a measured/estimated ratio outside this range is not comparable (e.g. host RSS against HBM): discarded"""
MAX_OOM_BOUND = 1.5
"""an out-of-memory run of a configuration estimated below 1/1.5 of the device is not taken as evidence about
the memory model (an allocation failure elsewhere, e.g. NCCL host buffers, or a broken job): discarded and
left to ``memory_model_miss``, so one such failure cannot close most of the space"""

ROUNDING_GIB = 2.0**-20
"""a kibibyte: a reserved estimate this close to the capacity counts as reaching it (the out-of-memory bound
puts a run that ran out exactly there, up to floating-point rounding)"""


@dataclass(frozen=True, slots=True)
class MemoryCalibration:
    """A multiplier on the estimated peak; ``MemoryCalibration()`` is the identity."""

    scale: float = 1.0
    n_trials: int = 0
    n_oom: int = 0
    reserve_gib: float = 0.0
    """the framework's allocator reserve over the allocated peak (GiB; 0: none learned)"""
    n_reserve: int = 0
    oom_peak_gib: float | None = None
    """the smallest estimated peak (GiB) of a run that ran out of memory"""
    measured_peak_gib: float | None = None
    """the largest estimated peak (GiB) of a run that completed with a measurement"""

    @property
    def is_identity(self) -> bool:
        return self.scale == 1.0 and self.reserve_gib == 0.0 and self.oom_peak_gib is None

    def fits_peak(self, peak_gib: float, usable_gib: float, capacity_gib: float | None = None) -> bool:
        """Whether an estimated peak fits: the calibrated peak within the usable memory (capacity less the
        study's ``memory_safety_margin``), or, with a learned reserve and the device's capacity, the reserved
        estimate (:meth:`reserved`) within the capacity: the margin stands in for the reserve until runs have
        measured it ("the gate compares reserved with capacity"), and the two are not stacked; strictly below,
        less a KiB for rounding, as a run that ran out bounds its own reserved estimate at capacity. And never at
        least as large as a run that ran out of memory (unless a measured run at least as large completed)."""
        peak = peak_gib * self.scale
        if self.reserve_gib > 0 and capacity_gib is not None:
            within = peak + self.reserve_gib < capacity_gib - ROUNDING_GIB
        else:
            within = peak <= usable_gib
        return within and not self.oom_dominated(peak_gib)

    def oom_dominated(self, peak_gib: float) -> bool:
        """Whether a configuration estimated at ``peak_gib`` is at least as large as one that ran out of memory
        and larger than every measured run that completed."""
        if self.oom_peak_gib is None or peak_gib < self.oom_peak_gib:
            return False
        return self.measured_peak_gib is None or peak_gib > self.measured_peak_gib

    @classmethod
    def fit(
        cls,
        ratios: Iterable[float],
        oom_bounds: Iterable[float] = (),
        reserves: Iterable[float] = (),
        capacity_gib: float | None = None,
        *,
        oom_peaks: Iterable[float] = (),
        measured_peaks: Iterable[float] = (),
    ) -> MemoryCalibration:
        """``ratios``: measured / estimated peak of completed runs; ``oom_bounds``: capacity / estimated peak
        of runs that ran out of memory (the true ratio was at least this); ``reserves``: reserved − allocated
        peak (GiB) of runs that printed both. With a reserve and the device's ``capacity_gib`` an out-of-memory
        run bounds the allocated ratio by (capacity − reserve) / estimated peak: it ran out when its allocated
        peak plus the reserve exceeded the device, which the gate's reserved check then refuses again.
        ``oom_peaks``: this study's out-of-memory runs' estimated peaks; ``measured_peaks``: its completed
        measured runs' estimated peaks."""
        r = [x for x in ratios if COMPARABLE[0] <= x <= COMPARABLE[1]]
        v = [max(0.0, x) for x in reserves]
        reserve = statistics.median(v) if v else 0.0
        share = 1.0 - reserve / capacity_gib if capacity_gib and reserve < capacity_gib else 1.0
        b = [x * share for x in oom_bounds if 0 < x <= MAX_OOM_BOUND]
        oom = [x for x in oom_peaks if x > 0]
        fine = [x for x in measured_peaks if x > 0]
        if not r and not b and not v and not oom:
            return cls()
        scale = statistics.median(r) if r else 1.0
        if b:
            scale = max(scale, max(b))
        return cls(
            scale=scale,
            n_trials=len(r),
            n_oom=len(b),
            reserve_gib=reserve,
            n_reserve=len(v),
            oom_peak_gib=min(oom) if oom else None,
            measured_peak_gib=max(fine) if fine and oom else None,
        )

    def apply(self, estimate: MemoryEstimate) -> tuple[float, bool]:
        """The calibrated peak (GiB) and whether it fits (:meth:`fits_peak`)."""
        peak = estimate.peak_gib * self.scale
        return peak, self.fits_peak(estimate.peak_gib, estimate.usable_gib, estimate.capacity_gib)

    def reserved(self, estimate: MemoryEstimate) -> float:
        """The reserved estimate (GiB): the calibrated peak plus the learned reserve."""
        return estimate.peak_gib * self.scale + self.reserve_gib

    def describe(self) -> str:
        src = f"{self.n_trials} measured peak{'s' if self.n_trials != 1 else ''}"
        if self.n_oom:
            src += f", {self.n_oom} out-of-memory run{'s' if self.n_oom != 1 else ''}"
        text = f"calibrated ×{self.scale:.2f} from {src}"
        if self.n_reserve:
            text += f", reserve +{self.reserve_gib:.1f} GiB from {self.n_reserve} reserved peak" + (
                "s" if self.n_reserve != 1 else ""
            )
        if self.oom_peak_gib is not None:
            text += f"; a run estimated at {self.oom_peak_gib:.1f} GiB ran out of memory"
            if self.measured_peak_gib is not None:
                text += f", one estimated at {self.measured_peak_gib:.1f} GiB completed"
        return text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scale": self.scale, "n_trials": self.n_trials, "n_oom": self.n_oom}
        if self.n_reserve:
            out.update(reserve_gib=self.reserve_gib, n_reserve=self.n_reserve)
        if self.oom_peak_gib is not None:
            out["oom_peak_gib"] = self.oom_peak_gib
            out["measured_peak_gib"] = self.measured_peak_gib
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> MemoryCalibration:
        if not data:
            return cls()
        return cls(
            scale=float(data.get("scale", 1.0)),
            n_trials=int(data.get("n_trials", 0)),
            n_oom=int(data.get("n_oom", 0)),
            reserve_gib=float(data.get("reserve_gib", 0.0)),
            n_reserve=int(data.get("n_reserve", 0)),
            oom_peak_gib=data.get("oom_peak_gib"),
            measured_peak_gib=data.get("measured_peak_gib"),
        )
