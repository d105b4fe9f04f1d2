"""What a study leaves behind: its storage (opening, resuming, heartbeat), its one account (:class:`StudySummary`,
behind the run summary, the report and the dashboard note), the audit report, optuna-dashboard notes, and
exports of a configuration (Primus overlay, Megatron arguments, env lines, JSON).

May import every layer below (the report uses the physics and the search's calibrated estimate);
optuna-dashboard and matplotlib only when a function needs them; never cli, DSPy or torch.
"""

from .dashboard import dashboard_app, note_hook, refresh_study_note, serve_dashboard, trial_note
from .export import FORMATS, export_config, parse_export, select_trial, study_spec, trial_config
from .report import build_report, default_report_dir, load_record
from .summary import StudySummary, study_summary

__all__ = [
    "FORMATS",
    "StudySummary",
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
    "study_summary",
    "trial_config",
    "trial_note",
]
