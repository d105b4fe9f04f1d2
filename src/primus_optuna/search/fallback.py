"""The model-guided proposer: used when there is no planner, it fails, it is over budget, or it has no valid idea.

It ranks every untried, legal configuration that fits in memory by the step-time model's tokens/s/GPU, corrected
by a :class:`~primus_optuna.physics.calibration.Calibration` fitted from the completed trials' (estimate,
measurement) pairs, and picks the best — or, with probability ``exploration``, a random one of the top few.
Randomness derives from ``(seed, index)`` only, where ``index`` is the sampler's storage-derived count of
earlier free trials (unchanged by heartbeat retries), so the choice is reproducible, resumable and thread-safe.
For a Pareto study the score is ``log(tokens/s) - w·log(peak GiB)`` with ``w`` drawn per trial from [0, 1].

Example::

    proposer = ModelGuidedProposer(spec, Space(spec))
    config, rationale = proposer.propose(study.trials, index=40, exclude=set())
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Row:
    config: TrainingConfig
    estimate: ThroughputEstimate
    peak_gib: float


def rng_for(seed: int, index: int, salt: int = 0) -> np.random.Generator:
    """The generator of one draw: a pure function of ``(seed, index, salt)``."""
    return np.random.default_rng([abs(int(seed)), int(index), salt])


def calibration_from_trials(
    spec: StudySpec, space: Space, trials: list[optuna.trial.FrozenTrial]
) -> Calibration:
    """Fit a :class:`Calibration` from completed trials that were measured (not analytical)."""
    pairs: list[tuple[Any, float]] = []
    for t in trials:
        if (
            t.state != optuna.trial.TrialState.COMPLETE
            or t.user_attrs.get("source", "analytical") == "analytical"
        ):
            continue
        measured = t.user_attrs.get("measured_tokens_per_s_per_gpu")
        config = complete_config(space, t.params)
        if measured and config is not None:
            pairs.append((estimate_throughput(spec, config), float(measured)))
    return Calibration.fit(pairs) if pairs else Calibration()


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
        self._rows: list[Row] | None = None
        self._lock = threading.Lock()

    def rows(self) -> list[Row]:
        """Every legal configuration that fits in memory, with its (uncalibrated) estimate; computed once."""
        with self._lock:
            if self._rows is None:
                rows = []
                for c in self.space.configs():
                    mem = estimate_memory(self.spec, c)
                    if mem.fits:
                        rows.append(Row(c, estimate_throughput(self.spec, c), mem.peak_gib))
                self._rows = rows
            return self._rows

    def propose(
        self, trials: list[optuna.trial.FrozenTrial], *, index: int, exclude: set[TrainingConfig]
    ) -> tuple[TrainingConfig, str] | None:
        """The next configuration and a one-line rationale, or ``None`` when every feasible one was tried.

        ``index`` seeds the exploration (the sampler passes its count of earlier free trials)."""
        rng = rng_for(self.seed, index)
        untried = [r for r in self.rows() if r.config not in exclude]
        if not untried:
            return None
        if self.mode == "random":
            row = untried[int(rng.integers(len(untried)))]
            return row.config, f"random: one of {len(untried)} untried feasible configurations"
        cal = calibration_from_trials(self.spec, self.space, trials)
        multi = self.spec.search.multi_objective
        w = float(rng.uniform(0.0, 1.0)) if multi else 0.0

        def score(r: Row) -> float:
            tps = corrected_tps(r.estimate, cal)
            if not multi:
                return tps
            return math.log(max(tps, 1e-9)) - w * math.log(max(r.peak_gib, 1e-3))

        ranked = sorted(untried, key=lambda r: (-score(r), r.config.key()))
        explore = rng.random() < self.exploration
        k = TOP_K
        idx = int(rng.integers(min(k, len(ranked)))) if explore else 0
        row = ranked[idx]
        tps = corrected_tps(row.estimate, cal)
        how = f"calibrated on {cal.n_trials} measured trials" if not cal.is_identity else "uncalibrated model"
        what = f"exploration pick {idx + 1} of the top {min(k, len(ranked))}" if explore else "best"
        obj = f" (Pareto weight w={w:.2f} on log peak memory)" if multi else ""
        return row.config, (
            f"model-guided {what} of {len(ranked)} untried feasible configurations{obj}: "
            f"{tps:.0f} tokens/s/GPU expected ({how}), peak {row.peak_gib:.1f} GiB"
        )
