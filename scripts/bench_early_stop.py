"""GPU-hours to reach 99% of the best configuration, with and without early stopping and warm start.

    python scripts/bench_early_stop.py [--seeds 3] [--n-trials 30] [--local]

**Simulated cluster** (default). The study: Mixtral 8x7B on 4 nodes × 4 MI300X, global batch 64. A "cluster"
whose noise-free tokens/s/GPU for a configuration is the step-time model's times the seeded hidden multiplier of
``scripts/bench_search.py`` (``HiddenObjective``: per-axis-value and pairwise factors, within ±20%). Each trial
launches ``tests/helpers/fake_launcher.py simulate STEP_S ITERS NOISE SEED SCALE`` through the command runner:
a job that logs ``ITERS`` = 20 iterations whose times are the true step time × a Gaussian noise of 3% per
iteration (the first two 1.5× slower: warm-up), sleeping ``SCALE`` = 0.002 of each so the run takes seconds.
The runner follows the log live exactly as on a cluster (intermediate values, the study's pruner).

GPU-hours of a launched trial = (``STARTUP_S`` = 180 s: allocation, container, model init, NCCL set-up — an
assumption) + the logged iteration times up to its end or its stop) × 16 GPUs / 3600; memory-pruned and
duplicate trials launch nothing and cost 0. "To reach 99%": cumulative GPU-hours until the first completed trial
whose noise-free throughput is ≥ 99% of the best feasible configuration's (the space is enumerated).

Variants per seed (sampler seed = noise seed = hidden-objective seed): ``plain`` (``--no-early-stop``, no warm
start), ``early-stop`` (the default ``search.early_stop``), ``warm-start`` (imports an earlier study of the same
model on 2 nodes × 4 GPUs, global batch 32, 20 trials, run on the same hidden cluster — its GPU-hours are
reported apart, not counted), ``both``.

**Local CPU study** (``--local``): ``studies/local-gpt-cpu.yaml`` run for real (the 2-process GPT workload on
CPU), ``--no-early-stop`` then early stopping, then early stopping warm-started from the first run; "GPU-hours"
are core-hours (2 processes × wall time), the best is the best measured in any of the three runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import optuna  # noqa: E402
from bench_search import HiddenObjective  # noqa: E402

from primus_optuna import Space, StudySpec  # noqa: E402
from primus_optuna.physics.memory import estimate_memory  # noqa: E402
from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from primus_optuna.record.earlier import warm_start  # noqa: E402
from primus_optuna.record.storage import open_study  # noqa: E402
from primus_optuna.run.base import RunContext, RunFailure  # noqa: E402
from primus_optuna.run.command import CommandRunner  # noqa: E402
from primus_optuna.run.logparse import parse_log  # noqa: E402
from primus_optuna.run.objective import make_objective  # noqa: E402
from primus_optuna.search.early_stop import study_pruner  # noqa: E402
from primus_optuna.search.sampler import PrimusSampler  # noqa: E402
from primus_optuna.space import TrainingConfig  # noqa: E402

FAKE = ROOT / "tests" / "helpers" / "fake_launcher.py"
STARTUP_S = 180.0
ITERS = 20
NOISE = 0.03
SCALE = 0.002
State = optuna.trial.TrialState


def study_dict(name: str, nodes: int, gbs: int) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"catalog": "mixtral-8x7b"},
        "cluster": {"gpu": "mi300x", "nodes": nodes, "gpus_per_node": 4},
        "workload": {"seq_length": 4096, "global_batch_size": gbs, "precision": "bf16"},
        "search": {"baseline": {"tp": 1, "pp": 2, "ep": 4, "mbs": 1}, "axes": {"mbs": [1, 2]}},
    }


class SimulatedCluster:
    """A launching runner: the fake launcher replays the true step time of each configuration with noise."""

    kind = "command"
    launches_jobs = True

    def __init__(self, spec: StudySpec, hidden: HiddenObjective, seed: int) -> None:
        self.spec, self.hidden, self.seed = spec, hidden, seed

    def true_tps(self, config: TrainingConfig) -> float:
        return estimate_throughput(self.spec, config).tokens_per_s_per_gpu * self.hidden.multiplier(config)

    def run(self, config: TrainingConfig, context: RunContext) -> Any:
        w = self.spec.workload
        step = w.seq_length * w.global_batch_size / self.true_tps(config) / self.spec.world
        seed = self.seed * 100_003 + (context.trial_number or 0)
        argv = [
            sys.executable,
            str(FAKE),
            "simulate",
            f"{step:.6f}",
            str(ITERS),
            str(NOISE),
            str(seed),
            str(SCALE),
        ]
        runner = CommandRunner(self.spec, argv, timeout_s=600)
        runner.poll_s = 0.01
        return runner.run(config, context)


def trial_hours(spec: StudySpec, t: optuna.trial.FrozenTrial, runs: Path) -> float:
    """Simulated GPU-hours of one trial: start-up + the iterations its log shows (0 when nothing launched)."""
    log = runs / f"trial-{t.number:05d}" / "run.log"
    if not log.is_file():
        return 0.0
    records = parse_log(log.read_text()).records
    return (STARTUP_S + sum((r.elapsed_ms or 0.0) for r in records) / 1000.0) * spec.world / 3600.0


def run_study(
    spec: StudySpec, seed: int, n: int, tmp: Path, *, early_stop: bool, sources: tuple[str, ...] = ()
) -> tuple[optuna.Study, Path, str]:
    url = f"sqlite:///{tmp / (spec.name + '.db')}"
    handle = open_study(
        spec,
        storage=url,
        pruner=study_pruner(spec, launches_jobs=True, early_stop=early_stop),
        heartbeat_interval=None,
    )
    if sources:
        warm_start(handle.study, spec, sources)
    handle.study.sampler = PrimusSampler(spec, seed=seed)
    hidden = HiddenObjective(StudySpec.from_dict(study_dict("bench-es", 4, 64)), seed)
    objective = make_objective(spec, SimulatedCluster(spec, hidden, seed), runs_dir=handle.runs_dir)
    handle.study.optimize(objective, n_trials=n, catch=(RunFailure,))
    return handle.study, handle.runs_dir, url


def hours_to_reach(
    spec: StudySpec, study: optuna.Study, runs: Path, truth: Any, target: float
) -> tuple[float | None, float, float]:
    """(GPU-hours until a completed trial's true value reaches ``target``, total GPU-hours, best true value)."""
    total, reached, best = 0.0, None, 0.0
    space = Space(spec)
    for t in study.trials:
        total += trial_hours(spec, t, runs)
        if t.state == State.COMPLETE:
            config = space.canonical(TrainingConfig.from_params({a: t.params[a] for a in t.params}))
            v = truth(config)
            best = max(best, v)
            if reached is None and v >= target:
                reached = total
    return reached, total, best


def simulated(seeds: int, n: int) -> list[str]:
    spec = StudySpec.from_dict(study_dict("bench-es", 4, 64))
    old_spec = StudySpec.from_dict(study_dict("bench-es-earlier", 2, 32))
    space = Space(spec)
    out = [
        f"simulated cluster: {spec.model.name} on {spec.cluster.nodes}x{spec.cluster.gpus_per_node} "
        f"{spec.cluster.gpu.name}, {n} trials, {ITERS} iterations/job, {NOISE:.0%} noise, start-up {STARTUP_S:.0f} s",
        f"{'seed':>4} {'variant':<11} {'GPU-h to 99%':>12} {'GPU-h total':>11} {'best %':>7} {'stopped':>7} "
        f"{'ES saved':>8}",
    ]
    summary: dict[str, list[tuple[float | None, float]]] = {}
    for seed in range(seeds):
        hidden = HiddenObjective(spec, seed)
        cluster = SimulatedCluster(spec, hidden, seed)
        feasible = [c for c in space.configs() if estimate_memory(spec, c).fits]
        best_true = max(cluster.true_tps(c) for c in feasible)
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            old, old_runs, old_url = run_study(old_spec, seed, 20, tmp, early_stop=False)
            old_hours = sum(trial_hours(old_spec, t, old_runs) for t in old.trials)
            out.append(
                f"{seed:>4} (earlier study: 20 trials on 2x4 GPUs, GBS 32, {old_hours:.1f} GPU-h, not counted)"
            )
            for variant, es, ws in (
                ("plain", False, False),
                ("early-stop", True, False),
                ("warm-start", False, True),
                ("both", True, True),
            ):
                sub = tmp / variant
                sub.mkdir()
                st, runs, _ = run_study(spec, seed, n, sub, early_stop=es, sources=(old_url,) if ws else ())
                reached, total, best = hours_to_reach(spec, st, runs, cluster.true_tps, 0.99 * best_true)
                stopped = [
                    t for t in st.trials if str(t.user_attrs.get("prune_reason", "")).startswith("slow")
                ]
                saved = sum(float(t.user_attrs.get("gpu_hours_saved_early_stop") or 0) for t in stopped)
                summary.setdefault(variant, []).append((reached, total))
                out.append(
                    f"{seed:>4} {variant:<11} {'not reached' if reached is None else f'{reached:.1f}':>12} "
                    f"{total:>11.1f} {best / best_true:>7.1%} {len(stopped):>7} {saved:>8.1f}"
                )
    out.append("median over seeds (GPU-hours to 99% of the best; 'not reached' counts as the whole budget):")
    for variant, rows in summary.items():
        to99 = [r if r is not None else t for r, t in rows]
        missed = sum(r is None for r, _ in rows)
        out.append(
            f"  {variant:<11} {statistics.median(to99):7.1f} GPU-h to 99% ({missed} of {len(rows)} not reached), "
            f"{statistics.median(t for _, t in rows):7.1f} GPU-h for all {n} trials"
        )
    return out


def local(n: int) -> list[str]:
    study = ROOT / "studies" / "local-gpt-cpu.yaml"
    exe = Path(sys.executable).with_name("primus-optuna")
    out = [f"local CPU study: {study.name}, {n} trials per run (core-hours = 2 processes x wall time)"]
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        first = f"sqlite:///{tmp / 'plain.db'}"
        for name, extra in (
            ("plain", ["--no-early-stop"]),
            ("early-stop", []),
            ("both", ["--warm-start", first]),
        ):
            url = f"sqlite:///{tmp / (name + '.db')}"
            t0 = time.perf_counter()
            cmd = [
                str(exe),
                "run",
                str(study),
                "--storage",
                url,
                "--no-llm",
                "--no-progress",
                "--n-trials",
                str(n),
            ]
            proc = subprocess.run(cmd + extra, cwd=tmp, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(proc.stdout + proc.stderr)
            st = optuna.load_study(study_name="local-gpt-cpu", storage=url)
            results.append((name, st, time.perf_counter() - t0, proc.stdout))
        best = max(t.value for _, st, _, _ in results for t in st.trials if t.state == State.COMPLETE)
        for name, st, wall, stdout in results:
            total, reached = 0.0, None
            for t in st.trials:
                total += float(t.user_attrs.get("gpu_hours") or 0.0)
                if reached is None and t.state == State.COMPLETE and t.value >= 0.99 * best:
                    reached = total
            stopped = sum(str(t.user_attrs.get("prune_reason", "")).startswith("slow") for t in st.trials)
            acct = next((ln for ln in stdout.splitlines() if ln.startswith("GPU-hours:")), "")
            out.append(
                f"  {name:<11} core-h to 99% of the best ({best:.0f}): "
                f"{'not reached' if reached is None else f'{reached * 3600:.0f} core-s'}, total {total * 3600:.0f} "
                f"core-s, {stopped} stopped, wall {wall:.0f} s | {acct}"
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--n-trials", type=int, default=30)
    p.add_argument("--local", action="store_true", help="run the local CPU study instead")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    lines = local(min(args.n_trials, 12)) if args.local else simulated(args.seeds, args.n_trials)
    print("\n".join(lines))
    print(f"({time.perf_counter() - t0:.0f} s wall)")


if __name__ == "__main__":
    main()
