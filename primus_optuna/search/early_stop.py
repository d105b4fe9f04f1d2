"""Early stopping of slow launches: :class:`ThroughputPruner` and the study file's ``search.early_stop``.

A launching runner reports each steady-state iteration's tokens/s/GPU of a running job as an intermediate value
(``trial.report(iteration, value)``). The pruner stops a job that is clearly slower than the best completed
trial. **Rule**: with ``v_1..v_n`` the trial's reported values, once ``n >= min_iters``, let ``m`` be their
median, ``s = 1.4826 · MAD(v)`` the robust iteration-to-iteration noise and ``se = 1.2533 · s / √n`` the
standard error of the median; the trial is pruned when

    m + z · se  <  (1 − margin) · best

where ``best`` is the highest value of the study's completed trials (those measured by a job: not the
``analytical`` or ``profiled`` estimates of a study run earlier with another runner). So even an optimistic reading of the
running throughput (``z`` standard errors up) is more than ``margin`` below the best: a noisy job gets more
iterations before it is judged, and one that is only slightly slower (within ``margin``) always runs to the
end. Defaults: ``min_iters=3``, ``margin=0.05``, ``z=2``. The value a completed trial returns is the median of
the same steady-state iterations, so both sides of the comparison are the same estimator.

Compose with the memory prefilter (which decides before any report and delegates afterwards)::

    pruner = MemoryPrefilterPruner(spec=spec, wrapped=ThroughputPruner(min_iters=3, margin=0.05))

When it prunes it writes ``prune_reason`` (``slow: ...``) to the trial's user attrs; the objective stops the
job's process group and records the GPU-hours the remaining iterations would have taken.
"""

from __future__ import annotations

import math
import statistics

import optuna
from optuna.pruners import BasePruner

from ..spec import StudySpec
from ..spec.study import EarlyStopSpec
from .attrs import PRUNE_REASON
from .pruner import MemoryPrefilterPruner

__all__ = ["EarlyStopSpec", "ThroughputPruner", "slow_verdict", "study_pruner"]

MAD_TO_SIGMA = 1.4826
"""MAD × 1.4826 estimates the standard deviation of normally distributed values"""
ESTIMATED = ("analytical", "profiled")
"""completed trials whose ``source`` is one of these are estimates, not jobs: never the ``best`` a job is held to"""
MEDIAN_SE = 1.2533
"""standard error of the median = √(π/2) · σ / √n for normally distributed values"""


def slow_verdict(
    values: list[float],
    best: float,
    *,
    min_iters: int = 3,
    margin: float = 0.05,
    z: float = 2.0,
    minimize: bool = False,
) -> str | None:
    """``"slow: ..."`` when ``values`` (a running trial's per-iteration tokens/s/GPU) meet the rule of the
    module docstring against ``best``; ``None`` otherwise. With ``minimize`` (a study that minimises, e.g. step
    time) the rule is mirrored: pruned when ``m − z·se > (1 + margin)·best``."""
    n = len(values)
    if n < min_iters or best <= 0:
        return None
    m = statistics.median(values)
    s = MAD_TO_SIGMA * statistics.median(abs(v - m) for v in values)
    se = MEDIAN_SE * s / math.sqrt(n)
    if minimize:
        bar = (1.0 + margin) * best
        if m - z * se <= bar:
            return None
        return (
            f"slow: {m:.4g} over {n} iterations (±{se:.2g}) is {m / best - 1.0:.0%} above the best completed "
            f"trial's {best:.4g} (stop above {bar:.4g} = best + {margin:.0%}, {z:g} standard errors of slack)"
        )
    bar = (1.0 - margin) * best
    if m + z * se >= bar:
        return None
    return (
        f"slow: {m:.1f} tokens/s/GPU over {n} iterations (±{se:.1f}) is {1.0 - m / best:.0%} below the best "
        f"completed trial's {best:.1f} (stop below {bar:.1f} = best − {margin:.0%}, {z:g} standard errors of "
        "slack)"
    )


class ThroughputPruner(BasePruner):
    """Prune a running trial whose reported throughput is clearly below the best completed trial's.

    The rule is the module docstring's, mirrored for a study that minimises (``study.direction``);
    single-objective studies only (Optuna's ``should_prune`` is).
    """

    def __init__(self, *, min_iters: int = 3, margin: float = 0.05, z: float = 2.0) -> None:
        EarlyStopSpec(min_iters=min_iters, margin=margin, z=z)  # the same validation as the study file
        self.min_iters, self.margin, self.z = min_iters, margin, z

    @classmethod
    def from_spec(cls, spec: EarlyStopSpec) -> ThroughputPruner:
        return cls(min_iters=spec.min_iters, margin=spec.margin, z=spec.z)

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        values = [v for _, v in sorted(trial.intermediate_values.items()) if math.isfinite(v)]
        if len(values) < self.min_iters:
            return False
        done = study._storage.get_all_trials(
            study._study_id, deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)
        )
        minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
        measured = [t.values[0] for t in done if t.values and t.user_attrs.get("source") not in ESTIMATED]
        if not measured:
            return False
        best = min(measured) if minimize else max(measured)
        verdict = slow_verdict(
            values, best, min_iters=self.min_iters, margin=self.margin, z=self.z, minimize=minimize
        )
        if verdict is None:
            return False
        study._storage.set_trial_user_attr(trial._trial_id, PRUNE_REASON, verdict)
        return True


def study_pruner(spec: StudySpec, *, launches_jobs: bool, early_stop: bool = True) -> MemoryPrefilterPruner:
    """The pruner of a study: the memory prefilter, wrapping a :class:`ThroughputPruner` built from
    ``search.early_stop`` when the runner launches jobs, early stopping is enabled (study file and
    ``early_stop``) and the study is single-objective (Optuna's ``should_prune`` is single-objective only)."""
    es = spec.search.early_stop
    on = launches_jobs and early_stop and es.enabled and not spec.search.multi_objective
    return MemoryPrefilterPruner(spec=spec, wrapped=ThroughputPruner.from_spec(es) if on else None)
