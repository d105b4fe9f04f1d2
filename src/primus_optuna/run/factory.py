"""Build the runner a study (or the ``--runner`` flag) asks for."""

from __future__ import annotations

from ..errors import SpecError
from ..spec import StudySpec
from ..spec.study import RUNNER_KINDS
from .base import Runner


def make_runner(spec: StudySpec, kind: str | None = None) -> Runner:
    """The runner of kind ``kind`` (default: ``spec.runner.kind``) configured from ``spec.runner.options``."""
    kind = kind or spec.runner.kind
    if kind not in RUNNER_KINDS:
        raise SpecError(f"--runner: unknown runner kind {kind!r}; choose one of {', '.join(RUNNER_KINDS)}")
    if kind == "analytical":
        from .analytical import AnalyticalRunner

        return AnalyticalRunner(spec)
    raise SpecError(f"runner kind {kind!r} is not available in this build")
