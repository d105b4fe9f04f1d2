"""Analytical models of a configuration: per-GPU memory on every pipeline stage, the step time with its
breakdown (compute, bubble, TP/CP/EP/PP/DP communication, recompute, optimizer), per-GPU-family efficiency
constants, calibrations fitted from measured runs, :func:`plan_space` (a whole space estimated in bulk) and
capacity planning (:mod:`.capacity`: the best configuration at every GPU count and type).

Pure Python over spec and space, kept fast: never Optuna, DSPy, LiteLLM, torch or matplotlib, nor search, run
or record (tests/package/test_layers.py asserts it).
"""

from .calibration import BREAKDOWN_TERMS, Calibration
from .comm import BusBandwidth, Group, Topology, bus_bandwidth_table, format_bus_bandwidth
from .fidelity import FidelityReport, ranking_fidelity, spearman, top3_holds_best
from .gemm_efficiency import EfficiencyCurve, gemm_seconds
from .memory import BREAKDOWN_KEYS, MemoryEstimate, StageMemory, estimate_memory
from .network import MeasuredNetwork, study_topology
from .plan import PlanEntry, PlanResult, no_fit_message, plan_space
from .shapes import (
    RECOMPUTE_DROPS,
    LayerParams,
    LayerShape,
    attention_terms,
    chunk_activation_bytes,
    chunks_in_flight,
    dense_mlp_terms,
    layer_activation_bytes,
    layer_activation_terms,
    layer_params,
    layers_in_flight,
    moe_terms,
    stage_chunks,
)
from .throughput import ThroughputEstimate, estimate_throughput, format_throughput, throughput_section
from .uncertainty import Band, estimate_band, gain_inside_band, ratio_band

__all__ = [
    "BREAKDOWN_KEYS",
    "Band",
    "BREAKDOWN_TERMS",
    "BusBandwidth",
    "Calibration",
    "Group",
    "Topology",
    "MeasuredNetwork",
    "study_topology",
    "bus_bandwidth_table",
    "format_bus_bandwidth",
    "top3_holds_best",
    "EfficiencyCurve",
    "FidelityReport",
    "gemm_seconds",
    "ranking_fidelity",
    "spearman",
    "PlanEntry",
    "PlanResult",
    "ThroughputEstimate",
    "estimate_band",
    "gain_inside_band",
    "ratio_band",
    "estimate_throughput",
    "format_throughput",
    "no_fit_message",
    "plan_space",
    "throughput_section",
    "LayerParams",
    "LayerShape",
    "MemoryEstimate",
    "StageMemory",
    "RECOMPUTE_DROPS",
    "attention_terms",
    "chunk_activation_bytes",
    "chunks_in_flight",
    "dense_mlp_terms",
    "moe_terms",
    "estimate_memory",
    "layer_activation_bytes",
    "layer_activation_terms",
    "layer_params",
    "layers_in_flight",
    "stage_chunks",
]
