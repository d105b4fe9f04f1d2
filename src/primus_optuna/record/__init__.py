"""What a study leaves behind: the audit report, optuna-dashboard notes, and exports of a configuration."""

from .export import FORMATS, export_config, parse_export, select_trial, study_spec, trial_config

__all__ = ["FORMATS", "export_config", "parse_export", "select_trial", "study_spec", "trial_config"]
