"""Memory prefilter: prune a trial whose configuration would not fit in GPU memory, before any GPU time.

:class:`MemoryPrefilterPruner` is an Optuna pruner: when the objective calls ``trial.should_prune()`` before
any ``report()``, it reads the trial's configuration from its parameters (the ten axes, whichever sampler
set them; missing axes come from the study's baseline), estimates its memory and prunes it when the peak
stage exceeds the usable memory. Later calls (after ``report()``) go to the wrapped pruner.

Multi-objective studies cannot call ``should_prune``; their objectives call :func:`prune_if_infeasible`,
which writes the same user attrs and raises :class:`optuna.TrialPruned`.

User attrs written (both paths): ``memory_peak_gib``, ``memory_usable_gib``, ``memory_peak_stage``, and
``prune_reason`` (e.g. ``"memory: 301.2 GiB on stage 3 > 259.2 GiB usable"``) when pruned. When the study
holds a :class:`~primus_optuna.physics.memory_calibration.MemoryCalibration` (study user attr
``memory_calibration``, refitted by the objective from measured peaks and out-of-memory runs), the calibrated
peak decides (``memory_peak_calibrated_gib``) and the reason says so.

Example::

    study = optuna.create_study(pruner=MemoryPrefilterPruner(spec=spec, wrapped=optuna.pruners.MedianPruner()))
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.pruners import BasePruner

from ..errors import SpecError
from ..physics.memory import MemoryEstimate, estimate_memory
from ..physics.memory_calibration import MemoryCalibration
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import AXES

__all__ = [
    "MemoryPrefilterPruner",
    "config_from_params",
    "memory_attrs",
    "memory_check",
    "prune_if_infeasible",
    "study_memory_calibration",
]

SPEC_ATTR = "primus_spec"


def config_from_params(space: Space, params: dict[str, Any]) -> TrainingConfig:
    """The canonical, derived configuration of a trial's params (other params are ignored; missing axes
    come from the study's baseline)."""
    axes = {k: v for k, v in params.items() if k in AXES}
    validated = TrainingConfig.from_params(axes)
    return space.canonical(space.baseline_raw.replace(**{k: getattr(validated, k) for k in axes}))


CALIBRATION_ATTR = "memory_calibration"


def memory_attrs(
    estimate: MemoryEstimate, calibration: MemoryCalibration | None = None
) -> tuple[bool, dict[str, Any]]:
    """Whether the configuration fits, and the trial user attrs that record it (``prune_reason`` only when it
    does not fit)."""
    attrs: dict[str, Any] = {
        "memory_peak_gib": round(estimate.peak_gib, 3),
        "memory_usable_gib": round(estimate.usable_gib, 3),
        "memory_peak_stage": estimate.peak_stage,
    }
    if calibration is None or calibration.is_identity:
        if not estimate.fits:
            attrs["prune_reason"] = estimate.reason()
        return estimate.fits, attrs
    peak, fits = calibration.apply(estimate)
    attrs["memory_peak_calibrated_gib"] = round(peak, 3)
    if not fits:
        attrs["prune_reason"] = (
            f"memory: {peak:.1f} GiB on stage {estimate.peak_stage} > {estimate.usable_gib:.1f} GiB usable "
            f"(model {estimate.peak_gib:.1f} GiB, {calibration.describe()})"
        )
    return fits, attrs


def study_memory_calibration(study: optuna.Study) -> MemoryCalibration:
    """The study's :class:`MemoryCalibration` (identity until the objective has stored one)."""
    return MemoryCalibration.from_dict(study.user_attrs.get(CALIBRATION_ATTR))


def memory_check(
    spec: StudySpec, config: TrainingConfig, calibration: MemoryCalibration | None = None
) -> tuple[MemoryEstimate, bool, dict[str, Any]]:
    """Estimate ``config``: the estimate, whether it fits (calibrated when given) and the user attrs."""
    est = estimate_memory(spec, config)
    fits, attrs = memory_attrs(est, calibration)
    return est, fits, attrs


class MemoryPrefilterPruner(BasePruner):
    """Prune configurations that do not fit before they run; delegate later decisions to ``wrapped``.

    ``spec`` defaults to the study's ``primus_spec`` user attr (the study file as a dict), read once.
    """

    def __init__(self, wrapped: BasePruner | None = None, spec: StudySpec | None = None) -> None:
        self.wrapped = wrapped
        self._spec = spec
        self._space: Space | None = Space(spec) if spec is not None else None

    def _space_for(self, study: optuna.Study) -> Space:
        if self._space is None:
            data = study.user_attrs.get(SPEC_ATTR)
            if data is None:
                raise SpecError(
                    "MemoryPrefilterPruner needs the study spec: pass spec=... or set the study user attr "
                    f"{SPEC_ATTR!r} to StudySpec.to_dict()"
                )
            self._spec = StudySpec.from_dict(data, source=f"study user attr {SPEC_ATTR}")
            self._space = Space(self._spec)
        return self._space

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if trial.last_step is not None:
            return self.wrapped.prune(study, trial) if self.wrapped is not None else False
        space = self._space_for(study)
        _, fits, attrs = memory_check(
            space.spec, config_from_params(space, trial.params), study_memory_calibration(study)
        )
        storage = study._storage
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial._trial_id, key, value)
        return not fits


def prune_if_infeasible(
    trial: optuna.Trial, spec: StudySpec, config: TrainingConfig | None = None
) -> MemoryEstimate:
    """For multi-objective studies (no ``should_prune``): record the estimate on ``trial`` and raise
    :class:`optuna.TrialPruned` when it does not fit. ``config`` defaults to the trial's params."""
    space = Space(spec)
    cfg = space.canonical(config) if config is not None else config_from_params(space, trial.params)
    est, fits, attrs = memory_check(spec, cfg, study_memory_calibration(trial.study))
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    if not fits:
        raise optuna.TrialPruned(attrs["prune_reason"])
    return est
