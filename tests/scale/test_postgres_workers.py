"""Four `primus-optuna run` worker processes on one PostgreSQL-backed study (scripts/services.sh starts the server
and exports PRIMUS_OPTUNA_PG_URL; scripts/test.sh sources it)."""

import os
import threading
import uuid
from collections import Counter
from contextlib import contextmanager

import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.record.storage import make_storage
from primus_optuna.search.sampler import PrimusSampler

from .helpers import State, cli, finish, scale_study, trials, write_study

PG_URL = os.environ.get("PRIMUS_OPTUNA_PG_URL")
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not PG_URL,
        reason="PRIMUS_OPTUNA_PG_URL is not set: run through scripts/test.sh, or "
        "`bash -c 'source scripts/services.sh; .venv/bin/python -m pytest tests/scale'`",
    ),
]
WORKERS = 4


@contextmanager
def fresh_database():
    """A new, empty database on the test server (dropped afterwards); yields its URL."""
    import sqlalchemy as sa

    name = f"scale_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield f"{PG_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def _round(url, study, name, n, cwd):
    argv = [
        "run",
        study,
        "--storage",
        url,
        "--study-name",
        name,
        "--n-trials",
        n,
        "--no-llm",
        "--no-progress",
    ]
    procs = [cli(argv, cwd=cwd, script=True) for _ in range(WORKERS)]
    for p in procs:
        rc, out, err = finish(p)
        assert rc == 0, err[-3000:]
        assert f"study {name!r}" in out


def test_four_workers_share_one_postgresql_study(tmp_path):
    name = f"scale-{uuid.uuid4().hex[:12]}"
    data = scale_study(name)
    study = write_study(tmp_path / "study.yaml", data)
    spec = StudySpec.from_dict(data)
    plan = [p.config.key() for p in PrimusSampler(spec).plan]
    space = Space(spec)
    feasible = {c.key() for c in space.configs() if estimate_memory(spec, c).fits}
    n = 5
    assert WORKERS * n <= len(feasible)  # round 1 cannot run out of configurations
    with fresh_database() as url:
        make_storage(url, heartbeat_interval=None)  # the schema (its creation race: see the next test)
        # round 1: the four workers create the study concurrently and share the sweep and the fallback
        _round(url, study, name, n, tmp_path)
        ts = trials(url, name)
        assert len(ts) == WORKERS * n  # every worker ran its trials; none lost, none extra
        by_state = Counter(t.state for t in ts)
        assert set(by_state) <= {State.COMPLETE, State.PRUNED}
        sweep = sorted(t.user_attrs["sweep_index"] for t in ts if t.user_attrs.get("phase") == "sweep")
        assert sweep == list(range(len(plan)))  # every sweep position exactly once
        keys = [t.user_attrs["config_key"] for t in ts]
        assert {t.user_attrs["config_key"] for t in ts if t.user_attrs.get("phase") == "sweep"} == set(plan)
        done = [t.user_attrs["config_key"] for t in ts if t.state == State.COMPLETE]
        assert len(done) == len(set(done))  # no configuration ran twice
        pruned = [t.user_attrs.get("prune_reason", "") for t in ts if t.state == State.PRUNED]
        assert all(r.startswith(("memory", "duplicate")) for r in pruned), pruned
        # a trial pruned as a duplicate shares its configuration with another trial (two concurrent trials of
        # one configuration may both prune; the configuration then counts as untried again)
        dup_keys = [
            t.user_attrs["config_key"]
            for t in ts
            if str(t.user_attrs.get("prune_reason", "")).startswith("duplicate")
        ]
        assert all(keys.count(k) >= 2 for k in dup_keys)
        assert (
            len(dup_keys) <= WORKERS
        )  # concurrent fallback picks spread over the ranking instead of colliding

        # round 2: more trials than configurations left: every feasible configuration runs exactly once, then
        # the workers stop
        _round(url, study, name, n, tmp_path)
        ts = trials(url, name)
        assert WORKERS * n < len(ts) <= 2 * WORKERS * n
        assert not [t for t in ts if t.state in (State.RUNNING, State.WAITING, State.FAIL)]
        done = Counter(t.user_attrs["config_key"] for t in ts if t.state == State.COMPLETE)
        assert max(done.values()) == 1
        assert set(done) == feasible, f"never ran: {sorted(feasible - set(done))}"


def test_workers_opening_a_brand_new_database_at_once_all_start():
    errors: list[str] = []
    with fresh_database() as url:
        barrier = threading.Barrier(WORKERS)

        def open_it() -> None:
            barrier.wait()
            try:
                make_storage(url, heartbeat_interval=None)
            except Exception as exc:  # the storage error a worker would print before exiting with code 2
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

        threads = [threading.Thread(target=open_it) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]
