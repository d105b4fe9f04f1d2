"""The LLM planner's round: :meth:`~primus_optuna.search.planner.Planner.propose` (budget, prompt, call,
validation) for a round of candidates; the first becomes this trial, the others are enqueued (``phase=planner``)
for the next trials of any worker. Nothing when no planner is configured, it is over budget or has no valid
idea (the note says why, for the model-guided proposer's rationale)."""

from __future__ import annotations

from .base import Context, Proposal

PLANNER_CONTEXT = 12
"""configurations of the corrected ranking shown to the planner"""


class PlannerProposer:
    name = "planner"

    def __init__(self) -> None:
        self.note = ""
        self.asked = False

    def propose(self, ctx: Context) -> Proposal | None:
        """One call per decision (a choice another worker claimed meanwhile is re-decided without a second
        call: the round's other candidates are queued already)."""
        sampler = ctx.sampler
        planner = sampler.planner
        if planner is None or self.asked:
            return None
        self.asked = True
        exclude = ctx.covered
        out = planner.propose(
            ctx.study,
            ctx.others,
            n=sampler.proposals_per_round,
            tried=list(dict.fromkeys(c.key() for c in ctx.state.ordered)),
            validate=lambda d: sampler.validate(d, exclude, ctx.mem_cal),
            trial_number=ctx.trial.number,
            ranking=sampler.fallback.ranking(
                ctx.others, k=PLANNER_CONTEXT, exclude=exclude, memory_scale=ctx.mem_cal.scale, prior=ctx.warm
            ),
        )
        if not out.accepted:
            self.note = (
                f"planner unavailable ({out.error or 'no valid candidate'}; {len(out.rejected)} rejected); "
            )
            return None
        for config, rationale in out.accepted[1:]:
            ctx.study.enqueue_trial(
                config.to_params(),
                user_attrs=sampler.proposal_attrs(Proposal(config, "planner", planner.model, rationale)),
                skip_if_exists=True,
            )
        config, rationale = out.accepted[0]
        return Proposal(config, "planner", planner.model, rationale)
