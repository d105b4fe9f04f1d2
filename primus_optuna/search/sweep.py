"""The deterministic single-axis sweep: the baseline, then one axis at a time with the others at the baseline.

The plan depends on the study file alone (and on the analytical model for the default axis order), so every
worker and every rerun computes the same list and maps the storage-unique trial number onto it.

Axis order (``search.sweep_order`` when given, only those axes): by default the axis whose single-axis points
the step-time model expects to move throughput the most comes first — its *expected impact* is the largest
``|estimate(point) / estimate(baseline) - 1|`` over the axis's points that fit in memory; axes with no
feasible point, or with a single legal value, go last, ties keep the canonical axis order. Sweeping the
high-impact axes first gives the planner the most informative measurements when the budget is short.

A single-axis change that breaks a coupling rule (e.g. ``pp=8`` with ``vpp=2`` on 56 layers) is *repaired*:
the legal configuration with that axis value that changes the fewest other axes (then the smallest steps in
candidate lists) replaces it, and its note says what moved. Infeasible (out-of-memory) points stay in the plan;
the memory pruner removes them at zero GPU cost so the dashboard shows what the filter removed.

Example::

    plan = sweep_plan(Space(spec))
    [p.rationale for p in plan[:3]]
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..space import Space, TrainingConfig
from ..spec.study import AXES

Score = Callable[[TrainingConfig], "float | None"]
"""Expected tokens/s/GPU of a configuration, or ``None`` when it does not fit in memory."""


@dataclass(frozen=True)
class SweepPoint:
    """One point of the sweep plan."""

    index: int
    axis: str | None
    """the swept axis; ``None`` for the baseline"""
    value: Any
    config: TrainingConfig
    note: str = ""
    """what else changed to keep the point legal, if anything"""

    @property
    def rationale(self) -> str:
        if self.axis is None:
            return "baseline" + (f" ({self.note})" if self.note else "")
        text = f"sweep {self.axis}={self.value} (other axes at the baseline)"
        return text + (f"; {self.note}" if self.note else "")


def _in_candidates(space: Space, c: TrainingConfig) -> bool:
    return all(getattr(c, a) in space.candidates[a] for a in AXES)


def _legal(space: Space, c: TrainingConfig) -> bool:
    return _in_candidates(space, c) and not space.check(c)


def _diff_note(base: TrainingConfig, c: TrainingConfig, skip: str | None) -> str:
    moved = [
        f"{a} {getattr(base, a)}→{getattr(c, a)}"
        for a in AXES
        if a != skip and getattr(base, a) != getattr(c, a)
    ]
    return f"also {', '.join(moved)} to stay legal" if moved else ""


def repair(space: Space, config: TrainingConfig, fixed: tuple[str, ...] = ()) -> TrainingConfig | None:
    """The legal configuration closest to ``config`` that keeps the ``fixed`` axes (``None`` if none is found).

    Tries changing one other axis, then two, then three; among equals the smallest moves in the candidate lists
    win, then the canonical axis order (deterministic).
    """
    c0 = space.canonical(config)
    if _legal(space, c0):
        return c0
    free = [a for a in AXES if a not in fixed]
    for size in (1, 2, 3):
        best: tuple[int, str, TrainingConfig] | None = None
        for axes in itertools.combinations(free, size):
            choices = [[v for v in space.candidates[a] if v != getattr(config, a)] for a in axes]
            for values in itertools.product(*choices):
                cand = space.canonical(config.replace(**dict(zip(axes, values, strict=True))))
                if any(getattr(cand, a) != getattr(config, a) for a in fixed) or not _legal(space, cand):
                    continue
                cost = sum(_step(space, a, getattr(config, a), getattr(cand, a)) for a in AXES)
                rank = (cost, cand.key(), cand)
                if best is None or rank[:2] < best[:2]:
                    best = rank
        if best is not None:
            return best[2]
    return None


def _step(space: Space, axis: str, old: Any, new: Any) -> int:
    if old == new:
        return 0
    cands = space.candidates[axis]
    if old in cands and new in cands:
        return abs(cands.index(old) - cands.index(new))
    return len(cands)


def sweep_center(space: Space) -> tuple[TrainingConfig, str]:
    """The baseline, or (when the study's baseline is illegal) its nearest legal repair, with a note."""
    base = space.canonical(space.baseline)
    if _legal(space, base):
        return base, ""
    fixed = repair(space, space.baseline)
    if fixed is None:
        return base, "the baseline is illegal and has no legal neighbour"
    return fixed, "the study's baseline is illegal; " + _diff_note(space.baseline, fixed, None).replace(
        " to stay legal", ""
    ).replace("also ", "moved ")


def axis_points(space: Space, center: TrainingConfig, axis: str) -> list[tuple[Any, TrainingConfig, str]]:
    """``(value, config, note)`` for every other legal value of ``axis`` around ``center``."""
    legal_values = space.legal_values()[axis]
    out = []
    for v in legal_values:
        if v == getattr(center, axis):
            continue
        c = repair(space, center.replace(**{axis: v}), fixed=(axis,))
        if c is not None:
            out.append((v, c, _diff_note(center, c, axis)))
    return out


def default_order(space: Space, center: TrainingConfig, score: Score | None) -> list[str]:
    """Axes by decreasing expected impact (see the module docstring); canonical order without a model.

    The impact of an axis is its largest relative change of the score against the baseline's; when the
    baseline itself does not fit (no score), against the median score of every feasible sweep point, so the
    order still follows the model rather than falling back to the canonical one."""
    if score is None:
        return list(AXES)
    values = {axis: [score(c) for _, c, _ in axis_points(space, center, axis)] for axis in AXES}
    base = score(center)
    if not base:
        feasible_all = [v for vs in values.values() for v in vs if v is not None and v > 0]
        base = statistics.median(feasible_all) if feasible_all else None
    impact: dict[str, float] = {}
    for axis in AXES:
        feasible = [v for v in values[axis] if v is not None and v > 0]
        if not feasible or not base:
            impact[axis] = -1.0 if not values[axis] else 0.0
            continue
        impact[axis] = max(abs(v / base - 1.0) for v in feasible)
    return sorted(AXES, key=lambda a: (-impact[a], AXES.index(a)))


def sweep_plan(space: Space, score: Score | None = None) -> list[SweepPoint]:
    """The whole sweep, baseline first, canonicalised and de-duplicated."""
    center, note = sweep_center(space)
    order = space.spec.search.sweep_order or default_order(space, center, score)
    plan = [SweepPoint(0, None, None, center, note)]
    seen = {center}
    for axis in order:
        for value, config, pnote in axis_points(space, center, axis):
            if config in seen:
                continue
            seen.add(config)
            plan.append(SweepPoint(len(plan), axis, value, config, pnote))
    return plan
