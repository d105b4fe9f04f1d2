"""Search quality: PrimusSampler (no LLM) against Optuna's RandomSampler and TPESampler on hidden objectives.

    python scripts/bench_search.py [--seeds 10] [--studies a.yaml,b.yaml] [--budgets 10,20,30] [--jobs 2]

**The objective the samplers face.** A "cluster" whose throughput is the step-time model's tokens/s/GPU times a
hidden, seeded multiplier the sampler cannot read (:class:`HiddenObjective`)::

    m(c) = 1 + A·tanh(s(c) / A),   A = 0.2
    s(c) = Σ_axis (f_axis[c.axis] - 1) + Σ_{axis pairs} (g_pair[c.a, c.b] - 1)

with one factor ``f`` per (axis, value) drawn uniformly in [0.8, 1.2] and one interaction factor ``g`` per
(axis pair, value pair) drawn uniformly in [0.95, 1.05]; ``tanh`` keeps the total multiplier within ±20%. The
runner (:class:`HiddenRunner`) returns it as a ``Measurement(source="measured")``, so a sampler sees it only
through completed trials, as on a real cluster, and PrimusSampler's fallback calibrates on it. Configurations
the memory model rejects are pruned as usual (:class:`MemoryPrefilterPruner`) and count as trials. The true
optimum is the maximum of the perturbed objective over every legal configuration that fits (the space is
enumerated).

**Samplers** (same hidden objective and seed for all, in-memory storage, one worker):

- ``primus``: ``PrimusSampler(spec, seed=s)`` with no LLM: the sweep, then the model-guided fallback.
- ``tpe``: ``optuna.samplers.TPESampler(seed=s)`` (defaults), through ``suggest_config``.
- ``random``: ``optuna.samplers.RandomSampler(seed=s)``, through ``suggest_config``.
- ``sweep+random``: ``PrimusSampler(spec, seed=s, fallback="random")``: the same sweep, then uniformly random
  untried configurations that fit in memory.
- ``sweep-only``: the sweep, then stop: the best over the first ``min(N, len(sweep))`` sweep points.

Reported per study and budget N (trial count, pruned trials included): the median and worst (over seeds)
fraction of the true optimum reached by the best completed trial among the first N; and each sampler's
sampler + pruner time per trial (first-trial set-up included) as a ratio to TPE's in the same runs.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
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
from optuna.samplers import BaseSampler  # noqa: E402

from primus_optuna.physics.memory import estimate_memory  # noqa: E402
from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from primus_optuna.run.base import Measurement, OutOfMemory, RunContext, RunFailure  # noqa: E402
from primus_optuna.run.objective import make_objective  # noqa: E402
from primus_optuna.search.pruner import MemoryPrefilterPruner  # noqa: E402
from primus_optuna.search.sampler import PrimusSampler  # noqa: E402
from primus_optuna.space import Space, TrainingConfig  # noqa: E402
from primus_optuna.spec import StudySpec  # noqa: E402
from primus_optuna.spec.study import AXES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STUDIES = (
    "studies/mixtral-8x22b-mi355x-fp8.yaml",
    "studies/llama3.1-70b-h100-bf16.yaml",
    "studies/qwen3-30b-a3b-h200-bf16.yaml",
)
SAMPLERS = ("primus", "tpe", "random", "sweep+random", "sweep-only")
AMPLITUDE = 0.2
"""bound of each per-(axis, value) factor and of the total hidden multiplier (±20%, issue 8)"""
PAIR_AMPLITUDE = 0.05
"""bound of each pairwise interaction factor (±5%)"""


# --- the hidden objective ----------------------------------------------------------------------------------
class HiddenObjective:
    """A seeded hidden multiplier of the step-time model's tokens/s/GPU (see the module docstring)."""

    def __init__(
        self,
        spec: StudySpec,
        seed: int,
        *,
        amplitude: float = AMPLITUDE,
        pair_amplitude: float = PAIR_AMPLITUDE,
        space: Space | None = None,
    ) -> None:
        self.spec, self.seed, self.amplitude = spec, seed, amplitude
        space = space or Space(spec)
        rng = np.random.default_rng([abs(int(seed)), zlib.crc32(spec.name.encode())])
        cands = {a: [str(v) for v in space.candidates[a]] for a in AXES}
        self.axis_factor: dict[str, dict[str, float]] = {
            a: {v: 1.0 + float(rng.uniform(-amplitude, amplitude)) for v in cands[a]} for a in AXES
        }
        self.pair_factor: dict[tuple[str, str], dict[tuple[str, str], float]] = {
            (a, b): {
                (va, vb): 1.0 + float(rng.uniform(-pair_amplitude, pair_amplitude))
                for va in cands[a]
                for vb in cands[b]
            }
            for a, b in combinations(AXES, 2)
        }

    def multiplier(self, config: TrainingConfig) -> float:
        """The hidden factor of ``config``, within ``1 ± amplitude``."""
        v = {a: str(getattr(config, a)) for a in AXES}
        s = sum(self.axis_factor[a].get(v[a], 1.0) - 1.0 for a in AXES)
        s += sum(f.get((v[a], v[b]), 1.0) - 1.0 for (a, b), f in self.pair_factor.items())
        return 1.0 + self.amplitude * math.tanh(s / self.amplitude)

    def value(self, config: TrainingConfig, model_tps: float | None = None) -> float:
        """The perturbed tokens/s/GPU (``model_tps`` saves re-estimating when already known)."""
        if model_tps is None:
            model_tps = estimate_throughput(self.spec, config).tokens_per_s_per_gpu
        return model_tps * self.multiplier(config)


class HiddenRunner:
    """A runner that "measures" the hidden objective: ``Measurement(source="measured")``; OOM when the memory
    model says the configuration does not fit (as the analytical runner)."""

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


def make_sampler(name: str, spec: StudySpec, seed: int) -> BaseSampler:
    if name == "primus":
        return PrimusSampler(spec, seed=seed)
    if name == "sweep+random":
        return PrimusSampler(spec, seed=seed, fallback="random")
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


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
    sampler = TimedSampler(make_sampler(name, spec, seed))
    pruner = TimedPruner(spec)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    with tempfile.TemporaryDirectory(prefix="bench-search-") as runs:
        fn = make_objective(spec, HiddenRunner(objective), space=land.space, runs_dir=runs)
        study.optimize(fn, n_trials=n, catch=(RunFailure,))
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


def run_sweep_only(
    land: Landscape, objective: HiddenObjective, seed: int, budgets: Sequence[int], plan: list[Any]
) -> RunResult:
    values = [
        objective.value(p.config, land.model_tps[p.config]) if p.config in land.model_tps else None
        for p in plan
    ]
    _, opt = land.optimum(objective)
    return RunResult(land.spec.name, "sweep-only", seed, best_so_far(values, budgets, opt), None)


@dataclass
class StudyReport:
    study: str
    results: list[RunResult]
    sweep_len: int
    legal: int
    feasible: int
    optimum_model_rank: list[int]
    optimum_multiplier: list[float]
    elapsed_s: float


def bench_study(
    path: str, seeds: Sequence[int], budgets: Sequence[int], samplers: Sequence[str]
) -> StudyReport:
    t0 = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    spec = StudySpec.from_yaml(ROOT / path if not Path(path).is_absolute() else path)
    land = Landscape.of(spec)
    plan = PrimusSampler(spec).plan
    results, ranks, mults = [], [], []
    for seed in seeds:
        objective = HiddenObjective(spec, seed, space=land.space)
        best, _ = land.optimum(objective)
        ranks.append(land.model_rank(best))
        mults.append(objective.multiplier(best))
        for name in samplers:
            if name == "sweep-only":
                results.append(run_sweep_only(land, objective, seed, budgets, plan))
            else:
                results.append(run_optuna(land, objective, name, seed, budgets))
    return StudyReport(
        spec.name,
        results,
        len(plan),
        len(land.space.configs()),
        len(land.model_tps),
        ranks,
        mults,
        time.perf_counter() - t0,
    )


# --- report ------------------------------------------------------------------------------------------------
def table(report: StudyReport, budgets: Sequence[int], samplers: Sequence[str]) -> list[str]:
    head = "".join(f" {f'N={n} median':>12} {'worst':>6}" for n in budgets)
    lines = [f"{'sampler':<13}{head} {'runs':>5} {'ms/trial':>9} {'x TPE':>6}"]
    tpe = [r for r in report.results if r.sampler == "tpe"]
    tpe_by_seed = {r.seed: r.overhead_s_per_trial for r in tpe}
    for name in samplers:
        rs = [r for r in report.results if r.sampler == name]
        if not rs:
            continue
        cells = ""
        for n in budgets:
            fr = [r.fractions[n] for r in rs]
            cells += f" {statistics.median(fr):>12.2%} {min(fr):>6.1%}"
        over = [r.overhead_s_per_trial for r in rs if r.overhead_s_per_trial is not None]
        if over:
            ratios = [
                r.overhead_s_per_trial / tpe_by_seed[r.seed]
                for r in rs
                if r.overhead_s_per_trial is not None and tpe_by_seed.get(r.seed)
            ]
            ms = f"{statistics.median(over) * 1000:>9.1f}"
            ratio = f"{statistics.median(ratios):>6.2f}" if ratios else f"{'-':>6}"
        else:
            ms, ratio = f"{'-':>9}", f"{'-':>6}"
        runs = f"{statistics.median(r.n_complete for r in rs):>5.0f}" if over else f"{'-':>5}"
        lines.append(f"{name:<13}{cells} {runs} {ms} {ratio}")
    return lines


def diagnostics(report: StudyReport, budgets: Sequence[int]) -> list[str]:
    out = [
        f"legal {report.legal}, fit in memory {report.feasible}, sweep {report.sweep_len} points; true optimum's "
        f"rank in the unperturbed model: median {statistics.median(report.optimum_model_rank):.0f} "
        f"(range {min(report.optimum_model_rank)}-{max(report.optimum_model_rank)}), its hidden multiplier "
        f"median {statistics.median(report.optimum_multiplier):.3f}"
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


def _bench_one(args: tuple[str, Sequence[int], Sequence[int], Sequence[str]]) -> StudyReport:
    return bench_study(*args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds (0..N-1)")
    ap.add_argument("--studies", default=",".join(STUDIES), help="comma-separated study files")
    ap.add_argument("--budgets", default="10,20,30", help="comma-separated trial budgets")
    ap.add_argument(
        "--samplers", default=",".join(SAMPLERS), help="comma-separated subset of " + ", ".join(SAMPLERS)
    )
    ap.add_argument("--jobs", type=int, default=min(3, os.cpu_count() or 1), help="studies run in parallel")
    args = ap.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    bad = [s for s in samplers if s not in SAMPLERS]
    if bad:
        ap.error(f"unknown sampler(s) {bad}; choose from {SAMPLERS}")
    if "tpe" not in samplers:
        samplers.insert(1, "tpe")  # the overhead ratio's reference
    studies = [s.strip() for s in args.studies.split(",") if s.strip()]
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    work = [(s, seeds, budgets, samplers) for s in studies]
    if args.jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            reports = list(pool.map(_bench_one, work))
    else:
        reports = [_bench_one(w) for w in work]
    print(
        f"fraction of the true optimum reached after N trials (pruned trials count), {len(seeds)} seeds; "
        f"runs = completed (launched) trials out of {max(budgets)}; ms/trial = sampler + pruner time per trial "
        "(set-up included), x TPE = its ratio to TPE in the same runs (medians over seeds)"
    )
    goal_ok = True
    n_last = max(budgets)
    for rep in reports:
        print(f"\n{rep.study} ({rep.elapsed_s:.0f} s)")
        for line in table(rep, budgets, samplers):
            print("  " + line)
        for line in diagnostics(rep, budgets):
            print("  " + line)
        prim = [r for r in rep.results if r.sampler == "primus"]
        tpe = [r for r in rep.results if r.sampler == "tpe"]
        if prim and tpe:
            med = {n: statistics.median(r.fractions[n] for r in prim) for n in budgets}
            med_tpe = {n: statistics.median(r.fractions[n] for r in tpe) for n in budgets}
            ok = med[n_last] >= 0.99 and all(med[n] > med_tpe[n] for n in budgets)
            goal_ok &= ok
            print(
                f"  goal (primus median >= 99% at N={n_last} and ahead of TPE at every budget): "
                + ("met" if ok else "NOT met")
            )
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; goal {'met' if goal_ok else 'NOT met'} on every study")
    return 0


if __name__ == "__main__":
    sys.exit(main())
