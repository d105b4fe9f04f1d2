"""``scripts/bench_planner.py``: which model a run asks (the loopback's scripted ones, a server's, a hosted
one) and the comparison end to end on the loopback."""

from __future__ import annotations

import argparse

import pytest

from tests.conftest import ROOT
from tests.helpers.scripts import load_script

bench = load_script("bench_planner")


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**({"model": None, "api_base": None} | kw))


def test_a_real_model_is_asked_only_when_named_hosted_or_on_a_server():
    assert bench._real_model(_args()) is None
    assert bench._real_model(_args(model="anthropic/claude-sonnet-4-5")) == (
        None,
        "anthropic/claude-sonnet-4-5",
    )
    assert bench._real_model(_args(api_base="http://127.0.0.1:8080/v1")) == (
        "http://127.0.0.1:8080/v1",
        "openai/test-model",
    )
    assert bench._real_model(_args(model="openai/m", api_base="http://h/v1")) == ("http://h/v1", "openai/m")


def test_a_single_run_names_what_it_needs(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main([])
    assert e.value.code == 2 and "give --model (a hosted model), --api-base URL" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--loopback", "--model", "openai/x"])
    assert "--loopback runs the scripted model" in capsys.readouterr().err


def test_compare_on_the_loopback_keeps_a_bad_model_out_and_rank_at_the_fallback(capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    study = str(ROOT / "studies" / "qwen3-30b-a3b-h200-bf16.yaml")
    argv = ["--compare", "--samplers", "fallback,rank,bad-model", "--studies", study, "--seeds", "1"]
    assert bench.main([*argv, "--budgets", "3,6", "--max-calls", "2"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[3]: ln for ln in out.splitlines() if ln.startswith("qwen3-30b-a3b-h200-bf16 seed 0 ")}
    assert set(lines) == {"fallback", "rank", "bad-model"}
    curve = {name: ln.split(" planner")[0].split()[4:] for name, ln in lines.items()}
    assert curve["rank"] == curve["fallback"] == curve["bad-model"]
    assert (
        "planner trials 2 (below 80%: 0)" in lines["rank"]
    )  # the planner chose two trials, at the fallback's
    assert "planner trials 0" in lines["bad-model"]
    books = [ln for ln in out.splitlines() if ln.strip().startswith("planner: mode oneshot")]
    assert books and "0 accepted" in books[0] and "proposed, 0 accepted" in books[0]
