"""FSDP2 memory per rank: torch's ``fully_shard`` on a gloo group of 2 and 4 CPU processes against the physics,
term by term (the measurement of tests/physics/test_fsdp_memory.py, printed; rank 0).

    PYTHONPATH=. python scripts/check_fsdp_memory.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.physics.layer_mix import rank_layer_params  # noqa: E402
from primus_optuna.physics.shapes import output_params  # noqa: E402
from tests.physics.test_fsdp_memory import ADAM_STEP_BYTES, MODEL, measure, physics, study  # noqa: E402


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    with tempfile.TemporaryDirectory() as d:
        got = measure(Path(d))
    rows: list[tuple[str, float, float]] = []
    for world in (2, 4):
        phys = physics(study(world), 0, dp_shard=world)
        share = phys["params"] / world
        r = got[world][0]["fsdp"]
        after, ws = r["backward"], r["working_set"]
        steps = ADAM_STEP_BYTES * r["tensors"]
        rows += [
            (f"{world} ranks: sharded gradients", after["Sharded Grad"], 4 * share),
            (f"{world} ranks: fp32 master + Adam moments", after["Sharded Param"] + after["OptState"] - steps, phys["optimizer"]),
            (f"{world} ranks: 16-bit sharded weights", 0, 2 * share),
            (f"{world} ranks: parameters in flight (2 units)", ws["params_in_flight"], phys["weights"] - 2 * share),
            (f"{world} ranks: gradients in flight", ws["grads_in_flight"], phys["gradients"] - 4 * share),
        ]  # fmt: skip
    hsdp = got[4][0]["hsdp"]["backward"]
    rows.append(
        (
            "4 ranks HSDP 2x2: sharded fp32 parameters",
            hsdp["Sharded Param"],
            4 * physics(study(4), 0, dp_shard=2)["params"] / 2,
        )
    )
    phys = physics(study(4, 2 * MODEL["num_layers"], pp=2), 1, dp_shard=2, pp=2)
    unit = max(rank_layer_params(study(2).model, 1, 1, False).total, output_params(study(2), 1, 2))
    held = got[2][0]["pipeline"]["held"]
    share = phys["params"] / 2
    rows += [
        ("2 ranks, PP stage: bf16 parameters held", held["Unsharded Param"], phys["weights"] - 2 * share),
        ("2 ranks, PP stage: fp32 unsharded gradients held", held["Temp"] + held["Unsharded Grad"], phys["gradients"] - 4 * share - 2 * unit),
    ]  # fmt: skip
    print("| term (bytes per rank) | torch fully_shard | physics | physics / torch |")
    print("|---|---|---|---|")
    for name, measured, model in rows:
        ratio = f"{model / measured:.3f}" if measured else "n/a (torch keeps none)"
        print(f"| {name} | {measured:,.0f} | {model:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
