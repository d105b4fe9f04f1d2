"""Search: the memory prefilter pruner (samplers and planners are added here by their pieces)."""

from .early_stop import ThroughputPruner, study_pruner
from .pruner import MemoryPrefilterPruner, config_from_params, memory_attrs, memory_check, prune_if_infeasible
from .sampler import PrimusSampler
from .suggest import suggest_config

__all__ = [
    "MemoryPrefilterPruner",
    "PrimusSampler",
    "ThroughputPruner",
    "config_from_params",
    "memory_attrs",
    "memory_check",
    "prune_if_infeasible",
    "study_pruner",
    "suggest_config",
]
