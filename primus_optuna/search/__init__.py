"""Search: the memory prefilter pruner (samplers and planners are added here by their pieces)."""

from .pruner import MemoryPrefilterPruner, config_from_params, memory_attrs, memory_check, prune_if_infeasible
from .sampler import PrimusSampler
from .suggest import suggest_config

__all__ = [
    "MemoryPrefilterPruner",
    "PrimusSampler",
    "config_from_params",
    "memory_attrs",
    "memory_check",
    "prune_if_infeasible",
    "suggest_config",
]
