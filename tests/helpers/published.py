"""Published training runs (tests/data/published-runs.csv) that the step-time model can express today.

Rows are kept when their model is in the catalog (Kimi-K2's Muon optimizer is not modelled: skipped) and
their GPU is an H100, B200, B300, GB200 or GB300 (the catalog entries; a Grace-Blackwell row's "node" is an
NVLink domain of up to 64 of its GPUs), an AMD MI325X or MI355X. MXFP8/FP8 current
scaling map to ``fp8`` (recipe ``mxfp8`` / ``tensorwise``; Megatron's default, delayed, where the row names
none); ``flex``/``turbo`` dispatchers to ``deepep``; the
rows' recompute modules to ``selective:<modules>`` (``[] (none)``: none). Estimated as they ran: the rows'
``grad_reduce_in_fp32=False`` (every Bridge recipe) and ``fp8_param_gather=True`` flags, GPT-OSS with its
sliding windows, attention sinks and linear biases (the catalog entry), the MoE dispatch sync-free under a
full-iteration CUDA graph (a captured graph cannot wait on the host for token counts), and the experts as TE's
fused grouped MLP where the row names the "cutedsl fused grouped MLP" (``workload.te_op_fuser``), FP8 attention
where it names "fp8 dot-product attention" (``workload.fp8_dot_product_attention``), the MXFP8 output layer
where it names ``fp8_output_proj=True`` (``workload.fp8_output_proj``); DeepSeek-V3
with its pipeline layout (:func:`row_layout`), precision-aware optimizer and ``overlap_grad_reduce=False``
where the row states them; the embedding and loss counted in the pipeline split where the row says
``account_for_embedding/loss_in_pipeline_split=True``; FSDP rows (torch FSDP2, Megatron-FSDP) with ``dp_shard``
over their data-parallel group (:func:`_fsdp`; Megatron-FSDP's CPU activation offloading is not modelled).
The MI325X rows do not state their GBS: 4 micro-batches per data-parallel rank for
Llama3.1-8B, GBS 256 for 70B (the assumption of tests/physics/test_throughput_validation.py).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus_optuna.physics.calibration import gpu_family
from primus_optuna.space import TrainingConfig
from primus_optuna.spec import StudySpec
from primus_optuna.spec.study import DISPATCHER_ALIASES

CSV = Path(__file__).resolve().parents[1] / "data" / "published-runs.csv"

MODELS: dict[str, Any] = {
    "Llama3.1-405B": "llama3.1-405b",
    "Llama3-70B": "llama3.1-70b",
    "Llama3.1-70B": "llama3.1-70b",
    "Llama3.1-8B": "llama3.1-8b",
    "Llama3-8B": "llama3.1-8b",
    "Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "GPT-OSS-120B": "gpt-oss-120b",
    "DeepSeek-V2-236B": "deepseek-v2",
    "DeepSeek-V3-671B": "deepseek-v3",
}
REPORT_ONLY_MODELS = frozenset({"DeepSeek-V3-671B"})
"""Models whose rows joined after the constants in physics/calibration.py were fitted (DeepSeek-V3 with its
layouts, 2026-12-03): reported with the held-back rows and never in a fitting part (scripts/fit_published.py
``split``), so the existing split and fits stay as they were."""
GPUS: dict[str, str] = {
    "H100-SXM": "h100",
    "B200": "b200",
    "B300": "b300",
    "GB200": "gb200",
    "GB300": "gb300",
    "MI325X": "mi325x",
    "MI355X": "mi355x",
}
"""The rows' GPUs as catalog entries."""
NVL_DOMAIN = {"GB200": 64, "GB300": 64}
"""GPUs of one NVLink domain in the Grace-Blackwell rows (NVL72 racks run with 64 of their GPUs per domain)."""
FP8_ATTENTION = "fp8 dot-product attention"
"""How the 26.06 Bridge rows state ``fp8_dot_product_attention=True`` (``workload.fp8_dot_product_attention``)."""
FP8_OUTPUT_PROJ = "fp8_output_proj=True"
"""How the 26.06 Bridge rows state ``fp8_output_proj=True`` (``workload.fp8_output_proj``)."""
FUSED_GROUPED_MLP = "cutedsl fused grouped MLP"
"""How the 26.06 Bridge recipes state TE's fused grouped MLP in ``other_memory_flags``
(``workload.te_op_fuser``)."""


def _gbs(r: dict[str, str]) -> int | None:
    """The row's GBS, or the stated assumption for the MI325X rows that do not give it."""
    if r["gbs"]:
        return int(r["gbs"])
    if r["gpu"] != "MI325X":
        return None
    if r["model"].startswith("Llama3.1-8B"):
        return 4 * int(r["mbs"]) * int(r["gpus"])
    return 256


WORDED_LAYOUTS = {
    "auto for PP4xVP4 (E+4 | 14x4 | 1+mtp+loss)": "Et*4|(t*4|)*14tmL",
    "auto for PP8 (E+8 | 6x8 | 5+mtp+loss)": "Et*8|(t*8|)*6t*5mL",
    "for PP16 (E+4 | 14x4 | 1+mtp+loss)": "Et*4|(t*4|)*14tmL",
    # Kimi-K2's recipe names a "Kimi layout for PP4xVP4" without giving it: the DeepSeek-V3 16-chunk split
    # without the MTP layer (61 = 4 + 14x4 + 1) is assumed
    "Kimi layout for PP4xVP4": "Et*4|(t*4|)*14tL",
}
"""Layouts the rows describe in words (E = embedding, mtp, loss), written as Megatron layout strings."""

PRECISION_AWARE = re.compile(
    r"precision-aware optimizer \(fp32 master[,;] bf16 main_grads/exp_avg/exp_avg_sq\)"
)
"""How the rows state Megatron-Core's precision-aware optimizer (fp32 master weights, bf16 main grads and
moments)."""


def row_layout(r: dict[str, str]) -> str | None:
    """The row's ``--pipeline-model-parallel-layout``: the recipe's string where the row gives it
    (``layout Et*4|(t*4|)*14tmL``), else the split it describes in words (:data:`WORDED_LAYOUTS`)."""
    text = r["pp_schedule"]
    m = re.search(r"layout (E[EtmL|()*0-9]+)", text)
    if m:
        return m.group(1)
    return next((layout for words, layout in WORDED_LAYOUTS.items() if words in text), None)


def _recompute(r: dict[str, str]) -> str:
    """The row's recompute as the ``recompute`` axis writes it: its ``recompute_modules`` (Megatron's default
    ``core_attn`` when it names none; ``[] (none)``, an empty module list, recomputes nothing)."""
    if r["recompute_granularity"] != "selective":
        return "none"
    text = r["recompute_modules"]
    if "none" in text:
        return "none"
    mods = [m.strip() for m in text.split(",") if m.strip()]
    return "selective:" + "+".join(mods) if mods else "selective"


@dataclass(frozen=True)
class Published:
    release: str
    label: str
    family: str
    spec: StudySpec
    config: TrainingConfig
    measured_tps: float
    report_only: bool = False
    fsdp: str | None = None
    """``torch-fsdp2`` / ``megatron-fsdp`` for a row that ran FSDP (:func:`fsdp_framework`)"""


FSDP_RECOMPUTE = "full:72"
"""The recompute of the MI325X Llama 3.1 70B FSDP rows (their table does not state it): as Primus's MI325X
examples run them, full, block, 72 of the 80 layers (examples/megatron/configs/MI325X/
llama3.1_70B-{BF16,FP8}-pretrain.yaml@fd1eeabb:62-72)."""


def fsdp_framework(r: dict[str, str]) -> str | None:
    """``torch-fsdp2`` or ``megatron-fsdp`` when the row ran FSDP (its ``dist_opt`` column), else None."""
    text = r["dist_opt"]
    if text.startswith("torch FSDP2"):
        return "torch-fsdp2"
    if text.startswith("Megatron-FSDP"):
        return "megatron-fsdp"
    return None


def _fsdp(r: dict[str, str], workload: dict[str, Any]) -> dict[str, Any]:
    """The axes an FSDP row ran with (ZeRO-3 over its whole data-parallel group) and its workload settings:
    Megatron refuses torch FSDP2 with the distributed optimizer or gradient-accumulation fusion
    (megatron/training/arguments.py@d98e8a64:1038-1041); Megatron-FSDP v1 runs on the distributed optimizer
    (arguments.py@d98e8a64:1124-1136) and its fusion is off where the row says so."""
    framework = fsdp_framework(r)
    if framework is None:
        return {}
    dp = int(r["gpus"]) // (int(r["tp"]) * int(r["pp"]) * int(r["cp"]))
    if framework == "torch-fsdp2":
        workload.update(distributed_optimizer=False, gradient_accumulation_fusion=False)
    elif "gradient_accumulation_fusion off" in r["other_memory_flags"]:
        workload["gradient_accumulation_fusion"] = False
    axes: dict[str, Any] = {"dp_shard": dp}
    if framework == "torch-fsdp2" and r["gpu"] == "MI325X" and r["recompute_granularity"] == "unknown":
        axes["recompute"] = FSDP_RECOMPUTE
    return axes


def _release(source: str) -> str:
    m = re.search(r"\[([^\]]*table[^\]]*)\]", source)
    if m:
        return "Megatron-Bridge " + m.group(1).split(" table")[0]
    return source.split(" ")[0]


def load_published() -> list[Published]:
    out = []
    with CSV.open() as fh:
        for r in csv.DictReader(fh):
            name = r["model"].split(" ")[0]
            gbs = _gbs(r)
            if name not in MODELS or r["gpu"] not in GPUS or gbs is None:
                continue
            gpus = int(r["gpus"])
            gpn = min(gpus, NVL_DOMAIN.get(r["gpu"], 8))
            model = MODELS[name]
            fp8 = "fp8" in r["precision"]
            flags = r["other_memory_flags"]
            workload: dict[str, Any] = {
                "seq_length": int(r["seq"]),
                "global_batch_size": gbs,
                "precision": "fp8" if fp8 else "bf16",
                "distributed_optimizer": r["dist_opt"] != "False",
                "tp_comm_overlap": "tp_comm_overlap userbuffers" in flags,
                # as the rows ran: the recipes' 2-byte gradient buffer and FP8 parameter all-gather
                "grad_reduce_in_fp32": "grad_reduce_in_fp32=False" not in flags,
                # a full-iteration CUDA graph cannot wait on the host for the MoE token counts
                "moe_sync_free": r["cuda_graph"] == "full_iteration",
                # TE's fused grouped MLP (use_transformer_engine_op_fuser + NVTE_CUTEDSL_FUSED_GROUPED_MLP=1)
                "te_op_fuser": FUSED_GROUPED_MLP in flags,
            }
            if fp8:
                # mxfp8 / fp8_cs (current scaling); a row that names no recipe keeps Megatron's default (delayed)
                if r["precision"].startswith("mxfp8"):
                    workload["fp8_recipe"] = "mxfp8"
                elif r["precision"].startswith("fp8_cs"):
                    workload["fp8_recipe"] = "tensorwise"
                workload["fp8_param_gather"] = "fp8_param_gather=True" in flags
                # the recipe's fp8_dot_product_attention (workload.fp8_dot_product_attention)
                workload["fp8_dot_product_attention"] = FP8_ATTENTION in flags
                # the MXFP8 output layer (workload.fp8_output_proj)
                workload["fp8_output_proj"] = FP8_OUTPUT_PROJ in flags
            if "overlap_grad_reduce=False" in flags:
                workload["overlap_grad_reduce"] = False
            if PRECISION_AWARE.search(flags):
                workload.update(
                    precision_aware_optimizer=True,
                    main_grads_dtype="bf16",
                    exp_avg_dtype="bf16",
                    exp_avg_sq_dtype="bf16",
                )
            fsdp = _fsdp(r, workload)
            layout = row_layout(r) if int(r["pp"]) > 1 else None
            pipeline: dict[str, Any] = {"layout": layout} if layout else {}
            if "account_for_embedding/loss_in_pipeline_split=True" in r["pp_schedule"]:
                pipeline |= {
                    "account_for_embedding_in_pipeline_split": True,
                    "account_for_loss_in_pipeline_split": True,
                }
            spec = StudySpec.from_dict(
                {
                    "name": "published",
                    "model": {"catalog": model} if isinstance(model, str) else model,
                    "cluster": {"gpu": GPUS[r["gpu"]], "nodes": gpus // gpn, "gpus_per_node": gpn},
                    "workload": workload,
                    "pipeline": pipeline,
                }
            )
            vp = int(r["vp"]) if r["vp"] else 1
            pp = int(r["pp"])
            rec = _recompute(r)
            # "flex/hybridep", "turbo DeepEP (64 CUs)": the recipe names the deepep axis value stands for
            recipe_dispatcher = re.split(r"[/ ]", r["moe_dispatcher"].lower())[0]
            disp = "deepep" if recipe_dispatcher in DISPATCHER_ALIASES else "alltoall"
            sched = "interleaved" if vp > 1 and pp > 1 else "1f1b"
            ep = int(r["ep"]) if spec.model.is_moe else 1
            config = TrainingConfig(
                tp=int(r["tp"]),
                pp=pp,
                vpp=vp if sched == "interleaved" else 1,
                cp=int(r["cp"]),
                ep=ep,
                mbs=int(r["mbs"]),
                recompute=fsdp.get("recompute", rec),
                dp_shard=fsdp.get("dp_shard", 1),
                moe_dispatcher=disp,
                pp_schedule=sched,
                ep_overlap=ep > 1 and re.search(r"EP a2a (1F1B )?overlap", flags) is not None,
            ).derive(spec.world, spec.workload.global_batch_size)
            label = f"{name} {r['gpu']} {gpus} {r['precision'].split(' ')[0]} {config.key()}"
            out.append(
                Published(
                    _release(r["source"]),
                    label,
                    gpu_family(spec.cluster.gpu),
                    spec,
                    config,
                    float(r["tok_s_gpu"]),
                    report_only=name in REPORT_ONLY_MODELS,
                    fsdp=fsdp_framework(r),
                )
            )
    return out
