import json
import re
from pathlib import Path

import optuna
import pytest

from primus_optuna import Space
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.search.attrs import EXPECTED, EXPECTED_SHARE
from primus_optuna.search.llm_budget import llm_accounting
from primus_optuna.search.llm_preflight import context_needed
from primus_optuna.search.sampler import PrimusSampler
from tests.helpers.openai_server import OpenAIServer, Reply

from .conftest import chat_reply

State = optuna.trial.TrialState
SENTINEL = "sk-sentinel-PRIMUS-0123456789"


def _cands(planner, spec):
    """Two good candidates (legal, fit, untried), then one illegal, one duplicate, one that does not fit."""
    ideas = planner.ideas(spec)
    fits = ideas.fits[:2]
    out = [
        {**fits[0].to_params(), "rationale": "good one"},
        {**ideas.illegal, "rationale": "illegal"},
        {**ideas.baseline.to_params(), "rationale": "the baseline again"},
        {**ideas.nofit.to_params(), "rationale": "too big"},
        {**fits[1].to_params(), "rationale": "good two"},
    ]
    return out, fits, ideas.n_sweep


def _valid_only(spec, study):
    space = Space(spec)
    for t in study.trials:
        if t.state == State.COMPLETE:
            c = space.canonical(space.make(**t.params))
            assert not space.check(c) and estimate_memory(spec, c).fits


def test_planner_with_dummy_lm_accepts_valid_candidates_and_records_rejections(planner, tmp_path):
    from dspy.utils import DummyLM

    spec = planner.spec()
    cands, good, n_sweep = _cands(planner, spec)
    lm = DummyLM([{"reasoning": "deepep with zb", "candidates": json.dumps(cands)}])
    study = planner.run(spec, n_sweep + 3, llm=lm)
    tail = study.trials[n_sweep:]
    assert [t.user_attrs["phase"] for t in tail] == ["planner", "planner", "fallback"]
    assert [t.user_attrs["rationale"].split(" [")[0] for t in tail[:2]] == ["good one", "good two"]
    assert [t.user_attrs["config_key"] for t in tail[:2]] == [c.key() for c in good]
    assert tail[1].system_attrs.get("fixed_params")  # the second candidate was queued in storage
    assert "planner unavailable" in tail[2].user_attrs["rationale"]  # DummyLM exhausted -> parse error
    books = llm_accounting(study)
    assert books["calls"] == 2 and books["rejected"] == 3 and books["unparseable"] == 1
    transcripts = [json.loads(p.read_text()) for p in tmp_path.iterdir() if p.is_file()]
    first = next(t for t in transcripts if t["accepted"])
    reasons = sorted(r["reason"].split(":")[0] for r in first["rejected"])
    assert reasons == ["duplicate", "illegal", "memory"]
    assert first["inputs"]["legal_values"] and "tp" in first["inputs"]["coupling_rules"]
    # the planner sees the fallback's corrected ranking: untried configurations, best expected first
    ranking = json.loads(first["inputs"]["corrected_ranking"])
    assert ranking and {"config", "expected", "uncertainty", "model", "peak_gib"} <= set(ranking[0])
    tried = {t.user_attrs["config_key"] for t in study.trials[:n_sweep]}
    assert not tried & {r["config"] for r in ranking}
    assert [r["expected"] for r in ranking] == sorted((r["expected"] for r in ranking), reverse=True)
    _valid_only(spec, study)


def test_planner_end_to_end_through_litellm_over_http(planner, monkeypatch):
    monkeypatch.setenv("PRIMUS_TEST_API_KEY", SENTINEL)
    spec = planner.spec(api_key_env="PRIMUS_TEST_API_KEY", timeout_s=30)  # answered: time for a loaded CI
    cands, good, n_sweep = _cands(planner, spec)
    with OpenAIServer([chat_reply(cands)]) as srv:
        spec = spec.model_copy(update={"llm": spec.llm.model_copy(update={"api_base": srv.url})})
        handle = planner.stored(spec, n_sweep + 2, cache=True)
        requests = list(srv.requests)
    study = handle.study
    assert len(requests) == 1 and requests[0]["path"] == "/v1/chat/completions"
    body = json.loads(requests[0]["body"])
    assert body["model"] == "test-model" and "coupling_rules" in json.dumps(body["messages"])
    auth = {k.lower(): v for k, v in requests[0]["headers"].items()}["authorization"]
    assert auth == f"Bearer {SENTINEL}"  # the key reached the server from the environment ...
    tail = study.trials[n_sweep:]
    assert [t.user_attrs["phase"] for t in tail] == ["planner", "planner"]
    assert tail[0].user_attrs["proposer"] == "openai/test-model"
    books = llm_accounting(study)
    assert books["tokens"] == 150 and books["calls"] == 1 and books["model"] == "openai/test-model"
    # ... and was stored nowhere: not in the SQLite file, the transcripts or the DSPy cache
    db = Path(handle.storage_url.removeprefix("sqlite:///")).read_bytes()
    assert SENTINEL.encode() not in db and b"sentinel" not in db
    files = [p for d in (handle.artifact_dir, handle.cache_dir) for p in d.rglob("*") if p.is_file()]
    assert any(handle.artifact_dir in p.parents for p in files)
    for p in files:
        assert SENTINEL.encode() not in p.read_bytes(), p


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (Reply(delay_s=3.0), "timeout"),
        (Reply(status=500), "internalservererror"),
        (Reply("I think you should use more GPUs."), "parse"),
        ("illegal", "1 rejected"),
        ("duplicate", "1 rejected"),
        ("memory", "1 rejected"),
    ],
    ids=["timeout", "http500", "unparseable", "illegal", "duplicate", "no-fit"],
)
def test_planner_failures_fall_back_and_launch_nothing_invalid(planner, reply, why):
    # only the timeout case is meant to run out of time; the answered ones get seconds enough for a loaded
    # CI machine (an answer arriving after a 1 s client timeout is counted as no answer)
    spec = planner.spec(timeout_s=1 if why == "timeout" else 30)
    cands, _, n_sweep = _cands(planner, spec)
    if isinstance(reply, str):
        picked = {"illegal": cands[1], "duplicate": cands[2], "memory": cands[3]}[reply]
        reply = Reply(chat_reply([picked]))
    with OpenAIServer([reply]) as srv:
        handle = planner.stored(spec, n_sweep + 1, llm_api_base=srv.url)
    study = handle.study
    last = study.trials[-1]
    assert last.user_attrs["phase"] == "fallback" and last.state == State.COMPLETE
    assert "planner unavailable" in last.user_attrs["rationale"]
    assert why in last.user_attrs["rationale"].lower()
    assert not [t for t in study.trials if t.user_attrs.get("phase") == "planner"]
    books = llm_accounting(study)
    assert books["calls"] == 1  # every call made counts against llm.max_calls, answered or not
    if why in ("timeout", "internalservererror"):
        assert books["failed"] == 1 and books["answered"] == 0 and books["tokens"] == 0
    else:
        assert books["answered"] == 1 and books["tokens"] == 150  # usage counted, parsed or not
        assert books["unparseable"] == (why == "parse")
    _valid_only(spec, study)


def test_missing_key_is_one_error_naming_the_variable(planner, monkeypatch):
    from primus_optuna.errors import SpecError
    from primus_optuna.search.llm_client import require_api_key

    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    spec = planner.spec()
    with pytest.raises(SpecError, match=r"needs OPENAI_API_KEY in the environment: export OPENAI_API_KEY="):
        PrimusSampler(spec, llm=spec.llm)
    with pytest.raises(SpecError, match=r"needs ANTHROPIC_API_KEY"):
        require_api_key(spec.llm.model_copy(update={"model": "anthropic/claude-x"}))
    with pytest.raises(SpecError, match=r"llm.api_key_env names 'MY_KEY'.*export MY_KEY="):
        require_api_key(spec.llm.model_copy(update={"api_key_env": "MY_KEY"}))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
    require_api_key(spec.llm)


def test_auth_error_stops_the_planner_and_unanswered_calls_are_not_counted(planner):
    spec = planner.spec(max_calls=2)
    n_sweep = planner.ideas(spec).n_sweep
    # a provider's refusal quotes the end of the key it was given (OpenAI's does): only its type is kept
    quoted = "Incorrect API key provided: sk-proj-****************QuOtEd"
    body = json.dumps(
        {"error": {"message": quoted, "type": "invalid_request_error", "code": "invalid_api_key"}}
    )
    with OpenAIServer([Reply(status=401, raw=body)]) as srv:
        handle = planner.stored(spec, n_sweep + 3, llm_api_base=srv.url)
        requests = len(srv.requests)
    study = handle.study
    assert requests == 1  # refused credentials: no second call
    tail = study.trials[n_sweep:]
    assert [t.user_attrs["phase"] for t in tail] == ["fallback"] * 3
    assert "refused the credentials (LMAuthError" in tail[0].user_attrs["rationale"]
    assert "HTTP 401" in tail[0].user_attrs["rationale"]
    assert "planner stopped: the provider refused the credentials" in tail[-1].user_attrs["rationale"]
    books = llm_accounting(study)
    assert books["calls"] == 1 and books["failed"] == 1
    assert books["stop_reason"].startswith("planner stopped: the provider refused the credentials")
    db = Path(handle.storage_url.removeprefix("sqlite:///")).read_bytes()
    assert b"QuOtEd" not in db and b"Incorrect API key" not in db
    for p in (p for p in handle.artifact_dir.rglob("*") if p.is_file()):
        assert b"QuOtEd" not in p.read_bytes(), p


def test_call_budget_is_enforced_from_storage_across_restarts(planner):
    spec = planner.spec(max_calls=1)
    cands, _, n_sweep = _cands(planner, spec)
    with OpenAIServer([chat_reply(cands[:1])]) as srv:
        for n in (n_sweep + 1, 3):
            handle = planner.stored(spec, n, llm_api_base=srv.url)
        assert len(srv.requests) == 1
    phases = [t.user_attrs["phase"] for t in handle.study.trials[n_sweep:]]
    assert phases == ["planner", "fallback", "fallback", "fallback"]
    assert "llm.max_calls=1 reached" in handle.study.trials[-1].user_attrs["rationale"]
    assert llm_accounting(handle.study)["calls"] == 1


def test_rerun_replays_from_the_dspy_cache(planner, tmp_path):
    spec = planner.spec(cache=True)  # off by default with an api_base
    cands, good, n_sweep = _cands(planner, spec)
    cache = tmp_path / "cache"
    with OpenAIServer([chat_reply(cands)]) as srv:
        keys = []
        for name in ("a.db", "b.db"):
            handle = planner.stored(spec, n_sweep + 1, name=name, llm_api_base=srv.url, cache_dir=cache)
            trials = handle.study.trials
            assert trials[-1].state == State.WAITING  # the second candidate, queued for the next trial
            keys.append([t.user_attrs["config_key"] for t in trials[n_sweep:]])
        assert len(srv.requests) == 1
    assert keys == [[c.key() for c in good]] * 2


def test_a_candidate_expected_far_below_the_best_is_not_launched_and_the_model_is_told(planner, tmp_path):
    from dspy.utils import DummyLM

    from primus_optuna.physics.throughput import estimate_throughput

    spec = planner.spec()
    ideas = planner.ideas(spec)
    alone = planner.run(spec, ideas.n_sweep + 1)  # no LLM: the fallback's pick after the sweep
    good = alone.trials[-1].user_attrs["config_key"]
    good_params = dict(alone.trials[-1].params)
    bad = min(ideas.fits, key=lambda c: estimate_throughput(spec, c).tokens_per_s_per_gpu)
    answers = [
        {"reasoning": "r", "candidates": json.dumps([{**bad.to_params(), "rationale": "bad"}, good_params])},
        {"reasoning": "r", "candidates": json.dumps([])},
    ]
    lm = DummyLM(answers)
    study = planner.run(spec, ideas.n_sweep + 2, llm=lm)
    launched = [t.user_attrs["config_key"] for t in study.trials if t.user_attrs.get("phase") == "planner"]
    assert launched == [good]  # the bad one never ran
    docs = [json.loads(p.read_text()) for p in tmp_path.iterdir() if p.is_file()]
    first = next(d for d in docs if d["trial_number"] == ideas.n_sweep)
    (rej,) = first["rejected"]
    assert rej["reason"].startswith("value: expected ") and rej["reason"].endswith(": not worth a launch")
    share = int(rej["reason"].split("), ")[1].split("%")[0])
    assert share < 80
    assert llm_accounting(study)["rejected"] == 1
    # the next call is told what was not launched, and why
    second = json.dumps(lm.history[-1]["messages"])
    assert bad.key() in second and "not worth a launch" in second


def test_streamed_usage_is_the_servers_and_candidates_come_first(planner):
    spec = planner.spec(mode="oneshot")
    cands, good, n_sweep = _cands(planner, spec)
    reply = Reply(json.dumps({"candidates": cands[:1], "reasoning": "short"}), usage=(1234, 321))
    with OpenAIServer([reply]) as srv:
        handle = planner.stored(spec, n_sweep + 1, llm_api_base=srv.url)
        body = json.loads(srv.requests[0]["body"])
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert llm_accounting(handle.study)["tokens"] == 1555  # the server's count, not a client-side estimate
    schema = body["response_format"]["json_schema"]["schema"]
    assert list(schema["properties"]) == ["candidates", "reasoning"]
    assert schema["properties"]["reasoning"]["maxLength"] <= 400
    assert schema["properties"]["candidates"]["items"]["properties"]["rationale"]["maxLength"] <= 200
    prompt = json.dumps(body["messages"])
    assert prompt.index("`candidates`") < prompt.index("`reasoning`")


def test_llama_cpp_context_error_over_http_stops_at_once(planner):
    spec = planner.spec(max_calls=3)
    n_sweep = planner.ideas(spec).n_sweep
    body = {
        "error": {
            "code": 400,
            "message": "Context size has been exceeded.",
            "type": "exceed_context_size_error",
        }
    }
    with OpenAIServer([Reply(status=400, raw=json.dumps(body))]) as srv:
        handle = planner.stored(spec, n_sweep + 2, llm_api_base=srv.url)
        assert len(srv.requests) == 1
    assert "context window" in llm_accounting(handle.study)["stop_reason"]


def test_context_error_of_a_prompt_over_its_budget_names_the_context_it_needs(planner):
    """A one-shot prompt that compaction cannot bring under ``llm.max_prompt_tokens`` (500): the stop reason
    gives its size and the server context it needs, not "lower llm.max_prompt_tokens" (it is already lower)."""
    spec = planner.spec(mode="oneshot", max_prompt_tokens=500, max_tokens=200)
    n_sweep = planner.ideas(spec).n_sweep
    body = {
        "error": {
            "code": 400,
            "message": "request (2215 tokens) exceeds the available context size (512 "
            "tokens), try increasing it",
            "type": "exceed_context_size_error",
        }
    }
    with OpenAIServer([Reply(status=400, raw=json.dumps(body))]) as srv:
        handle = planner.stored(spec, n_sweep + 1, llm_api_base=srv.url)
    why = llm_accounting(handle.study)["stop_reason"]
    m = re.search(
        r"oneshot prompt is ~([\d,]+) tokens at its smallest, more than llm.max_prompt_tokens = 500 "
        r"\(start the server with a context of at least ([\d,]+) tokens",
        why,
    )
    assert m, why
    est, need = (int(g.replace(",", "")) for g in m.groups())
    # the context asked for covers a tokenizer that counts TOKEN_MARGIN more than the estimate
    assert est > 500 and need == context_needed(est, 200) > est * 1.15 + 200
    assert "lower llm.max_prompt_tokens" not in why


def test_connection_refused_is_named(planner):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = planner.spec(timeout_s=10)
    n_sweep = planner.ideas(spec).n_sweep
    handle = planner.stored(spec, n_sweep + 1, llm_api_base=f"http://127.0.0.1:{port}/v1")
    assert "connection refused" in handle.study.trials[-1].user_attrs["rationale"]


def test_raw_model_output_is_never_printed(planner, caplog, tmp_path):
    raw = "\x1b[31mRAWMODELTEXT\x1b[0m " + "blah " * 400
    spec = planner.spec(mode="oneshot")
    cands, _, n_sweep = _cands(planner, spec)
    odd = [{**cands[0], "rationale": "\x1b[2Jwhy\n\n\tnot " + "x" * 900}]
    with OpenAIServer([Reply(json.dumps({"candidates": odd, "reasoning": "r"})), Reply(raw)]) as srv:
        handle = planner.stored(spec, n_sweep + 2, llm_api_base=srv.url)
    study = handle.study
    logged = caplog.text
    assert "RAWMODELTEXT" not in logged and "blah blah" not in logged
    books = llm_accounting(study)
    assert books["unparseable"] == 1 and "RAWMODELTEXT" not in str(books["last_error"] or "")
    rationales = [str(t.user_attrs.get("rationale")) for t in study.trials]
    assert not any("RAWMODELTEXT" in r or "\x1b" in r for r in rationales)
    planned = next(t for t in study.trials if t.user_attrs.get("phase") == "planner")
    said = planned.user_attrs["rationale"].split(" [expected ")[0]  # the model's words, then the figure
    assert said.startswith("why not xxx") and len(said) <= 300


def test_an_unparseable_answer_is_not_replayed_from_the_cache(planner, tmp_path):
    spec = planner.spec(cache=True)
    cands, good, n_sweep = _cands(planner, spec)
    cache = tmp_path / "cache"
    with OpenAIServer([Reply("not an answer"), chat_reply(cands[:1])]) as srv:
        for name in ("a.db", "b.db"):
            handle = planner.stored(spec, n_sweep + 1, name=name, llm_api_base=srv.url, cache_dir=cache)
        assert len(srv.requests) == 2  # the second run asked the server again
    assert handle.study.trials[-1].user_attrs["phase"] == "planner"


def test_no_cache_with_an_api_base_unless_asked(planner, tmp_path):
    spec = planner.spec()
    cands, _, n_sweep = _cands(planner, spec)
    with OpenAIServer([chat_reply(cands[:1])]) as srv:
        for name in ("a.db", "b.db"):
            planner.stored(spec, n_sweep + 1, name=name, llm_api_base=srv.url, cache_dir=tmp_path / "c")
        assert len(srv.requests) == 2


def test_rank_mode_chooses_among_the_fallbacks_shortlist_only(planner, tmp_path):
    from dspy.utils import DummyLM

    spec = planner.spec(mode="rank")
    n_sweep = planner.ideas(spec).n_sweep
    # the model's words may hold a figure of their own: the launch's share is read from its attr, not its words
    said = "second: deepep pays off here, 7% of the best trials"
    picks = [{"pick": 2, "rationale": said}, {"pick": 99, "rationale": "made up"}]
    lm = DummyLM([{"choices": json.dumps(picks), "reasoning": "r"}])
    study = planner.run(spec, n_sweep + 1, llm=lm)
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.iterdir() if p.is_file()]
    assert doc["mode"] == "rank"
    shortlist = doc["inputs"]["shortlist"].splitlines()
    assert len(shortlist) >= 2 and shortlist[1].startswith("2. ")
    last = study.trials[-1]
    assert last.user_attrs["phase"] == "planner"
    assert last.user_attrs["config_key"] == shortlist[1].split(" ")[1].rstrip(":")
    assert last.user_attrs["rationale"].startswith(said + " [expected ")
    # the figure it was launched on, as the gate computed it
    share = last.user_attrs[EXPECTED_SHARE]
    assert f"{share:.0%} of the best" in last.user_attrs["rationale"] and 0.8 <= share <= 1.0
    assert last.user_attrs[EXPECTED] > 0
    assert f"expected {last.user_attrs[EXPECTED]:,.0f} tokens/s/GPU" in last.user_attrs["rationale"]
    (rej,) = doc["rejected"]
    assert rej["reason"] == "not on the shortlist: 99"
    # every shortlisted configuration is worth a launch: none below 80% of the best
    shares = [int(line.split("; ")[1].split("%")[0]) for line in shortlist]
    assert min(shares) >= 80


def test_rank_mode_leaves_the_fallbacks_exploration_to_the_fallback(planner):
    """When the fallback's own pick is expected below 80% of the best (a pick its uncertainty earns), rank mode
    makes no call and the fallback runs it: a model that always takes the shortlist's first follows the path of
    the study without an LLM, and no planner launch is below the gate."""
    from dspy.utils import DummyLM

    from primus_optuna.physics.throughput import estimate_throughput
    from primus_optuna.search.pruner import MemoryPrefilterPruner
    from primus_optuna.search.suggest import suggest_config

    spec = planner.spec(mode="rank")
    space = Space(spec)

    def measured(
        trial: optuna.Trial,
    ) -> float:  # the centre runs at twice its estimate, the rest as estimated
        config = suggest_config(trial, spec, space)
        if trial.should_prune():
            raise optuna.TrialPruned()
        return estimate_throughput(spec, config).tokens_per_s_per_gpu * (2.0 if trial.number == 0 else 1.0)

    def path(**sampler: object) -> optuna.Study:
        study = optuna.create_study(
            direction="maximize",
            sampler=PrimusSampler(spec, **sampler),
            pruner=MemoryPrefilterPruner(spec=spec),
        )
        study.optimize(measured, n_trials=10)
        return study

    lm = DummyLM(
        [{"choices": json.dumps([{"pick": 1, "rationale": "the first one"}]), "reasoning": "r"}] * 10
    )
    ranked, alone = path(llm=lm), path()
    assert [t.user_attrs["config_key"] for t in ranked.trials] == [
        t.user_attrs["config_key"] for t in alone.trials
    ]
    launched = [t for t in ranked.trials if t.user_attrs["phase"] == "planner"]
    passed = [t for t in ranked.trials if t.user_attrs["rationale"].startswith("planner passed")]
    assert launched and passed and len(lm.history) == len(launched)  # no call for a trial it passed
    assert all(t.user_attrs[EXPECTED_SHARE] >= 0.8 for t in launched)
    for t in passed:
        assert t.user_attrs["phase"] == "fallback"
        share = int(
            re.search(
                r"exploration the planner may not launch: .*?(\d+)% of the best", t.user_attrs["rationale"]
            )[1]
        )
        assert share < 80


def test_rank_mode_chooses_at_temperature_zero_unless_told(planner):
    from primus_optuna.search.planner import Planner
    from primus_optuna.spec.study import DEFAULT_TEMPERATURE

    def temperature(**llm: object) -> float:
        spec = planner.spec(**llm)
        lm = Planner(spec, Space(spec), spec.llm, api_base="http://127.0.0.1:8080/v1").make_lm()
        return lm.kwargs["temperature"]

    assert temperature(mode="rank") == 0.0  # its choice among the shortlist, the same each run
    assert temperature(mode="oneshot") == DEFAULT_TEMPERATURE == 0.7
    assert temperature(mode="rank", temperature=0.9) == 0.9  # the file's value, when given


def test_rank_is_the_default_for_a_server_on_this_machine(planner):
    from primus_optuna.search.llm_client import is_local
    from primus_optuna.search.planner import Planner

    assert is_local("http://127.0.0.1:8080/v1") and is_local("http://localhost:11434/v1")
    assert is_local("http://[::1]:8000/v1") and not is_local("https://api.openai.com/v1")
    spec = planner.spec(mode="auto")
    space = Space(spec)
    assert Planner(spec, space, spec.llm, api_base="http://127.0.0.1:8080/v1").mode == "rank"
    assert Planner(spec, space, spec.llm, api_base="http://10.1.2.3:8000/v1").mode != "rank"


@pytest.mark.parametrize("passes_tools", [True, False])
def test_agent_mode_only_where_the_server_passes_tools(planner, caplog, passes_tools):
    from tests.helpers.openai_server import ranking_agent

    spec = planner.spec(mode="agent")
    n_sweep = planner.ideas(spec).n_sweep
    with OpenAIServer([ranking_agent(2)], tools=passes_tools) as srv:
        handle = planner.stored(spec, n_sweep + 1, llm_api_base=srv.url)
        probes, bodies = srv.probes, [json.loads(r["body"]) for r in srv.requests]
    assert len(probes) == 1  # one dry run, before the first agent call
    books = llm_accounting(handle.study)
    last = handle.study.trials[-1]
    assert last.user_attrs["phase"] == "planner"
    if passes_tools:
        assert books["mode"] == "agent" and all("tools" in b for b in bodies)
    else:
        assert books["mode"] == "rank" and not any("tools" in b for b in bodies)
        assert "--jinja" in books["last_error"] and "--jinja" in caplog.text


def test_a_server_on_this_machine_needs_no_key_until_it_asks_for_one(planner, monkeypatch):
    """llama.cpp, vLLM and Ollama ask for no key unless started with one: a local ``api_base`` runs with none in
    the environment; a server that refuses it stops the planner with a line saying which key to give."""
    from primus_optuna.errors import SpecError
    from primus_optuna.search.llm_client import NO_KEY, require_api_key

    monkeypatch.delenv("OPENAI_API_KEY")
    spec = planner.spec(max_calls=2)
    assert require_api_key(spec.llm, "http://127.0.0.1:8080/v1") == NO_KEY
    with pytest.raises(SpecError, match=r"needs OPENAI_API_KEY"):
        require_api_key(spec.llm, "https://llm.example.com/v1")
    n_sweep = planner.ideas(spec).n_sweep
    with OpenAIServer([Reply(status=401)]) as srv:
        handle = planner.stored(spec, n_sweep + 2, llm_api_base=srv.url)
        requests = len(srv.requests)
    assert requests == 1
    why = llm_accounting(handle.study)["stop_reason"]
    assert why.startswith("planner stopped: the provider refused the credentials: the server wants the key")
    assert NO_KEY not in why
