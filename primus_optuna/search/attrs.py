"""The vocabulary of a trial's user attrs (what a user reads; the library's own state is
:mod:`~primus_optuna.search.state`'s system attrs) and the one classifier of prune and failure reasons.

A reason is written as ``<category>: <details>`` (``memory: 301.2 GiB on stage 3 > 259.2 GiB usable``) or is
the category alone (``oom``); :func:`reason_category` reads the category back, :func:`trial_reason` gives a
finished trial's category in one wording for every surface (:data:`NO_REASON` when none was recorded).

Example::

    reason_category(trial.user_attrs.get(PRUNE_REASON)) == MEMORY
    trial_reason("FAIL", trial.user_attrs)  # "oom", or "no reason recorded"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DUPLICATE",
    "EXHAUSTED",
    "EXPECTED",
    "EXPECTED_SHARE",
    "FAILURE_REASON",
    "GPU_HOURS",
    "GPU_HOURS_SAVED_EARLY_STOP",
    "ILLEGAL",
    "INTERRUPTED",
    "LAUNCHED",
    "LAUNCH_FAILED",
    "MEMORY",
    "NO_REASON",
    "NO_THROUGHPUT",
    "OOM",
    "PHASE",
    "PREFILTER",
    "PRUNE_REASON",
    "RUN_ATTRS",
    "SLOW",
    "SOURCE",
    "SOURCES",
    "SPEC_CHANGED",
    "TIMEOUT",
    "reason_category",
    "source_of",
    "trial_reason",
]

# --- names -------------------------------------------------------------------------------------------------
PRUNE_REASON = "prune_reason"
FAILURE_REASON = "failure_reason"
PHASE = "phase"
SOURCE = "source"
"""how the value was obtained: ``analytical`` | ``profiled`` | ``measured``"""
GPU_HOURS = "gpu_hours"
GPU_HOURS_SAVED_EARLY_STOP = "gpu_hours_saved_early_stop"
LAUNCHED = "launched"
"""true from the moment the objective starts a launching runner's job (a killed worker's trial keeps it)"""
EXPECTED = "expected_tokens_per_s_per_gpu"
"""a planner proposal's expected tokens/s/GPU when the gate let it through (the corrected model + the learner)"""
EXPECTED_SHARE = "expected_share_of_best"
"""the same as a share of the best (measured, or expected of an untried one when higher) at that moment"""

RUN_ATTRS = (
    LAUNCHED,
    SOURCE,
    FAILURE_REASON,
    "interrupted_by",
    "log_tail",
    GPU_HOURS,
    GPU_HOURS_SAVED_EARLY_STOP,
    "iterations_run",
    "measured_tokens_per_s_per_gpu",
    "measured_partial",
    "measured_peak_memory_gib",
    "measured_repeats",
    "measured_spread",
    "estimate_error",
    "memory_model_miss",
    "step_time_s",
    "breakdown_s",
)
"""what one run of a trial left (its job, log and measurement): a heartbeat retry inherits the failed trial's
user attrs (Optuna copies them), so the objective clears these before the retry runs"""

# --- prune reasons (categories) ----------------------------------------------------------------------------
MEMORY = "memory"
"""the memory gate: the configuration would not fit"""
ILLEGAL = "illegal"
"""a configuration Megatron refuses"""
DUPLICATE = "duplicate"
"""the configuration already ran or runs"""
SLOW = "slow"
"""a launched job stopped early, clearly slower than the best"""
EXHAUSTED = "exhausted"
"""a placeholder: the sampler had nothing left to propose"""
PREFILTER = (MEMORY, ILLEGAL, DUPLICATE)
"""the categories decided before launch"""

# --- failure reasons ---------------------------------------------------------------------------------------
OOM = "oom"
TIMEOUT = "timeout"
LAUNCH_FAILED = "launch_failed"
NO_THROUGHPUT = "no_throughput"
INTERRUPTED = "interrupted"
SPEC_CHANGED = "spec_changed"
"""refused: the study was created from another search space"""

NO_REASON = "no reason recorded"
SOURCES = ("measured", "profiled", "analytical")


def reason_category(reason: Any) -> str:
    """The category of a prune or failure reason, one vocabulary for both: its words before the first ``:``
    or ``(`` (``memory``, ``duplicate``, ``slow``, ``exhausted``, ``oom``, ``timeout``, ``interrupted``, ...);
    :data:`NO_REASON` when there is none."""
    text = str(reason or "").strip()
    return re.split(r"[:(]", text, maxsplit=1)[0].strip() or NO_REASON


def trial_reason(state: str, attrs: Mapping[str, Any]) -> str | None:
    """The reason category of a finished trial (``state``: Optuna's state name): its prune reason when pruned,
    its failure reason when failed (:data:`NO_REASON` when none was recorded, e.g. a worker killed and failed by
    the heartbeat); ``None`` for other states."""
    if state == "PRUNED":
        return reason_category(attrs.get(PRUNE_REASON))
    if state == "FAIL":
        return reason_category(attrs.get(FAILURE_REASON))
    return None


def source_of(attrs: Mapping[str, Any]) -> str:
    """Where a trial's value came from: ``measured``/``profiled``/``analytical`` as the runner recorded it, or
    ``your objective`` for a value returned by an objective that records no source (a custom objective)."""
    src = attrs.get(SOURCE)
    return str(src) if src else "your objective"
