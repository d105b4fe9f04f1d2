"""Capacity planning: the best configuration of a study's model and workload at every cluster size and GPU type,
with the time and cost to train a token target: :func:`capacity_table`.

Each (GPU type, GPU count) is the study with its cluster replaced (whole nodes of the type's usual system,
:data:`~primus_optuna.spec.hardware.CATALOG_NODE`, or the study's own nodes for its own GPU) and, under
``batch="per-gpu"``, its global batch scaled with the GPU count; :func:`~.plan.plan_space` ranks that study's
legal space and its best fitting configuration is the row (:func:`~.plan.best_fitting`: ``plan``'s top, so the
study's own size is exactly what ``plan`` ranks first).

Example::

    table = capacity_table(spec, [8, 16, 32, 64], gpu_types=["h100", "mi355x"], tokens=1e12, days=30)
    table.answers.fewest, table.rows("h100")[-1].days
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import SpecError
from ..space import Space, TrainingConfig
from ..space.megatron_args import export_refusal, uses_primus
from ..spec.hardware import GPU_CATALOG, MXFP8_GPUS, GPUSpec, catalog_node, gpu_key
from ..spec.study import StudySpec
from .memory import estimate_memory, peak_memory_all, peaks_key
from .plan import PlanEntry, best_fitting, gc_paused
from .throughput import estimate_throughput
from .uncertainty import estimate_band

BATCH_MODES = ("fixed", "per-gpu")
"""``fixed``: every size trains the study's global batch (strong scaling); ``per-gpu``: the global batch grows
with the GPU count, the study's sequences per GPU kept (weak scaling)"""

SECONDS_PER_DAY = 86_400.0
GROWTH_LIMIT = 16
"""when no requested size fits a GPU type, sizes up to this many times the largest requested are tried (doubling)
to name the smallest that fits"""

BandFn = Callable[[StudySpec, PlanEntry], Any]
"""``band(spec_at_size, best) -> band``: the error band of a row's estimate, or None"""


def study_band(spec: StudySpec, best: PlanEntry) -> Any:
    """The default row band: :func:`~.uncertainty.estimate_band` of the cluster at that size (its GPU family,
    its node count; the study's hardware profile and network where it keeps its own GPU)."""
    return estimate_band(spec)


@dataclass(frozen=True, slots=True)
class GpuType:
    """One GPU type's cluster: its GPU, node and host sizes, and why it is left out (None: it is not)."""

    name: str
    gpu: GPUSpec
    gpus_per_node: int
    host_gpus: int
    own: bool
    """the study's own GPU (its overrides and node kept)"""
    excluded: str | None = None

    def layout(self, world: int) -> tuple[int, int] | str:
        """(nodes, GPUs per node) of ``world`` GPUs, or why they are not whole nodes (or whole hosts of one
        node)."""
        n = self.gpus_per_node
        if world % n == 0:
            return world // n, n
        if world < n and world % self.host_gpus == 0 and self.host_gpus < n:
            return 1, world
        hosts = f" or whole {self.host_gpus}-GPU hosts of one node" if self.host_gpus < n else ""
        return f"{world} GPUs are not whole {n}-GPU {self.name} nodes{hosts}"

    def describe(self) -> str:
        g = self.gpu
        fabric = "switch" if g.topology == "switch" else f"mesh of {g.intra_node_links} links"
        nics = g.nics_per_node or self.gpus_per_node
        net = nics * g.inter_node_bw_gbs / self.gpus_per_node
        own = ", the study's" if self.own else ""
        return (
            f"nodes of {self.gpus_per_node}{own}: {fabric} {g.intra_node_bw_gbs:g} GB/s per GPU inside, "
            f"{net:g} GB/s per GPU between nodes; {g.hbm_gib:.0f} GiB"
        )


@dataclass
class CapacityRow:
    """The best fitting configuration of one GPU type at one size, or why there is none."""

    gpu: str
    gpus: int
    nodes: int = 0
    gpus_per_node: int = 0
    global_batch_size: int = 0
    best: PlanEntry | None = None
    legal_configs: int = 0
    feasible_configs: int = 0
    why_not: str | None = None
    """why nothing runs at this size (None when ``best`` is set)"""
    why_kind: str | None = None
    """``node`` (not whole nodes), ``spec`` (the study refuses the size), ``batch`` (the global batch cannot be
    split), ``rules`` (no legal configuration otherwise), ``memory`` (none fits)"""
    tokens_per_day: float = 0.0
    days: float | None = None
    gpu_hours: float | None = None
    cost: float | None = None
    efficiency: float | None = None
    """tokens/s/GPU against the type's smallest fitting size"""
    meets: bool | None = None
    """trains the target within the days asked (None without both)"""
    note: str | None = None
    """why fewer tokens per day than a smaller size of the same type"""
    band: Any = None
    """the estimate's error band (issue 38: low, high, source); filled by :func:`capacity_table`'s ``band``"""

    @property
    def fits(self) -> bool:
        return self.best is not None

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.best.tokens_per_s_per_gpu if self.best else 0.0

    @property
    def cluster_tokens_per_s(self) -> float:
        return self.tokens_per_s_per_gpu * self.gpus

    def to_dict(self) -> dict[str, Any]:
        b = self.best
        return {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "global_batch_size": self.global_batch_size,
            "config": b.config.to_params() if b else None,
            "peak_gib": b.peak_gib if b else None,
            "tokens_per_s_per_gpu": b.tokens_per_s_per_gpu if b else None,
            "cluster_tokens_per_s": self.cluster_tokens_per_s if b else None,
            "tokens_per_day": self.tokens_per_day if b else None,
            "days": self.days,
            "gpu_hours": self.gpu_hours,
            "cost": self.cost,
            "efficiency": self.efficiency,
            "meets_target": self.meets,
            "legal_configs": self.legal_configs,
            "feasible_configs": self.feasible_configs,
            "why_not": self.why_not,
            "why_kind": self.why_kind,
            "note": self.note,
            "band": _band_dict(self.band),
        }


@dataclass
class Answers:
    """The rows that answer the questions (None: no row does), and what the cheapest was ranked by."""

    fewest: CapacityRow | None = None
    """the fewest GPUs that train the target within the days asked (then the cheapest, then the fastest)"""
    cheapest: CapacityRow | None = None
    """the lowest cost (else GPU-hours) to train the target, among the rows that meet it when days are asked"""
    fastest: CapacityRow | None = None
    """the most cluster tokens per second"""
    cheapest_by: str = "gpu-hours"
    """``cost`` when every fitting row has a price, else ``gpu-hours``"""


@dataclass
class CapacityTable:
    """Every (GPU type, size) of a capacity plan, the answers and the time/cost Pareto front."""

    study: str
    batch: str
    base_world: int
    base_gbs: int
    seq_length: int
    sizes: list[int]
    types: list[GpuType]
    tokens: float | None = None
    days: float | None = None
    prices: dict[str, float] = field(default_factory=dict)
    all_rows: list[CapacityRow] = field(default_factory=list)
    smallest_fit: dict[str, int | None] = field(default_factory=dict)
    """per type: the fewest GPUs that fit (beyond the requested sizes when none of them does), None: none up to
    :data:`GROWTH_LIMIT` times the largest"""
    answers: Answers = field(default_factory=Answers)
    pareto: list[CapacityRow] = field(default_factory=list)
    """fitting rows no other beats on both time (cluster tokens/s) and cost (else GPU-hours per token)"""

    def rows(self, gpu: str) -> list[CapacityRow]:
        """The rows of GPU type ``gpu`` at the requested sizes, smallest first."""
        return [r for r in self.all_rows if r.gpu == gpu and r.gpus in self.sizes]

    def to_dict(self) -> dict[str, Any]:
        a = self.answers
        return {
            "study": self.study,
            "batch": self.batch,
            "base_world": self.base_world,
            "base_global_batch_size": self.base_gbs,
            "seq_length": self.seq_length,
            "tokens": self.tokens,
            "days": self.days,
            "prices_per_gpu_hour": dict(self.prices),
            "types": [
                {
                    "gpu": t.name,
                    "gpus_per_node": t.gpus_per_node,
                    "host_gpus": t.host_gpus,
                    "cluster": t.describe(),
                    "excluded": t.excluded,
                    "smallest_fit": self.smallest_fit.get(t.name),
                }
                for t in self.types
            ],
            "rows": [r.to_dict() for t in self.types for r in self.rows(t.name)],
            "answers": {
                "fewest": _ref(a.fewest),
                "cheapest": _ref(a.cheapest),
                "cheapest_by": a.cheapest_by,
                "fastest": _ref(a.fastest),
            },
            "pareto": [_ref(r) for r in self.pareto],
        }


def _ref(row: CapacityRow | None) -> dict[str, Any] | None:
    return None if row is None else {"gpu": row.gpu, "gpus": row.gpus}


def band_text(band: Any) -> str:
    """A row's band as the tables print it (``−65%/+13%``), ``-`` for none."""
    text = getattr(band, "text", None)
    return "-" if band is None else text() if callable(text) else str(band)


def si_text(x: float) -> str:
    """``1T``, ``25.5B``, ``295K``: three significant digits with an SI-style suffix (tokens, dollars)."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _band_dict(band: Any) -> Any:
    if band is None:
        return None
    if hasattr(band, "to_dict"):
        return band.to_dict()
    return {k: getattr(band, k) for k in ("low", "high", "source") if hasattr(band, k)} or str(band)


# --- inputs ------------------------------------------------------------------------------------------------------
def resolve_gpu_types(
    spec: StudySpec, names: Sequence[str] | None = None, option: str = "gpu_types"
) -> list[GpuType]:
    """The clusters of the GPU types ``names`` (default: the study's GPU), each with why it is left out for this
    study's workload (None: it is not). Raises :class:`SpecError` naming ``option`` for an unknown name."""
    own = gpu_key(spec.cluster.gpu.name)
    out: list[GpuType] = []
    for raw in names or [own]:
        key = gpu_key(raw)
        if key in (t.name for t in out):
            continue
        if key == own:
            t = GpuType(key, spec.cluster.gpu, spec.cluster.gpus_per_node, spec.cluster.gpus_per_node, True)
        elif key in GPU_CATALOG:
            gpn, host = catalog_node(key)
            t = GpuType(key, GPU_CATALOG[key], gpn, host, False)
        else:
            raise SpecError(
                f"{option}: unknown GPU {raw!r}; use the study's GPU ({own}) or a catalog name "
                f"({', '.join(sorted(GPU_CATALOG))})"
            )
        out.append(replace(t, excluded=_exclusion(spec, t)))
    return out


def _exclusion(spec: StudySpec, t: GpuType) -> str | None:
    """Why the study's workload cannot run on GPU type ``t`` (None: it can)."""
    w = spec.workload
    if w.precision == "fp8" and t.gpu.fp8_tflops is None:
        return f"the study trains in FP8 (workload.precision) and {t.name} has no FP8"
    if w.precision == "fp8" and w.fp8_recipe == "mxfp8" and not t.own and t.name not in MXFP8_GPUS:
        return (
            f"the study's FP8 recipe is MXFP8 (workload.fp8_recipe) and {t.name} has no MX block scaling "
            f"(GPUs with it: {', '.join(sorted(MXFP8_GPUS))})"
        )
    if t.own:
        return None
    try:
        probe = _size_spec(spec, t, t.gpus_per_node * math.ceil(spec.world / t.gpus_per_node), "fixed")
    except SpecError as exc:
        return str(exc).split(": ", 1)[-1]
    primus = uses_primus(probe)
    refusal = export_refusal(probe, primus=primus)
    if refusal and refusal != export_refusal(spec, primus=uses_primus(spec)):
        return f"{'Primus' if primus else 'Megatron-LM'}, which {t.name} clusters run, cannot launch it: {refusal}"
    return None


def check_sizes(sizes: Sequence[int], types: Sequence[GpuType], option: str = "sizes") -> list[int]:
    """The sizes sorted, or :class:`SpecError` naming ``option`` when one is not positive, repeated, or whole
    nodes of none of the (usable) types."""
    if not sizes:
        raise SpecError(f"{option}: give at least one GPU count (e.g. 8,16,32)")
    usable = [t for t in types if t.excluded is None] or list(types)
    for n in sizes:
        if n <= 0:
            raise SpecError(f"{option}: {n} is not a GPU count; give positive integers (e.g. 8,16,32)")
        if all(isinstance(t.layout(n), str) for t in usable):
            nodes = ", ".join(f"{t.gpus_per_node} GPUs per {t.name} node" for t in usable)
            raise SpecError(
                f"{option}: {n} GPUs are not whole nodes ({nodes}); give multiples of the node size (e.g. "
                f"{usable[0].gpus_per_node * max(1, round(n / usable[0].gpus_per_node))})"
            )
    if len(set(sizes)) != len(sizes):
        raise SpecError(f"{option}: a GPU count is repeated; give each once")
    return sorted(sizes)


def check_prices(
    prices: dict[str, float], types: Sequence[GpuType], option: str = "prices"
) -> dict[str, float]:
    """``prices`` keyed by catalog key, or :class:`SpecError` naming ``option`` for a negative price or a GPU not
    among ``types``."""
    names = [t.name for t in types]
    out: dict[str, float] = {}
    for raw, value in prices.items():
        key = gpu_key(raw)
        if key not in names:
            raise SpecError(
                f"{option}: a price for {raw!r}, which is not among the GPU types planned ({', '.join(names)}); "
                "add it to the GPU types or remove its price"
            )
        if not (value >= 0 and math.isfinite(value)):
            raise SpecError(f"{option}: {raw}={value} is not a price per GPU-hour; give a number >= 0")
        out[key] = float(value)
    return out


# --- one size ----------------------------------------------------------------------------------------------------
def _scaled_gbs(spec: StudySpec, world: int, batch: str) -> int:
    gbs = spec.workload.global_batch_size
    return gbs if batch == "fixed" else max(1, round(gbs * world / spec.world))


def _size_spec(spec: StudySpec, t: GpuType, world: int, batch: str) -> StudySpec:
    """The study on ``world`` GPUs of type ``t`` (whole nodes; raises :class:`SpecError`)."""
    layout = t.layout(world)
    if isinstance(layout, str):
        raise SpecError(layout)
    nodes, gpn = layout
    data = spec.to_dict()
    gpu: Any = data["cluster"]["gpu"] if t.own else t.name
    data["cluster"] = {"gpu": gpu, "nodes": nodes, "gpus_per_node": gpn}
    data["workload"]["global_batch_size"] = _scaled_gbs(spec, world, batch)
    return StudySpec.from_dict(data, source=f"{t.name} x {world}")


def _batch_reason(space: Space) -> str | None:
    """Why the global batch cannot be split over the world with any (tp, cp, pp) of the space (None: it can)."""
    f = space.facts
    c = space.candidates
    for tp in c["tp"]:
        for cp in c["cp"]:
            for pp in c["pp"]:
                inner = tp * cp * pp
                if f.world % inner:
                    continue
                dp = f.world // inner
                if any(f.gbs % (mbs * dp) == 0 and f.gbs // (mbs * dp) >= pp for mbs in c["mbs"]):
                    return None
    most = max(
        (tp * cp * pp for tp in c["tp"] for cp in c["cp"] for pp in c["pp"] if f.world % (tp * cp * pp) == 0),
        default=1,
    )
    return (
        f"the global batch ({f.gbs} sequences) is too small to split over {f.world} GPUs: every legal "
        f"tp·cp·pp (at most {most}) leaves dp = {f.world // most} or more, and Megatron needs global_batch_size "
        "divisible by mbs·dp with at least pp micro-batches"
    )


def _memory_reason(spec: StudySpec, space: Space) -> str:
    configs = space.configs()
    peaks, usable = peak_memory_all(spec, configs)
    i = min(range(len(peaks)), key=peaks.__getitem__)
    mem = estimate_memory(spec, configs[i])
    return (
        f"nothing fits in memory: the smallest peak is {mem.peak_gib:.1f} GiB (stage {mem.peak_stage}, "
        f"{configs[i]}) > {usable:.1f} GiB usable"
    )


class _Reuse:
    """The enumerations and peak memories of the cells planned so far, for the cells alike (one size on GPU types
    of the same node size and launcher enumerate the same space; their peaks differ only in the usable memory)."""

    def __init__(self) -> None:
        self.spaces: dict[tuple[Any, ...], Space] = {}
        self.peaks: dict[tuple[Any, ...], tuple[list[TrainingConfig], list[float]]] = {}

    def space(self, sw: StudySpec) -> Space:
        space = Space(sw)
        key = (space.facts, tuple((a, tuple(v)) for a, v in space.candidates.items()))
        other = self.spaces.get(key)
        if other is None or not space.adopt_enumeration(other):
            self.spaces[key] = space
        return space

    def peak_memory(self, sw: StudySpec, space: Space) -> list[float]:
        configs = space.configs()
        key = (peaks_key(sw), id(configs))
        hit = self.peaks.get(key)
        if hit is None:
            hit = self.peaks[key] = (configs, peak_memory_all(sw, configs)[0])  # holds the list: its id stays
        return hit[1]


def _row(
    spec: StudySpec, t: GpuType, world: int, batch: str, reuse: _Reuse | None = None
) -> tuple[CapacityRow, StudySpec | None]:
    """The row of ``world`` GPUs of type ``t``, and the study at that size (None when it is refused)."""
    row = CapacityRow(t.name, world, global_batch_size=_scaled_gbs(spec, world, batch))
    layout = t.layout(world)
    if isinstance(layout, str):
        row.why_not, row.why_kind = layout, "node"
        return row, None
    try:
        sw = _size_spec(spec, t, world, batch)
    except SpecError as exc:
        row.why_not, row.why_kind = str(exc), "spec"
        return row, None
    row.nodes, row.gpus_per_node = sw.cluster.nodes, sw.cluster.gpus_per_node
    reuse = reuse or _Reuse()
    space = reuse.space(sw)
    if space.empty:
        why = _batch_reason(space)
        row.why_not, row.why_kind = (why, "batch") if why else (space.explain_empty(limit=50_000), "rules")
        return row, sw
    row.best, row.legal_configs, row.feasible_configs = best_fitting(sw, space, reuse.peak_memory(sw, space))
    if row.best is None:
        row.why_not, row.why_kind = _memory_reason(sw, space), "memory"
    return row, sw


# --- the table ---------------------------------------------------------------------------------------------------
def capacity_table(
    spec: StudySpec,
    sizes: Sequence[int],
    gpu_types: Sequence[str] | None = None,
    *,
    tokens: float | None = None,
    days: float | None = None,
    prices: dict[str, float] | None = None,
    batch: str = "fixed",
    band: BandFn | None = study_band,
) -> CapacityTable:
    """The best fitting configuration of ``spec``'s model and workload for every GPU type in ``gpu_types``
    (default: the study's) at every size in ``sizes`` (GPU counts, whole nodes), with tokens per day, the days,
    GPU-hours and cost (``prices``: per GPU-hour by type) to train ``tokens``, and the answers: the fewest GPUs
    that train them within ``days``, the cheapest, the fastest. ``band`` gives each row's error band (default :func:`study_band`; None for none).
    Raises :class:`SpecError` for bad input."""
    if batch not in BATCH_MODES:
        raise SpecError(f"batch: {batch!r} is not one of {', '.join(BATCH_MODES)}")
    if tokens is not None and not (tokens > 0 and math.isfinite(tokens)):
        raise SpecError(f"tokens: {tokens} is not a token count; give a number > 0 (e.g. 1e12)")
    if days is not None and not (days > 0 and math.isfinite(days)):
        raise SpecError(f"days: {days} is not a duration; give a number of days > 0 (e.g. 30)")
    if days is not None and tokens is None:
        raise SpecError("days: a deadline needs a token target; give tokens too (e.g. tokens=1e12)")
    types = resolve_gpu_types(spec, gpu_types)
    sizes = check_sizes(sizes, types)
    table = CapacityTable(
        study=spec.name,
        batch=batch,
        base_world=spec.world,
        base_gbs=spec.workload.global_batch_size,
        seq_length=spec.workload.seq_length,
        sizes=sizes,
        types=types,
        tokens=tokens,
        days=days,
        prices=check_prices(prices or {}, types),
    )
    reuse = _Reuse()
    with gc_paused():  # each cell allocates tens of thousands of acyclic configurations
        for t in types:
            if t.excluded is None:
                _fill_type(table, spec, t, band, reuse)
    _answer(table)
    return table


def _fill_type(
    table: CapacityTable, spec: StudySpec, t: GpuType, band: BandFn | None, reuse: _Reuse | None = None
) -> None:
    """The rows of type ``t`` at the requested sizes (and beyond, doubling, when none fits), their metrics,
    scaling efficiency and the notes on sizes that give fewer tokens per day than a smaller one."""
    rows: list[tuple[CapacityRow, StudySpec | None]] = [
        _row(spec, t, n, table.batch, reuse) for n in table.sizes
    ]
    n = table.sizes[-1]
    while not any(r.fits for r, _ in rows) and n < GROWTH_LIMIT * table.sizes[-1]:
        if rows[-1][0].why_kind == "batch" and table.batch == "fixed":
            break  # more GPUs only split the same batch further
        n *= 2
        rows.append(_row(spec, t, n, table.batch, reuse))
    fitting = [r for r, _ in rows if r.fits]
    table.smallest_fit[t.name] = fitting[0].gpus if fitting else None
    base = fitting[0].tokens_per_s_per_gpu if fitting else 0.0
    best_so_far: tuple[CapacityRow, StudySpec] | None = None
    for row, sw in rows:
        if not row.fits or sw is None:
            continue
        _metrics(table, row)
        row.efficiency = row.tokens_per_s_per_gpu / base
        if band is not None and row.best is not None:
            row.band = band(sw, row.best)
        if best_so_far and row.tokens_per_day < best_so_far[0].tokens_per_day:
            row.note = _why_fewer(best_so_far[0], row, sw)
        if best_so_far is None or row.tokens_per_day >= best_so_far[0].tokens_per_day:
            best_so_far = (row, sw)
    table.all_rows.extend(r for r, _ in rows)


def _metrics(table: CapacityTable, row: CapacityRow) -> None:
    tps = row.tokens_per_s_per_gpu
    row.tokens_per_day = tps * row.gpus * SECONDS_PER_DAY
    if table.tokens is None:
        return
    row.days = table.tokens / row.tokens_per_day
    row.gpu_hours = table.tokens / tps / 3600.0
    price = table.prices.get(row.gpu)
    row.cost = None if price is None else row.gpu_hours * price
    if table.days is not None:
        row.meets = row.days <= table.days


def _why_fewer(prev: CapacityRow, row: CapacityRow, sw: StudySpec) -> str:
    """Why ``row`` gives fewer tokens per day than the smaller ``prev``: the smaller size's best layout is
    illegal here (the rule's reason), or the step term that grows most per GPU when it runs here."""
    assert prev.best is not None and row.best is not None
    space = Space(sw)
    c: TrainingConfig = prev.best.config
    same = space.canonical(c.replace())
    lead = f"fewer tokens/day than {prev.gpus} GPUs"
    reasons = space.check(same)
    if reasons:
        return f"{lead}: its layout {prev.best.config} is illegal here ({reasons[0]})"
    mem = estimate_memory(sw, same)
    if not mem.fits:
        return f"{lead}: its layout {prev.best.config} no longer fits ({mem.peak_gib:.1f} GiB)"
    est = estimate_throughput(sw, same)
    before, after = prev.best.throughput, est

    def share(e: Any, term: str) -> float:
        return e.breakdown_s.get(term, 0.0) / e.step_time_s

    term = max(after.breakdown_s, key=lambda k: share(after, k) - share(before, k))
    return (
        f"{lead}: with its layout here {term} grows from {share(before, term):.0%} to "
        f"{share(after, term):.0%} of the step"
    )


def _answer(table: CapacityTable) -> None:
    """The fewest, cheapest and fastest rows, and the time/cost Pareto front."""
    fit = [r for r in table.all_rows if r.fits and r.gpus in table.sizes]
    if not fit:
        return
    a = table.answers
    priced = all(r.gpu in table.prices for r in fit)
    a.cheapest_by = "cost" if priced and table.prices else "gpu-hours"

    def cost_key(r: CapacityRow) -> float:
        per_token = 1.0 / r.tokens_per_s_per_gpu
        return per_token * table.prices[r.gpu] if a.cheapest_by == "cost" else per_token

    a.fastest = max(fit, key=lambda r: (r.cluster_tokens_per_s, -r.gpus))
    meeting = [r for r in fit if r.meets] if table.days is not None else fit
    if table.days is not None and meeting:
        a.fewest = min(meeting, key=lambda r: (r.gpus, cost_key(r), -r.cluster_tokens_per_s))
    if meeting:
        a.cheapest = min(meeting, key=lambda r: (cost_key(r), -r.cluster_tokens_per_s))
    front: list[CapacityRow] = []
    best = math.inf
    for r in sorted(fit, key=lambda r: (-r.cluster_tokens_per_s, cost_key(r))):
        if cost_key(r) < best:
            front.append(r)
            best = cost_key(r)
    table.pareto = front
