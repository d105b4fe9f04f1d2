"""The pre-launch feasibility gate: prune a trial whose configuration would not fit in GPU memory, before any
GPU time.

The gate is stateless: it decides on the *trial's suggested configuration* (what
:func:`~primus_optuna.search.suggest.suggest_config` recorded, or all ten axis params) and records its verdict
on the trial (system attr ``primus:memory_check``), so the decision is made once per trial, whichever process
asks, and survives a restart.

- :class:`MemoryPrefilterPruner`: at the first ``trial.should_prune()`` after the configuration was suggested
  — whether or not the objective called ``report()`` before — it checks memory and prunes when the peak stage
  exceeds the usable memory. Before a configuration exists it decides nothing (an early ``should_prune()``
  never checks the baseline in its place). Later calls go to the wrapped pruner.
- Under another pruner (``PatientPruner(MemoryPrefilterPruner(...))``, any wrapper that may not call it before
  launch): :func:`suggest_config` finds the gate anywhere in the study's pruner chain and applies it at once,
  so composition never skips the check.
- Multi-objective studies cannot call ``should_prune``; their objectives call :func:`prune_if_infeasible`,
  which writes the same attrs, sets the trial constraint ``memory_gib`` (calibrated peak − usable, or reserved
  estimate − capacity once a reserve is learned; ≤ 0 fits,
  so constrained samplers learn from it) and raises :class:`optuna.TrialPruned`.

User attrs written: ``memory_peak_gib``, ``memory_usable_gib``, ``memory_peak_stage``, and ``prune_reason``
(e.g. ``"memory: 301.2 GiB on stage 3 > 259.2 GiB usable"``) when pruned. The study's
:class:`~primus_optuna.physics.memory_calibration.MemoryCalibration` (derived from its trials by
:func:`~primus_optuna.search.calibrations.study_calibrations`) decides when it is not the identity
(``memory_peak_calibrated_gib``; the reason says so); once measured runs printed their reserved peak it also
compares the reserved estimate (calibrated peak + the learned reserve, ``memory_reserved_calibrated_gib``) with
the device's capacity.

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
from .attrs import PRUNE_REASON
from .calibrations import study_calibrations
from .configs import config_from_params, trial_config
from .state import MEMORY_CHECK, set_trial_state, stored_spec, system_attrs

__all__ = [
    "MemoryPrefilterPruner",
    "config_from_params",
    "feasibility_gate",
    "memory_attrs",
    "memory_check",
    "prune_if_infeasible",
    "study_memory_calibration",
]

CONSTRAINT = "memory_gib"
"""the trial constraint set by :func:`prune_if_infeasible`: calibrated peak − usable GiB, or with a learned
reserve the reserved estimate − the device's capacity (≤ 0: fits)"""


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
            attrs[PRUNE_REASON] = estimate.reason()
        return estimate.fits, attrs
    peak, fits = calibration.apply(estimate)
    attrs["memory_peak_calibrated_gib"] = round(peak, 3)
    if calibration.reserve_gib > 0:
        attrs["memory_reserved_calibrated_gib"] = round(calibration.reserved(estimate), 3)
    if not fits and calibration.oom_dominated(estimate.peak_gib):
        attrs[PRUNE_REASON] = (
            f"memory: estimated {estimate.peak_gib:.1f} GiB on stage {estimate.peak_stage}, at least the "
            f"{calibration.oom_peak_gib:.1f} GiB estimated for a run of this study that ran out of memory, and no "
            "run this large completed with a measurement"
        )
    elif not fits and calibration.reserve_gib > 0:  # a learned reserve: the reserved estimate decides alone
        attrs[PRUNE_REASON] = (
            f"memory: {calibration.reserved(estimate):.1f} GiB reserved on stage {estimate.peak_stage} > "
            f"{estimate.capacity_gib:.1f} GiB device ({peak:.1f} GiB allocated + the framework's reserve; "
            f"model {estimate.peak_gib:.1f} GiB, {calibration.describe()})"
        )
    elif not fits:
        attrs[PRUNE_REASON] = (
            f"memory: {peak:.1f} GiB on stage {estimate.peak_stage} > {estimate.usable_gib:.1f} GiB usable "
            f"(model {estimate.peak_gib:.1f} GiB, {calibration.describe()})"
        )
    return fits, attrs


def study_memory_calibration(study: optuna.Study, spec: StudySpec | None = None) -> MemoryCalibration:
    """The study's :class:`MemoryCalibration`, derived from its trials now (identity without evidence)."""
    return study_calibrations(study, spec, step=False).memory


def memory_check(
    spec: StudySpec, config: TrainingConfig, calibration: MemoryCalibration | None = None
) -> tuple[MemoryEstimate, bool, dict[str, Any]]:
    """Estimate ``config``: the estimate, whether it fits (calibrated when given) and the user attrs."""
    est = estimate_memory(spec, config)
    fits, attrs = memory_attrs(est, calibration)
    return est, fits, attrs


def _gate(study: optuna.Study, trial: Any, spec: StudySpec, config: TrainingConfig) -> tuple[bool, str]:
    """Check ``config`` for ``trial`` once: record the attrs and the verdict; ``(fits, reason)``."""
    done = system_attrs(trial).get(MEMORY_CHECK)
    if isinstance(done, dict) and done.get("key") == config.key():
        return bool(done["fits"]), str(done.get("reason", ""))
    fits, attrs = memory_attrs(estimate_memory(spec, config), study_memory_calibration(study, spec))
    for key, value in attrs.items():
        if isinstance(trial, optuna.Trial):
            trial.set_user_attr(key, value)
        else:
            study._storage.set_trial_user_attr(trial._trial_id, key, value)
    reason = str(attrs.get(PRUNE_REASON, ""))
    set_trial_state(study, trial, MEMORY_CHECK, {"key": config.key(), "fits": fits, "reason": reason})
    return fits, reason


class MemoryPrefilterPruner(BasePruner):
    """Prune configurations that do not fit before they run; delegate later decisions to ``wrapped``.

    ``spec`` defaults to the study file the study stored (:func:`~primus_optuna.search.state.store_spec`).
    Holds no per-trial state (picklable; any number of processes share one decision per trial).
    """

    def __init__(self, wrapped: BasePruner | None = None, spec: StudySpec | None = None) -> None:
        self.wrapped = wrapped
        self._spec = spec
        self._space: Space | None = None

    def space_for(self, study: optuna.Study) -> Space:
        if self._space is None:
            self._space = Space(self.spec_for(study))
        return self._space

    def spec_for(self, study: optuna.Study) -> StudySpec:
        if self._spec is None:
            self._spec = stored_spec(
                study, required="MemoryPrefilterPruner needs the study spec: pass spec=..."
            )
        assert self._spec is not None
        return self._spec

    def _delegate(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return self.wrapped.prune(study, trial) if self.wrapped is not None else False

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        spec = self.spec_for(study)
        sa = study._storage.get_trial_system_attrs(trial._trial_id)
        if sa.get(MEMORY_CHECK):  # decided already (this or another process): the wrapped pruner's turn
            return (not sa[MEMORY_CHECK]["fits"]) or self._delegate(study, trial)
        config = trial_config(self.space_for(study), _WithAttrs(trial, sa))
        if config is None:  # no configuration suggested yet: nothing to check (never the baseline instead)
            return self._delegate(study, trial) if trial.last_step is not None else False
        if trial.last_step is not None and self._delegate(study, trial):
            return True
        fits, _ = _gate(study, trial, spec, config)
        return not fits


class _WithAttrs:
    """A frozen trial seen with the system attrs just read from storage (the pruner's copy may be older)."""

    def __init__(self, trial: optuna.trial.FrozenTrial, sa: dict[str, Any]) -> None:
        self.params, self.system_attrs = trial.params, sa


def feasibility_gate(pruner: Any) -> MemoryPrefilterPruner | None:
    """The :class:`MemoryPrefilterPruner` anywhere in a pruner chain (``PatientPruner``'s
    ``_wrapped_pruner``, this package's ``wrapped``, any wrapper with a ``wrapped``/``_wrapped_pruner``/
    ``_pruner`` attribute), else ``None``."""
    seen: set[int] = set()
    while pruner is not None and id(pruner) not in seen:
        seen.add(id(pruner))
        if isinstance(pruner, MemoryPrefilterPruner):
            return pruner
        pruner = next(
            (
                getattr(pruner, a)
                for a in ("wrapped", "_wrapped_pruner", "_pruner")
                if getattr(pruner, a, None)
            ),
            None,
        )
    return None


def gate_now(trial: optuna.Trial, spec: StudySpec, config: TrainingConfig) -> None:
    """Apply a feasibility gate nested under another pruner at once (its wrapper may never call it before the
    job launches): raises :class:`optuna.TrialPruned` when ``config`` does not fit."""
    study = trial.study
    gate = feasibility_gate(study.pruner)
    if gate is None or gate is study.pruner or study._is_multi_objective():
        return
    fits, reason = _gate(study, trial, gate.spec_for(study) if gate._spec else spec, config)
    if not fits:
        raise optuna.TrialPruned(reason)


def prune_if_infeasible(
    trial: optuna.Trial, spec: StudySpec, config: TrainingConfig | None = None
) -> MemoryEstimate:
    """For multi-objective studies (no ``should_prune``) and any objective that wants the gate without the
    pruner: record the estimate on ``trial`` and the constraint ``memory_gib``; raise
    :class:`optuna.TrialPruned` when it does not fit. ``config`` defaults to the trial's configuration."""
    space = Space(spec)
    cfg = space.canonical(config) if config is not None else trial_config(space, trial)
    if cfg is None:
        if not trial.params:
            raise SpecError(
                "prune_if_infeasible: the trial has no configuration yet; call suggest_config first"
            )
        cfg = config_from_params(space, trial.params)
    study = trial.study
    fits, reason = _gate(study, trial, spec, cfg)
    est = estimate_memory(spec, cfg)
    peak = float(trial.user_attrs.get("memory_peak_calibrated_gib", est.peak_gib))
    if f"constraints:{CONSTRAINT}" not in study._storage.get_trial_system_attrs(trial._trial_id):
        reserved = trial.user_attrs.get("memory_reserved_calibrated_gib")
        trial.set_constraint(
            CONSTRAINT, peak - est.usable_gib if reserved is None else float(reserved) - est.capacity_gib
        )
    if not fits:
        trial.set_user_attr(PRUNE_REASON, reason)
        raise optuna.TrialPruned(reason)
    return est
