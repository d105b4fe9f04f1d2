"""Study files: what is tuned (model, cluster, workload, axes) and how (search, llm, runner, storage)."""

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
