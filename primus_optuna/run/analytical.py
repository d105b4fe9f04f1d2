"""The analytical runner: the step-time model's estimate *is* the value (``source="analytical"``).

It costs no GPU and a few microseconds, so a whole study can be explored before anything is launched. A
configuration the memory model says does not fit raises :class:`~primus_optuna.run.base.OutOfMemory`, as the
real launch would.

Example::

    m = AnalyticalRunner(spec).run(config, RunContext(spec, Path("/tmp/t0")))
    m.tokens_per_s_per_gpu, m.details["breakdown_s"]
"""

from __future__ import annotations

from ..physics.memory import estimate_memory
from ..physics.throughput import estimate_throughput
from ..space import TrainingConfig
from ..spec import StudySpec
from .base import Measurement, OutOfMemory, RunContext


class AnalyticalRunner:
    """Turns a configuration into its estimate."""

    kind = "analytical"
    uses_workdir = False
    """the objective does not create a per-trial directory for it"""
    measures_cluster_memory = False
    """its out-of-memory verdicts are the memory model's own: they never calibrate the model"""

    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec

    def run(self, config: TrainingConfig, context: RunContext) -> Measurement:
        mem = estimate_memory(self.spec, config)
        if not mem.fits:
            raise OutOfMemory(f"estimated {mem.reason()}", log_tail=mem.reason())
        est = estimate_throughput(self.spec, config)
        return Measurement(
            tokens_per_s_per_gpu=est.tokens_per_s_per_gpu,
            step_time_s=est.step_time_s,
            source="analytical",
            peak_memory_gib=mem.peak_gib,
            details={
                "breakdown_s": {k: round(v, 6) for k, v in est.breakdown_s.items()},
                "mfu": est.mfu,
                "memory_peak_stage": mem.peak_stage,
            },
        )
