"""Flash-attention kernels of the step-time model against cuDNN's measured ones on H200, GB200 and GB300.

    python scripts/check_attention.py          # the constants in physics/calibration.py
    python scripts/check_attention.py --fit    # grid-search each family's attention constants first

Data: tests/data/cudnn-sdpa.csv, NVIDIA/cudnn-frontend's SDPA training benchmark (cuDNN 9.22 on GB200/GB300,
9.19 on H200; causal ``top_left`` masks, batch 1-2, seq 2k-32k; each row's ``source`` names its file). Fitted
per family (H200 = ``hopper``, GB200 = ``blackwell``, GB300 = ``blackwell_ultra``) on the Llama 3.1 shape (GQA,
128-wide heads, full causal mask): the attention curve's peak fraction and half-span (keys per query at half of
it) and backward's rate relative to forward's (``attention_bwd_rate``). Held back: the DeepSeek-V3 (128 heads,
192/128-wide) and Kimi-K2.6 (64 heads, 192/128) shapes, and GPT-OSS's 64-wide heads with a 1024-token window
(H200) and a 128-token window (GB200/GB300: the span the fitting rows never reach, 128 keys against 1k-16k).

FP8 attention (``workload.fp8_dot_product_attention``, ``FamilyConstants.fp8_attention``): the forward and
backward rate multipliers over BF16's, per GPU and FP8 kind (``fp8``: per-tensor scaling; ``mxfp8``), fitted
on the same Llama 3.1 kernels (``--fit`` fits them after the BF16 constants); held back the same shapes as
above, GPT-OSS's 128-token window with its backward priced over the whole causal triangle
(``window_backward_unmasked``). Also printed: the FP8 windowed backward over BF16's.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.physics import calibration  # noqa: E402
from primus_optuna.physics.flops import window_pairs  # noqa: E402
from primus_optuna.physics.gemm_efficiency import EfficiencyCurve, flash_attention_seconds  # noqa: E402
from primus_optuna.spec import GPU_CATALOG  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "cudnn-sdpa.csv"
FAMILY = {"h200": "hopper", "gb200": "blackwell", "gb300": "blackwell_ultra"}
FITTING = ("llama3.1",)
SHORT_WINDOW = 256
"""windows of at most this many keys (two 128-key tiles): the FP8 backward comparison"""

FP8_KINDS = {"fp8": "tensorwise", "mxfp8": "mxfp8"}
"""cuDNN's FP8 data types and the ``workload.fp8_recipe`` each stands for (per-tensor scaling: delayed and
tensorwise)"""

PEAKS = tuple(round(0.50 + 0.025 * i, 3) for i in range(17))  # 0.50-0.90
FP8_RATES = tuple(round(0.50 + 0.025 * i, 3) for i in range(61))  # 0.50-2.00
HALF_SPANS = tuple(64 * i for i in range(1, 33))  # 64-2048 keys
BWD_RATES = tuple(round(0.60 + 0.025 * i, 3) for i in range(25))  # 0.60-1.20


@dataclasses.dataclass(frozen=True)
class Kernel:
    model: str
    gpu: str
    dtype: str
    seq: int
    fwd_flops: float
    head_width: float
    span: float
    """keys per query, averaged over the queries"""
    pairs: float
    """key-query pairs of one head (the mask's)"""
    full_pairs: float
    """the same under a full causal mask"""
    window: int | None
    backward: bool
    measured_s: float


def load() -> list[Kernel]:
    out = []
    with DATA.open() as fh:
        for r in csv.DictReader(fh):
            s, b, a = int(r["seq"]), int(r["batch"]), int(r["heads"])
            dqk, dvo = int(r["head_dim_qk"]), int(r["head_dim_vo"])
            window = int(r["window"]) if r["window"] else None
            # QKᵀ and PV: 2·d FLOPs per key-query pair each (physics.flops.core_attention_flops)
            fwd = 2 * b * a * window_pairs(s, window) * (dqk + dvo)
            out.append(
                Kernel(
                    r["model"],
                    r["gpu"],
                    r["data_type"],
                    s,
                    fwd,
                    (dqk + dvo) / 2,
                    window_pairs(s, window) / s,
                    window_pairs(s, window),
                    window_pairs(s),
                    window,
                    r["pass"] == "bwd",
                    float(r["time_ms"]) * 1e-3,
                )
            )
    return out


def model_seconds(k: Kernel, fam: calibration.FamilyConstants) -> float:
    """The step-time model's time of kernel ``k`` (one kernel, its fixed cost included): an FP8 kernel at the
    family's FP8 rates (``FamilyConstants.fp8_attention``), over the pairs its backward visits."""
    peak = GPU_CATALOG[k.gpu].bf16_tflops * 1e12
    flops, span = k.fwd_flops, k.span
    rates = fam.fp8_attention
    if k.dtype != "bfloat16" and rates is not None:
        fwd_rate, bwd_rate = rates.rates(FP8_KINDS[k.dtype])
        peak *= bwd_rate if k.backward else fwd_rate
        if k.backward:
            pairs = rates.backward_pairs(k.pairs, k.full_pairs)
            flops, span = flops * pairs / k.pairs, pairs / k.seq
    t = flash_attention_seconds(
        fam.attention,
        flops,
        peak,
        k.head_width,
        span=span,
        backward=k.backward,
        bwd_rate=fam.attention_bwd_rate,
    )
    return t + fam.kernel_us * 1e-6


def error(k: Kernel, fam: calibration.FamilyConstants) -> float:
    return model_seconds(k, fam) / k.measured_s - 1


def part(k: Kernel) -> str:
    """``fit`` (the fitting shape) or ``held``."""
    return "fit" if k.model in FITTING and k.window is None else "held"


def short_window(k: Kernel) -> bool:
    return k.window is not None and k.window <= SHORT_WINDOW


def fit(family: str, rows: list[Kernel]) -> tuple[float, calibration.FamilyConstants]:
    base = calibration.FAMILIES[family]
    best = (math.inf, base)
    for peak, half, bwd in itertools.product(PEAKS, HALF_SPANS, BWD_RATES):
        curve = EfficiencyCurve(peak, float(half), base.attention.fitted_to)
        fam = dataclasses.replace(base, attention=curve, attention_bwd_rate=bwd)
        val = statistics.fmean(abs(error(k, fam)) for k in rows)
        if val < best[0]:
            best = (val, fam)
    return best


def fit_fp8(family: str, dtype: str, rows: list[Kernel]) -> tuple[float, calibration.FamilyConstants]:
    """The (forward, backward) rate multipliers of FP8 kind ``dtype`` on ``rows``, the BF16 constants as
    they stand."""
    base = calibration.FAMILIES[family]
    old = base.fp8_attention or calibration.Fp8AttentionRates((1.0, 1.0))
    best = (math.inf, base)
    for pair in itertools.product(FP8_RATES, FP8_RATES):
        new = dataclasses.replace(old, **{"mxfp8" if dtype == "mxfp8" else "per_tensor": pair})
        fam = dataclasses.replace(base, fp8_attention=new)
        val = statistics.fmean(abs(error(k, fam)) for k in rows)
        if val < best[0]:
            best = (val, fam)
    return best


def report(rows: list[Kernel], title: str) -> None:
    print(f"\n{title}\n")
    print("| part | GPU | shape | seq | pass | measured ms | model ms | error |")
    print("|---|---|---|---|---|---|---|---|")
    errs: dict[tuple[str, str, str], list[float]] = {}
    for k in rows:
        fam = calibration.FAMILIES[FAMILY[k.gpu]]
        e = error(k, fam)
        errs.setdefault(
            (part(k), k.gpu, k.model if k.window is None else f"{k.model} window {k.window}"), []
        ).append(abs(e))
        print(
            f"| {part(k)} | {k.gpu} | {k.model}{'' if k.dtype == 'bfloat16' else ' ' + k.dtype} | {k.seq} | "
            f"{'bwd' if k.backward else 'fwd'} | "
            f"{k.measured_s * 1e3:.3f} | {model_seconds(k, fam) * 1e3:.3f} | {e:+.1%} |"
        )
    print()
    for (kind, gpu, model), v in sorted(errs.items()):
        print(f"{kind} {gpu} {model}: kernel-time MAE {statistics.fmean(v):.1%} ({len(v)} kernels)")
    for kind in sorted({key[0] for key in errs}):
        v = [e for key, es in errs.items() if key[0] == kind for e in es]
        print(f"{kind}: kernel-time MAE {statistics.fmean(v):.1%} ({len(v)} kernels)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--fit", action="store_true", help="grid-search the attention constants on the fitting shapes"
    )
    args = ap.parse_args()
    kernels = load()
    bf16 = [k for k in kernels if k.dtype == "bfloat16"]
    if args.fit:
        for gpu, family in FAMILY.items():
            rows = [k for k in bf16 if k.gpu == gpu and part(k) == "fit"]
            val, fam = fit(family, rows)
            calibration.FAMILIES[family] = fam
            print(
                f"fitted {family} on {len(rows)} {gpu} kernels: attention peak_fraction "
                f"{fam.attention.peak_fraction:.3f}, half_size {fam.attention.half_size:.0f} keys, attention_bwd_rate "
                f"{fam.attention_bwd_rate:.3f} (fitting MAE {val:.1%})"
            )
    report(bf16, "BF16 flash attention (cuDNN), model vs measured")
    fp8 = [k for k in kernels if k.dtype != "bfloat16"]
    if args.fit:
        for (gpu, dtype), family in sorted(
            {(k.gpu, k.dtype): FAMILY[k.gpu] for k in fp8}.items(), key=lambda kv: (kv[0][0], kv[0][1])
        ):
            rows = [k for k in fp8 if k.gpu == gpu and k.dtype == dtype and part(k) == "fit"]
            val, fam = fit_fp8(family, dtype, rows)
            calibration.FAMILIES[family] = fam
            got = fam.fp8_attention.rates(FP8_KINDS[dtype]) if fam.fp8_attention else (1.0, 1.0)
            print(
                f"fitted {family} {dtype} attention on {len(rows)} {gpu} kernels: forward rate x{got[0]:.3f}, "
                f"backward x{got[1]:.3f} over BF16 (fitting MAE {val:.1%})"
            )
    for dtype in FP8_KINDS:
        report([k for k in fp8 if k.dtype == dtype], f"{dtype} attention (cuDNN), model vs measured")
    print("\nFP8 attention backward with the 128-token window, over BF16's (same shape):")
    by = {(k.gpu, k.dtype, k.seq, k.backward): k.measured_s for k in kernels if short_window(k)}
    for gpu in sorted({k.gpu for k in kernels if short_window(k)}):
        ratios = [
            f"{s}: fp8 {by[(gpu, 'fp8', s, True)] / by[(gpu, 'bfloat16', s, True)]:.1f}x, mxfp8 "
            f"{by[(gpu, 'mxfp8', s, True)] / by[(gpu, 'bfloat16', s, True)]:.1f}x"
            for s in sorted({k.seq for k in kernels if short_window(k) and k.gpu == gpu})
        ]
        print(f"  {gpu}: " + "; ".join(ratios))


if __name__ == "__main__":
    main()
