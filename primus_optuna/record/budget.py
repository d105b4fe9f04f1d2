"""Budget accounting of a study: trials launched vs pruned before launch (the GPU-hour account, one rule for
the run summary, the report and the dashboard, is :mod:`primus_optuna.record.gpu_hours`).

A *launched* trial ran a runner that is not analytical (it measured something, failed while running — out of
memory, timeout, no throughput — or was stopped early by a pruner after it started); ``gpu_hours_spent`` is
the sum of their wall times × the cluster's GPUs. A trial pruned before launch — by the memory filter, as
illegal, or as a duplicate — spent none. Analytical trials cost no GPU time.

Its text is written by :class:`~primus_optuna.record.summary.StudySummary` (one wording everywhere).

Example::

    acc = budget_accounting(study.get_trials(), gpus=64)
    acc.launched, acc.to_dict()
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna

from ..search.attrs import EXHAUSTED, PREFILTER, reason_category, trial_reason  # noqa: F401 (re-exported)
from .account import launched_job


@dataclass
class BudgetAccounting:
    """Counts and GPU-hours of one study (see the module docstring)."""

    trials: int = 0
    launched: int = 0
    analytical: int = 0
    pruned_before_launch: Counter[str] = field(default_factory=Counter)
    pruned_other: int = 0
    failed_launched: int = 0
    gpus: int | None = None
    gpu_hours_spent: float = 0.0

    @property
    def n_pruned_before_launch(self) -> int:
        return sum(self.pruned_before_launch.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "trials": self.trials,
            "launched": self.launched,
            "failed_launched": self.failed_launched,
            "analytical": self.analytical,
            "pruned_before_launch": dict(self.pruned_before_launch),
            "pruned_other": self.pruned_other,
            "gpus": self.gpus,
            "gpu_hours_spent": round(self.gpu_hours_spent, 4),
        }


def budget_accounting(trials: Iterable[optuna.trial.FrozenTrial], gpus: int | None) -> BudgetAccounting:
    """Account for Optuna ``trials`` on a cluster of ``gpus`` GPUs (``None``: unknown, no GPU-hours)."""
    rows = []
    for t in trials:
        duration = (
            (t.datetime_complete - t.datetime_start).total_seconds()
            if t.datetime_start and t.datetime_complete
            else None
        )
        rows.append((t.state.name, t.user_attrs, duration))
    return account(rows, gpus)


def account(rows: Iterable[tuple[str, dict[str, Any], float | None]], gpus: int | None) -> BudgetAccounting:
    """The accounting of ``(state name, user attrs, wall seconds)`` rows (what the report reads back)."""
    acc = BudgetAccounting(gpus=gpus)
    hours: list[float] = []
    for state, ua, seconds in rows:
        if state in ("RUNNING", "WAITING"):
            continue
        acc.trials += 1
        cat = trial_reason(state, ua)
        if state == "PRUNED" and cat in PREFILTER:
            acc.pruned_before_launch[cat] += 1
            continue
        if state == "PRUNED" and cat == EXHAUSTED:  # a placeholder: nothing was left to propose
            acc.trials -= 1
            continue
        if state == "COMPLETE" and ua.get("source") == "analytical":
            acc.analytical += 1
        if not launched_job(state, ua):  # the one rule (record.account)
            continue
        acc.launched += 1
        acc.failed_launched += state == "FAIL"
        acc.pruned_other += state == "PRUNED"  # stopped while running (e.g. an early-stopping pruner)
        if gpus and seconds is not None:
            hours.append(seconds / 3600.0 * gpus)
    acc.gpu_hours_spent = sum(hours)
    return acc
