"""Benchmark of issue 5: PrimusSampler and ``primus-optuna run`` on the flagship study (analytical runner).

    python scripts/bench_sampler.py [--study studies/mixtral-8x22b-mi355x-fp8.yaml] [--trials 30] [--repeat 3]

1. The best configuration and its gain over the baseline after N trials (PrimusSampler without LLM).
2. Wall time of ``primus-optuna run STUDY --n-trials N`` in a fresh directory (a new process each time:
   imports, study creation in SQLite, the sweep plan, the fallback's table of estimates; median of repeats).
3. Sampler time per trial (``before_trial`` + ``infer_relative_search_space`` + ``sample_relative`` +
   ``sample_independent`` + ``after_trial``), PrimusSampler against TPESampler on the same study, in-memory
   storage, same objective, N trials each.
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

import optuna

from primus_optuna import StudySpec
from primus_optuna.run.objective import make_objective
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.search.sampler import PrimusSampler

ROOT = Path(__file__).resolve().parents[1]
HOOKS = (
    "before_trial",
    "infer_relative_search_space",
    "sample_relative",
    "sample_independent",
    "after_trial",
)


def timed(sampler: optuna.samplers.BaseSampler) -> list[float]:
    """Wrap the sampler's hooks so their time accumulates in the returned one-element list."""
    total = [0.0]
    for name in HOOKS:
        fn = getattr(sampler, name)

        def wrapper(*a, _fn=fn, **k):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                total[0] += time.perf_counter() - t0

        setattr(sampler, name, wrapper)
    return total


def run_library(spec: StudySpec, sampler: optuna.samplers.BaseSampler, n: int) -> tuple[optuna.Study, float]:
    total = timed(sampler)
    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    with tempfile.TemporaryDirectory() as tmp:
        study.optimize(make_objective(spec, runs_dir=tmp), n_trials=n)
    return study, total[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default=str(ROOT / "studies" / "mixtral-8x22b-mi355x-fp8.yaml"))
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec.from_yaml(args.study)
    n = args.trials

    sampler = PrimusSampler(spec, seed=spec.search.seed)
    t0 = time.perf_counter()
    _ = sampler.plan, sampler.fallback.rows()  # one-time set-up, timed apart
    setup_s = time.perf_counter() - t0
    study, primus_s = run_library(spec, sampler, n)
    State = optuna.trial.TrialState
    done = [t for t in study.trials if t.state == State.COMPLETE]
    best = max(done, key=lambda t: t.value)
    base = next((t for t in study.trials if t.user_attrs.get("sweep_axis") == "baseline"), None)
    print(f"study {spec.name}, {n} trials, analytical runner, PrimusSampler(seed={spec.search.seed}), no LLM")
    print(f"  best: trial {best.number} ({best.user_attrs['phase']}) {best.user_attrs['config_key']}")
    print(f"        {best.value:.1f} tokens/s/GPU, peak {best.user_attrs['memory_peak_gib']:.1f} GiB")
    if base is not None and base.state == State.COMPLETE:
        print(f"  baseline: {base.value:.1f} tokens/s/GPU -> gain {best.value / base.value - 1:+.1%}")
    elif base is not None:
        est = base.user_attrs["estimate_tokens_per_s_per_gpu"]
        print(f"  baseline: {base.state.name.lower()} ({base.user_attrs.get('prune_reason', '')})")
        print(
            f"            its estimate {est:.1f} tokens/s/GPU -> gain over that estimate {best.value / est - 1:+.1%}"
        )
    pruned = sum(t.state == State.PRUNED for t in study.trials)
    print(f"  complete {len(done)}, pruned {pruned}")

    tpe_study, tpe_s = run_library(spec, optuna.samplers.TPESampler(seed=spec.search.seed), n)
    tpe_done = [t for t in tpe_study.trials if t.state == State.COMPLETE]
    tpe_best = max((t.value for t in tpe_done), default=float("nan"))
    print(f"sampler time per trial over {n} trials (in-memory storage):")
    print(
        f"  PrimusSampler {primus_s / n * 1000:8.1f} ms   (+ one-time set-up {setup_s:.2f} s: sweep plan, "
        "table of feasible configurations' estimates)"
    )
    print(f"  TPESampler    {tpe_s / n * 1000:8.1f} ms   (TPE best after {n}: {tpe_best:.1f} tokens/s/GPU)")

    walls = []
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            exe = str(Path(sys.executable).with_name("primus-optuna"))
            cmd = [exe, "run", args.study, "--n-trials", str(n), "--no-progress"]
            cmd += ["--storage", f"sqlite:///{tmp}/bench.db"]
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
            walls.append(time.perf_counter() - t0)
    print(
        f"`primus-optuna run --n-trials {n}` wall time: median {statistics.median(walls):.2f} s "
        f"(min {min(walls):.2f}, max {max(walls):.2f}, {args.repeat} runs; goal < 15 s)"
    )


if __name__ == "__main__":
    main()
