"""``primus-optuna run``: create or resume the study and run trials; print the best configuration at the end."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from typing import Any

import click

from ..run.interrupt import stop_signal
from ._common import F, check_storage_url, seconds_option, study_argument, trial_value_text, user_errors


def _summary(study: Any, storage_url: str) -> Any:
    """The study's :class:`~primus_optuna.record.summary.StudySummary` (one account for every view)."""
    from ..record.report import record_of
    from ..record.summary import study_summary
    from ._common import program

    return study_summary(record_of(study, storage_url), program=program(), exhausted=_exhausted(study))


def summarize(study: Any, storage_url: str) -> list[str]:
    """The end-of-run report: best configuration, gain over the baseline, prune/fail counts, next commands."""
    return _summary(study, storage_url).lines()


def summary_data(study: Any, storage_url: str) -> dict[str, Any]:
    """The end-of-run summary as a JSON-serialisable dict (``run --json``)."""
    return _summary(study, storage_url).to_dict()


class ProgressLines:
    """Optuna callback for a non-terminal stderr (a log file, a pipe, CI): one line per finished trial, at
    most one every :attr:`every_s` seconds between the first and the last (Optuna's bar would write
    hundreds of ``\\r`` updates into the log)."""

    every_s = 10.0

    def __init__(self, n_trials: int) -> None:
        import threading
        import time

        self.n = n_trials
        self.done = 0
        self.last = float("-inf")
        self.clock = time.monotonic
        self.lock = threading.Lock()  # --n-jobs: trials finish in several threads

    def __call__(self, study: Any, trial: Any) -> None:
        with self.lock:
            self.done += 1
            done, now = self.done, self.clock()
            if done not in (1, self.n) and now - self.last < self.every_s:
                return
            self.last = now
        value = f" {trial_value_text(trial)}" if trial.values else ""
        reason = trial.user_attrs.get("prune_reason") or trial.user_attrs.get("failure_reason")
        best = self._best(study)
        click.echo(
            f"[{done}/{self.n}] trial {trial.number} {trial.state.name.lower()}{value}"
            + (f" ({reason})" if reason and not value else "")
            + best,
            err=True,
        )

    @staticmethod
    def _best(study: Any) -> str:
        """``; best X (trial N)`` by the first objective (tokens/s/GPU), also on a Pareto front, whose order
        is not by it."""
        try:
            front = study.best_trials
        except ValueError:
            return ""
        if not front:
            return ""
        sign = 1.0 if study.directions[0].name == "MAXIMIZE" else -1.0
        top = max(front, key=lambda t: sign * t.values[0])
        return f"; best {top.values[0]:.1f} (trial {top.number})"


class _PlainLines(logging.Formatter):
    """Optuna's and the library's log lines as the command's own: "warning: ...", not "[W <date>] ..." (a
    progress bar on a terminal keeps Optuna's own handler and format)."""

    def format(self, record: logging.LogRecord) -> str:
        record.level_word = record.levelname.lower()
        return super().format(record)


class _QuietInterrupt(logging.Filter):
    """Drop Optuna's "Trial N failed ... KeyboardInterrupt" warnings and their traceback: an interrupt is
    reported by one line of ours. A run failure (out of memory, timeout, no throughput: the job's fault, not
    ours) is one line naming the trial, the reason and the message, without a traceback; Optuna's second
    "failed with value None" line goes."""

    def filter(self, record: logging.LogRecord) -> bool:
        from ..run.base import RunFailure

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, KeyboardInterrupt):
            return False
        if isinstance(exc, RunFailure):
            number = record.getMessage().split(" failed", 1)[0].removeprefix("Trial ")
            record.msg = f"trial {number} failed ({exc.reason}): {exc}; its log is a trial artifact"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            self.failed.add(number)
            return True
        if "failed with value None" in record.getMessage():
            number = record.getMessage().split(" failed", 1)[0].removeprefix("Trial ")
            if number in self.failed:
                return False
        return not (stop_signal() is not None and "failed with value" in record.getMessage())

    def __init__(self) -> None:
        super().__init__()
        self.failed: set[str] = set()


def _graceful_signals(fn: F) -> F:
    """Run the command under :func:`~primus_optuna.run.interrupt.handle_signals` (graceful) from its first
    line: a signal while the study is opened is honoured before the first trial, and never cut into library
    code (Python's own handler raises even in a SQLAlchemy weakref callback, where the interrupt is lost)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..run.interrupt import handle_signals

        with handle_signals(graceful=True):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _exhausted(study: Any) -> bool:
    """Whether the study's PrimusSampler has nothing left to propose (:meth:`PrimusSampler.is_exhausted`)."""
    is_exhausted = getattr(study.sampler, "is_exhausted", None)
    return bool(is_exhausted(study)) if callable(is_exhausted) else False


def _print_summary(study: Any, storage_url: str, as_json: bool) -> None:
    if as_json:
        from ._common import emit_json

        emit_json(summary_data(study, storage_url))
        return
    for line in summarize(study, storage_url):
        click.echo(line)


@click.command("run")
@study_argument
@click.option(
    "--storage", default=None, metavar="URL", help="Optuna storage URL (default sqlite:///<study name>.db)."
)
@click.option("--study-name", default=None, help="Optuna study name (default: the study file's name).")
@click.option(
    "--n-trials",
    type=click.IntRange(min=1),
    default=None,
    help="New trials to run now (default search.n_trials).",
)
@click.option(
    "--runner", "runner_kind", default=None, help="Runner kind (default runner.kind of the study file)."
)
@click.option(
    "--llm", "llm_model", default=None, metavar="MODEL", help="LiteLLM model string for the planner."
)
@click.option(
    "--llm-api-base",
    default=None,
    metavar="URL",
    help="Base URL of an OpenAI-compatible server (one on this machine needs no key in the environment).",
)
@click.option("--no-llm", is_flag=True, help="Do not use the LLM planner (model-guided fallback only).")
@click.option(
    "--llm-mode",
    type=click.Choice(["auto", "agent", "oneshot", "rank"]),
    default=None,
    help="agent: the planner calls the library's tools before proposing; oneshot: one answer; rank: it chooses "
    "among the fallback's best candidates (default llm.mode).",
)
@click.option(
    "--llm-max-calls", type=click.IntRange(min=0), default=None, help="Planner calls (default llm.max_calls)."
)
@seconds_option("--llm-timeout", help="Wall-clock limit of one planner call (default llm.timeout_s).")
@click.option("--seed", type=int, default=None, help="Sampler seed (default search.seed).")
@click.option(
    "--n-jobs",
    type=click.IntRange(min=1),
    default=1,
    help="Trials run in parallel threads. With a runner that launches jobs on the study's GPUs (command, "
    "local, primus, megatron, torchtitan) more than 1 is refused, since the jobs would share the same GPUs: run one worker "
    "per allocation on one --storage instead; the slurm runner (own allocation per job) and the analytical "
    "runner take any K.",
)
@click.option(
    "--runs-dir",
    default=None,
    metavar="DIR",
    help="Per-trial work directories (default next to the storage).",
)
@click.option(
    "--heartbeat",
    type=click.IntRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Trial heartbeat interval; a trial silent for 3x this long (a killed worker) is failed and retried. "
    "Default 10 for the analytical runner, 30 otherwise; 0 disables (then a killed run leaves a RUNNING trial).",
)
@seconds_option(
    "--timeout",
    help="Start no new trial after this many seconds (the running ones finish); the study stays resumable.",
)
@click.option(
    "--no-early-stop",
    is_flag=True,
    help="Let every launched job run to its end (default: stop a job clearly slower than the best trial; "
    "thresholds in search.early_stop).",
)
@click.option(
    "--warm-start",
    "warm_sources",
    multiple=True,
    metavar="STORAGE_URL[:STUDY_NAME]",
    help="Seed the calibrations from an earlier study's measured trials and offer its best configurations "
    "first after the baseline (repeatable; the study name may be omitted when the storage holds one).",
)
@click.option(
    "--force-warm-start",
    is_flag=True,
    help="Warm-start even from a study of another model (not recommended).",
)
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the end-of-run summary as JSON on stdout.")
@user_errors
@_graceful_signals
def run(
    study: str,
    storage: str | None,
    study_name: str | None,
    n_trials: int | None,
    runner_kind: str | None,
    llm_model: str | None,
    llm_api_base: str | None,
    no_llm: bool,
    llm_mode: str | None,
    llm_max_calls: int | None,
    llm_timeout: float | None,
    seed: int | None,
    n_jobs: int,
    runs_dir: str | None,
    heartbeat: int | None,
    timeout: float | None,
    no_early_stop: bool,
    warm_sources: tuple[str, ...],
    force_warm_start: bool,
    no_progress: bool,
    as_json: bool,
) -> None:
    """Create or resume the Optuna study of STUDY and run trials (sweep, then planner or model-guided)."""
    import optuna

    from ..record.storage import default_storage_url
    from ..session import open_session
    from ..spec import StudySpec

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec.from_yaml(study)
    check_storage_url(storage or default_storage_url(spec))
    from ..record.dashboard import note_hook

    session = open_session(
        spec,
        storage=storage,
        study_name=study_name,
        n_trials=n_trials,
        runner_kind=runner_kind,
        llm_model="" if no_llm else llm_model,
        llm_api_base=llm_api_base,
        llm_overrides={"mode": llm_mode, "max_calls": llm_max_calls, "timeout_s": llm_timeout},
        seed=seed,
        n_jobs=n_jobs,
        runs_dir=runs_dir,
        heartbeat=heartbeat,
        early_stop=not no_early_stop,
        warm_sources=warm_sources,
        force_warm_start=force_warm_start,
        trial_hooks=(note_hook,),
    )
    _run_session(session, n_jobs=n_jobs, timeout=timeout, no_progress=no_progress, as_json=as_json)


def _announce(session: Any, say: Any) -> int:
    """Print the session's warm start, warnings, preflight and plan; the number of trials to ask."""
    from ..record.report import default_report_dir
    from ..run.objective import requeue_interrupted

    st, runner, llm, handle = session.study, session.runner, session.llm, session.handle
    if session.warm_start is not None:
        say(session.warm_start)
    for line in session.warnings:
        say(f"warning: {line}")
    for line in session.notes:
        say(line)
    verb = "created" if handle.created else f"resumed ({len(st.trials)} trials so far)"
    for line in session.preflight:
        say(line)
    say(
        f"study {st.study_name!r} {verb}; running {session.n_trials} trials with the {runner.kind} runner"
        + (f" and planner {llm.model} ({st.sampler.planner.mode})" if llm and st.sampler.planner else "")
    )
    say(
        f"report: {default_report_dir(st.study_name, handle.storage_url).resolve()}/report.html "
        "(written by the report command below)"
    )
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    requeued = requeue_interrupted(st)
    if requeued:
        say("re-running first the interrupted trial(s) " + ", ".join(f"#{k}" for k in requeued))
    if _exhausted(st):
        say("nothing left to run: every legal configuration that fits in memory has been tried")
        return 0
    # a signal while the study was opened: ask no trial (the sampler would decide one, a planner call with an
    # LLM, only for the objective to record it as interrupted)
    return 0 if stop_signal() is not None else session.n_trials


class _InterruptLine:
    """The interrupt's line, printed once: before the summary, or after it for a signal while it is written."""

    def __init__(self, study: Any, first_new: int) -> None:
        self.study, self.first_new, self.reported = study, first_new, False

    def __call__(self) -> None:
        signum = stop_signal()
        if signum is None or self.reported:
            return
        self.reported = True
        stopped = [
            t.number
            for t in self.study.get_trials(deepcopy=False)
            if t.user_attrs.get("failure_reason") == "interrupted" and t.number >= self.first_new
        ]
        click.echo(
            f"interrupted ({signal.Signals(signum).name})"
            + (
                f": trial(s) {', '.join(f'#{k}' for k in stopped)} stopped, recorded as FAIL "
                "(failure_reason: interrupted)"
                if stopped
                else ""
            )
            + "; run the same command again to resume (interrupted trials are re-run first)",
            err=True,
        )


def _run_session(
    session: Any, *, n_jobs: int, timeout: float | None, no_progress: bool, as_json: bool
) -> None:
    """Optimize the opened study, print its summary, and exit with the interrupt's or launch guard's code."""
    from ..record.dashboard import refresh_study_note
    from ..run.base import RunFailure
    from ..run.interrupt import exit_code, raise_if_stopped
    from ..run.launch_guard import RepeatedLaunchFailure
    from ._common import program

    st, handle = session.study, session.handle

    def say(text: str) -> None:  # with --json, stdout carries the JSON summary only
        click.echo(text, err=as_json)

    first_new = len(st.trials)
    guard = RepeatedLaunchFailure(first_trial=first_new)
    n = _announce(session, say)
    quiet = _QuietInterrupt()
    optuna_log = logging.getLogger("optuna")
    for f in (optuna_log, *optuna_log.handlers):
        f.addFilter(quiet)
    formats = [(h, h.formatter) for h in optuna_log.handlers]
    for h, _ in formats:
        h.setFormatter(_PlainLines("%(level_word)s: %(message)s"))
    # a terminal gets Optuna's progress bar; a log file or pipe gets one line per trial (throttled)
    show_bar = not no_progress and not as_json and sys.stderr.isatty()
    lines = not no_progress and not show_bar
    report_interrupt = _InterruptLine(st, first_new)
    # The stop flag alone says whether, and by which signal, the run was interrupted (its exit code, its line):
    # an interrupted `optimize` raises the Interrupted of the objective, a runner, the callback or a second
    # signal, or returns when the flag rose after the last trial; a signal may also come during the summary.
    try:
        try:
            st.optimize(
                session.objective,
                n_trials=n,
                timeout=timeout,
                n_jobs=n_jobs,
                catch=(RunFailure,),
                show_progress_bar=show_bar,
                # raise_if_stopped ends the study once a trial is recorded after a signal: without it the next
                # trial would be asked (and its sampler decision made) only to be recorded as interrupted
                callbacks=[*([ProgressLines(n)] if lines else []), guard, raise_if_stopped],
            )
        except KeyboardInterrupt:
            if stop_signal() is None:  # raised by code, not a signal's (handle_signals raises the flag first)
                raise
        report_interrupt()
        refresh_study_note(st, handle.storage_url, program=program())
        _print_summary(st, handle.storage_url, as_json)
    except KeyboardInterrupt:  # a second signal while the summary is written
        if stop_signal() is None:
            raise
    finally:
        for f in (optuna_log, *optuna_log.handlers):
            f.removeFilter(quiet)
        for h, fmt in formats:
            h.setFormatter(fmt)
    report_interrupt()
    signum = stop_signal()
    if signum is not None:
        sys.exit(exit_code(signum))
    if guard.message:
        click.echo(f"error: {guard.message}", err=True)
        sys.exit(1)
