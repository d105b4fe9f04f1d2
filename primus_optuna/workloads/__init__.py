"""Torch workloads: the Megatron-like transformer layer (memory validation, the profile runner), the small
GPT/MoE that the local runner trains (``python -m primus_optuna.workloads.gpt``), and the node's
microbenchmarks (``microbench``) that ``calibrate`` turns into a hardware profile.

The only package that imports torch at module level, so only ``run.profile`` and the ``calibrate`` command import
it (lazily) and the local runner starts it as a process; it imports the physics, space and spec layers, never
search, run or record (``calibrate`` needs no Optuna: it runs where only torch is installed).
"""

from .layer import TransformerLayer, build_layer, count_saved_bytes, make_input

__all__ = ["TransformerLayer", "build_layer", "count_saved_bytes", "make_input"]
