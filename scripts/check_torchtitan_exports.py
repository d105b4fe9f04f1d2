"""By-hand sweep (CI checks the studies' best trials: tests/titan) of ``--format torchtitan`` over whole spaces.

Every k-th legal configuration of each shipped study TorchTitan 0.3 has a registry function for, run as a
TorchTitan study (DeepSeek-V3 in bf16), goes through the CI check's
:func:`tests.titan.test_exported_torchtitan.check_export`: TorchTitan's own ``ConfigManager().parse_args`` on
the exported text, ``ParallelDims`` and its device meshes on a fake process group, the pipeline stage count and
split, the trainer's sequence and batch arithmetic, the parsed degrees/AC/batch against the configuration.

    python scripts/check_torchtitan_exports.py [--every K]

Needs torchtitan 0.3.0 (scripts/requirements-titan.txt).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from primus_optuna.errors import SpecError  # noqa: E402
from primus_optuna.space import Space  # noqa: E402
from primus_optuna.space.torchtitan_args import TITAN_MODELS, titan_target  # noqa: E402
from primus_optuna.spec import StudySpec  # noqa: E402
from tests.titan.test_exported_torchtitan import check_export, titan_study  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=20)
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    total, failures = 0, []
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        spec = titan_study(StudySpec.from_yaml(path))
        try:
            titan_target(spec)
        except SpecError:
            if spec.model.name not in TITAN_MODELS:
                print(f"{spec.name}: no TorchTitan registry function (refused)")
                continue
            spec = titan_study(spec, precision="bf16")
        configs = Space(spec).configs()
        picked = configs[:: a.every]
        t0 = time.perf_counter()
        for c in picked:
            try:
                check_export(spec, c)
            except (AssertionError, ValueError, SystemExit, RuntimeError) as exc:
                failures.append(f"{spec.name} {c.key()}: {type(exc).__name__}: {exc}")
        total += len(picked)
        print(
            f"{spec.name}: {len(picked)} of {len(configs)} legal configurations, {time.perf_counter() - t0:.0f} s"
        )
    print(f"checked {total} TorchTitan exports: {len(failures)} refused")
    for f in failures[:20]:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
