"""The model-guided proposer: used when there is no planner, it fails, it is over budget, or it has no valid idea.

It ranks every untried, legal configuration that fits in memory by what the measurements so far say about it:

1. the step-time model's tokens/s/GPU, rescaled by the study's
   :class:`~primus_optuna.physics.calibration.Calibration` of its terms (compute, communication, bubble) —
   the prior mean;
2. a Gaussian process on the residual ``log(measured / calibrated estimate)`` over the nine categorical axes
   (:mod:`~primus_optuna.search.learner`): per-(axis, value) effects, which a one-axis sweep measures
   directly, plus pairwise and three-way interactions, which only combinations reveal;
3. the pick: the highest *expected improvement* (in log tokens/s) over the best measurement, so the
   corrected model's favourite is measured first and a configuration whose outcome is still uncertain (a pair
   of axis values never measured together) wins when its upside is larger. With probability
   ``exploration`` the pick is instead a seeded draw among the few best by expected improvement.

Every completed trial that is not analytical teaches it: its value is the measurement (plain Optuna
objectives included), see :func:`~primus_optuna.search.learner.trial_measurement`. Measurements imported
from earlier studies (``prior=`` :func:`~primus_optuna.search.learner.prior_observations`) join them with a
larger noise. Randomness derives from ``(seed, index)`` only, where ``index`` is the trial number
(storage-unique), so the choice is reproducible, resumable and thread-safe. For
a Pareto study the score is ``log(tokens/s) - w·log(peak GiB)`` with ``w`` drawn per trial from [0, 1].

Example::

    proposer = ModelGuidedProposer(spec, Space(spec))
    config, rationale = proposer.propose(study.trials, index=40, exclude=set())
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from ..physics.calibration import BREAKDOWN_TERMS, Calibration
from ..physics.memory import estimate_memory
from ..physics.throughput import ThroughputEstimate, estimate_throughput
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import AXES
from .learner import (
    NOISE,
    PRIOR_NOISE,
    Observation,
    Posterior,
    ResidualModel,
    measured_pairs,
    observations,
)

__all__ = [
    "AxisValueFactors",
    "ModelGuidedProposer",
    "Ranked",
    "calibration_from_trials",
    "corrected_tps",
    "measured_pairs",
    "rng_for",
]

EXPLORATION = 0.0
"""probability of a seeded draw among the :data:`TOP_K` best by expected improvement instead of the best
(expected improvement already explores; a draw only cost the benchmark, docs/benchmarks.md)"""
TOP_K = 5
"""exploration picks uniformly among this many best configurations by expected improvement"""
RIDGE = 1.0
"""ridge penalty on the per-(axis, value) log factors of :class:`AxisValueFactors`"""
MIN_PAIRS_FOR_AXIS_FACTORS = 3
UPPER_Z = 1.645
"""a candidate's upper bound is its expected log throughput plus this many standard deviations (one-sided 95%)"""
MIN_SHARE = 0.8
"""a candidate expected below this share of the best (measured, or expected of an untried one) is never launched"""


def estimated_peak(peak_gib: float, memory_scale: float = 1.0) -> str:
    """``estimated peak X GiB`` (``, calibrated ×s: Y GiB`` beside it when the study's memory calibration is
    not 1): how a rationale names a memory figure the model estimated, never to be read as a measurement."""
    text = f"estimated peak {peak_gib:.1f} GiB"
    if round(memory_scale, 3) != 1.0:
        text += f" (calibrated ×{memory_scale:.2f}: {peak_gib * memory_scale:.1f} GiB)"
    return text


@dataclass(frozen=True)
class Row:
    config: TrainingConfig
    estimate: ThroughputEstimate
    peak_gib: float
    key: str


@dataclass(frozen=True)
class Ranked:
    """One configuration of the corrected ranking."""

    config: TrainingConfig
    expected: float
    """expected tokens/s/GPU (calibrated model × exp(posterior mean residual))"""
    uncertainty: float
    """posterior standard deviation of log tokens/s (0.05 ≈ ±5%)"""
    estimate: float
    """the uncalibrated step-time model's tokens/s/GPU"""
    peak_gib: float


@dataclass(frozen=True)
class Worth:
    """Whether a proposed configuration is worth a launch under the corrected model (see
    :meth:`ModelGuidedProposer.judge`)."""

    expected: float
    """expected tokens/s/GPU"""
    uncertainty: float
    """standard deviation of log tokens/s"""
    share: float
    """``expected`` as a share of the reference (the best measured, or the best expected untried)"""
    ei_rank: int | None
    """rank (0 = first) among the untried feasible configurations by expected improvement"""
    upper_share: float
    """the upper bound (:data:`UPPER_Z` standard deviations) as a share of the reference: below
    :data:`MIN_SHARE`, the model is confident the configuration is worse"""
    worth: bool
    why: str
    """``value: expected ... : not worth a launch`` (or the accepted figure)"""


def rng_for(seed: int, index: int, salt: int = 0) -> np.random.Generator:
    """The generator of one draw: a pure function of ``(seed, index, salt)`` (``s`` and ``-s`` differ)."""
    return np.random.default_rng([int(seed) % 2**64, int(index) % 2**64, int(salt) % 2**64])


def calibration_from_trials(
    spec: StudySpec, space: Space, trials: list[optuna.trial.FrozenTrial]
) -> Calibration:
    """Fit a :class:`Calibration` from completed trials that were measured (not analytical)."""
    pairs = [(est, m) for _, est, m in measured_pairs(spec, space, trials)]
    return Calibration.fit(pairs) if pairs else Calibration()


class AxisValueFactors:
    """Per-(axis, value) multiplicative corrections, fitted by ridge regression in log space: the readable
    summary of what the measurements say about each axis value (the proposer itself ranks with the GP).

    Example::

        f = AxisValueFactors.fit(space, [(config, residual_log_ratio), ...])
        f.log_factor(config)  # sum of the log factors of its axis values
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

    def effects(self) -> dict[str, dict[Any, float]]:
        """``{axis: {value: log factor}}`` of every fitted feature."""
        out: dict[str, dict[Any, float]] = {}
        for (axis, value), j in self.features.items():
            out.setdefault(axis, {})[value] = float(self.beta[j])
        return out


def corrected_tps(est: ThroughputEstimate, cal: Calibration) -> float:
    if cal.is_identity:
        return est.tokens_per_s_per_gpu
    step = sum(est.breakdown_s.values())
    new = sum(cal.apply(est.breakdown_s).values())
    return est.tokens_per_s_per_gpu * step / new if new > 0 else 0.0


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


def expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """E[max(0, X - best)] for X ~ N(mean, sd²) (log scale)."""
    z = (mean - best) / sd
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (mean - best) * _norm_cdf(z) + sd * pdf


def untested_pairs(config: TrainingConfig, observed: Sequence[TrainingConfig]) -> list[tuple[str, str]]:
    """Pairs of ``config``'s axis values that were each measured but never in the same configuration: the
    interactions a pick probes (the residual model is least certain about them)."""
    seen_values = {(a, getattr(c, a)) for c in observed for a in AXES}
    values = [(a, getattr(config, a)) for a in AXES if (a, getattr(config, a)) in seen_values]
    out = []
    for i, (a, va) in enumerate(values):
        for b, vb in values[i + 1 :]:
            if not any(getattr(c, a) == va and getattr(c, b) == vb for c in observed):
                out.append((f"{a}={va}", f"{b}={vb}"))
    return out


@dataclass
class _Table:
    """Every legal configuration that fits at one memory scale, as arrays (built once per scale)."""

    rows: list[Row]
    index: dict[TrainingConfig, int]
    by_key: dict[str, int]
    log_tps: np.ndarray
    breakdown: np.ndarray
    """rows × BREAKDOWN_TERMS seconds"""
    model: ResidualModel


class Judge:
    """Whether a proposed configuration is worth a launch: its expected tokens/s/GPU is at least
    :data:`MIN_SHARE` of the reference (the best measured, or the best expected among untried ones when
    higher), and either its upper bound (:data:`UPPER_Z` standard deviations) reaches the reference or it is
    among the ``k`` best untried configurations by expected improvement (the fallback's own acquisition).
    Every configuration is worth a launch in a Pareto study (the gate is on throughput alone).

    Example::

        judge = fallback.judge(trials, exclude=covered)
        judge(config).why        # "value: expected 1,700 tokens/s/GPU (±8%), 32% of the best ...: not worth a launch"
        judge.shortlist(5)       # the best untried by expected improvement that are worth a launch
    """

    def __init__(
        self,
        table: _Table,
        total: np.ndarray,
        sd: np.ndarray,
        open_rows: Sequence[int],
        measured: Sequence[float],
        *,
        k: int = TOP_K,
        multi: bool = False,
    ) -> None:
        self.table, self.total, self.sd, self.k, self.multi = table, total, sd, k, multi
        self.n_measured = len(measured)
        """this study's measured trials the model learned from (0: the uncorrected model alone)"""
        rows = np.asarray(open_rows, dtype=int)
        top_open = float(np.max(total[rows])) if len(rows) else -math.inf
        best = max(measured) if measured else top_open
        self.ref = max(best, top_open)
        self.what = (
            f"the best ({math.exp(best):,.0f} measured)"
            if measured and best >= top_open
            else f"the best untried ({math.exp(self.ref):,.0f} expected)"
        )
        self.order: list[int] = []
        """open rows by expected improvement over the best, best first (ties by key)"""
        if len(rows):
            ei = expected_improvement(total[rows], sd[rows], best)
            keys = [table.rows[i].key for i in rows]
            self.order = [int(rows[j]) for j in sorted(range(len(rows)), key=lambda j: (-ei[j], keys[j]))]
        self.ranks = {i: n for n, i in enumerate(self.order)}

    def _verdict(self, i: int) -> Worth:
        exp_tps, s = math.exp(self.total[i]), float(self.sd[i])
        share = math.exp(self.total[i] - self.ref)
        rank = self.ranks.get(i)
        upper_ok = self.total[i] + UPPER_Z * s >= self.ref
        worth = self.multi or (share >= MIN_SHARE and (upper_ok or (rank is not None and rank < self.k)))
        figure = f"expected {exp_tps:,.0f} tokens/s/GPU (±{s:.0%}), {share:.0%} of {self.what}" + (
            f", #{rank + 1} by expected improvement" if rank is not None else ""
        )
        upper = math.exp(self.total[i] + UPPER_Z * s - self.ref)
        why = figure if worth else f"value: {figure}: not worth a launch"
        return Worth(exp_tps, s, share, rank, upper, worth, why)

    def __call__(self, config: TrainingConfig) -> Worth:
        i = self.table.index.get(config)
        if i is None:
            return Worth(
                0.0, 0.0, 0.0, None, 0.0, False, "memory: does not fit at the study's memory calibration"
            )
        return self._verdict(i)

    def first(self) -> Worth | None:
        """The verdict on the fallback's own pick (the first untried by expected improvement), if any."""
        return self._verdict(self.order[0]) if self.order else None

    def shortlist(self, k: int) -> list[tuple[Ranked, Worth]]:
        """The ``k`` best untried configurations by expected improvement that are worth a launch."""
        out = []
        for i in self.order:
            w = self._verdict(i)
            if w.worth:
                r = self.table.rows[i]
                ranked = Ranked(
                    r.config, w.expected, w.uncertainty, r.estimate.tokens_per_s_per_gpu, r.peak_gib
                )
                out.append((ranked, w))
                if len(out) >= k:
                    break
        return out


class ModelGuidedProposer:
    """Ranks untried feasible configurations by the corrected model; picks by expected improvement.

    Args:
        prior: observations imported from earlier studies (:func:`~primus_optuna.search.learner.
            prior_observations`), learned from with a larger noise than this study's own trials.
        relevance: per-axis weights of the residual model's per-value effects
            (:class:`~primus_optuna.search.learner.ResidualModel`); read when the candidate table is built.
    """

    def __init__(
        self,
        spec: StudySpec,
        space: Space,
        *,
        seed: int = 0,
        exploration: float = EXPLORATION,
        mode: str = "model",
        prior: Sequence[Observation] = (),
        relevance: Mapping[str, float] | None = None,
    ) -> None:
        if mode not in ("model", "random"):
            raise ValueError(f"fallback must be 'model' or 'random', got {mode!r}")
        self.spec, self.space, self.seed = spec, space, seed
        self.exploration, self.mode = exploration, mode
        self.prior = list(prior)
        self.relevance = dict(relevance) if relevance else None
        self._peaks: list[tuple[TrainingConfig, float]] | None = None
        self._usable = 0.0
        self._row_cache: dict[TrainingConfig, Row] = {}
        self._tables: dict[float, _Table] = {}
        self._learned: tuple[Any, Any] | None = None
        """the last fit, by its observations (see :meth:`learn`)"""
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_tables"] = {}  # rebuilt on first use (numpy tables of every feasible configuration)
        state["_learned"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("relevance", None)
        self.__dict__.update(state)
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

    def _rows_locked(self, memory_scale: float) -> list[Row]:
        peaks = self._all_peaks()
        out = []
        for c, peak in peaks:
            if peak * memory_scale <= self._usable:
                row = self._row_cache.get(c)
                if row is None:
                    row = self._row_cache[c] = Row(c, estimate_throughput(self.spec, c), peak, c.key())
                out.append(row)
        return out

    def rows(self, memory_scale: float = 1.0) -> list[Row]:
        """Every legal configuration whose peak × ``memory_scale`` (the study's memory calibration) fits,
        with its uncalibrated step-time estimate (each computed once)."""
        with self._lock:
            return self._rows_locked(memory_scale)

    def fits(self, config: TrainingConfig, memory_scale: float = 1.0) -> bool:
        """Whether a legal configuration fits (the same test as :meth:`rows`)."""
        return config in self._table(memory_scale).index

    def _table(self, memory_scale: float) -> _Table:
        key = round(float(memory_scale), 6)
        with self._lock:
            table = self._tables.get(key)
            if table is None:
                rows = self._rows_locked(memory_scale)
                table = _Table(
                    rows,
                    {r.config: i for i, r in enumerate(rows)},
                    {r.key: i for i, r in enumerate(rows)},
                    np.log(np.maximum([r.estimate.tokens_per_s_per_gpu for r in rows], 1e-9)),
                    np.array([[r.estimate.breakdown_s.get(t, 0.0) for t in BREAKDOWN_TERMS] for r in rows]),
                    ResidualModel(self.space, [r.config for r in rows], self.relevance),
                )
                if len(self._tables) > 8:  # memory calibrations change rarely; keep a few
                    self._tables.pop(next(iter(self._tables)))
                self._tables[key] = table
            return table

    def estimate_of(self, config: TrainingConfig) -> float | None:
        """The model's tokens/s/GPU of a legal configuration that fits at the model's memory (else ``None``)."""
        table = self._table(1.0)
        i = table.index.get(config)
        return None if i is None else table.rows[i].estimate.tokens_per_s_per_gpu

    # --- the corrected model -----------------------------------------------------------------------------
    def learn(
        self,
        trials: list[optuna.trial.FrozenTrial],
        memory_scale: float = 1.0,
        extra: Sequence[Observation] = (),
    ) -> tuple[Calibration, Posterior, _Table, np.ndarray, list[Observation]]:
        """Fit the Calibration and the residual GP to the study's measurements, the prior ones given at
        construction and ``extra`` (a warm start's imported pairs, read from the study at each call)."""
        table = self._table(memory_scale)
        obs = observations(self.space, trials) + self.prior + list(extra)
        # one fit per set of observations: the sweep's judge and the pick of one decision share it
        key = (
            (round(float(memory_scale), 6), tuple((o.config, o.measured, o.prior) for o in obs))
            if all(o.estimate is None for o in obs)
            else None
        )
        learned = getattr(self, "_learned", None)
        if key is not None and learned is not None and learned[0] == key:
            return learned[1]
        ests = [o.estimate if o.estimate is not None else self._estimate(o.config) for o in obs]
        cal = (
            Calibration.fit(list(zip(ests, [o.measured for o in obs], strict=True))) if obs else Calibration()
        )
        prior_log = self._prior_log(table, cal)
        residuals = [
            math.log(o.measured / max(corrected_tps(e, cal), 1e-9)) for o, e in zip(obs, ests, strict=True)
        ]
        post = table.model.fit(
            [o.config for o in obs], residuals, [PRIOR_NOISE if o.prior else NOISE for o in obs]
        )
        if key is not None:
            self._learned = (key, (cal, post, table, prior_log, obs))
        return cal, post, table, prior_log, obs

    def _estimate(self, config: TrainingConfig) -> ThroughputEstimate:
        row = self._row_cache.get(config)
        return row.estimate if row is not None else estimate_throughput(self.spec, config)

    @staticmethod
    def _prior_log(table: _Table, cal: Calibration) -> np.ndarray:
        if cal.is_identity or not len(table.rows):
            return table.log_tps
        factors = np.array([cal.factor(t) for t in BREAKDOWN_TERMS])
        step = table.breakdown.sum(axis=1)
        new = table.breakdown @ factors
        return table.log_tps + np.log(np.maximum(step, 1e-12) / np.maximum(new, 1e-12))

    def ranking(
        self,
        trials: list[optuna.trial.FrozenTrial],
        *,
        k: int = 10,
        exclude: set[TrainingConfig] = frozenset(),  # type: ignore[assignment]
        memory_scale: float = 1.0,
        prior: Sequence[Observation] = (),
    ) -> list[Ranked]:
        """The ``k`` untried feasible configurations with the highest expected tokens/s/GPU under the
        corrected model (what the planner sees as context)."""
        _, post, table, prior_log, _ = self.learn(trials, memory_scale, prior)
        mean, sd = post.predict()
        total = prior_log + mean
        order = np.argsort(-total, kind="stable")
        out = []
        for i in order:
            r = table.rows[i]
            if r.config in exclude:
                continue
            out.append(
                Ranked(
                    r.config,
                    float(math.exp(total[i])),
                    float(sd[i]),
                    r.estimate.tokens_per_s_per_gpu,
                    r.peak_gib,
                )
            )
            if len(out) >= k:
                break
        return out

    def judge(
        self,
        trials: list[optuna.trial.FrozenTrial],
        *,
        exclude: set[TrainingConfig] = frozenset(),  # type: ignore[assignment]
        memory_scale: float = 1.0,
        prior: Sequence[Observation] = (),
        k: int = TOP_K,
    ) -> Judge:
        """The gate on proposed configurations (the LLM planner's) with the acquisition :meth:`propose` uses,
        learned once (see :class:`Judge`)."""
        _, post, table, prior_log, obs = self.learn(trials, memory_scale, prior)
        mean, sd = post.predict()
        open_rows = [i for i, r in enumerate(table.rows) if r.config not in exclude]
        measured = [math.log(o.measured) for o in obs if not o.prior]
        return Judge(
            table, prior_log + mean, sd, open_rows, measured, k=k, multi=self.spec.search.multi_objective
        )

    def propose(
        self,
        trials: list[optuna.trial.FrozenTrial],
        *,
        index: int,
        exclude: set[TrainingConfig],
        exclude_keys: set[str] = frozenset(),  # type: ignore[assignment]
        skip: int = 0,
        memory_scale: float = 1.0,
        prior: Sequence[Observation] = (),
    ) -> tuple[TrainingConfig, str] | None:
        """The next configuration and a one-line rationale, or ``None`` when every feasible one was tried.

        ``index`` seeds the exploration (the sampler passes its count of earlier free trials); ``exclude`` and
        ``exclude_keys`` (configuration keys claimed by running trials) are never proposed; ``skip`` leaves
        that many best-ranked picks to earlier trials still being sampled by other workers; ``memory_scale``
        is the study's memory calibration (a configuration is feasible when its peak × scale fits); ``prior``
        are observations from elsewhere (a warm start's imported pairs) learned with the trials'."""
        rng = rng_for(self.seed, index)
        table = self._table(memory_scale)
        closed = np.zeros(len(table.rows), dtype=bool)
        for c in exclude:
            if (i := table.index.get(c)) is not None:
                closed[i] = True
        for k in exclude_keys:
            if (i := table.by_key.get(k)) is not None:
                closed[i] = True
        open_idx = np.flatnonzero(~closed)
        if not len(open_idx):
            return None
        if self.mode == "random":
            row = table.rows[int(open_idx[int(rng.integers(len(open_idx)))])]
            return row.config, f"random: one of {len(open_idx)} untried feasible configurations"
        cal, post, table, prior_log, obs = self.learn(trials, memory_scale, prior)
        mean, sd = post.predict(open_idx)
        total = prior_log[open_idx] + mean
        multi = self.spec.search.multi_objective
        w = float(rng.uniform(0.0, 1.0)) if multi else 0.0
        if multi:
            peaks = np.log(np.maximum([table.rows[i].peak_gib for i in open_idx], 1e-3))
            score = total + 0.5 * sd - w * peaks
        elif obs:
            best = (
                max(math.log(o.measured) for o in obs if not o.prior)
                if any(not o.prior for o in obs)
                else float(np.max(total))
            )
            score = expected_improvement(total, sd, best)
        else:
            score = total
        # ties (e.g. equal estimates) break by key, so the choice does not depend on enumeration details
        keys = [table.rows[i].key for i in open_idx]
        n_head = max(TOP_K, skip + 1)
        head = sorted(np.argsort(-score, kind="stable")[: n_head * 4], key=lambda j: (-score[j], keys[j]))[
            :n_head
        ]
        explore = rng.random() < self.exploration
        pick = int(rng.integers(min(TOP_K, len(head)))) if explore else min(skip, len(head) - 1)
        j = head[pick]
        row = table.rows[int(open_idx[j])]
        expected = math.exp(total[j])
        n_trial = sum(1 for o in obs if not o.prior)
        n_prior = len(obs) - n_trial
        if obs:
            how = f"learned from {n_trial} measured trials" + (
                f" and {n_prior} prior ones" if n_prior else ""
            )
            how += f", ±{sd[j]:.0%} uncertain"
        else:
            how = "uncalibrated model, nothing measured yet"
        what = (
            f"exploration pick {pick + 1} of the top {len(head[:TOP_K])}"
            if explore
            else (
                "best" if pick == 0 else f"pick {pick + 1} (the better ones left to {pick} concurrent trials)"
            )
        )
        crit = "expected improvement" if obs and not multi else "expected throughput"
        probe = untested_pairs(row.config, [o.config for o in obs])
        if probe:
            how += (
                "; probes "
                + ", ".join(f"{x} with {y}" for x, y in probe[:2])
                + " (each measured, never together)"
            )
        obj = f" (Pareto weight w={w:.2f} on log peak memory)" if multi else ""
        return row.config, (
            f"model-guided {what} by {crit} of {len(open_idx)} untried feasible configurations{obj}: "
            f"{expected:.0f} tokens/s/GPU expected ({how}; model estimate "
            f"{row.estimate.tokens_per_s_per_gpu:.0f}), {estimated_peak(row.peak_gib, memory_scale)}"
        )
