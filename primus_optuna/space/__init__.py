"""The configuration space: :class:`TrainingConfig`, legality rules, :class:`Space`."""

from .config import TrainingConfig, parse_config_string
from .rules import RULES, Facts, Rule
from .space import Space

__all__ = ["RULES", "Facts", "Rule", "Space", "TrainingConfig", "parse_config_string"]
