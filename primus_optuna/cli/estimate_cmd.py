"""``estimate``: the analytical per-stage memory and step time of one configuration (legality first), the
throughput with its error band (:func:`~primus_optuna.physics.uncertainty.estimate_band`).

Exit code 0 when the configuration is legal, 1 when it is not (the reasons are printed; memory is still
estimated when the divisions allow it; the step time only for legal configurations). ``--explain-comm``
adds the collective model's NCCL-style bus bandwidths on the study's cluster (1-64 nodes), and which collectives
come from the cluster's measurements (``cluster.network``: which files) and which from the catalog.
"""

from __future__ import annotations

from typing import Any

import click

from ..physics.comm import Topology, bus_bandwidth_table, format_bus_bandwidth
from ..physics.layer_mix import StageMix, stage_mixes
from ..physics.memory import BREAKDOWN_KEYS, MemoryEstimate, estimate_memory
from ..physics.network import study_topology
from ..physics.throughput import estimate_throughput, format_throughput, measured_sources, throughput_section
from ..physics.uncertainty import estimate_band
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
from .space_cmd import config_line


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
        mixes = _mixes(spec, config)
        if mixes is not None and len(mixes) == len(mem.stages):
            for st, mx in zip(doc["memory"]["stages"], mixes, strict=True):
                st["layers"] = _layers_label(mx)
    if not reasons:
        est = estimate_throughput(spec, config)
        doc["throughput"] = throughput_section(est)
        band = estimate_band(spec)
        doc["throughput"]["band"] = band.to_dict()
        doc["throughput"]["tokens_per_s_per_gpu_range"] = list(band.bounds(est.tokens_per_s_per_gpu))
        if mem is not None and len(est.stage_work_s) == len(mem.stages):
            for st, work in zip(doc["memory"]["stages"], est.stage_work_s, strict=True):
                st["work_s"] = work
            doc["memory"]["pace_stage"] = est.busiest_stage
    return doc


def _mixes(spec: StudySpec, config: TrainingConfig) -> list[StageMix] | None:
    schedule = config.pp_schedule if config.pp > 1 else "1f1b"
    vpp = config.vpp if schedule in ("interleaved", "zbv") else 1
    return stage_mixes(spec.model, spec.pipeline, config.pp, vpp, schedule)


def _layers_label(mx: StageMix) -> str:
    """A stage's layers, e.g. ``E+3d+5moe`` or ``5moe+1mtp+L`` (d = dense, moe = MoE layers)."""
    parts = ["E"] if mx.embedding else []
    parts += [f"{n}{kind}" for n, kind in ((mx.dense, "d"), (mx.moe, "moe"), (mx.mtp, "mtp")) if n]
    parts += ["L"] if mx.loss else []
    return "+".join(parts) or "-"


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
    labelled = any("layers" in st for st in mem["stages"])
    timed = len(mem["stages"]) > 1 and all("work_s" in st for st in mem["stages"])
    if timed:  # the step time's per-stage pipeline work: the stage with the most sets the pace
        head += f" {'work s':>9}"
    lines = [title + ":", head + ("  layers" if labelled else "")]
    for st in mem["stages"]:
        marks = ["peak"] if st["stage"] == mem["peak_stage"] else []
        if timed and st["stage"] == mem.get("pace_stage"):
            marks.append("pace")
        mark = f" <- {', '.join(marks)}" if marks else ""
        cells = " ".join(f"{st['breakdown'][k]:>9.2f}" for k in BREAKDOWN_KEYS)
        work = f" {st['work_s']:>9.2f}" if timed else ""
        layers = f"  {st['layers']}" if "layers" in st else ""
        lines.append(f"{st['stage']:>5} {cells} {st['total_gib']:>9.2f}{work}{layers}{mark}")
    verdict = "fits" if mem["fits"] else "DOES NOT FIT"
    lines.append(
        f"peak {mem['peak_gib']:.1f} GiB on stage {mem['peak_stage']}; usable {mem['usable_gib']:.1f} of "
        f"{mem['capacity_gib']:.1f} GiB: {verdict}"
    )
    return lines


def comm_topology(spec: StudySpec) -> Topology:
    """The collective model of the study's cluster: its GPU family's efficiencies, its measured network."""
    return study_topology(spec)


def comm_section(spec: StudySpec) -> list[dict[str, Any]]:
    """``estimate --json --explain-comm``: one entry per collective, group and message size, with how it was
    priced (``source``: ``catalog`` or from the cluster's measurements)."""
    return [
        {
            "collective": r.collective,
            "nodes": r.nodes,
            "ranks": r.ranks,
            "bytes": r.nbytes,
            "seconds": r.seconds,
            "bus_gbs": r.bus_gbs,
            "source": r.source,
        }
        for r in bus_bandwidth_table(comm_topology(spec))
    ]


def comm_sources(spec: StudySpec) -> str:
    """Which collectives come from the cluster's measurements (which files) and which from the catalog."""
    net, profile = spec.cluster.network, spec.cluster.profile
    own = sorted({p.op for p in profile.collectives.points}) if profile is not None else []
    node = f"; within a node also from the hardware profile: {', '.join(own)}" if own else ""
    if net is None:
        if not own:
            return "collectives: catalog constants for all (no cluster.network)"
        return f"collectives: catalog constants across nodes (no cluster.network){node}"
    return f"collectives: {net.describe()}{node}"


@click.command()
@study_argument
@config_option
@json_option
@click.option(
    "--explain-comm",
    is_flag=True,
    help="also print the collective model's NCCL-style bus bandwidths on this cluster (1-64 nodes) and which "
    "collectives come from cluster.network's measurements (which files) or the catalog",
)
@user_errors
def estimate(study: str, config_text: str, as_json: bool, explain_comm: bool) -> None:
    """Estimate one configuration's per-GPU memory per stage and its step time (exit 1 when illegal)."""
    spec, sp = load_study(study)
    config = config_from_option(sp, config_text)
    doc = estimate_document(spec, sp, config)
    if explain_comm:
        doc["communication"] = comm_section(spec)
        doc["communication_sources"] = comm_sources(spec)
    measured = measured_sources(spec)
    if measured:  # the terms a hardware profile prices (cluster.profile)
        doc["measured"] = measured
    if as_json:
        emit_json(doc)
        raise SystemExit(0 if doc["legal"] else 1)
    click.echo(config_line(spec, config))
    if not doc["legal"]:
        click.echo("illegal:")
        for reason in doc["reasons"]:
            click.echo(f"  - {reason}")
    if "memory" in doc:
        for line in _memory_table(doc["memory"]):
            click.echo(line)
        if "pace_stage" in doc["memory"] and len(doc["memory"]["stages"]) > 1:
            click.echo(
                f"work s: each stage's pipeline work per step (compute and blocking sends); stage "
                f"{doc['memory']['pace_stage']} has the most and sets the pace"
            )
    else:
        click.echo("memory: not estimated (the configuration's sizes do not divide)")
    if doc["legal"]:
        est = estimate_throughput(spec, config)
        click.echo(format_throughput(est))
        click.echo(f"error band: {estimate_band(spec).describe(est.tokens_per_s_per_gpu)}")
    for term, source in measured.items():
        click.echo(f"  {term} priced from {source}")
    if explain_comm:
        click.echo(comm_sources(spec))
        click.echo(format_bus_bandwidth(bus_bandwidth_table(comm_topology(spec))))
    if not doc["legal"]:
        raise SystemExit(1)
