"""Build the runner a study (or the ``--runner`` flag) asks for.

Kinds: ``analytical`` (the estimate), ``profile`` (single-device layer profile extrapolated to the cluster),
and the launching kinds ``command``, ``local``, ``primus``, ``megatron``, ``slurm`` (see
:mod:`primus_optuna.run.presets`). ``spec.runner.options`` configure the study's own kind and are validated;
a kind chosen with ``--runner`` that differs from the study's gets its defaults.
"""

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
    options = dict(spec.runner.options) if kind == spec.runner.kind else {}
    if kind == "analytical":
        from .analytical import AnalyticalRunner

        if options:
            raise SpecError(f"runner.options: the analytical runner takes no options (got {sorted(options)})")
        return AnalyticalRunner(spec)
    if kind == "profile":
        from .profile import ProfileRunner

        return ProfileRunner.from_options(spec, options)
    from .presets import build_command_runner

    return build_command_runner(spec, kind, options)
