"""Study files: what is tuned (model, cluster, workload, axes) and how (search, llm, runner, storage), with the
GPU and model catalogs and the Primus/Megatron workload YAML import.

The bottom layer: imports pydantic and PyYAML (and ``errors``/``redaction``), never space, physics or any layer
above, nor Optuna, DSPy, LiteLLM or torch.
"""

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
