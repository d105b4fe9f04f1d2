"""The deterministic one-axis sweep around a configuration that fits, sized to the study's budget.

The plan depends on the study file alone (and on the analytical model), so every worker and every rerun
computes the same list and maps the storage-unique trial number onto it.

**Centre.** The study's baseline when it is legal and fits in memory; otherwise the fitting configuration
nearest to it: fewest parallelism moves first (the memory levers ``recompute`` and ``mbs`` are preferred), then
fewest moves, then the smallest steps in the candidate lists, then the higher estimate. ``search.start``
(:func:`model_start`) moves it to the model's best when the model is confident the baseline is slower (its
gain beyond the error band of a ratio of two estimates), so the first trial measures the model's top. Its note
says what moved and why.

**Points.** For each axis, the centre with that axis changed. A point that breaks a coupling rule (e.g.
``pp=8`` with ``vpp=2`` on 56 layers) is repaired to the legal configuration that changes the fewest other
axes; a point that does not fit is repaired the same way to the nearest fitting configuration with that axis
value, moving at most :data:`MAX_REPAIR_MOVES` other axes. Every note says what else moved. A point with no
fitting repair is not spent unless the budget has room for it at the end (at most
:data:`MAX_PRUNED_POINTS`, documented zero-cost prunes); :func:`sweep_design` lists the others as skipped.

**Budget and order.** The sweep uses ``search.sweep_trials`` trials (default: 15% of ``search.n_trials``,
4 of 30; the learner after the sweep uses the rest better, see :data:`SWEEP_SHARE`), centre included. Per
axis it sweeps the values that can still matter by the model — a value matters when the best fitting
configuration with it is estimated within :data:`MATTERS` of the best of all — plus one contrast value when no
other value of the axis matters. The first round gives every axis its most promising value, the most
promising first (ties: the axis with the larger expected impact ``|estimate(point) / estimate(centre) - 1|``;
``search.sweep_order`` instead sweeps the listed axes one after the other); then the remaining values by
estimate. What does not fit in the budget is skipped (listed by :func:`sweep_design`, reason given) and left to
the model-guided search after the sweep, whose uncertainty is largest exactly there. A longer budget extends a
shorter one's plan, so editing ``n_trials`` between runs keeps every sweep position's meaning.

Example::

    design = sweep_design(Space(spec), score)
    [p.rationale for p in design.points[:3]], design.skipped[:3]
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..physics.uncertainty import gain_inside_band, gain_verdict, ratio_band
from ..space import Space, TrainingConfig
from ..spec.study import AXES
from .nearest import MEMORY_LEVERS, Nearest, Score  # noqa: F401 (MEMORY_LEVERS re-exported)
from .suggest import legal_config


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
    from_model: bool = False
    """the centre is the model's best (``search.start``), not the baseline"""

    @property
    def rationale(self) -> str:
        if self.axis is None:
            head = "sweep centre" if self.from_model else "baseline"
            return head + (f" ({self.note})" if self.note else "")
        text = f"sweep {self.axis}={self.value} (other axes at the sweep centre)"
        return text + (f"; {self.note}" if self.note else "")


def _legal(space: Space, c: TrainingConfig) -> bool:
    return legal_config(space, c)[0] is not None


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


MAX_REPAIR_MOVES = 2
"""a sweep point that does not fit may move at most this many other axes to fit"""
MAX_PRUNED_POINTS = 2
"""points with no fitting repair spent (as zero-cost memory prunes) when the budget has room, at most"""
MATTERS = 0.25
"""a value can still matter when its best fitting configuration is estimated within 25% of the best one (the
model's errors on real clusters reach ±15-25%, see docs/benchmarks.md)"""
SWEEP_SHARE = 0.15
"""default share of ``search.n_trials`` given to the sweep: 4 of 30. The learner needs the remaining trials
more than the sweep needs a second round (scripts/bench_search.py on the shipped studies: a 15-point sweep
reached a median 77-83% of the optimum at 15 trials, a 4-point one 96-100%; docs/benchmarks.md)"""


@dataclass(frozen=True)
class SweepSkip:
    """A value the sweep does not spend a trial on, and why."""

    axis: str
    value: Any
    reason: str


@dataclass
class SweepDesign:
    """The sweep plan with what it left out."""

    points: list[SweepPoint]
    skipped: list[SweepSkip]
    centre_note: str
    """why the centre is not the baseline as written (illegal, does not fit), else empty"""
    budget: int
    start: dict[str, Any] | None = None
    """when ``search.start`` moved the centre to the model's best: ``note`` (why), ``baseline_estimate`` and
    ``centre_estimate`` (tokens/s/GPU)"""

    @property
    def centre(self) -> TrainingConfig:
        return self.points[0].config

    def summary(self) -> dict[str, Any]:
        """A JSON-able record (stored as the study user attr ``sweep``, read by the report)."""
        return {
            "centre": self.centre.key(),
            "centre_note": self.centre_note,
            "start": self.start,
            "budget": self.budget,
            "points": len(self.points),
            "skipped": [{"axis": s.axis, "value": str(s.value), "reason": s.reason} for s in self.skipped],
        }


def sweep_budget(space: Space) -> int:
    """Trials the sweep may use: ``search.sweep_trials``, default :data:`SWEEP_SHARE` of ``search.n_trials``
    (at least 2)."""
    search = space.spec.search
    if search.sweep_trials is not None:
        return search.sweep_trials
    return max(2, int(search.n_trials * SWEEP_SHARE))


def _moved(base: TrainingConfig, c: TrainingConfig, skip: str | None = None) -> str:
    return ", ".join(
        f"{a} {getattr(base, a)}→{getattr(c, a)}"
        for a in AXES
        if a != skip and getattr(base, a) != getattr(c, a)
    )


def sweep_center(
    space: Space,
    fits: Callable[[TrainingConfig], bool] | None = None,
    score: Score | None = None,
    nearest: Nearest | None = None,
) -> tuple[TrainingConfig, str]:
    """The sweep's centre and a note: the baseline if it is legal and fits, else the nearest one that does."""
    base = space.canonical(space.baseline)
    legal = _legal(space, base)
    if legal and (fits is None or fits(base)):
        return base, ""
    if fits is None:
        fixed = repair(space, space.baseline)
        if fixed is None:
            return base, "the baseline is illegal and has no legal neighbour"
        return fixed, f"the study's baseline is illegal; moved {_moved(space.baseline, fixed)}"
    found = (nearest or Nearest(space)).nearest(space.baseline if not legal else base, fits, score)
    if found is None:
        return base, "nothing in the space fits in memory; the baseline is kept"
    if legal:
        why = "does not fit in memory"
    elif space.check(base):
        why = "is illegal"
    else:
        outside = [a for a in AXES if getattr(base, a) not in space.candidates[a]]
        why = (
            "uses values outside the study's axes ("
            + ", ".join(f"{a}={getattr(base, a)}" for a in outside)
            + ")"
        )
    return found, (
        f"the study's baseline {why}; centred on the nearest configuration that fits: "
        f"moved {_moved(space.baseline, found)}"
    )


def axis_points(
    space: Space, center: TrainingConfig, axis: str, legal: dict[str, list[Any]] | None = None
) -> list[tuple[Any, TrainingConfig, str]]:
    """``(value, config, note)`` for every other legal value of ``axis`` around ``center`` (legal repairs);
    ``legal`` is ``space.legal_values()`` when already computed."""
    legal_values = (legal or space.legal_values())[axis]
    out = []
    for v in legal_values:
        if v == getattr(center, axis):
            continue
        c = repair(space, center.replace(**{axis: v}), fixed=(axis,))
        if c is not None:
            out.append((v, c, _diff_note(center, c, axis)))
    return out


def default_order(
    space: Space, center: TrainingConfig, score: Score | None, legal: dict[str, list[Any]] | None = None
) -> list[str]:
    """Axes by decreasing expected impact (see the module docstring); canonical order without a model.

    The impact of an axis is its largest relative change of the score against the centre's; when the centre
    itself has no score, against the median score of every feasible sweep point."""
    if score is None:
        return list(AXES)
    legal = legal or space.legal_values()
    values = {axis: [score(c) for _, c, _ in axis_points(space, center, axis, legal)] for axis in AXES}
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


def _value_best(
    space: Space, score: Score
) -> tuple[dict[tuple[str, Any], float], float, TrainingConfig | None]:
    """The best estimate of any fitting configuration with each (axis, value), the best overall and its
    configuration (the first in the space's order among equals)."""
    best: dict[tuple[str, Any], float] = {}
    top, top_config = 0.0, None
    for c in space.configs():
        s = score(c)
        if not s:
            continue
        if s > top:
            top, top_config = s, c
        for a in AXES:
            k = (a, getattr(c, a))
            if s > best.get(k, 0.0):
                best[k] = s
    return best, top, top_config


def model_start(
    space: Space, centre: TrainingConfig, score: Score, top: tuple[float, TrainingConfig | None]
) -> tuple[TrainingConfig, dict[str, Any]] | None:
    """The model's best configuration as the sweep's centre, and a note, when ``search.start`` asks for it:
    ``model`` always, ``auto`` (single-objective studies) when the best's estimated gain over ``centre`` (the
    baseline or its fitting repair) lies beyond the error band of the ratio of two estimates of the study
    (:func:`~primus_optuna.physics.uncertainty.ratio_band`): the model is then confident that the baseline is
    slower, and measuring it first would spend a trial on a point the model knows is worse. Returns the new
    centre and :attr:`SweepDesign.start`; ``None``: keep ``centre``."""
    mode = space.spec.search.start
    best, config = top
    if mode == "auto" and space.spec.search.multi_objective:
        return None  # a Pareto study's baseline is a reference on every objective, not only throughput
    if mode == "baseline" or config is None or config == centre:
        return None
    base = score(centre) or 0.0
    gain = best / base - 1 if base else float("inf")
    band = ratio_band(space.spec)
    if mode == "auto" and base and gain_inside_band(gain, band):
        return None
    versus = f"{gain:.0%} above the baseline's {base:,.0f}" if base else "the baseline does not fit"
    why = (
        "search.start: model"
        if mode == "model"
        else f"{gain_verdict(gain, band)} ({band.source}); search.start: baseline begins at the baseline"
    )
    note = f"the model's best, estimated {best:,.0f} tokens/s/GPU, {versus}: {why}"
    return config, {"note": note, "baseline_estimate": base or None, "centre_estimate": best}


def sweep_design(
    space: Space,
    score: Score | None = None,
    *,
    fits: Callable[[TrainingConfig], bool] | None = None,
    budget: int | None = None,
) -> SweepDesign:
    """The whole sweep (see the module docstring) with the values it skips and why.

    ``score`` is the expected tokens/s/GPU (``None`` when a configuration does not fit); ``fits`` defaults to
    ``score(c) is not None`` when a score is given (without either, everything is taken to fit)."""
    if fits is None and score is not None:
        fits = lambda c: score(c) is not None  # noqa: E731
    budget = sweep_budget(space) if budget is None else budget
    nearest = Nearest(space) if fits is not None else None
    center, note = sweep_center(space, fits, score, nearest)
    value_best, top, top_config = _value_best(space, score) if score is not None else ({}, 0.0, None)
    started = model_start(space, center, score, (top, top_config)) if score is not None else None
    start = None
    if started:
        center, start = started
    explicit = space.spec.search.sweep_order
    legal = space.legal_values()
    order = explicit or default_order(space, center, score, legal)
    skipped: list[SweepSkip] = []
    kept: dict[str, list[SweepPoint]] = {}
    unfit: list[SweepPoint] = []
    seen = {center}

    def vbest(axis: str, value: Any) -> float:
        return value_best.get((axis, value), 0.0)

    for axis in order:
        points = []
        for value, config, pnote in axis_points(space, center, axis, legal):
            if fits is not None and not fits(config):
                assert nearest is not None
                fixed = nearest.nearest(config, fits, score, fixed=axis, max_moves=MAX_REPAIR_MOVES)
                if fixed is None:
                    unfit.append(SweepPoint(0, axis, value, config, pnote))
                    continue
                moved = _moved(center, fixed, axis)
                config, pnote = fixed, f"also {moved} to fit in memory" if moved else ""
            if config in seen:
                continue
            seen.add(config)
            points.append(SweepPoint(0, axis, value, config, pnote))
        # the values that can still matter by the model, best first; a contrast value when none does
        ranked = sorted(points, key=lambda p: (-vbest(axis, p.value), space.candidates[axis].index(p.value)))
        keep = [p for p in ranked if not top or vbest(axis, p.value) >= (1 - MATTERS) * top] or ranked[:1]
        kept[axis] = keep
        for p in [q for q in ranked if q not in keep]:
            skipped.append(
                SweepSkip(
                    axis,
                    p.value,
                    f"cannot matter by the model: its best fitting configuration is estimated at "
                    f"{vbest(axis, p.value):.0f} tokens/s/GPU, {1 - vbest(axis, p.value) / top:.0%} below the best",
                )
            )
    if explicit:  # the user's order: axis by axis
        ordered = [p for axis in order for p in kept.get(axis, [])]
    else:  # every axis's most promising value first, the most promising axis first; then the rest
        rest = [p for axis in order for p in kept.get(axis, [])[1:]]
        # (stable: equal potentials keep the impact order)
        ordered = sorted(
            [ps[0] for axis in order if (ps := kept.get(axis))], key=lambda p: -vbest(p.axis or "", p.value)
        )
        ordered += sorted(rest, key=lambda p: -vbest(p.axis or "", p.value))
    ordered += unfit[:MAX_PRUNED_POINTS]
    centre_words = "; ".join(x for x in (note, start["note"] if start else "") if x)
    plan = [SweepPoint(0, None, None, center, centre_words, from_model=start is not None)]
    for p in ordered:
        if len(plan) >= budget:
            break
        plan.append(SweepPoint(len(plan), p.axis, p.value, p.config, p.note))
    spent = len(plan) - 1
    no_fit = f"does not fit in memory, and no fitting configuration is within {MAX_REPAIR_MOVES} other moves"
    for p in ordered[spent:]:
        reason = no_fit if p in unfit else f"beyond the sweep budget of {budget} trials (search.sweep_trials)"
        skipped.append(SweepSkip(p.axis or "", p.value, reason))
    skipped += [SweepSkip(p.axis or "", p.value, no_fit) for p in unfit[MAX_PRUNED_POINTS:]]
    return SweepDesign(plan, skipped, note, budget, start)


def sweep_plan(space: Space, score: Score | None = None, **kwargs: Any) -> list[SweepPoint]:
    """The sweep's points, centre first (see :func:`sweep_design`)."""
    return sweep_design(space, score, **kwargs).points
