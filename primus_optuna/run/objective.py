""":func:`make_objective`: the Optuna objective of a primus-optuna study.

``suggest_config`` → duplicate guard (a configuration already RUNNING or COMPLETE in the study is pruned as
``duplicate``) → memory pruning (:class:`MemoryPrefilterPruner` through ``trial.should_prune()`` in a
single-objective study, its helper in a Pareto study) → ``runner.run`` in a per-trial work directory → user
attrs → trial hooks → tokens/s/GPU, or ``(tokens/s/GPU, peak GiB)`` for a Pareto study.

A :class:`~primus_optuna.run.base.RunFailure` is recorded (``failure_reason``, ``log_tail``, the log as a trial
artifact, ``memory_model_miss`` for an OOM the memory model did not predict) and re-raised: optimise with
``catch=(RunFailure,)`` so the trial is FAIL and the study goes on. A successful run's log is attached too.
The trial hooks (e.g. the dashboard note) run for every outcome: complete, pruned or failed. An interrupt
(Ctrl-C, SIGTERM: a :class:`KeyboardInterrupt`) is recorded as ``failure_reason: interrupted`` and re-raised
(Optuna marks the trial FAIL); :func:`requeue_interrupted` enqueues such trials again when the study resumes
(``primus-optuna run`` does), and :class:`~primus_optuna.search.sampler.PrimusSampler` re-runs any failed point
once by itself, so a Python-API study resumes the same way. Nothing is refitted here: measured trials, peaks
and out-of-memory runs are evidence that :func:`~primus_optuna.search.calibrations.study_calibrations` reads.
The first trial stores the study file in the study (``primus:spec``).

Example::

    objective = make_objective(spec, AnalyticalRunner(spec))
    study.optimize(objective, n_trials=30, catch=(RunFailure,))
"""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna

from ..physics.memory import estimate_memory
from ..physics.throughput import estimate_throughput
from ..redaction import looks_secret, redact
from ..search.attrs import FAILURE_REASON, LAUNCHED, PRUNE_REASON, RUN_ATTRS
from ..search.configs import trial_config
from ..search.pruner import MemoryPrefilterPruner, prune_if_infeasible
from ..search.sampler import INTERRUPTED
from ..search.state import CONFIG, store_spec, system_attrs
from ..search.suggest import suggest_config
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.axes import OPTIONAL_AXES
from ..spec.study import AXES
from .base import EarlyStopped, RunContext, RunFailure, Runner
from .follow import LiveIteration
from .interrupt import Interrupted, stop_signal

RETRY_ATTRS = ("phase", "proposer", "rationale", "config_key", "sweep_index", "sweep_axis", "sweep_value")
"""user attrs an interrupted trial's re-run keeps (what was proposed, not what was measured)"""
TrialHook = Callable[[optuna.Trial, dict[str, Any]], None]
LOG_TAIL_CHARS = 4000


def duplicate_of(
    study: optuna.Study, trial: optuna.Trial, space: Space, config: TrainingConfig
) -> str | None:
    """``"duplicate: ..."`` when another RUNNING or COMPLETE trial has the same configuration.

    This trial's params are already in storage when it checks, so of two concurrent trials with one
    configuration at least one sees the other (both may prune; a config whose trials were all pruned as
    duplicates counts as untried again).
    """
    states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE)
    for t in study._storage.get_all_trials(study._study_id, deepcopy=False, states=states):
        if t.number == trial.number or not _settled(t):
            continue
        if trial_config(space, t) == config:
            return f"duplicate: same configuration as trial {t.number} ({t.state.name.lower()})"
    return None


def _settled(t: optuna.trial.FrozenTrial) -> bool:
    """Whether ``t`` runs its configuration: ``suggest_config`` recorded it (or every axis is a param). A
    running trial that is still deciding only holds a claim, which it gives up if another worker holds
    the same one, so a claim alone never makes this trial a duplicate."""
    return bool(t.system_attrs.get(CONFIG)) or all(a in t.params for a in AXES)


def storage_runs_dir(study: optuna.Study) -> Path:
    """``<storage stem>-runs`` next to a SQLite/journal file; ``./runs/<study>`` for a database server; a
    temporary directory for an in-memory study."""
    from ..record.storage import storage_file

    backend = getattr(study._storage, "_backend", study._storage)
    url = getattr(backend, "url", None)
    if url is None:
        journal = getattr(backend, "_file_path", None)
        url = f"journal:{journal}" if journal else None
    if url is None:
        return Path(tempfile.gettempdir()) / "primus-optuna-runs" / study.study_name
    f = storage_file(url)
    if f is not None:
        return f.with_name(f.stem + "-runs")
    return Path("runs") / study.study_name


def set_attrs(trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """Write user attrs, skipping those the trial already holds with the same value (each write is a
    storage transaction)."""
    have = trial.user_attrs
    for k, v in attrs.items():
        if k not in have or have[k] != v:
            trial.set_user_attr(k, v)


def forget_inherited_run(trial: optuna.Trial) -> None:
    """A heartbeat retry starts with the failed trial's user attrs (Optuna copies them: optuna 5.1.0
    optuna/storages/_callbacks.py:72-90); what that run left (its log, GPU-hours, measurement) is not this
    trial's: cleared to ``None`` before the retry runs."""
    if "failed_trial" not in system_attrs(trial):
        return
    set_attrs(trial, {k: None for k in RUN_ATTRS if trial.user_attrs.get(k) is not None})


def make_objective(
    spec: StudySpec,
    runner: Runner | None = None,
    *,
    space: Space | None = None,
    artifact_store: Any = None,
    trial_hooks: Iterable[TrialHook] = (),
    runs_dir: str | Path | None = None,
) -> Callable[[optuna.Trial], Any]:
    """The objective: returns tokens/s/GPU (or ``(tokens/s/GPU, peak GiB)`` when the study is a Pareto one)."""
    if runner is None:
        from .analytical import AnalyticalRunner

        runner = AnalyticalRunner(spec)
    return _Objective(spec, runner, space or Space(spec), artifact_store, tuple(trial_hooks), runs_dir)


class _Objective:
    """One trial: the sampler's configuration, the memory gate, the runner, and every outcome recorded (its
    attrs, log and hooks) as it happens."""

    def __init__(
        self,
        spec: StudySpec,
        runner: Runner,
        space: Space,
        artifact_store: Any,
        hooks: tuple[TrialHook, ...],
        runs_dir: str | Path | None,
    ) -> None:
        self.spec, self.runner, self.space, self.store, self.hooks = (
            spec,
            runner,
            space,
            artifact_store,
            hooks,
        )
        self.multi = spec.search.multi_objective
        env = spec.runner.options.get("env")
        self.secrets = (
            [str(v) for k, v in (env or {}).items() if looks_secret(k)] if isinstance(env, dict) else []
        )
        self.fixed_runs = Path(runs_dir) if runs_dir is not None else None
        self.launches = bool(getattr(runner, "launches_jobs", False))

    def hide(self, text: str) -> str:
        return redact(text, values=self.secrets)

    def __call__(self, trial: optuna.Trial) -> Any:
        try:
            return self.run_trial(trial)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: FAIL as interrupted, re-run first on resume
            failed: dict[str, Any] = {FAILURE_REASON: INTERRUPTED, "interrupted_by": _signal_name(exc)}
            started = getattr(exc, "log_path", None) is not None  # a job had been launched (its log exists)
            if self.launches and started and trial.datetime_start is not None:
                wall = (datetime.now() - trial.datetime_start).total_seconds()
                failed.update(_hours(wall, self.spec.world, "gpu_hours"))  # what the stopped job used
            set_attrs(trial, failed)
            _attach_log(self.store, trial, getattr(exc, "log_path", None), self.hide)
            _notify(self.hooks, trial, {**_stored_attrs(trial), **failed})
            raise

    def run_trial(self, trial: optuna.Trial) -> Any:
        spec, space, hooks = self.spec, self.space, self.hooks
        study = trial.study
        forget_inherited_run(trial)
        store_spec(
            study, spec
        )  # a Python-API study becomes a full citizen (report, export, warm start, note)
        config = suggest_config(trial, spec, space)
        signum = stop_signal()
        if signum is not None:  # a graceful stop asked while the sampler decided: do not start the runner
            raise Interrupted(signum)
        dup = duplicate_of(study, trial, space, config)
        if dup:
            trial.set_user_attr(PRUNE_REASON, dup)
            _notify(hooks, trial, {"config_key": config.key(), PRUNE_REASON: dup})
            raise optuna.TrialPruned(dup)
        mem = estimate_memory(spec, config)
        est = estimate_throughput(spec, config)
        attrs: dict[str, Any] = {
            "config_key": config.key(),
            "estimate_tokens_per_s_per_gpu": round(est.tokens_per_s_per_gpu, 3),
            "memory_peak_gib": round(mem.peak_gib, 3),
            "memory_usable_gib": round(mem.usable_gib, 3),
            "memory_peak_stage": mem.peak_stage,
        }
        set_attrs(trial, attrs)
        self._gate(trial, config, mem, attrs)
        try:
            m, repeated = _measure(self.runner, config, self._context(trial))
        except EarlyStopped as exc:
            self._early_stopped(trial, exc, est, attrs)
        except RunFailure as exc:
            self._failed(trial, exc, mem, attrs)
            raise
        return self._result(trial, m, repeated, est, mem, attrs)

    def _gate(self, trial: optuna.Trial, config: TrainingConfig, mem: Any, attrs: dict[str, Any]) -> None:
        """Prune before launch what would not fit (the study's memory pruner, or the estimate)."""
        try:
            if not self.multi and isinstance(trial.study.pruner, MemoryPrefilterPruner):
                if trial.should_prune():
                    # the pruner wrote the (possibly calibrated) reason to storage; trial.user_attrs is a cache
                    reason = _stored_attrs(trial).get(PRUNE_REASON) or mem.reason()
                    raise optuna.TrialPruned(reason)
            else:
                prune_if_infeasible(trial, self.spec, config)
        except optuna.TrialPruned:
            reason = _stored_attrs(trial).get(PRUNE_REASON, mem.reason())
            _notify(self.hooks, trial, {**attrs, PRUNE_REASON: reason})
            raise

    def _context(self, trial: optuna.Trial) -> RunContext:
        study = trial.study
        workdir = (self.fixed_runs or storage_runs_dir(study)) / f"trial-{trial.number:05d}"
        if getattr(self.runner, "uses_workdir", True):  # the analytical runner writes nothing
            workdir.mkdir(parents=True, exist_ok=True)
        context = RunContext(
            spec=self.spec, workdir=workdir, trial_number=trial.number, study_name=study.study_name
        )
        if self.launches and not self.multi:
            context.on_iteration = _follower(trial)
        if self.launches:
            set_attrs(trial, {LAUNCHED: True})  # before the job starts: a killed worker's trial keeps it
        return context

    def _early_stopped(self, trial: optuna.Trial, exc: EarlyStopped, est: Any, attrs: dict[str, Any]) -> None:
        stopped = {
            PRUNE_REASON: self.hide(str(exc)),
            "iterations_run": exc.iterations,
            **_hours(exc.wall_s, self.spec.world, "gpu_hours"),
        }
        if exc.gpu_hours_saved is not None:
            stopped["gpu_hours_saved_early_stop"] = round(exc.gpu_hours_saved, 4)
        if exc.tokens_per_s_per_gpu:  # a partial measurement: the fallback and the calibration learn from it
            m_tps = exc.tokens_per_s_per_gpu
            stopped |= {
                "source": "measured",
                "measured_partial": True,
                "measured_tokens_per_s_per_gpu": round(m_tps, 3),
                "estimate_error": round(est.tokens_per_s_per_gpu / m_tps - 1.0, 5),
            }
        set_attrs(trial, stopped)
        _attach_log(self.store, trial, exc.log_path, self.hide)
        _notify(self.hooks, trial, {**attrs, **stopped})
        raise optuna.TrialPruned(stopped[PRUNE_REASON]) from None

    def _failed(self, trial: optuna.Trial, exc: RunFailure, mem: Any, attrs: dict[str, Any]) -> None:
        # a job's output may carry credentials (an environment dump, a URL with a token): nothing of it is
        # stored, uploaded or re-raised (Optuna logs the exception) unredacted
        exc.args = tuple(self.hide(str(a)) for a in exc.args)
        exc.log_tail = self.hide(exc.log_tail or str(exc))
        failed = {FAILURE_REASON: exc.reason, "log_tail": exc.log_tail[-LOG_TAIL_CHARS:]}
        if self.launches:
            failed.update(_hours(exc.wall_s, self.spec.world, "gpu_hours"))
        if exc.reason == "oom" and _memory_fitted(trial, mem):
            failed["memory_model_miss"] = True
        if exc.reason == "oom" and not getattr(self.runner, "measures_cluster_memory", True):
            failed["counts_for_memory"] = False  # e.g. a local profiling run: not the cluster's GPU
        set_attrs(trial, failed)
        _attach_log(self.store, trial, exc.log_path, self.hide)
        _notify(self.hooks, trial, {**attrs, **failed})

    def _result(
        self, trial: optuna.Trial, m: Any, repeated: Any, est: Any, mem: Any, attrs: dict[str, Any]
    ) -> Any:
        peak = m.peak_memory_gib if m.peak_memory_gib is not None else mem.peak_gib
        result: dict[str, Any] = {
            "source": m.source,
            "step_time_s": round(m.step_time_s, 6),
            "breakdown_s": m.details.get("breakdown_s")
            or {k: round(v, 6) for k, v in est.breakdown_s.items()},
        }
        if self.launches:
            result.update(_hours(m.details.get("wall_s"), self.spec.world, "gpu_hours"))
        if m.source != "analytical":
            result["measured_tokens_per_s_per_gpu"] = round(m.tokens_per_s_per_gpu, 3)
            result["estimate_error"] = (
                round(est.tokens_per_s_per_gpu / m.tokens_per_s_per_gpu - 1.0, 5)
                if m.tokens_per_s_per_gpu
                else None
            )
            if m.peak_memory_gib is not None:
                result["measured_peak_memory_gib"] = round(m.peak_memory_gib, 3)
                if m.peak_reserved_gib is not None:
                    result["measured_reserved_memory_gib"] = round(m.peak_reserved_gib, 3)
                if not getattr(self.runner, "measures_cluster_memory", True):
                    result["counts_for_memory"] = False
        if repeated:
            result.update(repeated)
        if m.log_path and Path(m.log_path).is_file():
            result["log_tail"] = self.hide(_tail(Path(m.log_path)))
            _attach_log(self.store, trial, m.log_path, self.hide)
        set_attrs(trial, result)
        attrs.update(result)
        attrs["value"] = m.tokens_per_s_per_gpu
        _notify(self.hooks, trial, attrs)
        return (m.tokens_per_s_per_gpu, peak) if self.multi else m.tokens_per_s_per_gpu


def _memory_fitted(trial: optuna.Trial, mem: Any) -> bool:
    """Whether the memory filter let the trial through as fitting: the calibrated peak the pruner recorded
    (``memory_peak_calibrated_gib``) when the study has a memory calibration, else the estimate."""
    calibrated = _stored_attrs(trial).get("memory_peak_calibrated_gib")
    peak = float(calibrated) if isinstance(calibrated, (int, float)) else mem.peak_gib
    return peak <= mem.usable_gib


def _measure(runner: Runner, config: TrainingConfig, context: RunContext) -> tuple[Any, dict[str, Any]]:
    """``runner.repeats`` runs of ``config`` (each in ``repeat-<j>`` under the trial's directory when more than
    one): the median run (by tokens/s/GPU, the lower one of an even count) and the attrs that record them all
    (``measured_repeats``, ``measured_spread`` = (max − min) / median)."""
    k = max(1, int(getattr(runner, "repeats", 1) or 1))
    if k == 1:
        return runner.run(config, context), {}
    runs = []
    for j in range(k):
        sub = RunContext(
            spec=context.spec,
            workdir=context.workdir / f"repeat-{j}",
            trial_number=context.trial_number,
            study_name=context.study_name,
        )
        sub.workdir.mkdir(parents=True, exist_ok=True)
        runs.append(runner.run(config, sub))
    ordered = sorted(runs, key=lambda r: r.tokens_per_s_per_gpu)
    median = ordered[(k - 1) // 2]
    values = [r.tokens_per_s_per_gpu for r in runs]
    spread = (
        (max(values) - min(values)) / median.tokens_per_s_per_gpu if median.tokens_per_s_per_gpu else None
    )
    return median, {
        "measured_repeats": [round(v, 3) for v in values],
        "measured_spread": round(spread, 5) if spread is not None else None,
    }


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Enqueue once, ahead of any new trial, the configuration of every trial that ended as FAIL with
    ``failure_reason: interrupted`` (Ctrl-C, SIGTERM); returns their numbers. The retry keeps the original's
    phase, rationale and sweep attrs (an interrupted baseline is still the baseline) plus ``retry_of``."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    out = []
    for t in trials:
        if t.state != optuna.trial.TrialState.FAIL or t.user_attrs.get(FAILURE_REASON) != INTERRUPTED:
            continue
        if t.number in retried or t.user_attrs.get("retry_of") in out:
            continue
        params = {k: v for k, v in t.params.items() if k in AXES}
        if len(params) < len(AXES) - len(OPTIONAL_AXES):
            continue  # interrupted before its configuration was chosen: nothing to re-run
        attrs = {k: t.user_attrs[k] for k in RETRY_ATTRS if k in t.user_attrs}
        attrs["rationale"] = f"re-run of interrupted trial {t.number}: " + str(attrs.get("rationale", ""))
        attrs["retry_of"] = t.number
        study.enqueue_trial(params, user_attrs=attrs)
        out.append(t.number)
    return out


def _follower(trial: optuna.Trial) -> Callable[[LiveIteration, bool], str | None]:
    """The live-iteration callback of a launching run: report each iteration's tokens/s/GPU as an intermediate
    value and, while the job runs, ask the study's pruner whether to stop it (its ``prune_reason``)."""

    def on_iteration(it: LiveIteration, live: bool) -> str | None:
        trial.report(it.tokens_per_s_per_gpu, it.iteration)
        if live and trial.should_prune():
            return _stored_attrs(trial).get(PRUNE_REASON) or (
                f"slow: stopped by {type(trial.study.pruner).__name__} at iteration {it.iteration}"
            )
        return None

    return on_iteration


def _hours(wall_s: float | None, world: int, key: str) -> dict[str, float]:
    """``{key: GPU-hours}`` of a job that ran ``wall_s`` seconds on the study's ``world`` GPUs."""
    return {key: round(float(wall_s) * world / 3600.0, 4)} if wall_s is not None else {}


def _stored_attrs(trial: optuna.Trial) -> dict[str, Any]:
    """The trial's user attrs as stored now (``trial.user_attrs`` may be a cached copy)."""
    return trial.study._storage.get_trial(trial._trial_id).user_attrs


def _signal_name(exc: BaseException) -> str:
    """The stop flag's signal (what ``run`` reports), else the exception's (a Python-API Ctrl-C: SIGINT)."""
    signum = stop_signal() or getattr(exc, "signum", signal.SIGINT)
    return signal.Signals(signum).name


def _notify(hooks: tuple[TrialHook, ...], trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    for hook in hooks:
        hook(trial, attrs)


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - LOG_TAIL_CHARS))
        return f.read().decode("utf-8", "replace")


def _attach_log(
    artifact_store: Any, trial: optuna.Trial, log_path: str | None, hide: Callable[[str], str]
) -> None:
    """Upload a redacted copy of a run's log as a trial artifact (when there is a store and the file exists)."""
    if artifact_store is None or not log_path or not Path(log_path).is_file():
        return
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(log_path).name
        copy.write_text(hide(Path(log_path).read_text(errors="replace")))
        optuna.artifacts.upload_artifact(
            artifact_store=artifact_store, file_path=str(copy), study_or_trial=trial
        )
