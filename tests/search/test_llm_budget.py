"""The planner's books: calls reserved atomically in storage (threads, processes, SQLite and PostgreSQL), and
``llm.max_calls`` never overrun by ``n_jobs``."""

from __future__ import annotations

import multiprocessing
import os
import threading

import optuna
import pytest

from primus_optuna.search import llm_budget
from primus_optuna.search.llm_budget import llm_accounting, reserve_call
from tests.helpers.openai_server import OpenAIServer, Reply

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _reserve_many(url: str, n: int, limit: int, out: multiprocessing.Queue) -> None:
    study = optuna.load_study(study_name="b", storage=url)
    got = sum(reserve_call(study, limit) for _ in range(n))
    for _ in range(n):
        llm_budget.add(study, "tokens", 7)
        llm_budget.add(study, "cost_usd", 0.125)
    out.put(got)


def _storages(tmp_path):
    urls = [f"sqlite:///{tmp_path / 'b.db'}"]
    pg = os.environ.get("PRIMUS_OPTUNA_PG_URL")
    if pg and not os.environ.get("PRIMUS_OPTUNA_NO_PG"):
        urls.append(pg)
    return urls


def test_reservations_are_exact_across_threads(tmp_path):
    study = optuna.create_study(study_name="b", storage=f"sqlite:///{tmp_path / 'b.db'}")
    got: list[bool] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(6):
            ok = reserve_call(study, 5)
            llm_budget.add(study, "tokens", 3)
            with lock:
                got.append(ok)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    books = llm_accounting(study)
    assert sum(got) == 5 and books["calls"] == 5
    assert books["tokens"] == 8 * 6 * 3  # no lost update


def test_reservations_are_exact_across_processes(tmp_path):
    for url in _storages(tmp_path):
        name = "b"
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass
        optuna.create_study(study_name=name, storage=url)
        ctx = multiprocessing.get_context("spawn")
        q: multiprocessing.Queue = ctx.Queue()
        procs = [ctx.Process(target=_reserve_many, args=(url, 5, 7, q)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs)
        got = sum(q.get() for _ in procs)
        books = llm_accounting(optuna.load_study(study_name=name, storage=url))
        assert got == 7 and books["calls"] == 7, url
        assert books["tokens"] == 4 * 5 * 7 and books["cost_usd"] == pytest.approx(4 * 5 * 0.125), url


def test_in_memory_storage_counts_too():
    study = optuna.create_study()
    assert [reserve_call(study, 2) for _ in range(3)] == [True, True, False]
    assert not reserve_call(study, 0)
    assert llm_accounting(study)["calls"] == 2


def test_max_calls_holds_with_n_jobs(planner):
    """``llm.max_calls: 2`` with ``n_jobs=8``: at most two calls reach the endpoint (#23 item 3)."""
    spec = planner.spec(max_calls=2)
    n_sweep = planner.ideas(spec).n_sweep
    # an answer that never parses, slow enough that all eight workers ask at once
    with OpenAIServer([Reply("no idea", delay_s=0.3)]) as srv:
        handle = planner.stored(spec, n_sweep + 16, n_jobs=8, llm_api_base=srv.url)
        made = len(srv.requests)
    books = llm_accounting(handle.study)
    assert made == 2 and books["calls"] == 2
    assert books["unparseable"] == 2 and books["tokens"] == 300
    assert books["stop_reason"] == "llm.max_calls=2 reached"
    fallback = [t for t in handle.study.trials if t.user_attrs.get("phase") == "fallback"]
    assert len(fallback) == 16


def test_legacy_user_attrs_are_read():
    study = optuna.create_study()
    study.set_user_attr("llm_calls", 2)
    study.set_user_attr("llm_tokens", 3456)
    study.set_user_attr("llm_failed_calls", 1)
    books = llm_accounting(study)
    assert (books["calls"], books["tokens"], books["failed"]) == (2, 3456, 1)


def test_no_call_starts_once_the_cost_cap_is_spent(planner):
    spec = planner.spec(max_cost_usd=0.5)
    n_sweep = planner.ideas(spec).n_sweep
    with OpenAIServer(["no idea"]) as srv:
        llm_budget.add(planner.open(spec).study, "cost_usd", 0.5)  # spent by an earlier run
        handle = planner.stored(spec, n_sweep + 2, llm_api_base=srv.url)
        assert srv.requests == []
    books = llm_accounting(handle.study)
    assert books["calls"] == 0 and books["stop_reason"] == "llm.max_cost_usd=0.5 reached (spent 0.5000)"
    assert "llm.max_cost_usd=0.5 reached" in handle.study.trials[-1].user_attrs["rationale"]
