"""optuna-dashboard integration: trial notes written while a trial runs, the study note, and the server.

- :func:`note_hook` is a trial hook for ``make_objective(..., trial_hooks=(note_hook,))``: each call writes the
  trial's note (phase, proposer, rationale, estimate, memory, step-time breakdown, outcome so far).
- :func:`refresh_study_note` writes the study note: the current summary (best configuration, gain over the
  baseline, pruned trials by reason, LLM usage, report/export commands). ``run`` refreshes it at the end.
- :func:`serve_dashboard` starts optuna-dashboard with the study's file artifact store (logs, planner
  transcripts, profiles); :func:`dashboard_app` is the same as a WSGI app (tests serve it in a thread).

Every text goes through :func:`~primus_optuna.redaction.redact`, so an API key that leaked into a log tail
or an LLM rationale never reaches a note.

Example::

    objective = make_objective(spec, runner, trial_hooks=(note_hook,))
    study.optimize(objective, n_trials=30)
    refresh_study_note(study)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..redaction import redact
from ..search.attrs import FAILURE_REASON, PRUNE_REASON
from ..spec.study import AXES
from .report import StudyRecord, fmt_gib, fmt_pct, fmt_tok, record_of
from .summary import study_summary as summarize_study


def trial_note(attrs: dict[str, Any], params: dict[str, Any] | None = None, number: int | None = None) -> str:
    """The Markdown note of one trial from its user attrs (and params)."""
    lines = [f"## Trial {number}" if number is not None else "## Trial"]
    if params:
        lines += ["", "**Configuration**:", ""]
        row: list[str] = []
        for item in (f"`{a}={params[a]}`" for a in AXES if a in params):  # bullets that fit the pane
            if row and len(" ".join([*row, item])) + 2 > NOTE_WIDTH:
                lines.append("- " + " ".join(row))
                row = []
            row.append(item)
        lines.append("- " + " ".join(row))
    meta = [f"phase **{attrs.get('phase', '-')}**", f"proposer {attrs.get('proposer', '-')}"]
    if attrs.get("source"):
        meta.append(f"source {attrs['source']}")
    lines += ["", ", ".join(meta)]
    if attrs.get("rationale"):
        lines += ["", "### Rationale", "", *_prose(str(attrs["rationale"]))]
    lines += ["", "### Estimate", ""]
    est = attrs.get("estimate_tokens_per_s_per_gpu")
    lines.append(f"- tokens/s/GPU estimated: {fmt_tok(_f(est))}")
    if attrs.get("measured_tokens_per_s_per_gpu") is not None:
        lines.append(
            f"- measured: {fmt_tok(_f(attrs['measured_tokens_per_s_per_gpu']))} "
            f"(estimate_error {fmt_pct(_f(attrs.get('estimate_error')))})"
        )
    if attrs.get("step_time_s") is not None:
        lines.append(f"- step time: {float(attrs['step_time_s']):.3f} s")
    usable = f"{fmt_gib(_f(attrs.get('memory_usable_gib')))} GiB usable"
    if attrs.get("measured_peak_memory_gib") is not None:  # measured beats estimated
        lines.append(
            f"- peak memory: {fmt_gib(_f(attrs['measured_peak_memory_gib']))} GiB measured, of {usable}"
        )
    if attrs.get("memory_peak_gib") is not None:
        cal = attrs.get("memory_peak_calibrated_gib")
        lines.append(
            f"- peak memory estimated: {fmt_gib(_f(attrs['memory_peak_gib']))} GiB"
            + (f", calibrated {fmt_gib(_f(cal))} GiB" if cal is not None else "")
            + f" (stage {attrs.get('memory_peak_stage', '-')}), of {usable}"
        )
    breakdown = attrs.get("breakdown_s")
    if isinstance(breakdown, dict) and breakdown:
        total = sum(float(v) for v in breakdown.values() if isinstance(v, (int, float))) or 1.0
        lines += ["", "### Step-time breakdown", "", "| term | seconds | share |", "|---|---|---|"]
        for k, v in sorted(breakdown.items(), key=lambda kv: -float(kv[1] or 0)):
            lines.append(f"| {k} | {float(v):.4f} | {float(v) / total:.0%} |")
    for key, label in (
        (PRUNE_REASON, "Pruned"),
        (FAILURE_REASON, "Failed"),
        ("fallback_reason", "Fallback"),
    ):
        if attrs.get(key):
            lines += ["", *_prose(f"**{label}**: {attrs[key]}")]
    if attrs.get("log_tail"):
        lines += ["", "### Log tail", "", "```", *_pane_lines(str(attrs["log_tail"])), "```"]
    return redact("\n".join(lines) + "\n")


NOTE_WIDTH = 100
"""characters per line of a code block in a note (the note pane does not wrap code)"""
NOTE_LOG_LINES = 30


def _prose(text: str) -> list[str]:
    """A paragraph as lines of at most :data:`NOTE_WIDTH` characters, each ending in a Markdown line break
    (optuna-dashboard's note pane does not wrap long lines: a long rationale would run out of it)."""
    import textwrap

    wrapped = textwrap.wrap(text, NOTE_WIDTH, break_long_words=False, break_on_hyphens=False) or [""]
    return [line + "  " for line in wrapped[:-1]] + wrapped[-1:]


def _pane_lines(text: str) -> list[str]:
    """The last :data:`NOTE_LOG_LINES` lines of a log, each wrapped at :data:`NOTE_WIDTH` characters."""
    import textwrap

    out: list[str] = []
    for line in text.splitlines()[-NOTE_LOG_LINES:]:
        out += textwrap.wrap(line, NOTE_WIDTH, subsequent_indent="  ", drop_whitespace=False) or [""]
    return out


def _f(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def note_hook(trial: Any, attrs: dict[str, Any]) -> None:
    """Trial hook: (re)write the running trial's note from its user attrs merged with ``attrs``."""
    from optuna_dashboard import save_note

    merged = {**trial.user_attrs, **attrs}
    save_note(trial, trial_note(merged, trial.params, trial.number))


def study_summary(rec: StudyRecord, program: str = "primus-optuna") -> str:
    """The study note: the study's :class:`~primus_optuna.record.summary.StudySummary` (the same figures as
    ``run``'s summary and the report's executive summary), as short Markdown lines."""
    s = summarize_study(rec, program=program)
    w = rec.spec.workload
    lines = [
        f"## {rec.study_name}",
        "",
        f"{rec.spec.model.name} on {rec.spec.cluster.nodes}×{rec.spec.cluster.gpus_per_node} "
        f"{rec.spec.cluster.gpu.name}, seq {w.seq_length}, GBS {w.global_batch_size}, {w.precision}.",
        "",
        f"- **Trials**: {s.trials_text()} (target {s.n_trials_target}).",
    ]
    b = s.best
    if b is not None:
        lines.append(
            f"- **Best**: trial {b.trial}, `{b.config_key}`, {fmt_tok(b.tokens_per_s_per_gpu)} tokens/s/GPU "
            f"({b.value_kind}, source {b.source or '?'}); {b.peak_text()}."
        )
    else:
        lines.append("- **Best**: no completed trial yet.")
    if s.band is not None:
        lines.append(f"- **Error band**{s.band_text().removeprefix('error band')}.")
    lines.append(f"- **Gain**{s.gain_text().removeprefix('gain')}.")
    lines.append(f"- **Budget**: {s.launched_text()}.")
    if s.pruned_by_reason:
        lines.append("- **Pruned**: " + ", ".join(f"{k} {v}" for k, v in s.pruned_by_reason.items()) + ".")
    if s.failed_by_reason:
        lines.append("- **Failed**: " + ", ".join(f"{k} {v}" for k, v in s.failed_by_reason.items()) + ".")
    lines.append(f"- **GPU-hours**{s.gpu_hours_text().removeprefix('GPU-hours')}.")
    lines.append(f"- **LLM planner**: {s.llm_model or 'none'}; {s.llm.text()}.")
    if s.next:
        lines += ["", "Next:", ""] + [f"- `{c}`" for c in s.next]
    extra = (rec.spec.llm.api_key_env,) if rec.spec.llm.api_key_env else ()
    return redact("\n".join(lines) + "\n", names=extra)


def refresh_study_note(study: Any, storage_url: str = "", program: str = "primus-optuna") -> str:
    """Write the current summary as the study note (its next commands call ``program``); returns the
    Markdown."""
    from optuna_dashboard import save_note

    body = study_summary(record_of(study, storage_url=storage_url), program=program)
    save_note(study, body)
    return body


def artifact_dir_for(storage_url: str, study_name: str | None = None) -> Path:
    """The file artifact store that ``run`` uses for this storage (``<storage stem>-artifacts``)."""
    from .storage import sibling_dir

    return sibling_dir(storage_url, study_name or "study", "-artifacts")


ATTR_CHARS = 1024
"""optuna-dashboard's cut-off for one attribute's text (``MAX_ATTR_LENGTH``)"""


def readable_attr(value: Any) -> str:
    """An attribute value as the dashboard's attribute table shows it: strings and numbers as they are, a
    mapping as ``key: value`` pairs and a list as items, each with its own characters (``→``, not
    ``\\u2192``), cut at :data:`ATTR_CHARS` with a pointer to the full value."""
    import json

    def one(v: Any) -> str:  # nested values without quotes or escapes: {axis: ep, value: 2, reason: ...}
        if isinstance(v, str):
            return v
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {one(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(one(x) for x in v) + "]"
        return json.dumps(v, default=str)

    if isinstance(value, bytes):
        return "<binary object>"
    if isinstance(value, dict):
        text = "; ".join(f"{k}: {one(v)}" for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        text = ", ".join(one(v) for v in value)
    else:
        text = one(value)
    if len(text) > ATTR_CHARS:
        text = text[: ATTR_CHARS - 60].rstrip() + " … (cut; the full value is in the report)"
    return text


def _readable_attrs() -> None:
    """Make optuna-dashboard's attribute table use :func:`readable_attr` (its own writes ``json.dumps``
    with ASCII escapes, so a sweep note reads ``tp 1\\u21922``)."""
    from optuna_dashboard import _serializer

    def serialize_attrs(attrs: dict[str, Any]) -> list[dict[str, str]]:
        return [{"key": k, "value": readable_attr(v)} for k, v in attrs.items()]

    _serializer.serialize_attrs = serialize_attrs  # type: ignore[assignment]


def dashboard_app(storage: Any, artifact_dir: str | Path | None = None) -> Any:
    """optuna-dashboard's WSGI app over ``storage`` with the file artifact store in ``artifact_dir``."""
    import optuna_dashboard

    _readable_attrs()
    from optuna.artifacts import FileSystemArtifactStore

    store = None
    if artifact_dir is not None:
        Path(artifact_dir).mkdir(parents=True, exist_ok=True)
        store = FileSystemArtifactStore(str(artifact_dir))
    return optuna_dashboard.wsgi(storage, artifact_store=store)


def serve_dashboard(
    storage: str, host: str = "127.0.0.1", port: int = 8080, artifact_dir: str | Path | None = None
) -> None:
    """Serve optuna-dashboard (blocking) with the study's artifact store; ``artifact_dir`` defaults to the
    ``<storage stem>-artifacts`` folder that ``run`` writes to."""
    import optuna_dashboard
    from optuna.artifacts import FileSystemArtifactStore

    from .storage import make_storage, normalize_url

    _readable_attrs()
    url = normalize_url(storage)
    adir = Path(artifact_dir) if artifact_dir is not None else artifact_dir_for(url)
    store = FileSystemArtifactStore(str(adir)) if adir.is_dir() else None
    backend = (
        make_storage(url, heartbeat_interval=None) if not url.startswith("journal:") else make_storage(url)
    )
    optuna_dashboard.run_server(backend, host=host, port=port, artifact_store=store)
