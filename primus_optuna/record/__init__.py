"""What a study leaves behind: the audit report, optuna-dashboard notes, and exports of a configuration.

Imports stay light (no optuna-dashboard or matplotlib until a function needs them)."""

from .dashboard import dashboard_app, note_hook, refresh_study_note, serve_dashboard, trial_note
from .export import FORMATS, export_config, parse_export, select_trial, study_spec, trial_config
from .report import build_report, default_report_dir, load_record

__all__ = [
    "FORMATS",
    "build_report",
    "dashboard_app",
    "default_report_dir",
    "export_config",
    "load_record",
    "note_hook",
    "parse_export",
    "refresh_study_note",
    "select_trial",
    "serve_dashboard",
    "study_spec",
    "trial_config",
    "trial_note",
]
