"""Fixtures of the search tests: small studies, study-file writing, a planner reply in DSPy's chat format."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")


def chat_reply(candidates: list[dict[str, Any]], reasoning: str = "combine the best sweep values") -> str:
    """An assistant message that DSPy's ChatAdapter parses into ``reasoning`` and ``candidates``."""
    return (
        f"[[ ## reasoning ## ]]\n{reasoning}\n\n[[ ## candidates ## ]]\n{json.dumps(candidates)}\n\n"
        "[[ ## completed ## ]]"
    )


@pytest.fixture
def write_study(tmp_path: Path):
    def write(data: dict[str, Any], name: str = "study.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return path

    return write
