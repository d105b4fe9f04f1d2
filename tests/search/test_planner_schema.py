"""What counts as a reason in a planner's answer."""


def test_a_rationale_that_repeats_the_prompt_or_itself_is_not_kept_as_a_reason():
    """A small model often copies its input or loops on a phrase in place of a reason (SmolLM2 in rank mode:
    "10.675, 10.675, ..."); such a rationale is replaced by a note saying so."""
    from primus_optuna.search.planner_schema import no_reason, prompt_text

    inputs = {
        "study": "Qwen3 30B-A3B on 1 x 8 H200, BF16, seq 4096, global batch 256",
        "shortlist": "1. tp1-pp1-ep8: expected 10,756 tokens/s/GPU (±8%; 100% of the best), model 10,756",
        "rows": [{"note": "deepep pays off at ep 8 on one node"}],
    }
    prompt = prompt_text(inputs)
    assert "deepep pays off" in prompt and "10,756" in prompt
    for copied in (
        "Qwen3 30B-A3B on 1 x 8 H200, BF16, seq 4096",
        "expected 10,756 tokens/s/GPU (±8%; 100% of the best)",
    ):
        assert "repeated the prompt" in no_reason(copied, prompt)
    loop = "pick a value which has to be evaluated by a single evaluation function, " * 3
    assert "repeated itself" in no_reason(loop, prompt)
    assert "held no words" in no_reason("10,675,100.2 GiB, " + "10.675, " * 20, prompt)
    assert "held no words" in no_reason("1.97857142857-1-1-1.5-1.75.0.5-2.4-0.6.2.7.5-5.3", prompt)
    assert "held no words" in no_reason("][", prompt)
    assert no_reason(" \n", prompt) == "(no reason given)"  # an empty rationale still says so
    assert no_reason("ep 8 keeps the all-to-all inside the node, so deepep wins", prompt) is None
    assert no_reason("the best", prompt) is None  # too short to judge
    # the answer schema as sent (a response_format class) counts as prompt: its descriptions are echoed too
    from pydantic import BaseModel

    class Choice(BaseModel):
        """One choice of the rank mode: a number on the shortlist and why."""

    sent = prompt_text([inputs, [[None, Choice]]])
    assert "repeated the prompt" in no_reason(
        "A single choice of the rank mode: a number on the shortlist and why.", sent
    )
