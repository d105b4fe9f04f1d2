"""Runner-test helpers: a study matching the recorded logs (64 GPUs, seq 8192, GBS 128), the fake launcher."""

from __future__ import annotations

import sys
from pathlib import Path

from primus_optuna.space import Space, TrainingConfig
from primus_optuna.spec import StudySpec

FAKE = str(Path(__file__).resolve().parent / "fake_launcher.py")


def mixtral_spec() -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "fake-mixtral",
            "model": {"catalog": "mixtral-8x22b"},
            "cluster": {"gpu": "mi355x", "nodes": 8, "gpus_per_node": 8},
            "workload": {"seq_length": 8192, "global_batch_size": 128, "precision": "fp8"},
            "search": {
                "baseline": {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "mbs": 2, "pp_schedule": "interleaved"}
            },
        }
    )


def baseline(spec: StudySpec) -> TrainingConfig:
    space = Space(spec)
    assert not space.check(space.baseline)
    return space.baseline


def fake_argv(*args: str) -> list[str]:
    return [sys.executable, FAKE, *args]
