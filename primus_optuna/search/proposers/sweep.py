"""The sweep's next point: the first plan point not covered by a finished or running trial (so a trial added
with ``study.add_trial`` covers its point instead of shifting the others, and N workers take N points). Points
an earlier study measured (warm start) are skipped, the centre excepted.

Once the centre is measured (not in an analytical study), or its trial ended without a measurement (pruned or
failed), the order becomes value-driven: a remaining point runs only when the corrected model finds it worth a
launch and ranks it within the :data:`BY_VALUE_RANK` best untried configurations by expected improvement
(:class:`~primus_optuna.search.fallback.Judge`), its figure in the rationale. While the study has fewer trials
than the plan has points, a trial for which no point qualifies goes to the model's own pick (the fallback, the
passed-over point named in its rationale), so the search is never behind measuring the model's top
configurations; the points left wait (they run later when the measurements raise them), and after the sweep's
budget the planner is asked as before. In a study that sets ``search.sweep_trials`` (the user's sweep) and in a
Pareto study, a point is left out only when its upper bound is below
:data:`~primus_optuna.search.fallback.MIN_SHARE` of the best; the others keep the plan's order."""

from __future__ import annotations

from optuna.trial import TrialState

from ..configs import trial_config
from ..fallback import MIN_SHARE, Judge, Worth
from ..learner import trial_measurement
from ..sweep import SweepPoint
from .base import Context, Proposal
from .model_guided import ModelGuided
from .warm import known_configs

BY_VALUE_RANK = 1
"""a remaining sweep point runs (once the order is value-driven) when it is among this many best untried
configurations by expected improvement. 1: only when it is the model's own pick. On the vTrain measured
landscapes (scripts/bench_measured.py, split seed 0 / 1) it leaves the search behind measuring the model's top 3
on 1 / 0 of 35 landscapes, against 5 / 4 with the fallback's 5 (a one-axis point ranked #4 ran before the
model's #2 and #3); on the synthetic landscapes (scripts/bench_search.py, 13,000+ configurations) a sweep point
is almost never among the 5 best, so the figures do not change (docs/benchmarks.md)"""

SWEEP_ATTR = "sweep"
"""study user attr: the sweep's centre, budget and what it skipped and why (:meth:`SweepDesign.summary`)"""


class Sweep:
    name = "sweep"

    def __init__(self) -> None:
        self.note = ""
        """why the sweep proposed nothing while points remain (for the model-guided proposer's rationale)"""

    def remaining(self, ctx: Context) -> list[SweepPoint]:
        known = known_configs(ctx)
        return [
            p
            for p in ctx.sampler.plan
            if p.config not in ctx.covered and (p.index == 0 or p.config not in known)
        ]

    def propose(self, ctx: Context) -> Proposal | None:
        left = self.remaining(ctx)
        if left and left[0].index > 0 and ctx.sampler.fallback.mode == "model":
            judge = ctx.sampler.fallback.judge(
                ctx.others, exclude=ctx.covered, memory_scale=ctx.mem_cal.scale, prior=ctx.warm
            )
            # value-driven once the centre, the one-axis points' reference, is measured (not an analytical
            # study), unless the study file sets the sweep's length (search.sweep_trials: that sweep is run)
            by_value = ctx.sampler.spec.search.sweep_trials is None and not judge.multi
            if by_value and _centre_judged(ctx):
                return self._by_value(ctx, left, judge)
            if judge.n_measured and len(left) > 1:
                left = [p for p in left if judge(p.config).upper_share >= MIN_SHARE]
        if not left:
            return None
        return self._proposal(ctx, left[0])

    def _by_value(self, ctx: Context, left: list[SweepPoint], judge: Judge) -> Proposal | None:
        """The best remaining point by expected improvement when it is worth a launch and among the
        :data:`BY_VALUE_RANK` best; else the model's own pick while the sweep's budget lasts (else nothing)."""
        verdicts = [(judge(p.config), p) for p in left]
        ranked = sorted(
            ((w, p) for w, p in verdicts if w.ei_rank is not None),
            key=lambda wp: (wp[0].ei_rank, wp[1].index),
        )
        for w, p in ranked:
            if w.worth and w.ei_rank is not None and w.ei_rank < BY_VALUE_RANK:
                return self._proposal(ctx, p, w)
        if ctx.trial.number >= len(ctx.sampler.plan):
            return None  # the sweep's budget is spent: the planner, then the fallback
        nxt = ranked[0] if ranked else None
        self.note = (
            "sweep: no remaining point is "
            + (f"among the {BY_VALUE_RANK} best" if BY_VALUE_RANK > 1 else "the best")
            + " by expected improvement"
            + (f" (the best, {_label(nxt[1])}, is {_figure(nxt[0])})" if nxt else "")
            + "; the model's own pick first: "
        )
        return ModelGuided(self.note).propose(ctx)

    def _proposal(self, ctx: Context, p: SweepPoint, worth: Worth | None = None) -> Proposal:
        study = ctx.study
        if SWEEP_ATTR not in study._storage.get_study_user_attrs(study._study_id):
            study._storage.set_study_user_attr(study._study_id, SWEEP_ATTR, ctx.sampler.design.summary())
        value = p.value if p.axis else p.config.key()
        extra = {"sweep_index": p.index, "sweep_axis": p.axis or "baseline", "sweep_value": value}
        rationale = p.rationale + (f"; by value: {worth.why}" if worth is not None else "")
        return Proposal(p.config, "sweep", "sweep", rationale, extra)


def _centre_judged(ctx: Context) -> bool:
    """Whether the sweep's order may become value-driven: the centre is measured (and so is the model's
    reference), or each of its trials ended without a value (pruned or failed: the one-axis moves lost their
    reference, and the model, corrected by any other measurement, is all there is). An analytical trial of the
    centre (an estimate) keeps the plan's order."""
    space, centre = ctx.sampler.space, ctx.sampler.plan[0].config
    finished = [t for t in ctx.others if t.state.is_finished() and trial_config(space, t) == centre]
    if any(t.state == TrialState.COMPLETE for t in finished):
        return any(trial_measurement(t) is not None for t in finished)
    return bool(finished)


def _label(p: SweepPoint) -> str:
    return f"{p.axis}={p.value}" if p.axis else "the centre"


def _figure(w: Worth) -> str:
    return w.why.removeprefix("value: ").removesuffix(": not worth a launch")
