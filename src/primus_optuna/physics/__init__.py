"""Analytical models of a configuration: per-GPU memory (and, later, step time). Pure Python, no torch/Optuna."""

from .memory import BREAKDOWN_KEYS, MemoryEstimate, StageMemory, estimate_memory
from .shapes import (
    LayerParams,
    LayerShape,
    chunks_in_flight,
    layer_activation_bytes,
    layer_activation_terms,
    layer_params,
    layers_in_flight,
    stage_chunks,
)

__all__ = [
    "BREAKDOWN_KEYS",
    "LayerParams",
    "LayerShape",
    "MemoryEstimate",
    "StageMemory",
    "chunks_in_flight",
    "estimate_memory",
    "layer_activation_bytes",
    "layer_activation_terms",
    "layer_params",
    "layers_in_flight",
    "stage_chunks",
]
