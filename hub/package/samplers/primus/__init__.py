"""OptunaHub wrapper of primus-optuna: the sampler, the pruners and the objective of a distributed-training
configuration search (Megatron-LM / AMD Primus / TorchTitan parallelism, micro-batch, recompute, MoE
dispatcher, pipeline schedule). The implementation lives in the ``primus-optuna`` package (Apache-2.0); this
wrapper (MIT) only re-exports it, plus :func:`load_spec` for a study file."""

from __future__ import annotations

from pathlib import Path

from primus_optuna import AnalyticalRunner
from primus_optuna import make_objective
from primus_optuna import MemoryPrefilterPruner
from primus_optuna import PrimusSampler
from primus_optuna import prune_if_infeasible
from primus_optuna import StudySpec
from primus_optuna import suggest_config
from primus_optuna import ThroughputPruner


__all__ = [
    "AnalyticalRunner",
    "MemoryPrefilterPruner",
    "PrimusSampler",
    "StudySpec",
    "ThroughputPruner",
    "example_spec",
    "load_spec",
    "make_objective",
    "prune_if_infeasible",
    "suggest_config",
]


def load_spec(path: str | Path) -> StudySpec:
    """A primus-optuna study file (YAML)."""
    return StudySpec.from_yaml(path)


def example_spec() -> StudySpec:
    """The small study bundled with this package (Mixtral 8x7B on 2 x 4 MI300X)."""
    return load_spec(Path(__file__).with_name("small-moe.yaml"))
