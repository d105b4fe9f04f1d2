"""Flash-attention kernels of the step-time model against cuDNN's measured ones on H200, GB200 and GB300.

    python scripts/check_attention.py          # the constants in physics/calibration.py
    python scripts/check_attention.py --fit    # grid-search each family's attention constants first

Data: tests/data/cudnn-sdpa.csv, NVIDIA/cudnn-frontend's SDPA training benchmark (cuDNN 9.22 on GB200/GB300,
9.19 on H200; causal ``top_left`` masks, batch 1-2, seq 2k-32k; each row's ``source`` names its file). Fitted
per family (H200 = ``hopper``, GB200 = ``blackwell``, GB300 = ``blackwell_ultra``) on the Llama 3.1 shape (GQA,
128-wide heads): the attention curve's peak fraction and half-work and backward's rate relative to forward's
(``attention_bwd_rate``). Held back: the DeepSeek-V3 (128 heads, 192/128-wide) and Kimi-K2.6 (64 heads,
192/128) shapes, and GPT-OSS's 64-wide heads with a 1024-token window (H200). Reported apart: windows of at
most two 128-key tiles (GPT-OSS's 128 tokens on GB200/GB300), where the kernel is not bound by its FLOPs, and
what FP8 attention does to their backward.
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
APART_WINDOW = 256
"""windows of at most this many keys (two 128-key tiles) are reported apart: not FLOP-bound"""

PEAKS = tuple(round(0.40 + 0.025 * i, 3) for i in range(17))  # 0.40-0.80
HALF_WORK_SCALE = (0.25, 0.5, 1.0, 2.0, 4.0)
BWD_RATES = tuple(round(0.60 + 0.025 * i, 3) for i in range(25))  # 0.60-1.20


@dataclasses.dataclass(frozen=True)
class Kernel:
    model: str
    gpu: str
    dtype: str
    seq: int
    fwd_flops: float
    head_width: float
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
                    window,
                    r["pass"] == "bwd",
                    float(r["time_ms"]) * 1e-3,
                )
            )
    return out


def model_seconds(k: Kernel, fam: calibration.FamilyConstants) -> float:
    """The step-time model's time of kernel ``k`` (one kernel, its fixed cost included)."""
    peak = GPU_CATALOG[k.gpu].bf16_tflops * 1e12
    t = flash_attention_seconds(
        fam.attention, k.fwd_flops, peak, k.head_width, backward=k.backward, bwd_rate=fam.attention_bwd_rate
    )
    return t + fam.kernel_us * 1e-6


def error(k: Kernel, fam: calibration.FamilyConstants) -> float:
    return model_seconds(k, fam) / k.measured_s - 1


def part(k: Kernel) -> str:
    """``fit`` (the fitting shape), ``apart`` (a window of at most :data:`APART_WINDOW` keys) or ``held``."""
    if k.window is not None and k.window <= APART_WINDOW:
        return "apart"
    return "fit" if k.model in FITTING and k.window is None else "held"


def fit(family: str, rows: list[Kernel]) -> tuple[float, calibration.FamilyConstants]:
    base = calibration.FAMILIES[family]
    best = (math.inf, base)
    for peak, scale, bwd in itertools.product(PEAKS, HALF_WORK_SCALE, BWD_RATES):
        curve = EfficiencyCurve(peak, base.attention.half_work * scale, base.attention.fitted_to)
        fam = dataclasses.replace(base, attention=curve, attention_bwd_rate=bwd)
        val = statistics.fmean(abs(error(k, fam)) for k in rows)
        if val < best[0]:
            best = (val, fam)
    return best


def report(rows: list[Kernel], title: str) -> None:
    print(f"\n{title}\n")
    print("| part | GPU | shape | seq | pass | measured ms | model ms | error |")
    print("|---|---|---|---|---|---|---|---|")
    errs: dict[tuple[str, str], list[float]] = {}
    for k in rows:
        fam = calibration.FAMILIES[FAMILY[k.gpu]]
        e = error(k, fam)
        errs.setdefault((part(k), k.gpu), []).append(abs(e))
        print(
            f"| {part(k)} | {k.gpu} | {k.model} | {k.seq} | {'bwd' if k.backward else 'fwd'} | "
            f"{k.measured_s * 1e3:.3f} | {model_seconds(k, fam) * 1e3:.3f} | {e:+.1%} |"
        )
    print()
    for (kind, gpu), v in sorted(errs.items()):
        print(f"{kind} {gpu}: kernel-time MAE {statistics.fmean(v):.1%} ({len(v)} kernels)")


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
                f"{fam.attention.peak_fraction:.3f}, half_work {fam.attention.half_work:.3g}, attention_bwd_rate "
                f"{fam.attention_bwd_rate:.3f} (fitting MAE {val:.1%})"
            )
    report([k for k in bf16 if part(k) != "apart"], "BF16 flash attention (cuDNN), model vs measured")
    report([k for k in bf16 if part(k) == "apart"], "GPT-OSS 128-token windows, 64-wide heads (BF16): apart")
    print("\nFP8 attention backward with the 128-token window, over BF16's (same shape):")
    by = {(k.gpu, k.dtype, k.seq, k.backward): k.measured_s for k in kernels if part(k) == "apart"}
    for gpu in sorted({k.gpu for k in kernels if part(k) == "apart"}):
        ratios = [
            f"{s}: fp8 {by[(gpu, 'fp8', s, True)] / by[(gpu, 'bfloat16', s, True)]:.1f}x, mxfp8 "
            f"{by[(gpu, 'mxfp8', s, True)] / by[(gpu, 'bfloat16', s, True)]:.1f}x"
            for s in sorted({k.seq for k in kernels if part(k) == "apart" and k.gpu == gpu})
        ]
        print(f"  {gpu}: " + "; ".join(ratios))


if __name__ == "__main__":
    main()
