"""Torch workloads: the Megatron-like transformer layer (memory validation, the profile runner) and the small
GPT/MoE that the local runner trains (``python -m primus_optuna.workloads.gpt``).

The only package that imports torch at module level, so only ``run.profile`` imports it (lazily) and the local
runner starts it as a process; it imports the physics' layer shapes, never search, run or record.
"""

from .layer import TransformerLayer, build_layer, count_saved_bytes, make_input

__all__ = ["TransformerLayer", "build_layer", "count_saved_bytes", "make_input"]
