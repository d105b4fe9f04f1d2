"""primus-optuna: find the fastest distributed-training configuration of an LLM, as an Optuna study.

Example::

    from primus_optuna import Space, StudySpec

    spec = StudySpec.from_yaml("studies/mixtral-8x22b-mi355x-fp8.yaml")
    space = Space(spec)
    print(len(space.configs()), space.check(space.baseline))
"""

from .errors import PrimusError, SpecError
from .space import Space, TrainingConfig
from .spec import GPUSpec, ModelSpec, StudySpec

__version__ = "0.1.0"

__all__ = [
    "GPUSpec",
    "ModelSpec",
    "PrimusError",
    "Space",
    "SpecError",
    "StudySpec",
    "TrainingConfig",
    "__version__",
]
