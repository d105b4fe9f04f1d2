"""How trials are chosen: :class:`PrimusSampler` (the one-axis sweep, then the LLM planner or the model-guided
fallback), :func:`suggest_config` for Optuna's own samplers, and :class:`MemoryPrefilterPruner`, which prunes a
configuration that would not fit before anything is launched.

Imports Optuna, physics, space and spec; DSPy and LiteLLM only in ``planner`` (loaded when an LLM is
configured); never run, record or torch.
"""

from .early_stop import ThroughputPruner, study_pruner
from .learner import Observation, prior_observations
from .llm_budget import llm_accounting
from .pruner import MemoryPrefilterPruner, config_from_params, memory_attrs, memory_check, prune_if_infeasible
from .sampler import PrimusSampler
from .suggest import suggest_config
from .sweep import SweepDesign, sweep_design, sweep_plan

__all__ = [
    "MemoryPrefilterPruner",
    "Observation",
    "PrimusSampler",
    "SweepDesign",
    "ThroughputPruner",
    "config_from_params",
    "llm_accounting",
    "memory_attrs",
    "memory_check",
    "prior_observations",
    "prune_if_infeasible",
    "study_pruner",
    "suggest_config",
    "sweep_design",
    "sweep_plan",
]
