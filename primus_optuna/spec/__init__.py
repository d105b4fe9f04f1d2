"""Study files: what is tuned (model, cluster, workload, axes) and how (search, llm, runner, storage)."""

from .hardware import GB, GIB, GPU_CATALOG, GPUSpec
from .model import MODEL_CATALOG, ModelSpec, hf_to_megatron
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
    "BaselineSpec",
    "ClusterSpec",
    "GPUSpec",
    "LLMSpec",
    "ModelSpec",
    "RunnerSpec",
    "SearchSpec",
    "StudySpec",
    "WorkloadSpec",
    "hf_to_megatron",
]
