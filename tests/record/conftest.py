"""Fixtures of the record tests."""

from __future__ import annotations

import optuna
import pytest

from tests.helpers.recorded_study import SENTINEL_KEY, make_study


@pytest.fixture
def small_study(tmp_path, monkeypatch) -> tuple[str, optuna.Study]:
    monkeypatch.setenv("PRIMUS_TEST_API_KEY", SENTINEL_KEY)
    storage = f"sqlite:///{tmp_path / 'small.db'}"
    return storage, make_study(storage)
