"""The LLM planner's round: :meth:`~primus_optuna.search.planner.Planner.propose` (budget, prompt, call,
validation) for a round of candidates, each launched only when the fallback's acquisition finds it worth a
launch (:meth:`~primus_optuna.search.fallback.ModelGuidedProposer.judge`: else rejected with its expected
figure, which the next call is told); the first becomes this trial, the others are enqueued (``phase=planner``)
for the next trials of any worker. Nothing when no planner is configured, it is over budget or has no valid
idea (the note says why, for the model-guided proposer's rationale)."""

from __future__ import annotations

from typing import Any

from ...space import TrainingConfig
from ..attrs import EXPECTED, EXPECTED_SHARE
from ..fallback import Worth
from .base import Context, Proposal

PLANNER_CONTEXT = 12
"""configurations of the corrected ranking shown to the planner"""
SHORTLIST = 6
"""the rank mode's shortlist: the fallback's best untried configurations by expected improvement"""


def _exploration(first: Worth | None) -> str:
    """Why the fallback's own pick is kept from the planner (expected below :data:`~primus_optuna.search.fallback.MIN_SHARE` of the
    best: a pick its uncertainty earns), or ``""``; rank mode then leaves the trial to the fallback, so a model
    choosing among the shortlist never diverges from the fallback's path for want of that pick."""
    if first is None or first.worth:
        return ""
    figure = first.why.removeprefix("value: ").removesuffix(": not worth a launch")
    return f"the fallback's own pick is an exploration the planner may not launch: {figure}"


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
        judge = sampler.fallback.judge(
            ctx.others, exclude=exclude, memory_scale=ctx.mem_cal.scale, prior=ctx.warm
        )

        verdicts: dict[TrainingConfig, Worth] = {}

        def validate(params: dict[str, Any]) -> tuple[TrainingConfig | None, str]:
            """legal, fits, new (the sampler's check), then worth a launch (the fallback's acquisition)"""
            config, reason = sampler.validate(params, exclude, ctx.mem_cal)
            if config is None:
                return None, reason
            worth = verdicts[config] = judge(config)
            return (config, worth.why) if worth.worth else (None, worth.why)

        def proposal(config: TrainingConfig, rationale: str) -> Proposal:
            """the launch, with the gate's figures as attrs (what it was expected at when it was let through)"""
            w = verdicts[config]  # every accepted candidate passed ``validate``
            extra = {EXPECTED: round(w.expected, 1), EXPECTED_SHARE: round(w.share, 4)}
            return Proposal(config, "planner", planner.model, rationale, extra)

        exploration = _exploration(judge.first())
        out = planner.propose(
            ctx.study,
            ctx.others,
            n=sampler.proposals_per_round,
            tried=list(dict.fromkeys(c.key() for c in ctx.state.ordered)),
            validate=validate,
            trial_number=ctx.trial.number,
            ranking=sampler.fallback.ranking(
                ctx.others, k=PLANNER_CONTEXT, exclude=exclude, memory_scale=ctx.mem_cal.scale, prior=ctx.warm
            ),
            shortlist=judge.shortlist(SHORTLIST),
            defer=bool(exploration),
        )
        if out.deferred:
            self.note = f"planner passed ({exploration}); "
            return None
        if not out.accepted:
            self.note = (
                f"planner unavailable ({out.error or 'no valid candidate'}; {len(out.rejected)} rejected); "
            )
            return None
        for config, rationale in out.accepted[1:]:
            ctx.study.enqueue_trial(
                config.to_params(),
                user_attrs=sampler.proposal_attrs(proposal(config, rationale)),
                skip_if_exists=True,
            )
        return proposal(*out.accepted[0])
