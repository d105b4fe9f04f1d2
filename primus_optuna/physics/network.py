"""The cluster's measured collectives in the collective model: :class:`MeasuredNetwork`, :func:`study_topology`.

A study's ``cluster.network`` (:mod:`primus_optuna.spec.network`) gives bus bandwidths per collective, job
size (ranks), ranks per node and message size. They are kept per collective and *scope* (ranks per node: a
data-parallel group one rank per node is measured by ``NCCL_TESTS_SPLIT="MOD 8"``, a whole-node job by a plain
run) and replace the catalog's :class:`~.comm.Topology` price where they apply:

- inside the measured range of a scope: the bus bandwidth interpolated linearly in ``log(bytes)`` along each
  measured job size and in ``log(ranks)`` between job sizes (piecewise linear: monotone wherever the data is),
  turned into seconds with nccl-tests' factor (``t = S · factor(n) / busbw``);
- beyond the largest (or below the smallest) measured message of a job size, and beyond the largest (or below
  the smallest) measured job: the catalog model anchored at the nearest measured point (its time multiplied by
  measured / model there), so the price is continuous at the boundary and follows the model's shape beyond;
- a group whose ranks per node no job measured, but on the same side of the node boundary (both inside one
  node, or both across nodes): the catalog model anchored at the nearest measured scope's nearest job;
- a group on the other side of the node boundary from every measurement (an intra-node TP group when only
  multi-node jobs were measured), a collective nobody measured, and DeepEP's dispatch: the catalog.

:meth:`MeasuredNetwork.seconds` says which of these priced a call (``estimate --explain-comm``).

Example::

    topo = study_topology(spec)       # the catalog model, with the study's measured network when it has one
    topo.all_reduce(2**30, Group(64))
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..spec.network import COLLECTIVES, Row, bus_factor
from ..spec.study import StudySpec
from .calibration import FamilyConstants, family_constants
from .comm import Group, Topology

MEASURED = "measured"
ANCHORED = "measured, model beyond"
SCALED = "measured at another ranks per node, scaled by the model"
CATALOG = "catalog"
"""how a collective was priced (:meth:`MeasuredNetwork.seconds`)"""

Model = Callable[[float, Group], float]


@dataclass(frozen=True, slots=True)
class _Job:
    """One measured job size of a scope: its message sizes (log bytes) and bus bandwidths (bytes/s)."""

    ranks: int
    log_bytes: tuple[float, ...]
    busbw: tuple[float, ...]

    def inside(self, log_s: float) -> bool:
        return self.log_bytes[0] <= log_s <= self.log_bytes[-1]

    def interp(self, log_s: float) -> float:
        """The bus bandwidth at ``log_s`` inside the measured sizes (linear in log bytes)."""
        xs, ys = self.log_bytes, self.busbw
        i = bisect.bisect_right(xs, log_s)
        if i <= 0:
            return ys[0]
        if i >= len(xs):
            return ys[-1]
        x0, x1 = xs[i - 1], xs[i]
        w = (log_s - x0) / (x1 - x0)
        return ys[i - 1] + w * (ys[i] - ys[i - 1])


class MeasuredNetwork:
    """The measured bus bandwidths of one cluster, as tables per (collective, ranks per node)."""

    def __init__(self, rows: Iterable[Row], gpus_per_node: int) -> None:
        self.gpn = gpus_per_node
        points: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
        for coll, ranks, per_node, nbytes, busbw in rows:
            points.setdefault((coll, per_node, ranks), []).append((math.log(nbytes), busbw * 1e9))
        scopes: dict[tuple[str, int], list[_Job]] = {}
        for (coll, per_node, ranks), pts in sorted(points.items()):
            pts.sort()
            job = _Job(ranks, tuple(p[0] for p in pts), tuple(p[1] for p in pts))
            scopes.setdefault((coll, per_node), []).append(job)
        self.scopes = {k: tuple(v) for k, v in scopes.items()}
        """per (collective, ranks per node) the measured jobs, by ranks"""
        self._scopes_for: dict[tuple[str, int, bool], tuple[tuple[_Job, ...], int]] = {}
        self._memo: dict[tuple[str, float, int, int], tuple[float, str]] = {}

    def collectives(self) -> tuple[str, ...]:
        return tuple(c for c in COLLECTIVES if any(k[0] == c for k in self.scopes))

    def _group(self, ranks: int, per_node: int) -> Group:
        """A group of ``ranks`` with ``per_node`` of them on each node (as the model places groups)."""
        return Group(ranks, max(1, self.gpn // per_node))

    def _job_seconds(self, coll: str, job: _Job, per_node: int, nbytes: float, model: Model) -> float:
        """A measured job's time for ``nbytes``: interpolated inside its sizes, the model anchored at its
        smallest/largest size outside."""
        log_s = math.log(nbytes)
        if job.inside(log_s):
            return nbytes * bus_factor(coll, job.ranks) / job.interp(log_s)
        edge_log = job.log_bytes[0] if log_s < job.log_bytes[0] else job.log_bytes[-1]
        edge = math.exp(edge_log)
        g = self._group(job.ranks, per_node)
        at_edge = edge * bus_factor(coll, job.ranks) / job.interp(edge_log)
        return model(nbytes, g) * at_edge / model(edge, g)

    def seconds(self, coll: str, nbytes: float, g: Group, topo: Topology, model: Model) -> tuple[float, str]:
        """The time of ``coll`` of ``nbytes`` over ``g`` and how it was priced (:data:`MEASURED`, ...);
        ``model`` is the catalog's price of the same collective (memoised: the same call, the same price)."""
        key = (coll, nbytes, g.size, g.inner)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._seconds(coll, nbytes, g, topo, model)
        return hit

    def _seconds(self, coll: str, nbytes: float, g: Group, topo: Topology, model: Model) -> tuple[float, str]:
        n = g.size
        if n <= 1 or nbytes <= 0:
            return 0.0, CATALOG
        per_node = topo.members_per_node(g)
        jobs, scope_k = self._scope(coll, per_node, topo.intra(g))
        if not jobs:
            return model(nbytes, g), CATALOG
        if scope_k == per_node and jobs[0].ranks <= n <= jobs[-1].ranks:
            return self._interp_ranks(coll, jobs, per_node, nbytes, n, model), MEASURED
        job = min(jobs, key=lambda j: abs(math.log(j.ranks / n)))
        ref = self._group(job.ranks, scope_k)
        ratio = self._job_seconds(coll, job, scope_k, nbytes, model) / model(nbytes, ref)
        return model(nbytes, g) * ratio, ANCHORED if scope_k == per_node else SCALED

    def _scope(self, coll: str, per_node: int, intra: bool) -> tuple[tuple[_Job, ...], int]:
        """The measured jobs that price a group of ``per_node`` ranks per node on this side of the node
        boundary, and their scope: its own when measured there, else the nearest measured ranks per node
        (none: the catalog)."""
        key = (coll, per_node, intra)
        hit = self._scopes_for.get(key)
        if hit is None:

            def side(k: int) -> tuple[_Job, ...]:
                return tuple(j for j in self.scopes.get((coll, k), ()) if (j.ranks <= k) == intra)

            if side(per_node):
                hit = (side(per_node), per_node)
            else:
                near = sorted(
                    (abs(math.log(k / per_node)), k) for c, k in self.scopes if c == coll and side(k)
                )
                hit = (side(near[0][1]), near[0][1]) if near else ((), per_node)
            self._scopes_for[key] = hit
        return hit

    def _interp_ranks(
        self, coll: str, jobs: tuple[_Job, ...], per_node: int, nbytes: float, n: int, model: Model
    ) -> float:
        """Between two measured job sizes: the bus bandwidth linear in log(ranks)."""
        ranks = [j.ranks for j in jobs]
        i = bisect.bisect_left(ranks, n)
        if ranks[i] == n:
            return self._job_seconds(coll, jobs[i], per_node, nbytes, model)
        lo, hi = jobs[i - 1], jobs[i]
        bw_lo = nbytes * bus_factor(coll, lo.ranks) / self._job_seconds(coll, lo, per_node, nbytes, model)
        bw_hi = nbytes * bus_factor(coll, hi.ranks) / self._job_seconds(coll, hi, per_node, nbytes, model)
        w = math.log(n / lo.ranks) / math.log(hi.ranks / lo.ranks)
        return nbytes * bus_factor(coll, n) / (bw_lo + w * (bw_hi - bw_lo))


def study_topology(spec: StudySpec, k: FamilyConstants | None = None) -> Topology:
    """The study's collective model: the catalog's, with its GPU family's efficiencies (or ``k``'s: a hardware
    profile's), and the cluster's measured collectives (``cluster.network``) where it has them."""
    c = spec.cluster
    k = k or family_constants(c.gpu)
    rows = measured_rows(spec)
    net = MeasuredNetwork(rows, c.gpus_per_node) if rows else None
    return Topology(c.gpu, c.gpus_per_node, k.coll_eff, k.a2a_eff, k.a2a_inter_eff, measured=net)


def measured_rows(spec: StudySpec) -> list[Row]:
    """The collectives measured on this cluster: ``cluster.network``'s rows, and the hardware profile's own-node
    ones (``calibrate``: all ranks on one node) for each (collective, ranks per node) scope the network file
    does not measure."""
    c = spec.cluster
    rows: list[Row] = list(c.network.rows) if c.network is not None else []
    profile = c.profile
    if profile is None:
        return rows
    have = {(r[0], r[2]) for r in rows}
    rows += [
        (p.op, p.ranks, p.ranks, float(p.bytes), p.busbw_gbs)
        for p in profile.collectives.points
        if (p.op, p.ranks) not in have and p.ranks <= c.gpus_per_node and p.busbw_gbs > 0
    ]
    return rows
