"""Study files: what is tuned (model, cluster, workload, axes) and how (search, llm, runner, storage), with the
GPU and model catalogs and the Primus/Megatron workload YAML import.

The bottom layer: imports pydantic and PyYAML (and ``errors``/``redaction``), never space, physics or any layer
above, nor Optuna, DSPy, LiteLLM or torch.
"""

from .hardware import GB, GIB, GPU_CATALOG, GPUSpec
from .model import MODEL_CATALOG, ModelSpec, hf_to_megatron
from .recompute import (
    RECOMPUTE_MODULES,
    Recompute,
    canonical_recompute,
    parse_recompute,
    recompute_from_megatron,
)
from .study import (
    AXES,
    CHOICES,
    INT_AXES,
    BaselineSpec,
    ClusterSpec,
    LLMSpec,
    RunnerSpec,
    SearchSpec,
    StudySpec,
    WorkloadSpec,
)

__all__ = [
    "AXES",
    "CHOICES",
    "GB",
    "GIB",
    "GPU_CATALOG",
    "INT_AXES",
    "MODEL_CATALOG",
    "RECOMPUTE_MODULES",
    "BaselineSpec",
    "ClusterSpec",
    "GPUSpec",
    "LLMSpec",
    "ModelSpec",
    "Recompute",
    "RunnerSpec",
    "SearchSpec",
    "StudySpec",
    "WorkloadSpec",
    "canonical_recompute",
    "hf_to_megatron",
    "parse_recompute",
    "recompute_from_megatron",
]
