""":class:`MemoryCalibration`: the memory model corrected by what measured runs showed.

A measured trial that reports its peak memory gives a ratio measured / estimated peak (kept when comparable,
:data:`COMPARABLE`); a trial that ran out of memory gives a lower bound (the device's capacity / its estimated
peak, kept up to :data:`MAX_OOM_BOUND`). The calibration's ``scale`` is the
median ratio, raised to every lower bound, so a configuration that ran out of memory stays out after refitting.
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

    @property
    def is_identity(self) -> bool:
        return self.scale == 1.0 and self.reserve_gib == 0.0

    @classmethod
    def fit(
        cls,
        ratios: Iterable[float],
        oom_bounds: Iterable[float] = (),
        reserves: Iterable[float] = (),
        capacity_gib: float | None = None,
    ) -> MemoryCalibration:
        """``ratios``: measured / estimated peak of completed runs; ``oom_bounds``: capacity / estimated peak
        of runs that ran out of memory (the true ratio was at least this); ``reserves``: reserved − allocated
        peak (GiB) of runs that printed both. With a reserve and the device's ``capacity_gib`` an out-of-memory
        run bounds the allocated ratio by (capacity − reserve) / estimated peak: it ran out when its allocated
        peak plus the reserve exceeded the device, which the gate's reserved check then refuses again."""
        r = [x for x in ratios if COMPARABLE[0] <= x <= COMPARABLE[1]]
        v = [max(0.0, x) for x in reserves]
        reserve = statistics.median(v) if v else 0.0
        share = 1.0 - reserve / capacity_gib if capacity_gib and reserve < capacity_gib else 1.0
        b = [x * share for x in oom_bounds if 0 < x <= MAX_OOM_BOUND]
        if not r and not b and not v:
            return cls()
        scale = statistics.median(r) if r else 1.0
        if b:
            scale = max(scale, max(b))
        return cls(scale=scale, n_trials=len(r), n_oom=len(b), reserve_gib=reserve, n_reserve=len(v))

    def apply(self, estimate: MemoryEstimate) -> tuple[float, bool]:
        """The calibrated peak (GiB) and whether it fits: within the usable memory (capacity less the study's
        ``memory_safety_margin``), or, with a learned reserve, the reserved estimate (:meth:`reserved`) within
        the device's capacity: the margin stands in for the reserve until runs have measured it (issue 38:
        "the gate compares reserved with capacity"), and the two are not stacked."""
        peak = estimate.peak_gib * self.scale
        if self.reserve_gib > 0:
            # the measured reserve replaces the safety margin that stood in for it; strictly below: a run that
            # ran out bounds its own reserved estimate at capacity (less a KiB for rounding)
            return peak, peak + self.reserve_gib < estimate.capacity_gib - ROUNDING_GIB
        return peak, peak <= estimate.usable_gib

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
        return text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scale": self.scale, "n_trials": self.n_trials, "n_oom": self.n_oom}
        if self.n_reserve:
            out.update(reserve_gib=self.reserve_gib, n_reserve=self.n_reserve)
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
        )
