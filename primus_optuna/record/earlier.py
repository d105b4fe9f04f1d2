"""Open earlier studies for a warm start (``STORAGE_URL[:STUDY_NAME]``) and the Python entry point
:func:`warm_start` (what ``primus-optuna run --warm-start`` does).

Example::

    from primus_optuna import warm_start
    ws = warm_start(study, spec, ["sqlite:///mixtral-4n.db:mixtral-4n"])
    print(ws.summary())
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from ..errors import SpecError
from ..search.warm_start import WarmStart, apply_warm_start, load_warm_start
from ..spec import StudySpec
from .storage import make_storage, normalize_url, storage_file

__all__ = ["open_earlier_study", "open_earlier_studies", "parse_source", "warm_start"]

FILE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".log", ".jsonl")


def parse_source(source: str) -> tuple[str, str | None]:
    """``STORAGE_URL[:STUDY_NAME]`` → (URL, name or None). The name is what follows the last ``:`` when it has
    no ``/`` and what precedes it is a storage on its own (``scheme://...``, ``journal:...`` or a file path)."""
    head, sep, tail = source.rpartition(":")
    if sep and tail and "/" not in tail and not tail.isdigit():
        if "://" in head or head.startswith("journal:") or head.endswith(FILE_SUFFIXES):
            return head, tail
    return source, None


def open_earlier_study(source: str) -> optuna.Study:
    """The study ``source`` names (read only; nothing is created). Raises :class:`SpecError` naming the source
    when the storage file is missing, the study is not there, or the name is omitted and the storage holds
    several studies."""
    url, name = parse_source(source)
    url = normalize_url(url)
    f = storage_file(url)
    if f is not None and not f.is_file():
        raise SpecError(f"--warm-start {source!r}: no storage file {str(f)!r}")
    store = make_storage(url, heartbeat_interval=None)
    names = [s.study_name for s in optuna.study.get_all_study_summaries(store, include_best_trial=False)]
    if name is None:
        if len(names) != 1:
            raise SpecError(
                f"--warm-start {source!r}: the storage holds {len(names)} studies ({', '.join(names) or 'none'}); "
                "name one as STORAGE_URL:STUDY_NAME"
            )
        name = names[0]
    elif name not in names:
        raise SpecError(f"--warm-start {source!r}: no study {name!r} (studies: {', '.join(names) or 'none'})")
    return optuna.load_study(study_name=name, storage=store)


def open_earlier_studies(spec: StudySpec, sources: Sequence[str], *, force: bool = False) -> WarmStart:
    """Open every source and read what it contributes to ``spec`` (nothing is written)."""
    return load_warm_start(spec, [(s, open_earlier_study(s)) for s in sources], force=force)


def warm_start(
    study: optuna.Study, spec: StudySpec, sources: Sequence[str], *, force: bool = False
) -> WarmStart:
    """Warm-start ``study`` from the earlier studies ``sources``; returns what was imported."""
    ws = open_earlier_studies(spec, sources, force=force)
    apply_warm_start(study, spec, ws)
    return ws
