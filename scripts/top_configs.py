"""The model's fastest legal configurations that fit, term by term (seconds per step by breakdown term).

    python scripts/top_configs.py studies/mixtral-8x22b-mi355x-fp8.yaml [--top 5]

Every configuration of the study's space, legal (``Space.check``) and fitting (``estimate_memory().fits``),
sorted by ``estimate_throughput``: what docs/benchmarks.md compares before and after a model change.
"""

from __future__ import annotations

import argparse

from primus_optuna.physics.calibration import BREAKDOWN_TERMS
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    spec = StudySpec.from_yaml(args.study)
    space = Space(spec)
    rows = []
    for c in space.configs():
        if space.check(c) or not estimate_memory(spec, c).fits:
            continue
        rows.append((estimate_throughput(spec, c), c))
    rows.sort(key=lambda r: -r[0].tokens_per_s_per_gpu)
    print(f"{len(rows)} legal configurations that fit")
    names = [t.replace("compute_", "c_") for t in BREAKDOWN_TERMS]
    print("| # | config | tok/s/GPU | step s | " + " | ".join(names) + " |")
    print("|---" * (4 + len(names)) + "|")
    for i, (e, c) in enumerate(rows[: args.top], 1):
        cells = " | ".join(f"{e.breakdown_s[t]:.3f}" for t in BREAKDOWN_TERMS)
        print(f"| {i} | {c.key()} | {e.tokens_per_s_per_gpu:,.0f} | {e.step_time_s:.3f} | {cells} |")


if __name__ == "__main__":
    main()
