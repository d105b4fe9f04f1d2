"""Benchmark: size of each shipped study's legal space and the time to enumerate it.

python scripts/bench_space.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from primus_optuna import Space, StudySpec

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{'study':<34} {'product':>9} {'legal':>7} {f'enumerate ms (median of {args.repeat})':>28}")
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        spec = StudySpec.from_yaml(path)
        times, n = [], 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            space = Space(spec)
            n = len(space.configs())
            times.append((time.perf_counter() - t0) * 1000)
        product = 1
        for values in space.candidates.values():
            product *= len(values)
        print(f"{spec.name:<34} {product:>9} {n:>7} {statistics.median(times):>28.1f}")


if __name__ == "__main__":
    main()
