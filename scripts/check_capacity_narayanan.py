"""Check: ``capacity`` against the weak-scaling table of Narayanan et al. 2021 (Table 1; shared/reference/
validation.md), a public check of the curve's shape.

Each row is a GPT model on its own GPU count (A100 80GB, seq 2048, the row's global batch, fp16, full recompute,
no sequence parallelism, distributed optimizer or flash attention: what Megatron-LM ran in 2021, as
tests/physics/test_throughput_validation.py estimates the published configuration). Here the configuration is
not given: ``capacity_table`` searches the row's space (cp 1, recompute full, as the paper) and reports its best,
at the row's size and at half and twice of it. Printed: the best estimated TFLOP/s per GPU (the paper's FLOPs
formula) beside the published one, the ratio, the configuration found against the published one, and whether
the estimated per-GPU figures keep the published order and spread (published: 135-155 TFLOP/s, flat).

python scripts/check_capacity_narayanan.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.physics.capacity import capacity_table  # noqa: E402
from primus_optuna.physics.flops import narayanan_flops  # noqa: E402
from primus_optuna.spec import StudySpec  # noqa: E402
from tests.helpers.models import gpt_model  # noqa: E402
from tests.physics.test_throughput_validation import NARAYANAN, NARAYANAN_TORCH_DDP  # noqa: E402


def study(row: tuple) -> StudySpec:
    name, h, layers, heads, tp, pp, vpp, gpus, gbs, mbs, _ = row
    return StudySpec.from_dict(
        {
            "name": f"narayanan-{name}",
            "model": gpt_model(h, layers, heads),
            "cluster": {"gpu": "a100-80gb", "nodes": gpus // 8, "gpus_per_node": 8},
            "workload": {
                "seq_length": 2048,
                "global_batch_size": gbs,
                "precision": "fp16",
                "distributed_optimizer": False,
                "flash_attention": False,
                "sequence_parallel": False,
                "grad_reduce_in_fp32": False,
                "overlap_grad_reduce": name in NARAYANAN_TORCH_DDP,
                "gradient_accumulation_fusion": False,
            },
            "search": {
                "baseline": {"tp": tp, "pp": pp, "vpp": vpp, "mbs": mbs, "recompute": "full"},
                "axes": {"cp": [1], "recompute": ["full"], "mbs": sorted({1, 2, 4, 8, mbs})},
            },
        }
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print(
        f"{'model':>7} {'GPUs':>5} {'published':>9} {'estimated':>9} {'ratio':>6}  {'x0.5':>6} {'x2':>6}  "
        "best found (published TP/PP/VPP/MBS)"
    )
    t0 = time.perf_counter()
    got = []
    for row in NARAYANAN:
        name, h, layers, heads, tp, pp, vpp, gpus, gbs, mbs, published = row
        spec = study(row)
        sizes = [gpus // 2, gpus, 2 * gpus] if gpus >= 16 else [gpus, 2 * gpus]
        table = capacity_table(spec, sizes)
        rows = {r.gpus: r for r in table.rows(spec.cluster.gpu.name)}
        flops = narayanan_flops(gbs, 2048, layers, h, 51200)

        def tflops(n: int, flops: float = flops, rows: dict = rows) -> float | None:
            r = rows.get(n)
            return None if r is None or r.best is None else flops / r.best.throughput.step_time_s / n / 1e12

        here = tflops(gpus)
        got.append(here or 0.0)
        half, double = tflops(gpus // 2), tflops(2 * gpus)
        best = rows[gpus].best
        cfg = best.config if best else rows[gpus].why_not
        print(
            f"{name:>7} {gpus:>5} {published:>9} {here or 0:>9.1f} {(here or 0) / published:>6.2f}  "
            f"{half or 0:>6.1f} {double or 0:>6.1f}  {cfg} (TP{tp} PP{pp} VPP{vpp} MBS{mbs})"
        )
    pub = [r[-1] for r in NARAYANAN]
    ratios = [g / p for g, p in zip(got, pub, strict=True)]
    within = sum(abs(r - 1) <= 0.15 for r in ratios)
    print(
        f"\nwithin ±15%: {within}/{len(ratios)}; estimated spread {min(got):.0f}-{max(got):.0f} TFLOP/s "
        f"(published {min(pub)}-{max(pub)}); {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
