"""A small primus-optuna study built by hand: trials carry the contract's user attrs (issue 7 tests)."""

from __future__ import annotations

from typing import Any

import optuna

from primus_optuna.space import Space
from primus_optuna.spec import StudySpec

SENTINEL_KEY = "sk-sentinel-0123456789abcdef"


def small_spec() -> StudySpec:
    spec = StudySpec.from_yaml("studies/qwen3-30b-a3b-h200-bf16.yaml").to_dict()
    spec["llm"] = {"model": "openai/test-model", "api_key_env": "PRIMUS_TEST_API_KEY"}
    spec["runner"] = {"kind": "command", "options": {"steps": 20}}
    return StudySpec.from_dict(spec)


# (phase, axes changed from the baseline, state, measured, extra attrs)
TRIALS: list[tuple[str, dict[str, Any], str, float | None, dict[str, Any]]] = [
    ("sweep", {}, "COMPLETE", 4500.0, {}),
    ("sweep", {"mbs": 4}, "COMPLETE", 4800.0, {}),
    ("sweep", {"mbs": 8}, "PRUNED", None, {"prune_reason": "memory: peak 150.20 GiB > usable 126.00 GiB"}),
    ("sweep", {"tp": 2}, "COMPLETE", 4100.0, {}),
    ("sweep", {"recompute": "full"}, "COMPLETE", 3700.0, {}),
    (
        "planner",
        {"mbs": 4, "moe_dispatcher": "deepep"},
        "COMPLETE",
        5200.0,
        {"rationale": "DeepEP with MBS 4"},
    ),
    (
        "planner",
        {"pp": 2, "vpp": 3, "pp_schedule": "interleaved"},
        "PRUNED",
        None,
        {"prune_reason": "illegal: vpp"},
    ),
    ("fallback", {"mbs": 1}, "COMPLETE", 4300.0, {"fallback_reason": "llm max_calls reached"}),
    ("fallback", {"cp": 2}, "FAIL", None, {"failure_reason": "oom", "log_tail": f"key={SENTINEL_KEY} oom"}),
]


def make_study(storage: str, *, multi: bool = False, name: str = "small") -> optuna.Study:
    spec = small_spec()
    space = Space(spec)
    directions = ["maximize", "minimize"] if multi else ["maximize"]
    study = optuna.create_study(study_name=name, storage=storage, directions=directions)
    study.set_user_attr("primus_spec", spec.to_dict())
    study.set_user_attr("llm_calls", 2)
    study.set_user_attr("llm_tokens", 3456)
    study.set_user_attr("llm_cost_usd", 0.0123)
    study.set_user_attr(
        "planner_rounds",
        [
            {
                "round": 1,
                "tokens": 3456,
                "cost_usd": 0.0123,
                "candidates": [
                    {
                        "config": {"mbs": 4, "moe_dispatcher": "deepep"},
                        "accepted": True,
                        "rationale": "DeepEP",
                    },
                    {
                        "config": {"tp": 3},
                        "accepted": False,
                        "reason": "illegal: tp=3 does not divide 32 heads",
                    },
                ],
            },
            {"round": 2, "fallback_reason": "llm max_calls reached", "candidates": []},
        ],
    )
    dists = {a: optuna.distributions.CategoricalDistribution(space.candidates[a]) for a in space.candidates}
    for i, (phase, axes, state, measured, extra) in enumerate(TRIALS):
        c = space.canonical(space.make(**axes))
        estimate = (measured or 4000.0) * 1.1
        peak = 60.0 + 10 * c.mbs
        attrs = {
            "phase": phase,
            "proposer": {"sweep": "sweep", "planner": "llm", "fallback": "model"}[phase],
            "config_key": c.key(),
            "estimate_tokens_per_s_per_gpu": estimate,
            "memory_peak_gib": peak,
            "memory_usable_gib": 126.0,
            "memory_peak_stage": 0,
            "step_time_s": spec.tokens_per_step / (estimate * spec.world),
            "breakdown_s": {"compute": 1.5, "tp_comm": 0.1, "pp_bubble": 0.0},
            **extra,
        }
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
