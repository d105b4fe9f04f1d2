"""Efficiency constants of the step-time model (one table per GPU family) and :class:`Calibration`, the
multiplicative correction of the estimate's terms fitted from measured trials.

Every constant below says where it comes from: a datasheet/paper figure, an assumption, or "fitted to" a
row of shared/reference/validation.md. A handful per family are fitted (GEMM and attention efficiency,
collective efficiency); the fits are coarse (one value per family across all its rows, never per row).

Example::

    cal = Calibration.fit([(estimate, 1450.0), (estimate2, 1380.0)])  # (estimate, measured tok/s/GPU)
    estimate_throughput(spec, config, calibration=cal)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..spec.hardware import GPUSpec

BREAKDOWN_TERMS: tuple[str, ...] = (
    "compute_attention",
    "compute_mlp",
    "compute_other",
    "recompute",
    "pipeline_bubble",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_comm",
    "dp_comm",
    "optimizer",
)
"""The step-time breakdown's keys (seconds per step; exposed parts only, they sum to the step time)."""

TERM_GROUPS: dict[str, tuple[str, ...]] = {
    "compute": ("compute_attention", "compute_mlp", "compute_other", "recompute", "optimizer"),
    "communication": ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm"),
    "pipeline_bubble": ("pipeline_bubble",),
}
"""Groups :meth:`Calibration.fit` fits one multiplier each for (with enough trials)."""


@dataclass(frozen=True, slots=True)
class FamilyConstants:
    """Achievable fractions of datasheet peaks for one GPU family."""

    gemm_eff_bf16: float
    """fraction of BF16 peak reached by large, well-shaped GEMMs"""
    gemm_eff_fp8: float
    """fraction of FP8 peak reached by large GEMMs (FP8 GEMMs never run slower than BF16 ones)"""
    attn_eff: float
    """fraction of BF16 peak reached by causal flash attention (forward and backward)"""
    grouped_gemm_eff: float
    """multiplier of the GEMM efficiency for MoE grouped GEMMs (several experts per kernel)"""
    gemm_dim_half: float = 128.0
    """GEMM dimension at which tile quantisation halves the efficiency (assumption: a 128-wide MFMA/tensor-core
    tile); efficiency = eff · d/(d + d_half) for the smallest of M, N, K"""
    hbm_eff: float = 0.8
    """fraction of HBM bandwidth reached by memory-bound kernels (assumption: STREAM-like kernels reach
    ~80% of datasheet bandwidth on both vendors)"""
    kernel_us: float = 4.0
    """fixed cost per kernel launch in µs (assumption: typical launch + tail effect)"""
    coll_eff: float = 0.8
    """collectives' fraction of link bandwidth for large messages (hardware.md: ~70-90%)"""
    a2a_eff: float = 0.6
    """NCCL/RCCL all-to-all fraction of link bandwidth (assumption: below ring collectives, many small
    point-to-point transfers)"""
    deepep_intra_eff: float = 0.77
    """DeepEP normal kernels intra-node: 153-158 GB/s on H800 NVLink (~200 GB/s per direction)
    (validation.md, DeepEP row)"""
    deepep_inter_eff: float = 0.9
    """DeepEP inter-node: 43-58 GB/s over a 50 GB/s CX7 NIC (validation.md, DeepEP row), capped at 0.9"""
    deepep_overlap: float = 0.5
    """fraction of DeepEP dispatch/combine hidden under expert computation (assumption from Primus's reported
    35%+ MoE gain, validation.md; never more than the expert compute time)"""
    moe_sync_us: float = 60.0
    """host synchronisation per MoE layer and pass of the all-to-all dispatcher (token counts copied to the
    host); DeepEP/sync-free MoE avoid it (assumption)"""
    cp_overlap: float = 0.8
    """fraction of the core-attention time under which ring-attention K/V exchange can hide (assumption:
    Megatron/TE overlap each ring step with the previous block's attention)"""
    tp_overlap: float = 0.0
    """fraction of TP all-gather/reduce-scatter hidden under GEMMs; 0 = Megatron's default (no
    --tp-comm-overlap)"""
    dp_tail: float = 0.1
    """fraction of the DP collectives that stays exposed even when overlapped (last bucket; assumption)"""
    flash_attention: bool = True
    """causal flash attention (skips masked blocks, no s² scores in HBM). False = Megatron's 2021-22 attention
    (full s² score GEMMs + fused scaled-masked softmax over materialised scores), which is what the only
    published A100 rows (Narayanan 2021, Korthikanti 2022) ran"""
    fitted_to: tuple[str, ...] = ()
    """which published rows the fitted constants above come from"""


# One table. The fitted constants were chosen by scanning a coarse grid (steps of 0.01-0.05) to minimise the
# worst relative error over the family's rows in validation.md; the tests (tests/physics/
# test_throughput_validation.py) state the resulting per-row errors.
FAMILIES: dict[str, FamilyConstants] = {
    # A100: fitted to Narayanan et al. 2021 Table 1 (8 rows) and Korthikanti et al. 2022 Table 5 (4 rows).
    "ampere": FamilyConstants(
        gemm_eff_bf16=0.70,
        gemm_eff_fp8=0.70,
        attn_eff=0.40,
        grouped_gemm_eff=0.8,
        coll_eff=0.8,
        flash_attention=False,
        fitted_to=("Narayanan 2021 Table 1", "Korthikanti 2022 Table 5"),
    ),
    # H100/H200: fitted to the four Megatron-Bridge H100 rows.
    "hopper": FamilyConstants(
        gemm_eff_bf16=0.62,
        gemm_eff_fp8=0.65,
        attn_eff=0.45,
        grouped_gemm_eff=0.8,
        coll_eff=0.8,
        fitted_to=("Megatron-Bridge H100: GPT-OSS-120B, Qwen3-235B-A22B, Llama3-70B, Llama3.1-405B",),
    ),
    # B200: no published row in validation.md; Hopper's fractions (assumption).
    "blackwell": FamilyConstants(
        gemm_eff_bf16=0.70,
        gemm_eff_fp8=0.55,
        attn_eff=0.45,
        grouped_gemm_eff=0.8,
        fitted_to=("assumed = hopper (no published B200 row)",),
    ),
    # MI300X/MI325X: fitted to the three Primus MI325X rows.
    "cdna3": FamilyConstants(
        gemm_eff_bf16=0.55,
        gemm_eff_fp8=0.40,
        attn_eff=0.35,
        grouped_gemm_eff=0.7,
        coll_eff=0.7,
        fitted_to=("Primus MI325X: Llama 3.1 8B FP8, 70B FP8, 70B BF16",),
    ),
    # MI355X: no published row in validation.md; CDNA3's fractions (assumption). hardware.md's "Mixtral 8x22B
    # BF16 on MI355X in the mid-30s % MFU" is checked as a sanity range in the tests.
    "cdna4": FamilyConstants(
        gemm_eff_bf16=0.55,
        gemm_eff_fp8=0.40,
        attn_eff=0.35,
        grouped_gemm_eff=0.7,
        coll_eff=0.7,
        fitted_to=("assumed = cdna3 (no published MI355X row); sanity: Mixtral 8x22B BF16 mid-30s % MFU",),
    ),
}

_BY_NAME = {
    "mi300x": "cdna3",
    "mi325x": "cdna3",
    "mi355x": "cdna4",
    "mi350x": "cdna4",
    "a100-80gb": "ampere",
    "a100": "ampere",
    "h100": "hopper",
    "h200": "hopper",
    "b200": "blackwell",
    "gb200": "blackwell",
}


def gpu_family(gpu: GPUSpec) -> str:
    """The family whose constants apply to ``gpu`` (by catalog name, else by vendor)."""
    name = gpu.name.lower()
    if name in _BY_NAME:
        return _BY_NAME[name]
    for key, fam in _BY_NAME.items():
        if name.startswith(key):
            return fam
    return "cdna3" if gpu.vendor == "amd" else "hopper"


def family_constants(gpu: GPUSpec) -> FamilyConstants:
    return FAMILIES[gpu_family(gpu)]


# --- calibration from measured trials ----------------------------------------------------------------------
_CLAMP = (0.25, 4.0)


@dataclass
class Calibration:
    """Multiplicative corrections of the estimate: one per breakdown term (default 1) times a global scale.

    ``Calibration()`` is the identity. :meth:`fit` derives the multipliers from measured trials;
    :meth:`apply` rescales a breakdown; :meth:`to_dict`/:meth:`from_dict` round-trip through JSON (Optuna
    study user attrs).
    """

    multipliers: dict[str, float] = field(default_factory=dict)
    scale: float = 1.0
    n_trials: int = 0

    @classmethod
    def identity(cls) -> Calibration:
        return cls()

    @property
    def is_identity(self) -> bool:
        return self.scale == 1.0 and all(v == 1.0 for v in self.multipliers.values())

    def factor(self, term: str) -> float:
        return self.scale * self.multipliers.get(term, 1.0)

    def apply(self, breakdown_s: Mapping[str, float]) -> dict[str, float]:
        """The breakdown with every term multiplied by its factor."""
        return {k: v * self.factor(k) for k, v in breakdown_s.items()}

    @classmethod
    def fit(cls, pairs: Iterable[tuple[Any, float]], *, ridge: float = 0.05) -> Calibration:
        """Fit from ``(estimate, measured tokens/s/GPU)`` pairs; ``estimate`` is a ThroughputEstimate or its
        ``breakdown_s`` dict (uncalibrated).

        The measured step time of each trial is ``Σ breakdown · estimate_tps / measured_tps``. With fewer than
        four trials one global scale is fitted (geometric mean of the ratios); with more, one multiplier per
        group of :data:`TERM_GROUPS` by ridge-regularised least squares on relative errors, shrunk towards the
        global scale and clamped to [0.25, 4].
        """
        rows: list[tuple[dict[str, float], float]] = []
        for est, measured in pairs:
            bd = dict(est.breakdown_s if hasattr(est, "breakdown_s") else est)
            if not measured or measured <= 0:
                continue
            step = sum(bd.values())
            if step <= 0:
                continue
            tps = getattr(est, "tokens_per_s_per_gpu", None)
            if tps is None:
                raise ValueError("a breakdown alone cannot be fitted: pass the ThroughputEstimate")
            rows.append((bd, step * tps / measured))
        if not rows:
            return cls()
        ratios = [meas / sum(bd.values()) for bd, meas in rows]
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        g = min(max(g, _CLAMP[0]), _CLAMP[1])
        if len(rows) < 4:
            return cls(scale=g, n_trials=len(rows))
        groups = list(TERM_GROUPS)
        n = len(groups)
        # normal equations of sum_i ((x_i . a - y_i)/y_i)^2 + ridge * n_rows * sum_g (a_g - g)^2
        ata = [[0.0] * n for _ in range(n)]
        aty = [0.0] * n
        for bd, meas in rows:
            x = [sum(bd.get(t, 0.0) for t in TERM_GROUPS[grp]) / meas for grp in groups]
            for i in range(n):
                aty[i] += x[i]
                for j in range(n):
                    ata[i][j] += x[i] * x[j]
        lam = ridge * len(rows)
        for i in range(n):
            ata[i][i] += lam
            aty[i] += lam * g
        sol = _solve(ata, aty)
        mult = {}
        for grp, a in zip(groups, sol, strict=True):
            a = min(max(a, _CLAMP[0]), _CLAMP[1])
            for t in TERM_GROUPS[grp]:
                mult[t] = a
        return cls(multipliers=mult, scale=1.0, n_trials=len(rows))

    def to_dict(self) -> dict[str, Any]:
        return {"multipliers": dict(self.multipliers), "scale": self.scale, "n_trials": self.n_trials}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Calibration:
        if not data:
            return cls()
        return cls(
            multipliers={str(k): float(v) for k, v in dict(data.get("multipliers", {})).items()},
            scale=float(data.get("scale", 1.0)),
            n_trials=int(data.get("n_trials", 0)),
        )


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (tiny systems)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-15:
            continue
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-15 else 0.0 for i in range(n)]
