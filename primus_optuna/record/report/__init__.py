"""The audit report of a primus-optuna study, built from its storage alone.

:func:`build_report` writes ``report.md`` (plots as PNG files under ``plots/``), a self-contained
``report.html`` (plots embedded as base64 PNG) and ``study.yaml`` (the study file, for the command that
reproduces the run). Sections: setup, sweep phase, planner phase, memory filter, estimates vs measurements,
result (best configuration, gain over the baseline, Pareto front, sensitivity), plots, all trials. It works
on any study created by primus-optuna, finished or not; a section with nothing to show says so.

Modules, each importing only the ones before it: :mod:`.record` (the study read back from storage),
:mod:`.analysis` (figures derived from it), :mod:`.doc` (the document model and number formats; standard
library only), :mod:`.plots` (matplotlib, on first use), :mod:`.sections` (the section writers,
:func:`render`, :func:`build_report`). Importing the package does not import matplotlib.

Example::

    paths = build_report("sqlite:///mixtral.db", "mixtral-8x22b-mi355x-fp8", "mixtral-report")
    paths["html"]  # Path('mixtral-report/report.html')
"""

from .analysis import (
    estimate_errors,
    fallback_reason,
    gain,
    gpu_hours_saved,
    memory_pruned,
    planner_rounds,
    reproduce_command,
    sensitivity,
    step_time_s,
    versions,
)
from .doc import Doc, fmt_gib, fmt_pct, fmt_tok
from .plots import plot_axis_effects, plot_estimate_vs_measured, plot_history, plot_pareto
from .record import DEFAULT_MEASURE_STEPS, StudyRecord, TrialRow, load_record, record_of
from .sections import SECTIONS, Section, build_report, default_report_dir, render

__all__ = [
    "DEFAULT_MEASURE_STEPS",
    "SECTIONS",
    "Doc",
    "Section",
    "StudyRecord",
    "TrialRow",
    "build_report",
    "default_report_dir",
    "estimate_errors",
    "fallback_reason",
    "fmt_gib",
    "fmt_pct",
    "fmt_tok",
    "gain",
    "gpu_hours_saved",
    "load_record",
    "memory_pruned",
    "planner_rounds",
    "plot_axis_effects",
    "plot_estimate_vs_measured",
    "plot_history",
    "plot_pareto",
    "record_of",
    "render",
    "reproduce_command",
    "sensitivity",
    "step_time_s",
    "versions",
]
