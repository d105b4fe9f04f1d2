"""``estimate``: the analytical per-stage memory and step time of one configuration (legality first).

Exit code 0 when the configuration is legal, 1 when it is not (the reasons are printed; memory is still
estimated when the divisions allow it; the step time only for legal configurations).
"""

from __future__ import annotations

from typing import Any

import click

from ..physics.memory import BREAKDOWN_KEYS, MemoryEstimate, estimate_memory
from ..physics.throughput import estimate_throughput, format_throughput, throughput_section
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


def _memory_or_none(spec: StudySpec, config: TrainingConfig) -> MemoryEstimate | None:
    """The memory estimate, or None when the configuration's divisions make it meaningless."""
    if not config.dp or config.pp > spec.model.num_layers or spec.world % config.pp:
        return None
    try:
        return estimate_memory(spec, config)
    except (ZeroDivisionError, ValueError, IndexError):
        return None


def estimate_document(spec: StudySpec, space: Space, config: TrainingConfig) -> dict[str, Any]:
    """The ``estimate --json`` document: config, legality, memory (when computable) and throughput (legal only)."""
    reasons = space.check(config)
    doc: dict[str, Any] = {"config": config.to_dict(), "legal": not reasons, "reasons": reasons}
    mem = _memory_or_none(spec, config)
    if mem is not None:
        doc["memory"] = mem.to_dict()
    if not reasons:
        doc["throughput"] = throughput_section(estimate_throughput(spec, config))
    return doc


_SHORT = {
    "weights_gib": "weights",
    "gradients_gib": "grads",
    "optimizer_gib": "optim",
    "activations_gib": "activ",
    "comm_buffers_gib": "ccl",
    "dispatcher_buffers_gib": "deepep",
    "overhead_gib": "overhead",
}


def _memory_table(mem: dict[str, Any]) -> list[str]:
    head = f"{'stage':>5} " + " ".join(f"{_SHORT[k]:>9}" for k in BREAKDOWN_KEYS) + f" {'total':>9}"
    title = "memory per GPU (GiB)"
    if mem.get("recompute"):
        title += f", activations with recompute={mem['recompute']}"
    lines = [title + ":", head]
    for st in mem["stages"]:
        mark = " <- peak" if st["stage"] == mem["peak_stage"] else ""
        cells = " ".join(f"{st['breakdown'][k]:>9.2f}" for k in BREAKDOWN_KEYS)
        lines.append(f"{st['stage']:>5} {cells} {st['total_gib']:>9.2f}{mark}")
    verdict = "fits" if mem["fits"] else "DOES NOT FIT"
    lines.append(
        f"peak {mem['peak_gib']:.1f} GiB on stage {mem['peak_stage']}; usable {mem['usable_gib']:.1f} of "
        f"{mem['capacity_gib']:.1f} GiB: {verdict}"
    )
    return lines


@click.command()
@study_argument
@config_option
@json_option
@user_errors
def estimate(study: str, config_text: str, as_json: bool) -> None:
    """Estimate one configuration's per-GPU memory per stage and its step time (exit 1 when illegal)."""
    spec, sp = load_study(study)
    config = config_from_option(sp, config_text)
    doc = estimate_document(spec, sp, config)
    if as_json:
        emit_json(doc)
        raise SystemExit(0 if doc["legal"] else 1)
    click.echo(f"{config}  dp={config.dp} micro-batches={config.num_microbatches}")
    if not doc["legal"]:
        click.echo("illegal:")
        for reason in doc["reasons"]:
            click.echo(f"  - {reason}")
    if "memory" in doc:
        for line in _memory_table(doc["memory"]):
            click.echo(line)
    else:
        click.echo("memory: not estimated (the configuration's sizes do not divide)")
    if doc["legal"]:
        click.echo(format_throughput(estimate_throughput(spec, config)))
    if not doc["legal"]:
        raise SystemExit(1)
