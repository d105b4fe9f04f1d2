"""The pipeline simulations' memo kept on disk between processes: :data:`SIMULATIONS`.

A schedule simulation (:func:`primus_optuna.physics.pipeline.pipeline_timing`) depends only on its
normalised key (schedule, p, v, m and the pass durations as integers) and on the simulation's code, so its
result (the critical path's integer coefficients and the busiest stage's sends) can be kept across
processes: a fresh ``plan`` reads what earlier runs simulated instead of simulating it again. Same integers,
same estimates. The file is named after a hash of ``pipeline.py``'s source, so a changed simulation never
reads another's results.

Where: ``$PRIMUS_OPTUNA_SIM_CACHE`` (a directory; ``off`` disables it, as the tests do), else
``$XDG_CACHE_HOME/primus-optuna``, else ``~/.cache/primus-optuna``. An unreadable, unwritable or corrupt
file only costs the simulations: the cache is never required.

Example::

    SIMULATIONS.get(key)          # None until some process simulated ``key``
    SIMULATIONS.put(key, value)
    SIMULATIONS.save()            # merge this process's new results into the file (atomic replace)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

ENV = "PRIMUS_OPTUNA_SIM_CACHE"
MAX_ENTRIES = 100_000
"""the file stops growing beyond this many simulations (~10 MB)"""

Key = tuple[Any, ...]
Value = tuple[tuple[int, ...], int]


def cache_dir() -> Path | None:
    """The cache directory, or None when ``$PRIMUS_OPTUNA_SIM_CACHE`` is ``off``."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in ("off", "0", "false", "") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "primus-optuna"


class SimulationCache:
    """Simulation results by normalised key: this process's and those the cache file holds."""

    def __init__(self, source: Path) -> None:
        self._source = source
        self._known: dict[Key, Value] = {}
        self._new: dict[Key, Value] = {}
        self._loaded = False
        self._lock = threading.Lock()  # plans in several threads (n_jobs) share the memo
        self._save_lock = threading.Lock()  # one read-merge-write at a time in this process

    def path(self) -> Path | None:
        d = cache_dir()
        if d is None:
            return None
        digest = hashlib.sha256(self._source.read_bytes()).hexdigest()[:16]
        return d / f"pipeline-{digest}.json"

    def _load(self) -> None:
        with self._lock:
            if not self._loaded:
                self._known.update(self._read())
                self._loaded = True

    def _read(self) -> dict[Key, Value]:
        try:
            path = self.path()
            if path is None or not path.is_file():
                return {}
            rows = json.loads(path.read_text())
            return {tuple(k): (tuple(int(x) for x in c), int(s)) for k, c, s in rows}
        except (OSError, ValueError, TypeError):
            return {}

    def get(self, key: Key) -> Value | None:
        if not self._loaded:
            self._load()
        return self._known.get(key)

    def put(self, key: Key, value: Value) -> None:
        with self._lock:
            self._known[key] = value
            self._new[key] = value

    def save(self) -> None:
        """Merge this process's new simulations into the file (written to a temporary file, then renamed).
        Two processes saving at once may each miss the other's new entries in the file: they are simulated
        again later, nothing is wrong."""
        with self._save_lock:
            self._save()

    def _save(self) -> None:
        with self._lock:
            new = dict(self._new)
        if not new:
            return
        try:
            path = self.path()
            if path is None:
                return
            merged = self._read()
            for key, value in new.items():
                if len(merged) >= MAX_ENTRIES:
                    break
                merged[key] = value
            path.parent.mkdir(parents=True, exist_ok=True)
            rows = [[list(k), list(c), s] for k, (c, s) in merged.items()]
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pipeline-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(rows, fh, separators=(",", ":"))
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError:
            return
        with self._lock:
            for key in new:
                self._new.pop(key, None)

    def clear(self) -> None:
        """Forget what this process knows (the file stays; the next :meth:`get` reads it again)."""
        with self._lock:
            self._known.clear()
            self._new.clear()
            self._loaded = False


SIMULATIONS = SimulationCache(Path(__file__).with_name("pipeline.py"))

__all__ = ["ENV", "SIMULATIONS", "SimulationCache", "cache_dir"]
