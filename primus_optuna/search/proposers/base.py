"""What every proposer sees (:class:`Context`: the study's trials as tried / in flight / failed
configurations) and returns (:class:`Proposal`).

A configuration is *tried* (never proposed again) when a trial of it is running or waiting, completed, was
pruned (except as a duplicate, or for memory when the study's memory calibration now says it fits), ran out of
memory, or failed twice (a failed point is retried once, see :mod:`.retry`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from ...physics.memory_calibration import MemoryCalibration
from ...space import Space, TrainingConfig
from ..attrs import DUPLICATE, FAILURE_REASON, MEMORY, PRUNE_REASON, reason_category
from ..configs import trial_config
from ..state import EXHAUSTED

ACTIVE = (TrialState.RUNNING, TrialState.WAITING)


@dataclass
class Proposal:
    """A decision: the configuration, its phase (sweep|warm_start|retry|planner|fallback|enqueued), who made it
    and why; ``extra`` goes to the trial's user attrs (sweep index/axis/value, ``retry_of``)."""

    config: TrainingConfig
    phase: str
    proposer: str
    rationale: str
    extra: dict[str, Any] = field(default_factory=dict)


def counts_as_tried(t: FrozenTrial, mem_cal: MemoryCalibration) -> bool:
    """Whether ``t`` uses up its configuration (see the module docstring; FAIL is decided per configuration)."""
    attrs = t.user_attrs
    reason = reason_category(attrs.get(PRUNE_REASON))
    if reason == DUPLICATE or EXHAUSTED in t.system_attrs or attrs.get("phase") == "exhausted":
        return False
    if t.state == TrialState.PRUNED and reason == MEMORY and not mem_cal.is_identity:
        peak, usable = attrs.get("memory_peak_gib"), attrs.get("memory_usable_gib")
        if peak and usable and mem_cal.fits_peak(float(peak), float(usable)):
            return False
    return True


@dataclass
class Tried:
    """The study's configurations by what happened to them."""

    covered: set[TrainingConfig]
    """tried or in flight: never proposed again"""
    retry: list[tuple[TrainingConfig, FrozenTrial]]
    """configurations whose only attempt failed (not out of memory): retried once, oldest first"""
    ordered: list[TrainingConfig]
    """every configuration with a trial, in trial order (for the planner's prompt)"""


def tried(space: Space, trials: list[FrozenTrial], mem_cal: MemoryCalibration) -> Tried:
    attempts: dict[TrainingConfig, list[FrozenTrial]] = defaultdict(list)
    ordered = []
    for t in sorted(trials, key=lambda t: t.number):
        c = trial_config(space, t)
        if c is None:
            continue
        ordered.append(c)
        if t.state == TrialState.FAIL or counts_as_tried(t, mem_cal):
            attempts[c].append(t)
    covered: set[TrainingConfig] = set()
    retry = []
    for c, ts in attempts.items():
        failed = [t for t in ts if t.state == TrialState.FAIL]
        if len(failed) < len(ts):
            covered.add(c)
            continue
        first = failed[0]
        oom = first.user_attrs.get(FAILURE_REASON) == "oom"
        is_retry = any(
            t.user_attrs.get("retry_of") is not None or "failed_trial" in t.system_attrs for t in ts
        )
        covered.add(c)
        if len(failed) == 1 and not oom and not is_retry:
            retry.append((c, first))
    return Tried(covered, retry, ordered)


@dataclass
class Context:
    """One decision's view of the study (read once)."""

    sampler: Any
    """the :class:`~primus_optuna.search.sampler.PrimusSampler` deciding (its space, plan, planner, fallback)"""
    study: optuna.Study
    trial: FrozenTrial
    others: list[FrozenTrial]
    mem_cal: MemoryCalibration
    exclude: set[TrainingConfig] = field(default_factory=set)
    """configurations a concurrent worker claimed while this one decided (never proposed)"""

    @cached_property
    def state(self) -> Tried:
        return tried(self.sampler.space, self.others, self.mem_cal)

    @property
    def covered(self) -> set[TrainingConfig]:
        return self.state.covered | self.exclude

    def allowed(self, config: TrainingConfig) -> bool:
        """Whether ``config`` keeps the axes a wrapping ``PartialFixedSampler`` fixes (``sampler.fixed``)."""
        return all(getattr(config, a) == v for a, v in getattr(self.sampler, "fixed", {}).items())

    @cached_property
    def warm(self) -> list[Any]:
        from ..warm_start import warm_start_observations

        return warm_start_observations(self.sampler.space, self.study)


class Proposer(Protocol):
    name: str

    def propose(self, ctx: Context) -> Proposal | None: ...
