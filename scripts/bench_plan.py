"""Benchmark: ``plan`` (legality + memory + step time of every legal configuration, ranking, Pareto set).

Each repeat loads the study afresh (cold per-spec caches) and runs :func:`plan_space`. The pipeline-schedule
simulations are memoised per process (they depend on the schedule shape, not the study), so the first repeat
is reported separately from the median of the others. Goal: the flagship's whole space in < 1 s on 2 cores.
Then prints the flagship's top 5 with breakdowns and the baseline's rank.

python scripts/bench_plan.py [--repeat 5] [--top 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from primus_optuna.physics import pipeline
from primus_optuna.physics.plan import plan_space
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec

ROOT = Path(__file__).resolve().parents[1]
FLAGSHIP = ROOT / "studies" / "mixtral-8x22b-mi355x-fp8.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    print(f"{'study':<30} {'legal':>6} {'fit':>6} {'first s':>8} {'median s':>9} {'sims':>5}")
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        pipeline._normalised.cache_clear()
        pipeline.chunk_mix.cache_clear()
        pipeline._shape.cache_clear()  # per-process tables of schedule shapes: cold too
        times = []
        result = None
        for _ in range(args.repeat):
            spec = StudySpec.from_yaml(path)  # fresh object: cold per-spec caches
            t0 = time.perf_counter()
            result = plan_space(spec, Space(spec), top=args.top)
            times.append(time.perf_counter() - t0)
        sims = pipeline._normalised.cache_info().currsize
        assert result is not None
        print(
            f"{spec.name:<30} {result.legal_configs:>6} {result.feasible_configs:>6} {times[0]:>8.2f} "
            f"{statistics.median(times[1:] or times):>9.2f} {sims:>5}"
        )
    spec = StudySpec.from_yaml(FLAGSHIP)
    result = plan_space(spec, Space(spec), top=args.top)
    print(f"\n{spec.name}: top {args.top} (tokens/s/GPU, peak GiB, breakdown s)")
    for i, e in enumerate(result.top, 1):
        terms = ", ".join(f"{k} {v:.2f}" for k, v in e.throughput.breakdown_s.items() if v > 0.005)
        print(
            f"{i}. {e.config.key()}: {e.tokens_per_s_per_gpu:,.0f} tok/s/GPU, {e.peak_gib:.1f} GiB, "
            f"step {e.throughput.step_time_s:.2f} s, MFU {e.throughput.mfu:.1%}\n   {terms}"
        )
    b = result.baseline
    if b is not None:
        rank = (
            f"rank {result.baseline_rank}"
            if result.baseline_rank
            else f"does not fit in memory; by throughput alone rank {result.baseline_throughput_rank}"
        )
        terms = ", ".join(f"{k} {v:.2f}" for k, v in b.throughput.breakdown_s.items() if v > 0.005)
        print(
            f"baseline {b.config.key()} ({rank}): {b.tokens_per_s_per_gpu:,.0f} tok/s/GPU, "
            f"{b.peak_gib:.1f} GiB\n   {terms}"
        )
    print(f"Pareto set: {len(result.pareto)} configurations")


if __name__ == "__main__":
    main()
