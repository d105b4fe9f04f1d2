"""The sweep's next point: the first plan point not covered by a finished or running trial (so a trial added
with ``study.add_trial`` covers its point instead of shifting the others, and N workers take N points). Points
an earlier study measured (warm start) are skipped, the centre excepted."""

from __future__ import annotations

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
        if not left:
            return None
        p = left[0]
        study = ctx.study
        if SWEEP_ATTR not in study._storage.get_study_user_attrs(study._study_id):
            study._storage.set_study_user_attr(study._study_id, SWEEP_ATTR, ctx.sampler.design.summary())
        value = p.value if p.axis else p.config.key()
        extra = {"sweep_index": p.index, "sweep_axis": p.axis or "baseline", "sweep_value": value}
        return Proposal(p.config, "sweep", "sweep", p.rationale, extra)
