"""FSDP against published runs: every FSDP row of tests/data/published-runs.csv (torch FSDP2 under Primus's
Megatron backend, Megatron-FSDP under Megatron-Bridge), and the MI325X Llama 3.1 70B rows under three pricings.

    PYTHONPATH=. python scripts/check_fsdp.py

1. Held out: per (framework, GPU family) one throughput scale is fitted on the group's other rows (geometric
   mean of measured ÷ estimated) and the row left out is reported against it (leave-one-out). A group with a
   single row has nothing to fit on: its error without a scale is reported, and, for Megatron-FSDP, the two
   Grace-Blackwell rows (GB200: family blackwell, GB300: blackwell_ultra) are also reported with the scale of
   the other one. The family constants (physics/calibration.py) were fitted with scripts/fit_published.py's
   split: the two Megatron-FSDP rows and the MI325X FP8 row are in its held-back part, the MI325X BF16 row in
   its fitting part.
2. The MI325X rows priced as the distributed optimizer without recompute (how they were estimated before
   ``dp_shard``), as FSDP2 over the 64 GPUs without recompute, and as Primus's MI325X examples run them
   (recompute full, block, 72 of 80 layers; no gradient-accumulation fusion: ``PRIMUS_FSDP``), with the
   estimated peak memory.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.physics.memory import estimate_memory  # noqa: E402
from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from scripts.fit_published import estimate  # noqa: E402
from tests.helpers.published import Published, load_published  # noqa: E402
from tests.physics.test_throughput_validation import PRIMUS, PRIMUS_FSDP, config, make_spec  # noqa: E402

TOLERANCE = 0.15
"""the goal: held-out FSDP runs within ±15% after one scale per (framework, GPU family)"""


def fsdp_rows() -> list[tuple[Published, float]]:
    """Every published FSDP row with its estimated tokens/s/GPU."""
    return [(p, estimate(p)) for p in load_published() if p.fsdp]


def _scale(rows: list[tuple[Published, float]]) -> float:
    return math.exp(statistics.fmean(math.log(p.measured_tps / e) for p, e in rows))


def held_out(rows: list[tuple[Published, float]]) -> list[tuple[str, str, str, float, float, float | None]]:
    """(framework, family, label, estimated, measured, throughput error after the scale fitted on the
    group's other rows; None when the group has no other row)."""
    groups: dict[tuple[str, str], list[tuple[Published, float]]] = defaultdict(list)
    for p, e in rows:
        groups[(str(p.fsdp), p.family)].append((p, e))
    out = []
    for (framework, family), members in sorted(groups.items()):
        for i, (p, e) in enumerate(members):
            others = members[:i] + members[i + 1 :]
            err = _scale(others) * e / p.measured_tps - 1 if others else None
            out.append((framework, family, p.label, e, p.measured_tps, err))
    return out


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    rows = fsdp_rows()
    print(
        "| framework | family | row | estimated | measured | error (no scale) | held out, after the group's scale |"
    )
    print("|---|---|---|---|---|---|---|")
    table = held_out(rows)
    for framework, family, label, e, m, err in table:
        shown = "n/a (no other row)" if err is None else f"{err:+.1%}"
        print(f"| {framework} | {family} | {label} | {e:,.0f} | {m:,.0f} | {e / m - 1:+.1%} | {shown} |")
    scored = [err for *_, err in table if err is not None]
    inside = sum(abs(err) <= TOLERANCE for err in scored)
    print(
        f"\nheld-out rows within ±{TOLERANCE:.0%} after one scale per (framework, family): {inside} of {len(scored)}"
    )
    mf = [(p, e) for p, e in rows if p.fsdp == "megatron-fsdp"]
    for i, (p, e) in enumerate(mf):  # across the two Grace-Blackwell families (not one family: see above)
        others = mf[:i] + mf[i + 1 :]
        if others:
            err = _scale(others) * e / p.measured_tps - 1
            print(f"megatron-fsdp, scale from the other Grace-Blackwell row: {p.label}: {err:+.1%}")

    print(f"\n{'row':<24} {'pricing':<34} {'tok/s/GPU':>9} {'published':>9} {'error':>7} {'peak GiB':>8}")
    for name, model, prec, mbs, tp, gbs, published in PRIMUS:
        if not name.endswith("-fsdp"):
            continue
        for label, workload, axes in (
            ("distributed optimizer, no recompute", {}, {}),
            ("FSDP2 (dp_shard=64), no recompute", {}, {"dp_shard": 64}),
            (
                "FSDP2 as Primus's example runs it",
                {"gradient_accumulation_fusion": False},
                {"dp_shard": 64, **PRIMUS_FSDP},
            ),
        ):
            spec = make_spec(model, "mi325x", 64, 8192, gbs, prec, True, **workload)
            c = config(spec, tp=tp, mbs=mbs, **axes)
            tps = estimate_throughput(spec, c).tokens_per_s_per_gpu
            peak = estimate_memory(spec, c).peak_gib
            print(
                f"{name:<24} {label:<34} {tps:>9.0f} {published:>9} {tps / published - 1:>+7.1%} {peak:>8.0f}"
            )


if __name__ == "__main__":
    main()
