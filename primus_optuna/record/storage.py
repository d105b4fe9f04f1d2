"""Open or create a primus-optuna study: storage URL, heartbeat, artifact store, and the resume guard.

Default storage is ``sqlite:///<study name>.db`` in the working directory. Any Optuna URL works
(``postgresql://...``, ``mysql://...``), and a journal file is accepted as ``journal:PATH`` or a path ending in
``.log``/``.jsonl``. RDB storages get a heartbeat so a killed worker's trial is failed and retried
(:class:`optuna.storages.RetryHeartbeatStaleTrialCallback`) by the next ``optimize`` once it is older than
the grace period (default 3 x the heartbeat interval). Keep the grace period above interval + 1 s: SQLite's
clock has whole seconds, so a shorter one fails (and retries) trials that are alive.

At creation the study stores the study file (system attr ``primus:spec``, see :mod:`primus_optuna.search.state`,
with a one-line ``primus_study`` user attr) and ``primus_space_hash`` in its user attrs; resuming a study whose space hash differs is refused with a :class:`SpecError`.

Example::

    handle = open_study(spec, sampler=PrimusSampler(spec))
    handle.study.optimize(make_objective(spec, runner), n_trials=30)
"""

from __future__ import annotations

import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.artifacts import FileSystemArtifactStore

from ..errors import SpecError
from ..search.state import (  # noqa: F401 (re-exported)
    SPACE_HASH,
    changed_fields,
    hashed_workload,
    refuse_changed_space,
    space_hash,
    store_spec,
    stored_spec_data,
)
from ..spec import StudySpec

HEARTBEAT_INTERVAL_S = 30
GRACE_FACTOR = 3
"""grace period = GRACE_FACTOR x heartbeat interval when only the interval is given"""
MAX_RETRY = 2
CONNECT_TIMEOUT_S = 30
CREATE_ATTEMPTS = 6
"""workers opening a brand-new database together race on Optuna's schema creation (a Slurm array's first
tasks): the loser sees a unique-violation / already-exists error and simply retries"""


def default_storage_url(spec: StudySpec) -> str:
    """``spec.storage`` or ``sqlite:///<study name>.db`` (relative to the working directory)."""
    return spec.storage or f"sqlite:///{spec.name}.db"


def normalize_url(url: str) -> str:
    """Accept bare file paths: ``x.db``/``x.sqlite`` -> SQLite, ``x.log``/``x.jsonl`` -> ``journal:x.log``."""
    if "://" in url or url.startswith("journal:"):
        return url
    if url.endswith((".log", ".jsonl")):
        return f"journal:{url}"
    return f"sqlite:///{url}"


def storage_file(url: str) -> Path | None:
    """The local file behind a SQLite or journal URL (``None`` for a database server or in-memory SQLite)."""
    url = normalize_url(url)
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:").removeprefix("//"))
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///").split("?", 1)[0]
        return None if path in ("", ":memory:") else Path(path)
    return None


def sibling_dir(url: str, study_name: str, suffix: str) -> Path:
    """``<storage stem><suffix>`` next to a file storage, else ``./<study name><suffix>``."""
    f = storage_file(url)
    return f.with_name(f.stem + suffix) if f is not None else Path(f"{study_name}{suffix}")


def make_storage(
    url: str,
    *,
    heartbeat_interval: int | None = HEARTBEAT_INTERVAL_S,
    grace_period: int | None = None,
    max_retry: int = MAX_RETRY,
) -> optuna.storages.BaseStorage:
    """An Optuna storage for ``url`` (RDB with heartbeat and retry of stale trials, or a journal file)."""
    url = normalize_url(url)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = storage_file(url)
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    f = storage_file(url)
    if f is not None:
        f.parent.mkdir(parents=True, exist_ok=True)
    if url.startswith("sqlite"):
        connect_args: dict[str, Any] = {"timeout": CONNECT_TIMEOUT_S}
    elif url.startswith("postgresql") or url.startswith("mysql"):
        connect_args = {"connect_timeout": CONNECT_TIMEOUT_S}
    else:
        connect_args = {}
    heartbeat: dict[str, Any] = {}
    if heartbeat_interval:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
        heartbeat = {
            "heartbeat_interval": heartbeat_interval,
            "grace_period": grace_period or GRACE_FACTOR * heartbeat_interval,
            "heartbeat_stale_trial_callback": retry,
        }
    for attempt in range(CREATE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, engine_kwargs={"connect_args": connect_args}, **heartbeat
                )
        except (ImportError, ModuleNotFoundError) as exc:
            raise SpecError(f"--storage {url!r}: the database driver is missing ({exc})") from None
        except Exception as exc:  # sqlalchemy ArgumentError / OperationalError: a user-facing URL problem
            if attempt + 1 < CREATE_ATTEMPTS and _schema_race(exc):
                time.sleep(0.2 + random.random() * 0.5 * (attempt + 1))
                continue
            raise SpecError(f"--storage {url!r}: cannot open the storage: {exc}") from None
    raise AssertionError("unreachable")


def _schema_race(exc: BaseException) -> bool:
    """Whether ``exc`` is another worker creating the same tables at the same moment."""
    text = f"{type(exc).__name__} {exc}".lower()
    return any(k in text for k in ("uniqueviolation", "already exists", "duplicate key", "integrityerror"))


def directions(spec: StudySpec) -> list[str]:
    """``maximize`` tokens/s/GPU, ``minimize`` peak memory."""
    return ["maximize" if o == "tokens_per_s_per_gpu" else "minimize" for o in spec.search.objectives]


METRIC_NAMES = {"tokens_per_s_per_gpu": "tokens/s/GPU", "peak_memory_gib": "peak memory GiB"}
"""display text of each objective; the study's metric names are the objective names themselves, so
``trials_dataframe()`` has a column a user can type (``value_tokens_per_s_per_gpu``)"""


@dataclass
class StudyHandle:
    """An opened study and the places that belong to it."""

    study: optuna.Study
    storage_url: str
    artifact_store: FileSystemArtifactStore
    artifact_dir: Path
    runs_dir: Path
    cache_dir: Path
    created: bool


def open_study(
    spec: StudySpec,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    artifact_dir: str | Path | None = None,
    runs_dir: str | Path | None = None,
    heartbeat_interval: int | None = HEARTBEAT_INTERVAL_S,
    grace_period: int | None = None,
) -> StudyHandle:
    """Create the study, or resume it after checking that its space is unchanged.

    Raises :class:`SpecError` when the stored ``primus_space_hash`` differs from this study file's.
    """
    url = normalize_url(storage or default_storage_url(spec))
    name = study_name or spec.name
    store = make_storage(url, heartbeat_interval=heartbeat_interval, grace_period=grace_period)
    existed = name in {
        s.study_name for s in optuna.study.get_all_study_summaries(store, include_best_trial=False)
    }
    if existed:
        refuse_changed_space(
            optuna.load_study(study_name=name, storage=store), spec, where=f"study {name!r} in {url}"
        )
    try:
        study = optuna.create_study(
            study_name=name,
            storage=store,
            sampler=sampler,
            pruner=pruner,
            directions=directions(spec),
            load_if_exists=True,
        )
    except ValueError as exc:
        raise SpecError(f"study {name!r} in {url}: {exc}") from None
    store_spec(study, spec)  # a system attr: optuna-dashboard's study page lists user attrs only
    if study.metric_names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(spec.search.objectives))
    adir = Path(artifact_dir) if artifact_dir else sibling_dir(url, name, "-artifacts")
    adir.mkdir(parents=True, exist_ok=True)
    rdir = Path(runs_dir) if runs_dir else sibling_dir(url, name, "-runs")
    return StudyHandle(
        study=study,
        storage_url=url,
        artifact_store=FileSystemArtifactStore(str(adir)),
        artifact_dir=adir,
        runs_dir=rdir,
        cache_dir=sibling_dir(url, name, "-dspy-cache"),
        created=not existed,
    )
