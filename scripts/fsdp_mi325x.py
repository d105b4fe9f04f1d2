"""The published MI325X Llama 3.1 70B FSDP rows (tests/physics/test_throughput_validation.py ``PRIMUS``) under
three pricings: the distributed optimizer without recompute (how they were estimated before ``dp_shard``),
FSDP2 over the 64 GPUs without recompute, and FSDP2 as Primus's MI325X examples run it (recompute full, block,
72 of 80 layers; no gradient-accumulation fusion: ``PRIMUS_FSDP``). Prints model tokens/s/GPU, the error
against the published figure and the estimated peak memory.

PYTHONPATH=. python scripts/fsdp_mi325x.py
"""

from __future__ import annotations

from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from tests.physics.test_throughput_validation import PRIMUS, PRIMUS_FSDP, config, make_spec


def main() -> None:
    print(f"{'row':<24} {'pricing':<34} {'tok/s/GPU':>9} {'published':>9} {'error':>7} {'peak GiB':>8}")
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
