"""The runner interface: a configuration in, a :class:`Measurement` (or a typed :class:`RunFailure`) out.

Every runner — the analytical estimate, the single-device profile, a real launch — implements
:class:`Runner`. The objective records a failure as a FAIL trial with ``failure_reason`` = the failure's
``reason`` and attaches its log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from ..errors import PrimusError
from ..space import TrainingConfig
from ..spec import StudySpec

if TYPE_CHECKING:
    from .follow import LiveIteration


VALUE_KINDS = {"analytical": "estimated", "profiled": "projected", "measured": "measured"}
"""how a user reads a trial's value, by its ``source``: the step-time model's estimate, a single-device profile
projected to the cluster, or a run's log"""


def value_kind(source: str | None) -> str | None:
    """``estimated``, ``projected`` or ``measured`` for a trial's ``source`` (another runner's source counts
    as measured); ``None`` without a source (a plain objective's value)."""
    return None if source is None else VALUE_KINDS.get(source, "measured")


@dataclass
class Measurement:
    """What one run of one configuration produced."""

    tokens_per_s_per_gpu: float
    step_time_s: float
    source: str
    """``analytical`` (the estimate), ``profiled`` (single-device profile extrapolated) or ``measured``"""
    peak_memory_gib: float | None = None
    log_path: str | None = None
    peak_reserved_gib: float | None = None
    """the allocator's reserved peak where the framework prints it (the memory gate learns its reserve)"""
    details: dict[str, Any] = field(default_factory=dict)
    """runner-specific extras (breakdown, steps averaged, profile cache hits, ...); JSON-serialisable"""


class RunFailure(PrimusError):
    """A run that produced no throughput; ``reason`` is the machine-readable category."""

    reason: ClassVar[str] = "failed"

    def __init__(
        self, message: str, *, log_path: str | None = None, log_tail: str = "", wall_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail
        self.wall_s = wall_s
        """how long the job ran before it failed (launching runners)"""


class OutOfMemory(RunFailure):
    reason = "oom"


class RunTimeout(RunFailure):
    reason = "timeout"


class LaunchFailure(RunFailure):
    reason = "launch_failed"


class NoThroughput(RunFailure):
    reason = "no_throughput"


class EarlyStopped(RunFailure):
    """The job was stopped while running because it was slower than the best trial (the trial is PRUNED).

    ``message`` is the prune reason (``slow: ...``); ``gpu_hours_saved`` the GPU-hours its remaining
    iterations would have taken (``None`` when the log does not say how many were left).
    """

    reason = "slow"

    def __init__(
        self,
        message: str,
        *,
        log_path: str | None = None,
        log_tail: str = "",
        wall_s: float | None = None,
        gpu_hours_saved: float | None = None,
        iterations: int = 0,
        tokens_per_s_per_gpu: float | None = None,
    ) -> None:
        super().__init__(message, log_path=log_path, log_tail=log_tail, wall_s=wall_s)
        self.gpu_hours_saved = gpu_hours_saved
        self.iterations = iterations
        self.tokens_per_s_per_gpu = tokens_per_s_per_gpu
        """the median of the steady-state iterations it ran: a partial measurement"""


IterationCallback = Callable[["LiveIteration", bool], "str | None"]
"""Called by a launching runner for each steady-state iteration of a running job with ``(iteration, live)``;
``live`` is False for iterations read after the job ended. A returned string (while live) stops the job and
becomes the :class:`EarlyStopped` message."""


@dataclass
class RunContext:
    """Where and for what a run happens."""

    spec: StudySpec
    workdir: Path
    """a directory of its own for this trial (logs, overlays); created by the caller"""
    trial_number: int | None = None
    study_name: str | None = None
    on_iteration: IterationCallback | None = None
    """set by the objective: receives live iterations (intermediate values) and may stop the job"""


@runtime_checkable
class Runner(Protocol):
    """Turns a configuration into a measurement."""

    kind: str
    # optional: ``measures_cluster_memory = False`` when the runner's peak memory and out-of-memory failures
    # come from another device than the study's GPU (the profile runner); they then do not calibrate memory

    def run(self, config: TrainingConfig, context: RunContext) -> Measurement: ...
