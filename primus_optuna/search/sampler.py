""":class:`PrimusSampler`: a resumable one-axis sweep, then LLM-planned or model-guided whole configurations.

The sampler works as Optuna's ``GridSampler`` does: it decides in ``before_trial`` and records the decision at
once as the trial *system* attr ``primus:proposal`` (phase, proposer, configuration, key; sweep index,
``retry_of``), then serves each axis parameter from it in ``sample_independent``. Everything else is derived
from storage at each decision (:mod:`~primus_optuna.search.proposers`):

- the chain: a failed point is retried once → the warm start's offers → the sweep's first point not covered by
  a finished or running trial → the LLM planner (when configured and within budget) → the model-guided
  proposer. A configuration that is running, waiting, finished or failed twice is never proposed again;
- a heartbeat retry copies the system attrs, so it runs the same decision (also when the worker was killed
  while choosing: a retry without a decision decides afresh); ``study.add_trial`` covers the point it
  measured; an enqueued trial runs its params (a partial ``enqueue_trial`` is completed with the nearest
  configuration that fits, with a warning, its ``fixed_params`` untouched; one without axis params gets the
  chain's decision; an illegal full one is refused by ``suggest_config``); under a ``PartialFixedSampler`` the
  chain decides with the fixed axes held;
- a study created from another study file (another search space) is refused, as ``primus-optuna run`` does;
- threads of one process decide one at a time; other processes see a decision as soon as it is written, and a
  worker that finds its choice claimed by another in-flight trial gives its claim up and chooses again (when
  only later trials share it, it waits a moment for them to give way and looks again: the claim a trial keeps
  is one it saw alone after writing it, so two workers never keep the same one);
- when nothing is left, :meth:`is_exhausted` is true, ``optimize`` is stopped after the last trial, and a trial
  asked anyway is pruned (``exhausted: ...``) without parameters instead of running random ones;
- parameters that are not axes (or an axis asked with a distribution that does not hold the decision's value)
  are sampled by an independent :class:`~optuna.samplers.RandomSampler` (``seed``; reseeded by
  :meth:`reseed_rng`).

When the objective asks for its first axis (an objective that never does records nothing as run, its claim is
withdrawn and a warning says so), every proposed trial gets user attrs ``phase``
(sweep|warm_start|planner|fallback|enqueued), ``proposer``, ``rationale``, ``config_key``,
``estimate_tokens_per_s_per_gpu`` and ``memory_peak_gib``; sweep trials also
``sweep_index``, ``sweep_axis`` and ``sweep_value``; retries ``retry_of``. Creating the sampler's first trial
stores the study file in the study (``primus:spec``), so report, export, ``--warm-start`` and the dashboard
work on a study made with the Python API.

Example::

    study = optuna.create_study(direction="maximize", sampler=PrimusSampler(spec),
                                pruner=MemoryPrefilterPruner(spec=spec))
    study.optimize(make_objective(spec, AnalyticalRunner(spec)), n_trials=30)
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from ..errors import SpecError
from ..physics.memory import estimate_memory
from ..physics.memory_calibration import MemoryCalibration
from ..physics.throughput import estimate_throughput
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import AXES
from .attrs import FAILURE_REASON, PRUNE_REASON
from .calibrations import study_calibrations
from .configs import (
    complete_config,
    config_from_params,
    legal_config,
    partial_fixed_axes,
    trial_config,
)
from .fallback import ModelGuidedProposer
from .learner import Observation
from .logs import get_logger
from .nearest import Nearest
from .proposers import (
    Context,
    ModelGuided,
    PlannerProposer,
    Proposal,
    Retry,
    Sweep,
    WarmStartOffers,
)
from .proposers.base import ACTIVE
from .pruner import memory_attrs
from .state import (
    CONFIG,
    EXHAUSTED,
    FIXED_PARAMS,
    PROPOSAL,
    refuse_changed_space,
    set_trial_state,
    store_spec,
)
from .sweep import SweepDesign, SweepPoint, sweep_design

__all__ = ["EXHAUSTED_REASON", "INTERRUPTED", "PrimusSampler", "Proposal", "is_free"]

log = get_logger(__name__)
EXHAUSTED_REASON = "exhausted: every legal configuration that fits in memory has been tried"
INTERRUPTED = "interrupted"
"""``failure_reason`` (and ``phase``, when it came before the decision) of a trial stopped by Ctrl-C / SIGTERM"""
CLAIM_ATTEMPTS = 16
"""how many times a worker chooses again when another in-flight trial claimed the same configuration"""
CLAIM_RECHECK_S = 0.05
"""how long a trial whose claim only later trials share waits (up to twice this) before it looks again"""


def is_free(trial: FrozenTrial) -> bool:
    """Whether the sampler chooses this trial's configuration (not enqueued, no inherited decision)."""
    sa = trial.system_attrs
    return FIXED_PARAMS not in sa and not _decided(sa) and not trial.params


def _decided(system_attrs: dict[str, Any]) -> bool:
    """Whether the trial holds a decision (a claim given up for another worker's is none)."""
    proposal = system_attrs.get(PROPOSAL)
    return isinstance(proposal, dict) and bool(proposal.get("config"))


class PrimusSampler(BaseSampler):
    """Sweep, then plan (LLM) or model-guided fallback; every decision recorded on its trial.

    Args:
        spec: the study.
        seed: seeds the model-guided proposer's exploration (with the trial number) and the independent
            sampler of non-axis parameters; ``None`` draws one.
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
        seed: int | None = None,
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
        self.fixed: dict[str, Any] = {}
        """the axes a wrapping ``PartialFixedSampler`` fixes, when this sampler decides for one"""
        self._kwargs = {
            "seed": seed,
            "llm": llm,
            "fallback": fallback,
            "proposals_per_round": proposals_per_round,
            "artifact_store": artifact_store,
            "cache_dir": cache_dir,
            "llm_api_base": llm_api_base,
            "exploration": exploration,
            "prior": prior,
        }
        self._restricted_samplers: dict[tuple[tuple[str, Any], ...], PrimusSampler | None] = {}
        self._checked: set[tuple[int, int]] = set()
        self._warned_unused = False
        self.seed = int(np.random.SeedSequence().entropy % 2**63) if seed is None else int(seed)
        self.proposals_per_round = proposals_per_round
        self._design: SweepDesign | None = None
        self._nearest: Nearest | None = None
        self._lock = threading.RLock()
        """one decision at a time in this process (held through a planner call)"""
        self._design_lock = threading.Lock()
        """the sweep design's lazy computation: never the decision lock, so ``after_trial`` (run by Optuna after
        the trial's heartbeat stopped) never waits for another thread's planner call"""
        self._independent = RandomSampler(seed=seed)
        self.fallback = ModelGuidedProposer(
            spec,
            self.space,
            seed=self.seed,
            mode=fallback,
            prior=prior,
            **({"exploration": exploration} if exploration is not None else {}),
        )
        self._planner_args = (
            None
            if llm is None or llm is False
            else {
                "llm": llm,
                "api_base": llm_api_base,
                "artifact_store": artifact_store,
                "cache_dir": cache_dir,
            }
        )
        self.planner = self._make_planner()

    def _make_planner(self) -> Any:
        if self._planner_args is None:
            return None
        from .planner import Planner

        a = self._planner_args
        return Planner(
            self.spec,
            self.space,
            a["llm"],
            api_base=a["api_base"],
            artifact_store=a["artifact_store"],
            cache_dir=a["cache_dir"],
            usable_gib=estimate_memory(self.spec, self.space.canonical(self.space.baseline)).usable_gib,
            fallback=self.fallback,
        )

    # --- pickling (a Study holding this sampler can be pickled; locks and caches are rebuilt) -------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"], state["_design_lock"]
        state["planner"] = None
        state["_restricted_samplers"] = {}
        state["_checked"] = set()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._design_lock = threading.Lock()
        self.planner = self._make_planner()

    # --- the plan ------------------------------------------------------------------------------------------
    @property
    def design(self) -> SweepDesign:
        """The sweep (computed once; deterministic from the study file), with what it skipped and why."""
        with self._design_lock:
            if self._design is None:
                self._design = sweep_design(self.space, self.fallback.estimate_of)
            return self._design

    @property
    def plan(self) -> list[SweepPoint]:
        """The sweep plan's points, centre first."""
        return self.design.points

    # --- BaseSampler ---------------------------------------------------------------------------------------
    def reseed_rng(self) -> None:
        """Reseed the independent sampler (Optuna calls this per worker thread); the proposals' randomness
        derives from ``(seed, trial number)``."""
        self._independent.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        if param_name in AXES:
            proposal = trial.system_attrs.get(PROPOSAL)
            if isinstance(proposal, dict) and param_name in proposal.get("config", {}):
                self._write_decision_attrs(study, trial, proposal)
                value = proposal["config"][param_name]
                if _contains(param_distribution, value):
                    return value
                log.warning(
                    "trial %d: %s=%r (the sampler's decision) is not in %s; sampled independently",
                    trial.number,
                    param_name,
                    value,
                    param_distribution,
                )
            elif trial.system_attrs.get(EXHAUSTED):
                reason = str(trial.system_attrs[EXHAUSTED])
                study._storage.set_trial_user_attr(trial._trial_id, PRUNE_REASON, reason)
                raise optuna.TrialPruned(reason)
        return self._independent.sample_independent(study, trial, param_name, param_distribution)

    def _write_decision_attrs(
        self, study: optuna.Study, trial: FrozenTrial, proposal: dict[str, Any]
    ) -> None:
        """The decision's user attrs, written when the objective first asks for an axis (a trial whose
        objective never does records no configuration as if it ran)."""
        attrs = proposal.get("user_attrs")
        if attrs and trial.user_attrs.get("config_key") != proposal.get("key"):
            self._set_user_attrs(study, trial, attrs)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._refuse_changed_spec(study, trial)
        store_spec(study, self.spec)
        sa = trial.system_attrs
        if _decided(sa):  # a heartbeat retry (system attrs copied): the same decision
            return
        fixed = partial_fixed_axes(study.sampler)
        enqueued = {k: v for k, v in (sa.get(FIXED_PARAMS) or {}).items() if k in AXES}
        if enqueued:
            self._enqueued(study, trial, {**fixed, **enqueued})
            return
        if trial.params:  # e.g. a retry of a trial whose params were set without this sampler
            return
        decider = self._restricted(fixed) if fixed else self
        try:
            with self._lock:
                proposal = decider._decide(study, trial) if decider is not None else None
        except KeyboardInterrupt:
            # Optuna fails a trial interrupted in the objective, not one interrupted while the sampler decides
            # (``study.ask``): without this it stays RUNNING, and without a heartbeat for ever
            self._set_user_attrs(study, trial, {"phase": INTERRUPTED, FAILURE_REASON: INTERRUPTED})
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            raise
        if proposal is None:
            reason = EXHAUSTED_REASON
            if fixed:
                reason += (
                    " with " + ", ".join(f"{k}={v}" for k, v in fixed.items()) + " (PartialFixedSampler)"
                )
            set_trial_state(study, trial, EXHAUSTED, reason)
            self._set_user_attrs(study, trial, {"phase": "exhausted", PRUNE_REASON: reason})

    def _refuse_changed_spec(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Refuse a study created from another search space (as ``primus-optuna run`` does on resume): the
        trial is failed and a :class:`~primus_optuna.errors.SpecError` says what changed."""
        key = (id(study._storage), study._study_id)
        if key in self._checked:
            return
        try:
            refuse_changed_space(
                study,
                self.spec,
                fix="give PrimusSampler the study file the study was created with (primus_optuna.search.state."
                "stored_spec(study)), or create a new study",
            )
        except SpecError:
            study._storage.set_trial_user_attr(trial._trial_id, FAILURE_REASON, "spec_changed")
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            raise
        self._checked.add(key)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._withdraw_unused(study, trial, state)
        try:
            fixed = partial_fixed_axes(study.sampler)
            decider = self._restricted(fixed) if fixed else self
            exhausted = decider is None or decider.is_exhausted(study)
        except KeyboardInterrupt:
            # Optuna calls after_trial inside tell, and optuna 5's _run_trial cannot take an interrupt there
            # (optuna/study/_optimize.py@v5.1.0: its `finally` reads `updated_state`, unbound after a
            # KeyboardInterrupt: an UnboundLocalError, the trial left RUNNING): let the trial be recorded and stop
            # after it. Only Python's own Ctrl-C handler (a Python-API study) raises here: under handle_signals
            # (`primus-optuna run`) a signal during tell only raises the stop flag, which run reports.
            log.warning("interrupted while trial %d was recorded: the study stops after it", trial.number)
            exhausted = True
        else:
            if exhausted:
                log.info("every feasible configuration has been tried; stopping the study")
        if exhausted:
            try:
                study.stop()
            except RuntimeError:  # ask/tell: the caller checks is_exhausted()
                pass

    def _withdraw_unused(self, study: optuna.Study, trial: FrozenTrial, state: TrialState) -> None:
        """A decision the objective never asked for (no axis parameter, no ``suggest_config``) did not run:
        its claim is withdrawn (the point is proposed again) and, once, a warning says why."""
        sa = trial.system_attrs
        proposal = sa.get(PROPOSAL)
        if not _decided(sa) or CONFIG in sa or any(a in trial.params for a in AXES):
            return
        set_trial_state(study, trial, PROPOSAL, {"withdrawn": proposal.get("key"), "unused": True})
        if state == TrialState.COMPLETE and not self._warned_unused:
            self._warned_unused = True
            log.warning(
                "trial %d: the objective did not ask for the configuration PrimusSampler chose (%s); call "
                "suggest_config(trial, spec) in the objective (or trial.suggest_categorical for the axes "
                "tp pp ep cp vpp mbs recompute moe_dispatcher pp_schedule ep_overlap), or use another sampler",
                trial.number,
                proposal.get("key"),
            )

    def _restricted(self, fixed: dict[str, Any]) -> PrimusSampler | None:
        """The sampler that decides for a ``PartialFixedSampler`` fixing ``fixed``: the same study file with
        those axes held at their values (sweep, planner and fallback then never move them); ``None`` when no
        legal configuration has them."""
        key = tuple(sorted(fixed.items(), key=lambda kv: kv[0]))
        with self._design_lock:
            if key in self._restricted_samplers:
                return self._restricted_samplers[key]
        data = self.spec.to_dict()
        for axis, value in fixed.items():
            data["search"].setdefault("axes", {})[axis] = [value]
            data["search"].setdefault("baseline", {})[axis] = value
        try:
            restricted: PrimusSampler | None = PrimusSampler(StudySpec.from_dict(data), **self._kwargs)
            assert restricted is not None
            restricted.fixed = dict(fixed)
            if not restricted.space.configs():
                restricted = None
        except SpecError as exc:
            log.warning("PartialFixedSampler fixes %s: %s", fixed, exc)
            restricted = None
        if restricted is None:
            log.warning("no legal configuration of this study has %s (PartialFixedSampler)", fixed)
        with self._design_lock:
            return self._restricted_samplers.setdefault(key, restricted)

    # --- decisions -----------------------------------------------------------------------------------------
    def _context(self, study: optuna.Study, trial: FrozenTrial | None) -> Context:
        trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        others = [t for t in trials if trial is None or t.number != trial.number]
        mem_cal = study_calibrations(study, self.spec, self.space, step=False).memory
        return Context(self, study, trial or _NO_TRIAL, others, mem_cal)

    def proposers(self) -> list[Any]:
        """The chain, in order (a fresh planner proposer per decision carries its note to the fallback)."""
        sweep, planner = Sweep(), PlannerProposer()
        return [Retry(), WarmStartOffers(), sweep, planner, _Noted(planner, sweep)]

    def propose(self, study: optuna.Study, trial: FrozenTrial) -> Proposal | None:
        """The decision for a trial the sampler chooses (``None``: nothing left); writes nothing."""
        ctx = self._context(study, trial)
        for proposer in self.proposers():
            proposal = proposer.propose(ctx)
            if proposal is not None:
                return proposal
        return None

    def _decide(self, study: optuna.Study, trial: FrozenTrial) -> Proposal | None:
        ctx = self._context(study, trial)
        proposal = None
        chain = self.proposers()  # one chain per decision: the planner is asked at most once
        seen_finished = {t.number for t in ctx.others if t.state.is_finished()}
        for _ in range(CLAIM_ATTEMPTS):
            proposal = next((p for pr in chain if (p := pr.propose(ctx)) is not None), None)
            if proposal is None:
                return None
            self._record(
                study, trial, proposal, user_attrs=False
            )  # the claim, visible to every worker at once
            rivals = self._claimants(study, trial, proposal.config, seen_finished)
            if rivals and min(rivals) > trial.number:
                # only later trials claim it too. Of the claims of one configuration the first written is seen by
                # every later claimant, so a claimant keeps it only when, after writing, it sees no other claim;
                # the later trials give way to this one at once (below), so look again once they had the time.
                # SQLite's lock lines concurrent writers up, so two workers otherwise both see both claims, both
                # give way and meet again on the next point, until the attempts run out.
                time.sleep(CLAIM_RECHECK_S * (1.0 + random.random()))  # timing only, not a decision
                rivals = self._claimants(study, trial, proposal.config, seen_finished)
            if not rivals:
                break
            # another trial holds it: give the claim up at once (a rival waiting to look again then sees it gone)
            # and choose again
            set_trial_state(study, trial, PROPOSAL, {"withdrawn": proposal.config.key()})
            ctx.exclude.add(proposal.config)
        else:
            log.warning(
                "trial %d: %d choices in a row were claimed by other workers; running %s anyway (the objective's "
                "duplicate guard prunes it if another trial runs it)",
                trial.number,
                CLAIM_ATTEMPTS,
                proposal.config.key() if proposal else "-",
            )
        assert proposal is not None
        # the kept claim, with the user attrs the objective's first axis writes (user attrs cannot be taken back:
        # a decision the objective never asks for is withdrawn in after_trial, with nothing recorded as run)
        self._record(study, trial, proposal, user_attrs=False, pending=True)
        return proposal

    def _claimants(
        self, study: optuna.Study, trial: FrozenTrial, config: TrainingConfig, seen_finished: set[int]
    ) -> list[int]:
        """The other trials that hold ``config``: in flight (running or waiting, claims included), or started and
        finished after this decision read the study (a fast job can end before the check; it covers the point
        all the same)."""
        trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        return [
            t.number
            for t in trials
            if t.number != trial.number
            and (t.state in ACTIVE or t.number not in seen_finished)
            and trial_config(self.space, t) == config
        ]

    def is_exhausted(self, study: optuna.Study) -> bool:
        """Whether nothing is left to propose: no failed point to retry and no feasible configuration (sweep
        points included) that was not tried or is not in flight; a sweep point that does not fit is no launch
        left (once the centre is measured, the sweep by value never spends it)."""
        ctx = self._context(study, None)
        if ctx.state.retry:
            return False
        table = self.fallback.rows(ctx.mem_cal.scale)
        covered = ctx.covered
        return all(r.config in covered for r in table)

    def _enqueued(self, study: optuna.Study, trial: FrozenTrial, axes: dict[str, Any]) -> None:
        """An enqueued trial with axis params: record its decision. Partial axis params are completed with the
        nearest configuration that fits (and a warning), served by :meth:`sample_independent`; Optuna's own
        ``fixed_params`` stay as enqueued (``enqueue_trial(skip_if_exists=True)`` compares them: optuna 5.1.0
        optuna/study/study.py:1095-1120). An illegal full configuration records no decision: ``suggest_config``
        refuses it (a warning and ``prune_reason``), as Optuna warns about an out-of-range fixed value
        (optuna/trial/_trial.py:633-646) instead of running another."""
        ua = trial.user_attrs
        config = complete_config(self.space, axes)
        if config is not None:
            if legal_config(self.space, config)[0] is None:
                return
        else:
            config = self._complete(study, axes)
            if config is None:
                return
            missing = [a for a in self.space.searched_axes if a not in axes]
            msg = (
                f"trial {trial.number}: enqueue_trial gave {', '.join(f'{k}={v}' for k, v in axes.items())}; "
                f"completed {', '.join(missing)} with the nearest configuration that fits: {config.key()}"
            )
            log.warning(msg)
            ua = {**ua, "rationale": str(ua.get("rationale") or msg)}
        proposal = Proposal(
            config,
            str(ua.get("phase") or "enqueued"),
            str(ua.get("proposer") or "user"),
            str(ua.get("rationale", "")),
        )
        self._record(study, trial, proposal, user_attrs=not ua.get("config_key"))

    def _complete(self, study: optuna.Study, axes: dict[str, Any]) -> TrainingConfig | None:
        cands = self.space.candidates
        keep = tuple(a for a in axes if axes[a] in cands[a])
        ref = config_from_params(self.space, axes)
        if self._nearest is None:
            self._nearest = Nearest(self.space)
        nearest = self._nearest
        mem_scale = study_calibrations(study, self.spec, self.space, step=False).memory.scale
        found = nearest.nearest(
            ref, lambda c: self.fallback.fits(c, mem_scale), self.fallback.estimate_of, fixed=keep
        )
        return found or nearest.nearest(ref, lambda c: True, None, fixed=keep)

    def validate(
        self,
        params: dict[str, Any],
        exclude: set[TrainingConfig],
        memory_calibration: MemoryCalibration | None = None,
    ) -> tuple[TrainingConfig | None, str]:
        """Accept a candidate only if it is legal, within the study's axes, fits in memory and is new."""
        config, reason = legal_config(self.space, params)
        if config is None:
            return None, reason
        fits, attrs = memory_attrs(estimate_memory(self.spec, config), memory_calibration)
        if not fits:
            return None, attrs[PRUNE_REASON]
        if config in exclude:
            return None, "duplicate: already tried or queued"
        return config, ""

    def proposal_attrs(self, p: Proposal) -> dict[str, Any]:
        """The user attrs a proposal writes (what a user reads)."""
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

    def _record(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        p: Proposal,
        *,
        user_attrs: bool = True,
        pending: bool = False,
    ) -> None:
        """Write the decision (system attr :data:`PROPOSAL`); its user attrs now (``user_attrs``) or when the
        objective first asks for an axis (``pending``: kept in the decision)."""
        decision = {
            "phase": p.phase,
            "proposer": p.proposer,
            "config": p.config.to_params(),
            "key": p.config.key(),
        }
        for k in ("sweep_index", "retry_of"):
            if k in p.extra:
                decision["index" if k == "sweep_index" else k] = p.extra[k]
        if pending:
            decision["user_attrs"] = self.proposal_attrs(p)
        set_trial_state(study, trial, PROPOSAL, decision)
        if user_attrs:
            self._set_user_attrs(study, trial, self.proposal_attrs(p))

    @staticmethod
    def _set_user_attrs(study: optuna.Study, trial: FrozenTrial, attrs: dict[str, Any]) -> None:
        for key, value in attrs.items():
            study._storage.set_trial_user_attr(trial._trial_id, key, value)
            trial.user_attrs[key] = value


class _Noted:
    """The model-guided proposer, prefixed with the sweep's and the planner's notes (why they proposed
    nothing)."""

    name = "model-guided"

    def __init__(self, planner: PlannerProposer, sweep: Sweep) -> None:
        self.planner, self.sweep = planner, sweep

    def propose(self, ctx: Context) -> Proposal | None:
        return ModelGuided(self.sweep.note + self.planner.note).propose(ctx)


def _contains(dist: BaseDistribution, value: Any) -> bool:
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError, KeyError):
        return False


_NO_TRIAL = FrozenTrial(
    number=-1,
    state=TrialState.RUNNING,
    value=None,
    datetime_start=None,
    datetime_complete=None,
    params={},
    distributions={},
    user_attrs={},
    system_attrs={},
    intermediate_values={},
    trial_id=-1,
)
