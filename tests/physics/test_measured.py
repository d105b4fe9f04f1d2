"""A hardware profile's measured tables in place of the catalog's constants (physics/measured.py)."""

from __future__ import annotations

import math

import pytest
import yaml

from primus_optuna.physics.flops import Gemm
from primus_optuna.physics.measured import MeasuredCurve, fit_memory, fit_saturating
from primus_optuna.physics.throughput import _context, estimate_throughput
from primus_optuna.search.state import space_hash
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from tests.conftest import STUDIES
from tests.helpers.profiles import saturating, synthetic_profile


def local_study(profile: dict | None = None) -> StudySpec:
    data = yaml.safe_load((STUDIES / "local-gpt-cpu.yaml").read_text())
    if profile is not None:
        data["cluster"]["profile"] = profile
    return StudySpec.from_dict(data)


def test_fit_saturating_recovers_the_curve() -> None:
    f = saturating(80.0, 3e8)
    sizes = [1e6, 1e7, 1e8, 1e9, 1e10, 1e11]
    peak, half, mape = fit_saturating(sizes, [f(s) * 1e12 for s in sizes])
    assert peak == pytest.approx(80e12, rel=1e-6)
    assert half == pytest.approx(3e8, rel=1e-6)
    assert mape < 1e-9


def test_fit_memory_recovers_bandwidth_and_fixed_cost() -> None:
    nbytes = [1e4, 1e6, 1e8, 1e9]
    bw, fixed, mape = fit_memory(nbytes, [b / 2e12 + 5e-6 for b in nbytes])
    assert bw == pytest.approx(2e12, rel=1e-6)
    assert fixed == pytest.approx(5e-6, rel=1e-6)
    assert mape < 1e-9


def test_measured_curve_interpolates_in_log_size_and_extends_with_the_fit() -> None:
    curve = MeasuredCurve([(1e6, 10.0), (1e8, 30.0)], peak_flops=100.0, fitted_to="t")
    assert curve.rate(1e6) == pytest.approx(10.0)
    assert curve.rate(1e7) == pytest.approx(20.0)  # halfway in log(size)
    assert curve.fraction(1e7) == pytest.approx(0.2)
    # beyond the table: the fitted saturating curve, continuous at the ends, saturating above
    assert curve.rate(1e8 * (1 + 1e-9)) == pytest.approx(30.0, rel=1e-6)
    assert 30.0 < curve.rate(1e10) < curve.peak * curve.rate(1e8) / curve._fitted(1e8) + 1e-9
    assert curve.rate(1e4) < 10.0


def test_the_measured_gemm_table_prices_the_studys_gemms() -> None:
    rate = 0.25  # TFLOP/s at every size
    spec = local_study(synthetic_profile(gemm=lambda w: rate, memory_gbs=1e6, kernel_us=0.0))
    ctx = _context(spec)
    t = ctx.gemm(Gemm(256, 512, 512))
    assert t == pytest.approx(2 * 256 * 512 * 512 / (rate * 1e12), rel=1e-9)
    assert "hardware profile" in ctx.measured.sources["gemm"]
    assert ctx.k.attention_bwd is not None and ctx.kernel_s == pytest.approx(0.0, abs=1e-15)


def test_a_faster_measured_node_estimates_faster_and_a_slower_one_slower() -> None:
    catalog = local_study()
    config = Space(catalog).baseline
    base = estimate_throughput(catalog, config).tokens_per_s_per_gpu
    # the study declares a 0.1 TFLOP/s "GPU" (one CPU core)
    fast = synthetic_profile(gemm=lambda w: 1.0, attention=lambda s: 0.5, memory_gbs=400.0, kernel_us=0.5)
    slow = synthetic_profile(gemm=lambda w: 0.01, attention=lambda s: 0.002, memory_gbs=2.0, kernel_us=50.0)
    assert estimate_throughput(local_study(fast), config).tokens_per_s_per_gpu > 3 * base
    assert estimate_throughput(local_study(slow), config).tokens_per_s_per_gpu < base / 3


def test_attention_uses_the_measured_width_and_the_backward_curve() -> None:
    # heads 32 wide (hidden 128 / 4 heads): between the measured widths 16 and 48, the rates averaged
    prof = synthetic_profile(
        attention=lambda s: 0.1,
        attention_bwd=lambda s: 0.05,
        head_dims=(16, 48),
        memory_gbs=1e6,
        kernel_us=0.0,
    )
    for p in prof["attention"]:
        if p["head_dim"] == 48:
            p["fwd_tflops"] *= 3
            p["bwd_tflops"] *= 3
    ctx = _context(local_study(prof))
    lay = ctx.layer(1, 1, 1, 1, "alltoall", True)
    flops = 2.0 * 128 * 128 * 4 * 32  # causal QK^T and PV, 4 heads of 32, seq 128, mbs 1
    assert lay.core_f == pytest.approx(flops / 0.2e12, rel=1e-6)  # (0.1 + 0.3) / 2
    assert lay.core_b == pytest.approx(2.5 * flops / 0.1e12, rel=1e-6)


def test_fp8_and_grouped_gemms_take_the_measured_ratios() -> None:
    prof = synthetic_profile(gemm=lambda w: 0.2)
    fp8 = [dict(p, dtype="fp8", tflops=p["tflops"] * 1.6) for p in prof["gemm"]]
    grouped = [dict(p, m=p["m"] // 4, count=4, tflops=p["tflops"] * 0.5) for p in prof["gemm"]]
    prof["gemm"] += fp8 + grouped
    k = _context(local_study(prof)).k
    assert k.fp8_gemm_speedup == pytest.approx(1.6)
    assert k.grouped_gemm_eff == pytest.approx(0.5)
    assert k.grouped_expert_us == 0.0


def test_the_profile_content_enters_the_space_hash() -> None:
    a = local_study(synthetic_profile(gemm=lambda w: 0.2))
    b = local_study(synthetic_profile(gemm=lambda w: 0.3))
    assert space_hash(a) != space_hash(b)
    assert space_hash(local_study()) not in (space_hash(a), space_hash(b))
    # no profile: the hash of a study file written before the field existed
    assert space_hash(local_study()) == space_hash(StudySpec.from_yaml(STUDIES / "local-gpt-cpu.yaml"))
    assert not math.isnan(estimate_throughput(a, Space(a).baseline).tokens_per_s_per_gpu)


def test_on_cpu_the_eager_op_cost_adds_to_every_kernel() -> None:
    prof = synthetic_profile(kernel_us=1.0, extra={"op_overhead_us": 12.0})
    assert _context(local_study(prof)).kernel_s == pytest.approx(12e-6)
    # a GPU's host issues kernels ahead of them: its per-op cost is not added
    gpu = synthetic_profile(kernel_us=1.0, kind="cuda", extra={"op_overhead_us": 12.0})
    assert _context(local_study(gpu)).kernel_s == pytest.approx(1e-6, rel=1e-6)
