"""Synthetic hardware profiles (what ``calibrate`` writes) with known rates, for tests of the profile's use."""

from __future__ import annotations

from typing import Any

from primus_optuna.physics.measured import fit_tables


def saturating(peak_tflops: float, half: float):
    return lambda size: peak_tflops * size / (size + half)


def synthetic_profile(
    gemm=saturating(0.2, 1e5),
    attention=saturating(0.05, 16.0),
    attention_bwd=None,
    memory_gbs: float = 40.0,
    kernel_us: float = 2.0,
    compute_dtype: str = "fp32",
    head_dims: tuple[int, ...] = (32, 64),
    kind: str = "cpu",
    name: str = "synthetic",
    gemm_shapes: list[tuple[int, int, int]] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A profile document whose GEMMs run at ``gemm(work)`` TFLOP/s, attention forward at ``attention(span)``
    (backward ``attention_bwd``, default the same) and memory-bound kernels at ``memory_gbs`` + ``kernel_us``."""
    attention_bwd = attention_bwd or attention
    shapes = gemm_shapes or [
        (m, n, k) for m in (64, 256, 1024) for n, k in ((128, 128), (512, 512), (1024, 1024))
    ]
    gemm_pts = []
    for m, n, k in shapes:
        rate = gemm(m * n * k)
        sec = 2.0 * m * n * k / (rate * 1e12)
        gemm_pts.append(
            {"dtype": compute_dtype, "m": m, "n": n, "k": k, "count": 1, "seconds": sec, "tflops": rate}
        )
    att = []
    for seq in (64, 128, 256, 512, 1024):
        for d in head_dims:
            flops = 2.0 * seq * seq * d * 4
            fr, br = attention(seq / 2), attention_bwd(seq / 2)
            att.append(
                {
                    "seq": seq,
                    "head_dim": d,
                    "heads": 4,
                    "batch": 1,
                    "dtype": compute_dtype,
                    "fwd_s": flops / fr / 1e12,
                    "bwd_s": 2.5 * flops / br / 1e12,
                    "fwd_tflops": fr,
                    "bwd_tflops": br,
                }
            )
    mem = []
    for n in (2**12, 2**16, 2**20, 2**24):
        nbytes = 2 * n * 4
        sec = nbytes / (memory_gbs * 1e9) + kernel_us * 1e-6
        mem.append(
            {
                "kernel": "copy",
                "bytes": nbytes,
                "seconds": sec,
                "gbs": nbytes / sec / 1e9,
                "dtype": compute_dtype,
            }
        )
    data: dict[str, Any] = {
        "schema_version": 1,
        "created": "2026-12-06T00:00:00Z",
        "device": {"kind": kind, "name": name, "count": 2, "threads": 1, "torch": "2.x"},
        "compute_dtype": compute_dtype,
        "gemm": gemm_pts,
        "attention": att,
        "memory": mem,
        "allocator": {"applicable": False, "reason": "CPU"},
        "collectives": {"backend": "gloo", "ranks": 2, "points": [], "unsupported": {}},
        **(extra or {}),
    }
    data["fitted"] = fit_tables(data, compute_dtype, head_dims[0])
    return data
