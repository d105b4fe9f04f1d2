"""Shared fixtures: repository paths and small study dicts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"
FLAGSHIP = STUDIES / "mixtral-8x22b-mi355x-fp8.yaml"


@pytest.fixture
def flagship_path() -> Path:
    return FLAGSHIP


def small_moe_study(**search: object) -> dict:
    """A small MoE study (Mixtral 8x7B on 2 x 4 MI300X) whose product is cheap to brute-force."""
    return {
        "name": "small-moe",
        "model": {"catalog": "mixtral-8x7b"},
        "cluster": {"gpu": "mi300x", "nodes": 2, "gpus_per_node": 4},
        "workload": {"seq_length": 4096, "global_batch_size": 32, "precision": "bf16"},
        "search": {"baseline": {"tp": 1, "pp": 2, "ep": 4, "mbs": 1}, **search},
    }


def small_dense_study(**search: object) -> dict:
    return {
        "name": "small-dense",
        "model": {"catalog": "llama3.1-8b"},
        "cluster": {"gpu": "h100", "nodes": 1, "gpus_per_node": 8},
        "workload": {"seq_length": 4096, "global_batch_size": 64, "precision": "bf16"},
        "search": {"baseline": {"tp": 2, "pp": 2, "mbs": 1}, **search},
    }
