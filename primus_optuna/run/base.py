"""The runner interface: a configuration in, a :class:`Measurement` (or a typed :class:`RunFailure`) out.

Every runner — the analytical estimate, the single-device profile, a real launch — implements
:class:`Runner`. The objective records a failure as a FAIL trial with ``failure_reason`` = the failure's
``reason`` and attaches its log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..errors import PrimusError
from ..space import TrainingConfig
from ..spec import StudySpec


@dataclass
class Measurement:
    """What one run of one configuration produced."""

    tokens_per_s_per_gpu: float
    step_time_s: float
    source: str
    """``analytical`` (the estimate), ``profiled`` (single-device profile extrapolated) or ``measured``"""
    peak_memory_gib: float | None = None
    log_path: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    """runner-specific extras (breakdown, steps averaged, profile cache hits, ...); JSON-serialisable"""


class RunFailure(PrimusError):
    """A run that produced no throughput; ``reason`` is the machine-readable category."""

    reason: ClassVar[str] = "failed"

    def __init__(self, message: str, *, log_path: str | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail


class OutOfMemory(RunFailure):
    reason = "oom"


class RunTimeout(RunFailure):
    reason = "timeout"


class LaunchFailure(RunFailure):
    reason = "launch_failed"


class NoThroughput(RunFailure):
    reason = "no_throughput"


@dataclass
class RunContext:
    """Where and for what a run happens."""

    spec: StudySpec
    workdir: Path
    """a directory of its own for this trial (logs, overlays); created by the caller"""
    trial_number: int | None = None
    study_name: str | None = None


@runtime_checkable
class Runner(Protocol):
    """Turns a configuration into a measurement."""

    kind: str
    # optional: ``measures_cluster_memory = False`` when the runner's peak memory and out-of-memory failures
    # come from another device than the study's GPU (the profile runner); they then do not calibrate memory

    def run(self, config: TrainingConfig, context: RunContext) -> Measurement: ...
