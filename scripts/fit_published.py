"""Published runs against the step-time model: raw error, and error after one scale per (release, GPU family).

    python scripts/fit_published.py

Data: tests/data/published-runs.csv (sources in its `source` column); only rows the model can express
(tests/helpers/published.py). Software releases move throughput a lot, so each (release, family) group gets
its own scale (geometric mean of measured/estimated); a row is within tolerance at ±20% after it.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from tests.helpers.published import load_published  # noqa: E402


def calibrated_errors() -> dict[tuple[str, str], tuple[float, list[tuple[str, float, float, float, float]]]]:
    """{(release, family): (scale, [(label, estimated, measured, raw error, calibrated error)])}"""
    groups: dict = defaultdict(list)
    for p in load_published():
        est = estimate_throughput(p.spec, p.config).tokens_per_s_per_gpu
        groups[(p.release, p.family)].append((p.label, est, p.measured_tps))
    out = {}
    for key, rows in groups.items():
        scale = math.exp(sum(math.log(m / e) for _, e, m in rows) / len(rows))
        out[key] = (scale, [(lab, e, m, e / m - 1, scale * e / m - 1) for lab, e, m in rows])
    return out


def main() -> None:
    print("| release | family | scale | row | estimated | measured tok/s/GPU | raw error | after scale |")
    print("|---|---|---|---|---|---|---|---|")
    n = within = 0
    for (release, family), (scale, rows) in sorted(calibrated_errors().items()):
        for lab, e, m, raw, cal in rows:
            n += 1
            within += abs(cal) <= 0.20
            print(
                f"| {release} | {family} | {scale:.3f} | {lab} | {e:,.0f} | {m:,.0f} | {raw:+.1%} | {cal:+.1%} |"
            )
    print(f"\n{within} of {n} rows within ±20% after their (release, family) scale")


if __name__ == "__main__":
    main()
