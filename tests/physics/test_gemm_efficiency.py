"""Per-shape GEMM efficiency (physics/gemm_efficiency.py) and the overlap invariants of issue 14."""

from __future__ import annotations

import pytest

from primus_optuna.physics.calibration import FAMILIES
from primus_optuna.physics.gemm_efficiency import (
    ATTN_REFERENCE_HEAD_DIM,
    EfficiencyCurve,
    attention_width_factor,
    flash_attention_seconds,
    gemm_seconds,
)
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from tests.conftest import small_dense_study
from tests.physics.test_throughput import FLAG, FLAG_SPACE, sample, with_changes


def test_fraction_grows_with_work_and_saturates() -> None:
    c = EfficiencyCurve(0.7, 1e9, "test")
    works = [1e6, 1e8, 1e9, 1e10, 1e12, 1e14]
    fr = [c.fraction(w) for w in works]
    assert fr == sorted(fr) and fr[-1] < 0.7
    assert c.fraction(1e9) == pytest.approx(0.35)
    assert c.fraction(1e14) == pytest.approx(0.7, rel=1e-4)


def test_roofline_never_faster_than_hbm() -> None:
    c = EfficiencyCurve(1.0, 1.0, "test")
    # a skinny GEMM (M = 1): 2·N·K FLOPs but N·K weights to read: memory-bound
    t = gemm_seconds(c, 1, 8192, 8192, peak_flops=1e15, hbm_bytes_per_s=1e12, elt_bytes=2)
    assert t == pytest.approx((8192 + 8192 * 8192 + 8192) * 2 / 1e12)


def test_grouped_gemm_is_sized_by_the_group_and_padded() -> None:
    """A grouped kernel (CUTLASS grouped GEMM, TE GroupedLinear, hipBLASLt grouped GEMM) fills the device with
    the tiles of all local experts: its efficiency follows the group's total (padded) work (issue 21 item 3)."""
    c = EfficiencyCurve(0.8, 1e9, "test")
    kw = dict(peak_flops=1e15, hbm_bytes_per_s=1e13, elt_bytes=2)
    # 8 experts of 100 tokens: padded to 128 rows each, efficiency of the whole group's 8 x 128 rows
    grouped = gemm_seconds(c, 100, 4096, 4096, 8, grouped=True, **kw)
    work = 8 * 128 * 4096 * 4096
    assert grouped == pytest.approx(2 * work / (1e15 * c.fraction(work)))
    # more experts in the group run at a higher rate than one expert alone
    one = gemm_seconds(c, 100, 4096, 4096, 1, grouped=True, **kw)
    assert grouped < 8 * one
    # the same rows unpadded as one dense GEMM never take longer
    assert gemm_seconds(c, 800, 4096, 4096, **kw) < grouped


def test_every_family_has_labelled_curves() -> None:
    for name, fam in FAMILIES.items():
        assert fam.gemm.fitted_to and fam.attention.fitted_to, name
        assert 0 < fam.gemm.peak_fraction <= 1 and fam.gemm.half_size > 0
        assert 1.0 <= fam.fp8_gemm_speedup <= 2.0, name  # never the datasheet's full 2x (measured < 2)


def test_overlap_options_never_slow_a_step() -> None:
    tp_over = with_changes(FLAG, workload={"tp_comm_overlap": True})
    no_dp_over = with_changes(FLAG, workload={"overlap_grad_reduce": False})
    for c in sample(FLAG_SPACE, 60, seed=3):
        base = estimate_throughput(FLAG, c).step_time_s
        assert estimate_throughput(tp_over, c).step_time_s <= base * (1 + 1e-12)
        assert estimate_throughput(no_dp_over, c).step_time_s >= base * (1 - 1e-12)


def test_zero_bubble_needs_gradient_accumulation_fusion() -> None:
    # Primus: zero-bubble falls back to plain 1F1B when gradient_accumulation_fusion is off
    spec = StudySpec.from_yaml("studies/llama3.1-70b-h100-bf16.yaml")
    sp = Space(spec)
    zb = sp.make(tp=8, pp=4, vpp=1, cp=1, mbs=1, pp_schedule="zb1p")
    plain = sp.make(tp=8, pp=4, vpp=1, cp=1, mbs=1, pp_schedule="1f1b")
    off = with_changes(spec, workload={"gradient_accumulation_fusion": False})
    a, b = estimate_throughput(off, zb), estimate_throughput(off, plain)
    assert a.breakdown_s["pipeline_bubble"] == pytest.approx(b.breakdown_s["pipeline_bubble"])
    # and the extra main-grad add makes the step slower than with fusion
    assert b.step_time_s > estimate_throughput(spec, plain).step_time_s


def test_attention_width_factor_matches_cudnn_head_dim_ratio() -> None:
    """Flash attention with 64-wide heads runs at 408/609 of the 128-wide rate per FLOP (cuDNN, H100 BF16
    forward at 4k tokens, Shah et al. 2024); the curves are fitted on 128-wide heads, wider ones get no credit."""
    assert attention_width_factor(ATTN_REFERENCE_HEAD_DIM) == 1.0
    assert (
        attention_width_factor(160) == attention_width_factor(256) == 1.0
    )  # MLA (192 + 128) / 2, wide heads
    assert attention_width_factor(64) == pytest.approx(408 / 609, rel=0.01)
    widths = [16, 32, 64, 96, 128]
    factors = [attention_width_factor(w) for w in widths]
    assert factors == sorted(factors) and 0 < factors[0] < factors[-1]


def test_narrow_heads_cost_attention_time_only() -> None:
    """The same attention FLOPs and projections in 64 heads of 64 (16 KV groups) instead of 32 of 128 (8 KV
    groups): only the flash-attention term grows."""
    base = StudySpec.from_dict(small_dense_study())
    narrow = with_changes(base, model={"num_attention_heads": 64, "kv_channels": 64, "num_query_groups": 16})
    cfg = Space(base).baseline
    wide_est, narrow_est = estimate_throughput(base, cfg), estimate_throughput(narrow, cfg)
    assert narrow_est.breakdown_s["compute_mlp"] == pytest.approx(wide_est.breakdown_s["compute_mlp"])
    assert narrow_est.breakdown_s["compute_attention"] > wide_est.breakdown_s["compute_attention"]
    assert narrow_est.step_time_s > wide_est.step_time_s


def test_flash_attention_backward_is_its_flops_at_the_backward_rate() -> None:
    curve = EfficiencyCurve(0.6, 0.0)
    fwd = flash_attention_seconds(curve, 1e15, 2e15, 128, span=4096)
    assert fwd == pytest.approx(1e15 / (0.6 * 2e15))
    bwd = flash_attention_seconds(curve, 1e15, 2e15, 128, span=4096, backward=True, bwd_rate=0.8)
    assert bwd == pytest.approx(fwd * 2.5 / 0.8)
    # 64-wide heads: the head-width factor on both passes
    narrow = flash_attention_seconds(curve, 1e15, 2e15, 64, span=4096)
    assert narrow == pytest.approx(fwd / attention_width_factor(64))


def test_flash_attention_rate_follows_the_span_not_the_work() -> None:
    """The curve is indexed by keys per query: 8x the work at the same span runs at the same rate; at a span of
    half_size the rate is half the peak fraction's."""
    curve = EfficiencyCurve(0.7, 512.0)
    one = flash_attention_seconds(curve, 1e12, 1e15, 128, span=128)
    assert flash_attention_seconds(curve, 8e12, 1e15, 128, span=128) == pytest.approx(8 * one)
    assert flash_attention_seconds(curve, 1e12, 1e15, 128, span=512) == pytest.approx(1e12 / (0.35 * 1e15))


def test_cudnn_short_window_kernels_run_at_one_rate_whatever_the_work() -> None:
    """What indexing attention by span rests on: cuDNN's GPT-OSS kernels with a 128-token window take time
    proportional to their work (within 10%) from 2k to 16k tokens on GB200 and GB300, an 8-fold range of work
    at one span."""
    from scripts import check_attention as ca

    rows = [k for k in ca.load() if k.dtype == "bfloat16" and k.window == 128 and k.seq <= 16384]
    assert {k.gpu for k in rows} == {"gb200", "gb300"}
    for gpu, bwd in {(k.gpu, k.backward) for k in rows}:
        rates = [k.fwd_flops / k.measured_s for k in rows if (k.gpu, k.backward) == (gpu, bwd)]
        assert len(rates) == 4 and max(rates) / min(rates) < 1.10, (gpu, bwd, rates)


def test_attention_against_cudnn_kernels() -> None:
    """scripts/check_attention.py with the constants of physics/calibration.py: cuDNN's H200/GB200/GB300 kernels
    of the fitting shape (Llama 3.1) within 20% each (the 0.1 ms kernels at 2k tokens are the worst) and 5% on
    average; the held-back shapes (DeepSeek-V3 and Kimi-K2.6 on GB200/GB300, GPT-OSS with a 1024-token window on
    H200) within 30% each; GPT-OSS's 128-token window on GB200/GB300 (a span the fitting rows never reach)
    within 70% (its forward is the known gap: up to 65% faster than measured on GB300); 15% on average over all
    70 held-back kernels."""
    from scripts import check_attention as ca

    kernels = [k for k in ca.load() if k.dtype == "bfloat16"]
    errs: dict[str, list[float]] = {"fit": [], "held": []}
    for k in kernels:
        err = ca.error(k, ca.calibration.FAMILIES[ca.FAMILY[k.gpu]])
        bound = 0.20 if ca.part(k) == "fit" else 0.70 if ca.short_window(k) else 0.30
        assert abs(err) <= bound, (k, err)
        errs[ca.part(k)].append(abs(err))
    assert (len(errs["fit"]), len(errs["held"])) == (30, 70)
    assert sum(errs["fit"]) / 30 <= 0.05 and sum(errs["held"]) / 70 <= 0.15


def test_check_attention_fit_reproduces_the_shipped_constants() -> None:
    """``scripts/check_attention.py --fit`` on each GPU's fitting kernels lands on calibration.py's attention
    constants (peak fraction, half-span, backward rate)."""
    from scripts import check_attention as ca

    kernels = [k for k in ca.load() if k.dtype == "bfloat16"]
    for gpu, family in ca.FAMILY.items():
        _, fam = ca.fit(family, [k for k in kernels if k.gpu == gpu and ca.part(k) == "fit"])
        shipped = ca.calibration.FAMILIES[family]
        assert fam.attention.peak_fraction == pytest.approx(shipped.attention.peak_fraction), family
        assert fam.attention.half_size == pytest.approx(shipped.attention.half_size), family
        assert fam.attention_bwd_rate == pytest.approx(shipped.attention_bwd_rate), family


def test_cudnn_fp8_windowed_backward_visits_the_whole_causal_triangle() -> None:
    """What ``Fp8AttentionRates.window_backward_unmasked`` rests on: cuDNN's FP8 and MXFP8 backward of GPT-OSS's
    128-token window on GB200/GB300 grows at least 3-fold per doubling of seq from 4k tokens (BF16's doubles,
    as a band should), and runs within 30% of the rate of the full causal kernel the model prices it as."""
    from scripts import check_attention as ca

    kernels = ca.load()
    bwd = {(k.gpu, k.dtype, k.seq): k for k in kernels if k.window == 128 and k.backward}
    for gpu in ("gb200", "gb300"):
        fam = ca.calibration.FAMILIES[ca.FAMILY[gpu]]
        assert fam.fp8_attention is not None and fam.fp8_attention.window_backward_unmasked
        for dtype in ("fp8", "mxfp8"):
            for s in (4096, 8192, 16384):
                grow = bwd[(gpu, dtype, 2 * s)].measured_s / bwd[(gpu, dtype, s)].measured_s
                assert grow > 3.0, (gpu, dtype, s, grow)
                bf16 = bwd[(gpu, "bfloat16", 2 * s)].measured_s / bwd[(gpu, "bfloat16", s)].measured_s
                assert bf16 < 2.2, (gpu, s, bf16)
            for s in (4096, 16384, 32768):
                k = bwd[(gpu, dtype, s)]
                assert abs(ca.error(k, fam)) <= 0.30, (gpu, dtype, s, ca.error(k, fam))


def test_fp8_attention_against_cudnn_kernels() -> None:
    """scripts/check_attention.py's FP8 kernels with calibration.py's FP8 rates: the fitting shape (Llama 3.1,
    per-tensor FP8 on H200/GB200/GB300, MXFP8 on GB200/GB300) within 35% each (the 0.1-0.4 ms kernels at 2k
    tokens are the worst) and 7% on average; held back the DeepSeek-V3 and Kimi-K2.6 shapes within 35% each
    and 16% on average (their FP8 gain is larger than Llama's)."""
    from scripts import check_attention as ca

    errs: dict[str, list[float]] = {"fit": [], "held": []}
    for k in ca.load():
        if k.dtype == "bfloat16" or k.window is not None:
            continue
        err = ca.error(k, ca.calibration.FAMILIES[ca.FAMILY[k.gpu]])
        assert abs(err) <= 0.35, (k, err)
        errs[ca.part(k)].append(abs(err))
    assert (len(errs["fit"]), len(errs["held"])) == (50, 80)
    assert sum(errs["fit"]) / 50 <= 0.07 and sum(errs["held"]) / 80 <= 0.16


def test_check_attention_fp8_fit_reproduces_the_shipped_rates() -> None:
    """``scripts/check_attention.py --fit`` on each GPU's FP8 fitting kernels lands on calibration.py's FP8
    attention rates (forward and backward, per FP8 kind)."""
    from scripts import check_attention as ca

    kernels = [k for k in ca.load() if k.dtype != "bfloat16"]
    for gpu, dtype in sorted({(k.gpu, k.dtype) for k in kernels}):
        family = ca.FAMILY[gpu]
        rows = [k for k in kernels if (k.gpu, k.dtype) == (gpu, dtype) and ca.part(k) == "fit"]
        _, fam = ca.fit_fp8(family, dtype, rows)
        shipped = ca.calibration.FAMILIES[family].fp8_attention
        assert fam.fp8_attention is not None and shipped is not None
        recipe = ca.FP8_KINDS[dtype]
        assert fam.fp8_attention.rates(recipe) == pytest.approx(shipped.rates(recipe)), (gpu, dtype)
