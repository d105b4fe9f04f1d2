"""The GPU-hour account of a study (:mod:`primus_optuna.record.report.gpu_hours`, where the report's figures
live; this name is kept for the dashboard and the run summary)."""

from .report.gpu_hours import GpuHoursAccount, gpu_hours_account

__all__ = ["GpuHoursAccount", "gpu_hours_account"]
