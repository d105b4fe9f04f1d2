"""What a warm start imported, as data (:class:`WarmStart`, one :class:`ImportedPair` per earlier measurement):
the JSON round-trip of the study system attr ``primus:warm_start``, read by the calibrations and the sampler,
written by :func:`~primus_optuna.search.warm_start.apply_warm_start`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..physics.throughput import ThroughputEstimate
from ..space import Space, TrainingConfig

__all__ = ["ImportedPair", "Pair", "WarmStart"]

Pair = tuple[TrainingConfig, ThroughputEstimate, float]


@dataclass
class ImportedPair:
    """One earlier measurement in the new study's terms."""

    source: str
    params: dict[str, Any]
    breakdown_s: dict[str, float]
    estimate: float
    measured: float
    legal: bool
    """legal in the new space (re-estimated under the new spec) or kept as the earlier pair"""

    def to_pair(self, space: Space) -> Pair:
        config = (
            space.canonical(TrainingConfig.from_params(self.params))
            if self.legal
            else (TrainingConfig.from_params(self.params))
        )
        step = sum(self.breakdown_s.values())
        return config, ThroughputEstimate(step, self.estimate, 0.0, dict(self.breakdown_s)), self.measured


@dataclass
class WarmStart:
    """What the earlier studies contribute (JSON round-trip through the ``warm_start`` study attr)."""

    sources: list[str] = field(default_factory=list)
    pairs: list[ImportedPair] = field(default_factory=list)
    memory_ratios: list[float] = field(default_factory=list)
    oom_bounds: list[float] = field(default_factory=list)
    memory_reserves: list[float] = field(default_factory=list)
    """reserved − allocated peak (GiB) of the earlier measured runs on the same GPU that printed both"""
    offers: list[dict[str, Any]] = field(default_factory=list)
    """params of the earlier best configurations legal here, best first"""
    notes: list[str] = field(default_factory=list)
    ranking: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sources": self.sources,
            "pairs": [p.__dict__ for p in self.pairs],
            "memory_ratios": self.memory_ratios,
            "oom_bounds": self.oom_bounds,
            **({"memory_reserves": self.memory_reserves} if self.memory_reserves else {}),
            "offers": self.offers,
            "notes": self.notes,
            "ranking": self.ranking,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> WarmStart:
        if not data:
            return cls()
        return cls(
            sources=list(data.get("sources", [])),
            pairs=[ImportedPair(**p) for p in data.get("pairs", [])],
            memory_ratios=[float(x) for x in data.get("memory_ratios", [])],
            oom_bounds=[float(x) for x in data.get("oom_bounds", [])],
            memory_reserves=[float(x) for x in data.get("memory_reserves", [])],
            offers=list(data.get("offers", [])),
            notes=list(data.get("notes", [])),
            ranking=dict(data.get("ranking", {})),
        )

    def summary(self) -> str:
        """One paragraph: what was imported and how much it moved the ranking."""
        legal = sum(p.legal for p in self.pairs)
        text = (
            f"warm start from {', '.join(self.sources)}: {len(self.pairs)} measured trials imported ({legal} legal "
            f"in this space, re-estimated under it), {len(self.memory_ratios)} measured peaks and "
            f"{len(self.oom_bounds)} out-of-memory runs for the memory calibration"
        )
        r = self.ranking
        if r:
            text += (
                f"; ranking of the {r['n']} feasible configurations: Spearman {r['spearman']:.2f} against the "
                f"uncalibrated model, the new #1 was #{r['top1_was']}, {r['top10_overlap']}/10 of the top 10 "
                "unchanged"
            )
        if self.offers:
            text += f"; offered first after the baseline: {len(self.offers)} earlier best configurations"
        return text + ("" if not self.notes else " (" + "; ".join(self.notes) + ")")
