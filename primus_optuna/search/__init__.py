"""Search: the memory prefilter pruner (samplers and planners are added here by their pieces)."""

from .learner import Observation, prior_observations
from .pruner import MemoryPrefilterPruner, config_from_params, memory_attrs, memory_check, prune_if_infeasible
from .sampler import PrimusSampler
from .suggest import suggest_config
from .sweep import SweepDesign, sweep_design, sweep_plan

__all__ = [
    "MemoryPrefilterPruner",
    "Observation",
    "PrimusSampler",
    "SweepDesign",
    "config_from_params",
    "memory_attrs",
    "memory_check",
    "prior_observations",
    "prune_if_infeasible",
    "suggest_config",
    "sweep_design",
    "sweep_plan",
]
