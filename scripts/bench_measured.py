"""Search on measured landscapes: PrimusSampler (no LLM) replayed on the vTrain A100 single-node measurements,
against measuring the model's own top k, TPE and random.

    python scripts/bench_measured.py [--seeds 5] [--split-seed 0] [--gpus 2,4,8] [--min-points 8]
        [--groups 2048x24x64,...] [--budgets 3,5,10,15] [--sweep-trials N] [--start auto|baseline|model]
        [--jobs 2]

**Data and split.** tests/data/vtrain-a100-single-node.csv (VIA-Research/vTrain, MIT; how the runs were made:
shared/reference/data/README.md). A *group* is one model (hidden, layers) and global batch, as in
scripts/fit_vtrain.py; :func:`tests.helpers.vtrain.split_groups` halves the groups at random (``--split-seed``).
The A100 constants are fitted by ``fit_vtrain.fit`` on the fitting half only; the searches run only on the
held-back half, with those constants, and see held-back measurements only through the replay objective.

**Landscapes.** A study has one cluster, so a landscape is a held-back group on one GPU count (``--gpus``) with at
least ``--min-points`` measured configurations in the study's legal space. The study searches what vTrain varied:
TP, PP and micro-batch over the values in the CSV, with recompute ``full``, CP 1, no VPP and the 1F1B schedule
fixed as every run was made (README). Its legal space is the project's (``Space``), so it is larger than what
vTrain measured; a measured row the project's rules reject (e.g. fewer micro-batches than pipeline stages) is
outside it and listed, never searched.

**Replay objective** (:class:`ReplayObjective`): ``suggest_config``, the memory prefilter, then the measured
tokens/s/GPU of the configuration (``global batch · 1024 / iteration time / GPUs``); no physics. A legal
configuration vTrain did not measure is *pruned before launch* (``prune_reason = "unmeasured: ..."``) and does
not count as a measured trial: the landscape is the measured points and the rest of the space is refused at no
cost, as the memory prefilter refuses what does not fit. Counting it as a failed trial would instead charge a
sampler for vTrain's choice of rows and hand it a false "fails" signal about a configuration that runs. Every
method pays the same way: the budget N counts **measured** trials (the issue's "within 5 measured trials");
the unmeasured proposals are reported beside it. A study stops after the largest budget of measured trials or
``--max-trials`` trials of any kind.

**Methods** (same landscape for all; stochastic ones over ``--seeds`` seeds, one worker, in-memory storage):

- ``primus``: ``PrimusSampler(spec, seed=s)`` with no LLM, the plain objective above (as scripts/bench_search.py);
- ``top-k``: the model's ranking (analytical estimate, fitted constants) of the measured points, measured in
  order; its value after N measured trials is "measure the model's top N" (deterministic);
- ``tpe``: ``TPESampler(seed=s, multivariate=True)``; ``random``: ``RandomSampler(seed=s)``, through
  ``suggest_config`` (a repeated configuration is measured again and counts).

Reported per landscape: the fraction of the measured best (over the measured legal points) reached by the best
of the first N measured trials (median and worst seed), measured trials to 99%, the measured best's rank in the
model's order; and over all landscapes the median and the worst. Goals (issue 41): ``primus`` worst seed >= 0.99
after 5 measured trials on every landscape, and never below ``top-k`` at k = 3, 5, 10; each miss is attributed to
the model's ranking (its own top 5 misses too) or to the search (the model's top 5 had it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

import optuna  # noqa: E402
from fit_vtrain import fit  # noqa: E402
from optuna.samplers import BaseSampler  # noqa: E402

from primus_optuna.physics import calibration  # noqa: E402
from primus_optuna.physics.fidelity import spearman  # noqa: E402
from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from primus_optuna.search.attrs import PRUNE_REASON  # noqa: E402
from primus_optuna.search.pruner import MemoryPrefilterPruner  # noqa: E402
from primus_optuna.search.sampler import PrimusSampler  # noqa: E402
from primus_optuna.search.suggest import suggest_config  # noqa: E402
from primus_optuna.space import Space, TrainingConfig  # noqa: E402
from primus_optuna.spec import StudySpec  # noqa: E402
from tests.helpers.vtrain import Row, load_rows, split_groups  # noqa: E402

SAMPLERS = ("primus", "top-k", "tpe", "random")
STOCHASTIC = ("primus", "tpe", "random")
FIXED_AXES: dict[str, list] = {"recompute": ["full"], "cp": [1], "vpp": [1], "pp_schedule": ["1f1b"]}
"""as every vTrain run was made (shared/reference/data/README.md: use_checkpoint, 1F1B, no SP)"""
UNMEASURED = "unmeasured"
GOAL_AT = 5
GOAL_FRACTION = 0.99
TOPK_GOAL = (3, 5, 10)

Group = tuple[int, int, int]


# --- landscapes --------------------------------------------------------------------------------------------
@dataclass
class Landscape:
    """One held-back group on one GPU count: the study and its measured legal points."""

    group: Group
    gpus: int
    spec: StudySpec
    measured: dict[TrainingConfig, float]
    """measured tokens/s/GPU of every measured configuration in the study's legal space"""
    legal: int
    illegal: list[tuple[str, float, str]] = field(default_factory=list)
    """measured rows the project's rules reject: (configuration, tokens/s/GPU, first reason)"""

    @property
    def name(self) -> str:
        h, layers, gbs = self.group
        return f"h{h} L{layers} GBS{gbs} ({self.gpus} GPUs)"

    @property
    def best(self) -> float:
        return max(self.measured.values())


def searched_axes(rows: Sequence[Row]) -> dict[str, list]:
    """TP, PP and micro-batch over the values in ``rows``, the rest fixed as vTrain ran (:data:`FIXED_AXES`)."""
    return {a: sorted({getattr(r.config, a) for r in rows}) for a in ("tp", "pp", "mbs")} | FIXED_AXES


def study_spec(
    rows: Sequence[Row], axes: dict[str, list], sweep_trials: int | None = None, start: str | None = None
) -> StudySpec:
    """The study of one group on one GPU count (``rows``), searching ``axes``; its baseline is Megatron's
    defaults with recompute ``full`` (as vTrain ran; the sweep's centre)."""
    base = rows[0].spec
    h, layers, gbs = rows[0].group
    return base.model_copy(
        update={
            "name": f"vtrain-h{h}-l{layers}-gbs{gbs}-{rows[0].gpus}gpu",
            "search": base.search.model_copy(
                update={
                    "axes": axes,
                    "baseline": base.search.baseline.model_copy(update={"recompute": "full"}),
                    "sweep_trials": sweep_trials,
                    "start": start or base.search.start,
                }
            ),
        }
    )


def build_landscapes(
    rows: Sequence[Row],
    groups: set[Group],
    gpus: Sequence[int],
    min_points: int,
    sweep_trials: int | None = None,
    start: str | None = None,
) -> list[Landscape]:
    """The landscapes of ``groups`` on each GPU count in ``gpus`` with at least ``min_points`` measured legal
    configurations (axis values: the whole CSV's, so every landscape searches the same axes)."""
    axes = searched_axes(rows)
    by: dict[tuple[Group, int], list[Row]] = {}
    for r in rows:
        if r.group in groups and r.gpus in gpus:
            by.setdefault((r.group, r.gpus), []).append(r)
    out = []
    for (group, g), rs in sorted(by.items()):
        spec = study_spec(rs, axes, sweep_trials, start)
        space = Space(spec)
        legal = set(space.configs())
        land = Landscape(group, g, spec, {}, len(legal))
        for r in rs:
            c = space.canonical(r.config)
            if c in legal:
                land.measured[c] = r.measured_tps
            else:
                land.illegal.append((c.key(), r.measured_tps, (space.check(c) or ["outside the axes"])[0]))
        if len(land.measured) >= min_points:
            out.append(land)
    return out


class ReplayObjective:
    """The measured tokens/s/GPU of the trial's configuration; a legal one vTrain did not measure is pruned
    (``unmeasured: ...``) before launch. No physics."""

    def __init__(self, land: Landscape) -> None:
        self.land = land
        self.space = Space(land.spec)

    def value(self, config: TrainingConfig) -> float | None:
        """The measured tokens/s/GPU of ``config`` (``None`` when vTrain did not measure it)."""
        return self.land.measured.get(self.space.canonical(config))

    def __call__(self, trial: optuna.Trial) -> float:
        config = suggest_config(trial, self.land.spec, self.space)
        if trial.should_prune():
            raise optuna.TrialPruned()
        v = self.value(config)
        if v is None:
            reason = f"{UNMEASURED}: {config.key()} is not in the vTrain measurements"
            trial.set_user_attr(PRUNE_REASON, reason)
            raise optuna.TrialPruned(reason)
        return v


def model_order(land: Landscape) -> list[TrainingConfig]:
    """The measured points ranked by the model (current A100 constants), best estimate first."""
    est = {c: estimate_throughput(land.spec, c).tokens_per_s_per_gpu for c in land.measured}
    return sorted(est, key=lambda c: (-est[c], c.key()))


# --- runs --------------------------------------------------------------------------------------------------
@dataclass
class Run:
    sampler: str
    seed: int
    values: list[float]
    """measured tokens/s/GPU of each measured trial, in order"""
    unmeasured: int = 0
    """proposals refused as unmeasured (free)"""
    phases: list[str] = field(default_factory=list)
    """the phase of each measured trial (primus)"""
    configs: list[TrainingConfig] = field(default_factory=list)
    """the configuration of each measured trial"""


def make_sampler(name: str, spec: StudySpec, seed: int) -> BaseSampler:
    if name == "primus":
        return PrimusSampler(spec, seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


def run_sampler(land: Landscape, name: str, seed: int, n_measured: int, max_trials: int) -> Run:
    """One study: stops after ``n_measured`` measured trials or ``max_trials`` trials of any kind."""
    if name == "top-k":
        order = model_order(land)[:n_measured]
        return Run(name, 0, [land.measured[c] for c in order], configs=order)
    study = optuna.create_study(
        direction="maximize",
        sampler=make_sampler(name, land.spec, seed),
        pruner=MemoryPrefilterPruner(spec=land.spec),
    )

    def enough(study: optuna.Study, _t: optuna.trial.FrozenTrial) -> None:
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if len(done) >= n_measured:
            study.stop()

    objective = ReplayObjective(land)
    space = objective.space
    study.optimize(objective, n_trials=max_trials, callbacks=[enough])
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    unmeasured = sum(1 for t in trials if str(t.user_attrs.get(PRUNE_REASON, "")).startswith(UNMEASURED))
    return Run(
        name,
        seed,
        [float(t.value) for t in done],
        unmeasured,
        [str(t.user_attrs.get("phase", "-")) for t in done],
        [space.canonical(TrainingConfig.from_params(t.params)) for t in done],
    )


def fraction(values: Sequence[float], n: int, best: float) -> float:
    """Best of the first ``n`` measured values over ``best`` (0 when none)."""
    return max(values[:n], default=0.0) / best


def trials_to(values: Sequence[float], best: float, target: float = GOAL_FRACTION) -> int | None:
    """Measured trials until the best so far reaches ``target`` of ``best`` (None: never, within the run)."""
    for i, v in enumerate(values, 1):
        if v >= target * best - 1e-9:
            return i
    return None


@dataclass
class LandscapeReport:
    land: Landscape
    runs: list[Run]
    best_model_rank: int
    """1-based rank of the measured best in the model's order of the measured points"""
    rho: float
    estimate: dict[TrainingConfig, float]
    """the model's tokens/s/GPU of each measured point (fitted constants)"""
    elapsed_s: float

    def of(self, sampler: str) -> list[Run]:
        return [r for r in self.runs if r.sampler == sampler]

    def fractions(self, sampler: str, n: int) -> list[float]:
        return [fraction(r.values, n, self.land.best) for r in self.of(sampler)]


def bench_landscape(
    land: Landscape,
    fam: calibration.FamilyConstants,
    samplers: Sequence[str],
    seeds: Sequence[int],
    n_measured: int,
    max_trials: int,
) -> LandscapeReport:
    """Every method on one landscape, with ``fam`` as the A100 constants (restored afterwards)."""
    t0 = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    saved = calibration.FAMILIES["ampere"]
    calibration.FAMILIES["ampere"] = fam
    try:
        land = dataclasses.replace(
            land, spec=land.spec.model_copy()
        )  # no estimate cached with other constants
        order = model_order(land)
        est = {c: estimate_throughput(land.spec, c).tokens_per_s_per_gpu for c in order}
        best_c = max(land.measured, key=land.measured.__getitem__)
        runs = []
        for name in samplers:
            for seed in seeds if name in STOCHASTIC else (0,):
                runs.append(run_sampler(land, name, seed, n_measured, max_trials))
        return LandscapeReport(
            land,
            runs,
            order.index(best_c) + 1,
            spearman(list(est.values()), [land.measured[c] for c in order]),
            est,
            time.perf_counter() - t0,
        )
    finally:
        calibration.FAMILIES["ampere"] = saved


def _bench_one(args: tuple) -> LandscapeReport:
    return bench_landscape(*args)


# --- report ------------------------------------------------------------------------------------------------
def _q(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs):.3f} / {min(xs):.3f}" if xs else "-"


def _to99(rep: LandscapeReport, sampler: str) -> str:
    ts = [trials_to(r.values, rep.land.best) for r in rep.of(sampler)]
    if not ts:
        return "-"
    worst = "never" if None in ts else str(max(t for t in ts if t is not None))
    reached = sorted(t for t in ts if t is not None)
    med = str(int(statistics.median(reached))) if len(reached) * 2 > len(ts) else "never"
    return f"{med} / {worst}"


def landscape_table(
    reps: Sequence[LandscapeReport], budgets: Sequence[int], samplers: Sequence[str]
) -> list[str]:
    cols = [f"primus N={n}" for n in budgets] + ["primus to 99%"]
    cols += [f"top-{n}" for n in budgets if "top-k" in samplers]
    cols += [f"{s} N={GOAL_AT}" for s in ("tpe", "random") if s in samplers]
    lines = [
        "| landscape | measured / legal | model rank of best | Spearman | " + " | ".join(cols) + " |",
        "|---|---|---|---|" + "---|" * len(cols),
    ]
    for rep in reps:
        cells = [_q(rep.fractions("primus", n)) for n in budgets] + [_to99(rep, "primus")]
        if "top-k" in samplers:
            cells += [f"{rep.fractions('top-k', n)[0]:.3f}" for n in budgets]
        cells += [_q(rep.fractions(s, GOAL_AT)) for s in ("tpe", "random") if s in samplers]
        lines.append(
            f"| {rep.land.name} | {len(rep.land.measured)} / {rep.land.legal} | {rep.best_model_rank} | "
            f"{rep.rho:.2f} | " + " | ".join(cells) + " |"
        )
    return lines


def summary_table(
    reps: Sequence[LandscapeReport], budgets: Sequence[int], samplers: Sequence[str]
) -> list[str]:
    """Per method and budget: the median over landscapes of the per-landscape median, and the worst seed of the
    worst landscape; trials to 99%; unmeasured proposals per run."""
    head = " | ".join(f"N={n} median / worst" for n in budgets)
    lines = [
        f"| method | {head} | to 99%: median / worst run | unmeasured proposals per run |",
        "|---|" + "---|" * (len(budgets) + 2),
    ]
    for s in samplers:
        cells = []
        for n in budgets:
            med = [statistics.median(rep.fractions(s, n)) for rep in reps]
            worst = [min(rep.fractions(s, n)) for rep in reps]
            cells.append(f"{statistics.median(med):.3f} / {min(worst):.3f}")
        ts = [trials_to(r.values, rep.land.best) for rep in reps for r in rep.of(s)]
        reached = [t for t in ts if t is not None]
        worst_t = "never" if None in ts else str(max(reached))
        med_t = f"{statistics.median(reached):.0f}" if reached else "never"
        unm = statistics.median(r.unmeasured for rep in reps for r in rep.of(s))
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {med_t} / {worst_t} | {unm:.0f} |")
    return lines


def phase_diagnosis(reps: Sequence[LandscapeReport]) -> list[str]:
    """Where ``primus``'s measured trials went, by phase: how many, their estimate against the model's best
    estimate (of the measured points) and their measured value against the measured best."""
    out = []
    by: dict[str, list[tuple[float, float]]] = {}
    first: dict[str, int] = {}
    for rep in reps:
        top = max(rep.estimate.values())
        for r in rep.of("primus"):
            for i, (ph, c, v) in enumerate(zip(r.phases, r.configs, r.values, strict=True)):
                if i < GOAL_AT:
                    by.setdefault(ph, []).append((rep.estimate[c] / top, v / rep.land.best))
            first[r.phases[0] if r.phases else "-"] = first.get(r.phases[0] if r.phases else "-", 0) + 1
    for ph, xs in sorted(by.items()):
        est = statistics.median(x for x, _ in xs)
        meas = statistics.median(y for _, y in xs)
        out.append(
            f"primus's first {GOAL_AT} measured trials, phase {ph}: {len(xs)} trials; their estimate median "
            f"{est:.2f} of the model's best estimate (min {min(x for x, _ in xs):.2f}); measured median "
            f"{meas:.2f} of the measured best"
        )
    return out


def legal_space_losses(reps: Sequence[LandscapeReport]) -> list[str]:
    """Landscapes whose fastest measured row is outside the project's legal space."""
    out = []
    for rep in reps:
        above = [x for x in rep.land.illegal if x[1] > rep.land.best]
        if above:
            k, v, why = max(above, key=lambda x: x[1])
            out.append(f"{rep.land.name}: {k} measured {v / rep.land.best:.3f} of the legal best ({why})")
    return out


def goal_misses(reps: Sequence[LandscapeReport], samplers: Sequence[str]) -> list[str]:
    """Each landscape where ``primus``'s worst seed is below 0.99 after 5 measured trials or below the model's
    top k, with its attribution."""
    out = []
    for rep in reps:
        prim = rep.of("primus")
        if not prim:
            continue
        top5 = fraction(rep.of("top-k")[0].values, GOAL_AT, rep.land.best) if "top-k" in samplers else None
        cause = (
            "model ranking: its own top 5 reaches only " + f"{top5:.3f}"
            if top5 is not None and top5 < GOAL_FRACTION
            else "search: the model's top 5 had it"
        )
        worst = min(rep.fractions("primus", GOAL_AT))
        if worst < GOAL_FRACTION:
            w = min(prim, key=lambda r: fraction(r.values, GOAL_AT, rep.land.best))
            phases = ", ".join(w.phases[:GOAL_AT])
            out.append(
                f"{rep.land.name}: {worst:.3f} after {GOAL_AT} (seed {w.seed}; phases {phases}; measured best at "
                f"model rank {rep.best_model_rank}) -> {cause}"
            )
        if "top-k" in samplers:
            for k in TOPK_GOAL:
                p, t = min(rep.fractions("primus", k)), rep.fractions("top-k", k)[0]
                if p < t - 1e-9:
                    w = min(prim, key=lambda r: fraction(r.values, k, rep.land.best))
                    out.append(
                        f"{rep.land.name}: behind top-{k} ({p:.3f} worst seed vs {t:.3f}; seed {w.seed}'s first "
                        f"{k} phases: {', '.join(w.phases[:k])}; measured best at model rank {rep.best_model_rank})"
                    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="seeds of the stochastic methods (0..N-1)")
    ap.add_argument(
        "--split-seed", type=int, default=0, help="seed of the fitting / held-back split of groups"
    )
    ap.add_argument("--gpus", default="2,4,8", help="GPU counts whose landscapes are searched")
    ap.add_argument("--min-points", type=int, default=8, help="fewest measured legal points of a landscape")
    ap.add_argument(
        "--groups", default="", help="only these held-back groups, HIDDENxLAYERSxGBS comma-separated"
    )
    ap.add_argument("--budgets", default="3,5,10,15", help="measured-trial budgets reported")
    ap.add_argument(
        "--sweep-trials",
        type=int,
        default=None,
        help="search.sweep_trials of every study (default: the library's)",
    )
    ap.add_argument(
        "--start",
        choices=("auto", "baseline", "model"),
        default=None,
        help="search.start of every study (default: the library's)",
    )
    ap.add_argument("--max-trials", type=int, default=200, help="trials of any kind per study at most")
    ap.add_argument("--samplers", default=",".join(SAMPLERS), help="subset of " + ", ".join(SAMPLERS))
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="landscapes in parallel")
    args = ap.parse_args(argv)
    budgets = sorted({int(b) for b in args.budgets.split(",")} | set(TOPK_GOAL) | {GOAL_AT})
    samplers = [s for s in args.samplers.split(",") if s]
    if bad := [s for s in samplers if s not in SAMPLERS]:
        ap.error(f"unknown sampler(s) {bad}; choose from {SAMPLERS}")
    t0 = time.perf_counter()
    rows = load_rows()
    fit_g, held_g = split_groups(rows, args.split_seed)
    if args.groups:
        want = {tuple(int(x) for x in g.split("x")) for g in args.groups.split(",")}
        if bad_g := want - held_g:
            ap.error(f"--groups {sorted(bad_g)} are not held back with --split-seed {args.split_seed}")
        held_g = want
    with contextlib.redirect_stderr(io.StringIO()):
        fam = fit(rows, fit_g)
    gpus = [int(g) for g in args.gpus.split(",")]
    lands = build_landscapes(rows, held_g, gpus, args.min_points, args.sweep_trials, args.start)
    if not lands:
        ap.error("no landscape has --min-points measured points; lower it or pick other groups")
    seeds = list(range(args.seeds))
    work = [(land, fam, samplers, seeds, max(budgets), args.max_trials) for land in lands]
    if args.jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            reps = list(pool.map(_bench_one, work))
    else:
        reps = [_bench_one(w) for w in work]
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; split seed {args.split_seed}: fitted on {len(fit_g)} groups "
        f"(gemm peak {fam.gemm.peak_fraction}, half-work {fam.gemm.half_size:.0e}, host {fam.host_kernel_us} µs, "
        f"kernel {fam.kernel_us} µs); {len(reps)} held-back landscapes; {len(seeds)} seeds; fraction of the "
        "measured best after N measured trials (median / worst seed)\n"
    )
    print("\n".join(landscape_table(reps, budgets, samplers)))
    print()
    print("\n".join(summary_table(reps, budgets, samplers)))
    illegal = sum(len(rep.land.illegal) for rep in reps)
    losses = legal_space_losses(reps)
    print(
        f"\n{illegal} measured rows of these landscapes are outside the project's legal space (never searched); "
        f"on {len(losses)} landscapes the fastest measured row is one of them:"
    )
    for line in losses:
        print("  - " + line)
    print()
    for line in phase_diagnosis(reps):
        print(line)
    misses = goal_misses(reps, samplers)
    print(
        f"\ngoal (primus worst seed >= {GOAL_FRACTION} after {GOAL_AT} measured trials on every landscape, never "
        f"below the model's top k at k = {', '.join(map(str, TOPK_GOAL))}): "
        + ("met" if not misses else f"NOT met ({len(misses)})")
    )
    for m in misses:
        print("  - " + m)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
