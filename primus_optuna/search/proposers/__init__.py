"""The proposers :class:`~primus_optuna.search.sampler.PrimusSampler` chains, each a module of its own:
failed points retried once (:mod:`.retry`) → the warm start's offers (:mod:`.warm`) → the one-axis sweep
(:mod:`.sweep`) → the LLM planner (:mod:`.planner`) → the model-guided proposer (:mod:`.model_guided`). The first
that has something proposes; each reads the study through one :class:`~.base.Context`.
"""

from .base import Context, Proposal, Proposer, Tried
from .model_guided import ModelGuided
from .planner import PlannerProposer
from .retry import Retry
from .sweep import Sweep
from .warm import WarmStartOffers

__all__ = [
    "Context",
    "ModelGuided",
    "PlannerProposer",
    "Proposal",
    "Proposer",
    "Retry",
    "Sweep",
    "Tried",
    "WarmStartOffers",
]
