"""Step-time model against published runs (shared/reference/validation.md).

Tolerances are the issue's: Narayanan et al. 2021 Table 1 TFLOP/s per GPU ±15% per row; Korthikanti et al.
2022 Table 5 iteration times ±15% and the full/selective recompute ratio ±5%; Megatron-Bridge H100 and
Primus MI325X tokens/s/GPU ±25% (their exact recipes — recompute, dispatcher, GBS — are not all published,
so the assumptions are written next to each row). A row the model cannot meet stays here as a strict
expected failure with its measured error.
"""

from __future__ import annotations

from typing import Any

import pytest

from primus_optuna.physics.flops import narayanan_flops
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.space import TrainingConfig
from primus_optuna.spec import MODEL_CATALOG, StudySpec
from tests.helpers.models import gpt_model
from tests.helpers.published import FSDP_RECOMPUTE


def make_spec(
    model: dict[str, Any] | str,
    gpu: str,
    gpus: int,
    seq: int,
    gbs: int,
    precision: str,
    dist_opt: bool,
    flash: bool = True,
    sequence_parallel: bool = True,
    **workload: Any,
) -> StudySpec:
    m = {"catalog": model} if isinstance(model, str) else model
    return StudySpec.from_dict(
        {
            "name": "validation",
            "model": m,
            "cluster": {"gpu": gpu, "nodes": max(1, gpus // 8), "gpus_per_node": min(8, gpus)},
            "workload": {
                "seq_length": seq,
                "global_batch_size": gbs,
                "precision": precision,
                "distributed_optimizer": dist_opt,
                "flash_attention": flash,
                "sequence_parallel": sequence_parallel,
                **workload,
            },
        }
    )


def config(spec: StudySpec, **axes: Any) -> TrainingConfig:
    return TrainingConfig(**axes).derive(spec.world, spec.workload.global_batch_size)


# --- Narayanan et al. 2021, Table 1 ---------------------------------------------------------------------------
# (name, h, layers, heads, tp, pp, vpp, gpus, gbs, mbs, TFLOP/s per GPU). MBS and the interleaving (layers per
# virtual stage 5, 5, 3 for 76B/145B/310B; none for 39B) are from Megatron-LM examples/sc21/run_table_1.sh,
# the paper's artifact; fp16, full recompute, no distributed optimizer, no sequence parallelism (2021: it came
# with Korthikanti et al. 2022). Estimated as they ran (examples/sc21/run_table_1.sh@db6892a9, the last
# version before its removal): fp16 gradients (Megatron's --accumulate-allreduce-grads-in-fp32 was off by
# default), torch DDP (bucketed all-reduce overlapped with backward) for 1.7B-18.4B, Megatron's local DDP
# (one all-reduce after the backward) for 39.1B and up; no gradient-accumulation fusion (it came to Megatron-LM
# with 83b1e42f, 2022-02-13, and then only with fp32 grad accumulation, megatron/arguments.py@83b1e42f:176):
# each micro-batch's fp16 weight gradient is added into the fp16 main grad by a hook
# (megatron/model/distributed.py@488f8c02:174).
NARAYANAN_TORCH_DDP = {"1.7B", "3.6B", "7.5B", "18.4B"}
NARAYANAN = [
    ("1.7B", 2304, 24, 24, 1, 1, 1, 32, 512, 16, 137),
    ("3.6B", 3072, 30, 32, 2, 1, 1, 64, 512, 16, 138),
    ("7.5B", 4096, 36, 32, 4, 1, 1, 128, 512, 16, 142),
    ("18.4B", 6144, 40, 48, 8, 1, 1, 256, 1024, 8, 135),
    ("39.1B", 8192, 48, 64, 8, 2, 1, 512, 1536, 4, 138),
    ("76.1B", 10240, 60, 80, 8, 4, 3, 1024, 1792, 2, 140),
    ("145.6B", 12288, 80, 96, 8, 8, 2, 1536, 2304, 2, 148),
    ("310.1B", 16384, 96, 128, 8, 16, 2, 1920, 2160, 1, 155),
]


def narayanan_tflops(row: tuple) -> float:
    name, h, layers, heads, tp, pp, vpp, gpus, gbs, mbs, _ = row
    spec = make_spec(
        gpt_model(h, layers, heads),
        "a100-80gb",
        gpus,
        2048,
        gbs,
        "fp16",
        False,
        flash=False,
        sequence_parallel=False,
        grad_reduce_in_fp32=False,
        overlap_grad_reduce=name in NARAYANAN_TORCH_DDP,
        gradient_accumulation_fusion=False,
    )
    sched = "interleaved" if vpp > 1 else "1f1b"
    est = estimate_throughput(
        spec, config(spec, tp=tp, pp=pp, vpp=vpp, mbs=mbs, recompute="full", pp_schedule=sched)
    )
    return narayanan_flops(gbs, 2048, layers, h, 51200) / est.step_time_s / gpus / 1e12


NARAYANAN_XFAIL: dict[str, str] = {}


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(r, id=r[0], marks=pytest.mark.xfail(strict=True, reason=NARAYANAN_XFAIL[r[0]]))
        if r[0] in NARAYANAN_XFAIL
        else pytest.param(r, id=r[0])
        for r in NARAYANAN
    ],
)
def test_narayanan_table1_tflops_within_15pct(row: tuple) -> None:
    got = narayanan_tflops(row)
    assert got == pytest.approx(row[-1], rel=0.15), f"{row[0]}: model {got:.1f} vs published {row[-1]}"


# --- Korthikanti et al. 2022, Table 5 -------------------------------------------------------------------------
# (name, h, layers, heads, tp, pp, vpp, gbs, mbs, full-recompute s, SP+selective s); dp = 1, fp16, Adam without
# distributed optimizer, seq 2048. The full-recompute column is the paper's baseline, Megatron before its
# sequence parallelism (Table 4, 22B: "baseline with recompute" runs the no-SP forward, 7.7 ms per layer, vs
# 7.2 ms with SP), so it is estimated without sequence parallelism; the present-work column with it.
KORTHIKANTI = [
    ("22B", 6144, 48, 64, 8, 1, 1, 4, 4, 1.42, 1.10),
    ("175B", 12288, 96, 96, 8, 8, 3, 64, 1, 18.13, 13.75),
    ("530B", 20480, 105, 128, 8, 35, 3, 280, 1, 49.05, 37.83),
    ("1T", 25600, 128, 160, 8, 64, 1, 512, 1, 94.42, 71.49),
]


def korthikanti_times(row: tuple) -> tuple[float, float]:
    name, h, layers, heads, tp, pp, vpp, gbs, mbs, _, _ = row
    sched = "interleaved" if vpp > 1 else "1f1b"
    out = []
    for rc in ("full", "selective"):
        spec = make_spec(
            gpt_model(h, layers, heads),
            "a100-80gb",
            tp * pp,
            2048,
            gbs,
            "fp16",
            False,
            flash=False,
            sequence_parallel=rc == "selective",
        )
        c = config(spec, tp=tp, pp=pp, vpp=vpp, mbs=mbs, recompute=rc, pp_schedule=sched)
        out.append(estimate_throughput(spec, c).step_time_s)
    return out[0], out[1]


KORTHIKANTI_XFAIL: dict[str, str] = {
    # with the full-recompute baseline estimated without sequence parallelism (as it ran) the 22B ratio is
    # 1.371 against the published 1.291 (+6.2%): the model's no-SP layer is 2% slow and its SP + selective layer
    # 2% fast against the paper's Table 4 (27.2 and 20.3 ms per layer); the three pipelined models are within 5%
    "22B-ratio": "full/selective 1.371 vs 1.291 (+6.2%)",
}


def _kparams(kind: str) -> list:
    out = []
    for r in KORTHIKANTI:
        key = f"{r[0]}-{kind}"
        marks = (
            [pytest.mark.xfail(strict=True, reason=KORTHIKANTI_XFAIL[key])]
            if key in KORTHIKANTI_XFAIL
            else []
        )
        out.append(pytest.param(r, id=r[0], marks=marks))
    return out


@pytest.mark.parametrize("row", _kparams("time"))
def test_korthikanti_table5_iteration_times_within_15pct(row: tuple) -> None:
    full, sel = korthikanti_times(row)
    assert full == pytest.approx(row[-2], rel=0.15), f"full recompute {full:.2f} s vs {row[-2]}"
    assert sel == pytest.approx(row[-1], rel=0.15), f"selective {sel:.2f} s vs {row[-1]}"


@pytest.mark.parametrize("row", _kparams("ratio"))
def test_korthikanti_full_vs_selective_ratio_within_5pct(row: tuple) -> None:
    full, sel = korthikanti_times(row)
    assert full / sel == pytest.approx(row[-2] / row[-1], rel=0.05)


# --- Megatron-Bridge H100 (forced-balanced routing) -------------------------------------------------------------
# (name, model, gpus, precision, gbs, mbs, seq, tp, pp, cp, vpp, ep, tok/s/GPU, dispatcher). Assumed: no
# recompute, distributed optimizer; GPT-OSS-120B as the catalog gives it (HF openai/gpt-oss-120b: alternating
# 128-token sliding-window layers, attention sinks, linear biases, whose experts' output bias Megatron adds
# outside the grouped GEMM); the all-to-all dispatcher except for Qwen3-235B, whose EP 32 spans nodes
# and whose recipe is assumed to use the DeepEP ("flex") dispatcher (the published table gives the layout only).
BRIDGE = [
    ("gpt-oss-120b", "gpt-oss-120b", 64, "bf16", 512, 4, 4096, 1, 4, 1, 1, 8, 5630, "alltoall"),
    ("qwen3-235b-a22b", "qwen3-235b-a22b", 256, "fp8", 2048, 1, 4096, 2, 8, 1, 4, 32, 1575, "deepep"),
    ("llama3-70b", "llama3.1-70b", 64, "fp8", 128, 1, 8192, 4, 8, 1, 5, 1, 1602, "alltoall"),
    ("llama3.1-405b", "llama3.1-405b", 1024, "fp8", 512, 1, 8192, 8, 8, 2, 8, 1, 292, "alltoall"),
]
BRIDGE_XFAIL: dict[str, str] = {}


def bridge_tps(row: tuple) -> float:
    name, model, gpus, prec, gbs, mbs, seq, tp, pp, cp, vpp, ep, _, disp = row
    spec = make_spec(model, "h100", gpus, seq, gbs, prec, True)
    sched = "interleaved" if vpp > 1 else "1f1b"
    c = config(spec, tp=tp, pp=pp, cp=cp, vpp=vpp, ep=ep, mbs=mbs, pp_schedule=sched, moe_dispatcher=disp)
    return estimate_throughput(spec, c).tokens_per_s_per_gpu


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(r, id=r[0], marks=[pytest.mark.xfail(strict=True, reason=BRIDGE_XFAIL[r[0]])])
        if r[0] in BRIDGE_XFAIL
        else pytest.param(r, id=r[0])
        for r in BRIDGE
    ],
)
def test_megatron_bridge_h100_within_25pct(row: tuple) -> None:
    got = bridge_tps(row)
    assert got == pytest.approx(row[-2], rel=0.25), f"{row[0]}: model {got:.0f} vs published {row[-2]}"


# --- AMD Primus MI325X (8 nodes x 8 GPUs, seq 8192) ----------------------------------------------------------------
# (name, model, precision, mbs, tp, gbs, tok/s/GPU). GBS is not stated in the docs: assumed 512 for 8B (4
# micro-batches per GPU) and 256 for 70B.
PRIMUS = [
    ("llama3.1-8b-fp8", "llama3.1-8b", "fp8", 2, 1, 512, 16186),
    ("llama3.1-70b-fp8-fsdp", "llama3.1-70b", "fp8", 4, 1, 256, 1726),
    ("llama3.1-70b-bf16-fsdp", "llama3.1-70b", "bf16", 1, 1, 256, 1174),
]
PRIMUS_FSDP: dict[str, Any] = {"recompute": FSDP_RECOMPUTE}
"""The 70B rows as Primus's MI325X examples run them: torch FSDP2 over the 64 GPUs (``dp_shard`` = dp), no
distributed optimizer, recompute full, block, 72 of the 80 layers, no gradient-accumulation fusion
(examples/megatron/configs/MI325X/llama3.1_70B-{BF16,FP8}-pretrain.yaml@fd1eeabb:62-72; the published table
states FSDP but not the recompute). Priced as the distributed optimizer without recompute they were +39.3%
(BF16, an expected failure) and +24.8% (FP8); as FSDP2 alone +33.3% and +25.1%."""
PRIMUS_XFAIL: dict[str, str] = {}


def primus_tps(row: tuple, **axes: Any) -> float:
    name, model, prec, mbs, tp, gbs, _ = row
    fsdp = name.endswith("-fsdp")
    spec = make_spec(
        model,
        "mi325x",
        64,
        8192,
        gbs,
        prec,
        True,
        **({"gradient_accumulation_fusion": False} if fsdp else {}),
    )
    if fsdp:
        axes = {"dp_shard": spec.world // tp, **PRIMUS_FSDP, **axes}
    return estimate_throughput(spec, config(spec, tp=tp, mbs=mbs, **axes)).tokens_per_s_per_gpu


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(r, id=r[0], marks=[pytest.mark.xfail(strict=True, reason=PRIMUS_XFAIL[r[0]])])
        if r[0] in PRIMUS_XFAIL
        else pytest.param(r, id=r[0])
        for r in PRIMUS
    ],
)
def test_primus_mi325x_within_25pct(row: tuple) -> None:
    got = primus_tps(row)
    assert got == pytest.approx(row[-1], rel=0.25), f"{row[0]}: model {got:.0f} vs published {row[-1]}"


def test_catalog_models_used_above_exist() -> None:
    for name in ("qwen3-235b-a22b", "llama3.1-70b", "llama3.1-405b", "llama3.1-8b"):
        assert name in MODEL_CATALOG


def report() -> list[tuple[str, float, float]]:
    """(row, model, published) for every row: used by the fit notes in calibration.py."""
    out = []
    for r in NARAYANAN:
        out.append((f"narayanan {r[0]} TFLOP/s", narayanan_tflops(r), r[-1]))
    for r in KORTHIKANTI:
        full, sel = korthikanti_times(r)
        out.append((f"korthikanti {r[0]} full s", full, r[-2]))
        out.append((f"korthikanti {r[0]} selective s", sel, r[-1]))
        out.append((f"korthikanti {r[0]} ratio", full / sel, r[-2] / r[-1]))
    for r in BRIDGE:
        out.append((f"bridge {r[0]} tok/s", bridge_tps(r), r[-2]))
    for r in PRIMUS:
        out.append((f"primus {r[0]} tok/s", primus_tps(r), r[-1]))
    return out


if __name__ == "__main__":
    for name, got, ref in report():
        print(f"{name:<40} model {got:10.2f}  published {ref:10.2f}  error {100 * (got / ref - 1):+6.1f}%")
