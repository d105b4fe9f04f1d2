"""Runners: turn a configuration into a measured tokens/s/GPU, and the objective that calls them.

:func:`make_objective` (which needs Optuna) is imported lazily from :mod:`primus_optuna.run.objective`.
"""

from .analytical import AnalyticalRunner
from .base import (
    EarlyStopped,
    LaunchFailure,
    Measurement,
    NoThroughput,
    OutOfMemory,
    RunContext,
    RunFailure,
    Runner,
    RunTimeout,
)
from .command import CommandRunner
from .factory import make_runner
from .follow import LiveIteration, LogFollower
from .logparse import ParsedLog, parse_log
from .profile import ProfileRunner

__all__ = [
    "AnalyticalRunner",
    "CommandRunner",
    "EarlyStopped",
    "LaunchFailure",
    "LiveIteration",
    "LogFollower",
    "Measurement",
    "NoThroughput",
    "OutOfMemory",
    "ParsedLog",
    "ProfileRunner",
    "RunContext",
    "RunFailure",
    "RunTimeout",
    "Runner",
    "make_runner",
    "parse_log",
]
