"""``space`` and ``check``: the legal values of each axis, and the legality of one configuration."""

from __future__ import annotations

import time

import click

from ..physics import MemoryEstimate, estimate_memory, no_fit_message
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ._common import (
    config_from_option,
    config_option,
    emit_json,
    json_option,
    load_study,
    study_argument,
    user_errors,
)


@click.command()
@study_argument
@json_option
@user_errors
def space(study: str, as_json: bool) -> None:
    """Show the legal values per axis, the number of legal configurations and the baseline's legality."""
    spec, sp = load_study(study)
    t0 = time.perf_counter()
    summary = sp.summary()
    elapsed = time.perf_counter() - t0
    no_fit = no_fit_message(spec, sp)
    base_mem = _memory(spec, sp, sp.baseline)
    summary["no_fit"] = no_fit
    summary["baseline"]["memory"] = base_mem.to_dict() if base_mem else None
    if base_mem:
        del summary["baseline"]["memory"]["stages"]
    if as_json:
        emit_json(summary)
        return
    if no_fit:
        click.echo(no_fit)
    click.echo(
        f"study      {spec.name}: {spec.model.name} on {spec.cluster.nodes}x{spec.cluster.gpus_per_node} "
        f"{spec.cluster.gpu.name} ({spec.world} GPUs), seq {spec.workload.seq_length}, "
        f"GBS {spec.workload.global_batch_size}, {spec.workload.precision}"
    )
    click.echo("legal values per axis:")
    for axis, values in summary["axes"].items():
        click.echo(f"  {axis:<15} {', '.join(str(v) for v in values)}")
    click.echo(f"legal configurations: {summary['legal_configs']} (enumerated in {elapsed * 1000:.0f} ms)")
    for line in sp.axis_warnings():
        click.echo(f"warning: {line}", err=True)
    base = summary["baseline"]
    click.echo(f"baseline   {sp.baseline}: {'legal' if base['legal'] else 'ILLEGAL'}")
    for reason in base["reasons"]:
        click.echo(f"  - {reason}")
    if base_mem is not None:
        click.echo(f"  {_fits_line(base_mem)}")


def _memory(spec: StudySpec, sp: Space, config: TrainingConfig) -> MemoryEstimate | None:
    """The memory estimate of a legal configuration (``None`` for an illegal one)."""
    canon = sp.canonical(config)
    return None if sp.check(canon) else estimate_memory(spec, canon)


def _fits_line(mem: MemoryEstimate) -> str:
    verdict = "fits in memory" if mem.fits else "does NOT fit in memory"
    return f"{verdict}: {mem.reason().removeprefix('memory: ')} (estimate)"


def _derived_note(spec: StudySpec, config: TrainingConfig) -> str | None:
    """Why ``dp`` or the micro-batch count of a derived configuration is missing (``None`` when both exist)."""
    if not config.dp:
        inner = config.tp * config.cp * config.pp
        return f"tp·cp·pp = {inner} does not divide the {spec.world} GPUs"
    if not config.num_microbatches:
        return f"GBS {spec.workload.global_batch_size} not divisible by mbs·dp = {config.mbs * config.dp}"
    return None


def config_line(spec: StudySpec, config: TrainingConfig) -> str:
    """The configuration with its derived ``dp`` and micro-batch count, or why either is missing."""
    note = _derived_note(spec, config)
    if config.dp and config.num_microbatches:
        return f"{config}  dp={config.dp} micro-batches={config.num_microbatches}"
    if config.dp:
        return f"{config}  dp={config.dp}, micro-batches: none ({note})"
    return f"{config}  dp: none ({note})"


@click.command()
@study_argument
@config_option
@json_option
@user_errors
def check(study: str, config_text: str, as_json: bool) -> None:
    """Say whether one configuration is legal, with every reason when it is not (exit 1 when illegal)."""
    spec, sp = load_study(study)
    config = config_from_option(sp, config_text)
    reasons = sp.check(config)
    canonical = sp.canonical(config)
    canonical_reasons = sp.check(canonical) if canonical != config else reasons
    mem = _memory(spec, sp, config) if not canonical_reasons else None
    if as_json:
        emit_json(
            {
                "config": config.to_dict(),
                "derived_note": _derived_note(spec, config),
                "legal": not reasons,
                "reasons": reasons,
                "canonical": {
                    "config": canonical.to_dict(),
                    "legal": not canonical_reasons,
                    "reasons": canonical_reasons,
                },
                "fits": mem.fits if mem else None,
                "memory_peak_gib": round(mem.peak_gib, 3) if mem else None,
                "memory_usable_gib": round(mem.usable_gib, 3) if mem else None,
            }
        )
        raise SystemExit(1 if reasons else 0)
    click.echo(config_line(spec, config))
    click.echo("legal" if not reasons else "illegal:")
    for reason in reasons:
        click.echo(f"  - {reason}")
    if canonical != config:
        state = "legal" if not canonical_reasons else "illegal"
        click.echo(f"canonical form: {canonical} ({state})")
    if mem is not None:
        click.echo(_fits_line(mem))
    if reasons:
        raise SystemExit(1)
