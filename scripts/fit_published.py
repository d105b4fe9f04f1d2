"""Published runs against the step-time model: fit the GPU families' GEMM constants on one part of the rows,
report on the part held back.

    python scripts/fit_published.py          # report with the constants in physics/calibration.py
    python scripts/fit_published.py --fit    # grid-search each family's constants on its fitting rows first
    python scripts/fit_published.py --fit --family blackwell_ultra   # only that family

Data: tests/data/published-runs.csv (sources in its `source` column); only rows the model can express
(tests/helpers/published.py). Each family's rows, ordered by (release, label), alternate between the fitting
part (even positions) and the held-back part (odd positions). Fitted per family: the linear-GEMM peak
fraction and the grouped-GEMM multiplier (``grouped_gemm_eff``; a family in ``GROUPED_FROM`` takes another's),
jointly on dense and MoE rows, minimising the mean absolute iteration-time error without any scale; per vendor
(one grouped-GEMM implementation) the fixed cost per local expert (``grouped_expert_us``), jointly over that
vendor's families.

Reported on the held-back rows: the iteration-time error without any scale, and after one scale per
(release, family) fitted on that group's fitting rows (software releases move throughput a lot). Also
reported, as multi-node dense data that no fit here or in scripts/fit_vtrain.py sees: Narayanan et al. 2021
Table 1 (32-1920 A100s) and Korthikanti et al. 2022 Table 5 (8-512 A100s) from
shared/reference/validation.md, without any scale.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.physics import calibration  # noqa: E402
from primus_optuna.physics.fidelity import spearman  # noqa: E402
from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from tests.helpers.published import Published, load_published  # noqa: E402


def split(rows: list[Published]) -> tuple[list[Published], list[Published]]:
    """(fitting, held-back): per family, alternate rows ordered by (release, label); report-only rows (models
    that joined after the fit, ``Published.report_only``) are always held back."""
    fit, held = [], []
    by_family: dict[str, list[Published]] = defaultdict(list)
    for p in rows:
        if p.report_only:
            held.append(p)
        else:
            by_family[p.family].append(p)
    for fam_rows in by_family.values():
        for i, p in enumerate(sorted(fam_rows, key=lambda p: (p.release, p.label))):
            (fit if i % 2 == 0 else held).append(p)
    return fit, held


def estimate(p: Published, fam: calibration.FamilyConstants | None = None) -> float:
    """Estimated tokens/s/GPU of ``p`` (with ``fam`` as its family's constants)."""
    saved = calibration.FAMILIES[p.family]
    if fam is not None:
        calibration.FAMILIES[p.family] = fam
    try:
        return estimate_throughput(p.spec.model_copy(), p.config).tokens_per_s_per_gpu
    finally:
        calibration.FAMILIES[p.family] = saved


def time_error(est: float, measured: float, scale: float = 1.0) -> float:
    """Relative iteration-time error (estimated − measured) / measured; ``scale`` multiplies throughput."""
    return measured / (scale * est) - 1


PEAKS = (0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90)
"""linear-GEMM peak fractions scanned"""
GROUPED = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""grouped-GEMM multipliers scanned"""
PER_EXPERT_US = (0.0, 10.0, 25.0, 50.0)
"""fixed costs per local expert and grouped GEMM scanned (µs)"""
VENDOR_KERNELS = {
    "hopper": "nvidia",
    "blackwell": "nvidia",
    "blackwell_ultra": "nvidia",
    "cdna3": "amd",
    "cdna4": "amd",
}
"""families that share one grouped-GEMM implementation (TE GroupedLinear/cuBLAS on NVIDIA, hipBLASLt on AMD):
the per-expert cost is fitted jointly over them"""
FAMILIES = tuple(VENDOR_KERNELS)
"""the families fitted here, in fitting order (a ``GROUPED_FROM`` source before the families it gives to)"""


GROUPED_FROM = {"blackwell_ultra": "blackwell"}
"""families that run another family's grouped-GEMM kernels on the same tensor cores (B300/GB300: B200/GB200's
TE/cuBLAS grouped GEMMs and the CuTe-DSL fused MLP, compute capability 10): they take its grouped multiplier
and only their peak fraction is fitted (a power limit and clocks move the peak, not the kernels' relative
efficiency)"""


def _fit_one(
    family: str, rows: list[Published], per_expert: float, grouped_fixed: float | None = None
) -> tuple[float, calibration.FamilyConstants]:
    """``grouped_fixed``: the grouped multiplier to keep (a family in :data:`GROUPED_FROM`)."""
    base = calibration.FAMILIES[family]
    best = (math.inf, base)
    has_moe = any(p.spec.model.is_moe for p in rows)
    if grouped_fixed is not None:
        grid: tuple[float, ...] = (grouped_fixed,)
    else:
        grid = GROUPED if has_moe else (base.grouped_gemm_eff,)
    for peak, grouped in itertools.product(PEAKS, grid):
        fam = dataclasses.replace(
            base,
            gemm=dataclasses.replace(base.gemm, peak_fraction=peak),
            grouped_gemm_eff=grouped,
            grouped_expert_us=per_expert if has_moe else base.grouped_expert_us,
        )
        val = statistics.fmean(abs(time_error(estimate(p, fam), p.measured_tps)) for p in rows)
        if val < best[0]:
            best = (val, fam)
    return best


def fit_families(fit: list[Published], only: tuple[str, ...] = ()) -> dict[str, calibration.FamilyConstants]:
    """Per family the peak fraction and grouped multiplier; per vendor the per-expert cost (the sum of the
    families' fitting-row MAE is minimised over it). ``only``: fit just these families, each with its vendor's
    per-expert cost as it stands (the other families keep their constants)."""
    out: dict[str, calibration.FamilyConstants] = {}
    for vendor in sorted(set(VENDOR_KERNELS.values())):
        fams = [f for f in FAMILIES if VENDOR_KERNELS[f] == vendor and (not only or f in only)]
        if not fams:
            continue
        best: tuple[float, dict] = (math.inf, {})
        kept = {calibration.FAMILIES[f].grouped_expert_us for f in fams}
        for per_expert in sorted(kept) if only else PER_EXPERT_US:
            got: dict[str, tuple[float, calibration.FamilyConstants]] = {}
            for f in fams:  # FAMILIES order: a GROUPED_FROM source is fitted before the families it gives to
                src = GROUPED_FROM.get(f)
                fixed = None
                if src is not None:
                    fixed = (got[src][1] if src in got else calibration.FAMILIES[src]).grouped_gemm_eff
                got[f] = _fit_one(f, [p for p in fit if p.family == f], per_expert, fixed)
            total = sum(v for v, _ in got.values())
            if total < best[0]:
                best = (total, got)
        for f, (val, fam) in best[1].items():
            n = sum(p.family == f for p in fit)
            print(
                f"fitted {f} on {n} rows: gemm peak_fraction {fam.gemm.peak_fraction:.2f}, grouped_gemm_eff "
                f"{fam.grouped_gemm_eff:.2f}, grouped_expert_us {fam.grouped_expert_us:.0f} (fitting-row MAE "
                f"{val:.1%})"
            )
            out[f] = fam
    return out


def calibrated_errors() -> dict[tuple[str, str], tuple[float, list[tuple[str, float, float, float, float]]]]:
    """All rows, one scale per (release, family) from the group's own rows (tests/physics/
    test_published_step_time.py): {(release, family): (scale, [(label, estimated, measured, raw throughput
    error, error after scale)])}"""
    groups: dict = defaultdict(list)
    for p in load_published():
        groups[(p.release, p.family)].append((p.label, estimate(p), p.measured_tps))
    out = {}
    for key, rows in groups.items():
        scale = math.exp(statistics.fmean(math.log(m / e) for _, e, m in rows))
        out[key] = (scale, [(lab, e, m, e / m - 1, scale * e / m - 1) for lab, e, m in rows])
    return out


def held_back_report(fit: list[Published], held: list[Published]) -> None:
    est = {id(p): estimate(p) for p in fit + held}
    scale: dict[tuple[str, str], float] = {}
    groups: dict[tuple[str, str], list[Published]] = defaultdict(list)
    for p in fit:
        groups[(p.release, p.family)].append(p)
    for key, rows in groups.items():
        scale[key] = math.exp(statistics.fmean(math.log(p.measured_tps / est[id(p)]) for p in rows))
    print(
        "| part | release | family | row | estimated | measured tok/s/GPU | error (no scale) | after scale |"
    )
    print("|---|---|---|---|---|---|---|---|")
    moe_in, moe_n = 0, 0
    raw_dense, raw_moe = [], []
    for part, rows in (("fit", fit), ("held", held)):
        for p in sorted(rows, key=lambda p: (p.family, p.release, p.label)):
            e = est[id(p)]
            s = scale.get((p.release, p.family))
            raw = time_error(e, p.measured_tps)
            cal = time_error(e, p.measured_tps, s) if s else None
            print(
                f"| {part} | {p.release} | {p.family} | {p.label} | {e:,.0f} | {p.measured_tps:,.0f} | "
                f"{raw:+.1%} | {'n/a' if cal is None else f'{cal:+.1%}'} |"
            )
            if part == "held":
                (raw_moe if p.spec.model.is_moe else raw_dense).append(abs(raw))
                if p.spec.model.is_moe and cal is not None:
                    moe_n += 1
                    moe_in += abs(cal) <= 0.10
    print()
    if raw_dense:
        print(
            f"held-back dense rows: iteration-time MAE without scale {statistics.fmean(raw_dense):.1%} ({len(raw_dense)} rows)"
        )
    if raw_moe:
        print(
            f"held-back MoE rows: iteration-time MAE without scale {statistics.fmean(raw_moe):.1%} ({len(raw_moe)} rows)"
        )
    print(
        f"held-back MoE rows within ±10% after their (release, family) scale from the fitting rows: {moe_in} of {moe_n}"
    )
    # the MI355X optimisation steps are one ranking group (one model, one batch, four configurations)
    steps = [p for p in fit + held if p.family == "cdna4"]
    if len(steps) > 2:
        rho = spearman([est[id(p)] for p in steps], [p.measured_tps for p in steps])
        print(f"MI355X DeepSeek-V2 steps (4 configurations, 2 of them fitted): Spearman {rho:.3f}")


def narayanan_korthikanti_report() -> None:
    """Multi-node dense A100 rows that no fit sees: iteration-time error without any scale."""
    from tests.physics import test_throughput_validation as v

    errs: list[tuple[int, float]] = []  # (GPUs, |error|)
    n_rows = len(v.NARAYANAN)
    print("\n| row | GPUs | estimated | published | iteration-time error (no scale) |")
    print("|---|---|---|---|---|")
    for r in v.NARAYANAN:
        got = v.narayanan_tflops(r)
        err = r[-1] / got - 1  # time ∝ 1 / TFLOP/s
        errs.append((r[7], abs(err)))
        print(f"| Narayanan 2021 {r[0]} (TFLOP/s/GPU) | {r[7]} | {got:.1f} | {r[-1]} | {err:+.1%} |")
    for r in v.KORTHIKANTI:
        full, sel = v.korthikanti_times(r)
        for kind, got, pub in (("full", full, r[-2]), ("SP+selective", sel, r[-1])):
            err = got / pub - 1
            errs.append((r[4] * r[5], abs(err)))
            print(f"| Korthikanti 2022 {r[0]} {kind} (s) | {r[4] * r[5]} | {got:.2f} | {pub} | {err:+.1%} |")
    multi = [e for gpus, e in errs if gpus > 8]  # Korthikanti 22B runs on one node
    k_multi = [e for gpus, e in errs[n_rows:] if gpus > 8]
    print(
        "\nmulti-node dense A100 (held back from every fit): iteration-time MAE without scale "
        f"{statistics.fmean(multi):.1%} ({len(multi)} rows: Narayanan "
        f"{statistics.fmean(e for _, e in errs[:n_rows]):.1%}, Korthikanti {statistics.fmean(k_multi):.1%}); "
        f"with the single-node 22B rows {statistics.fmean(e for _, e in errs):.1%} ({len(errs)})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--fit", action="store_true", help="grid-search each family's constants on its fitting rows"
    )
    ap.add_argument(
        "--family",
        action="append",
        choices=FAMILIES,
        default=[],
        help="with --fit: fit only this family (repeatable), at its vendor's per-expert cost as it stands",
    )
    args = ap.parse_args()
    rows = load_published()
    fit, held = split(rows)
    if args.fit:
        calibration.FAMILIES.update(fit_families(fit, tuple(args.family)))
    held_back_report(fit, held)
    narayanan_korthikanti_report()


if __name__ == "__main__":
    main()
