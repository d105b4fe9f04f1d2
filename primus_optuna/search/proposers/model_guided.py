"""The model-guided proposer's pick (:class:`~primus_optuna.search.fallback.ModelGuidedProposer`): the best
untried feasible configuration by expected improvement under the corrected model; ``None`` when every
feasible configuration has been tried (the study is exhausted)."""

from __future__ import annotations

from .base import Context, Proposal


class ModelGuided:
    name = "model-guided"

    def __init__(self, note: str = "") -> None:
        self.note = note

    def propose(self, ctx: Context) -> Proposal | None:
        fallback = ctx.sampler.fallback
        found = fallback.propose(
            ctx.others,
            index=ctx.trial.number,
            exclude=ctx.covered,
            memory_scale=ctx.mem_cal.scale,
            prior=ctx.warm,
        )
        if found is None:
            return None
        config, rationale = found
        return Proposal(config, "fallback", f"fallback-{fallback.mode}", self.note + rationale)
