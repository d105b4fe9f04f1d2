"""A study read back from its storage: :class:`StudyRecord` (spec, space, directions, study attrs, artifacts)
and one :class:`TrialRow` per trial, built by :func:`load_record` (from a storage URL) or :func:`record_of`
(from a loaded study). Everything else in the report reads a record, never the storage. May import the spec,
space and the record layer's storage/export helpers; Optuna only inside the functions that open a study;
nothing from its sibling report modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...search.attrs import FAILURE_REASON, NO_REASON, PRUNE_REASON, reason_category, source_of
from ...space import Space, TrainingConfig
from ...spec import StudySpec
from ..export import study_spec, trial_config

DEFAULT_MEASURE_STEPS = 10
"""Steps a measured run would take when ``runner.options`` names none (``train_iters`` or ``steps``): the
default ``train_iters`` of the primus and megatron runners (run/presets.py)."""


@dataclass
class TrialRow:
    """One trial as the report sees it."""

    number: int
    state: str
    config: TrainingConfig | None
    values: list[float] | None
    attrs: dict[str, Any]
    duration_s: float | None = None
    """wall time from start to end (``None`` while running or unknown)"""
    reported: int = 0
    """intermediate values reported (``trial.report``): a job that reported ran"""

    @property
    def value(self) -> float | None:
        return self.values[0] if self.values else None

    def attr(self, key: str) -> Any:
        return self.attrs.get(key)

    @property
    def phase(self) -> str:
        return str(self.attrs.get("phase") or "-")

    @property
    def estimate(self) -> float | None:
        return as_number(self.attrs.get("estimate_tokens_per_s_per_gpu"))

    @property
    def measured(self) -> float | None:
        m = as_number(self.attrs.get("measured_tokens_per_s_per_gpu"))
        if m is None and self.state == "COMPLETE" and self.attrs.get("source") not in (None, "analytical"):
            return self.value
        return m

    @property
    def peak_gib(self) -> float | None:
        return as_number(self.attrs.get("memory_peak_gib"))

    @property
    def outcome(self) -> str:
        if self.state == "PRUNED":
            return f"pruned: {self.attrs.get(PRUNE_REASON) or NO_REASON}"
        if self.state == "FAIL":
            return f"failed: {self.attrs.get(FAILURE_REASON) or NO_REASON}"
        if self.state == "COMPLETE":
            return f"complete ({source_of(self.attrs)})"
        return self.state.lower()

    @property
    def prune_category(self) -> str:
        return reason_category(self.attrs.get(PRUNE_REASON))


def derived_attrs(study: Any, spec: StudySpec, space: Space) -> dict[str, Any]:
    """The study's user attrs plus what the report reads that is derived or library state: the calibrations
    (:func:`~primus_optuna.search.calibrations.study_calibrations`, unless a study recorded before they were
    derived stored its own fit) and the warm start's import."""
    from ...search.calibrations import study_calibrations
    from ...search.state import warm_start_data

    attrs = dict(study.user_attrs)
    cal = study_calibrations(study, spec, space)
    for key, value in (("calibration", cal.step_dict()), ("memory_calibration", cal.memory_dict())):
        if key not in attrs and value is not None:
            attrs[key] = value
    if "warm_start" not in attrs and (ws := warm_start_data(study)):
        attrs["warm_start"] = ws
    return attrs


def as_number(v: Any) -> float | None:
    """A stored attr as a float, ``None`` when absent or not a number."""
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


@dataclass
class StudyRecord:
    """A primus-optuna study read back from storage."""

    study_name: str
    storage_url: str
    spec: StudySpec
    space: Space
    directions: list[str]
    user_attrs: dict[str, Any]
    trials: list[TrialRow]
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    artifact_store: Any = None
    """the file artifact store of the study (planner transcripts), when found"""
    llm: dict[str, Any] = field(default_factory=dict)
    """the planner's books (:func:`~primus_optuna.search.llm_budget.llm_accounting`)"""

    @property
    def llm_model(self) -> str | None:
        """The planner's model: from the study file, else the one the run used (``--llm``)."""
        return self.spec.llm.model or self.llm.get("model")

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1

    @property
    def complete(self) -> list[TrialRow]:
        return [t for t in self.trials if t.state == "COMPLETE" and t.values]

    @property
    def baseline_config(self) -> TrainingConfig:
        return self.space.canonical(self.space.baseline)

    @property
    def baseline(self) -> TrialRow | None:
        """The first trial of the baseline configuration (completed one preferred)."""
        rows = [t for t in self.trials if t.config == self.baseline_config]
        done = [t for t in rows if t.state == "COMPLETE"]
        return (done or rows or [None])[0]

    @property
    def best(self) -> TrialRow | None:
        """Highest tokens/s/GPU among completed trials (for a Pareto study: the front's fastest point)."""
        done = self.complete
        return max(done, key=lambda t: (t.values[0], -t.number)) if done else None

    def pareto(self) -> list[TrialRow]:
        """Non-dominated completed trials (max tokens/s, min peak memory), fastest first."""
        if not self.multi_objective:
            return []
        signs = [1 if d == "MAXIMIZE" else -1 for d in self.directions]
        pts = [(t, [s * v for s, v in zip(signs, t.values, strict=False)]) for t in self.complete]
        front = [
            t
            for t, p in pts
            if not any(
                all(a >= b for a, b in zip(q, p, strict=False))
                and any(a > b for a, b in zip(q, p, strict=False))
                for _, q in pts
            )
        ]
        return sorted(front, key=lambda t: -t.values[0])

    @property
    def measure_steps(self) -> int:
        opts = self.spec.runner.options
        for key in ("train_iters", "steps", "iterations"):
            if isinstance(opts.get(key), int) and opts[key] > 0:
                return int(opts[key])
        return DEFAULT_MEASURE_STEPS


def load_record(
    storage: Any, study_name: str | None = None, artifact_dir: str | Path | None = None
) -> StudyRecord:
    """Read a study from a storage URL (any Optuna URL, a ``.db``/``.log`` path, ``journal:PATH``) or storage
    object; ``study_name`` may be omitted when the storage holds exactly one study. ``artifact_dir`` defaults
    to ``<storage stem>-artifacts`` (where ``run`` keeps logs and planner transcripts)."""
    import optuna

    from ..storage import make_storage, normalize_url

    url = ""
    if isinstance(storage, str):
        url = normalize_url(storage)
        storage = make_storage(url, heartbeat_interval=None)
    if study_name is None:
        names = optuna.get_all_study_names(storage)
        if len(names) != 1:
            from ...errors import SpecError

            raise SpecError(
                f"--study-name is required: the storage holds {len(names)} studies"
                + (f" ({', '.join(names)})" if names else "")
            )
        study_name = names[0]
    study = optuna.load_study(study_name=study_name, storage=storage)
    return record_of(study, storage_url=url, artifact_dir=artifact_dir)


def record_of(study: Any, storage_url: str = "", artifact_dir: str | Path | None = None) -> StudyRecord:
    """A :class:`StudyRecord` of a loaded (or live) Optuna study."""
    from optuna.artifacts import FileSystemArtifactStore

    from ...search.llm_budget import llm_accounting
    from ..storage import sibling_dir

    if artifact_dir is None and storage_url:
        artifact_dir = sibling_dir(storage_url, study.study_name, "-artifacts")
    store = (
        FileSystemArtifactStore(str(artifact_dir)) if artifact_dir and Path(artifact_dir).is_dir() else None
    )
    spec = study_spec(study)
    space = Space(spec)
    user_attrs = derived_attrs(study, spec, space)
    rows = []
    for t in study.get_trials(deepcopy=False):
        try:
            config = space.canonical(trial_config(t, spec)) if t.params else None
        except Exception:  # a trial with hand-made params: show it without a config
            config = None
        rows.append(
            TrialRow(
                t.number,
                t.state.name,
                config,
                list(t.values) if t.values else None,
                t.user_attrs,
                (t.datetime_complete - t.datetime_start).total_seconds()
                if t.datetime_start and t.datetime_complete
                else None,
                len(t.intermediate_values),
            )
        )
    try:
        from optuna.artifacts import get_all_artifact_meta

        artifacts = [
            {"trial": None, "filename": m.filename, "artifact_id": m.artifact_id, "mimetype": m.mimetype}
            for m in sorted(get_all_artifact_meta(study), key=lambda m: m.filename)
        ]
        for t in study.get_trials(deepcopy=False):
            artifacts += [
                {
                    "trial": t.number,
                    "filename": m.filename,
                    "artifact_id": m.artifact_id,
                    "mimetype": m.mimetype,
                }
                for m in sorted(get_all_artifact_meta(t, storage=study._storage), key=lambda m: m.filename)
            ]
    except Exception:  # artifact metadata is optional
        artifacts = []
    return StudyRecord(
        study_name=study.study_name,
        storage_url=storage_url,
        spec=spec,
        space=space,
        directions=[d.name for d in study.directions],
        user_attrs=user_attrs,
        trials=rows,
        artifacts=artifacts,
        artifact_store=store,
        llm=llm_accounting(study),
    )
