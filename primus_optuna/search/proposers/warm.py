"""The warm start's offers: right after the baseline, the earlier studies' best configurations that are legal
here and fit (best first, each once)."""

from __future__ import annotations

from ...space import TrainingConfig
from ..state import warm_start_data
from .base import Context, Proposal

PHASE = "warm_start"


def known_configs(ctx: Context) -> set[TrainingConfig]:
    """The configurations an earlier study measured that are legal here (the sweep skips them)."""
    space = ctx.sampler.space
    pairs = warm_start_data(ctx.study).get("pairs", [])
    return {space.canonical(TrainingConfig.from_params(p["params"])) for p in pairs if p.get("legal")}


class WarmStartOffers:
    name = "warm-start"

    def propose(self, ctx: Context) -> Proposal | None:
        offers = warm_start_data(ctx.study).get("offers", [])
        if not offers or ctx.sampler.plan[0].config not in ctx.covered:
            return None  # the baseline first
        space = ctx.sampler.space
        for params in offers:
            config = space.canonical(TrainingConfig.from_params(params))
            if config not in ctx.covered and ctx.allowed(config):
                return Proposal(config, PHASE, "warm-start", "best measured in an earlier study (warm start)")
        return None
