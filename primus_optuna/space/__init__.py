"""The configuration space of a study: :class:`TrainingConfig` (one point), Megatron-Core's legality rules
(each violation with a human reason), :class:`Space` (candidates, canonical forms, enumeration, baseline) and
Megatron/Primus argument names.

Imports only the spec: never the physics (legality is decided by rules, not by memory or speed estimates) or any
layer above, nor Optuna, DSPy, LiteLLM or torch.
"""

from .config import TrainingConfig, parse_config_string
from .rules import RULES, Facts, Rule
from .space import Space

__all__ = ["RULES", "Facts", "Rule", "Space", "TrainingConfig", "parse_config_string"]
