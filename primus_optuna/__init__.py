"""primus-optuna: find the fastest distributed-training configuration of an LLM, as an Optuna study.

Example::

    import optuna
    from primus_optuna import (AnalyticalRunner, MemoryPrefilterPruner, PrimusSampler, Space, StudySpec,
                               make_objective)

    spec = StudySpec.from_yaml("studies/mixtral-8x22b-mi355x-fp8.yaml")
    study = optuna.create_study(direction="maximize", sampler=PrimusSampler(spec),
                                pruner=MemoryPrefilterPruner(spec=spec))
    study.optimize(make_objective(spec, AnalyticalRunner(spec)), n_trials=30)

Every name but the errors is imported on first use, so ``import primus_optuna`` costs milliseconds (the
command line installs its Ctrl-C handling before anything heavy is imported).
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import PrimusError, SpecError
from .redaction import redact

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    # spec, space, physics (no Optuna, DSPy or torch)
    **dict.fromkeys(
        ("GPUSpec", "ModelSpec", "ParameterCounts", "PipelineSpec", "Recompute", "StudySpec"), "spec"
    ),
    "parse_recompute": "spec",
    **dict.fromkeys(("Space", "TrainingConfig", "parse_config_string"), "space"),
    **dict.fromkeys(
        (
            "Calibration",
            "EfficiencyCurve",
            "MemoryEstimate",
            "PlanEntry",
            "PlanResult",
            "StageMemory",
            "ThroughputEstimate",
            "estimate_memory",
            "estimate_throughput",
            "no_fit_message",
            "plan_space",
            "ranking_fidelity",
        ),
        "physics",
    ),
    # search (Optuna)
    "PrimusSampler": "search.sampler",
    "suggest_config": "search.suggest",
    "sweep_plan": "search.sweep",
    "sweep_design": "search.sweep",
    "prior_observations": "search.learner",
    "Observation": "search.learner",
    "budget_accounting": "record.budget",
    "llm_accounting": "search.llm_budget",
    "reserve_call": "search.llm_budget",
    "MemoryPrefilterPruner": "search.pruner",
    "study_calibrations": "search.calibrations",
    "store_spec": "search.state",
    "stored_spec": "search.state",
    "prune_if_infeasible": "search.pruner",
    "ThroughputPruner": "search.early_stop",
    "study_pruner": "search.early_stop",
    "warm_start": "record.earlier",
    # run
    "make_objective": "run.objective",
    "AnalyticalRunner": "run.analytical",
    "CommandRunner": "run.command",
    "ProfileRunner": "run.profile",
    "make_runner": "run.factory",
    "parse_log": "run.logparse",
    "Measurement": "run.base",
    "RunContext": "run.base",
    "RunFailure": "run.base",
    "OutOfMemory": "run.base",
    "RunTimeout": "run.base",
    "LaunchFailure": "run.base",
    "NoThroughput": "run.base",
    "EarlyStopped": "run.base",
    "LogFollower": "run.follow",
    "RepeatedLaunchFailure": "run.launch_guard",
    # record
    "open_study": "record.storage",
    "build_report": "record.report",
    "export_config": "record.export",
    "parse_export": "record.export",
    "note_hook": "record.dashboard",
    "refresh_study_note": "record.dashboard",
    "serve_dashboard": "record.dashboard",
    # spec import
    "import_primus_yaml": "spec.primus_import",
    # hardware profile (calibrate measures with torch)
    "HardwareProfile": "spec.profile",
    "load_profile": "spec.profile",
    "calibrate": "workloads.calibrate",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'primus_optuna' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Calibration",
    "EfficiencyCurve",
    "GPUSpec",
    "MemoryEstimate",
    "ModelSpec",
    "ParameterCounts",
    "PipelineSpec",
    "PlanEntry",
    "PlanResult",
    "PrimusError",
    "Recompute",
    "Space",
    "SpecError",
    "StageMemory",
    "StudySpec",
    "ThroughputEstimate",
    "TrainingConfig",
    "__version__",
    "estimate_memory",
    "estimate_throughput",
    "parse_config_string",
    "no_fit_message",
    "parse_recompute",
    "plan_space",
    "ranking_fidelity",
    "redact",
    *_LAZY,
]
