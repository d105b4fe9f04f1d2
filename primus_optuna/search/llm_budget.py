"""The LLM planner's books, kept in the study's storage: calls reserved before they are made, and what they cost.

The library's one budget reservation. Every count lives in a ``primus:llm:*`` study system attr (read and
written through :mod:`.state`) and changes by one atomic SQL statement on :class:`~optuna.storages.RDBStorage`
(SQLite or PostgreSQL, any number of processes and threads):

- :func:`reserve_call` takes one of ``llm.max_calls`` with ``UPDATE ... SET n = n + 1 WHERE n < max``; the
  statement's row count says whether this caller got it. So ``max_calls: 2`` with ``n_jobs=8`` (or eight
  worker processes) makes at most two calls: nothing is read first and written later.
- :func:`add` adds tokens, cost, failures, ... with ``UPDATE ... SET n = n + delta`` (no lost update).

A reservation is spent whether or not the provider answers; :func:`llm_accounting` tells apart calls that got
no answer (``failed``) and answers that did not parse (``unparseable``). Other storages (in-memory, journal)
fall back to a process-wide lock around read-modify-write, which is exact within one process.

Read everything with :func:`llm_accounting`; it also reads the ``llm_*`` user attrs of studies recorded
before this module existed.

Example::

    if reserve_call(study, spec.llm.max_calls):  # False: the budget is spent, make no call
        ...
"""

from __future__ import annotations

import json
import threading
from typing import Any

import optuna

from .state import set_study_state, study_state

PREFIX = "primus:llm:"
COUNTERS = (
    "calls",  # reserved (each is made once reserved): what ``llm.max_calls`` bounds
    "answered",
    "failed",
    "unparseable",
    "tokens",
    "cost_usd",
    "tool_calls",
    "proposed",
    "accepted",
    "rejected",
    "repaired",
    "truncated",  # answers that stopped at llm.max_tokens
)
MODEL = PREFIX + "model"
MODE = PREFIX + "mode"
STOP = PREFIX + "stop_reason"
NOTES = PREFIX + "notes"
FEEDBACK = PREFIX + "feedback"
"""the newest rejected candidates with the reason (``not worth a launch`` and its figure), shown at the next call"""
MAX_FEEDBACK = 8
LAST_ERROR = PREFIX + "last_error"
LEGACY = {
    "calls": "llm_calls",
    "tokens": "llm_tokens",
    "cost_usd": "llm_cost_usd",
    "rejected": "llm_rejected",
}
_local_lock = threading.Lock()


def _rdb(study: optuna.Study) -> Any:
    storage = study._storage
    backend = getattr(storage, "_backend", storage)  # optuna wraps RDBStorage in a _CachedStorage
    return backend if isinstance(backend, optuna.storages.RDBStorage) else None


def _ensure_row(rdb: Any, study_id: int, key: str) -> None:
    """Insert ``key = 0`` unless present (a concurrent insert of the same key loses on the unique index)."""
    from optuna.storages._rdb import models
    from sqlalchemy import exc

    session = rdb.scoped_session()
    try:
        q = session.query(models.StudySystemAttributeModel).filter_by(study_id=study_id, key=key)
        if q.one_or_none() is None:
            session.add(models.StudySystemAttributeModel(study_id=study_id, key=key, value_json="0"))
            session.commit()
    except exc.IntegrityError:
        session.rollback()
    finally:
        session.close()


def _atomic_add(rdb: Any, study_id: int, key: str, delta: float, limit: float | None) -> bool:
    from optuna.storages._rdb import models
    from sqlalchemy import Float, Integer, Text, cast

    _ensure_row(rdb, study_id, key)
    model = models.StudySystemAttributeModel
    kind = Integer if float(delta).is_integer() and key != PREFIX + "cost_usd" else Float
    value = cast(model.value_json, kind)
    session = rdb.scoped_session()
    try:
        q = session.query(model).filter(model.study_id == study_id, model.key == key)
        if limit is not None:
            q = q.filter(value + delta <= limit)
        n = q.update(
            {model.value_json: cast(value + (int(delta) if kind is Integer else delta), Text)},
            synchronize_session=False,
        )
        session.commit()
        return n == 1
    except Exception:
        session.rollback()
        raise
    finally:
        session.close()


def add(study: optuna.Study, name: str, delta: float = 1, *, limit: float | None = None) -> bool:
    """Add ``delta`` to counter ``name`` (one of :data:`COUNTERS`) unless that would pass ``limit``; whether
    it was added. Atomic across processes on SQLite and PostgreSQL."""
    key = PREFIX + name
    rdb = _rdb(study)
    if rdb is not None:
        return _atomic_add(rdb, study._study_id, key, delta, limit)
    with _local_lock:
        now = float(study_state(study, key) or 0)
        if limit is not None and now + delta > limit:
            return False
        new = now + delta
        set_study_state(study, key, int(new) if new.is_integer() else new)
        return True


def reserve_call(study: optuna.Study, max_calls: int) -> bool:
    """Take one of ``max_calls`` planner calls; ``False`` when they are all taken (then make no call)."""
    return max_calls > 0 and add(study, "calls", 1, limit=max_calls)


def notes(study: optuna.Study) -> list[str]:
    """The planner's scratchpad: what it learned in earlier calls (oldest first)."""
    value = study_state(study, NOTES)
    return [str(n) for n in value] if isinstance(value, list) else []


def feedback(study: optuna.Study) -> list[str]:
    """The newest rejected candidates and why, oldest first (what the next planner call is told)."""
    value = study_state(study, FEEDBACK)
    return [str(n) for n in value] if isinstance(value, list) else []


def add_feedback(study: optuna.Study, lines: list[str]) -> None:
    """Keep ``lines`` (one rejected candidate each) among the newest :data:`MAX_FEEDBACK`."""
    if lines:
        set_study_state(study, FEEDBACK, [*feedback(study), *lines][-MAX_FEEDBACK:])


def _num(value: Any) -> float:
    try:
        return float(json.loads(value) if isinstance(value, str) else value or 0)
    except (TypeError, ValueError):
        return 0.0


def llm_accounting(study: optuna.Study) -> dict[str, Any]:
    """The planner's books: ``calls`` (made; each reserved first), ``answered``, ``failed`` (no answer),
    ``unparseable``, ``tokens`` (provider usage, parsed or not), ``cost_usd``, ``tool_calls``, ``proposed`` /
    ``accepted`` / ``rejected`` / ``repaired`` candidates, ``truncated`` (answers cut at ``llm.max_tokens``), ``model``, ``mode``, ``stop_reason`` (why it made no
    further call, or ``None``), ``last_error`` and ``notes``."""
    sys_attrs = study_state(study)
    out: dict[str, Any] = {}
    recorded = any(k.startswith(PREFIX) for k in sys_attrs)
    user = {} if recorded else study._storage.get_study_user_attrs(study._study_id)
    for name in COUNTERS:
        if recorded:
            v = _num(sys_attrs.get(PREFIX + name, 0))
        else:  # a study recorded before the books moved to system attrs
            v = _num(user.get(LEGACY.get(name, ""), 0))
            if name == "failed":
                v = _num(user.get("llm_failed_calls", 0))
        out[name] = round(v, 6) if name == "cost_usd" else int(v)
    if not recorded and out["calls"] == 0:
        out["calls"] = out["failed"]
    out["model"] = sys_attrs.get(MODEL)
    out["mode"] = sys_attrs.get(MODE)
    out["stop_reason"] = sys_attrs.get(STOP)
    out["last_error"] = sys_attrs.get(LAST_ERROR)
    out["notes"] = [str(n) for n in sys_attrs.get(NOTES) or []]
    return out
