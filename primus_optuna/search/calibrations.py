"""The study's calibrations, derived from its trials whenever they are read: :func:`study_calibrations`.

Nothing is refitted and stored: the step-time :class:`~primus_optuna.physics.calibration.Calibration` and the
:class:`~primus_optuna.physics.memory_calibration.MemoryCalibration` are functions of the evidence in storage —
every measured trial (complete, or stopped early with a partial measurement), every measured peak (and the
reserved peak beside it, the framework's allocator reserve), every out-of-memory run, plus what a warm start imported (study system attr ``primus:warm_start``). The sampler,
the memory gate, the objective, the warm start and the report all call this one helper, so no refit can forget
evidence (a warm start keeps the study's own out-of-memory runs) and concurrent workers never overwrite each
other's fit.

A trial's memory evidence counts unless its ``counts_for_memory`` attr (legacy: ``oom_counts_for_memory``) is
false (e.g. a local profiling run, not the cluster's GPU).

Example::

    cal = study_calibrations(study, spec)
    cal.memory.scale, cal.step.multipliers
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna

from ..physics.calibration import Calibration
from ..physics.memory_calibration import MemoryCalibration
from ..physics.throughput import ThroughputEstimate, estimate_throughput
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from .attrs import FAILURE_REASON
from .configs import trial_config
from .learner import trial_measurement
from .state import stored_spec, warm_start_data
from .warm_data import WarmStart

__all__ = ["Evidence", "StudyCalibrations", "calibrations_of", "counts_for_memory", "study_calibrations"]

Pair = tuple[TrainingConfig, ThroughputEstimate, float]


@dataclass(frozen=True)
class Evidence:
    """What one trial says: its state name, configuration, user attrs and measured tokens/s/GPU (if any)."""

    state: str
    config: TrainingConfig | None
    attrs: dict[str, Any]
    measured: float | None


@dataclass
class StudyCalibrations:
    """The study's fits and the evidence behind them."""

    step: Calibration
    memory: MemoryCalibration
    pairs: list[Pair] = field(default_factory=list)
    """(configuration, estimate, measured) of every measured trial and imported pair"""
    memory_ratios: list[float] = field(default_factory=list)
    oom_bounds: list[float] = field(default_factory=list)
    memory_reserves: list[float] = field(default_factory=list)
    """reserved − allocated peak (GiB) of every measured trial that reported both"""

    def step_dict(self) -> dict[str, Any] | None:
        """The step-time calibration as a JSON dict, ``None`` when nothing was measured."""
        return self.step.to_dict() if self.pairs else None

    def memory_dict(self) -> dict[str, Any] | None:
        return (
            self.memory.to_dict() if (self.memory_ratios or self.oom_bounds or self.memory_reserves) else None
        )


def counts_for_memory(attrs: dict[str, Any]) -> bool:
    return bool(attrs.get("counts_for_memory", attrs.get("oom_counts_for_memory", True)))


def calibrations_of(
    spec: StudySpec,
    space: Space,
    evidence: Iterable[Evidence],
    warm: dict[str, Any] | None = None,
    *,
    step: bool = True,
) -> StudyCalibrations:
    """The calibrations of ``evidence`` (one per trial) and a warm start's import ``warm``; ``step=False``
    skips the step-time fit (no estimate per measured trial: the memory gate needs only the memory one)."""
    ws = WarmStart.from_dict(warm)
    pairs: list[Pair] = [p.to_pair(space) for p in ws.pairs] if step else []
    ratios, bounds = list(ws.memory_ratios), list(ws.oom_bounds)
    reserves = list(ws.memory_reserves)
    capacity = spec.cluster.gpu.hbm_gib
    oom_peaks: list[float] = []
    measured_peaks: list[float] = []
    for e in evidence:
        est_peak = e.attrs.get("memory_peak_gib")
        if step and e.measured is not None and e.config is not None:
            pairs.append((e.config, estimate_throughput(spec, e.config), e.measured))
        if not est_peak or float(est_peak) <= 0 or not counts_for_memory(e.attrs):
            continue
        if e.state == "COMPLETE" and e.attrs.get("measured_peak_memory_gib"):
            ratios.append(float(e.attrs["measured_peak_memory_gib"]) / float(est_peak))
            if e.attrs.get("measured_reserved_memory_gib"):
                reserves.append(
                    float(e.attrs["measured_reserved_memory_gib"])
                    - float(e.attrs["measured_peak_memory_gib"])
                )
        elif e.attrs.get(FAILURE_REASON) == "oom":
            bounds.append(capacity / float(est_peak))
            oom_peaks.append(float(est_peak))
        if e.state == "COMPLETE" and e.attrs.get("source", "analytical") != "analytical":
            measured_peaks.append(float(est_peak))
    fit = Calibration.fit([(est, m) for _, est, m in pairs]) if pairs else Calibration()
    memory = MemoryCalibration.fit(
        ratios, bounds, reserves, capacity, oom_peaks=oom_peaks, measured_peaks=measured_peaks
    )
    return StudyCalibrations(fit, memory, pairs, ratios, bounds, reserves)


def trial_evidence(
    space: Space, trials: Iterable[optuna.trial.FrozenTrial], *, configs: bool = True
) -> list[Evidence]:
    return [
        Evidence(
            t.state.name, trial_config(space, t) if configs else None, t.user_attrs, trial_measurement(t)
        )
        for t in trials
    ]


def study_calibrations(
    study: optuna.Study, spec: StudySpec | None = None, space: Space | None = None, *, step: bool = True
) -> StudyCalibrations:
    """The calibrations of ``study`` now (identity without evidence, or without a stored study file);
    ``step=False``: the memory calibration only (cheaper)."""
    spec = spec or stored_spec(study)
    if spec is None:
        return StudyCalibrations(Calibration(), MemoryCalibration())
    space = space or Space(spec)
    trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
    evidence = trial_evidence(space, trials, configs=step)
    return calibrations_of(spec, space, evidence, warm_start_data(study), step=step)
