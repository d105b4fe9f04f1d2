"""The planner as an agent with tools: scripted LMs (DSPy's DummyLM, text tool calls) and the loopback HTTP
server (OpenAI ``tool_calls``) drive it through check → estimate → submit, and through every failure mode."""

from __future__ import annotations

import json
import time
from pathlib import Path

import optuna
import pytest
from dspy.utils import DummyLM

from primus_optuna import Space
from primus_optuna.search.llm_budget import llm_accounting
from primus_optuna.search.planner_schema import REPAIRABLE, repair_near_miss
from primus_optuna.search.sampler import PrimusSampler
from tests.helpers.openai_server import OpenAIServer, Reply

State = optuna.trial.TrialState
SENTINEL = "sk-sentinel-AGENT-0123456789"


def _ideas(planner, spec):
    """An illegal idea (tp=3), two legal untried ones that fit, one that does not fit; the sweep's length."""
    ideas = planner.ideas(spec)
    return (
        ideas.illegal,
        ideas.fits[0].to_params(),
        ideas.fits[1].to_params(),
        ideas.nofit.to_params(),
        ideas.n_sweep,
    )


def _calls(*calls):
    """One DummyLM turn of ReActV2 in DSPy's text tool-call format."""
    return {
        "next_thought": "next step",
        "tool_calls": json.dumps({"tool_calls": [{"name": n, "args": a} for n, a in calls]}),
    }


def _transcripts(directory: Path):
    docs = [json.loads(p.read_text()) for p in directory.rglob("*") if p.is_file()]
    return sorted(
        (d for d in docs if d.get("kind") == "primus-optuna planner transcript"),
        key=lambda d: d["trial_number"],
    )


def test_agent_checks_an_illegal_idea_estimates_alternatives_and_proposes_a_legal_fitting_one(
    planner, tmp_path
):
    spec = planner.spec(mode="agent")
    illegal, good, other, nofit, n_sweep = _ideas(planner, spec)
    lm = DummyLM(
        [
            _calls(("check", {"config": illegal})),
            _calls(("estimate", {"config": nofit}), ("estimate", {"config": good})),
            _calls(("note", {"text": "tp=3 breaks the head count; the bigger layout does not fit"})),
            _calls(("submit", {"candidates": [{**good, "rationale": "legal, fits, untried"}]})),
            # the second call: the notes of the first are in its prompt
            _calls(("notes", {})),
            _calls(("submit", {"candidates": [{**other, "rationale": "the next idea"}]})),
        ]
    )
    study = planner.run(spec, n_sweep + 2, llm=lm)
    tail = study.trials[n_sweep:]
    assert [t.user_attrs["phase"] for t in tail] == ["planner", "planner"]
    space = Space(spec)
    assert tail[0].user_attrs["config_key"] == space.canonical(space.make(**good)).key()
    assert tail[0].user_attrs["rationale"].startswith("legal, fits, untried [expected ")
    first, second = _transcripts(tmp_path)
    assert first["mode"] == "agent"
    tools = [c["tool"] for c in first["tool_calls"]]
    assert tools == ["check", "estimate", "estimate", "note"]
    check = json.loads(first["tool_calls"][0]["result"])
    assert check["legal"] is False and any("tp=3 does not divide" in r for r in check["reasons"])
    no, yes = (json.loads(c["result"]) for c in first["tool_calls"][1:3])
    assert no["fits"] is False and no["why_not"].startswith("memory: ")
    assert yes["fits"] is True and yes["peak_gib_per_stage"] and yes["step_terms_s"]
    assert yes["usable_gib"] > max(yes["peak_gib_per_stage"])
    # each pipeline stage's work beside its memory (none without a pipeline)
    for est in (no, yes):
        stages = len(est["peak_gib_per_stage"])
        assert len(est.get("pipeline_work_s_per_stage", [0.0] * stages)) == stages
        assert ("pipeline_work_s_per_stage" in est) == (stages > 1)
    assert "tp=3 breaks the head count" in second["inputs"]["situation"]  # notes carried to the next call
    assert "tp=3 breaks the head count" in json.loads(second["tool_calls"][0]["result"])[0]
    books = llm_accounting(study)
    assert books["calls"] == 2 and books["tool_calls"] == 5 and books["accepted"] == 2
    assert books["notes"] == ["tp=3 breaks the head count; the bigger layout does not fit"]


def test_tool_budget_is_enforced_per_call(planner, tmp_path):
    spec = planner.spec(mode="agent", max_tool_calls=2)
    _, good, _, _, n_sweep = _ideas(planner, spec)
    lm = DummyLM(
        [
            _calls(("best", {})),
            _calls(("legal_values", {}), ("history", {"k": 3})),  # the second of these is refused
            _calls(("top_untried", {"k": 3})),  # the last turn: refused, then the submit is forced
            _calls(("submit", {"candidates": [{**good, "rationale": "forced submit"}]})),
        ]
    )
    study = planner.run(spec, n_sweep + 1, llm=lm)
    assert study.trials[-1].user_attrs["phase"] == "planner"
    (doc,) = _transcripts(tmp_path)
    ran = [c for c in doc["tool_calls"] if "refused" not in c]
    refused = [c for c in doc["tool_calls"] if c.get("refused") == "max_tool_calls"]
    assert [c["tool"] for c in ran] == ["best", "legal_values"]
    assert len(refused) == 2 and "call submit now" in refused[0]["result"]
    assert doc["termination"] == "forced_submit"


def test_agent_over_http_with_native_tool_calls(planner, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_TEST_API_KEY", SENTINEL)
    spec = planner.spec(mode="agent", api_key_env="PRIMUS_TEST_API_KEY")
    illegal, good, _, _, n_sweep = _ideas(planner, spec)
    replies = [
        Reply(tool_calls=[("check", {"config": illegal})]),
        Reply(
            tool_calls=[("estimate", {"config": good}), ("note", {"text": f"key {SENTINEL} must not leak"})]
        ),
        Reply(tool_calls=[("submit", {"candidates": [{**good, "rationale": "checked and estimated"}]})]),
    ]
    with OpenAIServer(replies) as srv:
        handle = planner.stored(spec, n_sweep + 1, name="a.db", llm_api_base=srv.url)
        requests = [json.loads(r["body"]) for r in srv.requests]
    assert len(requests) == 3
    names = {t["function"]["name"] for t in requests[0]["tools"]}
    assert {"check", "estimate", "history", "best", "legal_values", "budget", "top_untried", "note"} <= names
    submit = next(t for t in requests[0]["tools"] if t["function"]["name"] == "submit")
    item = submit["function"]["parameters"]["properties"]["candidates"]["items"]
    assert item["properties"]["tp"]["enum"] == Space(spec).legal_values()["tp"]  # schema from legal values
    tool_msgs = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs and "does not divide" in tool_msgs[0]["content"]  # the model saw the reason
    assert all(r["max_tokens"] == 1000 for r in requests)
    study = handle.study
    last = study.trials[-1]
    assert last.user_attrs["phase"] == "planner" and last.user_attrs["proposer"] == "openai/test-model"
    books = llm_accounting(study)
    assert books["calls"] == 1 and books["tokens"] == 3 * 150 and books["mode"] == "agent"
    assert books["notes"] == ["key [redacted] must not leak"]
    db = Path(handle.storage_url.removeprefix("sqlite:///")).read_bytes()
    assert SENTINEL.encode() not in db
    for p in handle.artifact_dir.rglob("*"):
        if p.is_file():
            assert SENTINEL.encode() not in p.read_bytes(), p


@pytest.mark.parametrize(
    ("replies", "why"),
    [
        ([Reply(tool_calls=[("check", "{not json")])], "could not be parsed"),
        (
            [Reply(tool_calls=[("launch_job", {"config": {}})]), Reply("I am done.")],
            "could not be parsed",
        ),
        (
            [Reply("{" + '"candidates": [' * 50, finish_reason="length", usage=(100, 1000))],
            "could not be parsed",
        ),
        ([Reply(tool_calls=[("best", {})], delay_s=3.0)], "timeout"),
    ],
    ids=["malformed-tool-call", "tool-error", "over-long-answer", "timeout"],
)
def test_agent_failures_end_in_the_fallback_with_the_reason(planner, tmp_path, replies, why, caplog):
    spec = planner.spec(mode="agent", timeout_s=1.5 if why == "timeout" else 30)  # see test_planner.py
    _, _, _, _, n_sweep = _ideas(planner, spec)
    with OpenAIServer(replies) as srv:
        handle = planner.stored(spec, n_sweep + 1, name="f.db", llm_api_base=srv.url)
    last = handle.study.trials[-1]
    assert last.state == State.COMPLETE and last.user_attrs["phase"] == "fallback"
    assert why in last.user_attrs["rationale"], last.user_attrs["rationale"]
    (doc,) = _transcripts(handle.artifact_dir)
    assert why in doc["error"]
    books = llm_accounting(handle.study)
    assert books["calls"] == 1
    if why == "timeout":
        assert books["failed"] == 1 and books["unparseable"] == 0
    else:
        assert books["unparseable"] == 1 and books["tokens"] >= 150  # usage counted though nothing parsed
    if replies[0].finish_reason == "length":  # named as the study's own setting, counted
        assert (
            "stopped at llm.max_tokens" in doc["error"] and books["truncated"] >= 1
        )  # each answer of the call
        assert "raise llm.max_tokens" in caplog.text and "LM response was truncated" not in caplog.text
    else:
        assert books.get("truncated", 0) == 0
    if replies[0].tool_calls and replies[0].tool_calls[0][0] == "launch_job":
        assert "Unknown tool" in json.dumps(doc["messages"])


def test_non_retryable_error_stops_the_planner_at_once(planner, tmp_path):
    spec = planner.spec(mode="oneshot", max_calls=5)
    _, _, _, _, n_sweep = _ideas(planner, spec)
    with OpenAIServer([Reply(status=404)]) as srv:
        handle = planner.stored(spec, n_sweep + 3, name="n.db", llm_api_base=srv.url)
        made = len(srv.requests)
    assert made == 1
    books = llm_accounting(handle.study)
    assert books["stop_reason"].startswith("planner stopped: HTTP 404")
    assert "/v1" in books["stop_reason"]
    assert "planner stopped: HTTP 404" in handle.study.trials[-1].user_attrs["rationale"]


def test_provider_refusing_tools_turns_the_planner_one_shot(planner, tmp_path):
    spec = planner.spec(mode="agent")
    _, _, good, _, n_sweep = _ideas(planner, spec)  # the second best: the fallback's trial takes the best
    answer = json.dumps({"reasoning": "ok", "candidates": [{**good, "rationale": "one-shot"}]})
    refuse = Reply(
        raw=json.dumps({"error": {"message": "tools are not supported by this model"}}), status=400
    )
    with OpenAIServer([refuse, answer]) as srv:
        handle = planner.stored(spec, n_sweep + 2, name="t.db", llm_api_base=srv.url)
        bodies = [json.loads(r["body"]) for r in srv.requests]
    assert "tools" in bodies[0] and "tools" not in bodies[1]
    assert bodies[1]["response_format"]["type"] == "json_schema"
    tail = handle.study.trials[n_sweep:]
    assert [t.user_attrs["phase"] for t in tail] == ["fallback", "planner"]
    assert "refuses tool calls" in tail[0].user_attrs["rationale"]
    assert tail[1].user_attrs["rationale"].startswith("one-shot [expected ")


def test_oneshot_schema_fold_compaction_and_near_miss_repair(planner, tmp_path):
    spec = planner.spec(mode="oneshot", fold_system_prompt=True, max_prompt_tokens=1200)
    space = Space(spec)
    plan = PrimusSampler(spec).plan
    ideas = planner.ideas(spec)
    # a near miss of one of the best ideas (one far below the best is not launched): one axis illegal
    target, near, note = next(
        (c, {**c.to_params(), axis: v}, f"{axis} {v}→{getattr(c, axis)}")
        for c in ideas.fits[:5]
        for axis in REPAIRABLE
        for v in space.candidates[axis]
        if v != getattr(c, axis)
        and space.check(space.canonical(space.make(**{**c.to_params(), axis: v})))
        and (repair_near_miss(space, {**c.to_params(), axis: v}) or (None,))[0] == c.to_params()
    )
    answer = json.dumps(
        {"reasoning": "virtual stages", "candidates": [{**near, "rationale": "vpp halves the bubble"}]}
    )
    with OpenAIServer([answer]) as srv:
        study = planner.run(spec, len(plan) + 1, llm=spec.llm, llm_api_base=srv.url)
        body = json.loads(srv.requests[0]["body"])
    assert [m["role"] for m in body["messages"]] == ["user"]  # the system message folded in
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["candidates"]["items"]["properties"]["pp_schedule"]["enum"] == [
        "1f1b",
        "interleaved",
        "zb1p",
        "zbv",
    ]
    last = study.trials[-1]
    assert last.user_attrs["phase"] == "planner" and last.user_attrs["config_key"] == target.key()
    assert last.user_attrs["rationale"].startswith(
        f"vpp halves the bubble (repaired: {note} to stay legal) [expected "
    )
    (doc,) = _transcripts(tmp_path)
    assert doc["compacted"] and doc["compacted"][0].startswith("top trials cut to")
    assert doc["prompt_tokens_estimate"] <= 1200 or "sweep_effects dropped" in doc["compacted"]
    assert llm_accounting(study)["repaired"] == 1


def test_unparseable_answers_in_a_row_stop_the_planner(planner, tmp_path):
    spec = planner.spec(mode="oneshot", max_unparseable=2, max_calls=6)
    _, _, _, _, n_sweep = _ideas(planner, spec)
    with OpenAIServer(["not an answer"]) as srv:
        handle = planner.stored(spec, n_sweep + 4, name="u.db", llm_api_base=srv.url)
        made = len(srv.requests)
    books = llm_accounting(handle.study)
    assert made == 2 and books["calls"] == 2 and books["unparseable"] == 2 and books["tokens"] == 300
    assert books["stop_reason"] == "planner stopped after 2 unparseable answers in a row"


def test_agent_budgets_hold_with_n_jobs(planner, tmp_path):
    """Eight threads, ``max_calls: 3``: three agent calls, each within its tool budget."""
    spec = planner.spec(mode="agent", max_calls=3, max_tool_calls=1)
    _, _, _, _, n_sweep = _ideas(planner, spec)
    with OpenAIServer([Reply(tool_calls=[("best", {})], delay_s=0.2)]) as srv:
        handle = planner.stored(spec, n_sweep + 12, name="p.db", llm_api_base=srv.url, n_jobs=8)
    books = llm_accounting(handle.study)
    assert books["calls"] == 3
    docs = _transcripts(handle.artifact_dir)
    assert len(docs) == 3
    for d in docs:
        assert len([c for c in d["tool_calls"] if "refused" not in c]) <= 1


def test_error_kinds():
    import litellm
    from dspy.utils.exceptions import AdapterParseError

    from primus_optuna.search.llm_client import PlannerTimeout, classify_error
    from primus_optuna.search.planner_prompt import ProposeConfigs

    def kind(exc):
        return classify_error(exc)[0]

    prose = AdapterParseError("JSONAdapter", ProposeConfigs, "sorry, the request timed out; context window")
    assert kind(prose) == "unparseable"  # the model's words are not read as an error of the provider
    assert kind(PlannerTimeout("spent")) == "timeout"
    assert kind(litellm.Timeout("slow", model="m", llm_provider="openai")) == "timeout"
    assert kind(litellm.NotFoundError("no such model", model="m", llm_provider="openai")) == "fatal"
    assert kind(litellm.ContextWindowExceededError("too long", model="m", llm_provider="openai")) == "fatal"
    assert kind(litellm.AuthenticationError("bad key", model="m", llm_provider="openai")) == "auth"
    assert kind(litellm.InternalServerError("boom", model="m", llm_provider="openai")) == "failed"
    bad = litellm.BadRequestError(
        "LLM Provider NOT provided. Pass in the LLM provider", model="m", llm_provider=""
    )
    assert kind(bad) == "fatal"


def test_an_abandoned_streamed_answer_stops_on_the_server(planner, tmp_path):
    """With an API base answers are streamed; at ``llm.timeout_s`` the planner closes the stream, so a
    single-slot local server stops generating instead of finishing an answer nobody reads (no retry)."""
    spec = planner.spec(mode="oneshot", timeout_s=1.0, num_retries=3)
    _, good, _, _, n_sweep = _ideas(planner, spec)
    words = " ".join(f"word{i}" for i in range(400))  # varied text: LiteLLM refuses a repeating stream
    slow = Reply(json.dumps({"reasoning": words, "candidates": [good]}), chunk_delay_s=0.05)
    with OpenAIServer([slow]) as srv:
        handle = planner.stored(spec, n_sweep + 1, name="s.db", llm_api_base=srv.url)
        deadline = time.monotonic() + 10
        while not srv.streams_abandoned and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(srv.requests) == 1 and json.loads(srv.requests[0]["body"])["stream"] is True
        assert srv.streams_abandoned == 1 and srv.streams_completed == 0
    last = handle.study.trials[-1]
    assert last.user_attrs["phase"] == "fallback" and "timeout" in last.user_attrs["rationale"]
    assert llm_accounting(handle.study)["failed"] == 1


def test_tools_stop_answering_when_the_prompt_budget_is_spent(planner, tmp_path):
    spec = planner.spec(
        mode="agent", max_prompt_tokens=500
    )  # less than the fixed part of the prompt: no room for any result
    _, good, _, _, n_sweep = _ideas(planner, spec)
    lm = DummyLM(
        [
            _calls(("legal_values", {})),
            _calls(("submit", {"candidates": [{**good, "rationale": "without tools"}]})),
        ]
    )
    study = planner.run(spec, n_sweep + 1, llm=lm)
    assert study.trials[-1].user_attrs["phase"] == "planner"
    (doc,) = _transcripts(tmp_path)
    assert [c.get("refused") for c in doc["tool_calls"]] == ["max_prompt_tokens"]
    assert "prompt budget spent" in doc["tool_calls"][0]["result"]
    assert doc["prompt_tokens_estimate"] > 500


def test_compaction_order_and_llama_cpp_python_json_object(planner, tmp_path):
    """A prompt budget below everything: top trials cut to 2 first, then legal values and sweep effects dropped,
    then the rest of the top trials and ranking; ``response_format: json_object`` sends llama-cpp-python's JSON
    mode with the schema."""
    spec = planner.spec(mode="oneshot", max_prompt_tokens=500, response_format="json_object")
    _, good, _, _, n_sweep = _ideas(planner, spec)
    answer = json.dumps({"reasoning": "r", "candidates": [{**good, "rationale": "small prompt"}]})
    with OpenAIServer([answer]) as srv:
        study = planner.run(spec, n_sweep + 1, llm=spec.llm, llm_api_base=srv.url)
        body = json.loads(srv.requests[0]["body"])
    fmt = body["response_format"]
    assert (
        fmt["type"] == "json_object"
        and fmt["schema"]["properties"]["candidates"]["items"]["properties"]["tp"]
    )
    (doc,) = _transcripts(tmp_path)
    steps = doc["compacted"]
    drops = [steps.index("legal_values dropped"), steps.index("sweep_effects dropped")]
    assert drops[1] == drops[0] + 1 and steps[drops[0] - 1] == "top trials cut to 2"
    assert all(s.startswith("top trials cut to") for i, s in enumerate(steps) if i not in drops)
    assert steps[-1] == "top trials cut to 0"  # the ranking goes last
    assert doc["inputs"]["legal_values"].startswith("(left out to fit llm.max_prompt_tokens)")
    assert doc["inputs"]["sweep_effects"].startswith("(left out to fit llm.max_prompt_tokens)")
    assert study.trials[-1].user_attrs["rationale"].startswith("small prompt [expected ")


def test_report_shows_the_agents_tool_calls_and_notes(planner, tmp_path):
    from primus_optuna.record.report import build_report

    spec = planner.spec(mode="agent")
    _, good, _, _, n_sweep = _ideas(planner, spec)
    lm = DummyLM(
        [
            _calls(("best", {}), ("note", {"text": "deepep pays off only with ep 8"})),
            _calls(("submit", {"candidates": [{**good, "rationale": "from the notes"}]})),
        ]
    )
    handle = planner.stored(spec, n_sweep + 1, llm=lm)
    md = build_report(handle.storage_url, None, tmp_path / "report")["md"].read_text()
    assert "The planner's notes (its scratchpad, carried from call to call):" in md
    assert "- deepep pays off only with ep 8" in md
    assert "agent: 2 tool calls (best, note)." in md
    assert "1 calls (0 with no answer, 0 unparseable)" in md and "2 tool calls" in md
