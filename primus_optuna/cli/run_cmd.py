"""``primus-optuna run``: create or resume the study and run trials; print the best configuration at the end."""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any

import click

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
        if base is not None and base.values[0] > 0:
            gain = best.values[0] / base.values[0] - 1.0
            lines.append(f"  gain over the baseline (trial {base.number}, {base.values[0]:.1f}): {gain:+.1%}")
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
    if pruned.get("exhausted"):
        lines.append("the search is complete: every legal configuration that fits in memory has been tried")
    failed = Counter(
        str(t.user_attrs.get("failure_reason", "error")) for t in trials if t.state == State.FAIL
    )
    if failed:
        lines.append("failed by reason: " + ", ".join(f"{k} {v}" for k, v in failed.most_common()))
    phases = Counter(str(t.user_attrs.get("phase", "?")) for t in trials)
    lines.append("trials by phase: " + ", ".join(f"{k} {v}" for k, v in sorted(phases.items())))
    from ..record.gpu_hours import gpu_hours_account
    from ..record.report import record_of

    lines.append(gpu_hours_account(record_of(study, storage_url)).line())
    ua = study.user_attrs
    if ua.get("llm_calls"):
        lines.append(
            f"LLM planner: {ua['llm_calls']} calls, {ua.get('llm_tokens', 0)} tokens, "
            f"${float(ua.get('llm_cost_usd', 0.0)):.4f}, {ua.get('llm_rejected', 0)} candidates rejected"
        )
    url = redact_url(storage_url)
    lines.append("next:")
    lines.append(f"  primus-optuna report --storage {url} --study-name {study.study_name}")
    lines.append(f"  primus-optuna dashboard --storage {url}")
    return lines


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
    no_early_stop: bool,
    warm_sources: tuple[str, ...],
    force_warm_start: bool,
    no_progress: bool,
) -> None:
    """Create or resume the Optuna study of STUDY and run trials (sweep, then planner or model-guided)."""
    import optuna

    from ..record.dashboard import note_hook, refresh_study_note
    from ..record.earlier import open_earlier_studies
    from ..record.report import default_report_dir
    from ..record.storage import HEARTBEAT_INTERVAL_S, open_study
    from ..run.base import RunFailure
    from ..run.factory import make_runner
    from ..run.objective import make_objective
    from ..search.early_stop import study_pruner
    from ..search.sampler import PrimusSampler
    from ..search.warm_start import apply_warm_start
    from ..spec import StudySpec

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec.from_yaml(study)
    runner = make_runner(spec, runner_kind)
    llm = None if no_llm else (llm_model or spec.llm.model)
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
        click.echo(apply_warm_start(st, spec, ws))
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
    verb = "created" if handle.created else f"resumed ({len(st.trials)} trials so far)"
    click.echo(
        f"study {st.study_name!r} {verb}; running {n} trials with the {runner.kind} runner"
        + (f" and planner {llm}" if llm else "")
    )
    click.echo(
        f"report: {default_report_dir(st.study_name)}/report.html (written by the report command below)"
    )
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    try:
        st.optimize(
            objective, n_trials=n, n_jobs=n_jobs, catch=(RunFailure,), show_progress_bar=not no_progress
        )
    except KeyboardInterrupt:
        click.echo("interrupted; run the same command again to resume where it stopped", err=True)
    refresh_study_note(st, handle.storage_url)
    for line in summarize(st, handle.storage_url):
        click.echo(line)
