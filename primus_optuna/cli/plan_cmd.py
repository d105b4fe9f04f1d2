"""``plan``: estimate every legal configuration, drop those that do not fit, rank the rest; the estimates' error
band, and whether the top configuration's estimated gain over the baseline lies inside the band of the ratio
of two estimates (:mod:`~primus_optuna.physics.uncertainty`)."""

from __future__ import annotations

import time

import click

from ..physics.plan import PlanEntry, PlanResult, no_fit_message, plan_space
from ..physics.throughput import format_throughput
from ..physics.uncertainty import Band, estimate_band, gain_inside_band, gain_verdict, ratio_band
from ._common import emit_json, json_option, load_study, skip_exit_collection, study_argument, user_errors


def _line(rank: int | str, e: PlanEntry) -> str:
    return (
        f"{str(rank):>5}  {e.tokens_per_s_per_gpu:10,.0f} tok/s/GPU  {e.peak_gib:7.1f} GiB  "
        f"MFU {e.throughput.mfu * 100:4.1f}%  {e.config}"
    )


@click.command()
@study_argument
@click.option(
    "--top", "top_n", default=10, show_default=True, type=click.IntRange(min=0), help="How many to show."
)
@click.option(
    "--pareto",
    "pareto_n",
    default=10,
    show_default=True,
    type=click.IntRange(min=0),
    help="How many points of the Pareto set to show, spread evenly from the fastest to the smallest (0: all).",
)
@json_option
@user_errors
def plan(study: str, top_n: int, pareto_n: int, as_json: bool) -> None:
    """Rank every legal configuration by estimated tokens/s/GPU (those that fit in memory)."""
    skip_exit_collection()
    spec, sp = load_study(study)
    t0 = time.perf_counter()
    result = plan_space(spec, sp, top=top_n)
    elapsed = time.perf_counter() - t0
    no_fit = no_fit_message(spec, sp) if result.legal_configs and not result.feasible_configs else None
    band, rband = estimate_band(spec), ratio_band(spec)
    gain = _top_gain(result)
    if as_json:
        doc = {**result.to_dict(), "no_fit": no_fit, "band": band.to_dict(), "ratio_band": rband.to_dict()}
        for entry, e in zip(doc["top"], result.top, strict=True):
            entry["tokens_per_s_per_gpu_range"] = list(band.bounds(e.tokens_per_s_per_gpu))
        doc["gain_over_baseline"] = gain
        doc["gain_inside_band"] = None if gain is None else gain_inside_band(gain, rband)
        emit_json(doc)
        return
    if no_fit:
        click.echo(no_fit)
    click.echo(
        f"study {spec.name}: {result.legal_configs} legal configurations, {result.feasible_configs} fit in "
        f"memory (estimated in {elapsed:.2f} s)"
    )
    click.echo(f"top {len(result.top)} (every figure estimated: tokens/s/GPU, peak memory per GPU, MFU):")
    click.echo(f"error band of every throughput: {band.text()} ({band.source})")
    for i, e in enumerate(result.top, 1):
        click.echo(_line(i, e))
        click.echo(format_throughput(e.throughput, indent="         ", header=False))
    base = result.baseline
    if base is None:
        click.echo("baseline: illegal (see `primus-optuna check`)")
    else:
        if result.baseline_rank:
            where = f"rank {result.baseline_rank} of {result.feasible_configs}"
        else:
            where = f"does not fit in memory (estimated peak {base.peak_gib:.1f} GiB)"
            if result.feasible_configs:
                where += (
                    f"; by throughput alone it would rank {result.baseline_throughput_rank} of "
                    f"{result.feasible_configs}"
                )
        click.echo(f"baseline ({where}):")
        click.echo(_line(result.baseline_rank or "-", base))
        click.echo(format_throughput(base.throughput, indent="         ", header=False))
    if gain is not None:
        click.echo(_gain_line(gain, rband))
    shown = _spread(len(result.pareto), pareto_n)
    more = (
        f"; {len(shown)} shown, spread evenly: --pareto 0 for all" if len(shown) < len(result.pareto) else ""
    )
    click.echo(
        f"Pareto set (estimated throughput vs peak memory, {len(result.pareto)} configurations{more}):"
    )
    for i in shown:
        click.echo(_line("", result.pareto[i]))


def _top_gain(result: PlanResult) -> float | None:
    """The estimated gain of the fastest configuration that fits over the baseline (when the baseline fits)."""
    if not result.top or result.baseline is None or not result.baseline_rank:
        return None
    return result.top[0].tokens_per_s_per_gpu / result.baseline.tokens_per_s_per_gpu - 1


def _gain_line(gain: float, band: Band) -> str:
    out = f"estimated gain of #1 over the baseline: {gain:+.1%}; {gain_verdict(gain, band)} ({band.source})"
    return out + ("; the baseline may be as fast: measure both" if gain_inside_band(gain, band) else "")


def _spread(total: int, n: int) -> list[int]:
    """Indices of ``n`` of ``total`` ordered items, evenly spread and both ends included (all when ``n`` is 0
    or at least ``total``)."""
    if n == 0 or n >= total:
        return list(range(total))
    if n == 1:
        return [0]
    return sorted({round(i * (total - 1) / (n - 1)) for i in range(n)})
