"""The audit report of a primus-optuna study, built from its storage alone.

:func:`build_report` writes ``report.md`` (plots as PNG files under ``plots/``), a self-contained
``report.html`` (plots embedded as base64 PNG) and ``study.yaml`` (the study file, for the command that
reproduces the run). Sections: setup, sweep phase, planner phase, memory filter, estimates vs measurements,
result (best configuration, gain over the baseline, Pareto front, sensitivity), plots, all trials. It works
on any study created by primus-optuna, finished or not; a section with nothing to show says so.

Example::

    paths = build_report("sqlite:///mixtral.db", "mixtral-8x22b-mi355x-fp8", "mixtral-report")
    paths["html"]  # Path('mixtral-report/report.html')
"""

from __future__ import annotations

import base64
import html
import io
import platform
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from ...physics.calibration import Calibration
from ...physics.memory_calibration import MemoryCalibration
from ...physics.throughput import estimate_throughput
from ...redaction import redact
from ...search.fallback import corrected_tps
from ...space import Space, TrainingConfig
from ...spec import StudySpec
from ...spec.study import AXES
from ..export import study_spec, trial_config

DEFAULT_MEASURE_STEPS = 10
"""Steps a measured run would take when ``runner.options`` names none (``train_iters`` or ``steps``): the
default ``train_iters`` of the primus and megatron runners (run/presets.py)."""

SHARP_LOSS = 0.10
"""A neighbour that loses at least this fraction of the best's estimate makes an axis "sharp"."""
FLAT_LOSS = 0.03
"""Neighbours within this fraction of the best's estimate make an axis "flat" (a broad basin)."""

PACKAGES = ("primus-optuna", "optuna", "optuna-dashboard", "dspy", "litellm", "matplotlib", "pydantic")


# --- what storage holds -------------------------------------------------------------------------------------


@dataclass
class TrialRow:
    """One trial as the report sees it."""

    number: int
    state: str
    config: TrainingConfig | None
    values: list[float] | None
    attrs: dict[str, Any]

    @property
    def value(self) -> float | None:
        return self.values[0] if self.values else None

    def attr(self, key: str) -> Any:
        return self.attrs.get(key)

    @property
    def phase(self) -> str:
        return str(self.attrs.get("phase") or "-")

    @property
    def estimate(self) -> float | None:
        return _num(self.attrs.get("estimate_tokens_per_s_per_gpu"))

    @property
    def measured(self) -> float | None:
        m = _num(self.attrs.get("measured_tokens_per_s_per_gpu"))
        if m is None and self.state == "COMPLETE" and self.attrs.get("source") not in (None, "analytical"):
            return self.value
        return m

    @property
    def peak_gib(self) -> float | None:
        return _num(self.attrs.get("memory_peak_gib"))

    @property
    def outcome(self) -> str:
        if self.state == "PRUNED":
            return f"pruned: {self.attrs.get('prune_reason') or 'no reason recorded'}"
        if self.state == "FAIL":
            return f"failed: {self.attrs.get('failure_reason') or 'no reason recorded'}"
        if self.state == "COMPLETE":
            return f"complete ({self.attrs.get('source') or 'unknown source'})"
        return self.state.lower()

    @property
    def prune_category(self) -> str:
        reason = str(self.attrs.get("prune_reason") or "unknown")
        return re.split(r"[:(]", reason, maxsplit=1)[0].strip() or "unknown"


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


@dataclass
class StudyRecord:
    """A primus-optuna study read back from storage."""

    study_name: str
    storage_url: str
    spec: StudySpec
    space: Space
    directions: list[str]
    user_attrs: dict[str, Any]
    trials: list[TrialRow]
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    artifact_store: Any = None
    """the file artifact store of the study (planner transcripts), when found"""

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1

    @property
    def complete(self) -> list[TrialRow]:
        return [t for t in self.trials if t.state == "COMPLETE" and t.values]

    @property
    def baseline_config(self) -> TrainingConfig:
        return self.space.canonical(self.space.baseline)

    @property
    def baseline(self) -> TrialRow | None:
        """The first trial of the baseline configuration (completed one preferred)."""
        rows = [t for t in self.trials if t.config == self.baseline_config]
        done = [t for t in rows if t.state == "COMPLETE"]
        return (done or rows or [None])[0]

    @property
    def best(self) -> TrialRow | None:
        """Highest tokens/s/GPU among completed trials (for a Pareto study: the front's fastest point)."""
        done = self.complete
        return max(done, key=lambda t: (t.values[0], -t.number)) if done else None

    def pareto(self) -> list[TrialRow]:
        """Non-dominated completed trials (max tokens/s, min peak memory), fastest first."""
        if not self.multi_objective:
            return []
        signs = [1 if d == "MAXIMIZE" else -1 for d in self.directions]
        pts = [(t, [s * v for s, v in zip(signs, t.values, strict=False)]) for t in self.complete]
        front = [
            t
            for t, p in pts
            if not any(
                all(a >= b for a, b in zip(q, p, strict=False))
                and any(a > b for a, b in zip(q, p, strict=False))
                for _, q in pts
            )
        ]
        return sorted(front, key=lambda t: -t.values[0])

    @property
    def measure_steps(self) -> int:
        opts = self.spec.runner.options
        for key in ("train_iters", "steps", "iterations"):
            if isinstance(opts.get(key), int) and opts[key] > 0:
                return int(opts[key])
        return DEFAULT_MEASURE_STEPS


def load_record(
    storage: Any, study_name: str | None = None, artifact_dir: str | Path | None = None
) -> StudyRecord:
    """Read a study from a storage URL (any Optuna URL, a ``.db``/``.log`` path, ``journal:PATH``) or storage
    object; ``study_name`` may be omitted when the storage holds exactly one study. ``artifact_dir`` defaults
    to ``<storage stem>-artifacts`` (where ``run`` keeps logs and planner transcripts)."""
    import optuna

    from ..storage import make_storage, normalize_url

    url = ""
    if isinstance(storage, str):
        url = normalize_url(storage)
        storage = make_storage(url, heartbeat_interval=None)
    if study_name is None:
        names = optuna.get_all_study_names(storage)
        if len(names) != 1:
            from ...errors import SpecError

            raise SpecError(
                f"--study-name is required: the storage holds {len(names)} studies"
                + (f" ({', '.join(names)})" if names else "")
            )
        study_name = names[0]
    study = optuna.load_study(study_name=study_name, storage=storage)
    return record_of(study, storage_url=url, artifact_dir=artifact_dir)


def record_of(study: Any, storage_url: str = "", artifact_dir: str | Path | None = None) -> StudyRecord:
    """A :class:`StudyRecord` of a loaded (or live) Optuna study."""
    from optuna.artifacts import FileSystemArtifactStore

    from ..storage import sibling_dir

    if artifact_dir is None and storage_url:
        artifact_dir = sibling_dir(storage_url, study.study_name, "-artifacts")
    store = (
        FileSystemArtifactStore(str(artifact_dir)) if artifact_dir and Path(artifact_dir).is_dir() else None
    )
    spec = study_spec(study)
    space = Space(spec)
    rows = []
    for t in study.get_trials(deepcopy=False):
        try:
            config = space.canonical(trial_config(t, spec)) if t.params else None
        except Exception:  # a trial with hand-made params: show it without a config
            config = None
        rows.append(
            TrialRow(t.number, t.state.name, config, list(t.values) if t.values else None, t.user_attrs)
        )
    try:
        from optuna.artifacts import get_all_artifact_meta

        artifacts = [
            {"trial": None, "filename": m.filename, "artifact_id": m.artifact_id, "mimetype": m.mimetype}
            for m in sorted(get_all_artifact_meta(study), key=lambda m: m.filename)
        ]
        for t in study.get_trials(deepcopy=False):
            artifacts += [
                {
                    "trial": t.number,
                    "filename": m.filename,
                    "artifact_id": m.artifact_id,
                    "mimetype": m.mimetype,
                }
                for m in sorted(get_all_artifact_meta(t, storage=study._storage), key=lambda m: m.filename)
            ]
    except Exception:  # artifact metadata is optional
        artifacts = []
    return StudyRecord(
        study_name=study.study_name,
        storage_url=storage_url,
        spec=spec,
        space=space,
        directions=[d.name for d in study.directions],
        user_attrs=dict(study.user_attrs),
        trials=rows,
        artifacts=artifacts,
        artifact_store=store,
    )


# --- derived figures ----------------------------------------------------------------------------------------


def step_time_s(rec: StudyRecord, t: TrialRow) -> float | None:
    """Estimated seconds per optimizer step: the ``step_time_s`` attr, else from the tokens/s estimate."""
    st = _num(t.attr("step_time_s"))
    if st:
        return st
    est = t.estimate
    if est:
        return rec.spec.tokens_per_step / (est * rec.spec.world)
    return None


def memory_pruned(rec: StudyRecord) -> list[TrialRow]:
    """Trials the memory filter removed."""
    return [
        t
        for t in rec.trials
        if t.state == "PRUNED" and ("memory" in t.prune_category.lower() or "fit" in t.prune_category.lower())
    ]


def gpu_hours_saved(rec: StudyRecord) -> tuple[float, int]:
    """(GPU-hours not spent on memory-pruned trials, how many had a step-time estimate)."""
    total, counted = 0.0, 0
    for t in memory_pruned(rec):
        st = step_time_s(rec, t)
        if st:
            total += st * rec.measure_steps * rec.spec.world / 3600.0
            counted += 1
    return total, counted


def estimate_errors(rec: StudyRecord) -> list[tuple[TrialRow, float, float, float]]:
    """(trial, estimate, measurement, error) for completed trials measured by a non-analytical runner.

    error = ``estimate_error`` attr, else (estimate − measured) / measured; positive = optimistic model."""
    out = []
    for t in rec.complete:
        if t.attr("source") in (None, "analytical"):
            continue
        est, meas = t.estimate, t.measured
        if est is None or not meas:
            continue
        err = _num(t.attr("estimate_error"))
        out.append((t, est, meas, err if err is not None else (est - meas) / meas))
    return out


def gain(new: float | None, old: float | None) -> float | None:
    return None if not new or not old else new / old - 1.0


def sensitivity(rec: StudyRecord, config: TrainingConfig) -> tuple[list[dict[str, Any]], str]:
    """Each axis one candidate step either side of ``config``, estimated analytically.

    Returns (rows, verdict); rows are empty and the verdict says why when the physics is unavailable."""
    try:
        from ...physics.memory import estimate_memory
        from ...physics.throughput import estimate_throughput
    except ImportError as exc:
        return [], f"not available: the analytical models cannot be imported ({exc})"
    spec, space = rec.spec, rec.space
    base_est = estimate_throughput(spec, config).tokens_per_s_per_gpu
    rows: list[dict[str, Any]] = []
    for axis in AXES:
        cands = space.candidates[axis]
        cur = getattr(config, axis)
        if cur not in cands or len(cands) < 2:
            continue
        i = cands.index(cur)
        for j, direction in ((i - 1, "-1"), (i + 1, "+1")):
            if not 0 <= j < len(cands):
                continue
            raw = config.replace(**{axis: cands[j]})
            row: dict[str, Any] = {"axis": axis, "step": direction, "value": cands[j]}
            reasons = space.check(raw)
            if reasons:
                row.update(status="illegal", note=reasons[0])
            else:
                c = space.canonical(raw)
                mem = estimate_memory(spec, c)
                tput = estimate_throughput(spec, c).tokens_per_s_per_gpu
                row.update(
                    status="fits" if mem.fits else "does not fit",
                    tokens=tput,
                    delta=tput / base_est - 1.0,
                    peak_gib=mem.peak_gib,
                    note="" if c == raw else f"canonical form {c.key()}",
                )
            rows.append(row)
    feasible = [r for r in rows if r.get("status") == "fits"]
    if not feasible:
        return rows, "no legal, fitting neighbour: the best configuration is isolated"
    near = [r for r in feasible if r["delta"] >= -FLAT_LOSS]
    sharp = [r for r in feasible if r["delta"] <= -SHARP_LOSS]
    if not near:
        verdict = (
            f"sharp peak: every legal neighbour loses more than {FLAT_LOSS:.0%} "
            f"({len(sharp)} of {len(feasible)} lose {SHARP_LOSS:.0%} or more)"
        )
    elif len(near) * 2 >= len(feasible):
        verdict = f"broad basin: {len(near)} of {len(feasible)} legal neighbours are within {FLAT_LOSS:.0%} of the best"
    else:
        verdict = f"moderate: {len(near)} of {len(feasible)} legal neighbours are within {FLAT_LOSS:.0%}"
    return rows, verdict


TRANSCRIPT_NAME = re.compile(r"planner-call-.*\.json$")


def planner_rounds(rec: StudyRecord) -> list[dict[str, Any]]:
    """The planner's calls, oldest first: the JSON transcripts the sampler stores as study artifacts
    (``planner-call-<trial>.json``: accepted, rejected with reason, tokens, cost_usd, error), read from the
    file artifact store. Each gets ``artifact`` (its file name); empty when the store is not found."""
    import json

    if rec.artifact_store is None:
        return []
    rounds = []
    for meta in rec.artifacts:
        if meta["trial"] is not None or not TRANSCRIPT_NAME.search(meta["filename"]):
            continue
        try:
            with rec.artifact_store.open_reader(meta["artifact_id"]) as f:
                doc = json.loads(f.read())
        except Exception:  # a missing or unreadable transcript: list the others
            continue
        if isinstance(doc, dict):
            rounds.append({**doc, "artifact": meta["filename"]})
    return sorted(rounds, key=lambda r: (r.get("time") or "", r.get("trial_number") or 0))


FALLBACK_NOTE = re.compile(r"^planner unavailable \((?P<why>.*?)(; (?P<n>\d+) rejected)?\); ")


def fallback_reason(rec: StudyRecord, t: TrialRow) -> str:
    """Why a fallback trial happened: the note the sampler puts before its rationale, else no LLM."""
    m = FALLBACK_NOTE.match(str(t.attr("rationale") or ""))
    if m:
        n = int(m.group("n") or 0)
        return m.group("why") + (f" ({n} candidates rejected)" if n else "")
    return "no LLM configured" if not rec.spec.llm.model else "not recorded"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "not installed"
    return out


def reproduce_command(rec: StudyRecord, study_file: str = "study.yaml") -> str:
    s = rec.spec.search
    storage = rec.storage_url or f"sqlite:///{rec.study_name}.db"
    cmd = (
        f"primus-optuna run {study_file} --storage {storage} --study-name {rec.study_name} "
        f"--n-trials {s.n_trials} --seed {s.seed} --runner {rec.spec.runner.kind}"
    )
    return cmd + (f" --llm {rec.spec.llm.model}" if rec.spec.llm.model else " --no-llm")


def default_report_dir(study_name: str) -> Path:
    """Where ``report`` writes when ``--out`` is not given (``run`` prints this path)."""
    return Path(f"{study_name}-report")


# --- number formatting (the test compares the report with storage through these) ----------------------------


def fmt_tok(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def fmt_gib(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


# --- a tiny document model rendered to Markdown and HTML ----------------------------------------------------


@dataclass
class Doc:
    blocks: list[tuple[str, Any]] = field(default_factory=list)
    images: dict[str, bytes] = field(default_factory=dict)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(("ul", items))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def table(self, headers: list[str], rows: list[list[Any]]) -> None:
        self.blocks.append(("table", (headers, [[str(c) for c in r] for r in rows])))

    def image(self, name: str, png: bytes | None, alt: str) -> None:
        if png:
            self.images[name] = png
            self.blocks.append(("img", (name, alt)))

    def markdown(self) -> str:
        out: list[str] = []
        for kind, data in self.blocks:
            if kind == "h":
                out.append("#" * data[0] + " " + data[1])
            elif kind == "p":
                out.append(data)
            elif kind == "ul":
                out.append("\n".join(f"- {i}" for i in data))
            elif kind == "code":
                out.append(f"```\n{data}\n```")
            elif kind == "table":
                headers, rows = data
                cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
                lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
                out.append("\n".join(lines))
            elif kind == "img":
                out.append(f"![{data[1]}](plots/{data[0]}.png)")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        out = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        ]
        for kind, data in self.blocks:
            if kind == "h":
                out.append(f"<h{data[0]}>{e(data[1])}</h{data[0]}>")
            elif kind == "p":
                out.append(f"<p>{_inline(data)}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in data) + "</ul>")
            elif kind == "code":
                out.append(f"<pre>{e(data)}</pre>")
            elif kind == "table":
                headers, rows = data
                out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>")
                out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows]
                out.append("</table>")
            elif kind == "img":
                b64 = base64.b64encode(self.images[data[0]]).decode()
                out.append(f"<figure><img alt='{e(data[1])}' src='data:image/png;base64,{b64}'></figure>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .5em;"
    "text-align:left;vertical-align:top}th{background:#f3f3f3}pre,code{background:#f6f6f6}pre{padding:.5em;"
    "overflow-x:auto}img{max-width:100%}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"
)


def _inline(text: str) -> str:
    """HTML-escape, then render Markdown ``code`` and **bold** spans."""
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)


# --- plots --------------------------------------------------------------------------------------------------


def _figure(width: float = 7.0, height: float = 4.0) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=100)


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def plot_history(rec: StudyRecord) -> bytes | None:
    done = sorted(rec.complete, key=lambda t: t.number)
    if not done:
        return None
    fig, ax = _figure()
    colours = {"sweep": "tab:blue", "planner": "tab:orange", "fallback": "tab:green"}
    for phase in sorted({t.phase for t in done}):
        pts = [t for t in done if t.phase == phase]
        ax.scatter(
            [t.number for t in pts], [t.value for t in pts], label=phase, c=colours.get(phase, "tab:gray")
        )
    best, xs, ys = float("-inf"), [], []
    for t in done:
        best = max(best, t.value or 0.0)
        xs.append(t.number)
        ys.append(best)
    ax.step(xs, ys, where="post", color="k", lw=1, label="best so far")
    pruned = [t for t in rec.trials if t.state in ("PRUNED", "FAIL")]
    if pruned:
        ax.scatter(
            [t.number for t in pruned], [0] * len(pruned), marker="x", c="tab:red", label="pruned/failed"
        )
    ax.set(xlabel="trial", ylabel="tokens/s/GPU", title="Optimisation history")
    ax.legend(fontsize=8)
    return _png(fig)


def plot_axis_effects(rec: StudyRecord) -> bytes | None:
    done = [t for t in rec.complete if t.config]
    axes = [a for a in AXES if len({getattr(t.config, a) for t in done}) > 1]
    if not axes:
        return None
    cols = min(3, len(axes))
    nrows = (len(axes) + cols - 1) // cols
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(nrows, cols, figsize=(3.4 * cols, 2.6 * nrows), dpi=100, squeeze=False)
    for k, axis in enumerate(axes):
        ax = grid[k // cols][k % cols]
        values = [v for v in rec.space.candidates[axis] if any(getattr(t.config, axis) == v for t in done)]
        for i, v in enumerate(values):
            ys = [t.value for t in done if getattr(t.config, axis) == v]
            ax.scatter([i] * len(ys), ys, s=14, alpha=0.7, c="tab:blue")
            ax.plot([i - 0.25, i + 0.25], [max(ys)] * 2, color="k", lw=1)
        ax.set_xticks(range(len(values)), [str(v) for v in values], fontsize=8)
        ax.set_title(axis, fontsize=9)
    for k in range(len(axes), nrows * cols):
        grid[k // cols][k % cols].axis("off")
    fig.suptitle("Per-axis effects (tokens/s/GPU of completed trials; bar = best)", fontsize=10)
    return _png(fig)


def plot_estimate_vs_measured(pairs: list[tuple[TrialRow, float, float, float]]) -> bytes | None:
    if not pairs:
        return None
    fig, ax = _figure(5.0, 5.0)
    est = [p[1] for p in pairs]
    meas = [p[2] for p in pairs]
    ax.scatter(meas, est)
    lo, hi = min(est + meas) * 0.95, max(est + meas) * 1.05
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="estimate = measured")
    for t, e, m, _ in pairs:
        ax.annotate(str(t.number), (m, e), fontsize=7)
    ax.set(xlabel="measured tokens/s/GPU", ylabel="estimated tokens/s/GPU", title="Estimate vs measured")
    ax.legend(fontsize=8)
    return _png(fig)


def plot_pareto(rec: StudyRecord, front: list[TrialRow]) -> bytes | None:
    if not front:
        return None
    fig, ax = _figure()
    done = rec.complete
    ax.scatter(
        [t.values[1] for t in done], [t.values[0] for t in done], c="tab:gray", alpha=0.5, label="trials"
    )
    pts = sorted(front, key=lambda t: t.values[1])
    ax.plot([t.values[1] for t in pts], [t.values[0] for t in pts], "o-", c="tab:red", label="Pareto front")
    ax.set(xlabel="peak memory (GiB)", ylabel="tokens/s/GPU", title="Pareto front")
    ax.legend(fontsize=8)
    return _png(fig)


# --- sections -----------------------------------------------------------------------------------------------


def _cfg(c: TrainingConfig | None) -> str:
    return "-" if c is None else f"`{c.key()}`"


def _setup(doc: Doc, rec: StudyRecord) -> None:
    spec, s = rec.spec, rec.spec.search
    m, g = spec.model, spec.cluster.gpu
    doc.h(2, "1. Setup")
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
            f"**Objective(s)**: {', '.join(s.objectives)}; memory safety margin {s.memory_safety_margin:.0%}",
            f"**Legal space**: {legal} canonical configurations",
            f"**Sampler**: n_trials {s.n_trials}, seed {s.seed}, sweep order "
            f"{', '.join(s.sweep_order) if s.sweep_order else 'default (highest expected impact first)'}, "
            f"proposals per round {spec.llm.proposals_per_round}",
            f"**LLM**: {spec.llm.model or 'none (model-guided fallback only)'}"
            + (f" (max {spec.llm.max_calls} calls" if spec.llm.model else "")
            + (
                f", max ${spec.llm.max_cost_usd}"
                if spec.llm.model and spec.llm.max_cost_usd is not None
                else ""
            )
            + (")" if spec.llm.model else ""),
            f"**Runner**: {spec.runner.kind}",
            f"**Storage**: {rec.storage_url or '(in-memory or unnamed)'}, study `{rec.study_name}`",
        ]
    )
    doc.table(["axis", "legal values"], [[a, ", ".join(map(str, v))] for a, v in _legal_values(rec).items()])
    doc.p("Package versions (report environment): " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    doc.p("Reproduce (the study file is written next to this report as `study.yaml`):")
    doc.code(reproduce_command(rec))


def _legal_values(rec: StudyRecord) -> dict[str, list[Any]]:
    try:
        return rec.space.legal_values()
    except Exception:
        return rec.space.candidates


def _sweep(doc: Doc, rec: StudyRecord) -> None:
    doc.h(2, "2. Sweep phase")
    rows = [t for t in rec.trials if t.phase == "sweep" and t.config]
    if not rows:
        doc.p("No sweep trial has run yet.")
        return
    base = rec.baseline_config
    groups: dict[str, list[TrialRow]] = {}
    order = list(AXES)
    for t in rows:
        diff = [a for a in AXES if getattr(t.config, a) != getattr(base, a)]
        axis = str(t.attr("sweep_axis") or (diff[0] if len(diff) == 1 else "+".join(diff) or "baseline"))
        groups.setdefault(axis, []).append(t)
    b = rec.baseline
    doc.p(
        f"Baseline {_cfg(base)}: {b.outcome if b else 'not run yet'}"
        + (f", estimate {fmt_tok(b.estimate)} tokens/s/GPU" if b else "")
    )
    for axis in sorted(groups, key=lambda a: (a != "baseline", order.index(a) if a in order else 99)):
        if axis == "baseline":
            continue
        ts = groups[axis]
        doc.h(3, f"Axis {axis}")
        table = []
        for t in sorted(ts, key=lambda t: t.number):
            moved = [a for a in AXES if getattr(t.config, a) != getattr(base, a)] or axis.split("+")
            value = ", ".join(f"{a}={getattr(t.config, a)}" for a in moved)
            table.append(
                [value, t.number, fmt_tok(t.estimate), fmt_tok(t.measured), fmt_gib(t.peak_gib), t.outcome]
            )
        doc.table(["value", "trial", "estimate", "measured", "peak GiB", "outcome"], table)
        done = [t for t in ts if t.state == "COMPLETE" and t.value]
        if done and b and b.value:
            top = max(done, key=lambda t: t.value or 0.0)
            g = gain(top.value, b.value)
            doc.p(
                f"Best other value on this axis: trial {top.number}, {fmt_pct(g)} vs the baseline"
                + ("." if g is not None and g > 0 else " (the baseline's value stays best).")
            )


def _planner(doc: Doc, rec: StudyRecord) -> None:
    doc.h(2, "3. Planner phase")
    a = rec.user_attrs
    doc.p(
        f"LLM usage: {a.get('llm_calls', 0)} calls, {a.get('llm_tokens', 0)} tokens, "
        f"${float(a.get('llm_cost_usd', 0.0) or 0.0):.4f}."
    )
    rounds = planner_rounds(rec)
    if not rounds:
        doc.p(
            "No planner transcript found"
            + (" (no LLM configured)." if not rec.spec.llm.model else " in the artifact store.")
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
    fallbacks = Counter(fallback_reason(rec, t) for t in rows if t.phase == "fallback")
    if fallbacks:
        doc.p("Fallback trials by reason: " + ", ".join(f"{k}: {v}" for k, v in fallbacks.items()) + ".")


def _cand(c: Any) -> str:
    if isinstance(c, dict):
        return ", ".join(f"{k}={v}" for k, v in c.items())
    return str(c or "-")


def _memory(doc: Doc, rec: StudyRecord) -> None:
    doc.h(2, "4. Memory filter")
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
        ["trial", "config", "peak GiB", "usable GiB", "stage", "reason", "est. step s"],
        [
            [
                t.number,
                _cfg(t.config),
                fmt_gib(t.peak_gib),
                fmt_gib(_num(t.attr("memory_usable_gib"))),
                t.attr("memory_peak_stage") if t.attr("memory_peak_stage") is not None else "-",
                t.attr("prune_reason"),
                "-" if step_time_s(rec, t) is None else f"{step_time_s(rec, t):.3f}",
            ]
            for t in mem
        ],
    )


def _estimates(doc: Doc, rec: StudyRecord) -> None:
    doc.h(2, "5. Estimates vs measurements")
    pairs = estimate_errors(rec)
    if not pairs:
        doc.p(
            "No trial was measured by a real runner: completed trials used the analytical runner, whose "
            "measurement is the estimate itself, so there is nothing to compare yet."
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


def _result(doc: Doc, rec: StudyRecord) -> None:
    doc.h(2, "6. Result")
    best = rec.best
    if best is None:
        doc.p("No completed trial yet: no best configuration.")
        return
    b = rec.baseline
    doc.p(f"**Best configuration**: trial {best.number}, {_cfg(best.config)}")
    doc.p(
        f"tokens/s/GPU {fmt_tok(best.value)} ({best.attr('source') or 'unknown source'}); estimate "
        f"{fmt_tok(best.estimate)}; peak memory {fmt_gib(best.peak_gib)} GiB."
    )
    if b is not None and b.state == "COMPLETE":
        doc.p(
            f"Gain over the baseline (trial {b.number}, {fmt_tok(b.value)} tokens/s/GPU): "
            f"objective {fmt_pct(gain(best.value, b.value))}, estimated "
            f"{fmt_pct(gain(best.estimate, b.estimate))}."
        )
    elif b is not None:
        doc.p(
            f"The baseline (trial {b.number}) has no completed run ({b.outcome}): no measured gain; estimated "
            f"gain over its estimate {fmt_tok(b.estimate)}: {fmt_pct(gain(best.estimate, b.estimate))}."
        )
    else:
        doc.p("The baseline has not been tried yet: no gain to report.")
    if best.config:
        doc.p(
            f"Export it: `primus-optuna export --storage {rec.storage_url or 'URL'} --study-name {rec.study_name} "
            "--format primus` (or megatron, env, json)."
        )
    if rec.multi_objective:
        front = rec.pareto()
        doc.h(3, "Pareto front")
        doc.table(
            ["trial", "config", "tokens/s/GPU", "peak GiB"],
            [[t.number, _cfg(t.config), fmt_tok(t.values[0]), fmt_gib(t.values[1])] for t in front],
        )
        doc.image("pareto_front", plot_pareto(rec, front), "Pareto front")
    doc.h(3, "Sensitivity (each axis ±1 candidate step from the best, analytical)")
    if best.config is None:
        doc.p("The best trial has no configuration.")
        return
    rows, verdict = sensitivity(rec, best.config)
    doc.p(f"Verdict: **{verdict}**.")
    if rows:
        doc.table(
            ["axis", "step", "value", "status", "estimate", "vs best", "peak GiB", "note"],
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


def _plots(doc: Doc, rec: StudyRecord) -> None:
    doc.h(2, "7. Plots")
    hist, effects = plot_history(rec), plot_axis_effects(rec)
    if not hist and not effects:
        doc.p("No completed trial to plot yet.")
    doc.image("history", hist, "optimisation history")
    doc.image("axis_effects", effects, "per-axis effects")


def _trials(doc: Doc, rec: StudyRecord) -> None:
    doc.h(2, "8. All trials")
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
                fmt_gib(t.peak_gib),
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


def render(rec: StudyRecord) -> Doc:
    """The whole report as a :class:`Doc`."""
    doc = Doc()
    state = f"{len(rec.trials)} trials ({', '.join(f'{k} {v}' for k, v in Counter(t.state for t in rec.trials).items()) or 'none'})"
    doc.h(1, f"primus-optuna report: {rec.study_name}")
    doc.p(f"{state}; target {rec.spec.search.n_trials}.")
    for section in (_setup, _sweep, _planner, _memory, _estimates, _result, _plots, _trials):
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
    out = Path(out_dir) if out_dir is not None else default_report_dir(rec.study_name)
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
