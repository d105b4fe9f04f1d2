"""Every published run of the MLA / shared-expert / GPT-OSS families in published-runs.csv, and every run
whose layers split over the pipeline only with the embedding and loss counted in
(``account_for_embedding/loss_in_pipeline_split``: Qwen3-235B-A22B's 94 and Llama3.1-405B's 126 layers), is
estimated to fit its GPU with its own layout and recompute settings. Left out: the Qwen3-235B-A22B H100
GBS-2048 row (25.11), whose 94 layers over PP8xVP4 need an uneven split the row does not state.

The DeepSeek-V3 rows state Megatron-Core's precision-aware optimizer (fp32 master, bf16 main grads and Adam
moments): their workload sets it (``precision_aware_optimizer``, 8 optimizer bytes per parameter instead of 12).
Some recipes also use memory features the model does not have: Muon (one momentum buffer; Kimi-K2, counted as
Adam) lowers the real peak, so there the estimate is an upper bound; full-iteration CUDA graphs with the MoE paged stash (GB200/GB300
mxfp8 rows) add graph pools and a paged buffer and offload expert activations, modelled neither way.
Kimi-K2's layout is assumed (the recipe names it without giving it).

Data: tests/physics/data/published_moe_runs.csv, the DeepSeek-V2/V3, Kimi-K2, GPT-OSS and the stated
account-for-embedding/loss Qwen3-235B-A22B / Llama3.1-405B rows of
shared/reference/data/published-runs.csv copied verbatim (each row's ``source`` column names its recipe). These
runs ran, so their true peak was below the GPU's capacity: the check is ``estimated peak <= capacity`` (the
study's safety margin is a search policy, not a fact about a run that ran).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from primus_optuna import StudySpec
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.space import Space
from primus_optuna.spec import GPU_CATALOG
from tests.helpers.published import FUSED_GROUPED_MLP, GPUS, PRECISION_AWARE, row_layout

DATA = Path(__file__).parent / "data" / "published_moe_runs.csv"
ROWS = list(csv.DictReader(DATA.open()))

CATALOG = {
    "DeepSeek-V3": "deepseek-v3",
    "DeepSeek-V2": "deepseek-v2",
    "GPT-OSS-120B": "gpt-oss-120b",
    "Kimi-K2": "kimi-k2",
    "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Llama3.1-405B": "llama3.1-405b",
}
GPUS_PER_NODE = {"GB300": 4, "GB200": 4}


def _recompute(row: dict[str, str]) -> str:
    """The row's recompute as the ``recompute`` axis writes it (``recompute_modules`` replace Megatron's
    default ``core_attn``; an empty module list recomputes nothing)."""
    if row["recompute_granularity"] != "selective":
        return "none"
    mods = [m.strip() for m in row["recompute_modules"].split(",") if m.strip()]
    mods = [m for m in mods if "none" not in m]
    return "selective:" + "+".join(mods) if mods else "none"


def _fp8_recipe(row: dict[str, str]) -> str:
    p = row["precision"]
    if p.startswith("mxfp8"):
        return "mxfp8"
    # fp8_cs = per-tensor current scaling; the DeepSeek-V3 H100 row names no recipe (tensorwise assumed: it
    # only decides whether moe_act/layernorm recompute is allowed, which that row does not use)
    return "tensorwise"


def _spec(row: dict[str, str]) -> tuple[StudySpec, dict]:
    model = next(v for k, v in CATALOG.items() if row["model"].startswith(k))
    gpus, gpn = int(row["gpus"]), GPUS_PER_NODE.get(row["gpu"], 8)
    # catalog GPUs: the device-reported capacity where one is on record, else the datasheet GB converted to
    # GiB (GB200/GB300/B300)
    gpu = GPUS[row["gpu"]]
    assert GPU_CATALOG[gpu].hbm_gb == float(row["gpu_mem_gb"]) or row["gpu"] in ("B200", "H100-SXM")
    flags = row["other_memory_flags"]
    workload = {
        "seq_length": int(row["seq"]),
        "global_batch_size": int(row["gbs"]),
        "precision": "bf16" if row["precision"] == "bf16" else "fp8",
        "grad_reduce_in_fp32": "grad_reduce_in_fp32=False" not in flags,
        "te_op_fuser": FUSED_GROUPED_MLP in flags,
    }
    if workload["precision"] == "fp8":
        workload["fp8_recipe"] = _fp8_recipe(row)
        workload["fp8_param_gather"] = "fp8_param_gather=True" in flags
    if PRECISION_AWARE.search(flags):
        workload |= {
            "precision_aware_optimizer": True,
            "main_grads_dtype": "bf16",
            "exp_avg_dtype": "bf16",
            "exp_avg_sq_dtype": "bf16",
        }
    data = {
        "name": "published",
        "model": {"catalog": model},
        "cluster": {"gpu": gpu, "nodes": gpus // gpn, "gpus_per_node": gpn},
        "workload": workload,
        # a run that ran used at most the device's memory: no safety margin (a study's margin is its choice)
        "search": {"memory_safety_margin": 0.0},
    }
    layout = row_layout(row)
    if layout and int(row["pp"]) > 1:
        data["pipeline"] = {"layout": layout}
    elif "account_for" in row["pp_schedule"] + flags:
        data["pipeline"] = {
            "account_for_embedding_in_pipeline_split": True,
            "account_for_loss_in_pipeline_split": True,
        }
    vp = int(row["vp"] or 1)
    disp = row["moe_dispatcher"].lower()
    axes = dict(
        tp=int(row["tp"]),
        pp=int(row["pp"]),
        vpp=vp,
        ep=int(row["ep"]),
        cp=int(row["cp"]),
        mbs=int(row["mbs"]),
        recompute=_recompute(row),
        moe_dispatcher="deepep" if ("deep" in disp or "hybridep" in disp) else "alltoall",
        pp_schedule="interleaved" if vp > 1 else "1f1b",
    )
    return StudySpec.from_dict(data), axes


def _id(row: dict[str, str]) -> str:
    return f"{row['model'].split(' ')[0]}-{row['gpu']}-{row['precision'].split(' ')[0]}-tp{row['tp']}pp{row['pp']}vp{row['vp'] or 1}ep{row['ep']}-gbs{row['gbs']}"


CAPACITY_UNKNOWN = {
    "Llama3.1-405B-GB200-fp8_cs-tp4pp16vp4ep1-gbs1536": (
        "estimated 184.8 GiB against GB200's '186 GB' converted to 173.2 GiB; the catalog has no device-reported "
        "GB200 capacity, and GPUs whose datasheet GB are GiB-sized stacks report about the GB figure in GiB "
        "(B200 '180 GB': 179 GiB; MI355X '288 GB': 288 GiB), at which this estimate would fit"
    ),
}
"""Rows that do not fit only because the GPU's capacity is a conservative conversion (strict: a row that
starts fitting must leave this list)."""


def _params() -> list:
    out = []
    for r in ROWS:
        why = CAPACITY_UNKNOWN.get(_id(r))
        marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
        out.append(pytest.param(r, id=_id(r), marks=marks))
    return out


@pytest.mark.parametrize("row", _params())
def test_published_run_fits(row: dict[str, str]) -> None:
    spec, axes = _spec(row)
    space = Space(spec)
    config = space.make(**axes)
    assert space.check(config) == [], "the published layout and recompute must be legal"
    est = estimate_memory(spec, config.derive(spec.world, spec.workload.global_batch_size))
    assert est.fits, (est.reason(), est.stages[est.peak_stage].breakdown)
    assert est.peak_gib > 0.2 * est.capacity_gib  # and not trivially: these recipes fill the device
