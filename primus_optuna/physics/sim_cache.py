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

    def path(self) -> Path | None:
        d = cache_dir()
        if d is None:
            return None
        digest = hashlib.sha256(self._source.read_bytes()).hexdigest()[:16]
        return d / f"pipeline-{digest}.json"

    def _load(self) -> None:
        self._loaded = True
        self._known.update(self._read())

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
        self._known[key] = value
        self._new[key] = value

    def save(self) -> None:
        """Merge this process's new simulations into the file (written to a temporary file, then renamed)."""
        if not self._new:
            return
        try:
            path = self.path()
            if path is None:
                return
            merged = self._read()
            for key, value in self._new.items():
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
            self._new.clear()
        except OSError:
            return

    def clear(self) -> None:
        """Forget what this process knows (the file stays; the next :meth:`get` reads it again)."""
        self._known.clear()
        self._new.clear()
        self._loaded = False


SIMULATIONS = SimulationCache(Path(__file__).with_name("pipeline.py"))

__all__ = ["ENV", "SIMULATIONS", "SimulationCache", "cache_dir"]
