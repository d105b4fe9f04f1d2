"""What measured trials teach the search: a Gaussian process on the step-time model's log residual.

Every completed trial that is not analytical is a measurement: its value is the tokens/s/GPU the cluster
reached (the ``measured_tokens_per_s_per_gpu`` attr, when present, is the same number). The model of a
configuration's throughput is::

    log tps(c) = log estimate(c)            the step-time model (after the study's Calibration), prior mean
               + r(c),   r ~ GP(m, k)       what the model misses, learned from log(measured / estimate)

with a constant mean ``m`` (the mean residual) and a kernel over the nine categorical axes that depends on
``S(c, c')`` = the number of axes on which the two configurations agree::

    k(c, c') = s1·S + s2·C(S, 2) + s3·C(S, 3)

which is exactly the covariance of a sum of random per-(axis, value) effects (variance ``s1``), pairwise
(axis-value, axis-value) interactions (``s2``) and three-way ones (``s3``). A one-axis sweep therefore
measures per-axis-value effects directly, and a pair never measured together keeps the uncertainty of its
interaction term. ``s1, s2`` are chosen by marginal likelihood on a small grid once enough trials exist;
before then a measurement counts as noisier (:data:`EARLY_NOISE`), so one early surprise is not all carried to
its neighbours.
With ``relevance`` (per axis, mean 1 over the axes that vary) the first term becomes ``s1·Σ_a r_a·[c_a = c'_a]``:
an axis believed to matter more gets a larger per-value effect (automatic relevance determination with the
weights given, not learned; none by default).
The posterior mean and standard deviation of every feasible configuration are one small linear solve away
(``n ≤`` a few hundred observations, one matrix product per proposal).

Observations from elsewhere (an earlier study of the same model and cluster) enter through
:meth:`ResidualModel.fit`'s ``prior`` argument, see :func:`prior_observations`: they are treated as
measurements with a larger noise, so this study's own trials outweigh them.

Example::

    model = ResidualModel(space, configs)            # configs: the candidates, encoded once
    post = model.fit(observed_configs, log_residuals)
    mean, std = post.predict()                       # per candidate, log scale
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from ..physics.throughput import ThroughputEstimate, estimate_throughput
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import AXES
from .configs import trial_config

NOISE = 0.02
"""standard deviation of one measurement in log space (run-to-run variation of a training job: ~1-3%)"""
PRIOR_NOISE = 0.06
"""the same for an observation imported from another study (other software versions, other day)"""
MAIN_SD = (0.04, 0.08, 0.15, 0.25)
"""grid of the per-(axis, value) effect's standard deviation (log scale) tried by marginal likelihood"""
PAIR_SD = (0.01, 0.03, 0.06)
"""grid of the pairwise interaction's standard deviation"""
DEFAULT_SD = (0.08, 0.04)
"""(main, pair) used until :data:`MIN_FOR_HYPERPARAMETERS` observations exist"""
MIN_FOR_HYPERPARAMETERS = 8
EARLY_NOISE = 0.06
"""a measurement's standard deviation while the hyperparameters are :data:`DEFAULT_SD` (fewer than
:data:`MIN_FOR_HYPERPARAMETERS` observations): one of the first measurements missing its estimate is partly
its own (a kernel or collective algorithm that configuration alone picks), not all a per-axis effect its
neighbours share. Fitted to the vTrain A100 replay (``scripts/bench_measured.py``, split seeds 0-3): with 0.02
the learner's reading of one low early measurement reordered the model's near-tied #3 and #4 and left the
measured best unmeasured after 3 trials; 0.04 still missed on 1 landscape on two of the four splits, 0.06 on
none. On the synthetic landscapes (``scripts/bench_search.py``, not used to choose it) medians moved by -3.6 to
+1.2 points and worst seeds by -7.4 to +11.5 (docs/benchmarks.md, search-held-back)"""
TRIPLE_RATIO = 0.5
"""three-way interactions' standard deviation as a fraction of the pairwise one (hidden cross-axis synergies)"""


@dataclass(frozen=True)
class Observation:
    """One (configuration, measured tokens/s/GPU) pair; ``prior`` marks one imported from another study, whose
    ``estimate`` (when given) is the model's figure the measurement is compared with (a warm start re-estimates
    an earlier configuration under the new study, or keeps the earlier estimate when it is not legal here)."""

    config: TrainingConfig
    measured: float
    prior: bool = False
    estimate: ThroughputEstimate | None = None


def trial_measurement(t: optuna.trial.FrozenTrial) -> float | None:
    """The measured tokens/s/GPU of a completed trial: its value (the attr when present), ``None`` for an
    analytical trial (the estimate itself) or one without a positive value. A job stopped early for being slow
    (PRUNED with ``measured_partial``) counts with the median of the iterations it ran, and so does a trial a
    plain objective's pruner stopped (e.g. ``MedianPruner``: PRUNED with intermediate values and no
    ``prune_reason`` of this package), the median of its reported values: the model-guided phase learns that
    such configurations are slow instead of proposing them again."""
    partial = t.state == optuna.trial.TrialState.PRUNED and bool(t.user_attrs.get("measured_partial"))
    if t.user_attrs.get("source") == "analytical":
        return None
    if plain_pruned(t):
        return _positive(statistics.median(v for v in t.intermediate_values.values() if math.isfinite(v)))
    if t.state != optuna.trial.TrialState.COMPLETE and not partial:
        return None
    measured = t.user_attrs.get("measured_tokens_per_s_per_gpu")
    if measured is None and t.values:
        measured = t.values[0]
    try:
        value = float(measured) if measured is not None else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and value > 0 and math.isfinite(value) else None


def plain_pruned(t: optuna.trial.FrozenTrial) -> bool:
    """A trial stopped by a user's pruner after reporting (not pruned before launch by this package)."""
    return (
        t.state == optuna.trial.TrialState.PRUNED
        and not t.user_attrs.get("prune_reason")
        and any(math.isfinite(v) for v in t.intermediate_values.values())
    )


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 and math.isfinite(value) else None


def observations(space: Space, trials: Iterable[optuna.trial.FrozenTrial]) -> list[Observation]:
    """Every completed, non-analytical trial as an :class:`Observation` (plain objectives included)."""
    out = []
    for t in trials:
        measured = trial_measurement(t)
        if measured is None:
            continue
        config = trial_config(space, t)
        if config is not None:
            out.append(Observation(config, measured))
    return out


def prior_observations(
    space: Space, pairs: Iterable[tuple[TrainingConfig | dict[str, Any], float]]
) -> list[Observation]:
    """Measurements from earlier studies as :class:`Observation` s with ``prior=True``: the entry point for a
    warm start. ``pairs`` are ``(configuration or its axis params, measured tokens/s/GPU)``; configurations
    outside this study's axes still count (their values simply match nothing here), non-positive
    measurements are dropped."""
    out = []
    for config, measured in pairs:
        if isinstance(config, dict):
            config = TrainingConfig.from_params({a: config[a] for a in AXES if a in config})
        if measured and measured > 0:
            out.append(Observation(space.canonical(config), float(measured), prior=True))
    return out


def measured_pairs(
    spec: StudySpec, space: Space, trials: list[optuna.trial.FrozenTrial]
) -> list[tuple[TrainingConfig, ThroughputEstimate, float]]:
    """(config, estimate, measured tokens/s/GPU) of every completed, non-analytical trial."""
    return [(o.config, estimate_throughput(spec, o.config), o.measured) for o in observations(space, trials)]


class Encoding:
    """Integer codes of configurations per axis (an axis with one candidate is left out: it never differs)."""

    def __init__(self, space: Space) -> None:
        self.axes = [a for a in AXES if len(space.candidates[a]) > 1]
        self.codes = {a: {v: i for i, v in enumerate(space.candidates[a])} for a in self.axes}

    def encode(self, configs: Sequence[TrainingConfig]) -> np.ndarray:
        """``len(configs) × n_axes`` codes; a value outside the candidates gets -1-axis (matches nothing)."""
        x = np.empty((len(configs), len(self.axes)), dtype=np.int16)
        for j, a in enumerate(self.axes):
            codes = self.codes[a]
            x[:, j] = [codes.get(getattr(c, a), -1 - j) for c in configs]
        return x


def _kernel_of_matches(
    s: np.ndarray, main: float, pair: float, weighted: np.ndarray | None = None
) -> np.ndarray:
    """The kernel from the match count ``s`` (``weighted``: the relevance-weighted count of the main term)."""
    triple = pair * TRIPLE_RATIO
    w = s if weighted is None else weighted
    return main**2 * w + pair**2 * s * (s - 1) / 2 + triple**2 * s * (s - 1) * (s - 2) / 6


def _matches(a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """``S[i, j]`` = the number of axes on which row ``i`` of ``a`` and row ``j`` of ``b`` agree (each axis
    counted with its weight when ``weights`` is given)."""
    s = np.zeros((len(a), len(b)))
    for j in range(a.shape[1]):
        eq = a[:, j, None] == b[None, :, j]
        s += eq if weights is None else weights[j] * eq
    return s


@dataclass
class Posterior:
    """The fitted residual GP: predicts the log residual of the encoded candidates."""

    candidates: np.ndarray
    observed: np.ndarray
    alpha: np.ndarray
    chol: np.ndarray | None
    mean0: float
    main: float
    pair: float
    n: int
    weights: np.ndarray | None = None
    """per-axis relevance of the main term (``None``: every axis 1)"""

    def _kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        weighted = None if self.weights is None else _matches(a, b, self.weights)
        return _kernel_of_matches(_matches(a, b), self.main, self.pair, weighted)

    def predict(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation (log scale) of the candidates (or the ``rows`` subset)."""
        cand = self.candidates if rows is None else self.candidates[rows]
        s_self = np.full(len(cand), float(cand.shape[1]))
        w_self = None if self.weights is None else np.full(len(cand), float(self.weights.sum()))
        prior_var = _kernel_of_matches(s_self, self.main, self.pair, w_self)
        if self.n == 0 or self.chol is None:
            return np.full(len(cand), self.mean0), np.sqrt(prior_var)
        k = self._kernel(cand, self.observed)
        mean = self.mean0 + k @ self.alpha
        v = np.linalg.solve(self.chol, k.T)
        var = np.maximum(prior_var - (v * v).sum(axis=0), 1e-12)
        return mean, np.sqrt(var)


class ResidualModel:
    """The GP on log(measured / estimate) over a fixed set of candidate configurations (encoded once).

    ``relevance``: per-axis weights of the main term (rescaled to mean 1 over the axes that vary; an axis left
    out weighs 1)."""

    def __init__(
        self,
        space: Space,
        candidates: Sequence[TrainingConfig],
        relevance: Mapping[str, float] | None = None,
    ) -> None:
        self.encoding = Encoding(space)
        self.candidates = self.encoding.encode(candidates)
        self.weights: np.ndarray | None = None
        if relevance and self.encoding.axes:
            w = np.array([max(float(relevance.get(a, 1.0)), 0.0) for a in self.encoding.axes])
            if w.sum() <= 0:
                raise ValueError("relevance: at least one varying axis needs a positive weight")
            self.weights = w * len(w) / w.sum()

    def fit(
        self,
        configs: Sequence[TrainingConfig],
        residuals: Sequence[float],
        noise: Sequence[float] | None = None,
    ) -> Posterior:
        """Condition on observed log residuals (``noise``: per-observation standard deviations)."""
        n = len(configs)
        if n == 0:
            main, pair = DEFAULT_SD
            return Posterior(
                self.candidates, np.zeros((0, 0)), np.zeros(0), None, 0.0, main, pair, 0, self.weights
            )
        x = self.encoding.encode(configs)
        y = np.asarray(residuals, dtype=float)
        sd = np.asarray(noise if noise is not None else [NOISE] * n, dtype=float)
        if n < MIN_FOR_HYPERPARAMETERS:
            sd = np.maximum(sd, EARLY_NOISE)
        mean0 = float(np.average(y, weights=1.0 / sd**2))
        s = _matches(x, x)
        weighted = None if self.weights is None else _matches(x, x, self.weights)
        grid = [(m, p) for m in MAIN_SD for p in PAIR_SD] if n >= MIN_FOR_HYPERPARAMETERS else [DEFAULT_SD]
        best: tuple[float, float, float, np.ndarray, np.ndarray] | None = None
        for main, pair in grid:
            kxx = _kernel_of_matches(s, main, pair, weighted) + np.diag(sd**2)
            try:
                chol = np.linalg.cholesky(kxx)
            except np.linalg.LinAlgError:
                continue
            alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y - mean0))
            # log marginal likelihood (up to a constant)
            lml = -0.5 * float((y - mean0) @ alpha) - float(np.log(np.diag(chol)).sum())
            if best is None or lml > best[0]:
                best = (lml, main, pair, chol, alpha)
        if best is None:  # numerically singular (cannot happen with a positive noise): no correction
            main, pair = DEFAULT_SD
            return Posterior(
                self.candidates, np.zeros((0, 0)), np.zeros(0), None, mean0, main, pair, 0, self.weights
            )
        _, main, pair, chol, alpha = best
        return Posterior(self.candidates, x, alpha, chol, mean0, main, pair, n, self.weights)
