"""Budget accounting of a study: trials launched vs pruned, GPU-hours spent vs saved by the filter.

A *launched* trial ran a runner that is not analytical (it measured something, failed while running — out of
memory, timeout, no throughput — or was stopped early by a pruner after it started); its GPU-hours are its wall time × the cluster's GPUs. A trial pruned
before launch — by the memory filter, as illegal, or as a duplicate — spent none; the GPU-hours the filter
*saved* are those prunes counted at the median launched trial's cost (a configuration that does not fit would
at least have started, loaded and failed; a duplicate would have rerun). Analytical trials cost no GPU time,
so a study run only with the analytical runner saves none either: the accounting says so.

Example::

    acc = budget_accounting(study.get_trials(), gpus=64)
    print("\\n".join(acc.lines()))
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import optuna

PREFILTER = ("memory", "illegal", "duplicate")
"""prune-reason categories decided before launch"""


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
    gpu_hours_per_launch: float | None = None
    """median GPU-hours of a launched trial (``None`` when nothing was launched)"""

    @property
    def n_pruned_before_launch(self) -> int:
        return sum(self.pruned_before_launch.values())

    @property
    def gpu_hours_saved(self) -> float | None:
        if self.gpu_hours_per_launch is None:
            return None
        return self.n_pruned_before_launch * self.gpu_hours_per_launch

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
            "gpu_hours_per_launch": None
            if self.gpu_hours_per_launch is None
            else round(self.gpu_hours_per_launch, 4),
            "gpu_hours_saved": None if self.gpu_hours_saved is None else round(self.gpu_hours_saved, 4),
        }

    def lines(self) -> list[str]:
        """Human lines for ``run``'s summary and the report."""
        pre = ", ".join(f"{k} {v}" for k, v in self.pruned_before_launch.most_common()) or "none"
        out = [
            f"budget: {self.trials} trials — {self.launched} launched ({self.failed_launched} of them failed), "
            f"{self.analytical} analytical (no GPU), {self.n_pruned_before_launch} pruned before launch ({pre})"
            + (f", {self.pruned_other} stopped while running" if self.pruned_other else "")
        ]
        if self.gpus is None:
            out.append("GPU-hours: unknown (the study does not record its cluster size)")
        elif not self.launched:
            out.append(
                "GPU-hours: 0 spent (nothing launched on the cluster); the filter's saving is only counted "
                "against launched trials"
            )
        else:
            saved = self.gpu_hours_saved or 0.0
            out.append(
                f"GPU-hours: {self.gpu_hours_spent:.2f} spent by {self.launched} launched trials on {self.gpus} "
                f"GPUs; ≈{saved:.2f} saved by the {self.n_pruned_before_launch} prunes before launch (at the "
                f"median launched trial's {self.gpu_hours_per_launch:.3f})"
            )
        return out


def _category(reason: str) -> str:
    return reason.split(":", 1)[0].strip() or "unknown"


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
        source = ua.get("source")
        if state == "PRUNED":
            cat = _category(str(ua.get("prune_reason", "")))
            if cat in PREFILTER:
                acc.pruned_before_launch[cat] += 1
                continue
            if cat == "exhausted":  # a placeholder: nothing was left to propose
                acc.trials -= 1
                continue
            acc.pruned_other += 1  # stopped while running (e.g. an early-stopping pruner): it spent GPU time
            launched = source != "analytical"
        else:
            launched = (state == "COMPLETE" and source not in (None, "analytical")) or (
                state == "FAIL" and ua.get("failure_reason") is not None
            )
        if state == "COMPLETE" and source == "analytical":
            acc.analytical += 1
        if not launched:
            continue
        acc.launched += 1
        acc.failed_launched += state == "FAIL"
        if gpus and seconds is not None:
            hours.append(seconds / 3600.0 * gpus)
    acc.gpu_hours_spent = sum(hours)
    acc.gpu_hours_per_launch = statistics.median(hours) if hours else None
    return acc


def study_gpus(study: optuna.Study) -> int | None:
    """The cluster's GPU count from the study's stored spec (``None`` without one)."""
    from ..search.pruner import stored_spec_data

    spec = stored_spec_data(study) or {}
    cluster = spec.get("cluster") or {}
    try:
        return int(cluster["nodes"]) * int(cluster["gpus_per_node"])
    except (KeyError, TypeError, ValueError):
        return None
