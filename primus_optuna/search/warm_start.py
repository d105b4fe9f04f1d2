"""Warm start: seed a new study with what earlier studies measured.

:func:`load_warm_start` reads the completed, measured trials of earlier studies (``STORAGE_URL[:STUDY_NAME]``)
and re-estimates each configuration under the earlier study's spec (the model error it showed) and, when it is
legal in the new study's space, under the new spec. Each becomes one (configuration, estimate, measurement) pair
in the new study's terms: a legal configuration keeps its model error, ``measured × estimate_new /
estimate_old`` against ``estimate_new``; one that is not legal in the new space keeps its earlier pair (its
error per breakdown term and per axis value still informs the fit). Measured peaks and out-of-memory runs
become memory-calibration evidence when the GPU is the same (the ratio is the memory model's error on that
device). A study of another model is refused unless ``force``.

:func:`apply_warm_start` stores the import in the study system attr ``primus:warm_start`` (nothing is refitted:
:func:`~primus_optuna.search.calibrations.study_calibrations` derives the calibrations from the import *and*
the study's own trials whenever they are read, so a warm start never forgets the study's own out-of-memory
runs); the sampler's fallback (per-axis-value corrections included) reads the imported pairs through
:func:`warm_start_observations`; the earlier studies' best configurations that are legal here and fit are
offered first after the baseline, and the sweep skips the points they measured
(:mod:`~primus_optuna.search.proposers.warm`).

Earlier studies are opened from ``STORAGE_URL[:STUDY_NAME]`` by :mod:`primus_optuna.record.earlier`, whose
:func:`~primus_optuna.record.earlier.warm_start` is the Python entry point.

Example::

    ws = load_warm_start(spec, [("mixtral-4n.db", optuna.load_study(...))])
    summary = apply_warm_start(study, spec, ws)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna

from ..errors import SpecError
from ..physics.calibration import Calibration
from ..physics.memory import estimate_memory
from ..physics.memory_calibration import MemoryCalibration
from ..physics.throughput import estimate_throughput
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from .attrs import FAILURE_REASON
from .configs import legal_config, trial_config
from .fallback import AxisValueFactors, corrected_tps
from .learner import Observation
from .pruner import memory_attrs
from .state import WARM_START, set_study_state, stored_spec, warm_start_data
from .warm_data import ImportedPair, Pair, WarmStart

__all__ = [
    "WARM_START_ATTR",
    "WarmStart",
    "apply_warm_start",
    "earlier_spec",
    "load_warm_start",
    "warm_start_memory",
    "warm_start_observations",
    "warm_start_pairs",
]

WARM_START_ATTR = WARM_START
PHASE = "warm_start"
MAX_OFFERS = 3
"""how many of the earlier best configurations are offered first"""


def earlier_spec(source: str, study: optuna.Study) -> StudySpec:
    """The study file an earlier primus-optuna study stored (its ``primus:spec`` attr)."""
    spec = stored_spec(study, required=f"--warm-start {source!r}")
    assert spec is not None
    return spec


def _same_model(a: StudySpec, b: StudySpec) -> bool:
    return a.model.model_dump(exclude={"name"}) == b.model.model_dump(exclude={"name"})


def load_warm_start(
    spec: StudySpec, earlier: Sequence[tuple[str, optuna.Study]], *, force: bool = False
) -> WarmStart:
    """Read the earlier studies (``(source, study)``, opened by
    :func:`primus_optuna.record.earlier.open_earlier_study`) for the new study ``spec``; raises
    :class:`SpecError` for a study of another model unless ``force``."""
    space = Space(spec)
    ws = WarmStart(sources=[source for source, _ in earlier])
    ranked: list[tuple[float, TrainingConfig]] = []
    for source, old_study in earlier:
        old = earlier_spec(source, old_study)
        if not _same_model(old, spec):
            if not force:
                raise SpecError(
                    f"--warm-start {source!r}: that study tuned model {old.model.name!r}, this one tunes "
                    f"{spec.model.name!r} (different architecture): its measurements would miscalibrate this "
                    "study. Import from a study of the same model, or pass --force-warm-start (force=True)."
                )
            ws.notes.append(f"{source}: another model ({old.model.name}), imported because forced")
        same_gpu = old.cluster.gpu.name == spec.cluster.gpu.name
        if not same_gpu:
            ws.notes.append(
                f"{source}: another GPU ({old.cluster.gpu.name}), its memory evidence is not used"
            )
        old_space = Space(old)
        estimated = sum(
            1
            for t in old_study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.COMPLETE
            and t.user_attrs.get("source", "analytical") == "analytical"
        )
        if estimated:
            ws.notes.append(
                f"{source}: {estimated} trials estimated by the analytical runner are not imported: only measured "
                "trials calibrate this study (an estimate repeats its own model)"
            )
        for t in old_study.get_trials(deepcopy=False):
            ua = t.user_attrs
            try:
                config = trial_config(old_space, t)
            except SpecError:
                config = None
            if config is None:
                continue
            if same_gpu and t.state == optuna.trial.TrialState.FAIL and ua.get(FAILURE_REASON) == "oom":
                if ua.get("oom_counts_for_memory", True):
                    mem = estimate_memory(old, config)
                    if mem.peak_gib > 0:
                        ws.oom_bounds.append(mem.capacity_gib / mem.peak_gib)
                continue
            measured = ua.get("measured_tokens_per_s_per_gpu")
            if t.state != optuna.trial.TrialState.COMPLETE or ua.get("source", "analytical") == "analytical":
                continue
            if not measured or float(measured) <= 0:
                continue
            measured = float(measured)
            est_old = estimate_throughput(old, config)
            if same_gpu and ua.get("measured_peak_memory_gib"):
                peak = estimate_memory(old, config).peak_gib
                if peak > 0:
                    ws.memory_ratios.append(float(ua["measured_peak_memory_gib"]) / peak)
                if ua.get("measured_reserved_memory_gib"):
                    reserved = float(ua["measured_reserved_memory_gib"])
                    ws.memory_reserves.append(reserved - float(ua["measured_peak_memory_gib"]))
            new = legal_config(space, config)[0]
            tag = f"{source}#{t.number}"
            if new is not None and est_old.tokens_per_s_per_gpu > 0:
                est = estimate_throughput(spec, new)
                m = measured * est.tokens_per_s_per_gpu / est_old.tokens_per_s_per_gpu
                ws.pairs.append(
                    ImportedPair(tag, new.to_params(), est.breakdown_s, est.tokens_per_s_per_gpu, m, True)
                )
                ranked.append((measured, new))
            else:
                ws.pairs.append(
                    ImportedPair(
                        tag,
                        config.to_params(),
                        est_old.breakdown_s,
                        est_old.tokens_per_s_per_gpu,
                        measured,
                        False,
                    )
                )
    mem_cal = MemoryCalibration.fit(ws.memory_ratios, ws.oom_bounds)
    seen: set[TrainingConfig] = set()
    for _, config in sorted(ranked, key=lambda x: (-x[0], x[1].key())):
        if config in seen or len(ws.offers) >= MAX_OFFERS:
            continue
        seen.add(config)
        if memory_attrs(estimate_memory(spec, config), mem_cal)[0]:
            ws.offers.append(config.to_params())
    ws.ranking = ranking_shift(spec, space, ws, mem_cal)
    return ws


def fit_from_pairs(space: Space, pairs: list[Pair]) -> tuple[Calibration, AxisValueFactors]:
    """The step-time calibration and per-axis-value corrections of ``pairs`` (as the fallback fits them)."""
    cal = Calibration.fit([(e, m) for _, e, m in pairs]) if pairs else Calibration()
    factors = AxisValueFactors.fit(
        space, [(c, math.log(m / max(corrected_tps(e, cal), 1e-9))) for c, e, m in pairs if m > 0]
    )
    return cal, factors


def ranking_shift(spec: StudySpec, space: Space, ws: WarmStart, mem_cal: MemoryCalibration) -> dict[str, Any]:
    """How the imported evidence reorders the feasible configurations: Spearman rank correlation between the
    uncalibrated and the warm-started expected tokens/s/GPU, the warm-started #1's rank before, top-10 overlap."""
    pairs = [p.to_pair(space) for p in ws.pairs]
    if not pairs:
        return {}
    cal, factors = fit_from_pairs(space, pairs)
    rows = []
    for c in space.configs():
        if memory_attrs(estimate_memory(spec, c), mem_cal)[0]:
            est = estimate_throughput(spec, c)
            rows.append(
                (c, est.tokens_per_s_per_gpu, corrected_tps(est, cal) * math.exp(factors.log_factor(c)))
            )
    if len(rows) < 2:
        return {}
    before = np.array([r[1] for r in rows])
    after = np.array([r[2] for r in rows])
    rb = np.argsort(np.argsort(-before))
    ra = np.argsort(np.argsort(-after))
    spearman = float(np.corrcoef(rb, ra)[0, 1])
    top_after = int(np.argmin(ra))
    k = min(10, len(rows))
    overlap = len(set(np.argsort(-before)[:k]) & set(np.argsort(-after)[:k]))
    return {
        "n": len(rows),
        "spearman": round(spearman, 4),
        "top1": rows[top_after][0].key(),
        "top1_was": int(rb[top_after]) + 1,
        "top10_overlap": overlap,
        "calibration": cal.to_dict(),
    }


def warm_start_pairs(space: Space, study: optuna.Study) -> list[Pair]:
    """The imported (configuration, estimate, measured) pairs of ``study`` (none without a warm start)."""
    return [ImportedPair(**p).to_pair(space) for p in warm_start_data(study).get("pairs", [])]


def warm_start_observations(space: Space, study: optuna.Study) -> list[Observation]:
    """The imported pairs of ``study`` as prior :class:`~primus_optuna.search.learner.Observation` s (each
    keeps the estimate it is compared with) for the fallback's learner."""
    return [
        Observation(config, measured, prior=True, estimate=est)
        for config, est, measured in warm_start_pairs(space, study)
        if measured > 0
    ]


def warm_start_memory(study: optuna.Study) -> tuple[list[float], list[float]]:
    """The imported memory evidence of ``study``: (measured/estimated peak ratios, out-of-memory bounds)."""
    ws = warm_start_data(study)
    return [float(x) for x in ws.get("memory_ratios", [])], [float(x) for x in ws.get("oom_bounds", [])]


def apply_warm_start(study: optuna.Study, spec: StudySpec, ws: WarmStart) -> str:
    """Store ``ws`` in ``study`` (system attr ``primus:warm_start``); returns the summary. The calibrations
    follow from it and the study's own trials (:func:`~primus_optuna.search.calibrations.study_calibrations`)."""
    from .state import store_spec

    store_spec(study, spec)
    set_study_state(study, WARM_START, ws.to_dict())
    return ws.summary()
