"""One account of a study, built from its storage: :class:`StudyAccount`. The run summary, ``run --json``, the
report and the dashboard note all render it (through :class:`~primus_optuna.record.summary.StudySummary`), so
a count reads the same everywhere, also after a ``kill -9``, a heartbeat retry and a resume.

Rules (one each; the reason vocabulary is :mod:`primus_optuna.search.attrs`):

- **trials** by state (RUNNING and WAITING included); a *placeholder* is a trial pruned with nothing left to
  propose (``exhausted``), counted apart;
- **launched**: a trial whose job started on the GPUs: the objective marked it ``launched`` before starting
  the job, or it recorded GPU-hours, or its value was ``measured``/``profiled``, or the job itself failed
  (out of memory, timeout, ...), or it reported intermediate values (a custom objective's job); a trial failed
  by the heartbeat after its worker was killed counts when it had been launched. **Failed**/**stopped early**: the
  launched trials that failed / were pruned after launch (a slow job, or a prune by your objective);
- **pruned before launch**: the memory gate, illegal configurations and duplicates;
- **reasons**: :func:`~primus_optuna.search.attrs.trial_reason` (``no reason recorded`` when none was);
- **sources** of the completed trials' values: ``measured``, ``profiled``, ``analytical`` or ``your
  objective`` (a custom objective that records no source);
- **GPU-hours spent**: each launched trial's ``gpu_hours``; without it, its step time × the measured steps ×
  the GPUs (a measured trial of a plain objective), else its wall time × the GPUs (a killed job);
  **not spent**: the memory-pruned trials' estimated cost (:func:`~primus_optuna.record.report.analysis.
  gpu_hours_saved`) and the stopped jobs' ``gpu_hours_saved_early_stop``.

Example::

    acc = study_account(load_record("sqlite:///study.db"))
    acc.launched, acc.failed_by_reason, acc.gpu_hours_spent
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..search.attrs import (
    EXHAUSTED,
    GPU_HOURS,
    GPU_HOURS_SAVED_EARLY_STOP,
    INTERRUPTED,
    LAUNCHED,
    NO_REASON,
    PREFILTER,
    SOURCE,
    SPEC_CHANGED,
    source_of,
    trial_reason,
)

if TYPE_CHECKING:
    from .report.record import StudyRecord, TrialRow

__all__ = ["StudyAccount", "launched_job", "study_account"]


def _number(v: Any) -> float | None:
    try:
        return None if v is None or isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        return None


def launched_job(state: str, attrs: dict[str, Any], reported: int = 0) -> bool:
    """Whether a finished trial's job started on the GPUs (see the module docstring); ``reported``: how many
    intermediate values the trial reported (a custom objective's job that reported ran)."""
    if state in ("RUNNING", "WAITING"):
        return False
    reason = trial_reason(state, attrs)
    if state == "PRUNED" and reason in (*PREFILTER, EXHAUSTED):
        return False
    if (
        attrs.get(LAUNCHED)
        or attrs.get(GPU_HOURS) is not None
        or attrs.get(SOURCE) in ("measured", "profiled")
        or (reported and attrs.get(SOURCE) != "analytical")
    ):
        return True
    # a failure of the job itself (out of memory, timeout, no throughput, ...) ran one; an interrupt before the
    # job started, a refused study file or a worker killed before launching did not
    return state == "FAIL" and reason not in (NO_REASON, INTERRUPTED, SPEC_CHANGED)


@dataclass(frozen=True)
class StudyAccount:
    """The counts and GPU-hours of one study (see the module docstring for each rule)."""

    trials: int
    by_state: dict[str, int]
    placeholders: int
    pruned_by_reason: dict[str, int]
    pruned_before_launch: dict[str, int]
    failed_by_reason: dict[str, int]
    launched: int
    launched_failed: int
    stopped_early: int
    estimated: int
    """completed trials of the analytical runner (no GPU)"""
    sources: dict[str, int]
    by_phase: dict[str, int]
    gpus: int
    gpu_hours_spent: float
    gpu_hours_saved_memory: float
    memory_pruned: int
    gpu_hours_saved_early_stop: float
    launched_trials: list[int] = field(default_factory=list)
    stopped_trials: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            k: round(v, 4) if isinstance(v, float) else v
            for k, v in self.__dict__.items()
            if k not in ("launched_trials", "stopped_trials")
        }


def _spent(rec: StudyRecord, t: TrialRow) -> float:
    hours = _number(t.attr(GPU_HOURS))
    if hours is not None:
        return hours
    step = _number(t.attr("step_time_s"))
    if t.state == "COMPLETE" and step:
        return step * rec.measure_steps * rec.spec.world / 3600.0
    return (t.duration_s or 0.0) * rec.spec.world / 3600.0


def study_account(rec: StudyRecord) -> StudyAccount:
    """The :class:`StudyAccount` of a study read back from storage."""
    from .report.analysis import gpu_hours_saved, memory_pruned  # the report package imports this module

    rows = rec.trials
    reasons = {t.number: trial_reason(t.state, t.attrs) for t in rows}
    placeholders = [t for t in rows if reasons[t.number] == EXHAUSTED]
    pruned = Counter(
        reasons[t.number] for t in rows if t.state == "PRUNED" and reasons[t.number] != EXHAUSTED
    )
    launched = [t for t in rows if launched_job(t.state, t.attrs, t.reported)]
    stopped = [t for t in launched if t.state == "PRUNED"]
    saved_memory, _ = gpu_hours_saved(rec)
    return StudyAccount(
        trials=len(rows),
        by_state=dict(Counter(t.state.lower() for t in rows)),
        placeholders=len(placeholders),
        pruned_by_reason=dict(pruned.most_common()),
        pruned_before_launch={k: v for k, v in pruned.most_common() if k in PREFILTER},
        failed_by_reason=dict(Counter(reasons[t.number] for t in rows if t.state == "FAIL").most_common()),
        launched=len(launched),
        launched_failed=sum(t.state == "FAIL" for t in launched),
        stopped_early=len(stopped),
        estimated=sum(t.state == "COMPLETE" and t.attr(SOURCE) == "analytical" for t in rows),
        sources=dict(Counter(source_of(t.attrs) for t in rows if t.state == "COMPLETE").most_common()),
        by_phase=dict(Counter(t.phase if t.phase != "-" else "?" for t in rows)),
        gpus=rec.spec.world,
        gpu_hours_spent=sum(_spent(rec, t) for t in launched),
        gpu_hours_saved_memory=saved_memory,
        memory_pruned=len(memory_pruned(rec)),
        gpu_hours_saved_early_stop=sum(_number(t.attr(GPU_HOURS_SAVED_EARLY_STOP)) or 0.0 for t in stopped),
        launched_trials=[t.number for t in launched],
        stopped_trials=[t.number for t in stopped],
    )
