"""The model-guided proposer: used when there is no planner, it fails, it is over budget, or it has no valid idea.

It ranks every untried, legal configuration that fits in memory by the step-time model's tokens/s/GPU, corrected
in two steps from the completed trials' (estimate, measurement) pairs — a
:class:`~primus_optuna.physics.calibration.Calibration` of the model's terms (compute, communication,
bubble), then a per-(axis, value) factor: a ridge regression of log(measured / calibrated estimate) on one-hot
axis values, so an effect the model misses for one value (a slow kernel for mbs=1, a dispatcher that
underperforms on this fabric) carries over to every untried configuration with that value. It picks the best —
or, with probability ``exploration``, a random one of the top few.
Randomness derives from ``(seed, index)`` only, where ``index`` is the sampler's storage-derived count of
earlier free trials (unchanged by heartbeat retries), so the choice is reproducible, resumable and thread-safe.
For a Pareto study the score is ``log(tokens/s) - w·log(peak GiB)`` with ``w`` drawn per trial from [0, 1].

Example::

    proposer = ModelGuidedProposer(spec, Space(spec))
    config, rationale = proposer.propose(study.trials, index=40, exclude=set())
"""

from __future__ import annotations

import heapq
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from ..physics.calibration import Calibration
from ..physics.memory import estimate_memory
from ..physics.throughput import ThroughputEstimate, estimate_throughput
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from .suggest import complete_config

EXPLORATION = 0.2
TOP_K = 20
"""exploration picks uniformly among this many best-ranked untried configurations"""
RIDGE = 1.0
"""ridge penalty on the per-(axis, value) log factors: with few measurements they stay near 0 (no correction);
one measurement that deviates by d moves its values' factors by about d/2"""
MIN_PAIRS_FOR_AXIS_FACTORS = 3


@dataclass(frozen=True)
class Row:
    config: TrainingConfig
    estimate: ThroughputEstimate
    peak_gib: float
    key: str


def rng_for(seed: int, index: int, salt: int = 0) -> np.random.Generator:
    """The generator of one draw: a pure function of ``(seed, index, salt)``."""
    return np.random.default_rng([abs(int(seed)), int(index), salt])


def measured_pairs(
    spec: StudySpec, space: Space, trials: list[optuna.trial.FrozenTrial]
) -> list[tuple[TrainingConfig, ThroughputEstimate, float]]:
    """(config, estimate, measured tokens/s/GPU) of every completed, measured (not analytical) trial, and of
    every job stopped early for being slow (``measured_partial``: the median of the iterations it ran)."""
    pairs: list[tuple[TrainingConfig, ThroughputEstimate, float]] = []
    for t in trials:
        partial = t.state == optuna.trial.TrialState.PRUNED and bool(t.user_attrs.get("measured_partial"))
        if (t.state != optuna.trial.TrialState.COMPLETE and not partial) or t.user_attrs.get(
            "source", "analytical"
        ) == "analytical":
            continue
        measured = t.user_attrs.get("measured_tokens_per_s_per_gpu")
        config = complete_config(space, t.params)
        if measured and config is not None:
            pairs.append((config, estimate_throughput(spec, config), float(measured)))
    return pairs


def calibration_from_trials(
    spec: StudySpec, space: Space, trials: list[optuna.trial.FrozenTrial]
) -> Calibration:
    """Fit a :class:`Calibration` from completed trials that were measured (not analytical)."""
    pairs = [(est, m) for _, est, m in measured_pairs(spec, space, trials)]
    return Calibration.fit(pairs) if pairs else Calibration()


class AxisValueFactors:
    """Per-(axis, value) multiplicative corrections, fitted by ridge regression in log space.

    Example::

        f = AxisValueFactors.fit(space, [(config, residual_log_ratio), ...])
        f.factor(config)  # exp(sum of the factors of its axis values)
    """

    def __init__(self, features: dict[tuple[str, Any], int], beta: np.ndarray) -> None:
        self.features, self.beta = features, beta

    @classmethod
    def identity(cls) -> AxisValueFactors:
        return cls({}, np.zeros(0))

    @staticmethod
    def feature_index(space: Space) -> dict[tuple[str, Any], int]:
        """One feature per candidate value of every axis that has more than one."""
        index: dict[tuple[str, Any], int] = {}
        for axis, values in space.candidates.items():
            if len(values) > 1:
                for v in values:
                    index[(axis, v)] = len(index)
        return index

    @classmethod
    def fit(
        cls, space: Space, samples: list[tuple[TrainingConfig, float]], ridge: float = RIDGE
    ) -> AxisValueFactors:
        if len(samples) < MIN_PAIRS_FOR_AXIS_FACTORS:
            return cls.identity()
        index = cls.feature_index(space)
        x = np.zeros((len(samples), len(index)))
        for i, (c, _) in enumerate(samples):
            for j in cls.columns(index, c):
                x[i, j] = 1.0
        y = np.array([r for _, r in samples])
        y = y - y.mean()  # the global level is the Calibration's job
        beta = np.linalg.solve(x.T @ x + ridge * np.eye(len(index)), x.T @ y)
        return cls(index, beta)

    @staticmethod
    def columns(index: dict[tuple[str, Any], int], config: TrainingConfig) -> list[int]:
        return [j for a, v in config.to_params().items() if (j := index.get((a, v))) is not None]

    @property
    def is_identity(self) -> bool:
        return not self.beta.size or not np.any(self.beta)

    def log_factor(self, config: TrainingConfig) -> float:
        return (
            float(sum(self.beta[j] for j in self.columns(self.features, config))) if self.beta.size else 0.0
        )


def corrected_tps(est: ThroughputEstimate, cal: Calibration) -> float:
    if cal.is_identity:
        return est.tokens_per_s_per_gpu
    step = sum(est.breakdown_s.values())
    new = sum(cal.apply(est.breakdown_s).values())
    return est.tokens_per_s_per_gpu * step / new if new > 0 else 0.0


class ModelGuidedProposer:
    """Ranks untried feasible configurations by the calibrated estimate; seeded exploration."""

    def __init__(
        self,
        spec: StudySpec,
        space: Space,
        *,
        seed: int = 0,
        exploration: float = EXPLORATION,
        mode: str = "model",
    ) -> None:
        if mode not in ("model", "random"):
            raise ValueError(f"fallback must be 'model' or 'random', got {mode!r}")
        self.spec, self.space, self.seed = spec, space, seed
        self.exploration, self.mode = exploration, mode
        self._peaks: list[tuple[TrainingConfig, float]] | None = None
        self._usable = 0.0
        self._row_cache: dict[TrainingConfig, Row] = {}
        self._onehot: tuple[dict[TrainingConfig, int], np.ndarray] | None = None
        self._lock = threading.Lock()

    def _all_peaks(self) -> list[tuple[TrainingConfig, float]]:
        """Every legal configuration with its estimated peak memory (computed once)."""
        if self._peaks is None:
            peaks = []
            for c in self.space.configs():
                mem = estimate_memory(self.spec, c)
                peaks.append((c, mem.peak_gib))
                self._usable = mem.usable_gib
            self._peaks = peaks
        return self._peaks

    def rows(self, memory_scale: float = 1.0) -> list[Row]:
        """Every legal configuration whose peak × ``memory_scale`` (the study's memory calibration) fits,
        with its uncalibrated step-time estimate (each computed once)."""
        with self._lock:
            peaks = self._all_peaks()
            out = []
            for c, peak in peaks:
                if peak * memory_scale <= self._usable:
                    row = self._row_cache.get(c)
                    if row is None:
                        row = self._row_cache[c] = Row(c, estimate_throughput(self.spec, c), peak, c.key())
                    out.append(row)
            return out

    def _log_factors(self, factors: AxisValueFactors) -> dict[TrainingConfig, float]:
        """Every legal configuration's log correction (one matrix product over cached one-hot rows)."""
        if factors.is_identity:
            return {}
        with self._lock:
            configs = [c for c, _ in self._all_peaks()]
            if self._onehot is None:
                index = AxisValueFactors.feature_index(self.space)
                x = np.zeros((len(configs), len(index)))
                for i, c in enumerate(configs):
                    x[i, AxisValueFactors.columns(index, c)] = 1.0
                self._onehot = ({c: i for i, c in enumerate(configs)}, x)
            _, x = self._onehot
        values = x @ factors.beta
        return {c: float(v) for c, v in zip(configs, values, strict=True)}

    def propose(
        self,
        trials: list[optuna.trial.FrozenTrial],
        *,
        index: int,
        exclude: set[TrainingConfig],
        exclude_keys: set[str] = frozenset(),  # type: ignore[assignment]
        skip: int = 0,
        memory_scale: float = 1.0,
        prior: list[tuple[TrainingConfig, ThroughputEstimate, float]] | None = None,
    ) -> tuple[TrainingConfig, str] | None:
        """The next configuration and a one-line rationale, or ``None`` when every feasible one was tried.

        ``index`` seeds the exploration (the sampler passes its count of earlier free trials); ``exclude`` and
        ``exclude_keys`` (configuration keys claimed by running trials) are never proposed; ``skip`` leaves
        that many best-ranked picks to earlier trials still being sampled by other workers; ``memory_scale``
        is the study's memory calibration (a configuration is feasible when its peak × scale fits); ``prior``
        are (configuration, estimate, measured) pairs from elsewhere (a warm start) fitted with the trials'."""
        rng = rng_for(self.seed, index)
        untried = [
            r for r in self.rows(memory_scale) if r.config not in exclude and r.key not in exclude_keys
        ]
        if not untried:
            return None
        if self.mode == "random":
            row = untried[int(rng.integers(len(untried)))]
            return row.config, f"random: one of {len(untried)} untried feasible configurations"
        pairs = list(prior or []) + measured_pairs(self.spec, self.space, trials)
        cal = Calibration.fit([(est, m) for _, est, m in pairs]) if pairs else Calibration()
        factors = AxisValueFactors.fit(
            self.space,
            [(c, math.log(m / max(corrected_tps(est, cal), 1e-9))) for c, est, m in pairs if m > 0],
        )
        multi = self.spec.search.multi_objective
        w = float(rng.uniform(0.0, 1.0)) if multi else 0.0

        log_f = self._log_factors(factors)

        def expected(r: Row) -> float:
            return corrected_tps(r.estimate, cal) * math.exp(log_f.get(r.config, 0.0))

        def score(r: Row) -> float:
            tps = expected(r)
            if not multi:
                return tps
            return math.log(max(tps, 1e-9)) - w * math.log(max(r.peak_gib, 1e-3))

        k = TOP_K
        # only the head of the ranking is ever used: the top k for exploration, or the skip-th best
        ranked = heapq.nsmallest(max(k, skip + 1), untried, key=lambda r: (-score(r), r.key))
        explore = rng.random() < self.exploration
        idx = int(rng.integers(min(k, len(ranked)))) if explore else min(skip, len(ranked) - 1)
        row = ranked[idx]
        tps = expected(row)
        how = f"calibrated on {cal.n_trials} measured trials" if not cal.is_identity else "uncalibrated model"
        if not factors.is_identity:
            how += " with per-axis-value factors"
        what = (
            f"exploration pick {idx + 1} of the top {min(k, len(ranked))}"
            if explore
            else ("best" if idx == 0 else f"pick {idx + 1} (the better ones left to {idx} concurrent trials)")
        )
        obj = f" (Pareto weight w={w:.2f} on log peak memory)" if multi else ""
        return row.config, (
            f"model-guided {what} of {len(untried)} untried feasible configurations{obj}: "
            f"{tps:.0f} tokens/s/GPU expected ({how}), peak {row.peak_gib:.1f} GiB"
        )
