"""scripts/compare_profile.py (what scripts/gpu_calibrate_check.sh prints on an H100/H200), on synthetic
profiles whose rates are known."""

from __future__ import annotations

import pytest

from primus_optuna.physics.calibration import FAMILIES
from primus_optuna.physics.memory import FRAGMENTATION
from primus_optuna.spec.hardware import GPU_CATALOG
from primus_optuna.spec.profile import HardwareProfile
from scripts.compare_profile import catalog_gpu, comparison, format_rows
from tests.helpers.profiles import synthetic_profile

H100 = GPU_CATALOG["h100"]
HOPPER = FAMILIES["hopper"]


def hopper_like(scale: float, **extra: object) -> HardwareProfile:
    """An H100 whose GEMMs and attention run at ``scale`` times the catalog's Hopper curves."""
    peak = H100.bf16_tflops
    shapes = [(m, n, k) for m in (512, 2048, 8192) for n, k in ((1024, 1024), (4096, 4096), (8192, 8192))]
    data = synthetic_profile(
        gemm=lambda w: scale * peak * HOPPER.gemm.fraction(w),
        attention=lambda s: scale * peak * HOPPER.attention.fraction(s),
        attention_bwd=lambda s: scale * peak * HOPPER.attention.fraction(s) * HOPPER.attention_bwd_rate,
        memory_gbs=H100.hbm_bw_tbs * 1e3 * HOPPER.hbm_eff,
        kernel_us=HOPPER.kernel_us,
        compute_dtype="bf16",
        head_dims=(128,),
        kind="cuda",
        name="NVIDIA H100 80GB HBM3",
        gemm_shapes=shapes,
        extra=extra,
    )
    return HardwareProfile.model_validate(data)


def rows_by_name(profile: HardwareProfile) -> dict[str, tuple]:
    return {r[0]: r for r in comparison(profile, catalog_gpu(profile))}


def test_the_device_name_picks_the_catalog_gpu() -> None:
    assert catalog_gpu(hopper_like(1.0)).name == "h100"
    prof = hopper_like(1.0)
    prof.device.name = "NVIDIA H200"
    assert catalog_gpu(prof).name == "h200"
    assert catalog_gpu(prof, "h100").name == "h100"


@pytest.mark.parametrize("scale", [1.0, 0.8])
def test_measured_over_catalog_is_the_scale_of_the_synthetic_node(scale: float) -> None:
    rows = rows_by_name(hopper_like(scale))
    gemm = [r for name, r in rows.items() if "multiply-adds (" in name]
    attention = [r for name, r in rows.items() if name.startswith("attention ")]
    assert len(gemm) >= 3 and len(attention) == 10  # 5 spans, forward and backward
    for _, meas, cat, _ in gemm + attention:
        assert meas / cat == pytest.approx(scale, rel=1e-6)
    assert rows["bf16 GEMM half-work (fitted)"][1] == pytest.approx(HOPPER.gemm.half_size, rel=1e-6)
    assert rows["bf16 GEMM peak fraction (fitted)"][1] == pytest.approx(scale * HOPPER.gemm.peak_fraction)
    bw = rows["memory-bound kernels bandwidth"]
    assert bw[1] == pytest.approx(bw[2], rel=1e-6)


def test_allocator_reserve_is_compared_with_the_memory_models_fragmentation() -> None:
    measured = hopper_like(
        1.0,
        allocator={
            "applicable": True,
            "allocated_gib": 10.0,
            "reserved_gib": 11.0,
            "reserve_fraction": 1 / 11,
        },
    )
    what, over, cat, _ = rows_by_name(measured)["allocator: reserved beyond allocated / allocated"]
    assert over == pytest.approx(0.1) and cat == FRAGMENTATION
    lines = format_rows(comparison(measured, H100))
    assert lines[0].split()[:4] == ["what", "measured", "catalog", "ratio"]
    assert any(
        line.startswith("allocator: reserved") and f"{0.1 / FRAGMENTATION:.2f}" in line for line in lines
    )
    # not measured (CPU): said so, no ratio
    cpu = rows_by_name(hopper_like(1.0))["allocator reserve"]
    assert cpu[1] is None and "not measured" in cpu[3]
