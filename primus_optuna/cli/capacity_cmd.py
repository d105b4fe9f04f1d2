"""``capacity``: the best configuration at every cluster size and GPU type, with the time and cost to train a
token target, and the answers (fewest GPUs, cheapest, fastest)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import click

from ..errors import SpecError
from ..physics.capacity import (
    BATCH_MODES,
    CapacityRow,
    CapacityTable,
    band_text,
    capacity_table,
    check_prices,
    check_sizes,
    resolve_gpu_types,
    si_text,
)
from ..spec.hardware import gpu_key
from ..spec.study import StudySpec, token_count
from ._common import (
    check_output_path,
    emit_json,
    json_option,
    skip_exit_collection,
    study_argument,
    user_errors,
)

PLOT_FORMATS = ("png", "svg", "pdf")


def parse_tokens(text: str, option: str = "--tokens") -> float:
    """``1T``, ``300B``, ``1.5e12``, ``2_000M`` as a token count (:func:`~primus_optuna.spec.study.token_count`)."""
    try:
        return token_count(text)
    except ValueError as exc:
        raise SpecError(f"{option}: {exc}") from None


def parse_sizes(text: str, option: str = "--gpus") -> list[int]:
    """``8,16,32`` or a progression ``8,16,32,...,1024`` (doubling; ``8,16,24,...,64`` adds 8)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    hint = "give GPU counts separated by commas (e.g. 8,16,32 or 8,16,32,...,1024)"
    if not parts or parts.count("...") > 1:
        raise SpecError(f"{option}: {text!r}: {hint}")
    if "..." not in parts:
        return [_count(p, option, hint) for p in parts]
    i = parts.index("...")
    head, tail = (
        [_count(p, option, hint) for p in parts[:i]],
        [_count(p, option, hint) for p in parts[i + 1 :]],
    )
    if len(head) < 2 or len(tail) != 1:
        raise SpecError(
            f"{option}: {text!r}: a progression needs two or more counts before '...' and the last after"
        )
    steps, ratios = {b - a for a, b in pairwise(head)}, {b / a for a, b in pairwise(head)}
    arithmetic, geometric = len(steps) == 1 and head[1] > head[0], len(ratios) == 1 and head[1] % head[0] == 0
    if arithmetic and geometric:
        raise SpecError(
            f"{option}: {text!r} is ambiguous (doubling or adding {head[1] - head[0]}); write three counts before "
            f"'...' (e.g. {head[0]},{head[1]},{head[1] * 2},...,{tail[0]} or {head[0]},{head[1]},"
            f"{2 * head[1] - head[0]},...,{tail[0]})"
        )
    out = list(head)
    while out[-1] < tail[0] and (arithmetic or geometric) and len(out) < 100:
        out.append(out[-1] + head[1] - head[0] if arithmetic else out[-1] * head[1] // head[0])
    if not (arithmetic or geometric) or out[-1] != tail[0]:
        raise SpecError(
            f"{option}: {text!r}: the counts before '...' must double (or grow by a fixed step) and reach "
            f"{tail[0]} exactly"
        )
    return out


def _count(text: str, option: str, hint: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise SpecError(f"{option}: {text!r} is not a GPU count; {hint}")
    return int(text)


def parse_prices(text: str, gpus: list[str], option: str = "--price") -> dict[str, float]:
    """``h100=2.5,mi355x=3.1`` (per GPU-hour), or one number for every GPU type in ``gpus``."""
    hint = "write GPU=PRICE per GPU-hour separated by commas (e.g. h100=2.5,mi355x=3.1) or one price for all"
    try:
        if "=" not in text:
            return {g: float(text) for g in gpus}
        out: dict[str, float] = {}
        for part in text.split(","):
            name, sep, value = part.partition("=")
            if not sep or not name.strip():
                raise ValueError
            out[name.strip()] = float(value)
        return out
    except ValueError:
        raise SpecError(f"{option}: {text!r} is not a price list; {hint}") from None


def _money(x: float | None) -> str:
    return "-" if x is None else "$" + si_text(x)


def _columns(t: CapacityTable) -> list[tuple[str, int, Callable[[CapacityRow], str]]]:
    """(header, width, cell) of each column this table shows: the global batch under ``per-gpu``, days and
    GPU-hours with a token target, cost with prices, the band when a row has one."""
    cols: list[tuple[str, int, Callable[[CapacityRow], str]]] = [("GPUs", 6, lambda r: str(r.gpus))]
    if t.batch == "per-gpu":
        cols.append(("GBS", 6, lambda r: str(r.global_batch_size)))
    cols += [
        ("tok/s/GPU", 9, lambda r: f"{r.tokens_per_s_per_gpu:,.0f}"),
        ("cluster/s", 9, lambda r: si_text(r.cluster_tokens_per_s)),
        ("tok/day", 8, lambda r: si_text(r.tokens_per_day)),
    ]
    if t.tokens is not None:
        cols.append(("days", 8, lambda r: f"{r.days:,.1f}" + ("*" if r.meets is False else "")))
        cols.append(("GPU-hours", 9, lambda r: si_text(r.gpu_hours or 0.0)))
        if t.prices:
            cols.append(("cost", 8, lambda r: _money(r.cost)))
    cols.append(("eff.", 5, lambda r: f"{r.efficiency or 0:.0%}"))
    if any(r.band is not None for r in t.all_rows):
        cols.append(("band", 12, lambda r: band_text(r.band)))
    return cols


def _row_text(cols: list[tuple[str, int, Callable[[CapacityRow], str]]], r: CapacityRow) -> str:
    n = 2 if cols[1][0] == "GBS" else 1
    lead = "  ".join(f"{cell(r):>{w}}" for _, w, cell in cols[:n])
    if not r.fits:
        return f"  {lead}  {r.why_not}"
    line = "  ".join(f"{cell(r):>{w}}" for _, w, cell in cols)
    return f"  {line}  {r.best.config if r.best else ''}" + (f"\n          ^ {r.note}" if r.note else "")


def _answer_text(label: str, r: CapacityRow | None, none: str) -> str:
    if r is None:
        return f"  {label:<12} {none}"
    days = f"{r.days:,.1f} days, " if r.days is not None else ""
    cost = f"{_money(r.cost)}, " if r.cost is not None else ""
    hours = f"{si_text(r.gpu_hours)} GPU-hours, " if r.gpu_hours is not None else ""
    return (
        f"  {label:<12} {r.gpus} {r.gpu} ({days}{cost}{hours}{si_text(r.cluster_tokens_per_s)} tokens/s): "
        f"{r.best.config if r.best else ''}"
    )


def render(t: CapacityTable) -> str:
    """The table as text: per GPU type its cluster and rows, then the answers."""
    batch = (
        f"global batch {t.base_gbs} kept fixed at every size (--batch fixed)"
        if t.batch == "fixed"
        else f"global batch scaled with the GPU count ({t.base_gbs} at {t.base_world} GPUs; --batch per-gpu)"
    )
    out = [f"capacity of {t.study}: seq {t.seq_length}, {batch}; every figure estimated"]
    if t.tokens is not None:
        deadline = f" in {t.days:g} days" if t.days is not None else ""
        out.append(f"target: {si_text(t.tokens)} tokens{deadline}" + ("; * = misses it" if t.days else ""))
    cols = _columns(t)
    head = "  " + "  ".join(f"{h:>{w}}" for h, w, _ in cols) + "  best configuration"
    for ty in t.types:
        price = t.prices.get(ty.name)
        priced = f", ${price:g}/GPU-hour" if price is not None else ""
        out.append(f"\n{ty.name} ({ty.describe()}{priced})")
        if ty.excluded:
            out.append(f"  excluded: {ty.excluded}")
            continue
        out.append(head)
        rows = t.rows(ty.name)
        out += [_row_text(cols, r) for r in rows]
        small = t.smallest_fit.get(ty.name)
        if not any(r.fits for r in rows):
            beyond = f"the smallest that fits is {small} GPUs" if small else "none fits up to 16x the largest"
            out.append(f"  nothing fits at these sizes; {beyond}")
        elif small is not None and small > rows[0].gpus:
            out.append(f"  the smallest size that fits: {small} GPUs")
        if any((r.efficiency or 0) > 1.005 for r in rows if r.fits):
            out.append(
                f"  eff. = tokens/s/GPU against {small} GPUs (the smallest that fits); above 100%: a larger cluster "
                "fits layouts the smaller one cannot (less recompute, a larger micro-batch, more parallel groups"
                + (", a larger global batch" if t.batch == "per-gpu" else "")
                + ")"
            )
    a = t.answers
    out.append("\nanswers:")
    if t.days is not None:
        out.append(_answer_text("fewest GPUs", a.fewest, "no size trains the target in time; add GPUs"))
    by = "cost" if a.cheapest_by == "cost" else "GPU-hours (price every type with --price for cost)"
    out.append(_answer_text("cheapest", a.cheapest, "-") + f"  [by {by}]")
    out.append(_answer_text("fastest", a.fastest, "nothing fits"))
    return "\n".join(out)


@click.command()
@study_argument
@click.option(
    "--gpus",
    "gpus_text",
    default=None,
    metavar="N,N,...",
    help="GPU counts, e.g. 8,16,32 or 8,16,32,...,1024 (default: the study's capacity.gpus).",
)
@click.option(
    "--gpu",
    "gpu_text",
    default=None,
    metavar="NAME,...",
    help="GPU types (catalog names); default: the study's capacity.gpu, else its GPU.",
)
@click.option("--tokens", "tokens_text", default=None, metavar="N", help="Tokens to train, e.g. 1T or 300B.")
@click.option("--days", type=float, default=None, help="Days to train them in (needs --tokens).")
@click.option(
    "--price",
    "price_text",
    default=None,
    metavar="GPU=USD,...",
    help="Price per GPU-hour, e.g. h100=2.5,mi355x=3.1.",
)
@click.option(
    "--batch",
    type=click.Choice(BATCH_MODES),
    default=None,
    help="fixed (default): the study's global batch at every size; per-gpu: scaled with the GPU count.",
)
@click.option("--plot", "plot_path", default=None, metavar="FILE", help="Write the plot (PNG, SVG or PDF).")
@json_option
@user_errors
def capacity(
    study: str,
    gpus_text: str | None,
    gpu_text: str | None,
    tokens_text: str | None,
    days: float | None,
    price_text: str | None,
    batch: str | None,
    plot_path: str | None,
    as_json: bool,
) -> None:
    """The best configuration at every GPU count and type, tokens per day, days, GPU-hours and cost to train a
    target, and the fewest GPUs, the cheapest and the fastest."""
    skip_exit_collection()
    spec = StudySpec.from_yaml(study)
    plan = _inputs(spec, gpus_text, gpu_text, tokens_text, days, price_text, batch)
    if plot_path is not None:
        check_output_path(plot_path, "--plot")
        if plot_path.rsplit(".", 1)[-1].lower() not in PLOT_FORMATS:
            raise SpecError(f"--plot: {plot_path!r}: name a .png, .svg or .pdf file")
        _need_matplotlib()
    t0 = time.perf_counter()
    table = capacity_table(spec, **plan)
    elapsed = time.perf_counter() - t0
    if plot_path is not None:
        from ..record.report.plots import plot_capacity

        with open(plot_path, "wb") as fh:
            fh.write(plot_capacity(table, fmt=plot_path.rsplit(".", 1)[-1].lower()))
    if as_json:
        emit_json(table.to_dict())
        return
    click.echo(render(table))
    cells = len(table.all_rows)
    what = f"{cells} cluster{'s' if cells != 1 else ''} estimated in {elapsed:.1f} s"
    click.echo(f"\n({what}" + (f"; plot: {plot_path})" if plot_path else ")"))


def _inputs(
    spec: StudySpec,
    gpus_text: str | None,
    gpu_text: str | None,
    tokens_text: str | None,
    days: float | None,
    price_text: str | None,
    batch: str | None,
) -> dict[str, Any]:
    """:func:`capacity_table`'s arguments: each option, else the study's ``capacity`` section, checked, with
    errors naming the option (or the study field)."""
    cap = spec.capacity
    if gpu_text is not None:
        names: list[str] | None = [g.strip() for g in gpu_text.split(",") if g.strip()] or None
        types = resolve_gpu_types(spec, names, option="--gpu")
    else:
        types = resolve_gpu_types(spec, cap.gpu if cap else None, option="capacity.gpu")
    if gpus_text is not None:
        sizes = check_sizes(parse_sizes(gpus_text), types, option="--gpus")
    elif cap is not None:
        sizes = check_sizes(cap.gpus, types, option="capacity.gpus")
    else:
        raise SpecError(
            "--gpus: give the GPU counts (e.g. --gpus 8,16,32,...,1024) or a capacity section in the study"
        )
    tokens = parse_tokens(tokens_text) if tokens_text is not None else (cap.tokens if cap else None)
    if days is not None and not (days > 0 and math.isfinite(days)):
        raise SpecError(f"--days: {days:g} is not a number of days; give a number > 0 (e.g. 30)")
    days = days if days is not None else (cap.days if cap else None)
    if days is not None and tokens is None:
        raise SpecError("--days: a deadline needs a token target; add --tokens (e.g. --tokens 1T)")
    names_planned = [t.name for t in types]
    if price_text is not None:
        prices = check_prices(parse_prices(price_text, names_planned), types, option="--price")
    else:  # the study's prices of the types planned
        prices = {k: v for k, v in (cap.prices if cap else {}).items() if gpu_key(k) in names_planned}
        prices = check_prices(prices, types, option="capacity.prices")
    batch = batch or (cap.batch if cap else "fixed")
    return {
        "sizes": sizes,
        "gpu_types": names_planned,
        "tokens": tokens,
        "days": days,
        "prices": prices,
        "batch": batch,
    }


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SpecError("--plot needs matplotlib: pip install 'primus-optuna[plots]'") from None
