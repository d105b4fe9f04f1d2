"""How trials are chosen: :class:`PrimusSampler` (a chain of proposers: retry, warm start, the one-axis sweep,
the LLM planner, the model-guided fallback), :func:`suggest_config` for Optuna's own samplers, and
:class:`MemoryPrefilterPruner`, which prunes a configuration that would not fit before anything is launched.
Library state is in ``primus:`` system attrs (:mod:`.state`; the LLM call budget, reserved before each call, in
:mod:`.llm_budget`); calibrations are derived from the trials
(:func:`study_calibrations`).

Imports Optuna, physics, space and spec; DSPy and LiteLLM only in ``planner`` (loaded when an LLM is
configured); never run, record or torch.
"""

from .calibrations import StudyCalibrations, study_calibrations
from .configs import legal_config, trial_config
from .early_stop import ThroughputPruner, study_pruner
from .learner import Observation, prior_observations
from .llm_budget import llm_accounting, reserve_call
from .pruner import (
    MemoryPrefilterPruner,
    config_from_params,
    feasibility_gate,
    memory_attrs,
    memory_check,
    prune_if_infeasible,
)
from .sampler import PrimusSampler
from .state import store_spec, stored_spec
from .suggest import suggest_config
from .sweep import SweepDesign, sweep_design, sweep_plan

__all__ = [
    "MemoryPrefilterPruner",
    "Observation",
    "PrimusSampler",
    "StudyCalibrations",
    "SweepDesign",
    "ThroughputPruner",
    "config_from_params",
    "feasibility_gate",
    "legal_config",
    "llm_accounting",
    "memory_attrs",
    "memory_check",
    "prior_observations",
    "prune_if_infeasible",
    "reserve_call",
    "store_spec",
    "stored_spec",
    "study_calibrations",
    "study_pruner",
    "suggest_config",
    "sweep_design",
    "sweep_plan",
    "trial_config",
]
