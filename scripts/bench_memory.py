"""Benchmark: legality + memory estimate of every legal configuration of each shipped study.

Each repeat loads the study afresh (cold per-spec cache), enumerates the legal space and estimates every
configuration's per-stage memory. Goal: the flagship's 25,760 configurations (issue 12's recompute values) in
< 0.5 s on 2 cores.

python scripts/bench_memory.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from primus_optuna.physics import estimate_memory
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(
        f"{'study':<30} {'legal':>6} {'fit':>6} {'enum ms':>8} {'memory ms':>10} {'total ms':>9} "
        f"{'configs/s':>10}  (median of {args.repeat})"
    )
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        enum_t, mem_t, tot_t = [], [], []
        n = fit = 0
        for _ in range(args.repeat):
            spec = StudySpec.from_yaml(path)  # fresh object: cold per-spec cache
            t0 = time.perf_counter()
            configs = Space(spec).configs()
            t1 = time.perf_counter()
            fit = sum(estimate_memory(spec, c).fits for c in configs)
            t2 = time.perf_counter()
            n = len(configs)
            enum_t.append((t1 - t0) * 1000)
            mem_t.append((t2 - t1) * 1000)
            tot_t.append((t2 - t0) * 1000)
        total = statistics.median(tot_t)
        print(
            f"{spec.name:<30} {n:>6} {fit:>6} {statistics.median(enum_t):>8.1f} "
            f"{statistics.median(mem_t):>10.1f} {total:>9.1f} {n / total * 1000:>10.0f}"
        )


if __name__ == "__main__":
    main()
