"""Per shipped study: the legal configurations each constructor rule removes, and Megatron-Core's config classes
over the whole space.

    python scripts/check_constructor_rules.py [--transformer-config]

For each study in ``studies/``: the legal configurations (all rules), how many each of the rules taken from
framework constructors (``deepep_ep``, ``tp_comm_overlap_sp``) removes (the space enumerated without that rule,
minus the space with it), and how many of the removed ones have tp = 1 (the issue's "TP × EP = 1" count: the
flex dispatcher's group is expert-TP × EP and the export's expert TP is 1, so tp = 2 at ep = 1 is refused too).

``--transformer-config`` also builds Megatron-Core's ``TransformerConfig`` (megatron-core as installed, the
translation of tests/mcore/test_exported_configs.py) from every distinct export of every legal configuration
(micro-batch size aside) and counts those it refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from unittest.mock import patch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import primus_optuna.space.space as space_mod  # noqa: E402
from primus_optuna.space import Space, rules  # noqa: E402
from primus_optuna.space.megatron_args import megatron_overrides  # noqa: E402
from primus_optuna.spec import StudySpec  # noqa: E402

CONSTRUCTOR_RULES = ("deepep_ep", "tp_comm_overlap_sp")


def _space_without(spec: StudySpec, rule_id: str) -> list:
    """The legal configurations of ``spec`` with every rule but ``rule_id``."""
    with patch.object(space_mod, "RULES", tuple(r for r in rules.RULES if r.id != rule_id)):
        return Space(spec)._enumerate_list()


def _transformer_configs(spec: StudySpec, configs: list) -> tuple[int, dict[str, int]]:
    from tests.mcore.test_exported_configs import _args, transformer_config

    seen: set[str] = set()
    refused: dict[str, int] = {}
    for c in configs:
        values = megatron_overrides(spec, c)
        key = json.dumps(
            {k: v for k, v in values.items() if k != "micro_batch_size"}, sort_keys=True, default=str
        )
        if key in seen:
            continue
        seen.add(key)
        try:
            transformer_config(_args(spec, values))
        except Exception as exc:  # count each refusal by its message
            refused[str(exc)[:120]] = refused.get(str(exc)[:120], 0) + 1
    return len(seen), refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transformer-config", action="store_true")
    a = ap.parse_args()
    if a.transformer_config:
        import warnings

        import megatron.core.utils as mu
        from packaging.version import Version

        from tests.mcore.test_exported_configs import TE_VERSION

        warnings.filterwarnings("ignore")
        mu._te_version = Version(TE_VERSION)
    print(
        f"{'study':34} {'legal':>7} "
        + " ".join(f"{r:>20}" for r in CONSTRUCTOR_RULES)
        + "  deepep_ep at tp=1"
    )
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        spec = StudySpec.from_yaml(path)
        legal = Space(spec).configs()
        removed, kept = {}, set(legal)
        for rid in CONSTRUCTOR_RULES:
            before = _space_without(spec, rid)
            removed[rid] = [c for c in before if c not in kept]
        tp1 = sum(1 for c in removed["deepep_ep"] if c.tp == 1)
        print(
            f"{spec.name:34} {len(legal):7} "
            + " ".join(f"{len(v):20}" for v in removed.values())
            + f"  {tp1:17}"
        )
        if a.transformer_config:
            t = time.perf_counter()
            n, refused = _transformer_configs(spec, legal)
            print(
                f"    TransformerConfig: {n} distinct exports, {sum(refused.values())} refused "
                f"({time.perf_counter() - t:.1f} s) {refused or ''}"
            )


if __name__ == "__main__":
    main()
