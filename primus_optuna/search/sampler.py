""":class:`PrimusSampler`: a resumable one-axis sweep, then LLM-planned or model-guided whole configurations.

All state comes from the study's storage; nothing is counted in memory:

- A *free* trial (created by the sampler, not enqueued and not a heartbeat retry) takes sweep position
  ``k`` = the number of free trials with a smaller trial number. Trial numbers are unique per storage, so a
  rerun continues at the next point and N workers never get the same position (as Optuna's GridSampler).
- After the sweep, a free trial asks the planner (when configured and within budget) for a round of
  candidates: the first becomes this trial, the rest are enqueued in storage (``phase=planner``) and are taken
  by the next trials of any worker. Otherwise the model-guided fallback picks the configuration.
- Whole configurations are returned by :meth:`sample_relative` over a fixed categorical search space (the
  study's candidate values), so they pass through :func:`suggest_config` unchanged.

Every proposed trial gets user attrs ``phase`` (sweep|planner|fallback), ``proposer``, ``rationale``,
``config_key``, ``estimate_tokens_per_s_per_gpu`` and ``memory_peak_gib``; sweep trials also ``sweep_index``,
``sweep_axis`` and ``sweep_value``. Duplicate configurations that slip through concurrency (e.g. an enqueued
trial popped twice on SQLite) are pruned by the objective's duplicate guard.

Example::

    study = optuna.create_study(direction="maximize", sampler=PrimusSampler(spec),
                                pruner=MemoryPrefilterPruner(spec=spec))
    study.optimize(make_objective(spec, AnalyticalRunner(spec)), n_trials=30)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial

from ..errors import SpecError
from ..physics.memory import estimate_memory
from ..physics.memory_calibration import MemoryCalibration
from ..physics.throughput import estimate_throughput
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import AXES
from .fallback import ModelGuidedProposer, rng_for
from .learner import Observation
from .pruner import memory_attrs, study_memory_calibration
from .suggest import axis_distributions, complete_config
from .sweep import SweepDesign, SweepPoint, sweep_design
from .warm_start import PHASE as WARM_PHASE
from .warm_start import next_offer, warm_start_observations

log = logging.getLogger(__name__)
RUNNING = optuna.trial.TrialState.RUNNING
EXHAUSTED = "exhausted: every legal configuration that fits in memory has been tried"
SWEEP_ATTR = "sweep"
"""study user attr: the sweep's centre, budget and what it skipped and why (:meth:`SweepDesign.summary`)"""
PLANNER_CONTEXT = 12
"""configurations of the corrected ranking shown to the planner"""
PENDING_S = 60.0
"""a free trial still without a configuration this long after its start is a killed sampling, not a
concurrent one (a proposal takes milliseconds, a planner call at most the LLM timeout)"""


def _counts_as_tried(t: FrozenTrial, mem_cal: MemoryCalibration) -> bool:
    """Whether ``t`` uses up its configuration: not when it was pruned as a duplicate (both of a concurrent
    pair may be), was an exhausted-space placeholder, or was pruned by memory but fits under the study's
    current memory calibration (measured runs showed the model was pessimistic)."""
    attrs = t.user_attrs
    reason = str(attrs.get("prune_reason", ""))
    if reason.startswith("duplicate") or attrs.get("phase") == "exhausted":
        return False
    if t.state == optuna.trial.TrialState.PRUNED and reason.startswith("memory") and not mem_cal.is_identity:
        peak, usable = attrs.get("memory_peak_gib"), attrs.get("memory_usable_gib")
        if peak and usable and float(peak) * mem_cal.scale <= float(usable):
            return False
    return True


@dataclass
class Proposal:
    config: TrainingConfig
    phase: str
    proposer: str
    rationale: str
    extra: dict[str, Any] = field(default_factory=dict)


def is_free(trial: FrozenTrial) -> bool:
    """Whether the sampler chose this trial's params (not enqueued, not a heartbeat retry)."""
    return "fixed_params" not in trial.system_attrs and "failed_trial" not in trial.system_attrs


def trial_config(space: Space, trial: FrozenTrial) -> TrainingConfig | None:
    """The configuration a trial has or is queued with (``None`` while its params are incomplete)."""
    params = trial.system_attrs.get("fixed_params") or trial.params
    try:
        return complete_config(space, params)
    except SpecError:
        return None


class PrimusSampler(BaseSampler):
    """Sweep, then plan (LLM) or model-guided fallback; state derived from storage.

    Args:
        spec: the study.
        seed: seeds exploration (with the count of earlier free trials) and any non-axis parameter (with the
            trial number).
        llm: ``None`` (no planner), a LiteLLM model string, an :class:`~primus_optuna.spec.study.LLMSpec`, or a
            ``dspy.BaseLM`` (e.g. ``dspy.utils.DummyLM`` in tests).
        fallback: ``"model"`` (calibrated step-time ranking) or ``"random"``.
        proposals_per_round: candidates asked from the planner per call.
        artifact_store: where planner transcripts go (study artifacts).
        cache_dir: DSPy disk cache directory (next to the storage, so reruns replay).
        llm_api_base: overrides ``llm.api_base``.
        exploration: probability that the fallback picks among its few best by expected improvement at random
            (default :data:`~primus_optuna.search.fallback.EXPLORATION`).
        prior: measurements imported from earlier studies (see
            :func:`~primus_optuna.search.learner.prior_observations`): the fallback learns from them, with a
            larger noise than from this study's own trials.
    """

    def __init__(
        self,
        spec: StudySpec,
        *,
        seed: int = 0,
        llm: Any = None,
        fallback: str = "model",
        proposals_per_round: int = 4,
        artifact_store: Any = None,
        cache_dir: str | Path | None = None,
        llm_api_base: str | None = None,
        exploration: float | None = None,
        prior: Sequence[Observation] = (),
    ) -> None:
        self.spec = spec
        self.space = Space(spec)
        self.seed = seed
        self.proposals_per_round = proposals_per_round
        self.planner_context = PLANNER_CONTEXT
        self._dists = axis_distributions(self.space)
        self._design: SweepDesign | None = None
        self._lock = threading.Lock()
        self.fallback = ModelGuidedProposer(
            spec,
            self.space,
            seed=seed,
            mode=fallback,
            prior=prior,
            **({"exploration": exploration} if exploration is not None else {}),
        )
        self.planner = None
        if llm is not None and llm is not False:
            from .planner import Planner

            self.planner = Planner(
                spec,
                self.space,
                llm,
                api_base=llm_api_base,
                artifact_store=artifact_store,
                cache_dir=cache_dir,
                usable_gib=estimate_memory(spec, self.space.canonical(self.space.baseline)).usable_gib,
                fallback=self.fallback,
            )

    # --- the plan ------------------------------------------------------------------------------------------
    def _score(self, config: TrainingConfig) -> float | None:
        """The model's tokens/s/GPU of a legal configuration that fits (``None`` otherwise), from the
        fallback's table of every feasible configuration (computed once)."""
        return self.fallback.estimate_of(config)

    @property
    def design(self) -> SweepDesign:
        """The sweep (computed once; deterministic from the study file), with what it skipped and why."""
        with self._lock:
            if self._design is None:
                self._design = sweep_design(self.space, self._score)
            return self._design

    @property
    def plan(self) -> list[SweepPoint]:
        """The sweep plan's points, centre first."""
        return self.design.points

    # --- BaseSampler ---------------------------------------------------------------------------------------
    def reseed_rng(self) -> None:
        """Nothing to reseed: randomness derives from ``(seed, trial.number)``."""

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or not is_free(trial):
            return {}
        proposal = self.propose(study, trial)
        if proposal is None:  # every feasible configuration has been tried: this trial runs nothing
            for key, value in (("phase", "exhausted"), ("prune_reason", EXHAUSTED)):
                study._storage.set_trial_user_attr(trial._trial_id, key, value)
                trial.user_attrs[key] = value
            return {}
        self._record(study, trial, proposal)
        return proposal.config.to_params()

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        rng = rng_for(self.seed, trial.number, salt=sum(map(ord, param_name)))
        if isinstance(param_distribution, CategoricalDistribution):
            return param_distribution.choices[int(rng.integers(len(param_distribution.choices)))]
        return RandomSampler(seed=int(rng.integers(2**31))).sample_independent(
            study, trial, param_name, param_distribution
        )

    # --- proposals -----------------------------------------------------------------------------------------
    def propose(self, study: optuna.Study, trial: FrozenTrial) -> Proposal | None:
        """The configuration for a free trial: its sweep point, else a planner or fallback choice."""
        trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        k = sum(1 for t in trials if t.number < trial.number and is_free(t))
        # warm start: the earlier studies' best configurations right after the baseline; sweep points they
        # measured already (legal here) are skipped
        known: set[TrainingConfig] = set()
        if k >= 1:
            offer, taken, known = next_offer(self.space, study, trials, trial.number)
            if offer is not None:
                return Proposal(
                    offer, WARM_PHASE, "warm-start", "best measured in an earlier study (warm start)"
                )
            k -= taken
        plan = [(i, p) for i, p in enumerate(self.plan) if i == 0 or p.config not in known]
        if k < len(plan):
            if SWEEP_ATTR not in study._storage.get_study_user_attrs(study._study_id):
                study._storage.set_study_user_attr(study._study_id, SWEEP_ATTR, self.design.summary())
            i, p = plan[k]
            value = p.value if p.axis else p.config.key()
            extra = {"sweep_index": i, "sweep_axis": p.axis or "baseline", "sweep_value": value}
            return Proposal(p.config, "sweep", "sweep", p.rationale, extra)
        others = [t for t in trials if t.number != trial.number]
        mem_cal = study_memory_calibration(study)
        counted = [t for t in others if _counts_as_tried(t, mem_cal)]
        ordered = [c for c in (trial_config(self.space, t) for t in counted) if c is not None]
        exclude = set(ordered)
        # concurrent workers: a trial being proposed right now has its config_key attr before its params, and
        # an earlier free trial still being sampled has neither; skip the former's choice and leave the latter
        # the better-ranked picks, so simultaneous fallback trials spread instead of colliding
        claimed = {
            str(t.user_attrs["config_key"])
            for t in counted
            if t.state == RUNNING and t.user_attrs.get("config_key")
        }
        now = datetime.now()
        pending = sum(
            1
            for t in others
            if t.number < trial.number
            and t.state == RUNNING
            and is_free(t)
            and not t.params
            and "config_key" not in t.user_attrs
            and t.datetime_start is not None
            and (now - t.datetime_start).total_seconds() < PENDING_S  # a killed sampling is not pending
        )
        note = ""
        warm = warm_start_observations(self.space, study)
        if self.planner is not None:
            out = self.planner.propose(
                study,
                others,
                n=self.proposals_per_round,
                tried=list(dict.fromkeys(c.key() for c in ordered)),
                validate=lambda d: self.validate(d, exclude, mem_cal),
                trial_number=trial.number,
                ranking=self.fallback.ranking(
                    others, k=self.planner_context, exclude=exclude, memory_scale=mem_cal.scale, prior=warm
                ),
            )
            if out.accepted:
                for config, rationale in out.accepted[1:]:
                    study.enqueue_trial(
                        config.to_params(),
                        user_attrs=self._attrs(Proposal(config, "planner", self.planner.model, rationale)),
                        skip_if_exists=True,
                    )
                config, rationale = out.accepted[0]
                return Proposal(config, "planner", self.planner.model, rationale)
            note = (
                f"planner unavailable ({out.error or 'no valid candidate'}; {len(out.rejected)} rejected); "
            )
        found = self.fallback.propose(
            others,
            index=k,
            exclude=exclude,
            exclude_keys=claimed,
            skip=pending,
            memory_scale=mem_cal.scale,
            prior=warm,
        )
        if found is None:
            log.info("every feasible configuration has been tried; stopping the study")
            try:
                study.stop()
            except RuntimeError:
                pass
            return None
        config, rationale = found
        return Proposal(config, "fallback", f"fallback-{self.fallback.mode}", note + rationale)

    def validate(
        self,
        params: dict[str, Any],
        exclude: set[TrainingConfig],
        memory_calibration: MemoryCalibration | None = None,
    ) -> tuple[TrainingConfig | None, str]:
        """Accept a candidate only if it is legal, within the study's axes, fits in memory and is new."""
        try:
            config = self.space.canonical(
                TrainingConfig.from_params({a: params[a] for a in AXES if a in params})
            )
        except SpecError as exc:
            return None, f"invalid: {exc}"
        reasons = self.space.check(config)
        if reasons:
            return None, "illegal: " + "; ".join(reasons)
        outside = [a for a in AXES if getattr(config, a) not in self.space.candidates[a]]
        if outside:
            return None, "outside the study's axes: " + ", ".join(
                f"{a}={getattr(config, a)}" for a in outside
            )
        fits, attrs = memory_attrs(estimate_memory(self.spec, config), memory_calibration)
        if not fits:
            return None, attrs["prune_reason"]
        if config in exclude:
            return None, "duplicate: already tried or queued"
        return config, ""

    def _attrs(self, p: Proposal) -> dict[str, Any]:
        mem = estimate_memory(self.spec, p.config)
        est = estimate_throughput(self.spec, p.config)
        return {
            "phase": p.phase,
            "proposer": p.proposer,
            "rationale": p.rationale,
            "config_key": p.config.key(),
            "estimate_tokens_per_s_per_gpu": round(est.tokens_per_s_per_gpu, 3),
            "memory_peak_gib": round(mem.peak_gib, 3),
            **p.extra,
        }

    def _record(self, study: optuna.Study, trial: FrozenTrial, p: Proposal) -> None:
        # sample_relative sees the trial cached before before_trial; write through the storage and the cache
        for key, value in self._attrs(p).items():
            study._storage.set_trial_user_attr(trial._trial_id, key, value)
            trial.user_attrs[key] = value
