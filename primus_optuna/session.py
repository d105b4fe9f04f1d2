"""A study session: what ``primus-optuna run`` does before and around ``study.optimize``, as a library call the
CLI and Python users share: check the study file (a space where nothing fits, the runner's preflight, the LLM
key and endpoint), open or resume the study (heartbeat, resume guard, warm start), give it the sampler, the
pruner and the objective, and say what a newcomer should know (warnings about the sweep centre, the cluster and
the axes). The CLI adds only its printing, progress and signal handling.

Example::

    session = open_session(StudySpec.from_yaml("study.yaml"), storage="sqlite:///s.db")
    session.study.optimize(session.objective, n_trials=session.n_trials, catch=(RunFailure,))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import SpecError
from .spec import StudySpec

__all__ = ["ANALYTICAL_HEARTBEAT_S", "Session", "open_session"]

ANALYTICAL_HEARTBEAT_S = 10
"""analytical trials take milliseconds: a short heartbeat makes a killed run's trial retryable within 30 s"""


@dataclass
class Session:
    """An opened study, ready to optimize."""

    spec: StudySpec
    handle: Any
    """the :class:`~primus_optuna.record.storage.StudyHandle` (study, storage URL, artifact store, folders)"""
    runner: Any
    objective: Any
    llm: Any
    """the planner's :class:`~primus_optuna.spec.study.LLMSpec`, ``None`` without a planner"""
    n_trials: int
    warnings: list[str] = field(default_factory=list)
    """what the study file leads to that a user should know (sweep centre moved, cluster, axes)"""
    notes: list[str] = field(default_factory=list)
    """what a newcomer should know that is not a warning (e.g. where the sweep begins)"""
    preflight: list[str] = field(default_factory=list)
    """what the LLM endpoint's preflight found"""
    warm_start: str | None = None
    """what the warm start imported (``None`` without one)"""

    @property
    def study(self) -> Any:
        return self.handle.study


def _planner_llm(spec: StudySpec, model: str | None, api_base: str | None, overrides: dict[str, Any]) -> Any:
    """The planner's LLM settings (``None`` without a model), after checking its key and endpoint."""
    if not model:
        return None, []
    from .search.llm_preflight import preflight

    changes = {"model": model, **overrides}
    llm = spec.llm.model_copy(update={k: v for k, v in changes.items() if v is not None})
    return llm, preflight(llm, api_base or spec.llm.api_base)


def _centre_notes(design: Any) -> list[str]:
    """Where the sweep begins when ``search.start`` moved it to the model's best (information, not a warning)."""
    return [f"the sweep begins at {design.centre.key()}: {design.start['note']}"] if design.start else []


def _centre_warnings(spec: StudySpec, space: Any, design: Any) -> list[str]:
    from .physics.memory import estimate_memory

    out = []
    if design.centre_note:
        base = space.canonical(space.baseline)
        reasons = space.check(base)
        mem = estimate_memory(spec, base) if not reasons else None
        why = "; ".join(reasons) or (f"estimated {mem.reason()}" if mem is not None and not mem.fits else "")
        out.append(
            f"{design.centre_note}"
            + (f" ({why})" if why else "")
            + ("" if design.start else f"; the sweep starts from {design.centre.key()}")
        )
    return out + [*spec.cluster.warnings(), *space.axis_warnings()]


def open_session(
    spec: StudySpec,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    runner_kind: str | None = None,
    llm_model: str | None = None,
    llm_api_base: str | None = None,
    llm_overrides: dict[str, Any] | None = None,
    seed: int | None = None,
    n_jobs: int = 1,
    runs_dir: str | None = None,
    heartbeat: int | None = None,
    early_stop: bool = True,
    warm_sources: tuple[str, ...] = (),
    force_warm_start: bool = False,
    trial_hooks: tuple[Any, ...] = (),
) -> Session:
    """Check ``spec`` and open (create or resume) its study with the sampler, pruner and objective.

    Raises :class:`~primus_optuna.errors.SpecError` (nothing written) when no configuration fits, the runner's
    preflight fails, ``n_jobs`` would share one allocation between launched jobs, the LLM key or endpoint is
    missing, a warm start is refused or the stored study was created from another search space.
    ``llm_model``: the planner's model (``None``: the study file's; ``""``: no planner). ``heartbeat``: the
    trial heartbeat in seconds (``None``: 10 for the analytical runner, else the storage default; 0: none).
    """
    from .physics.plan import no_fit_message
    from .record.earlier import open_earlier_studies
    from .record.storage import HEARTBEAT_INTERVAL_S, open_study
    from .run.factory import make_runner
    from .run.objective import make_objective
    from .search.early_stop import study_pruner
    from .search.sampler import PrimusSampler
    from .search.warm_start import apply_warm_start
    from .space import Space

    if study_name is not None and ("/" in study_name or "\\" in study_name):
        raise SpecError(f"--study-name {study_name!r}: no '/' or '\\' in a study name (it names files)")
    space = Space(spec)
    no_fit = no_fit_message(spec, space)
    if no_fit:  # every trial would be pruned: say so and create nothing
        raise SpecError(no_fit)
    runner = make_runner(spec, runner_kind)
    check = getattr(runner, "preflight", None)
    if callable(check):  # a missing checkout or launcher is one error now, not a failed launch per trial
        check()
    launches = getattr(runner, "launches_jobs", False)
    if n_jobs > 1 and launches and runner.kind != "slurm":
        raise SpecError(
            f"--n-jobs {n_jobs}: the {runner.kind} runner launches each trial on the study's {spec.world} GPUs, "
            f"so {n_jobs} parallel trials would share them; run one `primus-optuna run` worker per allocation "
            "instead, all with the same --storage (docs/scaling-out.md), or use the slurm runner, whose "
            "jobs get their own allocations"
        )
    model = spec.llm.model if llm_model is None else llm_model
    llm, preflight = _planner_llm(spec, model, llm_api_base, llm_overrides or {})
    # the heartbeat lets a resumed or parallel run fail and retry the trial of a killed worker instead of leaving
    # it RUNNING (its sweep point would then never run); on SQLite it costs tens of ms per trial
    if heartbeat is None:
        heartbeat = ANALYTICAL_HEARTBEAT_S if runner.kind == "analytical" else HEARTBEAT_INTERVAL_S
    # read the earlier studies first: a refused warm start writes nothing
    ws = open_earlier_studies(spec, warm_sources, force=force_warm_start) if warm_sources else None
    handle = open_study(
        spec,
        storage=storage,
        study_name=study_name,
        pruner=study_pruner(spec, launches_jobs=launches, early_stop=early_stop),
        runs_dir=runs_dir,
        heartbeat_interval=heartbeat or None,
    )
    st = handle.study
    warm = apply_warm_start(st, spec, ws) if ws is not None else None
    st.sampler = PrimusSampler(
        spec,
        seed=spec.search.seed if seed is None else seed,
        llm=llm,
        proposals_per_round=spec.llm.proposals_per_round,
        artifact_store=handle.artifact_store,
        cache_dir=handle.cache_dir if llm else None,
        llm_api_base=llm_api_base,
    )
    objective = make_objective(
        spec,
        runner,
        space=st.sampler.space,
        artifact_store=handle.artifact_store,
        runs_dir=handle.runs_dir,
        trial_hooks=trial_hooks,
    )
    return Session(
        spec=spec,
        handle=handle,
        runner=runner,
        objective=objective,
        llm=llm,
        n_trials=n_trials or spec.search.n_trials,
        warnings=_centre_warnings(spec, space, st.sampler.design),
        notes=_centre_notes(st.sampler.design),
        preflight=preflight,
        warm_start=warm,
    )
