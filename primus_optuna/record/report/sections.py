"""The report's sections, :func:`render` (the whole report as a :class:`~.doc.Doc`) and :func:`build_report`
(the files). A section is a function ``(doc, rec) -> None`` that opens with ``doc.section(title)`` (numbered
in order) and says so when it has nothing to show; :data:`SECTIONS` lists them in report order, so a new
section is one function plus one entry there (then regenerate the golden report of
tests/record/test_report_golden.py). May import every sibling module (record, analysis, doc, plots), the
physics, the search's fallback (the calibrated estimate) and redaction; nothing imports this module but the
package ``__init__``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ...errors import SpecError
from ...physics.calibration import Calibration
from ...physics.capacity import band_text, capacity_table, si_text
from ...physics.memory_calibration import MemoryCalibration
from ...physics.throughput import estimate_throughput
from ...physics.uncertainty import calibration_band, gain_verdict
from ...redaction import redact
from ...search.attrs import EXPECTED_SHARE, PRUNE_REASON, source_of
from ...search.fallback import corrected_tps
from ...search.warm_start import WarmStart
from ...space import TrainingConfig
from ...spec.study import AXES
from ..summary import (
    estimates_band,
    estimates_ratio_band,
    llm_usage,
    report_dir,
    study_summary,
    suggested_export,
)
from .analysis import (
    estimate_errors,
    fallback_reason,
    gain,
    gpu_hours_saved,
    memory_pruned,
    mfu_denominator,
    planner_rounds,
    reproduce_command,
    sensitivity,
    step_time_s,
    tflops_per_gpu,
    versions,
)
from .doc import Doc, fmt_gib, fmt_pct, fmt_tok
from .plots import plot_axis_effects, plot_capacity, plot_estimate_vs_measured, plot_history, plot_pareto
from .record import DEFAULT_MEASURE_STEPS, StudyRecord, TrialRow, as_number, load_record


def default_report_dir(study_name: str, storage_url: str = "") -> Path:
    """Where ``report`` writes when ``--out`` is not given (``run`` prints this path): ``<storage
    stem>-report`` next to a file storage (beside its ``-artifacts``), else ``./<study name>-report``."""
    return report_dir(storage_url, study_name)


def _cfg(c: TrainingConfig | None) -> str:
    return "-" if c is None else f"`{c.key()}`"


def _throughput_text(rec: StudyRecord, tokens: float | None) -> str:
    """``X tokens/s/GPU (Y TFLOP/s/GPU, MFU Z% of the FP8 peak P TFLOP/s)``."""
    tf = tflops_per_gpu(rec, tokens)
    if tf is None:
        return f"{fmt_tok(tokens)} tokens/s/GPU"
    name, peak = mfu_denominator(rec)
    return (
        f"{fmt_tok(tokens)} tokens/s/GPU ({_tflops(tf)} TFLOP/s/GPU, MFU {tf / peak:.1%} of the dense {name} peak "
        f"{_tflops(peak)} TFLOP/s)"
    )


def _tflops(x: float) -> str:
    """TFLOP/s without rounding a small device's figures to 0 (``1,979``, ``0.042``)."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.3g}"


def _peak_text(t: TrialRow) -> str:
    """The measured peak memory when the run measured one, the estimate (and the calibrated estimate the
    memory filter compared) beside it."""
    measured = as_number(t.attr("measured_peak_memory_gib"))
    cal = as_number(t.attr("memory_peak_calibrated_gib"))
    cal_text = f", calibrated estimate {fmt_gib(cal)} GiB" if cal is not None else ""
    if measured is not None:
        return f"peak memory {fmt_gib(measured)} GiB measured (estimate {fmt_gib(t.peak_gib)} GiB{cal_text})"
    return f"peak memory {fmt_gib(t.peak_gib)} GiB (estimate; not measured{cal_text})"


def _peak_cell(t: TrialRow) -> str:
    """A table cell: the measured peak first (``97.25 measured``), else the estimate (``100.00 est.``)."""
    measured = as_number(t.attr("measured_peak_memory_gib"))
    if measured is not None:
        return f"{fmt_gib(measured)} measured"
    return f"{fmt_gib(t.peak_gib)} est." if t.peak_gib is not None else fmt_gib(None)


def _summary(doc: Doc, rec: StudyRecord) -> None:
    """The study's :class:`~primus_optuna.record.summary.StudySummary`: the same figures as ``run``'s
    summary, ``run --json`` and the dashboard's study note."""
    doc.section("Executive summary")
    s = study_summary(rec)
    best = rec.best
    lines = []
    if best is None or s.best is None:
        lines.append("**Best configuration**: none yet (no completed trial).")
    else:
        lines.append(
            f"**Best configuration**: trial {best.number}, {_cfg(best.config)}: {_throughput_text(rec, best.value)}, "
            f"{source_of(best.attrs)}; {s.best.peak_text()}."
        )
    if s.band is not None:
        lines.append(f"**Error band**{s.band_text().removeprefix('error band')}.")
    lines.append(f"**Gain**{s.gain_text().removeprefix('gain')}.")
    lines.append(f"**Trials**: {s.trials_text()}; {s.launched_text()}.")
    lines.append(f"**GPU-hours**{s.gpu_hours_text().removeprefix('GPU-hours')}.")
    if s.llm.calls or s.llm.failed_calls:
        lines.append(f"**LLM planner**: {s.llm.text()}.")
    doc.bullets(lines)


def _setup(doc: Doc, rec: StudyRecord) -> None:
    spec, s = rec.spec, rec.spec.search
    m, g = spec.model, spec.cluster.gpu
    doc.section("Setup")
    try:
        legal = len(rec.space.configs())
    except Exception as exc:  # an empty space still gets a report
        legal = 0
        doc.p(f"The space is empty: {exc}")
    moe = f", {m.num_experts} experts top-{m.moe_router_topk}" if m.is_moe else " (dense)"
    doc.bullets(
        [
            f"**Model**: {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads{moe}",
            f"**Cluster**: {spec.cluster.nodes} × {spec.cluster.gpus_per_node} {g.name} ({spec.world} GPUs, "
            f"{g.hbm_gb:g} GB HBM, {g.hbm_gib:.1f} GiB device memory each)",
            f"**Workload**: sequence {spec.workload.seq_length}, global batch {spec.workload.global_batch_size}, "
            f"{spec.workload.precision}, distributed optimizer {spec.workload.distributed_optimizer}",
            *(
                [
                    f"**Collectives**: {spec.cluster.network.describe()}; the rest of the model from the catalog"
                ]
                if spec.cluster.network is not None
                else []
            ),
            f"**Objective(s)**: {', '.join(s.objectives)}; memory safety margin {s.memory_safety_margin:.0%}",
            f"**Legal space**: {legal} canonical configurations",
            f"**Sampler**: n_trials {s.n_trials} in the study file (`run --n-trials` overrides it per run), seed {s.seed}, "
            "sweep order "
            f"{', '.join(s.sweep_order) if s.sweep_order else 'default (highest expected impact first)'}, "
            f"proposals per round {spec.llm.proposals_per_round}",
            _llm_setup(rec),
            f"**Runner**: {spec.runner.kind}",
            f"**Storage**: {rec.storage_url or '(in-memory or unnamed)'}, study `{rec.study_name}`",
        ]
    )
    doc.table(["axis", "legal values"], [[a, ", ".join(map(str, v))] for a, v in _legal_values(rec).items()])
    doc.p("Package versions (report environment): " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    doc.p(
        "Reproduce in a fresh study (the study file is written next to this report as `study.yaml`; this "
        "study's own storage and name would resume it and add trials):"
    )
    doc.code(reproduce_command(rec))
    _warm_start(doc, rec)


def _warm_start(doc: Doc, rec: StudyRecord) -> None:
    """What ``--warm-start`` imported and how much it moved the ranking (only for a warm-started study)."""
    data = rec.user_attrs.get("warm_start")
    if not data:
        return
    ws = WarmStart.from_dict(data)
    doc.p("**Warm start** (study attr `warm_start`): " + redact(ws.summary()) + ".")
    r = ws.ranking
    if r:
        doc.p(
            f"With the imported evidence the expected best is `{r['top1']}` (rank {r['top1_was']} under the "
            "uncalibrated model); the configurations offered first after the baseline: "
            + (", ".join(f"`{TrainingConfig.from_params(p).key()}`" for p in ws.offers) or "none")
            + "."
        )


def _gpu_hours(doc: Doc, rec: StudyRecord) -> None:
    """GPU-hours spent and not spent, and the jobs stopped early (only when the study launched jobs)."""
    s = study_summary(rec)
    if not s.launched:
        return
    doc.p(f"**{s.gpu_hours_text()}.**")
    stopped = [t for t in rec.trials if t.number in s.account.stopped_trials]
    if stopped:
        doc.table(
            ["trial", "config", "partial tok/s/GPU", "iterations", "GPU-h used", "GPU-h not spent", "reason"],
            [
                [
                    t.number,
                    _cfg(t.config),
                    fmt_tok(as_number(t.attr("measured_tokens_per_s_per_gpu"))),
                    t.attr("iterations_run") or "-",
                    t.attr("gpu_hours") if t.attr("gpu_hours") is not None else "-",
                    t.attr("gpu_hours_saved_early_stop")
                    if t.attr("gpu_hours_saved_early_stop") is not None
                    else "-",
                    t.attr(PRUNE_REASON),
                ]
                for t in stopped
            ],
        )


def _legal_values(rec: StudyRecord) -> dict[str, list[Any]]:
    """The legal values of the axes the study searches."""
    try:
        values = rec.space.legal_values()
    except Exception:
        values = rec.space.candidates
    return {a: values[a] for a in rec.space.searched_axes}


def _sweep(doc: Doc, rec: StudyRecord) -> None:
    doc.section("Sweep phase")
    rows = [t for t in rec.trials if t.phase == "sweep" and t.config]
    if not rows:
        doc.p("No sweep trial has run yet.")
        return
    base = rec.baseline_config
    # the sweep moves one axis from its centre (the baseline unless that is illegal or does not fit)
    centre_row = next((t for t in rows if t.attr("sweep_axis") == "baseline" and t.config), None)
    centre = centre_row.config if centre_row is not None and centre_row.config is not None else base
    groups: dict[str, list[TrialRow]] = {}
    order = list(AXES)
    for t in rows:
        diff = [a for a in AXES if getattr(t.config, a) != getattr(centre, a)]
        axis = str(t.attr("sweep_axis") or (diff[0] if len(diff) == 1 else "+".join(diff) or "baseline"))
        groups.setdefault(axis, []).append(t)
    b = centre_row or rec.baseline
    doc.p(
        f"Baseline {_cfg(base)}: {b.outcome if b else 'not run yet'}"
        + (f", estimate {fmt_tok(b.estimate)} tokens/s/GPU" if b else "")
    )
    _sweep_design(doc, rec)
    for axis in sorted(groups, key=lambda a: (a != "baseline", order.index(a) if a in order else 99)):
        if axis == "baseline":
            continue
        ts = groups[axis]
        doc.h(3, f"Axis {axis}")
        table = []
        swept = [a for a in axis.split("+") if a in AXES]
        for t in sorted(ts, key=lambda t: t.number):
            value = ", ".join(str(getattr(t.config, a)) for a in swept)
            also = [a for a in AXES if a not in swept and getattr(t.config, a) != getattr(centre, a)]
            note = ("also moved " + ", ".join(f"{a}={getattr(t.config, a)}" for a in also)) if also else ""
            table.append(
                [value, t.number, fmt_tok(t.estimate), fmt_tok(t.measured), _peak_cell(t), t.outcome, note]
            )
        doc.table(["value", "trial", "estimate", "measured", "peak GiB", "outcome", "note"], table)
        done = [t for t in ts if t.state == "COMPLETE" and t.value]
        if done and b and b.value:
            top = max(done, key=lambda t: t.value or 0.0)
            g = gain(top.value, b.value)
            ref = "the sweep centre" if centre != base else "the baseline"
            doc.p(
                f"Best other value on this axis: trial {top.number}, {fmt_pct(g)} vs {ref}"
                + ("." if g is not None and g > 0 else f" ({ref}'s value stays best).")
            )


def _sweep_design(doc: Doc, rec: StudyRecord) -> None:
    """The sweep's centre, budget and what it skipped and why (study attr ``sweep``, written by the sampler)."""
    design = rec.user_attrs.get("sweep")
    if not isinstance(design, dict):
        return
    start = design.get("start") if isinstance(design.get("start"), dict) else {}
    note = "; ".join(x for x in (design.get("centre_note"), start.get("note")) if x) or (
        "the study's baseline (it fits)"
    )
    doc.p(
        f"Sweep centre {design.get('centre')}: {note}. The sweep spends {design.get('points')} trials "
        f"(search.sweep_trials budget {design.get('budget')}), centre included."
    )
    skipped = design.get("skipped") or []
    if skipped:
        doc.p(
            f"Values the sweep did not spend a trial on ({len(skipped)}); the model-guided search after the "
            "sweep may still try them:"
        )
        doc.table(
            ["axis", "value", "why"], [[s.get("axis"), s.get("value"), s.get("reason")] for s in skipped]
        )


def _llm_setup(rec: StudyRecord) -> str:
    """The setup bullet: the planner's model (from the file or ``--llm``), mode and budgets."""
    spec, model = rec.spec, rec.llm_model
    if not model:
        return "**LLM**: none (model-guided fallback only)"
    given = "" if spec.llm.model else " (given on the command line)"
    mode = rec.llm.get("mode") or spec.llm.mode
    cost = f", max ${spec.llm.max_cost_usd}" if spec.llm.max_cost_usd is not None else ""
    return (
        f"**LLM**: {model}{given}, {mode} (max {spec.llm.max_calls} calls{cost}, "
        f"{spec.llm.max_tool_calls} tool calls and {spec.llm.timeout_s:g} s per call)"
    )


def llm_usage_line(books: dict[str, Any]) -> str:
    """The planner's accounting in one sentence (:meth:`~primus_optuna.record.summary.LLMUsage.detail`)."""
    return llm_usage(books).detail()


def _planner(doc: Doc, rec: StudyRecord) -> None:
    doc.section("Planner phase")
    doc.p(llm_usage_line(rec.llm))
    notes = rec.llm.get("notes") or []
    if notes:
        doc.p("The planner's notes (its scratchpad, carried from call to call):")
        doc.bullets([redact(str(n)) for n in notes])
    rounds = planner_rounds(rec)
    if not rounds:
        doc.p(
            "No planner transcript found"
            + (" (no LLM configured)." if not rec.llm_model else " in the artifact store.")
        )
    for i, r in enumerate(rounds, 1):
        head = f"Round {i} (before trial {r.get('trial_number', '?')}, {r.get('model') or '?'})"
        doc.h(3, head)
        accepted, rejected = r.get("accepted") or [], r.get("rejected") or []
        doc.p(
            f"{len(accepted)} accepted, {len(rejected)} rejected; tokens {r.get('tokens', '-')}, cost "
            f"${float(r.get('cost_usd') or 0.0):.4f}, {r.get('elapsed_s', '-')} s; transcript artifact "
            f"`{r['artifact']}`." + (f" **Error, fell back**: {r['error']}" if r.get("error") else "")
        )
        tools = r.get("tool_calls") or []
        if tools:
            doc.p(
                f"{r.get('mode', 'agent')}: {len(tools)} tool calls ("
                + ", ".join(str(c.get("tool")) + (" refused" if c.get("refused") else "") for c in tools)
                + ")."
            )
        table = [[_cand(c.get("config")), "accepted", "", c.get("rationale") or ""] for c in accepted]
        table += [
            [_cand(c.get("candidate")), "rejected", c.get("reason") or "", c.get("rationale") or ""]
            for c in rejected
        ]
        if table:
            doc.table(["candidate", "decision", "reason", "rationale"], table)
    rows = [t for t in rec.trials if t.phase in ("planner", "fallback")]
    if not rows:
        doc.p("No planner or fallback trial has run yet (the sweep comes first).")
        return
    doc.h(3, "Planner and fallback trials")
    doc.table(
        ["trial", "phase", "proposer", "config", "estimate", "value", "outcome", "rationale"],
        [
            [
                t.number,
                t.phase,
                t.attr("proposer") or "-",
                _cfg(t.config),
                fmt_tok(t.estimate),
                fmt_tok(t.value),
                t.outcome,
                t.attr("rationale") or "",
            ]
            for t in rows
        ],
    )
    shares = [
        v for t in rows if t.phase == "planner" and (v := as_number(t.attr(EXPECTED_SHARE))) is not None
    ]
    if shares:
        lo, hi = f"{min(shares):.0%}", f"{max(shares):.0%}"
        doc.p(
            f"Planner launches: {len(shares)}, expected at {lo if lo == hi else f'{lo}-{hi}'} of the best when "
            "the gate let them through (each trial's `expected_share_of_best`)."
        )
    fallbacks = Counter(fallback_reason(rec, t) for t in rows if t.phase == "fallback")
    if fallbacks:
        doc.p("Fallback trials by reason: " + ", ".join(f"{k}: {v}" for k, v in fallbacks.items()) + ".")


def _cand(c: Any) -> str:
    if isinstance(c, dict):
        return ", ".join(f"{k}={v}" for k, v in c.items())
    return str(c or "-")


def _memory(doc: Doc, rec: StudyRecord) -> None:
    doc.section("Memory filter")
    doc.bullets(["budget: " + study_summary(rec).launched_text()])
    pruned = [t for t in rec.trials if t.state == "PRUNED"]
    counts = Counter(t.prune_category for t in pruned)
    doc.p(
        f"{len(pruned)} trials pruned"
        + (": " + ", ".join(f"{k} {v}" for k, v in counts.most_common()) if counts else "")
        + "."
    )
    mcal = MemoryCalibration.from_dict(rec.user_attrs.get("memory_calibration"))
    if not mcal.is_identity:
        doc.p(
            f"Memory calibration (study attr `memory_calibration`): the filter compares the estimated peak "
            f"× {mcal.scale:.2f} with the usable memory, {mcal.describe().removeprefix('calibrated ')}; "
            "configurations pruned before it that fit under it were offered again."
        )
    mem = memory_pruned(rec)
    if not mem:
        doc.p("The memory filter removed no trial.")
        return
    hours, counted = gpu_hours_saved(rec)
    doc.p(
        f"The memory filter removed {len(mem)} trials before launch. **GPU-hours not spent: {hours:.2f}** "
        f"(estimated step time × {rec.measure_steps} steps × {rec.spec.world} GPUs, over the {counted} trials "
        "with a step-time estimate; steps from runner.options, else the default "
        f"{DEFAULT_MEASURE_STEPS})."
    )
    doc.table(
        ["trial", "config", "est. peak GiB", "usable GiB", "stage", "reason", "est. step s"],
        [
            [
                t.number,
                _cfg(t.config),
                fmt_gib(t.peak_gib),
                fmt_gib(as_number(t.attr("memory_usable_gib"))),
                t.attr("memory_peak_stage") if t.attr("memory_peak_stage") is not None else "-",
                t.attr(PRUNE_REASON),
                "-" if step_time_s(rec, t) is None else f"{step_time_s(rec, t):.3f}",
            ]
            for t in mem
        ],
    )


def _estimates(doc: Doc, rec: StudyRecord) -> None:
    doc.section("Estimates vs measurements")
    pairs = estimate_errors(rec)
    if not pairs:
        sources = set(study_summary(rec).account.sources)
        if sources <= {"analytical"}:
            doc.p(
                "No trial was measured by a real runner: completed trials used the analytical runner, whose "
                "measurement is the estimate itself, so there is nothing to compare yet."
            )
        else:
            doc.p(
                "No completed trial recorded a measurement beside its estimate (values by source: "
                + ", ".join(f"{k} {v}" for k, v in study_summary(rec).account.sources.items())
                + "), so there is nothing to compare yet."
            )
        return
    errs = [p[3] for p in pairs]
    mean, median = statistics.fmean(errs), statistics.median(errs)
    bias = "optimistic (estimates above measurements)" if mean > 0 else "pessimistic (estimates below)"
    doc.p(
        f"{len(pairs)} measured trials. Mean estimate_error **{fmt_pct(mean)}**, median **{fmt_pct(median)}**, "
        f"mean absolute {fmt_pct(statistics.fmean(abs(e) for e in errs))}. Optimism bias: the model is {bias}."
    )
    cal_doc = rec.user_attrs.get("calibration")
    if cal_doc:
        cal = Calibration.from_dict(cal_doc)
        terms = ", ".join(f"{k} ×{v:.2f}" for k, v in sorted(cal.multipliers.items()) if abs(v - 1.0) > 1e-9)
        after = [
            corrected_tps(estimate_throughput(rec.spec, t.config), cal) / m - 1.0
            for t, _, m, _ in pairs
            if t.config is not None and m
        ]
        doc.p(
            f"Running calibration (study attr `calibration`, fitted on {cal.n_trials} measured trials): global "
            f"scale ×{cal.scale:.3f}"
            + (f"; per term {terms}" if terms else "")
            + ". "
            + (
                f"With it, the mean absolute error on these trials (in-sample) is "
                f"{fmt_pct(statistics.fmean(abs(e) for e in after))} instead of "
                f"{fmt_pct(statistics.fmean(abs(e) for e in errs))}; the fallback proposer ranks with it."
                if after
                else ""
            )
        )
    misses = [t for t, *_ in pairs if t.attr("memory_model_miss")]
    if misses:
        doc.p(
            "Memory-model misses (predicted to fit, ran out of memory or the reverse): "
            + ", ".join(str(t.number) for t in misses)
        )
    doc.table(
        ["trial", "config", "source", "estimate", "measured", "estimate_error"],
        [
            [t.number, _cfg(t.config), t.attr("source"), fmt_tok(e), fmt_tok(m), fmt_pct(err)]
            for t, e, m, err in pairs
        ],
    )
    doc.image("estimate_vs_measured", plot_estimate_vs_measured(pairs), "estimate vs measured")


def _ratio_note(rec: StudyRecord, estimated_gain: float | None) -> str:
    """`` (a ±18% error of the ratio of two estimates could undo it: <source>)`` for an estimated gain."""
    if estimated_gain is None:
        return ""
    band = estimates_ratio_band(rec)
    return f" ({gain_verdict(estimated_gain, band)}: {band.source})"


def _result(doc: Doc, rec: StudyRecord) -> None:
    doc.section("Result")
    _gpu_hours(doc, rec)
    best = rec.best
    if best is None:
        doc.p("No completed trial yet: no best configuration.")
        return
    b = rec.baseline
    doc.p(f"**Best configuration**: trial {best.number}, {_cfg(best.config)}")
    band = estimates_band(rec)
    doc.p(
        f"{_throughput_text(rec, best.value)} ({source_of(best.attrs)}); estimate "
        f"{fmt_tok(best.estimate)} tokens/s/GPU {band.text()} ({band.source}); {_peak_text(best)}."
    )
    repeats = best.attr("measured_repeats")
    if isinstance(repeats, list) and len(repeats) > 1:
        doc.p(
            f"Measured {len(repeats)} times ({', '.join(fmt_tok(as_number(v)) for v in repeats)} tokens/s/GPU): "
            f"the value is the median; spread (max − min) / median {fmt_pct(as_number(best.attr('measured_spread')))}."
        )
    if b is not None and b.state == "COMPLETE":
        doc.p(
            f"Gain over the baseline (trial {b.number}, {fmt_tok(b.value)} tokens/s/GPU): "
            f"objective {fmt_pct(gain(best.value, b.value))}, estimated "
            f"{fmt_pct(gain(best.estimate, b.estimate))}{_ratio_note(rec, gain(best.estimate, b.estimate))}."
        )
    elif b is not None:
        doc.p(
            f"The baseline (trial {b.number}) has no completed run ({b.outcome}): no measured gain; estimated "
            f"gain over its estimate {fmt_tok(b.estimate)}: {fmt_pct(gain(best.estimate, b.estimate))}"
            f"{_ratio_note(rec, gain(best.estimate, b.estimate))}."
        )
    else:
        s = study_summary(rec)  # the run summary's gain: over the sweep centre when the baseline was not run
        text = (
            s.gain_text() if s.gain is not None else "the baseline has not been tried yet: no gain to report"
        )
        doc.p(text[:1].upper() + text[1:] + ".")
    if best.config:
        fmt = suggested_export(rec.spec)  # one the study's GPUs run
        others = ", ".join(f for f in ("primus", "megatron", "env", "json") if f != fmt)
        doc.p(
            f"Export it: `primus-optuna export --storage {rec.storage_url or 'URL'} --study-name {rec.study_name} "
            f"--format {fmt}` (or {others})."
        )
    if rec.multi_objective:
        front = rec.pareto()
        doc.h(3, "Pareto front")
        doc.table(
            ["trial", "config", "tokens/s/GPU", "peak GiB"],
            [[t.number, _cfg(t.config), fmt_tok(t.values[0]), fmt_gib(t.values[1])] for t in front],
        )
        doc.image("pareto_front", plot_pareto(rec, front), "Pareto front")
    cal_doc = rec.user_attrs.get("calibration")
    cal = Calibration.from_dict(cal_doc) if cal_doc else None
    doc.h(
        3,
        "Sensitivity (each axis ±1 candidate step from the best, "
        + ("estimated with the study's calibration)" if cal else "analytical)"),
    )
    if best.config is None:
        doc.p("The best trial has no configuration.")
        return
    mcal = MemoryCalibration.from_dict(rec.user_attrs.get("memory_calibration"))
    rows, verdict = sensitivity(rec, best.config, cal, mcal)
    if not mcal.is_identity:
        doc.p(
            f"Fit and peak use the memory filter's calibration (study attr `memory_calibration`, "
            f"{mcal.describe()})."
        )
    if cal is not None:
        band = calibration_band(rec.spec, [(t.config, m) for t, _, m, _ in estimate_errors(rec) if t.config])
        doc.p(
            f"Estimates use the study's step-time calibration (study attr `calibration`, fitted on "
            f"{cal.n_trials} measured trials, global scale ×{cal.scale:.3f})"
            + (f"; their error band {band.text()} ({band.source})." if band else ".")
        )
    doc.p(f"Verdict: **{verdict}**.")
    if rows:
        own = estimate_throughput(rec.spec, best.config, cal).tokens_per_s_per_gpu
        measured = (
            f"; measured {fmt_tok(best.value)}" if best.attr("source") not in (None, "analytical") else ""
        )
        doc.p(
            f"`vs best est.` compares each neighbour's estimate with the best configuration's own estimate under "
            f"the same model ({fmt_tok(own)} tokens/s/GPU{measured}): the model's view of each step, not a "
            "measured difference."
        )
        doc.table(
            ["axis", "step", "value", "status", "estimate", "vs best est.", "est. peak GiB", "note"],
            [
                [
                    r["axis"],
                    r["step"],
                    r["value"],
                    r["status"],
                    fmt_tok(r.get("tokens")),
                    fmt_pct(r.get("delta")),
                    fmt_gib(r.get("peak_gib")),
                    r.get("note", ""),
                ]
                for r in rows
            ],
        )


def _capacity(doc: Doc, rec: StudyRecord) -> None:
    """The study's capacity plan (docs/capacity.md), only when the study file has a ``capacity`` section."""
    cap = rec.spec.capacity
    if cap is None:
        return
    doc.section("Capacity plan")
    try:
        t = capacity_table(
            rec.spec,
            cap.gpus,
            cap.gpu or None,
            tokens=cap.tokens,
            days=cap.days,
            prices=cap.prices,
            batch=cap.batch,
        )
    except SpecError as exc:
        doc.p(f"Not computed: {exc}.")
        return
    batch = (
        "the study's global batch at every size" if t.batch == "fixed" else "the global batch scaled per GPU"
    )
    target = (
        f"{si_text(t.tokens)} tokens" + (f" in {t.days:g} days" if t.days is not None else "")
        if t.tokens
        else "none"
    )
    doc.p(f"Estimated (analytical model), {batch}; target: {target}.")
    rows = []
    for ty in t.types:
        if ty.excluded:
            rows.append([ty.name, "-", "-", "-", "-", "-", "-", "-", f"excluded: {ty.excluded}"])
        for r in t.rows(ty.name):
            if not r.fits:
                rows.append([r.gpu, r.gpus, "-", "-", "-", "-", "-", "-", r.why_not])
                continue
            days = "-" if r.days is None else f"{r.days:,.1f}" + (" (misses)" if r.meets is False else "")
            rows.append([
                r.gpu, r.gpus, fmt_tok(r.tokens_per_s_per_gpu), days,
                "-" if r.gpu_hours is None else f"{r.gpu_hours:,.0f}", "-" if r.cost is None else f"${r.cost:,.0f}",
                f"{r.efficiency:.0%}", band_text(r.band), _cfg(r.best.config if r.best else None) + (f" ({r.note})" if r.note else ""),
            ])  # fmt: skip
    head = ["GPU", "GPUs", "tokens/s/GPU", "days", "GPU-hours", "cost", "eff.", "band", "configuration"]
    doc.table(head, rows)
    a = t.answers
    answers = [("fewest GPUs meeting the target", a.fewest), ("cheapest", a.cheapest), ("fastest", a.fastest)]
    doc.bullets([f"{label}: " + (f"{r.gpus} {r.gpu}" if r else "none") for label, r in answers])
    doc.image("capacity", plot_capacity(t), "capacity plan")


def _plots(doc: Doc, rec: StudyRecord) -> None:
    doc.section("Plots")
    hist, effects = plot_history(rec), plot_axis_effects(rec)
    if not hist and not effects:
        doc.p("No completed trial to plot yet.")
    doc.image("history", hist, "optimisation history")
    doc.image("axis_effects", effects, "per-axis effects")


def _trials(doc: Doc, rec: StudyRecord) -> None:
    doc.section("All trials")
    if not rec.trials:
        doc.p("The study has no trial yet.")
        return
    doc.table(
        ["trial", "state", "phase", "config", "value", "estimate", "peak GiB", "outcome"],
        [
            [
                t.number,
                t.state,
                t.phase,
                _cfg(t.config),
                fmt_tok(t.value),
                fmt_tok(t.estimate),
                _peak_cell(t),
                t.outcome,
            ]
            for t in rec.trials
        ],
    )
    if rec.artifacts:
        doc.p(
            "Artifacts (open them in optuna-dashboard): "
            + ", ".join(
                f"`{a['filename']}`" + (f" (trial {a['trial']})" if a["trial"] is not None else " (study)")
                for a in rec.artifacts
            )
        )


Section = Callable[[Doc, StudyRecord], None]

SECTIONS: list[Section] = [
    _summary, _setup, _sweep, _planner, _memory, _estimates, _result, _capacity, _plots, _trials
]  # fmt: skip
"""The report's sections in order; each is numbered by the position it is written in."""


def render(rec: StudyRecord) -> Doc:
    """The whole report as a :class:`Doc`."""
    doc = Doc()
    state = f"{len(rec.trials)} trials ({', '.join(f'{k} {v}' for k, v in Counter(t.state for t in rec.trials).items()) or 'none'})"
    doc.h(1, f"primus-optuna report: {rec.study_name}")
    doc.p(f"{state}; target {rec.spec.search.n_trials}.")
    for section in SECTIONS:
        section(doc, rec)
    return doc


def build_report(
    storage: Any,
    study_name: str | None,
    out_dir: str | Path | None = None,
    *,
    artifact_dir: str | Path | None = None,
) -> dict[str, Path]:
    """Write ``report.md``, ``report.html``, ``study.yaml`` and ``plots/*.png`` under ``out_dir``
    (default ``<study name>-report``). ``storage`` is a URL or an Optuna storage; ``artifact_dir`` the file
    artifact store (default: next to a file storage).

    Returns the paths by kind (``md``, ``html``, ``study``, ``plots``)."""
    rec = load_record(storage, study_name, artifact_dir)
    out = Path(out_dir) if out_dir is not None else default_report_dir(rec.study_name, rec.storage_url)
    out.mkdir(parents=True, exist_ok=True)
    doc = render(rec)
    extra = (rec.spec.llm.api_key_env,) if rec.spec.llm.api_key_env else ()
    paths = {"md": out / "report.md", "html": out / "report.html", "study": out / "study.yaml"}
    paths["md"].write_text(redact(doc.markdown(), names=extra))
    paths["html"].write_text(redact(doc.html(f"primus-optuna report: {rec.study_name}"), names=extra))
    paths["study"].write_text(yaml.safe_dump(rec.spec.to_public_dict(), sort_keys=False))
    if doc.images:
        (out / "plots").mkdir(exist_ok=True)
        for name, png in doc.images.items():
            (out / "plots" / f"{name}.png").write_bytes(png)
        paths["plots"] = out / "plots"
    return paths
