"""A small primus-optuna study built by hand (issue 7 tests): trials carry the contract's user attrs, and the
planner transcripts are study artifacts in the sampler's JSON format, in ``<storage stem>-artifacts``."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from primus_optuna.space import Space
from primus_optuna.spec import StudySpec

SENTINEL_KEY = "sk-sentinel-0123456789abcdef"
FALLBACK_WHY = "llm.max_calls=2 reached"


def small_spec() -> StudySpec:
    spec = StudySpec.from_yaml("studies/qwen3-30b-a3b-h200-bf16.yaml").to_dict()
    spec["llm"] = {"model": "openai/test-model", "api_key_env": "PRIMUS_TEST_API_KEY", "max_calls": 2}
    spec["runner"] = {"kind": "command", "options": {"train_iters": 20}}
    return StudySpec.from_dict(spec)


# (phase, axes changed from the baseline, state, measured, extra attrs)
TRIALS: list[tuple[str, dict[str, Any], str, float | None, dict[str, Any]]] = [
    ("sweep", {}, "COMPLETE", 4500.0, {"sweep_axis": "baseline"}),
    ("sweep", {"mbs": 4}, "COMPLETE", 4800.0, {"sweep_axis": "mbs"}),
    (
        "sweep",
        {"mbs": 8},
        "PRUNED",
        None,
        {"sweep_axis": "mbs", "prune_reason": "memory: 150.2 GiB on stage 0 > 126.0 GiB usable"},
    ),
    ("sweep", {"tp": 2}, "COMPLETE", 4100.0, {"sweep_axis": "tp"}),
    ("sweep", {"recompute": "full"}, "COMPLETE", 3700.0, {"sweep_axis": "recompute"}),
    (
        "planner",
        {"mbs": 4, "moe_dispatcher": "deepep"},
        "COMPLETE",
        5200.0,
        {"rationale": "DeepEP with MBS 4"},
    ),
    (
        "planner",
        {"mbs": 1, "moe_dispatcher": "deepep"},
        "PRUNED",
        None,
        {"prune_reason": "duplicate: trial 5"},
    ),
    (
        "fallback",
        {"mbs": 1},
        "COMPLETE",
        4300.0,
        {"rationale": f"planner unavailable ({FALLBACK_WHY}; 0 rejected); best calibrated estimate"},
    ),
    (
        "fallback",
        {"cp": 2},
        "FAIL",
        None,
        {
            "failure_reason": "oom",
            "log_tail": f"key={SENTINEL_KEY} oom",
            "rationale": f"planner unavailable ({FALLBACK_WHY}; 0 rejected); next best estimate",
        },
    ),
]

TRANSCRIPTS = [
    {
        "kind": "primus-optuna planner transcript",
        "model": "openai/test-model",
        "trial_number": 5,
        "time": "2026-01-01T10:00:00+0000",
        "elapsed_s": 1.5,
        "tokens": 2000,
        "cost_usd": 0.01,
        "accepted": [
            {"config": {"mbs": 4, "moe_dispatcher": "deepep"}, "key": "k1", "rationale": "DeepEP with MBS 4"},
            {"config": {"mbs": 1, "moe_dispatcher": "deepep"}, "key": "k2", "rationale": "small micro-batch"},
        ],
        "rejected": [
            {
                "candidate": {"tp": 3},
                "rationale": "odd TP",
                "reason": "illegal: tp=3 does not divide 32 heads",
            }
        ],
        "error": None,
    },
    {
        "kind": "primus-optuna planner transcript",
        "model": "openai/test-model",
        "trial_number": 7,
        "time": "2026-01-01T10:05:00+0000",
        "elapsed_s": 30.0,
        "tokens": 1456,
        "cost_usd": 0.0023,
        "accepted": [],
        "rejected": [],
        "error": "LMTimeoutError: request timed out",
    },
]


def make_study(storage: str, *, multi: bool = False, name: str = "small") -> optuna.Study:
    """The study in ``storage`` (a ``sqlite:///PATH`` URL) plus its artifact store next to the file."""
    spec = small_spec()
    space = Space(spec)
    directions = ["maximize", "minimize"] if multi else ["maximize"]
    study = optuna.create_study(study_name=name, storage=storage, directions=directions)
    study.set_user_attr("primus_spec", spec.to_dict())
    study.set_user_attr("llm_calls", 2)
    study.set_user_attr("llm_tokens", 3456)
    study.set_user_attr("llm_cost_usd", 0.0123)
    db = Path(storage.removeprefix("sqlite:///"))
    adir = db.with_name(db.stem + "-artifacts")
    adir.mkdir(exist_ok=True)
    store = FileSystemArtifactStore(str(adir))
    with tempfile.TemporaryDirectory() as tmp:
        for doc in TRANSCRIPTS:
            path = Path(tmp) / f"planner-call-{doc['trial_number']}.json"
            path.write_text(json.dumps(doc))
            upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=study)
    dists = {
        a: optuna.distributions.CategoricalDistribution(space.candidates[a]) for a in space.searched_axes
    }
    for i, (phase, axes, state, measured, extra) in enumerate(TRIALS):
        c = space.canonical(space.make(**axes))
        estimate = (measured or 4000.0) * 1.1
        peak = 60.0 + 10 * c.mbs
        attrs = {
            "phase": phase,
            "proposer": {"sweep": "sweep", "planner": "openai/test-model", "fallback": "fallback-model"}[
                phase
            ],
            "rationale": "sweep" if phase == "sweep" else "",
            "config_key": c.key(),
            "estimate_tokens_per_s_per_gpu": estimate,
            "memory_peak_gib": peak,
            "memory_usable_gib": 126.0,
            "memory_peak_stage": 0,
            **extra,
        }
        if state == "COMPLETE":
            attrs["step_time_s"] = spec.tokens_per_step / (estimate * spec.world)
            attrs["breakdown_s"] = {"compute": 1.5, "tp_comm": 0.1, "pp_bubble": 0.0}
        if measured is not None:
            attrs.update(
                source="measured",
                measured_tokens_per_s_per_gpu=measured,
                estimate_error=(estimate - measured) / measured,
            )
        values = None
        if state == "COMPLETE":
            values = [measured, peak] if multi else [measured]
        study.add_trial(
            optuna.trial.create_trial(
                params=c.to_params(),
                distributions=dists,
                values=values,
                user_attrs=attrs,
                state=getattr(optuna.trial.TrialState, state),
            )
        )
        assert study.trials[-1].number == i
    return study
