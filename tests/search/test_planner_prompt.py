"""What the planner tells the model: each mode's inputs, read from the trials and cut to the prompt budget."""

import json

import optuna
import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.search.llm_client import PlannerAdapter
from primus_optuna.search.planner_prompt import (
    MIN_BEST_KEPT,
    PromptBuilder,
    ProposeConfigs,
    best_trials,
    sweep_effects,
)
from primus_optuna.search.planner_schema import answer_schema, response_format
from primus_optuna.search.sampler import PrimusSampler
from tests.conftest import small_moe_study

State = optuna.trial.TrialState


@pytest.fixture(scope="module")
def oneshot():
    spec = StudySpec.from_dict(
        {**small_moe_study(), "llm": {"model": "openai/test-model", "mode": "oneshot"}}
    )
    space = Space(spec)
    fmt = response_format(answer_schema(space, 4, reasoning=True), "json_schema")
    adapter = PlannerAdapter(fmt=fmt, fold_system=False, native_tools=False)
    return spec, space, adapter, PrimusSampler(spec).fallback.ranking([], k=10)


def test_compaction_keeps_the_corrected_ranking_until_the_legal_values_are_left_out(oneshot):
    """A budget that holds the prompt once the legal values are left out (the answer schema lists them): the
    corrected ranking keeps its :data:`MIN_BEST_KEPT` best instead of being cut to nothing first."""
    spec, space, adapter, ranking = oneshot
    prompt = PromptBuilder(spec, space, usable_gib=None, budget=10**6)
    kept = prompt.inputs([], 4, [], ranking, k_best=MIN_BEST_KEPT)
    with_values = prompt.prompt_tokens(adapter, ProposeConfigs, kept)
    without = prompt.prompt_tokens(adapter, ProposeConfigs, kept | {"legal_values": "(left out)"})
    assert without < with_values
    inputs, size, steps = prompt.compact(adapter, [], 4, [], ranking)
    assert size == prompt.prompt_tokens(adapter, ProposeConfigs, inputs) and steps == []
    prompt.budget = without + 20
    inputs, size, steps = prompt.compact(adapter, [], 4, [], ranking)
    assert size <= prompt.budget and "legal_values dropped" in steps
    assert len(json.loads(inputs["corrected_ranking"])) == MIN_BEST_KEPT
    assert "top trials cut to 0" not in steps and "sweep_effects dropped" not in steps


def _trial(value: float | None, state: State = State.COMPLETE, **attrs) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        state=state, values=None if value is None else [value], user_attrs=attrs, params={}, distributions={}
    )


def test_the_evidence_is_the_sweeps_effects_the_best_first_and_real_failures():
    trials = [
        _trial(100.0, config_key="base", phase="sweep", sweep_axis="tp", sweep_value=1),
        _trial(140.0, config_key="tp2", phase="sweep", sweep_axis="tp", sweep_value=2),
        _trial(
            None,
            State.PRUNED,
            config_key="tp8",
            phase="sweep",
            sweep_axis="tp",
            sweep_value=8,
            prune_reason="memory 90.1 GiB > 80.0 GiB usable",
        ),
        _trial(None, State.PRUNED, config_key="tp2", prune_reason="duplicate of trial 1"),
        _trial(120.0, config_key="mix", phase="planner", estimate_tokens_per_s_per_gpu=131.04),
    ]
    assert sweep_effects(trials) == {"tp": {"1": 100.0, "2": 140.0, "8": "memory 90.1 GiB > 80.0 GiB usable"}}
    doc = best_trials(trials, multi=False, k=2)
    assert [d["config"] for d in doc["best"]] == ["tp2", "mix"] and doc["best"][1]["estimate"] == 131.0
    assert [d["config"] for d in doc["pruned_or_failed"]] == ["tp8"]  # a duplicate is no evidence
    assert best_trials(trials, multi=False, k=0)["pruned_or_failed"] == []
    assert "Pareto" in best_trials(trials, multi=True)["objective"]
