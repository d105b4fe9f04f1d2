"""Runners turn a configuration into tokens/s/GPU: the analytical estimate, a single-device torch profile, or a
launched job (command, Primus, Megatron, Slurm, local) whose log is parsed; ``objective.make_objective`` is the
Optuna objective that calls one (it needs Optuna, so this package does not import it).

May import search, physics, space and spec; torch only inside the profile runner (through ``workloads``);
never cli, nor record (one exception: ``objective`` reads a storage's file path from ``record.storage``).
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
    value_kind,
)
from .command import CommandRunner
from .factory import make_runner
from .follow import LiveIteration, LogFollower
from .launch_guard import RepeatedLaunchFailure
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
    "RepeatedLaunchFailure",
    "RunContext",
    "RunFailure",
    "RunTimeout",
    "Runner",
    "make_runner",
    "parse_log",
    "value_kind",
]
