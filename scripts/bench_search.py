"""Search quality: PrimusSampler (no LLM) against Optuna's samplers and simple baselines on hidden landscapes.

    python scripts/bench_search.py [--seeds 10] [--first-seed 0] [--studies a.yaml,b.yaml] [--budgets 10,15,20,30]
        [--jobs 2]

**The landscape the samplers face.** A "cluster" whose throughput is the step-time model's tokens/s/GPU times
a hidden, seeded multiplier the sampler cannot read (:class:`HiddenObjective`)::

    log m(c) = Σ_axis e_axis[c.axis]  +  Σ_{axis pairs} g_pair[c.a, c.b]  +  synergy(c)

- per-(axis, value) effects ``e ~ N(0, σ_axis²)`` with one ``σ_axis`` per axis drawn in [0.03, 0.15] (some axes
  matter much more than the model thinks, some hardly), clipped to ±2.5 σ;
- pairwise interactions ``g ~ N(0, 0.04²)`` per (axis pair, value pair), clipped to ±0.1;
- one hidden cross-axis synergy: +0.12 (+13%) when two axes take the values of a configuration drawn from the
  model's top 200, a combination that no one-axis sweep from the centre visits.

Objectives are **plain**: ``suggest_config``, the memory prefilter (``trial.should_prune()``), then
``return`` the value. They set no attribute, so a sampler learns only from trial values, as with any user's
objective. Configurations the memory model rejects are pruned and count as trials; illegal ones are pruned by
``suggest_config``. The true optimum is the maximum over every legal configuration that fits (enumerated).

**Samplers** (same landscape and seed for all, in-memory storage, one worker):

- ``primus``: ``PrimusSampler(spec, seed=s)`` with no LLM: the sweep, then the model-guided fallback.
- ``tpe``: ``TPESampler(seed=s, multivariate=True)``; ``gp``: ``GPSampler(seed=s)``; ``random``:
  ``RandomSampler(seed=s)``: the nine axes as categorical parameters through ``suggest_config``.
- ``random-fit``: uniformly random, untried configurations among those that are legal and fit.
- ``top-k``: the step-time model's own ranking measured in order (what ``primus-optuna plan`` prints).
- ``primus-oracle``: a reference, not a method: ``primus`` whose residual model is told the landscape's own
  per-axis effect sizes (``relevance`` = the hidden ``σ_axis²``), which no user's study can know. What the
  search would gain from knowing which axes the model misses most; not counted in the goals' "ahead of".
- ``main-oracle``: a bound, not a method: the configurations measured in the order of the model × the hidden
  per-(axis, value) effects, known exactly (:meth:`HiddenObjective.main_log`); only the pairwise interactions
  and the synergy stay hidden. What a search reaches at N trials if it had learned every per-axis effect
  before its first; a worst seed it leaves below a goal is one no per-axis learner meets at that budget.

The study list always includes one study whose baseline does not fit: when every selected study's baseline
fits, a variant of the first with its micro-batch raised until it does not (``<name>-unfit-baseline``).

Reported per study and budget N (trial count, pruned trials included): the median and worst (over seeds)
fraction of the true optimum reached by the best completed trial among the first N, and each sampler's
sampler + pruner time per trial (first-trial set-up included); the goals (issue 15's, issue 41's) and primus
against measuring the model's own top k at N = k = 3, 5, 10.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

import numpy as np  # noqa: E402
import optuna  # noqa: E402
from optuna.distributions import BaseDistribution  # noqa: E402
from optuna.samplers import BaseSampler  # noqa: E402

from primus_optuna.physics.memory import estimate_memory  # noqa: E402
from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from primus_optuna.run.base import Measurement, OutOfMemory, RunContext, RunFailure  # noqa: E402
from primus_optuna.run.objective import make_objective  # noqa: E402, F401  (tests drive the runner through it)
from primus_optuna.search.pruner import MemoryPrefilterPruner  # noqa: E402
from primus_optuna.search.sampler import PrimusSampler  # noqa: E402
from primus_optuna.search.suggest import axis_distributions, suggest_config  # noqa: E402
from primus_optuna.space import Space, TrainingConfig  # noqa: E402
from primus_optuna.spec import StudySpec  # noqa: E402
from primus_optuna.spec.study import AXES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STUDIES = (
    "studies/mixtral-8x22b-mi355x-fp8.yaml",
    "studies/llama3.1-70b-h100-bf16.yaml",
    "studies/qwen3-30b-a3b-h200-bf16.yaml",
)
SAMPLERS = ("primus", "tpe", "gp", "random", "random-fit", "top-k", "primus-oracle", "main-oracle")
REFERENCES = ("primus-oracle", "main-oracle")
"""samplers that know the hidden landscape: reported, never a baseline primus must beat"""
AXIS_SD = (0.03, 0.15)
"""range of the per-axis standard deviation of the per-(axis, value) log effects"""
PAIR_SD = 0.015
"""standard deviation of each pairwise (axis-value, axis-value) log effect"""
SYNERGY = 0.12
"""log bonus of the hidden cross-axis synergy (+13%)"""
SYNERGY_POOL = 200
"""the synergy's values come from one of the model's top this-many feasible configurations"""


# --- the hidden objective ----------------------------------------------------------------------------------
class HiddenObjective:
    """A seeded hidden multiplier of the step-time model's tokens/s/GPU (see the module docstring)."""

    def __init__(
        self,
        spec: StudySpec,
        seed: int,
        *,
        space: Space | None = None,
        model_tps: dict[TrainingConfig, float] | None = None,
    ) -> None:
        self.spec, self.seed = spec, seed
        space = space or Space(spec)
        rng = np.random.default_rng([abs(int(seed)), zlib.crc32(spec.name.encode())])
        cands = {a: [str(v) for v in space.candidates[a]] for a in AXES}
        self.axis_sd = {a: float(rng.uniform(*AXIS_SD)) for a in AXES}
        self.axis_factor: dict[str, dict[str, float]] = {
            a: {v: math.exp(float(np.clip(rng.normal(0.0, sd), -2.5 * sd, 2.5 * sd))) for v in cands[a]}
            for a, sd in self.axis_sd.items()
        }
        self.pair_factor: dict[tuple[str, str], dict[tuple[str, str], float]] = {
            (a, b): {
                (va, vb): math.exp(float(np.clip(rng.normal(0.0, PAIR_SD), -2.5 * PAIR_SD, 2.5 * PAIR_SD)))
                for va in cands[a]
                for vb in cands[b]
            }
            for a, b in combinations(AXES, 2)
        }
        # the synergy: two axes (with a choice) at the values of one of the model's best configurations
        # (``model_tps``: the feasible configurations' estimates in enumeration order, computed once per study)
        tps = model_tps or {
            c: estimate_throughput(spec, c).tokens_per_s_per_gpu
            for c in space.configs()
            if estimate_memory(spec, c).fits
        }
        model = sorted(tps, key=lambda c: -tps[c])[:SYNERGY_POOL] if SYNERGY_POOL else []
        free = [a for a in AXES if len(cands[a]) > 1]
        self.synergy: dict[str, str] = {}
        if model and len(free) >= 2:
            ref = model[int(rng.integers(len(model)))]
            pair = rng.choice(len(free), size=2, replace=False)
            self.synergy = {free[i]: str(getattr(ref, free[i])) for i in sorted(pair)}

    def main_log(self, config: TrainingConfig) -> float:
        """The per-(axis, value) part of :meth:`log_multiplier` (no pairs, no synergy)."""
        return sum(math.log(self.axis_factor[a].get(str(getattr(config, a)), 1.0)) for a in AXES)

    def log_multiplier(self, config: TrainingConfig) -> float:
        v = {a: str(getattr(config, a)) for a in AXES}
        s = self.main_log(config)
        s += sum(math.log(f.get((v[a], v[b]), 1.0)) for (a, b), f in self.pair_factor.items())
        if self.synergy and all(v[a] == x for a, x in self.synergy.items()):
            s += SYNERGY
        return s

    def multiplier(self, config: TrainingConfig) -> float:
        """The hidden factor of ``config``."""
        return math.exp(self.log_multiplier(config))

    def value(self, config: TrainingConfig, model_tps: float | None = None) -> float:
        """The perturbed tokens/s/GPU (``model_tps`` saves re-estimating when already known)."""
        if model_tps is None:
            model_tps = estimate_throughput(self.spec, config).tokens_per_s_per_gpu
        return model_tps * self.multiplier(config)


class HiddenRunner:
    """A runner that "measures" the hidden objective: ``Measurement(source="measured")``; OOM when the memory
    model says the configuration does not fit (as the analytical runner). For studies driven through
    :func:`make_objective` (the benchmark itself uses plain objectives)."""

    kind = "hidden"

    def __init__(self, objective: HiddenObjective) -> None:
        self.objective = objective
        self.spec = objective.spec

    def run(self, config: TrainingConfig, context: RunContext) -> Measurement:
        mem = estimate_memory(self.spec, config)
        if not mem.fits:
            raise OutOfMemory(f"estimated {mem.reason()}", log_tail=mem.reason())
        est = estimate_throughput(self.spec, config)
        m = self.objective.multiplier(config)
        return Measurement(
            tokens_per_s_per_gpu=est.tokens_per_s_per_gpu * m,
            step_time_s=est.step_time_s / m,
            source="measured",
            peak_memory_gib=mem.peak_gib,
        )


@dataclass
class Landscape:
    """Model tokens/s/GPU of every legal configuration that fits (computed once per study)."""

    spec: StudySpec
    space: Space
    model_tps: dict[TrainingConfig, float]

    @classmethod
    def of(cls, spec: StudySpec) -> Landscape:
        space = Space(spec)
        tps = {
            c: estimate_throughput(spec, c).tokens_per_s_per_gpu
            for c in space.configs()
            if estimate_memory(spec, c).fits
        }
        return cls(spec, space, tps)

    def optimum(self, objective: HiddenObjective) -> tuple[TrainingConfig, float]:
        """The true optimum of the perturbed objective (enumeration of every feasible configuration)."""
        return max(((c, objective.value(c, t)) for c, t in self.model_tps.items()), key=lambda x: x[1])

    def model_rank(self, config: TrainingConfig) -> int:
        """1-based rank of ``config`` by the unperturbed model (1 = the model's own best)."""
        t = self.model_tps[config]
        return 1 + sum(1 for v in self.model_tps.values() if v > t)

    def ranked(self) -> list[TrainingConfig]:
        """Every feasible configuration, best estimate first (ties by key)."""
        return sorted(self.model_tps, key=lambda c: (-self.model_tps[c], c.key()))


# --- baselines that propose whole configurations -----------------------------------------------------------
class ListSampler(BaseSampler):
    """Proposes whole configurations from a fixed list in order (``top-k``) or a seeded random permutation of
    it (``random-fit``): the trial number indexes it (one worker)."""

    def __init__(self, space: Space, configs: Sequence[TrainingConfig]) -> None:
        self.configs = list(configs)
        self.dists = axis_distributions(space)

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, BaseDistribution]:
        return dict(self.dists)

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        return self.configs[trial.number % len(self.configs)].to_params()

    def sample_independent(self, study: Any, trial: Any, name: str, dist: Any) -> Any:
        raise RuntimeError("every parameter is sampled relatively")


# --- timing wrappers ---------------------------------------------------------------------------------------
class TimedSampler(BaseSampler):
    """Delegates to ``inner`` and adds up the seconds spent in it."""

    def __init__(self, inner: BaseSampler) -> None:
        self.inner = inner
        self.seconds = 0.0

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0

    def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
        return self._timed(self.inner.infer_relative_search_space, study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
        return self._timed(self.inner.sample_relative, study, trial, search_space)

    def sample_independent(self, study: Any, trial: Any, name: str, dist: Any) -> Any:
        return self._timed(self.inner.sample_independent, study, trial, name, dist)

    def before_trial(self, study: Any, trial: Any) -> None:
        self._timed(self.inner.before_trial, study, trial)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        self._timed(self.inner.after_trial, study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


class TimedPruner(MemoryPrefilterPruner):
    """The memory prefilter, timed (a subclass, so the objective still calls it before running)."""

    def __init__(self, spec: StudySpec) -> None:
        super().__init__(spec=spec)
        self.seconds = 0.0

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        t0 = time.perf_counter()
        try:
            return super().prune(study, trial)
        finally:
            self.seconds += time.perf_counter() - t0


# --- one run -----------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    study: str
    sampler: str
    seed: int
    fractions: dict[int, float]
    """budget -> best completed value among the first N trials / true optimum (0 when none completed)"""
    overhead_s_per_trial: float | None
    best_phase: str = ""
    n_complete: int = 0
    phases: dict[str, int] = field(default_factory=dict)


def make_sampler(name: str, land: Landscape, seed: int, hidden: HiddenObjective | None = None) -> BaseSampler:
    spec = land.spec
    if name == "primus":
        return PrimusSampler(spec, seed=seed)
    if name == "primus-oracle":
        if hidden is None:
            raise ValueError("primus-oracle needs the hidden objective")
        sampler = PrimusSampler(spec, seed=seed)
        sampler.fallback.relevance = {a: sd**2 for a, sd in hidden.axis_sd.items()}
        return sampler
    if name == "main-oracle":
        if hidden is None:
            raise ValueError("main-oracle needs the hidden objective")
        h = hidden
        return ListSampler(
            land.space,
            sorted(land.model_tps, key=lambda c: (-math.log(land.model_tps[c]) - h.main_log(c), c.key())),
        )
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "random-fit":
        configs = land.ranked()
        order = np.random.default_rng([seed, 17]).permutation(len(configs))
        return ListSampler(land.space, [configs[i] for i in order])
    if name == "top-k":
        return ListSampler(land.space, land.ranked())
    raise ValueError(f"unknown sampler {name!r}")


def plain_objective(land: Landscape, hidden: HiddenObjective) -> Callable[[optuna.Trial], float]:
    """What a user writes: suggest the configuration, let the memory filter prune, launch, return the value."""

    def objective(trial: optuna.Trial) -> float:
        config = suggest_config(trial, land.spec, land.space)
        if trial.should_prune():
            raise optuna.TrialPruned()
        return hidden.value(config, land.model_tps.get(config))

    return objective


def best_so_far(values: Sequence[float | None], budgets: Sequence[int], optimum: float) -> dict[int, float]:
    """Fraction of ``optimum`` reached by the best value among the first N (``None`` = not completed)."""
    out = {}
    for n in budgets:
        done = [v for v in values[:n] if v is not None]
        out[n] = max(done) / optimum if done else 0.0
    return out


def run_optuna(
    land: Landscape, objective: HiddenObjective, name: str, seed: int, budgets: Sequence[int]
) -> RunResult:
    spec = land.spec
    n = max(budgets)
    sampler = TimedSampler(make_sampler(name, land, seed, objective))
    pruner = TimedPruner(spec)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    study.optimize(plain_objective(land, objective), n_trials=n, catch=(RunFailure,))
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    values = [t.value if t.state == optuna.trial.TrialState.COMPLETE else None for t in trials]
    _, opt = land.optimum(objective)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = max(done, key=lambda t: t.value) if done else None
    phases: dict[str, int] = {}
    for t in trials:
        p = str(t.user_attrs.get("phase", "-"))
        phases[p] = phases.get(p, 0) + 1
    return RunResult(
        spec.name,
        name,
        seed,
        best_so_far(values, budgets, opt),
        (sampler.seconds + pruner.seconds) / max(1, len(trials)),
        best_phase=str(best.user_attrs.get("phase", "-")) if best else "",
        n_complete=len(done),
        phases=phases,
    )


@dataclass
class StudyReport:
    study: str
    results: list[RunResult]
    sweep_len: int
    sweep_pruned: int
    centre_note: str
    legal: int
    feasible: int
    optimum_model_rank: list[int]
    optimum_multiplier: list[float]
    elapsed_s: float


def load_spec(path: str, sweep_trials: int | None = None, start: str | None = None) -> StudySpec:
    """A study file, or ``<file>#unfit``: its baseline with the micro-batch raised until it does not fit;
    ``sweep_trials`` / ``start`` override ``search.sweep_trials`` / ``search.start``."""
    file, _, variant = path.partition("#")
    spec = StudySpec.from_yaml(ROOT / file if not Path(file).is_absolute() else file)
    update = {"sweep_trials": sweep_trials} if sweep_trials is not None else {}
    update |= {"start": start} if start is not None else {}
    if update:
        spec = spec.model_copy(update={"search": spec.search.model_copy(update=update)})
    if variant != "unfit":
        return spec
    space = Space(spec)
    base = spec.search.baseline.model_dump()
    for mbs in space.candidates["mbs"]:
        for recompute in space.candidates["recompute"][:1]:
            trial = {**base, "mbs": mbs, "recompute": recompute}
            s2 = spec.model_copy(
                update={
                    "name": f"{spec.name}-unfit-baseline",
                    "search": spec.search.model_copy(
                        update={"baseline": spec.search.baseline.model_copy(update=trial)}
                    ),
                }
            )
            sp2 = Space(s2)
            b = sp2.canonical(sp2.baseline)
            if not sp2.check(b) and not estimate_memory(s2, b).fits:
                return s2
    raise SystemExit(f"{file}: no micro-batch makes its baseline not fit; pick another study for #unfit")


def bench_study(
    path: str,
    seeds: Sequence[int],
    budgets: Sequence[int],
    samplers: Sequence[str],
    sweep_trials: int | None = None,
    start: str | None = None,
) -> StudyReport:
    t0 = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    spec = load_spec(path, sweep_trials, start)
    land = Landscape.of(spec)
    design = PrimusSampler(spec).design
    results, ranks, mults = [], [], []
    for seed in seeds:
        objective = HiddenObjective(spec, seed, space=land.space, model_tps=land.model_tps)
        best, _ = land.optimum(objective)
        ranks.append(land.model_rank(best))
        mults.append(objective.multiplier(best))
        for name in samplers:
            results.append(run_optuna(land, objective, name, seed, budgets))
    return StudyReport(
        spec.name,
        results,
        len(design.points),
        sum(1 for p in design.points if p.config not in land.model_tps),
        design.centre_note,
        len(land.space.configs()),
        len(land.model_tps),
        ranks,
        mults,
        time.perf_counter() - t0,
    )


# --- report ------------------------------------------------------------------------------------------------
def table(report: StudyReport, budgets: Sequence[int], samplers: Sequence[str]) -> list[str]:
    head = "".join(f" {f'N={n} median':>12} {'worst':>6}" for n in budgets)
    lines = [f"{'sampler':<11}{head} {'runs':>5} {'ms/trial':>9}"]
    for name in samplers:
        rs = [r for r in report.results if r.sampler == name]
        if not rs:
            continue
        cells = ""
        for n in budgets:
            fr = [r.fractions[n] for r in rs]
            cells += f" {statistics.median(fr):>12.2%} {min(fr):>6.1%}"
        over = [r.overhead_s_per_trial for r in rs if r.overhead_s_per_trial is not None]
        ms = f"{statistics.median(over) * 1000:>9.1f}" if over else f"{'-':>9}"
        runs = f"{statistics.median(r.n_complete for r in rs):>5.0f}"
        lines.append(f"{name:<11}{cells} {runs} {ms}")
    return lines


def diagnostics(report: StudyReport, budgets: Sequence[int]) -> list[str]:
    out = [
        f"legal {report.legal}, fit in memory {report.feasible}; sweep {report.sweep_len} points "
        f"({report.sweep_pruned} memory-pruned); centre: {report.centre_note or 'the baseline'}",
        f"true optimum's rank in the unperturbed model: median "
        f"{statistics.median(report.optimum_model_rank):.0f} (range {min(report.optimum_model_rank)}-"
        f"{max(report.optimum_model_rank)}), its hidden multiplier median "
        f"{statistics.median(report.optimum_multiplier):.3f}",
    ]
    prim = [r for r in report.results if r.sampler == "primus"]
    if prim:
        phases: dict[str, int] = {}
        for r in prim:
            phases[r.best_phase] = phases.get(r.best_phase, 0) + 1
        out.append(
            "primus: best trial found in phase "
            + ", ".join(f"{k} ({v} seeds)" for k, v in sorted(phases.items()))
            + f"; completed trials per run: median {statistics.median(r.n_complete for r in prim):.0f}"
        )
    return out


def goals(report: StudyReport, budgets: Sequence[int], samplers: Sequence[str]) -> tuple[bool, str]:
    """The issue-15 targets: primus median >= 99% at 30 and >= 95% at 15, worst >= 90% at 30, and ahead of
    every baseline's median at 10/20/30 (budgets that were run; where both medians are at the true optimum,
    ahead means a worst seed no lower than the baseline's)."""
    prim = [r for r in report.results if r.sampler == "primus"]
    if not prim:
        return True, "no primus runs"
    med = {n: statistics.median(r.fractions[n] for r in prim) for n in budgets}
    worst = {n: min(r.fractions[n] for r in prim) for n in budgets}
    checks = []
    if 30 in med:
        checks.append((f"median {med[30]:.1%} >= 99% at 30", med[30] >= 0.99))
        checks.append((f"worst {worst[30]:.1%} >= 90% at 30", worst[30] >= 0.90))
    if 15 in med:
        checks.append((f"median {med[15]:.1%} >= 95% at 15", med[15] >= 0.95))
    for name in samplers:
        rs = [r for r in report.results if r.sampler == name]
        if name == "primus" or name in REFERENCES or not rs:
            continue
        for n in (b for b in budgets if b in (10, 20, 30)):
            other = statistics.median(r.fractions[n] for r in rs)
            # both medians at the true optimum, where nothing is above: ahead when the worst seed is not behind
            ceiling = med[n] >= 1.0 and other >= 1.0 and worst[n] >= min(r.fractions[n] for r in rs)
            if other >= med[n] and not ceiling:
                checks.append((f"not ahead of {name} at {n} ({med[n]:.1%} vs {other:.1%})", False))
    ok = all(c for _, c in checks)
    failed = [t for t, c in checks if not c]
    return ok, "met" if ok else "NOT met: " + "; ".join(failed)


GOAL_41 = {10: 0.95, 15: 0.97, 30: 1.0}
"""issue 41's targets: primus median fraction of the optimum at these budgets"""
GOAL_41_WORST = 0.95
"""issue 41's worst-seed target, read at every budget of at least 10 trials"""
TOP_K_BUDGETS = (3, 5, 10)
"""the budgets at which primus is compared with measuring the model's own top k"""


def goals_41(report: StudyReport, budgets: Sequence[int]) -> tuple[bool, str]:
    """Issue 41's targets on the budgets that were run: the median at 10 / 15 / 30 (:data:`GOAL_41`) and the
    worst seed >= :data:`GOAL_41_WORST` at every budget of at least 10."""
    prim = [r for r in report.results if r.sampler == "primus"]
    if not prim:
        return True, "no primus runs"
    failed = []
    for n in budgets:
        fr = [r.fractions[n] for r in prim]
        if n in GOAL_41 and statistics.median(fr) < GOAL_41[n] - 1e-9:
            failed.append(f"median {statistics.median(fr):.1%} < {GOAL_41[n]:.0%} at {n}")
        if n >= 10 and min(fr) < GOAL_41_WORST:
            failed.append(f"worst {min(fr):.1%} < {GOAL_41_WORST:.0%} at {n}")
    return not failed, "met" if not failed else "NOT met: " + "; ".join(failed)


def top_k_comparison(report: StudyReport, budgets: Sequence[int]) -> list[str]:
    """Primus against measuring the model's top k, at k = N in :data:`TOP_K_BUDGETS` (those run): medians,
    worst seeds and the seeds on which primus is behind; "behind" when its median or its worst is lower."""
    prim = {r.seed: r for r in report.results if r.sampler == "primus"}
    topk = {r.seed: r for r in report.results if r.sampler == "top-k"}
    seeds = sorted(set(prim) & set(topk))
    out = []
    for n in (b for b in TOP_K_BUDGETS if b in budgets):
        if not seeds:
            break
        p = [prim[s].fractions[n] for s in seeds]
        t = [topk[s].fractions[n] for s in seeds]
        behind = statistics.median(p) < statistics.median(t) or min(p) < min(t)
        out.append(
            f"N={n}: primus {statistics.median(p):.1%} (worst {min(p):.1%}) vs top-{n} {statistics.median(t):.1%} "
            f"(worst {min(t):.1%}); behind on {sum(a < b for a, b in zip(p, t, strict=True))} of {len(seeds)} "
            f"seeds: {'BEHIND' if behind else 'not behind'}"
        )
    return out


def _bench_one(
    args: tuple[str, Sequence[int], Sequence[int], Sequence[str], int | None, str | None],
) -> StudyReport:
    return bench_study(*args)


def with_unfit_baseline(studies: list[str]) -> list[str]:
    """The studies, plus ``<first>#unfit`` when every baseline fits (the benchmark needs one that does not)."""
    for s in studies:
        spec = load_spec(s)
        space = Space(spec)
        b = space.canonical(space.baseline)
        if space.check(b) or not estimate_memory(spec, b).fits:
            return studies
    return studies + [studies[0].partition("#")[0] + "#unfit"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds (first-seed .. first-seed+N-1)")
    ap.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="first landscape seed: seeds 0-9 tuned the search's defaults; use others (e.g. 100) to report on "
        "landscapes held back from that tuning",
    )
    ap.add_argument(
        "--studies",
        default=",".join(STUDIES),
        help="comma-separated study files (FILE#unfit: its baseline made not to fit)",
    )
    ap.add_argument("--budgets", default="3,5,10,15,20,30", help="comma-separated trial budgets")
    ap.add_argument(
        "--samplers", default=",".join(SAMPLERS), help="comma-separated subset of " + ", ".join(SAMPLERS)
    )
    ap.add_argument(
        "--sweep-trials",
        type=int,
        default=None,
        help="override search.sweep_trials of every study (a study that sets it runs its sweep in the plan's order)",
    )
    ap.add_argument(
        "--start",
        choices=("auto", "baseline", "model"),
        default=None,
        help="override search.start of every study (the sweep's centre)",
    )
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="studies run in parallel")
    args = ap.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    bad = [s for s in samplers if s not in SAMPLERS]
    if bad:
        ap.error(f"unknown sampler(s) {bad}; choose from {SAMPLERS}")
    studies = with_unfit_baseline([s.strip() for s in args.studies.split(",") if s.strip()])
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    t0 = time.perf_counter()
    work = [(s, seeds, budgets, samplers, args.sweep_trials, args.start) for s in studies]
    if args.jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            reports = list(pool.map(_bench_one, work))
    else:
        reports = [_bench_one(w) for w in work]
    print(
        f"fraction of the true optimum reached after N trials (pruned trials count), {len(seeds)} seeds; "
        f"runs = completed (launched) trials out of {max(budgets)}; ms/trial = sampler + pruner time per "
        "trial (set-up included), median over seeds; plain objectives (the value only)"
    )
    goal_ok = True
    for rep in reports:
        print(f"\n{rep.study} ({rep.elapsed_s:.0f} s)")
        for line in table(rep, budgets, samplers):
            print("  " + line)
        for line in diagnostics(rep, budgets):
            print("  " + line)
        ok, text = goals(rep, budgets, samplers)
        goal_ok &= ok
        print(
            f"  goal (primus median >= 99% at 30, >= 95% at 15, worst >= 90% at 30, ahead of every other): {text}"
        )
        print(
            f"  goal (issue 41: median >= 95% at 10, >= 97% at 15, 100% at 30, worst >= 95%): {goals_41(rep, budgets)[1]}"
        )
        for line in top_k_comparison(rep, budgets):
            print("  against the model's top k, " + line)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; goal {'met' if goal_ok else 'NOT met'} on every study")
    return 0


if __name__ == "__main__":
    sys.exit(main())
