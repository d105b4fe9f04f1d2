"""Benchmark: ``plan`` CPU time and wall time per study (CPU time is what a quiet machine would take when
the wall clock is inflated by other processes sharing the cores).

For each study: ``--repeat`` calls of :func:`plan_space` on a fresh spec (cold per-spec caches); the
process-wide pipeline-schedule simulations are cleared before the first call, so the first is "cold" and the
others "warm".

python scripts/bench_plan_cpu.py studies/deepseek-v3-mi355x-fp8.yaml studies/gpt-oss-120b-h100-bf16.yaml
"""

from __future__ import annotations

import argparse
import time

from primus_optuna.physics import pipeline
from primus_optuna.physics.plan import plan_space
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("studies", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'study':<30} {'legal':>6} {'fit':>6}  cold cpu/wall s   warm cpu/wall s")
    for path in args.studies:
        pipeline._normalised.cache_clear()
        pipeline.chunk_mix.cache_clear()
        pipeline._shape.cache_clear()  # per-process tables of schedule shapes: cold too
        runs = []
        result = None
        for _ in range(args.repeat):
            spec = StudySpec.from_yaml(path)
            cpu, wall = time.process_time(), time.perf_counter()
            result = plan_space(spec, Space(spec), top=5)
            runs.append((time.process_time() - cpu, time.perf_counter() - wall))
        assert result is not None
        warm = ", ".join(f"{c:.2f}/{w:.2f}" for c, w in runs[1:])
        print(
            f"{spec.name:<30} {result.legal_configs:>6} {result.feasible_configs:>6}  "
            f"{runs[0][0]:.2f}/{runs[0][1]:.2f}        {warm}"
        )


if __name__ == "__main__":
    main()
