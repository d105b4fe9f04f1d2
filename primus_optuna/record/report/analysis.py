"""The figures the report derives from a :class:`~.record.StudyRecord`: step time and GPU-hours not spent on
memory-pruned trials, estimate errors of measured trials, gain over the baseline, the sensitivity of the best
configuration (each axis one step either side, estimated analytically), the planner's rounds (its transcripts)
and fallback reasons, the environment's versions and the command that reproduces the run. Plain data out, no
formatting. May import :mod:`.record`, the spec and space, and the physics (lazily, in :func:`sensitivity`);
not the document model, the plots or the sections.
"""

from __future__ import annotations

import platform
import re
from importlib import metadata
from typing import Any

from ...search.attrs import MEMORY
from ...space import TrainingConfig
from ...spec.study import AXES
from .record import StudyRecord, TrialRow, as_number

SHARP_LOSS = 0.10
"""A neighbour that loses at least this fraction of the best's estimate makes an axis "sharp"."""
FLAT_LOSS = 0.03
"""Neighbours within this fraction of the best's estimate make an axis "flat" (a broad basin)."""

PACKAGES = ("primus-optuna", "optuna", "optuna-dashboard", "dspy", "litellm", "matplotlib", "pydantic")


def step_time_s(rec: StudyRecord, t: TrialRow) -> float | None:
    """Estimated seconds per optimizer step: the ``step_time_s`` attr, else from the tokens/s estimate."""
    st = as_number(t.attr("step_time_s"))
    if st:
        return st
    est = t.estimate
    if est:
        return rec.spec.tokens_per_step / (est * rec.spec.world)
    return None


def memory_pruned(rec: StudyRecord) -> list[TrialRow]:
    """Trials the memory filter removed."""
    return [t for t in rec.trials if t.state == "PRUNED" and t.prune_category == MEMORY]


def gpu_hours_saved(rec: StudyRecord) -> tuple[float, int]:
    """(GPU-hours not spent on memory-pruned trials, how many had a step-time estimate).

    A configuration pruned and later launched anyway (re-offered once the memory calibration showed it fits)
    saved nothing and is not counted."""
    launched = {t.config for t in rec.trials if t.state in ("COMPLETE", "FAIL", "RUNNING") and t.config}
    total, counted = 0.0, 0
    for t in memory_pruned(rec):
        if t.config in launched:
            continue
        st = step_time_s(rec, t)
        if st:
            total += st * rec.measure_steps * rec.spec.world / 3600.0
            counted += 1
    return total, counted


def estimate_errors(rec: StudyRecord) -> list[tuple[TrialRow, float, float, float]]:
    """(trial, estimate, measurement, error) for completed trials measured by a non-analytical runner.

    error = ``estimate_error`` attr, else (estimate − measured) / measured; positive = optimistic model."""
    out = []
    for t in rec.complete:
        if t.attr("source") in (None, "analytical"):
            continue
        est, meas = t.estimate, t.measured
        if est is None or not meas:
            continue
        err = as_number(t.attr("estimate_error"))
        out.append((t, est, meas, err if err is not None else (est - meas) / meas))
    return out


def tflops_per_gpu(rec: StudyRecord, tokens_per_s_per_gpu: float | None) -> float | None:
    """Model TFLOP/s per GPU at ``tokens_per_s_per_gpu`` (training FLOPs per token without recompute, as
    for MFU)."""
    if not tokens_per_s_per_gpu:
        return None
    from ...physics.flops import model_flops_per_token

    return tokens_per_s_per_gpu * model_flops_per_token(rec.spec.model, rec.spec.workload.seq_length) / 1e12


def mfu_denominator(rec: StudyRecord) -> tuple[str, float]:
    """(name, TFLOP/s) of the dense peak MFU is measured against: FP8 for an fp8 study on a GPU with an FP8
    peak, else BF16."""
    g, precision = rec.spec.cluster.gpu, rec.spec.workload.precision
    name = "FP8" if precision == "fp8" and g.fp8_tflops is not None else "BF16"
    return name, g.peak_tflops(precision)


def gain(new: float | None, old: float | None) -> float | None:
    return None if not new or not old else new / old - 1.0


def sensitivity(
    rec: StudyRecord, config: TrainingConfig, calibration: Any = None, memory_calibration: Any = None
) -> tuple[list[dict[str, Any]], str]:
    """Each axis one candidate step either side of ``config``, estimated analytically — with the study's
    step-time ``calibration`` (a :class:`~primus_optuna.physics.calibration.Calibration`) when given, and
    fit and peak under ``memory_calibration`` (the :class:`~primus_optuna.physics.memory_calibration.
    MemoryCalibration` the memory filter uses) when given.

    Returns (rows, verdict); rows are empty and the verdict says why when the physics is unavailable."""
    try:
        from ...physics.memory import estimate_memory
        from ...physics.throughput import estimate_throughput
    except ImportError as exc:
        return [], f"not available: the analytical models cannot be imported ({exc})"
    spec, space = rec.spec, rec.space
    base_est = estimate_throughput(spec, config, calibration).tokens_per_s_per_gpu
    rows: list[dict[str, Any]] = []
    for axis in AXES:
        cands = space.candidates[axis]
        cur = getattr(config, axis)
        if cur not in cands or len(cands) < 2:
            continue
        i = cands.index(cur)
        for j, direction in ((i - 1, "-1"), (i + 1, "+1")):
            if not 0 <= j < len(cands):
                continue
            raw = config.replace(**{axis: cands[j]})
            row: dict[str, Any] = {"axis": axis, "step": direction, "value": cands[j]}
            reasons = space.check(raw)
            if reasons:
                row.update(status="illegal", note=reasons[0])
            else:
                c = space.canonical(raw)
                mem = estimate_memory(spec, c)
                peak, fits = (
                    memory_calibration.apply(mem)
                    if memory_calibration is not None
                    else (mem.peak_gib, mem.fits)
                )
                tput = estimate_throughput(spec, c, calibration).tokens_per_s_per_gpu
                row.update(
                    status="fits" if fits else "does not fit",
                    tokens=tput,
                    delta=tput / base_est - 1.0,
                    peak_gib=peak,
                    note="" if c == raw else f"canonical form {c.key()}",
                )
            rows.append(row)
    feasible = [r for r in rows if r.get("status") == "fits"]
    if not feasible:
        return rows, "no legal, fitting neighbour: the best configuration is isolated"
    near = [r for r in feasible if r["delta"] >= -FLAT_LOSS]
    sharp = [r for r in feasible if r["delta"] <= -SHARP_LOSS]
    if not near:
        verdict = (
            f"sharp peak: every legal neighbour loses more than {FLAT_LOSS:.0%} "
            f"({len(sharp)} of {len(feasible)} lose {SHARP_LOSS:.0%} or more)"
        )
    elif len(near) * 2 >= len(feasible):
        verdict = f"broad basin: {len(near)} of {len(feasible)} legal neighbours are within {FLAT_LOSS:.0%} of the best"
    else:
        verdict = f"moderate: {len(near)} of {len(feasible)} legal neighbours are within {FLAT_LOSS:.0%}"
    return rows, verdict


TRANSCRIPT_NAME = re.compile(r"planner-call-.*\.json$")


def planner_rounds(rec: StudyRecord) -> list[dict[str, Any]]:
    """The planner's calls, oldest first: the JSON transcripts the sampler stores as study artifacts
    (``planner-call-<trial>.json``: accepted, rejected with reason, tokens, cost_usd, error), read from the
    file artifact store. Each gets ``artifact`` (its file name); empty when the store is not found."""
    import json

    if rec.artifact_store is None:
        return []
    rounds = []
    for meta in rec.artifacts:
        if meta["trial"] is not None or not TRANSCRIPT_NAME.search(meta["filename"]):
            continue
        try:
            with rec.artifact_store.open_reader(meta["artifact_id"]) as f:
                doc = json.loads(f.read())
        except Exception:  # a missing or unreadable transcript: list the others
            continue
        if isinstance(doc, dict):
            rounds.append({**doc, "artifact": meta["filename"]})
    return sorted(rounds, key=lambda r: (r.get("time") or "", r.get("trial_number") or 0))


FALLBACK_NOTE = re.compile(r"^planner unavailable \((?P<why>.*?)(; (?P<n>\d+) rejected)\); ")
"""the sampler's note before a fallback rationale; the reason may hold parentheses, the count ends it"""


def fallback_reason(rec: StudyRecord, t: TrialRow) -> str:
    """Why a fallback trial happened: the note the sampler puts before its rationale, else no LLM."""
    m = FALLBACK_NOTE.match(str(t.attr("rationale") or ""))
    if m:
        n = int(m.group("n") or 0)
        return m.group("why") + (f" ({n} candidates rejected)" if n else "")
    return "no LLM configured" if not rec.llm_model else "not recorded"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def reproduce_command(rec: StudyRecord, study_file: str = "study.yaml") -> str:
    """The ``run`` command that repeats this study in a fresh one (``<name>-reproduce`` in
    ``reproduce.db``): the same storage and name would resume this study and add trials to it. As many trials
    as this study holds."""
    s = rec.spec.search
    name = f"{rec.study_name}-reproduce"
    cmd = (
        f"primus-optuna run {study_file} --storage sqlite:///reproduce.db --study-name {name} "
        f"--n-trials {len(rec.trials) or s.n_trials} --seed {s.seed} --runner {rec.spec.runner.kind}"
    )
    return cmd + (f" --llm {rec.llm_model}" if rec.llm_model else " --no-llm")
