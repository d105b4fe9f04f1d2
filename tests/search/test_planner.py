import json
from pathlib import Path

import optuna
import pytest

from primus_optuna import Space
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.search.llm_budget import llm_accounting
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
    assert [t.user_attrs["rationale"] for t in tail[:2]] == ["good one", "good two"]
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
    spec = planner.spec(api_key_env="PRIMUS_TEST_API_KEY")
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
    from primus_optuna.search.planner import require_api_key

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
    with OpenAIServer([Reply(status=401)]) as srv:
        handle = planner.stored(spec, n_sweep + 3, llm_api_base=srv.url)
        requests = len(srv.requests)
    study = handle.study
    assert requests == 1  # refused credentials: no second call
    tail = study.trials[n_sweep:]
    assert [t.user_attrs["phase"] for t in tail] == ["fallback"] * 3
    assert "authenticationerror" in tail[0].user_attrs["rationale"].lower()
    assert "planner stopped: the provider refused the credentials" in tail[-1].user_attrs["rationale"]
    books = llm_accounting(study)
    assert books["calls"] == 1 and books["failed"] == 1
    assert books["stop_reason"].startswith("planner stopped: the provider refused the credentials")


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
    spec = planner.spec()
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
