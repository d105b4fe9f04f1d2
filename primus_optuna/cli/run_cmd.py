"""``primus-optuna run``: create or resume the study and run trials; print the best configuration at the end."""

from __future__ import annotations

import logging
import os
import signal
import statistics
import sys
from collections import Counter
from typing import Any

import click

from ..run.interrupt import stop_signal
from ._common import study_argument, user_errors

ANALYTICAL_HEARTBEAT_S = 10
"""analytical trials take milliseconds: a short heartbeat makes a killed run's trial retryable within 30 s"""


def _category(reason: str) -> str:
    return reason.split(":", 1)[0].strip() or "unknown"


def _baseline_note(trials: list[Any], best: float) -> str:
    """Why there is no measured gain, and the gain against the baseline's estimate when it has one."""
    base = next((t for t in trials if t.user_attrs.get("sweep_axis") == "baseline"), None)
    if base is None:
        return "n/a (no baseline trial in this study)"
    why = (
        base.user_attrs.get("prune_reason")
        or base.user_attrs.get("failure_reason")
        or base.state.name.lower()
    )
    est = base.user_attrs.get("estimate_tokens_per_s_per_gpu")
    note = f"n/a: the baseline (trial {base.number}) did not complete ({why})"
    if est:
        note += f"; against its estimate of {est:.1f} tokens/s/GPU: {best / est - 1.0:+.1%}"
    return note


def _noise_warning(done: list[Any]) -> list[str]:
    """A warning when the two fastest configurations are closer than the measurement noise: the median
    relative spread of the repeated runs (``runner.options.repeats`` > 1); nothing without repeats."""
    spreads = [float(t.user_attrs["measured_spread"]) for t in done if t.user_attrs.get("measured_spread")]
    if not spreads or len(done) < 2:
        return []
    noise = statistics.median(spreads)
    a, b = sorted(done, key=lambda t: -t.values[0])[:2]
    if a.values[0] - b.values[0] > noise * a.values[0]:
        return []
    return [
        f"  warning: trials {a.number} and {b.number} are within the measurement noise "
        f"({a.values[0] / b.values[0] - 1.0:+.1%} apart; repeated runs spread {noise:.1%}): "
        "measure both again before choosing"
    ]


def summarize(study: Any, storage_url: str) -> list[str]:
    """The end-of-run report: best configuration, gain over the baseline, prune/fail counts, next commands."""
    import optuna

    from ..redaction import redact_url

    State = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    by_state = Counter(t.state for t in trials)
    lines = [
        f"study {study.study_name!r}: {len(trials)} trials — {by_state[State.COMPLETE]} complete, "
        f"{by_state[State.PRUNED]} pruned, {by_state[State.FAIL]} failed"
    ]
    done = [t for t in trials if t.state == State.COMPLETE and t.values]
    base = next((t for t in done if t.user_attrs.get("sweep_axis") == "baseline"), None)
    multi = len(study.directions) > 1
    if done:
        best = max(done, key=lambda t: t.values[0])
        lines.append(f"best configuration (trial {best.number}, {best.user_attrs.get('phase', '?')}):")
        lines.append(f"  {best.user_attrs.get('config_key', best.params)}")
        lines.append(
            f"  {best.values[0]:.1f} tokens/s/GPU, peak memory {best.user_attrs.get('memory_peak_gib')} GiB"
        )
        lines += _noise_warning(done)
        if base is not None and base.values[0] > 0:
            gain = best.values[0] / base.values[0] - 1.0
            # the sweep's centre stands in for a baseline that is illegal or does not fit (its rationale says so)
            moved = "centred on the nearest" in str(base.user_attrs.get("rationale", ""))
            what = (
                "the sweep centre (the study's baseline does not fit or is illegal)"
                if moved
                else "the baseline"
            )
            lines.append(f"  gain over {what} (trial {base.number}, {base.values[0]:.1f}): {gain:+.1%}")
        else:
            lines.append("  gain over the baseline: " + _baseline_note(trials, best.values[0]))
        if multi:
            front = sorted(study.best_trials, key=lambda t: -t.values[0])
            lines.append(f"Pareto front ({len(front)} trials, tokens/s/GPU vs peak GiB):")
            for t in front:
                lines.append(
                    f"  #{t.number}: {t.values[0]:.1f} tok/s/GPU, {t.values[1]:.1f} GiB  {t.user_attrs.get('config_key')}"
                )
    else:
        lines.append("no trial has completed yet")
    pruned = Counter(
        _category(str(t.user_attrs.get("prune_reason", "unknown"))) for t in trials if t.state == State.PRUNED
    )
    if pruned:
        lines.append("pruned by reason: " + ", ".join(f"{k} {v}" for k, v in pruned.most_common()))
    if pruned.get("exhausted") or _exhausted(study):
        lines.append("the search is complete: every legal configuration that fits in memory has been tried")
    failed = Counter(
        str(t.user_attrs.get("failure_reason", "error")) for t in trials if t.state == State.FAIL
    )
    if failed:
        lines.append("failed by reason: " + ", ".join(f"{k} {v}" for k, v in failed.most_common()))
    from ..record.budget import budget_accounting, study_gpus

    lines += budget_accounting(trials, study_gpus(study)).lines()
    phases = Counter(str(t.user_attrs.get("phase", "?")) for t in trials)
    lines.append("trials by phase: " + ", ".join(f"{k} {v}" for k, v in sorted(phases.items())))
    from ..record.gpu_hours import gpu_hours_account
    from ..record.report import record_of
    from ..search.state import stored_spec_data

    if stored_spec_data(study) is not None:  # a study this package created (GPU count, steps, estimates)
        lines.append(gpu_hours_account(record_of(study, storage_url)).line())
    ua = study.user_attrs
    if ua.get("llm_calls") or ua.get("llm_failed_calls"):
        lines.append(
            f"LLM planner: {ua.get('llm_calls', 0)} calls, {ua.get('llm_tokens', 0)} tokens, "
            f"${float(ua.get('llm_cost_usd', 0.0)):.4f}, {ua.get('llm_rejected', 0)} candidates rejected"
            + (
                f"; {ua['llm_failed_calls']} failed calls (no answer; not counted in llm.max_calls)"
                if ua.get("llm_failed_calls")
                else ""
            )
        )
    url = redact_url(storage_url)
    lines.append("next:")
    lines.append(f"  primus-optuna report --storage {url} --study-name {study.study_name}")
    lines.append(f"  primus-optuna dashboard --storage {url}")
    return lines


class _QuietInterrupt(logging.Filter):
    """Drop Optuna's "Trial N failed ... KeyboardInterrupt" warnings and their traceback: an interrupt is
    reported by one line of ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, KeyboardInterrupt):
            return False
        return not (stop_signal() is not None and "failed with value" in record.getMessage())


def summary_data(study: Any, storage_url: str) -> dict[str, Any]:
    """The end-of-run summary as a JSON-serialisable dict (``run --json``)."""
    import optuna

    from ..redaction import redact_url

    State = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    by_state = Counter(t.state.name.lower() for t in trials)
    done = [t for t in trials if t.state == State.COMPLETE and t.values]
    base = next((t for t in done if t.user_attrs.get("sweep_axis") == "baseline"), None)

    def brief(t: Any) -> dict[str, Any]:
        ua = t.user_attrs
        return {
            "trial": t.number,
            "phase": ua.get("phase"),
            "config_key": ua.get("config_key"),
            "params": t.params,
            "tokens_per_s_per_gpu": t.values[0],
            "source": ua.get("source"),
            "measured_peak_memory_gib": ua.get("measured_peak_memory_gib"),
            "estimated_peak_memory_gib": ua.get("memory_peak_gib"),
        }

    best = max(done, key=lambda t: t.values[0]) if done else None
    url = redact_url(storage_url)
    return {
        "study": study.study_name,
        "storage": url,
        "trials": len(trials),
        "by_state": dict(by_state),
        "best": brief(best) if best else None,
        "baseline": brief(base) if base else None,
        "gain_over_baseline": (
            best.values[0] / base.values[0] - 1.0 if best and base and base.values[0] > 0 else None
        ),
        "pruned_by_reason": dict(
            Counter(
                _category(str(t.user_attrs.get("prune_reason", "unknown")))
                for t in trials
                if t.state == State.PRUNED
            )
        ),
        "failed_by_reason": dict(
            Counter(str(t.user_attrs.get("failure_reason", "error")) for t in trials if t.state == State.FAIL)
        ),
        "trials_by_phase": dict(Counter(str(t.user_attrs.get("phase", "?")) for t in trials)),
        "next": [
            f"primus-optuna report --storage {url} --study-name {study.study_name}",
            f"primus-optuna dashboard --storage {url}",
        ],
    }


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
@click.option("--llm-api-base", default=None, metavar="URL", help="Base URL of an OpenAI-compatible server.")
@click.option("--no-llm", is_flag=True, help="Do not use the LLM planner (model-guided fallback only).")
@click.option("--seed", type=int, default=None, help="Sampler seed (default search.seed).")
@click.option("--n-jobs", type=click.IntRange(min=1), default=1, help="Trials run in parallel threads.")
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
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
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
def run(
    study: str,
    storage: str | None,
    study_name: str | None,
    n_trials: int | None,
    runner_kind: str | None,
    llm_model: str | None,
    llm_api_base: str | None,
    no_llm: bool,
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

    from ..errors import SpecError
    from ..physics.plan import no_fit_message
    from ..record.dashboard import note_hook, refresh_study_note
    from ..record.earlier import open_earlier_studies
    from ..record.report import default_report_dir
    from ..record.storage import HEARTBEAT_INTERVAL_S, open_study
    from ..run.base import RunFailure
    from ..run.factory import make_runner
    from ..run.interrupt import Interrupted, exit_code, handle_signals
    from ..run.objective import make_objective, requeue_interrupted
    from ..search.early_stop import study_pruner
    from ..search.sampler import PrimusSampler
    from ..search.sweep import sweep_center
    from ..search.warm_start import apply_warm_start
    from ..space import Space
    from ..spec import StudySpec

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec.from_yaml(study)
    space = Space(spec)
    no_fit = no_fit_message(spec, space)
    if no_fit:  # every trial would be pruned: say so and create nothing
        raise SpecError(no_fit)
    runner = make_runner(spec, runner_kind)
    llm = None if no_llm else (llm_model or spec.llm.model)
    if llm:  # a missing key is one error now, not a failed call per trial later
        from ..search.planner import require_api_key

        require_api_key(spec.llm.model_copy(update={"model": llm}), llm_api_base or spec.llm.api_base)
    # the heartbeat lets a resumed or parallel run fail and retry the trial of a killed worker instead of leaving
    # it RUNNING (its sweep point would then never run); on SQLite it costs tens of ms per trial
    if heartbeat is None:
        heartbeat = ANALYTICAL_HEARTBEAT_S if runner.kind == "analytical" else HEARTBEAT_INTERVAL_S
    # read the earlier studies first: a refused warm start writes nothing
    ws = open_earlier_studies(spec, warm_sources, force=force_warm_start) if warm_sources else None
    handle = open_study(
        spec,
        storage=storage,
        study_name=study_name,
        pruner=study_pruner(
            spec, launches_jobs=getattr(runner, "launches_jobs", False), early_stop=not no_early_stop
        ),
        runs_dir=runs_dir,
        heartbeat_interval=heartbeat or None,
    )
    st = handle.study
    if ws is not None:
        click.echo(apply_warm_start(st, spec, ws), err=as_json)
    st.sampler = PrimusSampler(
        spec,
        seed=spec.search.seed if seed is None else seed,
        llm=llm,
        proposals_per_round=spec.llm.proposals_per_round,
        artifact_store=handle.artifact_store,
        cache_dir=handle.cache_dir if llm else None,
        llm_api_base=llm_api_base,
    )
    objective = make_objective(
        spec,
        runner,
        space=st.sampler.space,
        artifact_store=handle.artifact_store,
        runs_dir=handle.runs_dir,
        trial_hooks=(note_hook,),
    )
    n = n_trials or spec.search.n_trials

    def say(text: str) -> None:  # with --json, stdout carries the JSON summary only
        click.echo(text, err=as_json)

    from ..physics.memory import estimate_memory

    center, center_note = sweep_center(space, fits=lambda c: estimate_memory(spec, c).fits)
    if center_note:
        base = space.canonical(space.baseline)
        why = "; ".join(space.check(base)) or estimate_memory(spec, base).reason()
        say(f"warning: {center_note} ({why}); the sweep starts from {center}")
    first_new = len(st.trials)
    verb = "created" if handle.created else f"resumed ({first_new} trials so far)"
    say(
        f"study {st.study_name!r} {verb}; running {n} trials with the {runner.kind} runner"
        + (f" and planner {llm}" if llm else "")
    )
    say(f"report: {default_report_dir(st.study_name)}/report.html (written by the report command below)")
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    requeued = requeue_interrupted(st)
    if requeued:
        say("re-running first the interrupted trial(s) " + ", ".join(f"#{k}" for k in requeued))
    quiet = _QuietInterrupt()
    optuna_log = logging.getLogger("optuna")
    optuna_log.addFilter(quiet)
    for h in optuna_log.handlers:
        h.addFilter(quiet)
    interrupted: Interrupted | None = None
    if _exhausted(st):
        say("nothing left to run: every legal configuration that fits in memory has been tried")
        n = 0
    try:
        with handle_signals():
            try:
                st.optimize(
                    objective,
                    n_trials=n,
                    timeout=timeout,
                    n_jobs=n_jobs,
                    catch=(RunFailure,),
                    show_progress_bar=not no_progress and not as_json,
                )
            except KeyboardInterrupt as exc:
                interrupted = exc if isinstance(exc, Interrupted) else Interrupted()
            if interrupted is not None:
                stopped = [
                    t.number
                    for t in st.get_trials(deepcopy=False)
                    if t.user_attrs.get("failure_reason") == "interrupted" and t.number >= first_new
                ]
                click.echo(
                    f"interrupted ({signal.Signals(interrupted.signum).name})"
                    + (
                        f": trial(s) {', '.join(f'#{k}' for k in stopped)} stopped, recorded as FAIL "
                        "(failure_reason: interrupted)"
                        if stopped
                        else ""
                    )
                    + "; run the same command again to resume (interrupted trials are re-run first)",
                    err=True,
                )
            refresh_study_note(st, handle.storage_url)
            _print_summary(st, handle.storage_url, as_json)
    except KeyboardInterrupt as exc:  # a second interrupt while writing the summary
        interrupted = interrupted or (exc if isinstance(exc, Interrupted) else Interrupted())
    finally:
        optuna_log.removeFilter(quiet)
        for h in optuna_log.handlers:
            h.removeFilter(quiet)
    if interrupted is not None:
        sys.exit(exit_code(interrupted.signum))
