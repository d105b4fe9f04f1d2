"""The sweep's next point: the first plan point not covered by a finished or running trial (so a trial added
with ``study.add_trial`` covers its point instead of shifting the others, and N workers take N points). Points
an earlier study measured (warm start) are skipped, the centre excepted.

Once something is measured (not in an analytical study), a point the corrected model is confident is worse
(its upper bound, :class:`~primus_optuna.search.fallback.Judge`, below 80% of the best measured or expected)
is left out, its trial spent on the model's own pick instead; the others keep the plan's order."""

from __future__ import annotations

from ..fallback import MIN_SHARE
from .base import Context, Proposal
from .warm import known_configs

SWEEP_ATTR = "sweep"
"""study user attr: the sweep's centre, budget and what it skipped and why (:meth:`SweepDesign.summary`)"""


class Sweep:
    name = "sweep"

    def remaining(self, ctx: Context) -> list:
        known = known_configs(ctx)
        return [
            p
            for p in ctx.sampler.plan
            if p.config not in ctx.covered and (p.index == 0 or p.config not in known)
        ]

    def propose(self, ctx: Context) -> Proposal | None:
        left = self.remaining(ctx)
        if len(left) > 1 and left[0].index > 0 and ctx.sampler.fallback.mode == "model":
            judge = ctx.sampler.fallback.judge(
                ctx.others, exclude=ctx.covered, memory_scale=ctx.mem_cal.scale, prior=ctx.warm
            )
            if judge.n_measured:  # nothing measured (an analytical study): the plan stands
                left = [p for p in left if judge(p.config).upper_share >= MIN_SHARE]
        if not left:
            return None
        p = left[0]
        study = ctx.study
        if SWEEP_ATTR not in study._storage.get_study_user_attrs(study._study_id):
            study._storage.set_study_user_attr(study._study_id, SWEEP_ATTR, ctx.sampler.design.summary())
        value = p.value if p.axis else p.config.key()
        extra = {"sweep_index": p.index, "sweep_axis": p.axis or "baseline", "sweep_value": value}
        return Proposal(p.config, "sweep", "sweep", p.rationale, extra)
