"""The error band of a throughput estimate: :func:`estimate_band` (one estimate) and :func:`ratio_band` (the
ratio of two estimates of one study, e.g. a best configuration over the baseline).

A band is relative: the measured tokens/s/GPU lies in ``[estimate × (1 + low), estimate × (1 + high)]`` for
≥ 80% of the held-back runs of the estimate's **regime** — GPU family, dense or MoE, one node or many — as
``scripts/fit_bands.py --write`` measured them (the data file ``error_bands.json`` beside this module: one
signed error, measured ÷ estimated tokens/s/GPU − 1, per held-back row, with the script, date and held-back
sets that produced it). A regime with fewer than :data:`MIN_ROWS` rows pools with the rows of its kind (each
family weighing alike), then of its scale, then all.

Two widenings on the optimistic side (the measured value lower) stand for what the held-back rows cannot
show: they ran on the reference clusters the catalog constants were fitted to. On a cluster the catalog was
not fitted to, estimates ran 1.3× optimistic on one node and 2-9× at 32-64 nodes (issue 38's measurement on a
cloud H100 cluster, figures in the data file's ``unseen_cluster``). So catalog constants without a measured
hardware profile widen the band to the one-node factor, and more than one node without a measured network
(``cluster.network``) widens it to a factor growing from the one-node factor to the worst stated one at 32
nodes (log-linear in nodes between the two figures the issue gives: an assumption, not a measurement).

Estimates under a study's step-time calibration: :func:`calibration_band` (its leave-one-out residuals).
With a study's own measured trials, :func:`residual_band` replaces the held-back band: the 80% quantile of the
study's own estimate errors (the estimates are judged on the cluster they are for), and
:func:`residual_ratio_band` the ratio band (the same quantile over the pairs of those trials).

The ratio of two configurations of one study: both share the cluster, the kernels and the constants, so
their errors are correlated and the ratio's band is narrower where it was measured: the held-back ratio
errors of the pairs of one vTrain group (one node, one model and batch) and, across nodes, of the pairs of
held-back rows of one published release and GPU family or of one paper (different models: a conservative
stand-in for two configurations of one model).
On a network not measured no pair was measured (the issue reports rank correlation down to 0.43 there): the
ratio takes the absolute band. :func:`gain_inside_band` says whether a gain could be the band's error alone;
:func:`gain_verdict` says it in words.

Example::

    b = estimate_band(spec)
    b.describe(5259.0)   # '5,259 tokens/s/GPU −76%/+13% (catalog constants, ..., network not measured; ...)'
    lo, hi = b.bounds(5259.0)
    gain_inside_band(0.146, ratio_band(spec))   # True: the baseline may be as fast
    b.low, b.high, b.source, b.regime.key
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from ..spec import StudySpec
from .calibration import Calibration, gpu_family
from .throughput import estimate_throughput

DATA = Path(__file__).with_name("error_bands.json")
"""The held-back errors (written by ``scripts/fit_bands.py --write``)."""
COVERAGE = 0.8
"""the share of held-back rows a band must hold"""
FLOOR = 0.05
"""the narrowest band on either side (chosen, not measured: a regime's held-back rows are too few to support a
narrower one, and a run's own measurement spreads by a few percent)"""
MIN_ROWS = 5
"""rows (or measured trials) a regime needs for its own quantile"""

Constants = Literal["catalog", "profile"]


@dataclass(frozen=True)
class Regime:
    """What an estimate's error depends on: GPU family, dense/MoE, one node or many, where the constants and
    the network figures come from."""

    family: str
    moe: bool
    multi_node: bool
    constants: Constants = "catalog"
    network_measured: bool = False

    @property
    def key(self) -> str:
        """e.g. ``hopper moe multi-node, catalog constants, network not measured``"""
        scale = "multi-node" if self.multi_node else "one node"
        out = f"{self.family} {'moe' if self.moe else 'dense'} {scale}, {self.constants} constants"
        if self.multi_node:
            out += ", network measured" if self.network_measured else ", network not measured"
        return out


@dataclass(frozen=True)
class Band:
    """A relative error band: the measured value lies in ``[v × (1 + low), v × (1 + high)]``."""

    low: float
    """≤ 0: the optimistic side (measured below the estimate)"""
    high: float
    """≥ 0"""
    source: str
    """where the figures come from, short (printed in parentheses)"""
    regime: Regime
    rows: int
    """held-back rows (or measured trials) behind it"""
    quantile: float
    """the 80% quantile of ``|error|`` of those rows (floored), before any widening for an unseen cluster"""

    def bounds(self, value: float) -> tuple[float, float]:
        return value * (1 + self.low), value * (1 + self.high)

    def contains(self, estimate: float, measured: float) -> bool:
        lo, hi = self.bounds(estimate)
        return lo <= measured <= hi

    def text(self) -> str:
        """``±12%`` when symmetric (to the percent), else ``−76%/+12%``."""
        lo, hi = round(-self.low * 100), round(self.high * 100)
        return f"±{hi}%" if lo == hi else f"\u2212{lo}%/+{hi}%"

    def describe(self, value: float, unit: str = "tokens/s/GPU") -> str:
        """``5,259 tokens/s/GPU ±12% (catalog constants, ...)``"""
        return f"{value:,.0f} {unit} {self.text()} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["text"] = self.text()
        d["regime"]["key"] = self.regime.key
        return d


@cache
def band_table() -> dict[str, Any]:
    """The data file: ``rows`` (held-back errors), ``ratio`` (held-back ratio errors by scale),
    ``unseen_cluster`` (the issue's figures) and the provenance of each."""
    return json.loads(DATA.read_text())


def quantile_abs(
    errors: Sequence[float], weights: Sequence[float] | None = None, q: float = COVERAGE
) -> float:
    """The smallest ``|e|`` such that the rows with ``|error| ≤ |e|`` weigh at least ``q`` of the total."""
    w = list(weights) if weights is not None else [1.0] * len(errors)
    pairs = sorted(zip((abs(e) for e in errors), w, strict=True))
    total, acc = sum(w), 0.0
    for v, wt in pairs:
        acc += wt
        if acc >= q * total - 1e-12:
            return v
    return pairs[-1][0]


def _pool(rows: list[dict[str, Any]], regime: Regime) -> tuple[list[dict[str, Any]], str]:
    """The rows of the narrowest level with :data:`MIN_ROWS` rows, and its words."""
    kind = "MoE" if regime.moe else "dense"
    scale = "multi-node" if regime.multi_node else "one-node"
    levels = (
        (
            lambda r: (
                r["family"] == regime.family
                and r["moe"] == regime.moe
                and r["multi_node"] == regime.multi_node
            ),
            f"{regime.family} {kind} {scale} rows",
        ),
        (
            lambda r: r["moe"] == regime.moe and r["multi_node"] == regime.multi_node,
            f"{kind} {scale} rows of every GPU family",
        ),
        (lambda r: r["multi_node"] == regime.multi_node, f"{scale} rows of every GPU family"),
        (lambda r: True, "all rows"),
    )
    for match, words in levels:
        got = [r for r in rows if match(r)]
        if len(got) >= MIN_ROWS:
            return got, words
    return rows, "all rows"


def _family_weights(rows: list[dict[str, Any]]) -> list[float]:
    """Each family weighs alike in a pooled level (vTrain's hundreds of A100 rows count as one family)."""
    n: dict[str, int] = {}
    for r in rows:
        n[r["family"]] = n.get(r["family"], 0) + 1
    return [1.0 / n[r["family"]] for r in rows]


def unseen_optimism(nodes: int, one_node: bool) -> float:
    """The factor by which an estimate may be optimistic on a cluster the catalog was not fitted to:
    the one-node figure, growing log-linearly in nodes to the worst stated figure at its node count
    (``one_node``: only the one-node part applies, the network being measured)."""
    u = band_table()["unseen_cluster"]
    f1, fw, nw = float(u["one_node"]), float(u["worst"]), int(u["worst_at_nodes"])
    if one_node or nodes <= 1:
        return f1
    return f1 * (fw / f1) ** min(math.log(nodes) / math.log(nw), 1.0)


def regime_of(
    spec: StudySpec,
    constants: Constants | None = None,
    network_measured: bool | None = None,
    nodes: int | None = None,
) -> Regime:
    """The regime of ``spec``'s estimates (at ``nodes`` nodes instead of the study's when given);
    ``constants`` / ``network_measured`` default to what the study attaches (``cluster.profile``,
    ``cluster.network`` where the spec has them)."""
    if constants is None:
        constants = "profile" if getattr(spec.cluster, "profile", None) else "catalog"
    if network_measured is None:
        network_measured = bool(getattr(spec.cluster, "network", None))
    return Regime(
        gpu_family(spec.cluster.gpu),
        spec.model.is_moe,
        (nodes or spec.cluster.nodes) > 1,
        constants,
        network_measured,
    )


def estimate_band(
    spec: StudySpec,
    *,
    constants: Constants | None = None,
    network_measured: bool | None = None,
    nodes: int | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
) -> Band:
    """The band of ``spec``'s throughput estimates (any configuration: the regime is the study's) from the
    held-back errors of its regime, widened for what they cannot show (module docstring). ``constants`` /
    ``network_measured`` override what the study attaches; ``nodes``: the band at that many nodes of the
    study's cluster instead of its own (capacity planning); ``rows``: held-back rows to use instead of the data
    file's (cross-validation)."""
    nodes = nodes or spec.cluster.nodes
    regime = regime_of(spec, constants, network_measured, nodes)
    pooled, words = _pool(list(band_table()["rows"] if rows is None else rows), regime)
    q = max(quantile_abs([r["error"] for r in pooled], _family_weights(pooled)), FLOOR)
    low, high = -q, q
    parts = [f"{regime.constants} constants"]
    f = 1.0
    if regime.constants == "catalog":  # the node's kernels: 1.3x on one node of an unseen cluster
        f = unseen_optimism(1, one_node=True)
        parts.append("not calibrated to this cluster")
    if regime.multi_node and not regime.network_measured:  # the network's part beyond one node
        f *= unseen_optimism(nodes, one_node=False) / unseen_optimism(1, one_node=True)
        parts.append("network not measured")
    elif regime.multi_node:
        parts.append("network measured")
    low = min(low, 1 / f - 1)
    source = f"{', '.join(parts)}; held-back error \u00b1{q:.0%} ({words})"
    if low < -q:
        source += f"; up to {1 / (1 + low):.1f}\u00d7 optimistic on a cluster the catalog was not fitted to"
    return Band(low, high, source, regime, len(pooled), q)


def residual_band(errors: Iterable[float], regime: Regime, what: str = "measured trials") -> Band | None:
    """The band of the study's own measured errors (measured ÷ estimated − 1, one per trial): the 80% quantile
    of ``|error|`` on each side of zero; ``None`` below :data:`MIN_ROWS` trials."""
    errs = list(errors)
    if len(errs) < MIN_ROWS:
        return None
    q = max(quantile_abs(errs), FLOOR)
    return Band(-q, q, f"error of this study's {len(errs)} {what}", regime, len(errs), q)


def calibration_band(spec: StudySpec, pairs: Sequence[tuple[Any, float]]) -> Band | None:
    """The band of estimates under the study's step-time calibration, from ``pairs`` of (configuration,
    measured tokens/s/GPU): leave-one-out — each trial estimated with the :class:`Calibration` fitted on the
    others (in-sample residuals would flatter it) — the 80% quantile of ``|measured ÷ estimate − 1|``;
    ``None`` below :data:`MIN_ROWS` trials."""
    if len(pairs) < MIN_ROWS:
        return None
    raw = [(estimate_throughput(spec, c), m) for c, m in pairs]
    errs = []
    for i, (config, measured) in enumerate(pairs):
        cal = Calibration.fit([p for j, p in enumerate(raw) if j != i])
        errs.append(measured / estimate_throughput(spec, config, cal).tokens_per_s_per_gpu - 1)
    q = max(quantile_abs(errs), FLOOR)
    what = f"leave-one-out error of the step-time calibration on this study's {len(pairs)} measured trials"
    return Band(-q, q, what, regime_of(spec), len(pairs), q)


def residual_ratio_band(
    errors: Iterable[float], regime: Regime, what: str = "measured trials"
) -> Band | None:
    """The band of the ratio of two estimates from the study's own measured errors: the 80% quantile of
    ``|(1 + e_i) / (1 + e_j) − 1|`` over the pairs of trials; ``None`` below :data:`MIN_ROWS` trials."""
    errs = list(errors)
    if len(errs) < MIN_ROWS:
        return None
    q = max(quantile_abs(pair_ratio_errors(errs)), FLOOR)
    return Band(-q, q, f"ratio error of the pairs of this study's {len(errs)} {what}", regime, len(errs), q)


def pair_ratio_errors(errors: Sequence[float]) -> list[float]:
    """``(1 + e_i) / (1 + e_j) − 1`` over the pairs ``i < j``: the error of the estimated ratio of two rows."""
    return [(1 + a) / (1 + b) - 1 for a, b in itertools.combinations(errors, 2)]


def ratio_band(
    spec: StudySpec,
    *,
    constants: Constants | None = None,
    network_measured: bool | None = None,
    nodes: int | None = None,
) -> Band:
    """The band of the ratio of two estimates of ``spec``'s study (module docstring): the held-back ratio
    errors of its scale where measured, else the absolute band (arguments as :func:`estimate_band`)."""
    absolute = estimate_band(spec, constants=constants, network_measured=network_measured, nodes=nodes)
    regime = absolute.regime
    if regime.multi_node and not regime.network_measured:
        return Band(
            absolute.low,
            absolute.high,
            "no ratio measured on a network not measured: the estimate's own band",
            regime,
            absolute.rows,
            absolute.quantile,
        )
    entry = band_table()["ratio"]["multi_node" if regime.multi_node else "one_node"]
    if entry["pairs"] < MIN_ROWS:
        return absolute
    q = max(float(entry["abs_q80"]), FLOOR)
    return Band(-q, q, f"held-back error of the ratio of {entry['what']}", regime, int(entry["pairs"]), q)


def gain_inside_band(gain: float, band: Band) -> bool:
    """Whether the measured ratio ``(1 + gain) × (1 + e)`` can reach 1 for an error ``e`` in ``band``: the
    gain could be the estimate's error alone."""
    return (1 + gain) * (1 + band.low) <= 1 <= (1 + gain) * (1 + band.high)


def gain_verdict(gain: float, band: Band) -> str:
    """How an estimated gain reads against the band of a ratio of two estimates, in the words every surface
    prints: ``a −48%/+13% error of the ratio of two estimates could undo it`` (:func:`gain_inside_band`), or
    ``more than a ±5% error of the ratio of two estimates could undo``."""
    if gain_inside_band(gain, band):
        return f"a {band.text()} error of the ratio of two estimates could undo it"
    return f"more than a {band.text()} error of the ratio of two estimates could undo"


__all__ = [
    "Band",
    "Regime",
    "band_table",
    "calibration_band",
    "estimate_band",
    "gain_inside_band",
    "gain_verdict",
    "pair_ratio_errors",
    "quantile_abs",
    "ratio_band",
    "regime_of",
    "residual_band",
    "residual_ratio_band",
    "unseen_optimism",
]
