"""The pipeline simulations' on-disk memo (primus_optuna.physics.sim_cache): a fresh process reads what an
earlier one simulated and gets the same estimates without simulating; a changed simulation (another source
hash) or a corrupt file reads nothing; ``off`` disables it."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_optuna.physics import pipeline, sim_cache
from primus_optuna.physics.plan import plan_space
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from tests.conftest import FLAGSHIP


def _fresh_process_state() -> None:
    """What a new process starts with: no in-process memo, the file not read yet."""
    pipeline._normalised.cache_clear()
    pipeline._shape.cache_clear()
    sim_cache.SIMULATIONS.clear()


def _plan(spec: StudySpec) -> list[tuple[str, float, float]]:
    r = plan_space(spec, Space(spec), top=5)
    return [(e.config.key(), e.tokens_per_s_per_gpu, e.peak_gib) for e in r.ranked]


def test_a_fresh_process_reads_the_simulations_and_gets_the_same_plan(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(sim_cache.ENV, str(tmp_path))
    _fresh_process_state()
    first = _plan(StudySpec.from_yaml(FLAGSHIP))
    files = list(tmp_path.glob("pipeline-*.json"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    _fresh_process_state()

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated although the cache file holds the result")

    monkeypatch.setattr(pipeline, "simulate", no_simulation)
    assert _plan(StudySpec.from_yaml(FLAGSHIP)) == first
    _fresh_process_state()


def test_the_file_is_named_after_the_simulation_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(sim_cache.ENV, str(tmp_path))
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("x = 2\n")
    ca, cb = sim_cache.SimulationCache(a), sim_cache.SimulationCache(b)
    ca.put(("1f1b", 2, 1, 6, 10, 20, 0, 1, 0, 0, 0), ((1, 2, 0, 3, 0, 0, 0), 2))
    ca.save()
    assert cb.get(("1f1b", 2, 1, 6, 10, 20, 0, 1, 0, 0, 0)) is None  # another simulation's source
    fresh = sim_cache.SimulationCache(a)
    assert fresh.get(("1f1b", 2, 1, 6, 10, 20, 0, 1, 0, 0, 0)) == ((1, 2, 0, 3, 0, 0, 0), 2)


@pytest.mark.parametrize("content", ["{not json", '[["1f1b"]]', "[1, 2]"])
def test_a_corrupt_file_reads_nothing(tmp_path, monkeypatch, content: str) -> None:
    monkeypatch.setenv(sim_cache.ENV, str(tmp_path))
    src = tmp_path / "sim.py"
    src.write_text("y = 0\n")
    cache = sim_cache.SimulationCache(src)
    path = cache.path()
    assert path is not None
    path.write_text(content)
    assert cache.get(("1f1b", 2, 1, 6, 1, 1, 0, 0, 0, 0, 0)) is None


def test_off_disables_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(sim_cache.ENV, "off")
    assert sim_cache.cache_dir() is None
    cache = sim_cache.SimulationCache(Path(sim_cache.__file__))
    cache.put(("1f1b", 2, 1, 6, 1, 1, 0, 0, 0, 0, 0), ((1,) * 7, 1))
    cache.save()  # nowhere to write: a no-op
    assert not list(tmp_path.iterdir())
