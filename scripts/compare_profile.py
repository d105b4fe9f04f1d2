"""Compare a hardware profile's measured curves with the catalog's constants for that GPU (the figures the step-time
model uses without a profile): GEMM rate at several sizes and the fitted peak fraction / half-work, the FP8 and
grouped-GEMM ratios, flash-attention forward/backward rates over keys per query, the memory-bound kernels'
bandwidth and fixed cost, and the caching allocator's reserve against the memory model's FRAGMENTATION.

python scripts/compare_profile.py PROFILE.yaml [--gpu h100]     # --gpu: default from the profile's device name

Used by scripts/gpu_calibrate_check.sh on an H100/H200; tested on synthetic profiles
(tests/physics/test_compare_profile.py).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from primus_optuna.physics.calibration import family_constants, gpu_family  # noqa: E402
from primus_optuna.physics.gemm_efficiency import attention_width_factor  # noqa: E402
from primus_optuna.physics.measured import MeasuredCurve  # noqa: E402
from primus_optuna.physics.memory import FRAGMENTATION  # noqa: E402
from primus_optuna.spec.hardware import GPU_CATALOG, GPUSpec, gpu_key  # noqa: E402
from primus_optuna.spec.profile import HardwareProfile, load_profile  # noqa: E402

Row = tuple[str, float | None, float | None, str]
"""(what, measured, catalog, unit)"""


def catalog_gpu(profile: HardwareProfile, name: str | None = None) -> GPUSpec:
    """The catalog GPU to compare with: ``name``, else the first catalog name found in the device's name."""
    if name:
        return GPU_CATALOG[gpu_key(name)]
    device = profile.device.name.lower()
    for key in sorted(GPU_CATALOG, key=len, reverse=True):
        if key in device.replace(" ", ""):
            return GPU_CATALOG[key]
    raise SystemExit(f"no catalog GPU in the device name {profile.device.name!r}; pass --gpu")


def gemm_rows(profile: HardwareProfile, gpu: GPUSpec) -> list[Row]:
    k = family_constants(gpu)
    peak = gpu.bf16_tflops * 1e12
    dtype = profile.compute_dtype
    plain = profile.gemm_points(dtype)
    rows: list[Row] = []
    if not plain:
        return rows
    curve = MeasuredCurve([(p.work, p.tflops * 1e12) for p in plain], peak, "profile")
    buckets: dict[int, list[float]] = {}
    for p in plain:  # the measured points by decade of work: the median of each against the catalog's there
        buckets.setdefault(math.floor(math.log10(p.work)), []).append(p.work)
    for e, works in sorted(buckets.items()):
        meas = statistics.median(curve.rate(w) for w in works)
        cat = statistics.median(peak * k.gemm.fraction(w) for w in works)
        rows.append(
            (
                f"{dtype} GEMM, 1e{e}-1e{e + 1} multiply-adds ({len(works)})",
                meas / 1e12,
                cat / 1e12,
                "TFLOP/s",
            )
        )
    fit = profile.fitted.gemm.get(dtype)
    if fit is not None:
        rows.append(
            (f"{dtype} GEMM peak fraction (fitted)", fit.peak_tflops * 1e12 / peak, k.gemm.peak_fraction, "")
        )
        rows.append((f"{dtype} GEMM half-work (fitted)", fit.half, k.gemm.half_size, "multiply-adds"))
    by_shape = {(p.m, p.n, p.k): p.tflops for p in plain}
    fp8 = [
        p.tflops / by_shape[(p.m, p.n, p.k)]
        for p in profile.gemm_points("fp8")
        if (p.m, p.n, p.k) in by_shape
    ]
    if fp8:
        rows.append(
            (f"FP8 / {dtype} GEMM speed-up (median)", sorted(fp8)[len(fp8) // 2], k.fp8_gemm_speedup, "x")
        )
    grouped = profile.gemm_points(dtype, grouped=True)
    if grouped:
        ratios = sorted(p.tflops * 1e12 / curve.rate(p.work) for p in grouped)
        rows.append(("grouped / plain GEMM rate (median)", ratios[len(ratios) // 2], k.grouped_gemm_eff, "x"))
    return rows


def attention_rows(profile: HardwareProfile, gpu: GPUSpec) -> list[Row]:
    k = family_constants(gpu)
    peak = gpu.bf16_tflops * 1e12
    rows: list[Row] = []
    for d in sorted({p.head_dim for p in profile.attention}):
        pts = [p for p in profile.attention if p.head_dim == d]
        fwd = MeasuredCurve([(p.span, p.fwd_tflops * 1e12) for p in pts], peak, "")
        bwd = MeasuredCurve([(p.span, p.bwd_tflops * 1e12) for p in pts], peak, "")
        width = attention_width_factor(d)
        for span in sorted({p.span for p in pts}):
            cat = peak * k.attention.fraction(span) * width
            rows.append(
                (
                    f"attention fwd, head {d}, {span:g} keys/query",
                    fwd.rate(span) / 1e12,
                    cat / 1e12,
                    "TFLOP/s",
                )
            )
            rows.append(
                (
                    f"attention bwd, head {d}, {span:g} keys/query",
                    bwd.rate(span) / 1e12,
                    cat * k.attention_bwd_rate / 1e12,
                    "TFLOP/s",
                )
            )
    return rows


def memory_rows(profile: HardwareProfile, gpu: GPUSpec) -> list[Row]:
    k = family_constants(gpu)
    rows: list[Row] = []
    mem = profile.fitted.memory
    if mem is not None:
        rows.append(
            ("memory-bound kernels bandwidth", mem.bandwidth_gbs, gpu.hbm_bw_tbs * 1e3 * k.hbm_eff, "GB/s")
        )
        rows.append(("memory-bound kernel fixed cost", mem.kernel_us, k.kernel_us, "us"))
    a = profile.allocator
    if a.applicable and a.allocated_gib and a.reserved_gib:
        over = (a.reserved_gib - a.allocated_gib) / a.allocated_gib
        rows.append(("allocator: reserved beyond allocated / allocated", over, FRAGMENTATION, ""))
    else:
        rows.append(("allocator reserve", None, FRAGMENTATION, f"not measured: {a.reason}"))
    return rows


def comparison(profile: HardwareProfile, gpu: GPUSpec) -> list[Row]:
    """Every row: measured value, the catalog's, their unit."""
    return gemm_rows(profile, gpu) + attention_rows(profile, gpu) + memory_rows(profile, gpu)


def format_rows(rows: list[Row]) -> list[str]:
    out = [f"{'what':<52} {'measured':>12} {'catalog':>12} {'ratio':>7}  unit"]
    for what, meas, cat, unit in rows:
        m = "-" if meas is None else f"{meas:12.4g}"
        c = "-" if cat is None else f"{cat:12.4g}"
        r = f"{meas / cat:7.2f}" if meas is not None and cat else "      -"
        out.append(f"{what:<52} {m:>12} {c:>12} {r}  {unit}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--gpu", default=None, help="catalog GPU to compare with (default: from the device name)")
    args = ap.parse_args()
    profile = load_profile(args.profile)
    gpu = catalog_gpu(profile, args.gpu)
    d = profile.device
    print(
        f"{d.name} x{d.count} (torch {d.torch}, CUDA {d.cuda}, cuDNN {d.cudnn}) against catalog {gpu.name} "
        f"({gpu_family(gpu)} constants, {gpu.bf16_tflops:g} TFLOP/s BF16, {gpu.hbm_bw_tbs:g} TB/s); "
        f"{len(profile.gemm)} GEMMs, {len(profile.attention)} attention shapes in {profile.elapsed_s:.0f} s"
    )
    for line in format_rows(comparison(profile, gpu)):
        print(line)


if __name__ == "__main__":
    main()
