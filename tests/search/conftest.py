"""Fixtures of the search tests: small studies, study-file writing, a planner reply in DSPy's chat format, and
the planner tests' bench (:func:`planner`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.artifacts import FileSystemArtifactStore

from primus_optuna import Space, StudySpec, TrainingConfig
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.record.storage import StudyHandle, open_study
from primus_optuna.run.objective import make_objective
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.search.sampler import PrimusSampler
from tests.conftest import small_moe_study

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


@dataclass(frozen=True)
class Ideas:
    """Candidates a scripted planner can propose on the planner bench's study."""

    n_sweep: int
    """the sweep's length: the planner's first trial is trial ``n_sweep``"""
    baseline: TrainingConfig
    fits: list[TrainingConfig]
    """legal configurations that fit and that the sweep does not try, the step-time model's best first (a
    candidate far below the best is not launched)"""
    nofit: TrainingConfig
    """a legal configuration that does not fit"""

    @property
    def illegal(self) -> dict[str, Any]:
        """the first fitting idea with tp=3 (does not divide the heads)"""
        return {**self.fits[0].to_params(), "tp": 3}


class PlannerBench:
    """The small MoE study with an ``llm`` section (a fake OpenAI model, one-shot, no retries, 5 s timeout), a fake key in
    the environment, and the two ways the planner tests run it: in memory (a DummyLM) or in SQLite."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    def spec(self, **llm: Any) -> StudySpec:
        data = small_moe_study(sweep_order=["mbs"])
        # one-shot unless told (auto is rank mode with the loopback server's api_base)
        data["llm"] = {
            "model": "openai/test-model",
            "num_retries": 0,
            "timeout_s": 5,
            "mode": "oneshot",
            **llm,
        }
        return StudySpec.from_dict(data)

    def ideas(self, spec: StudySpec) -> Ideas:
        space = Space(spec)
        plan = PrimusSampler(spec).plan
        swept = {p.config for p in plan}
        fits = [c for c in space.configs() if c not in swept and estimate_memory(spec, c).fits]
        fits.sort(key=lambda c: -estimate_throughput(spec, c).tokens_per_s_per_gpu)
        nofit = next(c for c in space.configs() if not estimate_memory(spec, c).fits)
        return Ideas(len(plan), plan[0].config, fits, nofit)

    def run(self, spec: StudySpec, n_trials: int, *, n_jobs: int = 1, **sampler: Any) -> optuna.Study:
        """An in-memory study; the planner's transcripts go to ``tmp_path`` unless ``artifact_store`` is given."""
        sampler.setdefault("artifact_store", FileSystemArtifactStore(str(self.tmp_path)))
        study = optuna.create_study(
            direction="maximize",
            sampler=PrimusSampler(spec, **sampler),
            pruner=MemoryPrefilterPruner(spec=spec),
        )
        study.optimize(make_objective(spec), n_trials=n_trials, n_jobs=n_jobs)
        return study

    def open(self, spec: StudySpec, name: str = "s.db") -> StudyHandle:
        """The study in SQLite under ``tmp_path`` (created, or resumed when ``name`` exists)."""
        return open_study(spec, storage=f"sqlite:///{self.tmp_path / name}", pruner=MemoryPrefilterPruner())

    def stored(
        self,
        spec: StudySpec,
        n_trials: int,
        *,
        name: str = "s.db",
        n_jobs: int = 1,
        cache: bool = False,
        **sampler: Any,
    ) -> StudyHandle:
        """Run :meth:`open`'s study with the planner of ``spec.llm``, its transcripts in the study's artifact
        store (and its DSPy cache in the study's when ``cache``)."""
        handle = self.open(spec, name)
        sampler = {"llm": spec.llm, "artifact_store": handle.artifact_store, **sampler}
        if cache:
            sampler["cache_dir"] = handle.cache_dir
        handle.study.sampler = PrimusSampler(spec, **sampler)
        handle.study.optimize(
            make_objective(spec, runs_dir=handle.runs_dir), n_trials=n_trials, n_jobs=n_jobs
        )
        return handle


@pytest.fixture
def openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake ``OPENAI_API_KEY`` (the loopback server and DummyLM accept any key)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")


@pytest.fixture
def planner(tmp_path: Path, openai_key: None) -> PlannerBench:
    """The planner tests' bench (:class:`PlannerBench`), with ``OPENAI_API_KEY`` set to a fake key."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return PlannerBench(tmp_path)
