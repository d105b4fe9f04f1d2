"""Torch workloads: the Megatron-like transformer layer used for memory validation, profiling and local runs."""

from .layer import TransformerLayer, build_layer, count_saved_bytes, make_input

__all__ = ["TransformerLayer", "build_layer", "count_saved_bytes", "make_input"]
