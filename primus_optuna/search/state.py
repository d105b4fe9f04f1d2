"""The library's state in a study: every ``primus:`` system-attr name, how it is read and written, and the one
reader and writer of the study file stored in a study.

Optuna's own samplers record a decision when they make it (``GridSampler`` writes ``grid_id`` in
``before_trial``) and derive everything else from the trials; so does primus-optuna. Nothing the library
needs is a counter or a user attr: user attrs keep what a user reads (estimates, measurements, rationale,
reasons). Names:

Trial system attrs
    - :data:`PROPOSAL` — the sampler's decision, written in ``before_trial`` before anything slow: ``{"phase",
      "proposer", "config" (the ten axis params), "key", "index" (sweep position, when a sweep point),
      "retry_of" (when a retry)}``. A heartbeat retry copies it (Optuna copies system attrs), so a retry runs
      the same decision; other workers see it at once (in-flight configurations are never proposed again). A
      claim given up to another worker's reads ``{"withdrawn": key}`` until the next choice is written.
    - :data:`CONFIG` — the configuration the trial runs, written by
      :func:`~primus_optuna.search.suggest.suggest_config` (it differs from the params when a plain sampler's
      suggestion was mapped to the nearest legal configuration, see :data:`MAPPED`).
    - :data:`MAPPED` — ``{"from": params, "moves": n}`` when ``suggest_config`` mapped an illegal suggestion.
    - :data:`MEMORY_CHECK` — the feasibility gate's verdict on this trial's configuration (``fits``, peak, usable).
    - :data:`EXHAUSTED` — the sampler had nothing left to propose for this trial.

Study system attrs
    - :data:`SPEC` — the study file (also read under the legacy name ``primus_spec``, system then user attr).
    - :data:`WARM_START` — what a warm start imported (legacy: user attr ``warm_start``).
    - ``primus:llm:*`` — the LLM planner's books and its call budget, reserved before each call: one module
      of their own, :mod:`.llm_budget` (``reserve_call``, ``llm_accounting``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import optuna

from ..errors import SpecError
from ..space import Space
from ..spec import StudySpec
from ..spec.axes import without_unused_optional
from ..spec.model import MODEL_HASHED_WHEN_CHANGED, ModelSpec
from ..spec.study import HASHED_WHEN_CHANGED, WorkloadSpec

__all__ = [
    "CONFIG",
    "EXHAUSTED",
    "FIXED_PARAMS",
    "MAPPED",
    "MEMORY_CHECK",
    "PREFIX",
    "PROPOSAL",
    "SPEC",
    "SPACE_HASH",
    "SUMMARY",
    "WARM_START",
    "changed_fields",
    "refuse_changed_space",
    "set_study_state",
    "set_trial_state",
    "store_spec",
    "stored_spec",
    "stored_spec_data",
    "study_state",
    "space_hash",
    "trial_state",
    "warm_start_data",
]

PREFIX = "primus:"
PROPOSAL = PREFIX + "proposal"
CONFIG = PREFIX + "config"
MAPPED = PREFIX + "mapped"
MEMORY_CHECK = PREFIX + "memory_check"
EXHAUSTED = PREFIX + "exhausted"
SPEC = PREFIX + "spec"
FIXED_PARAMS = "fixed_params"
"""Optuna's own trial system attr of ``enqueue_trial`` (read, never written: ``skip_if_exists`` compares it)"""
WARM_START = PREFIX + "warm_start"
LEGACY_SPEC = "primus_spec"
"""where studies written before the ``primus:`` names keep the study file (system attr, older still: user attr)"""
LEGACY_WARM_START = "warm_start"
SUMMARY = "primus_study"
"""study *user* attr: a one-line summary a user reads (model, cluster, workload)"""
SPACE_HASH = "primus_space_hash"
"""study user attr: the hash of the search space (``record.storage.space_hash``), the resume guard"""


# --- generic system-attr access ----------------------------------------------------------------------------
def system_attrs(trial: Any) -> dict[str, Any]:
    """A trial's system attrs: a FrozenTrial's, or the cached frozen trial's of a live ``optuna.Trial`` (Optuna
    5 has no ``Trial.system_attrs``; the cache is the trial the sampler's ``before_trial`` saw)."""
    cached = getattr(trial, "_cached_frozen_trial", None)
    if cached is not None:
        return cached.system_attrs
    return getattr(trial, "system_attrs", None) or {}


def trial_state(study: optuna.Study, trial: Any, key: str, *, fresh: bool = False) -> Any:
    """A trial system attr (from the cached trial, or from storage when ``fresh``)."""
    if fresh:
        return study._storage.get_trial_system_attrs(trial._trial_id).get(key)
    return system_attrs(trial).get(key)


def set_trial_state(study: optuna.Study, trial: Any, key: str, value: Any) -> None:
    """Write a trial system attr through the storage *and* the trial's cached copy (``sample_independent`` and
    ``Trial`` see the cached frozen trial, not storage)."""
    study._storage.set_trial_system_attr(trial._trial_id, key, value)
    cached = getattr(trial, "_cached_frozen_trial", trial)
    try:
        cached.system_attrs[key] = value
    except (AttributeError, TypeError):  # a live Trial's system_attrs is a read-only view
        pass


def study_state(study: optuna.Study, key: str | None = None) -> Any:
    """The study's system attrs (all of them, or one)."""
    attrs = study._storage.get_study_system_attrs(study._study_id)
    return attrs if key is None else attrs.get(key)


def set_study_state(study: optuna.Study, key: str, value: Any) -> None:
    study._storage.set_study_system_attr(study._study_id, key, value)


# --- the stored study file ---------------------------------------------------------------------------------
def stored_spec_data(study: Any) -> Any:
    """The study file a primus-optuna study stored, as a dict (``None`` without one); reads the legacy names
    of older studies too."""
    attrs = study._storage.get_study_system_attrs(study._study_id)
    for key in (SPEC, LEGACY_SPEC):
        if attrs.get(key) is not None:
            return attrs[key]
    return study.user_attrs.get(LEGACY_SPEC)


def stored_spec(study: Any, *, required: str | None = None) -> StudySpec | None:
    """The :class:`StudySpec` a study stored; ``None`` without one, or a :class:`SpecError` whose message
    starts with ``required`` when given."""
    data = stored_spec_data(study)
    if not isinstance(data, dict):
        if required is None:
            return None
        raise SpecError(
            f"{required}: study {study.study_name!r} was not created by primus-optuna (no study file in its "
            f"system attr {SPEC!r}); create it with `primus-optuna run`, or give the Python study a PrimusSampler / make_objective "
            "(either stores it), or call store_spec(study, spec)"
        )
    return StudySpec.from_dict(data, source=f"study {study.study_name!r} ({SPEC})")


def store_spec(study: Any, spec: StudySpec) -> None:
    """Store ``spec`` in ``study`` (system attr :data:`SPEC`), a one-line summary user attr and the space hash
    (the resume guard of ``primus-optuna run``); a study that has one keeps it."""
    if stored_spec_data(study) is not None:
        return
    set_study_state(study, SPEC, spec.to_public_dict())
    g = spec.cluster.gpu
    study._storage.set_study_user_attr(
        study._study_id,
        SUMMARY,
        f"{spec.model.name} on {spec.cluster.nodes}x{spec.cluster.gpus_per_node} {g.name}, seq "
        f"{spec.workload.seq_length}, GBS {spec.workload.global_batch_size}, {spec.workload.precision}",
    )
    if study.user_attrs.get(SPACE_HASH) is None:
        study._storage.set_study_user_attr(study._study_id, SPACE_HASH, space_hash(spec))


def warm_start_data(study: Any) -> dict[str, Any]:
    """What a warm start imported into ``study`` (empty without one)."""
    data = study_state(study, WARM_START)
    if data is None:
        data = study.user_attrs.get(LEGACY_WARM_START)
    return dict(data or {})


# --- the resume guard --------------------------------------------------------------------------------------
def space_hash(spec: StudySpec) -> str:
    """A hash of everything that defines the search space, the estimates and the sweep plan.

    Covers the candidate values of every axis and the whole model, cluster (GPU figures included) and workload,
    the objectives, memory margin, baseline, axes, sweep order and start: each of them changes which configuration a
    sweep position means or how it is estimated and pruned. Editing the LLM, runner, storage, trial budget,
    seed or early-stopping thresholds keeps the hash.
    """
    data = spec.to_dict()
    # the trial budget and the sweep's share of it only say where the sweep stops: a longer sweep extends a
    # shorter one (see search.sweep), so changing them keeps every position's meaning; early-stopping
    # thresholds only decide when a job stops
    search = {
        k: v for k, v in data["search"].items() if k not in ("n_trials", "seed", "sweep_trials", "early_stop")
    }
    for k in ("baseline", "axes"):  # axes added later, not searched: old hashes hold
        search[k] = without_unused_optional(search[k])
    if search.get("start") == "auto":  # added later: the default keeps old hashes
        del search["start"]
    doc = {
        "candidates": without_unused_optional(Space(spec).candidates),
        "model": _without_defaults(data["model"], MODEL_HASHED_WHEN_CHANGED, ModelSpec),
        "cluster": hashed_cluster(data["cluster"]),
        "workload": hashed_workload(data["workload"]),
        "search": search,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


CLUSTER_HASHED_WHEN_SET: tuple[str, ...] = ("network", "profile")
"""cluster fields added after studies were written: they enter the hash only when set, with their content (a
network file's measured rows, a hardware profile's tables), so a changed file is not silently mixed with trials
estimated under the old one"""


def hashed_cluster(cluster: dict[str, Any]) -> dict[str, Any]:
    """The cluster as :func:`space_hash` sees it: :data:`CLUSTER_HASHED_WHEN_SET` only when not None, and
    without ``gpus_per_host`` (the cluster's and the GPU's), which only says how a launch is split over hosts,
    never what a configuration means or is estimated at."""
    out = {
        k: v
        for k, v in cluster.items()
        if k != "gpus_per_host" and (k not in CLUSTER_HASHED_WHEN_SET or v is not None)
    }
    out["gpu"] = {k: v for k, v in cluster["gpu"].items() if k != "gpus_per_host"}
    return out


def hashed_workload(workload: dict[str, Any]) -> dict[str, Any]:
    """The workload as :func:`space_hash` sees it: the precision-aware optimizer's fields,
    ``sequence_parallel``, ``te_op_fuser``, ``fp8_dot_product_attention`` and ``fp8_output_proj`` enter only
    when they differ from their defaults, so study files written before they existed keep their hash (fp32
    everywhere, sequence parallelism, no TE op fuser, BF16 attention and output layer then, as now)."""
    return _without_defaults(workload, HASHED_WHEN_CHANGED, WorkloadSpec)


def _without_defaults(section: dict[str, Any], fields: tuple[str, ...], model: Any) -> dict[str, Any]:
    """``section`` without those of ``fields`` that hold ``model``'s default (fields added after studies were
    written: their hash stays)."""
    return {k: v for k, v in section.items() if k not in fields or v != model.model_fields[k].default}


HASHED_SECTIONS = ("model", "cluster", "workload", "search")


def _short(value: Any, width: int = 80) -> str:
    """``repr(value)``, a long list as its length (e.g. ``cluster.network``'s measured rows)."""
    text = repr(value)
    if len(text) <= width:
        return text
    if isinstance(value, list):
        return f"[{len(value)} items]"
    return text[: width - 3] + "..."


def changed_fields(stored: Any, spec: StudySpec, limit: int = 8) -> str:
    """``search.axes.mbs: [1, 2] -> [1, 2, 4]; ...``: the space-defining fields of the stored study file
    (:data:`SPEC`) that differ from ``spec`` ("" when there is no stored copy)."""
    if not isinstance(stored, dict):
        return ""
    new = spec.to_public_dict()
    diffs: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        elif a != b:
            diffs.append(f"{path}: {_short(a)} -> {_short(b)}")

    for section in HASHED_SECTIONS:
        a, b = stored.get(section), new.get(section)
        if section == "search":
            a = {k: v for k, v in (a or {}).items() if k not in ("n_trials", "seed")}
            b = {k: v for k, v in (b or {}).items() if k not in ("n_trials", "seed")}
        walk(a, b, section)
    more = f"; and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "; ".join(diffs[:limit]) + more


def refuse_changed_space(
    study: Any,
    spec: StudySpec,
    *,
    where: str | None = None,
    fix: str = "start a new study with --study-name NAME or another --storage",
) -> None:
    """Raise a :class:`SpecError` when ``study`` was created from a study file whose space differs from
    ``spec``'s (its stored :data:`SPACE_HASH`; the one resume guard of the CLI and of :class:`PrimusSampler`)."""
    old = study.user_attrs.get(SPACE_HASH)
    h = space_hash(spec)
    if old is None or old == h:
        return
    changed = changed_fields(stored_spec_data(study), spec)
    raise SpecError(
        f"{where or f'study {study.study_name!r}'} was created from a different search space (hash {old}, this "
        f"study file gives {h})"
        + (f"; changed: {changed}" if changed else "")
        + ": the study file was edited between runs in a way that changes the space or "
        "its estimates (axes, model, cluster or GPU figures, workload, objectives, memory margin, "
        "baseline or sweep order) — or a primus-optuna upgrade changed a catalog figure the study used. "
        f"Restore the file, or {fix}."
    )
