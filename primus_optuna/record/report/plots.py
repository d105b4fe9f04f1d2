"""The report's plots as PNG bytes (matplotlib, Agg backend, imported on first use): optimisation history,
per-axis effects, estimate vs measured, Pareto front, a capacity plan. Each returns ``None`` when there is nothing to plot.
May import :mod:`.record`, the spec (axis names) and the capacity plan's types; not :mod:`.doc` or :mod:`.sections`.
"""

from __future__ import annotations

import io
from typing import Any

from ...physics.capacity import CapacityRow, CapacityTable
from ...spec.study import AXES
from .record import StudyRecord, TrialRow


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
    if pruned:  # no value: ticks along the bottom edge, not points at 0 tokens/s/GPU
        ax.plot(
            [t.number for t in pruned],
            [0.0] * len(pruned),
            "|",
            c="tab:red",
            ms=10,
            transform=ax.get_xaxis_transform(),
            label="pruned/failed (no value)",
        )
    ax.set(xlabel="trial", ylabel="tokens/s/GPU", title="Optimisation history")
    ax.legend(fontsize=8)
    return _png(fig)


def plot_axis_effects(rec: StudyRecord) -> bytes | None:
    fig = axis_effects_figure(rec)
    return None if fig is None else _png(fig)


def _set_value_ticks(ax: Any, labels: list[str], width_in: float) -> None:
    """Category tick labels that do not run together: horizontal when they fit the subplot's width (about
    0.075 in per character at 8 pt), else vertical (one line of text per tick)."""
    ax.set_xticks(range(len(labels)))
    chars = sum(len(x) + 2 for x in labels)
    if chars * 0.075 <= width_in * 0.85:
        ax.set_xticklabels(labels, fontsize=8)
    else:
        ax.set_xticklabels(labels, fontsize=7, rotation=90)


def axis_effects_figure(rec: StudyRecord) -> Any:
    """The per-axis effects figure (``None`` when no axis varies among the completed trials)."""
    done = [t for t in rec.complete if t.config]
    axes = [a for a in AXES if len({getattr(t.config, a) for t in done}) > 1]
    if not axes:
        return None
    cols = min(3, len(axes))
    nrows = (len(axes) + cols - 1) // cols
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 3.4
    fig, grid = plt.subplots(nrows, cols, figsize=(width * cols, 3.0 * nrows), dpi=100, squeeze=False)
    for k, axis in enumerate(axes):
        ax = grid[k // cols][k % cols]
        values = [v for v in rec.space.candidates[axis] if any(getattr(t.config, axis) == v for t in done)]
        for i, v in enumerate(values):
            ys = [t.value for t in done if getattr(t.config, axis) == v]
            ax.scatter([i] * len(ys), ys, s=14, alpha=0.7, c="tab:blue")
            ax.plot([i - 0.25, i + 0.25], [max(ys)] * 2, color="k", lw=1)
        _set_value_ticks(ax, [str(v) for v in values], width)
        ax.set_title(axis, fontsize=9)
    for k in range(len(axes), nrows * cols):
        grid[k // cols][k % cols].axis("off")
    fig.suptitle("Per-axis effects (tokens/s/GPU of completed trials; bar = best)", fontsize=10)
    fig.tight_layout()
    return fig


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


def plot_capacity(table: CapacityTable, fmt: str = "png") -> bytes:
    """A capacity plan (:func:`~primus_optuna.physics.capacity.capacity_table`) in three panels: tokens/s/GPU and
    days to train against the GPU count per GPU type, and cost (GPU-hours without prices) against days with the
    Pareto front. Without a token target the days and cost are per 1T tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15.0, 4.5), dpi=100)
    target = table.tokens or 1e12
    per = "" if table.tokens else " per 1T tokens"
    by_cost = table.answers.cheapest_by == "cost"

    def when(r: CapacityRow) -> float:
        return target / r.tokens_per_day

    def cost(r: CapacityRow) -> float:
        hours = target / r.tokens_per_s_per_gpu / 3600
        return hours * table.prices[r.gpu] if by_cost else hours

    for t in table.types:
        rows = [r for r in table.rows(t.name) if r.fits]
        if not rows:
            continue
        xs = [r.gpus for r in rows]
        ax1.plot(xs, [r.tokens_per_s_per_gpu for r in rows], "o-", label=t.name)
        ax2.plot(xs, [when(r) for r in rows], "o-", label=t.name)
        ax3.scatter([when(r) for r in rows], [cost(r) for r in rows], label=t.name)
        for r in rows:
            ax3.annotate(str(r.gpus), (when(r), cost(r)), fontsize=7)
    front = sorted(table.pareto, key=when)
    if front:
        ax3.plot([when(r) for r in front], [cost(r) for r in front], "k--", lw=1, label="Pareto front")
    if table.days is not None:
        ax2.axhline(table.days, color="tab:red", lw=1, ls=":", label=f"{table.days:g} days")
        ax3.axvline(table.days, color="tab:red", lw=1, ls=":", label=f"{table.days:g} days")
    batch = "fixed global batch" if table.batch == "fixed" else "global batch per GPU"
    ax1.set(xlabel="GPUs", ylabel="tokens/s/GPU (estimated)", title=f"Throughput per GPU ({batch})")
    ax2.set(xlabel="GPUs", ylabel="days", title=f"Days to train{per}", yscale="log")
    ylabel = "cost (USD)" if by_cost else "GPU-hours"
    ax3.set(xlabel="days", ylabel=ylabel, title=f"{ylabel.split(' ')[0].capitalize()} vs time{per}")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(table.sizes, [str(n) for n in table.sizes], fontsize=8)
        ax.minorticks_off()
    ax3.set_xscale("log")
    for ax in (ax1, ax2, ax3):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not any(r.fits for r in table.all_rows if r.gpus in table.sizes):
        ax1.text(0.5, 0.5, "nothing fits at these sizes", ha="center", transform=ax1.transAxes)
    fig.suptitle(f"Capacity plan: {table.study}")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format=fmt)
    plt.close(fig)
    return buf.getvalue()
