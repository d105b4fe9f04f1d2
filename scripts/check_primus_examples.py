"""How many primus-runner overlays merged into AMD's example experiments build (tests/data/primus-examples,
AMD-AGI/Primus examples/megatron/configs/MI300X|MI355X@fd1eeabb, the catalog models' files).

Each pretraining example is the ``experiment`` of a study of its catalog model on its GPU (4 nodes of 8, seq
4096, GBS 256, the file's precision); three configurations each (the baseline, the middle and the last legal
one). Prints the overlays built / failed and each failing file's first error.

    PYTHONPATH=. python scripts/check_primus_examples.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from primus_optuna.run.presets import primus_overlay
from primus_optuna.space import Space
from primus_optuna.spec import MODEL_CATALOG, StudySpec

EXAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "primus-examples"


def _key(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    models = {_key(m): m for m in MODEL_CATALOG}
    total, failed, first = 0, 0, {}
    files = sorted(EXAMPLES.glob("*/*-pretrain.yaml"))
    for path in files:
        model = models[_key(path.name.split("-")[0].replace("_v0.1", ""))]
        spec = StudySpec.from_dict(
            {
                "name": path.stem,
                "model": {"catalog": model},
                "cluster": {"gpu": path.parent.name.lower(), "nodes": 4, "gpus_per_node": 8},
                "workload": {
                    "seq_length": 4096,
                    "global_batch_size": 256,
                    "precision": "fp8" if "-FP8-" in path.name else "bf16",
                },
            }
        )
        space = Space(spec)
        legal = space.configs()
        experiment = yaml.safe_load(path.read_text())
        for config in (space.baseline, legal[len(legal) // 2], legal[-1]):
            total += 1
            try:
                primus_overlay(spec, config, experiment=experiment)
            except Exception as exc:  # noqa: BLE001 - counting every failure is the point
                failed += 1
                first.setdefault(f"{path.parent.name}/{path.name}", f"{type(exc).__name__}: {exc}"[:110])
    print(
        f"{total - failed} of {total} overlays build ({len(files)} example files), {failed} fail in {len(first)} files"
    )
    for name, error in first.items():
        print(f"  {name}: {error}")


if __name__ == "__main__":
    main()
